#!/usr/bin/env bash
# Packs the GPU tests and cserps-bench-gpu, built here (nvcc needs no GPU),
# with every shared library they load except the NVIDIA driver's and CUDA's
# own, and with this machine's C library and loader, into .gpu-bundle/ (git
# ignores it). A GPU machine that has CUDA but none of the Debian packages
# the build needs then runs them with
#
#   tools/gpu_check.sh --bundle .gpu-bundle
#
# (the device tool carries .gpu-bundle with the working tree; it must stay
# under its 64 MiB, so the binaries are stripped and the size is printed).
#
#   tools/gpu_bundle.sh            CUDA_ARCH (default 90) and BUILD_DIR (build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
BUNDLE=.gpu-bundle

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCSERPS_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target cserps_gpu_tests cserps-bench-gpu

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/sys"
binaries=("$BUILD_DIR"/bin/gpu_*_test "$BUILD_DIR/bin/cserps-bench-gpu")
for b in "${binaries[@]}"; do
  strip -o "$BUNDLE/bin/$(basename "$b")" "$b"
done

# The driver (libcuda) must be the GPU machine's; CUDA's libraries are large
# (cuBLASLt alone is over 500 MB) and that machine has the same major version.
# The C library goes to sys/ with its loader, which runs the binaries there.
ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case "$soname" in
      libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) ;;
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*)
        cp -L "$path" "$BUNDLE/sys/$soname" ;;
      *) cp -L "$path" "$BUNDLE/lib/$soname" ;;
    esac
  done
cp -L /lib64/ld-linux-x86-64.so.2 "$BUNDLE/sys/"

echo "gpu_bundle: $BUNDLE: $(ls "$BUNDLE/bin" | wc -l) binaries, $(ls "$BUNDLE/lib" "$BUNDLE/sys" | grep -c '\.so') libraries, $(du -sh "$BUNDLE" | cut -f1)"
