#!/usr/bin/env bash
# Runs every libFuzzer target of a CSERPS_FUZZ build (tools/test.sh makes
# build-clang one) for SECONDS each, from its committed corpus
# (tests/fuzz/corpus/TARGET, and configs/ for the config loader; read only:
# what the run finds goes to a scratch folder) and prints its executions and
# coverage. A crash, a sanitizer report or a hang fails the script, and the
# input that caused it is copied to fuzz-artifacts/ to be kept as
# regression corpus once fixed.
#   tools/fuzz.sh [SECONDS] [BUILD_DIR]      (default 10, build-clang)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
build=${2:-build-clang}
work=$(mktemp -d /tmp/cserps-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
# Debian's gRPC and protobuf are not instrumented: their containers'
# annotations would be reported falsely.
export ASAN_OPTIONS=detect_container_overflow=0:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OPENBLAS_NUM_THREADS=1

for target in config_fuzz idx_fuzz checkpoint_fuzz request_fuzz bulk_frame_fuzz; do
  seeds=(tests/fuzz/corpus/"$target")
  if [ "$target" = config_fuzz ]; then seeds+=(configs); fi
  mkdir -p "$work/$target"
  # The shards of the request and bulk frame targets run threads whose
  # allocations outlive an input; leaks are checked for the others.
  leaks=1
  if [ "$target" = request_fuzz ] || [ "$target" = bulk_frame_fuzz ]; then leaks=0; fi
  # --foreground keeps the target in this terminal's process group, so that
  # Ctrl-C reaches it (timeout alone moves it to a group of its own).
  rc=0
  timeout --foreground $((seconds * 3 + 60)) "$build/bin/$target" -max_total_time="$seconds" \
    -timeout=20 -rss_limit_mb=4096 -detect_leaks=$leaks -print_final_stats=1 \
    -artifact_prefix="$work/$target-" "$work/$target" "${seeds[@]}" \
    >"$work/$target.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    # timeout's own TERM (a hang, exit 124) reads "interrupted" too.
    if [ "$rc" -ne 124 ] && grep -q '^==[0-9]*== libFuzzer: run interrupted' "$work/$target.log"; then
      echo "fuzz: interrupted" >&2
      exit 130
    fi
    echo "fuzz: $target FAILED"
    tail -n 60 "$work/$target.log"
    mkdir -p fuzz-artifacts
    cp "$work/$target"-* fuzz-artifacts/ 2>/dev/null || true
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$target.log")
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$work/$target.log" | tail -n 1)
  echo "fuzz: $target: $runs executions in ${seconds}s, $cov, crashes 0"
done
