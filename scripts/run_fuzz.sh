#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ and runs each for a fixed time.
#
#   scripts/run_fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#
# Environment:
#   FUZZ_TARGETS   space-separated subset of targets (default: all of them)
#   FUZZ_BUILD     build directory (default: build-fuzz)
#   FUZZ_JOBS      parallel compile jobs (default: 2)
#   FUZZ_OUT       where crash inputs and logs go (default: $FUZZ_BUILD/out)
#   FUZZ_NO_DEPS=1 do not try to install missing packages
#
# Installs what is missing (clang with its libFuzzer runtime, cmake, glog, nlohmann-json,
# OpenSSL headers) with apt-get, idempotently; needs root or sudo for that. Fuzzes each target
# on a temporary copy of its seed corpus (fuzz/corpus/<target>, never modified), after
# replaying the saved crash inputs of fuzz/regressions/<target>. Prints the number of
# executions per target. Exit status: 0 when nothing crashed, 1 when a target crashed, hung,
# or a regression input still fails (the inputs are kept under $FUZZ_OUT), 2 on a setup or
# build error.
set -euo pipefail

SECONDS_PER_TARGET="${1:-60}"
if ! [[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]] || [ "$SECONDS_PER_TARGET" -lt 1 ]; then
  echo "usage: $0 [seconds per target (>= 1), default 60]" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FUZZ_BUILD:-$ROOT/build-fuzz}"
JOBS="${FUZZ_JOBS:-2}"
OUT="${FUZZ_OUT:-$BUILD/out}"
ALL_TARGETS="fuzz_handshake_frame fuzz_auth_exchange fuzz_segment_desc fuzz_tcp_session fuzz_tcp_server fuzz_shm_server fuzz_master_service fuzz_oplog_apply fuzz_master_rpc fuzz_real_client_wire fuzz_master_http fuzz_metadata_http"
TARGETS="${FUZZ_TARGETS:-$ALL_TARGETS}"

# libFuzzer flags per target: -max_len bounds the input size; -timeout (seconds) turns a
# hung input into a failure; the server targets need their own threads' time too.
target_flags() {
  case "$1" in
    fuzz_handshake_frame) echo "-max_len=8192 -timeout=10" ;;
    fuzz_auth_exchange) echo "-max_len=2048 -timeout=10" ;;
    fuzz_segment_desc) echo "-max_len=8192 -timeout=10" ;;
    fuzz_tcp_session|fuzz_tcp_server) echo "-max_len=40000 -timeout=20" ;;
    fuzz_shm_server) echo "-max_len=4096 -timeout=20" ;;
    fuzz_master_service) echo "-max_len=4096 -timeout=10" ;;
    fuzz_oplog_apply) echo "-max_len=16384 -timeout=10" ;;
    fuzz_master_rpc) echo "-max_len=8192 -timeout=30" ;;
    fuzz_real_client_wire) echo "-max_len=4096 -timeout=20" ;;
    fuzz_master_http) echo "-max_len=4096 -timeout=20" ;;
    fuzz_metadata_http) echo "-max_len=4096 -timeout=20" ;;
    *) echo "-timeout=20" ;;
  esac
}

log() { echo "run_fuzz: $*"; }

# ---------------------------------------------------------------- dependencies
fuzzer_runtime_ok() {
  command -v clang++ >/dev/null 2>&1 || return 1
  local d
  d="$(mktemp -d)"
  printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
    >"$d/t.cc"
  if clang++ -fsanitize=fuzzer,address,undefined "$d/t.cc" -o "$d/t" >/dev/null 2>&1; then
    rm -rf "$d"
    return 0
  fi
  rm -rf "$d"
  return 1
}

