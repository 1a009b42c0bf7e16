#!/usr/bin/env bash
# Installs what is missing, builds cserps (Release) and trains the main job on
# a local cluster: 2 servers and 4 workers on 127.0.0.1, an MLP on
# Fashion-MNIST with S-SGD for 3 epochs (configs/quickstart.textproto).
# Extra arguments go to cserps-launch, e.g. --set='epochs=1'.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
BUILD_DIR=${BUILD_DIR:-build-release}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j"$(nproc)" --target cserps-server cserps-worker cserps-launch

start=$(date +%s)
"$BUILD_DIR/bin/cserps-launch" --config=configs/quickstart.textproto "$@"
echo "demo: the job took $(( $(date +%s) - start )) s after the build"
