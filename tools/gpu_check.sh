#!/usr/bin/env bash
# Checks the CUDA backend on a machine with a GPU, in one go (about a minute
# on one H200): runs every GPU test binary, cserps-bench-gpu, the main job
# (configs/quickstart.textproto through cserps-launch, --backend=cuda then
# cpu) and the Python front's CUDA test (when the Python has pytest and a
# torch that sees the GPU; a bundle's module is built there by
# tools/gpu_native.sh), then, since such a machine has more cores than a
# development one, the wire and scale benches (about two minutes more), and
# ends with one summary table.
#
#   tools/gpu_check.sh                      build here (Release, -DCSERPS_CUDA=ON), then run
#   tools/gpu_check.sh --bundle .gpu-bundle run what tools/gpu_bundle.sh packed
#
# The bundle is for GPU machines without the Debian packages the build needs
# (the device tool's): binaries built on a development machine, run with
# the bundle's libraries and the machine's driver and CUDA libraries, on the
# machine's C library when it is at least the bundle's, else on the
# bundle's own loader and C library.
#
# CUDA_ARCH   CMAKE_CUDA_ARCHITECTURES when building, default 90 (H100/H200)
# BUILD_DIR   build directory, default build-gpu-check
# PYTHON      with --bundle, the Python to build cserps_native for and run
#             the CUDA test with, default python3
# OUT         when set, the whole log is also written to $OUT/gpu_check.log
#
# Fails (non-zero) when the build, a GPU test, the benchmark or the main job
# fails, when no GPU test exists, or when any GPU test was SKIPPED although
# nvidia-smi lists a GPU: a skip there means the tests did not see the
# device, which must not pass for success. Without a GPU the tests skip, the
# main job is not run, the benchmark measures
# nothing, and the script says so and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

BUILD_DIR=${BUILD_DIR:-build-gpu-check}
CUDA_ARCH=${CUDA_ARCH:-90}
BUNDLE=""
if [ "${1:-}" = "--bundle" ]; then
  BUNDLE=$(cd "${2:?--bundle DIR}" && pwd) || exit 1
fi
JOBS=$(nproc)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# tools/gpu_bundle.sh packs the bundle into one tarball (the device tool's
# carry limit); it is unpacked into the work directory (by Python where
# no xz is installed).
if [ -n "$BUNDLE" ] && [ -f "$BUNDLE/bundle.tar.xz" ]; then
  mkdir -p "$WORK/bundle"
  tar -C "$WORK/bundle" -xJf "$BUNDLE/bundle.tar.xz" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$BUNDLE/bundle.tar.xz" "$WORK/bundle" || exit 1
  BUNDLE=$WORK/bundle
fi

# Directories holding the driver's and CUDA's libraries on this machine, for
# the bundle's loader (which does not read this machine's configuration).
# The loader's cache first; then LD_LIBRARY_PATH and the driver's usual
# mount; a search (one `find`, bounded) only for the names still missing.
# CUDA's compat/ libcuda is skipped: it may not match the kernel's driver.
cuda_library_path() {
  local names=(libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)
  local dirs=() missing=() name found d
  for name in "${names[@]}"; do
    found=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n {print $NF; exit}')
    if [ -z "$found" ]; then
      for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }} /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        if [ -e "$d/$name" ]; then found=$d/$name; break; fi
      done
    fi
    if [ -n "$found" ]; then
      dirs+=("$(dirname "$(readlink -f "$found")")")
    else
      missing+=("$name")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    local roots=(/usr/local/cuda/ /usr/lib/x86_64-linux-gnu/ /usr/lib64/ /opt/)
    # pip's nvidia-* wheels keep their libraries under site-packages/nvidia/.
    roots+=($(python3 -c 'import site; print(*site.getsitepackages())' 2>/dev/null))
    local expr=() path
    for name in "${missing[@]}"; do expr+=(-o -name "$name"); done
    while read -r path; do
      name=$(basename "$path")
      # One directory per name: the first found.
      if [[ " ${missing[*]} " == *" $name "* ]]; then
        dirs+=("$(dirname "$(readlink -f "$path")")")
        missing=("${missing[@]/$name}")
      fi
    done < <(timeout 60 find "${roots[@]}" -maxdepth 6 -path '*/compat/*' -prune \
               -o \( -false "${expr[@]}" \) -print 2>/dev/null)
  fi
  printf '%s\n' "${dirs[@]}" | awk 'NF && !seen[$0]++' | paste -sd: -
}

# Whether this machine's C library is at least the bundle's: then the
# bundled binaries run on it, as the machine's CUDA libraries expect (its
# NCCL may need a newer C library than the bundle's); else on the bundle's.
system_libc_will_do() {
  local mine bundled
  mine=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  bundled=$(cat "$BUNDLE/sys/glibc_version" 2>/dev/null)
  [ -n "$mine" ] && [ -n "$bundled" ] && [ -e /lib64/ld-linux-x86-64.so.2 ] &&
    [ "$(printf '%s\n%s\n' "$bundled" "$mine" | sort -V | head -1)" = "$bundled" ]
}

