#!/usr/bin/env bash
# Installs what is missing, builds cserps and every test, and runs them all
# through ctest. A second build with clang checks the thread-safety
# annotations (-Wthread-safety; g++ ignores them) of the binaries, and,
# built with AddressSanitizer and UndefinedBehaviorSanitizer, runs each
# libFuzzer target for a few seconds (tools/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
jobs=$(nproc)

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j"$jobs"

cmake -S . -B "$BUILD_DIR-clang" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DCSERPS_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug -DCSERPS_FUZZ=ON
cmake --build "$BUILD_DIR-clang" -j"$jobs" --target cserps_server cserps_trainer cserps-worker \
  cserps-launch cserps_fuzz_targets

ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$jobs"
tools/fuzz.sh "${CSERPS_FUZZ_SECONDS:-10}" "$BUILD_DIR-clang"
