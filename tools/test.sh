#!/usr/bin/env bash
# Installs what is missing, builds cserps and every test, and runs them all
# through ctest. A second build with clang checks the thread-safety
# annotations (-Wthread-safety; g++ ignores them) of the binaries, and,
# built with AddressSanitizer and UndefinedBehaviorSanitizer, runs the unit
# tests of common/ and server/ and each libFuzzer target for a few seconds
# (tools/fuzz.sh). A third, built with ThreadSanitizer, runs the server and
# PS client tests. docs/results/sanitizers.md has the rest of the suite
# under the sanitizers, which does not fit the time.
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
  cserps-launch cserps_fuzz_targets cserps_common_server_tests

cmake -S . -B "$BUILD_DIR-tsan" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DCSERPS_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug -DCSERPS_TSAN=ON
cmake --build "$BUILD_DIR-tsan" -j"$jobs" --target cserps_server_client_tests

ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$jobs"
# Debian's gRPC and protobuf are not instrumented: their containers'
# annotations would be reported falsely.
ASAN_OPTIONS=detect_container_overflow=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$BUILD_DIR-clang" --output-on-failure -j"$jobs" -R '^(common|server)_'
tools/fuzz.sh "${CSERPS_FUZZ_SECONDS:-10}" "$BUILD_DIR-clang"
ctest --test-dir "$BUILD_DIR-tsan" --output-on-failure -j"$jobs" -R '^(server|ps|tsan)_'