install_deps() {
  local pkgs=(clang cmake make libgoogle-glog-dev libgflags-dev nlohmann-json3-dev libssl-dev
              libprotobuf-dev protobuf-compiler libre2-dev)
  local missing=()
  if command -v dpkg-query >/dev/null 2>&1; then
    for p in "${pkgs[@]}"; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
  fi
  local need_rt=0
  if [ ${#missing[@]} -eq 0 ] && ! fuzzer_runtime_ok; then need_rt=1; fi
  if [ ${#missing[@]} -eq 0 ] && [ $need_rt -eq 0 ]; then return 0; fi
  if [ "${FUZZ_NO_DEPS:-0}" = 1 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "missing: ${missing[*]:-libFuzzer runtime}; install them (FUZZ_NO_DEPS=1 or no apt-get)" >&2
    return 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  log "installing ${missing[*]:-the libFuzzer runtime}"
  $sudo apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
  if ! fuzzer_runtime_ok; then
    # Debian 12 ships libFuzzer in libclang-rt-<N>-dev, older releases in libfuzzer-<N>-dev.
    local v
    v="$(clang++ --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "libclang-rt-$v-dev" ||
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "libfuzzer-$v-dev" || true
  fi
  fuzzer_runtime_ok || { log "clang++ cannot link -fsanitize=fuzzer programs" >&2; return 1; }
}

install_deps || exit 2
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mc-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# ---------------------------------------------------------------- build
log "building in $BUILD"
if ! cmake -S "$ROOT/fuzz" -B "$BUILD" -DCMAKE_CXX_COMPILER=clang++ >"$WORK/configure.log" 2>&1; then
  cat "$WORK/configure.log" >&2
  exit 2
fi
# A target the configure step left out (fuzz_master_service without protobuf / RE2) is
# skipped with a message rather than failing the build.
known="$(cmake --build "$BUILD" --target help 2>/dev/null || true)"
kept=""
for t in $TARGETS; do
  if grep -qw "$t" <<<"$known"; then kept="$kept $t"; else log "$t: not configured (fuzz_master_service and fuzz_master_http need protobuf and RE2, fuzz_metadata_http cpp-httplib); skipped"; fi
done
TARGETS="$kept"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "$JOBS" --target $TARGETS || exit 2

# ---------------------------------------------------------------- run
mkdir -p "$OUT"
failed=()
summary=()
for t in $TARGETS; do
  bin="$BUILD/$t"
  [ -x "$bin" ] || { log "no binary $bin" >&2; exit 2; }
  # shellcheck disable=SC2046
  read -r -a flags <<<"$(target_flags "$t")"
  mkdir -p "$OUT/$t"
  rm -f "$OUT/$t"/crash-* "$OUT/$t"/timeout-* "$OUT/$t"/oom-* "$OUT/$t"/leak-*

  # 1. Saved crash inputs: each must now pass.
  reg_failed=0
  if [ -d "$ROOT/fuzz/regressions/$t" ] && [ -n "$(ls -A "$ROOT/fuzz/regressions/$t")" ]; then
    for f in "$ROOT/fuzz/regressions/$t"/*; do
      [ -f "$f" ] || continue
      case "$f" in *.md|*.txt) continue ;; esac
      if ! "$bin" "${flags[@]}" "$f" >"$WORK/$t.regression.log" 2>&1; then
        log "$t: regression input $(basename "$f") still fails:" >&2
        grep -E "FUZZ ORACLE FAILURE|ERROR: |SUMMARY:|runtime error" "$WORK/$t.regression.log" | head -5 >&2 || true
        cp "$WORK/$t.regression.log" "$OUT/$t/regression-$(basename "$f").log"
        reg_failed=1
      fi
    done
  fi

  # 2. Fuzz on a temporary copy of the seeds (the repository's corpus never grows).
  corpus="$WORK/corpus-$t"
  mkdir -p "$corpus"
  if [ -d "$ROOT/fuzz/corpus/$t" ]; then cp -r "$ROOT/fuzz/corpus/$t/." "$corpus/"; fi
  logf="$OUT/$t/fuzz.log"
  log "$t: fuzzing for ${SECONDS_PER_TARGET}s"
  set +e
  "$bin" "${flags[@]}" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
    -rss_limit_mb=4096 -artifact_prefix="$OUT/$t/" "$corpus" >"$logf" 2>&1
  rc=$?
  set -e
  execs="$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$logf" | tail -1)"
  if [ -z "$execs" ]; then
    # No final stats (the process died): take the last progress line.
    execs="$(sed -n 's/^#\([0-9]*\).*/\1/p' "$logf" | tail -1)"
    execs="${execs:-0}"
  fi
  artifacts="$(ls "$OUT/$t" | grep -E '^(crash|timeout|oom|leak)-' || true)"
  status=ok
  if [ $rc -ne 0 ] || [ -n "$artifacts" ]; then
    status="FAILED (exit $rc)"
    log "$t: FAILED; log: $logf" >&2
    grep -E "FUZZ ORACLE FAILURE|ERROR: |SUMMARY:|runtime error|Test unit written" "$logf" | head -8 >&2 || true
    failed+=("$t")
  elif [ $reg_failed -ne 0 ]; then
    status="FAILED (regression input)"
    failed+=("$t")
  fi
  summary+=("$(printf '%-22s %12s executions  %s' "$t" "$execs" "$status")")
done

echo
echo "run_fuzz: ${SECONDS_PER_TARGET}s per target"
for line in "${summary[@]}"; do echo "  $line"; done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run_fuzz: FAILED: ${failed[*]} (inputs and logs under $OUT)"
  exit 1
fi
echo "run_fuzz: no crashes"
