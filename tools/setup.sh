#!/usr/bin/env bash
# Installs, only when missing, the Debian packages cserps needs.
# Non-interactive; runs `apt-get update` at most once.
#   tools/setup.sh           the build, the tests and the demo
#   tools/setup.sh --build   only the build (deploy/docker/Dockerfile)
#   tools/setup.sh --docker  a Docker engine, docker-compose and debootstrap
#                            (tools/compose_check.sh)
set -euo pipefail

build=(
  build-essential cmake pkg-config
  protobuf-compiler libprotobuf-dev
  protobuf-compiler-grpc libgrpc++-dev
  libabsl-dev
  prometheus-cpp-dev
  libgtest-dev libgmock-dev
  libopenblas-dev
  zlib1g-dev
  libssl-dev
  libspdlog-dev
)
tests=(clang libclang-rt-14-dev openssl python3 prometheus docker-compose dataset-fashion-mnist
  python3-dev pybind11-dev python3-torch python3-torchvision python3-pytest)
docker=(docker.io docker-compose debootstrap)

case "${1:-}" in
  "") packages=("${build[@]}" "${tests[@]}") ;;
  --build) packages=("${build[@]}") ;;
  --docker) packages=("${docker[@]}") ;;
  *) echo "usage: tools/setup.sh [--build|--docker]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

# Whether containerd ran here before (a container runtime of the host's
# own, which the Docker clean-up below must leave alone).
containerd_before=0
if dpkg-query -W -f='${Status}' containerd 2>/dev/null | grep -q "install ok installed"; then
  containerd_before=1
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
# The tests run Prometheus's binary themselves; the package also starts it
# as a service on every interface, on the port 9090 compose publishes.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus.service ||
    echo "setup: could not stop prometheus.service; stop it before compose publishes 9090" >&2
fi
# The compose check runs a Docker daemon of its own, without a bridge or
# iptables rules; the package would start the system's, which adds both and
# comes back at every boot. A Docker or containerd installed before setup
# ran is left as it is.
if [[ " ${missing[*]} " == *" docker.io "* ]] && [ -d /run/systemd/system ]; then
  units=(docker.socket docker.service)
  if [ "$containerd_before" -eq 0 ]; then units+=(containerd.service); fi
  $SUDO systemctl disable --now "${units[@]}" ||
    echo "setup: could not stop the Docker services the package started" >&2
fi
