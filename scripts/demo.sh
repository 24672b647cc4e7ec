#!/usr/bin/env bash
# The main job: a target and an initiator as two processes on 127.0.0.1 with P2PHANDSHAKE.
# The initiator writes 1 GiB in 1 MiB requests, reads it back, compares every byte, then runs
# a 5-second write benchmark. Usage: scripts/demo.sh [build dir]
set -euo pipefail
build=${1:-build}
exec "$(dirname "$0")/../tests/bench_pair.sh" "$build/tools/transfer_engine_bench" \
  --buffer_size=1073741824 --block_size=1048576 --batch_size=64 --duration=5
