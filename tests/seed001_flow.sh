#!/usr/bin/env bash
# Seed 001's run (../shared/seeds/001_*.txt, section 5), as its script does it: start the target,
# start the initiator the moment the target logs "listening on <ip>:<port>", then check the
# initiator's exit status and scan both logs for upstream's failure lines. Repeated `runs` times
# in a row; any failure fails the test. The command lines are the seed's, adapted only for
# memory: --device_logicid=-1 (host memory) instead of NPU 0 and 1.
# Usage: seed001_flow.sh <tool> [runs] [extra target flags...]
# Exit status: 0 when every run moved its data; 1 on the first failed run (its logs printed).
set -uo pipefail
tool=$1
runs=${2:-20}
shift 2 || shift $#
dir=$(mktemp -d)
target_pid=""
trap '[ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null; rm -rf "$dir"' EXIT
export GLOG_logtostderr=1

fail() {
  echo "run $run: $*" >&2
  echo "--- target log" >&2; cat "$dir/target.log" >&2
  echo "--- initiator log" >&2; cat "$dir/initiator.log" >&2 2>/dev/null
  exit 1
}

for run in $(seq 1 "$runs"); do
  : >"$dir/target.log"
  : >"$dir/initiator.log"
  "$tool" \
      --mode=target \
      --device_logicid=-1 \
      --local_server_name=127.0.0.1:12345 \
      --metadata_server=P2PHANDSHAKE \
      --block_iteration=1 \
      --batch_size=2 \
      --block_size=16384 \
      "$@" \
      >"$dir/target.log" 2>&1 &
  target_pid=$!
  endpoint=""
  # The seed polls once a second; polling every 5 ms starts the initiator as close to the
  # "listening on" line as a script can.
  for _ in $(seq 1 2000); do
    kill -0 "$target_pid" 2>/dev/null || fail "target exited before listen"
    endpoint=$(grep -Eo 'listening on [^[:space:]]+:[0-9]+' "$dir/target.log" | tail -1 |
               awk '{print $3}')
    [ -n "$endpoint" ] && break
    sleep 0.005
  done
  [ -n "$endpoint" ] || fail "target did not print a listening endpoint"
  "$tool" \
      --mode=initiator \
      --device_logicid=-1 \
      --local_server_name=127.0.0.1:12346 \
      --metadata_server=P2PHANDSHAKE \
      --segment_id="$endpoint" \
      --operation=write \
      --block_iteration=1 \
      --batch_size=2 \
      --block_size=16384 \
      >"$dir/initiator.log" 2>&1
  xfer_ec=$?
  kill "$target_pid" 2>/dev/null
  wait "$target_pid" 2>/dev/null
  target_pid=""
  [ "$xfer_ec" -eq 0 ] || fail "initiator exited $xfer_ec"
  if grep -qE 'getTransferStatus FAILED|Sync data transfer timeout|Failed to install .* transport' \
      "$dir/initiator.log" "$dir/target.log"; then
    fail "transfer reported FAILED/TIMEOUT or a transport failed to install"
  fi
  for line in 'Success to initialize .* engine' 'submit transfer suc\.' 'Test completed: duration '; do
    grep -qE "$line" "$dir/initiator.log" || fail "initiator did not log '$line'"
  done
done
echo "seed001_flow: $runs runs in a row, each initiator started at the target's 'listening on'"
