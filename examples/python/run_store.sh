#!/usr/bin/env bash
# The Store with three processes on this host: mooncake_master, a writer client that puts
# objects into the pool (its own segment) and keeps serving them, and a reader
# client that gets them and checks every byte. Exit status 0 only if the reader matched all.
#   PYTHON=<interpreter with mooncake installed> examples/python/run_store.sh [count] [size]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
master_bin=${MOONCAKE_MASTER:-$(dirname "$(command -v "$python")")/mooncake_master}
count=${1:-16}
size=${2:-1048576}
work=$(mktemp -d "${TMPDIR:-/tmp}/mc_store.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "run_store: $1" >&2
  for f in "$work"/*.log; do echo "--- $(basename "$f") (last lines)" >&2; tail -n 15 "$f" >&2; done
  exit 1
}
[ -x "$master_bin" ] || fail "mooncake_master not found at $master_bin (set MOONCAKE_MASTER)"
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

"$master_bin" --rpc_port="$port" --metrics_port="$mport" >"$work/master.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q "Master service started" "$work/master.log" && break
  sleep 0.1
done
grep -q "Master service started" "$work/master.log" || fail "mooncake_master did not start"
echo "master: 127.0.0.1:$port (metrics http://127.0.0.1:$mport/metrics)"

"$python" -u "$here/store_client.py" writer --master "127.0.0.1:$port" --count "$count" \
  --size "$size" >"$work/writer.out" 2>"$work/writer.log" &
pids+=($!)
for _ in $(seq 1 300); do
  grep -q writer_ready "$work/writer.out" && break
  kill -0 "${pids[1]}" 2>/dev/null || fail "the writer exited early"
  sleep 0.1
done
grep -q writer_ready "$work/writer.out" || fail "the writer was not ready within 30 s"
grep -v writer_ready "$work/writer.out"

"$python" -u "$here/store_client.py" reader --master "127.0.0.1:$port" --count "$count" \
  --size "$size" 2>"$work/reader.log" || fail "the reader failed"
echo "master_key_count after the reader: $(curl -s "http://127.0.0.1:$mport/metrics" | awk '/^master_key_count/ {print $2}')"
