#!/usr/bin/env bash
# Installs the system packages needed to build and test the engine (Debian 12 / Ubuntu 22.04+).
# Idempotent: packages already present are left alone. Needs root (or sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      libgoogle-glog-dev libgflags-dev nlohmann-json3-dev libgtest-dev libgmock-dev libssl-dev
      libcurl4-openssl-dev libhiredis-dev libcpp-httplib-dev
      # The Store's master RPC messages (protobuf; the wire is the Store's own).
      libprotobuf-dev protobuf-compiler
      # The master's remove_by_regex (linear-time regular expressions).
      libre2-dev
      # mooncake_master's --config_path in YAML.
      libyaml-cpp-dev
      # The HA operation log's CRC32 (zlib).
      zlib1g-dev
      # The master's KV events: ZeroMQ (headers; libzmq5 loaded at run time), msgpack-cxx.
      libzmq3-dev libmsgpack-cxx-dev
      # Servers the metadata-store tests start on 127.0.0.1; etcdctl for tests/multihost.
      etcd-server etcd-client redis-server
      python3 python3-venv python3-pip
      # Upstream's CPU wheel (interop tests and side-by-side benchmarks) loads these.
      libibverbs1 libnuma1 libcurl4
      # The UCX transport (headers to build it; libucp loaded at run time) and ucx_perftest,
      # its baseline in bench/ucx_bench.py.
      libucx-dev ucx-utils
      # clang's thread-safety analysis of the lock annotations (scripts/check_thread_safety.sh).
      clang
      # promtool: the master's /metrics and monitoring/'s rules checked (test_monitoring.py).
      prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