# Sets CMD to the command line that runs the built or bundled binary $1.
binary_command() {
  if [ -n "$BUNDLE" ] && system_libc_will_do; then
    CMD=(/lib64/ld-linux-x86-64.so.2 --library-path "$BUNDLE/lib:$CUDA_PATH"
         "$BUNDLE/bin/$1")
  elif [ -n "$BUNDLE" ]; then
    CMD=("$BUNDLE/sys/ld-linux-x86-64.so.2" --library-path "$BUNDLE/lib:$BUNDLE/sys:$CUDA_PATH"
         "$BUNDLE/bin/$1")
  else
    CMD=("$BUILD_DIR/bin/$1")
  fi
}

# Sets job_result: configs/quickstart.textproto run by cserps-launch from
# $1 (servers and 4 workers on 127.0.0.1) with --backend=cuda (the workers
# share the GPU) and then --backend=cpu, each worker's test accuracy and the
# wall time. A bundle's launcher starts its children directly, so they load
# on this machine's C library with the bundle's libraries: that needs
# system_libc_will_do, and the bundle's copy of the data.
run_jobs() {
  local bin=$1 data="" env=() backend rc t0 acc
  if [ -n "$BUNDLE" ]; then
    if ! system_libc_will_do || [ ! -d "$BUNDLE/data" ] || [ ! -x "$bin/cserps-launch" ]; then
      job_result="skipped (the bundle's launcher needs this machine's C library >= the bundle's, and its data)"
      return
    fi
    data=$BUNDLE/data
    env=(env "LD_LIBRARY_PATH=$BUNDLE/lib:$CUDA_PATH")
  fi
  job_result=""
  for backend in cuda cpu; do
    echo "--- quickstart job, --backend=$backend"
    t0=$SECONDS
    rc=0
    timeout 300 "${env[@]}" "$bin/cserps-launch" --config=configs/quickstart.textproto \
      --bin_dir="$bin" --backend="$backend" \
      --set="log_every_steps=0;output_dir=$WORK/job-$backend${data:+;data.dir=$data}" \
      >"$WORK/job-$backend.txt" 2>&1 || rc=$?
    tail -n 12 "$WORK/job-$backend.txt"
    if [ "$rc" -ne 0 ]; then
      job_result+="$backend FAILED (exit $rc); "
      failures+=("main job ($backend)")
      continue
    fi
    acc=$(awk '/^rank +test_acc/ {t = 1; next} t && $1 ~ /^[0-9]+$/ {print $2}' "$WORK/job-$backend.txt" |
          sort -u | paste -sd/ -)
    job_result+="$backend: test accuracy $acc in $((SECONDS - t0)) s; "
  done
  job_result=${job_result%; }
}

# Sets package and bin: cserps_native built by tools/gpu_native.sh from the
# bundle's kit for $1, and scripts that start the bundle's programs (the
# tests start them by name from CSERPS_BIN_DIR, and cserps-launch its own
# from the directory it is in). Returns 3 when this machine cannot build
# the module (python_result says why), 1 when the build fails.
bundle_python_module() {
  local py=$1 rc=0 program
  package=$WORK/python
  bin=$WORK/python-bin
  PYTHON=$py CUDA_PATH=$CUDA_PATH timeout 300 tools/gpu_native.sh "$BUNDLE" "$package" \
    >"$WORK/native.txt" 2>&1 || rc=$?
  tail -n 20 "$WORK/native.txt"
  if [ "$rc" -eq 3 ]; then
    python_result="not run (cserps_native cannot be built here: $(tail -n 1 "$WORK/native.txt"))"
    return 3
  elif [ "$rc" -ne 0 ]; then
    return 1
  fi
  mkdir -p "$bin"
  for program in cserps-server cserps-worker cserps-launch; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$BUNDLE/lib:$CUDA_PATH" \
      "$BUNDLE/bin/$program" >"$bin/$program"
    chmod +x "$bin/$program"
  done
}

