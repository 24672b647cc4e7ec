#!/usr/bin/env bash
# The GPU device checks of issue #8, in one run (under 5 minutes on one H200):
#   1. build (Release, ninja, -j16) in build-gpucheck, with the Python extension when the
#      interpreter has pybind11; where the build cannot be configured (missing -dev
#      packages), the prebuilt bundle .gpu_bundle made by `gpu_check.sh --bundle` is used;
#   2. the GPU tests: platform_device_test and device_test against the real CUDA backend
#      (the device_gpu.* ctest cases), store_client_device_test (the Store client's puts and
#      gets with CUDA memory as the caller's buffers), plus tests/python/test_cuda.py and
#      test_tensor_into_cuda.py when torch sees a GPU;
#   3. the seed pair (examples/python/run_pair.sh) with cuda:0 tensors;
#   4. the bench, 16 MiB blocks: GPU->GPU same host (cuda_ipc) beside a cudaMemcpy
#      device-to-device baseline measured in the same run, GPU->host and host->GPU over TCP;
#   5. UCX rows (issue #16), where the UCX library has CUDA (ucx_info -d lists cuda_copy or
#      cuda_ipc): GPU->GPU write and read with --protocol=ucx; SKIP with the reason otherwise;
#   6. a short table, last.
# A step whose prerequisite is missing is reported as SKIP with the reason. Without a GPU the
# script says so and exits 0 at once.
#   scripts/gpu_check.sh            # on the GPU machine
#   scripts/gpu_check.sh --bundle   # here: build and pack .gpu_bundle (binaries + libraries)
#   MC_GPU_CHECK_SIM=1 MC_GPU_BUILD_DIR=build-gpu JOBS=2 scripts/gpu_check.sh
#                                   # the whole script on simulated devices (tests the script)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${JOBS:-16}
bdir=${MC_GPU_BUILD_DIR:-build-gpucheck}
results=()
failures=0
note() { echo "== gpu_check: $*"; }
row() { results+=("$1|$2|$3"); }

bundle() {
  local b=${MC_BUNDLE_BUILD_DIR:-build-gpu}
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || return 1
  ninja -C "$b" -j "${JOBS:-2}" device_test mp_peer platform_device_test transfer_engine_bench \
    gpu_baseline store_client_device_test || return 1
  rm -rf .gpu_bundle && mkdir -p .gpu_bundle/lib
  for t in tests/device_test tests/mp_peer platform_device_test tools/transfer_engine_bench \
           bench/gpu_baseline src/store/client/store_client_device_test; do
    cp "$b/$t" .gpu_bundle/ || return 1
    # Every library but glibc's own travels (the GPU machine may lack the -dev packages).
    ldd "$b/$t" | awk '/=> \//{print $3}' |
      grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*)\.so' |
      xargs -r cp -n -t .gpu_bundle/lib/
  done
  grep -qx '/.gpu_bundle/' .git/info/exclude 2>/dev/null || echo '/.gpu_bundle/' >>.git/info/exclude
  note "bundle ready: $(du -sh .gpu_bundle | cut -f1) in .gpu_bundle (carry it to the GPU machine)"
}
if [ "${1:-}" = "--bundle" ]; then bundle; exit $?; fi

# 0. Is there a GPU?
sim=${MC_GPU_CHECK_SIM:-0}
if [ "$sim" = 1 ]; then
  note "MC_GPU_CHECK_SIM=1: simulated devices, small buffers (a test of this script)"
  export MC_DEVICE_SIM=1
  nvidia-smi() { echo "simulated devices"; }
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  note "no NVIDIA GPU on this host (nvidia-smi missing or sees no device): nothing to check"
  exit 0
fi
nvidia-smi -L
start=$(date +%s)

# 1. Build, or use the bundle.
py=${PYTHON:-python3}
pyopt=OFF
"$py" -c 'import pybind11' 2>/dev/null && pyopt=ON
bin_test=""; bin_peer=""; bin_unit=""; bin_bench=""; bin_base=""; bin_store=""; pypath=""
if [ "${MC_GPU_CHECK_BUNDLE:-0}" != 1 ] &&  # MC_GPU_CHECK_BUNDLE=1: the bundle, no build
   cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMC_WERROR=OFF \
     -DMC_BUILD_PYTHON=$pyopt -DPython_EXECUTABLE="$(command -v "$py")" >"/tmp/gpu_check_cmake.log" 2>&1 &&
   ninja -C "$bdir" -j "$jobs" >"/tmp/gpu_check_build.log" 2>&1; then
  note "built in $bdir ($(( $(date +%s) - start )) s)"
  b=$root/$bdir
  bin_test=$b/tests/device_test; bin_peer=$b/tests/mp_peer
  bin_unit=$b/platform_device_test; bin_bench=$b/tools/transfer_engine_bench
  bin_base=$b/bench/gpu_baseline; bin_store=$b/src/store/client/store_client_device_test
  [ "$pyopt" = ON ] && pypath=$root/$bdir/python
  export MC_MASTER_BIN=$b/src/store/mooncake_master
  row build ok "$bdir"
