#!/usr/bin/env bash
# Starts and stops throwaway metadata-store servers for tests and demos, on 127.0.0.1 only.
#
#   store_servers.sh start etcd|redis|http <dir> [extra server args...]
#       Installs the server from Debian when missing (etcd-server / redis-server; needs root or
#       sudo; idempotent), starts it on a free 127.0.0.1 port with its data under <dir>, waits
#       until it answers, writes <dir>/<kind>.port and <dir>/<kind>.pid, and prints the port.
#       Extra args go to the server (e.g. `start redis <dir> --requirepass secret`).
#       http runs our mooncake_http_metadata_server: $MC_HTTP_METADATA_SERVER, or the first
#       build*/tools/http_metadata_server/mooncake_http_metadata_server found.
#       The server's output goes to <dir>/<kind>.log.
#       With MC_STORE_SERVERS_OWNER_PID=<pid>, the server is also stopped once <pid> exits.
#   store_servers.sh stop <dir> [kind]
#       Stops the servers started in <dir> (or only <kind>) and removes their files.
# Exit status: 0 on success; 1 with a message on stderr otherwise.
set -euo pipefail

die() { echo "store_servers: $*" >&2; exit 1; }

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# True while pid $1 runs; a zombie counts as gone (our servers are not our children).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat:0:1}" != Z ]
}

# A port in 20000..32767 (below Linux's ephemeral range) that nothing listens on.
pick_port() {
  local p i
  for i in $(seq 1 50); do
    p=$((20000 + RANDOM % 12768))
    port_open "$p" || { echo "$p"; return 0; }
  done
  die "no free port found"
}

# GET http://127.0.0.1:$1$2 with bash alone; prints the response (headers and body).
http_get() {
  local port=$1 path=$2
  (exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
   printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
   timeout 2 cat <&3) 2>/dev/null
}

# Installs Debian package $2, which provides command $1, unless the command exists. apt's
# output goes to $3 (a log file); its tail is shown on failure.
ensure_installed() {
  local cmd=$1 pkg=$2 log=$3
  command -v "$cmd" >/dev/null 2>&1 && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "$cmd is missing and installing $pkg needs root"
    sudo="sudo -n"
  fi
  command -v apt-get >/dev/null 2>&1 || die "$cmd is missing and there is no apt-get"
  echo "store_servers: installing $pkg (apt output in $log)" >&2
  # One apt at a time, even when tests start servers in parallel.
  if ! (
    flock -w 600 9 || { echo "timed out waiting for the apt lock" >&2; exit 1; }
    command -v "$cmd" >/dev/null 2>&1 && exit 0
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y -qq --no-install-recommends "$pkg" ||
      { $sudo apt-get update -qq &&
        $sudo apt-get install -y -qq --no-install-recommends "$pkg"; }
  ) 9>/tmp/mc_store_servers.apt.lock >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die "installing $pkg failed"
  fi
  command -v "$cmd" >/dev/null 2>&1 || die "$pkg installed but $cmd is still missing"
}

find_http_server() {
  if [ -n "${MC_HTTP_METADATA_SERVER:-}" ]; then
    [ -x "$MC_HTTP_METADATA_SERVER" ] ||
      die "MC_HTTP_METADATA_SERVER=$MC_HTTP_METADATA_SERVER is not executable"
    echo "$MC_HTTP_METADATA_SERVER"
    return
  fi
  local root f
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  for f in "$root"/build*/tools/http_metadata_server/mooncake_http_metadata_server; do
    [ -x "$f" ] && { echo "$f"; return; }
  done
  die "mooncake_http_metadata_server not found: build it or set MC_HTTP_METADATA_SERVER"
}

# Waits until the server of kind $1 on port $2 (pid $3) answers; false if it died or never did.
wait_ready() {
  local kind=$1 port=$2 pid=$3 i
  for i in $(seq 1 150); do  # 15 s
    alive "$pid" || return 1
    case $kind in
      etcd) http_get "$port" /health | grep -q '"health":"true"' && return 0 ;;
      *) port_open "$port" && return 0 ;;
    esac
    sleep 0.1
  done
  return 1
}

