#!/usr/bin/env bash
# Builds and installs the Python package into a virtual environment, then runs its tests:
#   1. creates build/py-venv (python3 -m venv) unless it exists;
#   2. installs what the tests and the build need, if missing: pytest, numpy, safetensors, torch 2.13.0
#      (the CPU build, never a CUDA one), scikit-build-core, pybind11;
#   3. `pip install .` without build isolation, so that the build directory
#      (build/<wheel tag>, see pyproject.toml) is reused and a rebuild compiles only what changed;
#   4. runs `pytest -q tests/python` with that interpreter (extra arguments go to pytest).
# Needs the system packages of scripts/install_deps.sh. Idempotent; safe on a fresh clone.
#   PYTHON=python3.11 JOBS=2 scripts/python_test.sh -k transfer
# MC_PY_INSTALL_ONLY=1 stops after step 3 (no torch, no tests): `make store-demo` uses it.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${MC_PY_VENV:-build/py-venv}
py="$venv/bin/python"
log="$venv/pip.log"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-${JOBS:-$(nproc)}}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! "$py" -c 'import sys' 2>/dev/null; then
  echo "== python_test: creating $venv"
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi

pip_install() {  # quiet, with the log shown when it fails
  if ! "$py" -m pip install "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" | tail -n 40 >&2
    return 1
  fi
}

missing=()
"$py" -c 'import pytest' 2>/dev/null || missing+=(pytest)
"$py" -c 'import numpy' 2>/dev/null || missing+=(numpy)
"$py" -c 'import safetensors' 2>/dev/null || missing+=(safetensors)  # the safetensors export tests
"$py" -c 'import msgpack' 2>/dev/null || missing+=(msgpack)  # a dependency (structured objects)
"$py" -c 'import zmq' 2>/dev/null || missing+=(pyzmq)  # the KV event subscriber of the tests
"$py" -c 'import scikit_build_core, pybind11' 2>/dev/null ||
  missing+=("scikit-build-core>=0.10" "pybind11>=2.12")
if [ ${#missing[@]} -gt 0 ]; then
  echo "== python_test: installing ${missing[*]}"
  pip_install "${missing[@]}"
fi

install_only=${MC_PY_INSTALL_ONLY:-0}
torch_required=1
if [ "$install_only" != 1 ] && ! "$py" -c 'import torch' 2>/dev/null; then
  echo "== python_test: installing torch 2.13.0 (CPU build)"
  # "+cpu" pins the CPU build: a plain "torch==2.13.0" may resolve to a CUDA build on PyPI.
  if ! pip_install "torch==2.13.0+cpu" &&
     ! pip_install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"; then
    echo "python_test: WARNING: torch could not be installed; its tests will be SKIPPED" >&2
    torch_required=0
  fi
fi

echo "== python_test: pip install . (build dir reused; CMAKE_BUILD_PARALLEL_LEVEL=$CMAKE_BUILD_PARALLEL_LEVEL)"
pip_install --no-build-isolation .

[ "$install_only" = 1 ] && exit 0

echo "== python_test: pytest tests/python"
MC_PYTEST_REQUIRE_PACKAGE=1 MC_PYTEST_REQUIRE_TORCH=$torch_required \
  "$py" -m pytest -q -rs tests/python "$@"
