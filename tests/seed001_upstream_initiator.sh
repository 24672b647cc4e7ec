#!/usr/bin/env bash
# The seed's race with upstream's initiator: our transfer_engine_bench target, and upstream's
# transfer_engine_bench (from its PyPI wheel, in build/upstream-venv, made by
# tests/interop/setup_upstream_venv.sh) started the moment the target logs "listening on".
# Upstream's initiator reads the target's first buffer without checking that there is one, so
# it crashed whenever it fetched the descriptor before the target had registered; ours
# registers before it listens. Skipped (77) without the wheel.
# Usage: seed001_upstream_initiator.sh <our transfer_engine_bench> <venv> [runs]
set -uo pipefail
ours=$1
venv=$2
runs=${3:-20}
upstream=$(ls "$venv"/lib/python3*/site-packages/mooncake/transfer_engine_bench 2>/dev/null | head -1)
[ -x "$upstream" ] || { echo "upstream's wheel not in $venv: skipped"; exit 77; }
dir=$(mktemp -d)
target_pid=""
trap '[ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null; rm -rf "$dir"' EXIT
export GLOG_logtostderr=1
for run in $(seq 1 "$runs"); do
  : >"$dir/target.log"
  "$ours" --mode=target --buffer_size=67108864 >"$dir/target.log" 2>&1 &
  target_pid=$!
  endpoint=""
  for _ in $(seq 1 2000); do
    kill -0 "$target_pid" 2>/dev/null || { cat "$dir/target.log" >&2; exit 1; }
    endpoint=$(grep -Eo 'listening on [^[:space:]]+:[0-9]+' "$dir/target.log" | tail -1 |
               awk '{print $3}')
    [ -n "$endpoint" ] && break
    sleep 0.005
  done
  [ -n "$endpoint" ] || { echo "run $run: no listening line" >&2; exit 1; }
  timeout 60 "$upstream" --mode=initiator --segment_id="$endpoint" --metadata_server=P2PHANDSHAKE \
      --local_server_name=127.0.0.1 --protocol=tcp --operation=write --duration=1 \
      --block_size=65536 --batch_size=16 --threads=1 --buffer_size=67108864 \
      >"$dir/initiator.log" 2>&1
  ec=$?
  kill "$target_pid" 2>/dev/null
  wait "$target_pid" 2>/dev/null
  target_pid=""
  if [ "$ec" -ne 0 ] || ! grep -q "Test completed" "$dir/initiator.log"; then
    echo "run $run: upstream's initiator exited $ec" >&2
    tail -20 "$dir/initiator.log" >&2
    exit 1
  fi
done
echo "seed001_upstream_initiator: $runs runs in a row, upstream's initiator started at 'listening on'"