elif [ -x .gpu_bundle/device_test ]; then
  note "build failed here (log: /tmp/gpu_check_cmake.log, /tmp/gpu_check_build.log): using .gpu_bundle"
  tail -n 5 /tmp/gpu_check_cmake.log /tmp/gpu_check_build.log 2>/dev/null
  export LD_LIBRARY_PATH=$root/.gpu_bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  b=$root/.gpu_bundle
  bin_test=$b/device_test; bin_peer=$b/mp_peer
  bin_unit=$b/platform_device_test; bin_bench=$b/transfer_engine_bench
  bin_base=$b/gpu_baseline; bin_store=$b/store_client_device_test
  row build "SKIP (prebuilt bundle used)" "configure/build failed on this host"
else
  note "build failed and no .gpu_bundle: see /tmp/gpu_check_cmake.log and /tmp/gpu_check_build.log"
  tail -n 20 /tmp/gpu_check_cmake.log /tmp/gpu_check_build.log 2>/dev/null
  exit 1
fi
export MC_TEST_MP_PEER=$bin_peer

# 2. GPU tests (the real CUDA backend: MC_DEVICE_SIM unset, except in the script's own test).
[ "$sim" = 1 ] || unset MC_DEVICE_SIM
[ "$sim" = 1 ] || export MC_STORE_DEVICE_TEST_REAL=1  # store_client_device_test: the real backend
for t in "$bin_unit" "$bin_test" "$bin_store"; do
  [ -x "$t" ] || { row "$(basename "${t:-store_client_device_test}")" SKIP "not built"; continue; }
  name=$(basename "$t")
  if timeout 120 "$t" --gtest_brief=1 >"/tmp/gpu_check_$name.log" 2>&1; then
    skipped=$(grep -c '\[  SKIPPED \]' "/tmp/gpu_check_$name.log")
    row "$name" ok "$(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "/tmp/gpu_check_$name.log" | tail -1), $skipped skipped"
  else
    failures=$((failures + 1))
    grep -E 'FAILED|Failure|error' "/tmp/gpu_check_$name.log" | head -n 20
    row "$name" FAIL "log /tmp/gpu_check_$name.log"
  fi
done

# 3. Python: torch CUDA tensors, the seed pair.
have_torch_cuda=0
if [ -n "$pypath" ] &&
   PYTHONPATH=$pypath "$py" -c 'import torch, mooncake.engine; assert torch.cuda.is_available()' 2>/dev/null; then
  have_torch_cuda=1
fi
if [ $have_torch_cuda = 1 ]; then
  if PYTHONPATH=$pypath:$root/tests/python timeout 180 "$py" -m pytest -q tests/python/test_cuda.py \
       tests/python/test_tensor_into_cuda.py >/tmp/gpu_check_pytest.log 2>&1; then
    row "pytest test_cuda.py test_tensor_into_cuda.py" ok "$(tail -n 1 /tmp/gpu_check_pytest.log)"
  else
    failures=$((failures + 1)); tail -n 30 /tmp/gpu_check_pytest.log
    row "pytest test_cuda.py test_tensor_into_cuda.py" FAIL "log /tmp/gpu_check_pytest.log"
  fi
  if PYTHONPATH=$pypath PYTHON=$py timeout 150 examples/python/run_pair.sh >/tmp/gpu_check_pair.log 2>&1 &&
     grep -q 'target_device cuda:0' /tmp/gpu_check_pair.log; then
    row "seed pair (cuda:0 tensors)" ok "$(grep -E '^(target|initiator)_device|matched_bytes' /tmp/gpu_check_pair.log | tr '\n' ' ')"
  else
    failures=$((failures + 1)); cat /tmp/gpu_check_pair.log
    row "seed pair (cuda:0 tensors)" FAIL "log /tmp/gpu_check_pair.log"
  fi
else
  if [ -z "$pypath" ]; then
    why="no mooncake.engine built for $py (pybind11 missing there, or the prebuilt bundle was used)"
  else
    why="$py has no torch with a usable GPU"
  fi
  note "SKIP Python steps: $why"
  row "pytest test_cuda.py" SKIP "$why"
  row "seed pair (cuda:0 tensors)" SKIP "$why"
fi

