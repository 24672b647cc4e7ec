#!/usr/bin/env bash
# Runs transfer_engine_bench as a target and an initiator (two processes, P2PHANDSHAKE on
# 127.0.0.1), with --verify: the whole buffer is written, read back and compared.
# Usage: bench_pair.sh <transfer_engine_bench> [initiator flags...]
# Exit status: the initiator's (non-zero on any failed request or mismatched byte).
set -euo pipefail
bench=$1; shift
buffer=1073741824
for a in "$@"; do case $a in --buffer_size=*) buffer=${a#*=};; esac; done
log=$(mktemp)
trap 'kill $target 2>/dev/null || true; wait $target 2>/dev/null || true; rm -f "$log"' EXIT
"$bench" --mode=target --buffer_size="$buffer" >"$log" 2>&1 &
target=$!
seg=""
for _ in $(seq 1 150); do
  if ! kill -0 $target 2>/dev/null; then echo "target exited:" >&2; cat "$log" >&2; exit 1; fi
  if grep -q "Target segment name" "$log"; then
    seg=$(grep -Eo 'listening on [^[:space:]]+' "$log" | tail -1 | awk '{print $3}')
    break
  fi
  sleep 0.2
done
[ -n "$seg" ] || { echo "target did not become ready" >&2; cat "$log" >&2; exit 1; }
echo "target segment: $seg"
"$bench" --mode=initiator --segment_id="$seg" --verify --operation=write "$@"
