#!/usr/bin/env bash
# Checks the CUDA backend on a machine with a GPU, in one go (well under 8
# minutes on one H200): configures and builds the GPU tests and
# cserps-bench-gpu (Release, -DCSERPS_CUDA=ON), runs `ctest -L gpu`, runs the
# benchmark, and ends with one summary table.
#
#   tools/gpu_check.sh
#   CUDA_ARCH=80 BUILD_DIR=build-a100 tools/gpu_check.sh
#
# CUDA_ARCH   CMAKE_CUDA_ARCHITECTURES, default 90 (H100/H200, sm_90)
# BUILD_DIR   build directory, default build-gpu-check
# OUT         when set, the whole log is also written to $OUT/gpu_check.log
#
# Fails (non-zero) when the build, a GPU test or the benchmark fails, when no
# GPU test exists, or when any GPU test was SKIPPED although nvidia-smi lists
# a GPU: a skip there means the tests did not see the device, which must not
# pass for success. Without a GPU the tests skip, the benchmark measures
# nothing, and the script says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD_DIR=${BUILD_DIR:-build-gpu-check}
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=$(nproc)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

main() {
  local failures=() gpu_listing="" have_gpu=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_listing=$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)
  fi
  [ -n "$gpu_listing" ] && have_gpu=1
  echo "== gpu_check: $(date -u +%FT%TZ), arch sm_${CUDA_ARCH}, ${JOBS} jobs, build ${BUILD_DIR}"
  if [ "$have_gpu" = 1 ]; then
    echo "$gpu_listing"
  else
    echo "nvidia-smi lists no GPU"
  fi

  # --- build -------------------------------------------------------------
  local t0=$SECONDS build_result
  if cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCSERPS_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" &&
     cmake --build "$BUILD_DIR" -j"$JOBS" --target cserps_gpu_tests cserps-bench-gpu; then
    build_result="ok ($((SECONDS - t0)) s)"
  else
    build_result="FAILED ($((SECONDS - t0)) s)"
    failures+=("build")
  fi

  # --- tests -------------------------------------------------------------
  local tests_result="not run" bench_result="not run"
  if [ ${#failures[@]} -eq 0 ]; then
    t0=$SECONDS
    ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure --timeout 300 \
      2>&1 | tee "$WORK/ctest.txt"
    local ctest_rc=${PIPESTATUS[0]}
    local total passed failed skipped
    total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$WORK/ctest.txt")
    passed=$(grep -E '^ *[0-9]+/[0-9]+ Test +#' "$WORK/ctest.txt" | grep -c ' Passed ')
    skipped=$(grep -c '\*\*\*Skipped' "$WORK/ctest.txt")
    failed=$((total - passed - skipped))
    tests_result="${passed} passed, ${failed} failed, ${skipped} skipped of ${total} ($((SECONDS - t0)) s)"
    if [ "$total" -eq 0 ]; then
      failures+=("no GPU tests found")
    fi
    if [ "$ctest_rc" -ne 0 ] || [ "$failed" -ne 0 ]; then
      failures+=("GPU tests")
    fi
    if [ "$skipped" -ne 0 ] && [ "$have_gpu" = 1 ]; then
      failures+=("GPU tests SKIPPED on a machine with a GPU")
      echo
      echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
      echo "!!! FAIL: ${skipped} GPU test(s) SKIPPED although nvidia-smi lists a GPU:"
      grep '\*\*\*Skipped' "$WORK/ctest.txt" | sed 's/^/!!!   /'
      echo "!!! The tests did not see the device (CUDA_VISIBLE_DEVICES? driver?)."
      echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    fi

    # --- benchmark -------------------------------------------------------
    t0=$SECONDS
    timeout 300 "$BUILD_DIR/bin/cserps-bench-gpu" 2>&1 | tee "$WORK/bench.txt"
    local bench_rc=${PIPESTATUS[0]}
    if [ "$bench_rc" -eq 0 ]; then
      bench_result="ok ($((SECONDS - t0)) s)"
    else
      bench_result="FAILED, exit ${bench_rc} ($((SECONDS - t0)) s)"
      failures+=("benchmark")
    fi
  fi

  # --- summary -----------------------------------------------------------
  echo
  echo "== gpu_check summary"
  printf '| %-10s | %s\n' "gpu" "$([ "$have_gpu" = 1 ] && echo "$gpu_listing" | head -1 || echo "none listed by nvidia-smi")"
  printf '| %-10s | %s\n' "build" "$build_result"
  printf '| %-10s | %s\n' "gpu tests" "$tests_result"
  printf '| %-10s | %s\n' "benchmark" "$bench_result"
  if [ -f "$WORK/bench.txt" ] && grep -q '^|' "$WORK/bench.txt"; then
    echo
    grep '^|' "$WORK/bench.txt"
  fi
  echo
  if [ ${#failures[@]} -ne 0 ]; then
    local joined
    joined=$(printf '%s; ' "${failures[@]}")
    echo "gpu_check: FAILED: ${joined%; }"
    return 1
  fi
  if [ "$have_gpu" = 0 ]; then
    echo "gpu_check: NO GPU HERE: built, tests skipped, nothing measured"
    return 0
  fi
  echo "gpu_check: OK"
}

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  main 2>&1 | tee "$OUT/gpu_check.log"
  exit "${PIPESTATUS[0]}"
fi
main
