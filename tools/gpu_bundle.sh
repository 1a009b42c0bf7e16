#!/usr/bin/env bash
# Packs the GPU tests, cserps-bench-gpu, the wire and scale benches and the
# three programs (with Fashion-MNIST, for gpu_check.sh's main job), built
# here (nvcc needs no GPU), with every shared library they load except the
# NVIDIA driver's and CUDA's own, and with this machine's C library and
# loader, into .gpu-bundle/ (git ignores it). A GPU machine that has CUDA
# but none of the Debian packages the build needs then runs them with
#
#   tools/gpu_check.sh --bundle .gpu-bundle
#
# (the device tool carries .gpu-bundle with the working tree; it must stay
# under its 64 MiB, so the binaries are stripped, everything is packed into
# one xz tarball, .gpu-bundle/bundle.tar.xz, which gpu_check.sh unpacks,
# and the size is printed).
#
#   tools/gpu_bundle.sh            CUDA_ARCH (default 90) and BUILD_DIR (build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-gpu}
CUDA_ARCH=${CUDA_ARCH:-90}
BUNDLE=.gpu-bundle

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCSERPS_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" >/dev/null
# The bundle takes every gpu_*_test in bin/: a test renamed or removed since
# the last build there must not come along. The current ones are relinked.
rm -f "$BUILD_DIR"/bin/gpu_*_test
cmake --build "$BUILD_DIR" -j"$(nproc)" --target cserps_gpu_tests cserps-bench-gpu \
  cserps-launch cserps-server cserps-worker cserps-bench-wire cserps-bench-scale cserps_native

rm -rf "$BUNDLE"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/sys"
binaries=("$BUILD_DIR"/bin/gpu_*_test "$BUILD_DIR"/bin/cserps-bench-{gpu,wire,scale}
          "$BUILD_DIR"/bin/cserps-{launch,server,worker})
for b in "${binaries[@]}"; do
  strip -o "$STAGE/bin/$(basename "$b")" "$b"
done

# The driver (libcuda) must be the GPU machine's; CUDA's libraries are large
# (cuBLASLt alone is over 500 MB) and that machine has the same major version.
# The C and C++ runtimes go to sys/ with the loader: used together on a
# machine whose own are older, left out where the machine's will do.
ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case "$soname" in
      libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) ;;
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libstdc++.so.*|libgcc_s.so.*)
        cp -L "$path" "$STAGE/sys/$soname" ;;
      *) cp -L "$path" "$STAGE/lib/$soname" ;;
    esac
  done
cp -L /lib64/ld-linux-x86-64.so.2 "$STAGE/sys/"
# gpu_check.sh runs the binaries on the machine's own C library when it is
# at least this one (the machine's CUDA libraries, NCCL's say, may need it).
getconf GNU_LIBC_VERSION | awk '{print $2}' >"$STAGE/sys/glibc_version"

# The native kit, from which tools/gpu_native.sh builds the Python module on
# the GPU machine for its own Python: the headers module.cc needs besides
# the C and C++ libraries', Python's and pybind11's; the archives and
# shared libraries of the module's link line, which native/link_args names
# as @KIT@/lib/ARCHIVE and @SO@SONAME; and the build's defines.
pack_native_kit() {
  local kit=$STAGE/native dir=$BUILD_DIR/python/CMakeFiles/cserps_native.dir
  mkdir -p "$kit/include" "$kit/lib" "$kit/proto"
  sed -n 's/^CXX_DEFINES = //p' "$dir/flags.make" >"$kit/defines"
  local includes header top rel root
  read -r -a includes <<<"$(sed -n 's/^CXX_INCLUDES = //p' "$dir/flags.make")"
  # A library's headers go whole (which of them a header includes can
  # depend on the compiler); another include directory's (CUDA's) only
  # those reached; the C and C++ libraries', Python's and pybind11's are
  # the GPU machine's own.
  c++ -M -std=c++17 $(cat "$kit/defines") "${includes[@]}" python/native/module.cc |
    tr ' \\' '\n\n' | grep '^/' | sort -u | while read -r header; do
      case "$header" in
        "$PWD"/*|/usr/lib/gcc/*) ;;
        /usr/include/*)
          top=${header#/usr/include/}; top=${top%%/*}
          case "$top" in
            c++|x86_64-linux-gnu|linux|asm-generic|python3*|pybind11|*.h) ;;
            *) [ -d "$kit/include/$top" ] || cp -r "/usr/include/$top" "$kit/include/" ;;
          esac ;;
        *)
          for root in "${includes[@]}"; do
            root=${root#-I}
            if [ "${header#"$root"/}" != "$header" ]; then
              rel=${header#"$root"/}
              mkdir -p "$kit/include/$(dirname "$rel")"; cp "$header" "$kit/include/$rel"
              break
            fi
          done ;;
      esac
    done
  (cd "$BUILD_DIR/proto" && find . -name '*.pb.h' -exec cp --parents {} "$kit/proto/" \;)

  local arg name path candidate soname
  for arg in $(sed 's/.* [^ ]*module\.cc\.o //' "$dir/link.txt"); do
    case "$arg" in
      -L*|-Wl,-rpath,*) continue ;;
      -ldl|-lm|-lrt|-lpthread|-latomic) echo "$arg"; continue ;;
      -l*)
        name=${arg#-l}
        path=""
        for candidate in /usr/local/cuda/lib{,64}/lib"$name".{so,a} \
                         /usr/lib/x86_64-linux-gnu/lib"$name".{so,a}; do
          if [ -e "$candidate" ]; then path=$candidate; break; fi
        done
        [ -n "$path" ] || { echo "gpu_bundle: no library for $arg" >&2; return 1; } ;;
      *) path=$arg ;;
    esac
    case "$path" in
      *.a)
        [ -e "$kit/lib/$(basename "$path")" ] || (cd "$BUILD_DIR/python" && cp "$path" "$kit/lib/")
        echo "@KIT@/lib/$(basename "$path")" ;;
      *.so|*.so.*)
        soname=$(objdump -p "$path" | awk '$1 == "SONAME" {print $2}')
        echo "@SO@$soname"
        case "$soname" in
          libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) ;;
          *) [ -e "$STAGE/lib/$soname" ] || cp -L "$path" "$STAGE/lib/$soname" ;;
        esac ;;
      *) echo "$arg" ;;
    esac
  done >"$kit/link_args"
  strip --strip-debug "$kit"/lib/*.a
}
pack_native_kit

# Fashion-MNIST for gpu_check.sh's main job, when this machine has it.
if [ -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p "$STAGE/data"
  cp /usr/share/datasets/fashion-mnist/*.gz "$STAGE/data/"
fi

mkdir -p "$BUNDLE"
# xz: 48 MB where gzip took 65 (OpenBLAS' kernels for every CPU pack well).
tar -C "$STAGE" -cf - . | xz -9 -T0 >"$BUNDLE/bundle.tar.xz"
echo "gpu_bundle: $BUNDLE/bundle.tar.xz: $(ls "$STAGE/bin" | wc -l) binaries, $(ls "$STAGE/lib" "$STAGE/sys" | grep -c '\.so') libraries, $(du -sh "$STAGE" | cut -f1) unpacked, $(du -sh "$BUNDLE/bundle.tar.xz" | cut -f1) packed"