# Sets python_result: the Python front's CUDA tensors (tests/python/test_cuda.py)
# through cserps_native, when the Python it is built for has pytest and a
# torch that sees the GPU; a skip there is a failure. A build's module is
# built for CMake's Python_EXECUTABLE (/usr/bin/python3 unless configured
# otherwise); a bundle's, by tools/gpu_native.sh from the bundle's kit, for
# $PYTHON (default python3: on the device tool's machines, the one with
# CUDA torch), its servers started from the bundle.
run_python_cuda() {
  local py package bin rc=0 other="-DPython_EXECUTABLE"
  if [ -n "$BUNDLE" ]; then
    other="PYTHON="
    if ! system_libc_will_do; then
      python_result="not run (the bundle's libraries need this machine's C library >= the bundle's)"
      return
    fi
    py=${PYTHON:-python3}
  else
    py=$(sed -n 's/^_\{0,1\}Python_EXECUTABLE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" | head -n 1)
    if [ -z "$py" ]; then
      python_result="not run (the build found no Python)"
      return
    fi
  fi
  if ! "$py" -c 'import pytest, torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
      2>/dev/null; then
    python_result="not run ($py has no pytest, or no torch that sees a GPU; another Python: $other)"
    return
  fi
  if [ -n "$BUNDLE" ]; then
    bundle_python_module "$py" || rc=$?
    if [ "$rc" -eq 3 ]; then
      return
    elif [ "$rc" -ne 0 ]; then
      python_result="FAILED: cserps_native did not build from the bundle for $py"
      failures+=("Python module from the bundle")
      return
    fi
  else
    package=$BUILD_DIR/python
    bin=$BUILD_DIR/bin
    if ! cmake --build "$BUILD_DIR" -j"$JOBS" --target cserps_native >"$WORK/native.txt" 2>&1; then
      tail -n 20 "$WORK/native.txt"
      python_result="not run (cserps_native did not build for $py: pybind11 and its headers?)"
      return
    fi
  fi
  local t0=$SECONDS
  rc=0
  echo "--- pytest tests/python/test_cuda.py ($("$py" -c 'import torch; print("torch", torch.__version__)'))"
  PYTHONPATH="$package" CSERPS_BIN_DIR="$bin" PYTHONDONTWRITEBYTECODE=1 \
    timeout 300 "$py" -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda.py \
    >"$WORK/python.txt" 2>&1 || rc=$?
  cat "$WORK/python.txt"
  if [ "$rc" -ne 0 ]; then
    python_result="FAILED, exit $rc ($((SECONDS - t0)) s)"
    failures+=("Python CUDA tests")
  elif grep -q 'skipped' "$WORK/python.txt"; then
    python_result="SKIPPED although torch sees a GPU ($((SECONDS - t0)) s)"
    failures+=("Python CUDA tests SKIPPED")
  else
    python_result="ok ($((SECONDS - t0)) s)"
  fi
}

# Sets wire_result: cserps-bench-wire and cserps-bench-scale from $1 on this
# machine's cores (docs/results/wire.md and scale.md measure them on two),
# short cases, each bench bounded in time.
run_wire_benches() {
  local bin=$1 env=() rc bench t0=$SECONDS
  if [ -n "$BUNDLE" ]; then
    if ! system_libc_will_do || [ ! -x "$bin/cserps-bench-wire" ]; then
      wire_result="skipped (the bundle's benches start servers, which needs this machine's C library >= the bundle's)"
      return
    fi
    env=(env "LD_LIBRARY_PATH=$BUNDLE/lib:$CUDA_PATH")
  fi
  wire_result=""
  for bench in wire scale; do
    echo "--- cserps-bench-$bench ($(nproc) CPUs)"
    local args=(--server="$bin/cserps-server" --seconds=1)
    if [ "$bench" = wire ]; then
      args+=(--sizes=65536,4194304,67108864 --layouts=1x1,2x2,4x4 --grbs_ratios=256)
    else
      args+=(--sizes=4194304 --layouts=1x2,1x16,4x16 --grbs_ratios=)
    fi
    rc=0
    timeout 240 "${env[@]}" "$bin/cserps-bench-$bench" "${args[@]}" >"$WORK/$bench.txt" 2>&1 || rc=$?
    cat "$WORK/$bench.txt"
    if [ "$rc" -ne 0 ]; then
      wire_result+="$bench FAILED (exit $rc); "
      failures+=("cserps-bench-$bench")
    else
      wire_result+="$bench ok; "
    fi
  done
  wire_result="${wire_result%; } ($((SECONDS - t0)) s)"
}

# NCCL says why it cannot start (a sandbox without /sys, say) instead of
# failing with a bare ncclSystemError.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

main() {
  local failures=() gpu_listing="" have_gpu=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_listing=$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)
  fi
  [ -n "$gpu_listing" ] && have_gpu=1
  local what="arch sm_${CUDA_ARCH}, ${JOBS} jobs, build ${BUILD_DIR}"
  [ -n "$BUNDLE" ] && what="bundle $BUNDLE"
  echo "== gpu_check: $(date -u +%FT%TZ), $what"
  if [ "$have_gpu" = 1 ]; then
    echo "$gpu_listing"
  else
    echo "nvidia-smi lists no GPU"
  fi

  # --- build -------------------------------------------------------------
  local t0=$SECONDS build_result bin_dir
  CUDA_PATH=""
  # The tests below are every gpu_*_test in the build's bin/: the binary of
  # a test renamed or removed since the last build there would still run.
  # The current ones are relinked.
  if [ -z "$BUNDLE" ]; then rm -f "$BUILD_DIR"/bin/gpu_*_test; fi
  if [ -n "$BUNDLE" ]; then
    CUDA_PATH=$(cuda_library_path)
    build_result="bundle (CUDA libraries from ${CUDA_PATH:-nowhere found})"
    bin_dir=$BUNDLE/bin
  elif cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCSERPS_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" &&
       cmake --build "$BUILD_DIR" -j"$JOBS" --target cserps_gpu_tests cserps-bench-gpu \
         cserps-launch cserps-server cserps-worker cserps-bench-wire cserps-bench-scale; then
    build_result="ok ($((SECONDS - t0)) s)"
    bin_dir=$BUILD_DIR/bin
  else
    build_result="FAILED ($((SECONDS - t0)) s)"
    failures+=("build")
  fi

  # --- tests -------------------------------------------------------------
  local tests_result="not run" bench_result="not run"
  if [ ${#failures[@]} -eq 0 ]; then
    t0=$SECONDS
    local total=0 passed=0 failed=0 skipped=0 test name rc CMD
    for test in "$bin_dir"/gpu_*_test; do
      [ -x "$test" ] || continue
      name=$(basename "$test")
      total=$((total + 1))
      echo "--- $name"
      binary_command "$name"
      timeout 120 "${CMD[@]}" >"$WORK/$name.txt" 2>&1
      rc=$?
      cat "$WORK/$name.txt"
      if [ $rc -ne 0 ]; then
        failed=$((failed + 1))
      elif grep -q '^\[  SKIPPED \]' "$WORK/$name.txt"; then
        skipped=$((skipped + 1))
      else
        passed=$((passed + 1))
      fi
    done
    tests_result="${passed} passed, ${failed} failed, ${skipped} skipped of ${total} binaries ($((SECONDS - t0)) s)"
    [ "$total" -eq 0 ] && failures+=("no GPU tests found")
    [ "$failed" -ne 0 ] && failures+=("GPU tests")
    if [ "$skipped" -ne 0 ] && [ "$have_gpu" = 1 ]; then
      failures+=("GPU tests SKIPPED on a machine with a GPU")
      echo
      echo "!!! FAIL: ${skipped} GPU test binaries SKIPPED although nvidia-smi lists a GPU:"
      grep -l '^\[  SKIPPED \]' "$WORK"/gpu_*_test.txt | sed 's/^/!!!   /'
      echo "!!! The tests did not see the device (CUDA_VISIBLE_DEVICES? driver?)."
    fi

    # --- benchmark -------------------------------------------------------
    t0=$SECONDS
    binary_command cserps-bench-gpu
    timeout 180 "${CMD[@]}" 2>&1 | tee "$WORK/bench.txt"
    local bench_rc=${PIPESTATUS[0]}
    if [ "$bench_rc" -eq 0 ]; then
      bench_result="ok ($((SECONDS - t0)) s)"
    else
      bench_result="FAILED, exit ${bench_rc} ($((SECONDS - t0)) s)"
      failures+=("benchmark")
    fi
  fi

  # --- the main job, end to end ------------------------------------------
  local job_result="not run (no GPU listed)"
  if [ ${#failures[@]} -eq 0 ] && [ "$have_gpu" = 1 ]; then
    run_jobs "$bin_dir"
  fi

  # --- the Python front on the GPU -----------------------------------------
  local python_result="not run (no GPU listed)"
  if [ ${#failures[@]} -eq 0 ] && [ "$have_gpu" = 1 ]; then
    run_python_cuda
  fi

  # --- the wire path on this machine's cores -------------------------------
  local wire_result="not run (no GPU listed)"
  if [ ${#failures[@]} -eq 0 ] && [ "$have_gpu" = 1 ]; then
    run_wire_benches "$bin_dir"
  fi

  # --- summary -----------------------------------------------------------
  echo
  echo "== gpu_check summary"
  printf '| %-10s | %s\n' "gpu" "$([ "$have_gpu" = 1 ] && echo "$gpu_listing" | head -1 || echo "none listed by nvidia-smi")"
  printf '| %-10s | %s\n' "build" "$build_result"
  printf '| %-10s | %s\n' "gpu tests" "$tests_result"
  printf '| %-10s | %s\n' "benchmark" "$bench_result"
  printf '| %-10s | %s\n' "main job" "$job_result"
  printf '| %-10s | %s\n' "python" "$python_result"
  printf '| %-10s | %s\n' "wire" "$wire_result"
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
    echo "gpu_check: NO GPU HERE: tests skipped, nothing measured"
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
