#!/usr/bin/env bash
# Create (idempotently) a virtual environment holding upstream Mooncake's CPU-only
# Transfer Engine wheel, to be used as the reference peer in interop tests.
#
# Usage: tests/interop/setup_upstream_venv.sh [VENV_DIR]
#   VENV_DIR defaults to build/upstream-venv in the repository.
# Env:
#   MC_UPSTREAM_WHEEL   optional path to a local copy of the wheel (used instead of the index)
#   MC_UPSTREAM_NO_APT  set to 1 to never run apt-get (fail instead if a system library is missing)
#
# The wheel's engine.so links against libibverbs.so.1 (even in the non-CUDA build), which pip
# cannot provide; on Debian it comes from the `libibverbs1` package. Without it the import fails
# with "ImportError: libibverbs.so.1: cannot open shared object file". We install it with
# --no-install-recommends (no ibverbs-providers), so upstream finds 0 HCAs and uses TCP.
#
# Prints the venv's python path as the last line of stdout on success; exits non-zero otherwise.
set -euo pipefail

PKG="mooncake-transfer-engine-non-cuda"
VER="0.3.13.post1"
VENV="${1:-$(cd "$(dirname "$0")/../.." && pwd)/build/upstream-venv}"
PY="$VENV/bin/python"

log() { echo "[setup_upstream_venv] $*" >&2; }
die() { echo "[setup_upstream_venv] ERROR: $*" >&2; exit 1; }

import_ok() {
  [ -x "$PY" ] || return 1
  timeout 60 "$PY" - "$VER" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("mooncake-transfer-engine-non-cuda") == sys.argv[1]
from mooncake.engine import TransferEngine  # loads engine.so and its shared libraries
TransferEngine()
PYEOF
}

engine_so() {
  "$PY" - <<'PYEOF' 2>/dev/null
import importlib.util, os
spec = importlib.util.find_spec("mooncake")
print(os.path.join(list(spec.submodule_search_locations)[0], "engine.so"))
PYEOF
}

# Map a missing soname to the Debian package that ships it.
deb_pkg_for() {
  case "$1" in
    libibverbs.so.1) echo libibverbs1 ;;
    libnuma.so.1) echo libnuma1 ;;
    libcurl.so.4) echo libcurl4 ;;
    libnl-3.so.200) echo libnl-3-200 ;;
    libnl-route-3.so.200) echo libnl-route-3-200 ;;
    *) echo "" ;;
  esac
}

if import_ok; then
  log "already set up: $VENV"
  echo "$PY"
  exit 0
fi

command -v python3 >/dev/null || die "python3 not found"
if [ ! -x "$PY" ]; then
  log "creating venv $VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV" || die "python3 -m venv $VENV failed (is the python3-venv package installed?)"
fi

SRC="$PKG==$VER"
if [ -n "${MC_UPSTREAM_WHEEL:-}" ]; then
  [ -f "$MC_UPSTREAM_WHEEL" ] || die "MC_UPSTREAM_WHEEL=$MC_UPSTREAM_WHEEL does not exist"
  SRC="$MC_UPSTREAM_WHEEL"
fi
log "pip install $SRC"
if ! "$PY" -m pip install --quiet "$SRC" >"$VENV/pip-install.log" 2>&1; then
  tail -n 30 "$VENV/pip-install.log" >&2 || true
  die "pip install of $SRC failed (full log: $VENV/pip-install.log)"
fi

# System libraries engine.so needs at load time.
SO="$(engine_so)"
[ -f "$SO" ] || die "mooncake/engine.so not found after install"
missing="$(ldd "$SO" 2>/dev/null | awk '/not found/ {print $1}' | sort -u || true)"
if [ -n "$missing" ]; then
  log "engine.so misses system libraries: $(echo $missing)"
  pkgs=""
  for lib in $missing; do
    p="$(deb_pkg_for "$lib")"
    [ -n "$p" ] || die "no known Debian package for missing library $lib"
    pkgs="$pkgs $p"
  done
  if [ "${MC_UPSTREAM_NO_APT:-0}" = 1 ] || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "missing system libraries ($(echo $missing)); install Debian packages:$pkgs"
  fi
  log "apt-get install$pkgs"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends $pkgs >"$VENV/apt-install.log" 2>&1; then
    apt-get update -qq >>"$VENV/apt-install.log" 2>&1 || true
    apt-get install -y --no-install-recommends $pkgs >>"$VENV/apt-install.log" 2>&1 \
      || { tail -n 20 "$VENV/apt-install.log" >&2; die "apt-get install$pkgs failed"; }
  fi
fi

if ! import_ok; then
  timeout 60 "$PY" -c 'from mooncake.engine import TransferEngine; TransferEngine()' >&2 || true
  die "upstream engine installed in $VENV but 'from mooncake.engine import TransferEngine' fails"
fi
log "ready: $VENV"
echo "$PY"