# 4. Bench: 16 MiB blocks, 1 GiB buffers on each side.
bs=16777216; buf=${MC_GPU_CHECK_BUFFER:-1073741824}
pair() {  # pair <label> <target flags> -- <initiator flags>: prints the initiator's JSON line
  local label=$1; shift
  local tflags=() iflags=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do tflags+=("$1"); shift; done
  shift
  iflags=("$@")
  "$bin_bench" --mode=target --buffer_size=$buf "${tflags[@]}" >/tmp/gpu_check_target.log 2>&1 &
  local tp=$! seg=""
  for _ in $(seq 1 100); do
    grep -q "Target segment name" /tmp/gpu_check_target.log && break
    kill -0 $tp 2>/dev/null || break
    sleep 0.1
  done
  seg=$(grep -Eo 'listening on [^[:space:]]+' /tmp/gpu_check_target.log | tail -1 | awk '{print $3}')
  if [ -z "$seg" ]; then
    kill $tp 2>/dev/null; wait $tp 2>/dev/null
    echo "target failed: $(tail -n 3 /tmp/gpu_check_target.log)" >&2
    return 1
  fi
  timeout 60 "$bin_bench" --mode=initiator --segment_id="$seg" --buffer_size=$buf --block_size=$bs \
    --batch_size=16 --threads=2 --duration=3 --json --verify "${iflags[@]}" \
    >"/tmp/gpu_check_$label.log" 2>&1
  local rc=$?
  kill $tp 2>/dev/null; wait $tp 2>/dev/null
  [ $rc -eq 0 ] || { tail -n 5 "/tmp/gpu_check_$label.log" >&2; return 1; }
  grep -q "matched_bytes $buf" "/tmp/gpu_check_$label.log" || return 1
  grep '^{' "/tmp/gpu_check_$label.log" | tail -n 1
}
gbps() { sed -E 's/.*"gbps":([0-9.]+).*/\1/'; }
last_gbps=0
bench_row() {  # bench_row <label> <description> <pair args...>; sets last_gbps
  local label=$1 desc=$2; shift 2
  local j
  if j=$(pair "$label" "$@"); then
    last_gbps=$(echo "$j" | gbps)
    row "$desc" ok "$last_gbps GB/s"
  else
    last_gbps=0
    failures=$((failures + 1)); row "$desc" FAIL "log /tmp/gpu_check_$label.log"
  fi
}
base=$("$bin_base" d2d --block_size $bs --batch 16 --duration 3 2>/tmp/gpu_check_base.log | gbps)
if [ -n "$base" ]; then row "cudaMemcpy D2D baseline, 16 MiB" ok "$base GB/s"; else
  failures=$((failures + 1)); row "cudaMemcpy D2D baseline" FAIL "$(cat /tmp/gpu_check_base.log)"; base=0; fi
bench_row ipc_write "GPU->GPU write, cuda_ipc, 16 MiB" --gpu_id=0 -- --gpu_id=0 --operation=write
ipc_w=$last_gbps
bench_row ipc_read "GPU<-GPU read, cuda_ipc, 16 MiB" --gpu_id=0 -- --gpu_id=0 --operation=read
bench_row tcp_g2h "GPU->host write, tcp, 16 MiB" -- --gpu_id=0 --operation=write --protocol=tcp
bench_row tcp_h2g "host->GPU write, tcp, 16 MiB" --gpu_id=0 -- --operation=write --protocol=tcp
h2d=$("$bin_base" h2d --block_size $bs --batch 16 --duration 2 2>/dev/null | gbps)
[ -n "$h2d" ] && row "cudaMemcpy H2D pinned baseline" ok "$h2d GB/s"
ratio=$(awk -v a="$ipc_w" -v b="$base" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "n/a" }')
row "cuda_ipc write / D2D baseline (target >= 80%)" info "$ratio"

# 5. UCX: GPU memory registered with UCX and moved by it (cuda_ipc on one host), where the
#    UCX library in use was built with CUDA; otherwise the staging paths above stay in charge.
if ! command -v ucx_info >/dev/null 2>&1; then
  row "ucx GPU->GPU, 16 MiB" SKIP "ucx_info not found (apt-get install ucx-utils libucx0)"
elif ! ucx_info -d 2>/dev/null | grep -Eq 'Transport: (cuda_copy|cuda_ipc)'; then
  row "ucx GPU->GPU, 16 MiB" SKIP "UCX $(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p') here has no CUDA transport (ucx_info -d): device memory stays on cuda_ipc/tcp staging"
else
  bench_row ucx_write "GPU->GPU write, ucx, 16 MiB" --gpu_id=0 -- --gpu_id=0 --operation=write --protocol=ucx
  ucx_w=$last_gbps
  bench_row ucx_read "GPU<-GPU read, ucx, 16 MiB" --gpu_id=0 -- --gpu_id=0 --operation=read --protocol=ucx
  ratio=$(awk -v a="$ucx_w" -v b="$base" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "n/a" }')
  row "ucx write / D2D baseline" info "$ratio"
fi

# 6. The table.
echo
echo "gpu_check: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1), $(( $(date +%s) - start )) s"
printf '| %-46s | %-6s | %s\n' check result detail
printf '|%s|%s|%s\n' "------------------------------------------------" "--------" "------"
for r in "${results[@]}"; do
  IFS='|' read -r a b c <<<"$r"
  printf '| %-46s | %-6s | %s\n' "$a" "$b" "$c"
done
[ $failures -eq 0 ] && exit 0 || exit 1
