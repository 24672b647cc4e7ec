#!/usr/bin/env bash
# Runs the seed's pair on this host: recv.py (target) in the background, send.py (initiator)
# once the target printed target_ready, then stops recv.py. Exit status 0 only if send.py
# printed "matched_bytes 65536". Both run in a fresh temporary directory (they exchange
# mooncake_te_handshake.txt through the current directory).
#   PYTHON=<interpreter with mooncake and torch> examples/python/run_pair.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
case $python in */*) python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python") ;; esac
work=$(mktemp -d "${TMPDIR:-/tmp}/mc_pair.XXXXXX")
recv_pid=""

cleanup() {
  if [ -n "$recv_pid" ] && kill -0 "$recv_pid" 2>/dev/null; then
    kill "$recv_pid" 2>/dev/null
    wait "$recv_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "run_pair: $1" >&2
  for f in recv.err send.err; do
    [ -s "$work/$f" ] && { echo "--- $f (last lines)" >&2; tail -n 20 "$work/$f" >&2; }
  done
  exit 1
}

cd "$work" || exit 1
"$python" -u "$here/recv.py" >recv.out 2>recv.err &
recv_pid=$!
for _ in $(seq 1 300); do
  grep -q '^target_ready ' recv.out && break
  kill -0 "$recv_pid" 2>/dev/null || fail "recv.py exited before it was ready"
  sleep 0.1
done
grep -q '^target_ready ' recv.out || fail "recv.py was not ready within 30 s"
cat recv.out

timeout 120 "$python" "$here/send.py" >send.out 2>send.err
rc=$?
cat send.out
[ "$rc" -eq 0 ] || fail "send.py exited with status $rc"
grep -qx 'matched_bytes 65536' send.out || fail "send.py did not print 'matched_bytes 65536'"
echo "run_pair: OK"