# With MC_STORE_SERVERS_OWNER_PID set (a test process), a watchdog stops the server once that
# process is gone, so that a crashed or timed-out test leaves no server behind.
start_watchdog() {
  local dir=$1 kind=$2 pid=$3 owner=${MC_STORE_SERVERS_OWNER_PID:-}
  [ -n "$owner" ] || return 0
  (
    while alive "$owner" && alive "$pid"; do sleep 1; done
    if alive "$pid"; then
      kill -TERM "$pid" 2>/dev/null; sleep 2; kill -KILL "$pid" 2>/dev/null
    fi
  ) >/dev/null 2>&1 </dev/null &
  echo $! >"$dir/$kind.watchdog"
}

start() {
  local kind=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ -f "$dir/$kind.pid" ] && alive "$(cat "$dir/$kind.pid")"; then
    die "$kind already runs from $dir (pid $(cat "$dir/$kind.pid"))"
  fi
  local bin
  case $kind in
    etcd) ensure_installed etcd etcd-server "$dir/install.log"; bin=etcd ;;
    redis) ensure_installed redis-server redis-server "$dir/install.log"; bin=redis-server ;;
    http) bin=$(find_http_server) ;;
    *) die "unknown kind '$kind' (etcd, redis or http)" ;;
  esac
  local try port port2 pid
  for try in 1 2 3 4 5; do
    port=$(pick_port)
    case $kind in
      etcd)
        port2=$(pick_port)
        [ "$port2" != "$port" ] || continue
        rm -rf "$dir/etcd.data"
        if [ "$(uname -m)" != x86_64 ]; then  # etcd 3.4 asks for this on arm64 and others
          ETCD_UNSUPPORTED_ARCH=${ETCD_UNSUPPORTED_ARCH:-$(dpkg --print-architecture)}
          export ETCD_UNSUPPORTED_ARCH
        fi
        "$bin" --name mc-test --data-dir "$dir/etcd.data" \
          --listen-client-urls "http://127.0.0.1:$port" \
          --advertise-client-urls "http://127.0.0.1:$port" \
          --listen-peer-urls "http://127.0.0.1:$port2" \
          --initial-advertise-peer-urls "http://127.0.0.1:$port2" \
          --initial-cluster "mc-test=http://127.0.0.1:$port2" \
          "$@" >"$dir/etcd.log" 2>&1 </dev/null &
        pid=$! ;;
      redis)
        mkdir -p "$dir/redis.data"
        "$bin" --port "$port" --bind 127.0.0.1 --dir "$dir/redis.data" --save '' \
          --appendonly no --daemonize no "$@" >"$dir/redis.log" 2>&1 </dev/null &
        pid=$! ;;
      http)
        "$bin" --host 127.0.0.1 --port "$port" "$@" >"$dir/http.log" 2>&1 </dev/null &
        pid=$! ;;
    esac
    if wait_ready "$kind" "$port" "$pid"; then
      echo "$port" >"$dir/$kind.port"
      echo "$pid" >"$dir/$kind.pid"
      start_watchdog "$dir" "$kind" "$pid"
      echo "$port"
      return 0
    fi
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  echo "store_servers: $kind did not start; the end of $dir/$kind.log:" >&2
  tail -n 20 "$dir/$kind.log" >&2 || true
  exit 1
}

stop_one() {
  local dir=$1 kind=$2 pid i
  [ -f "$dir/$kind.pid" ] || return 0
  pid=$(cat "$dir/$kind.pid")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
      alive "$pid" || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  if [ -f "$dir/$kind.watchdog" ]; then
    kill "$(cat "$dir/$kind.watchdog")" 2>/dev/null || true
  fi
  rm -rf "$dir/$kind.pid" "$dir/$kind.port" "$dir/$kind.data" "$dir/$kind.watchdog"
}

stop() {
  local dir=$1 kind=${2:-}
  [ -d "$dir" ] || return 0
  if [ -n "$kind" ]; then
    stop_one "$dir" "$kind"
  else
    for kind in etcd redis http; do stop_one "$dir" "$kind"; done
  fi
}

case "${1:-}" in
  start)
    [ $# -ge 3 ] || die "usage: $0 start etcd|redis|http <dir> [server args...]"
    shift
    start "$@" ;;
  stop) [ $# -ge 2 ] || die "usage: $0 stop <dir> [kind]"; shift; stop "$@" ;;
  *) die "usage: $0 start etcd|redis|http <dir> [server args...] | stop <dir> [kind]" ;;
esac
