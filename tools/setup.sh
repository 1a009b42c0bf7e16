#!/usr/bin/env bash
# Installs, only when missing, the Debian packages that the build, the tests
# and the demo need. Non-interactive; runs `apt-get update` at most once.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  protobuf-compiler libprotobuf-dev
  protobuf-compiler-grpc libgrpc++-dev
  libabsl-dev
  prometheus-cpp-dev
  libgtest-dev libgmock-dev
  libopenblas-dev
  zlib1g-dev
  libspdlog-dev
  clang
  python3
  prometheus
  docker-compose
  dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
