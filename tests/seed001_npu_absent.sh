#!/usr/bin/env bash
# Seed 001's target command line as written (NPU 0) on a host without the Ascend runtime: the
# tool must fail at once, exit non-zero, and name libascendcl.so. Skipped (77) where the runtime
# is installed.
# Usage: seed001_npu_absent.sh <tool>
set -uo pipefail
tool=$1
if ldconfig -p 2>/dev/null | grep -q 'libascendcl\.so' ||
   [ -e "${ASCEND_HOME_PATH:-/usr/local/Ascend/ascend-toolkit/latest}/lib64/libascendcl.so" ]; then
  echo "libascendcl.so is installed here: skipped"; exit 77
fi
export GLOG_logtostderr=1
start=$(date +%s)
out=$(timeout 20 "$tool" --mode=target --device_logicid=0 --local_server_name=127.0.0.1:12345 \
      --metadata_server=P2PHANDSHAKE --block_iteration=1 --batch_size=2 --block_size=16384 2>&1)
ec=$?
echo "$out"
[ "$ec" -ne 0 ] && [ "$ec" -ne 124 ] || { echo "exit status $ec: expected a failure" >&2; exit 1; }
grep -q 'libascendcl\.so' <<<"$out" || { echo "the message does not name libascendcl.so" >&2; exit 1; }
grep -q 'listening on' <<<"$out" && { echo "it started listening first" >&2; exit 1; }
[ $(( $(date +%s) - start )) -le 5 ] || { echo "it did not fail at once" >&2; exit 1; }
echo "seed001_npu_absent: failed at once (exit $ec), naming libascendcl.so"
