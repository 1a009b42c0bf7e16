#!/usr/bin/env bash
# Builds the Python front's native module (cserps._native) on a GPU machine
# from an unpacked bundle of tools/gpu_bundle.sh, for that machine's Python.
# A bundle cannot hold the module itself: it is built for one Python
# version, and a GPU machine's Python (the one with a CUDA torch) is
# seldom the development machine's. The bundle's native/ holds the rest:
# the headers module.cc needs besides Python's and pybind11's, the worker
# libraries' archives, the build's defines and its link line. This
# machine's C++ compiler, Python headers and pybind11 do the rest, and the
# module finds the bundle's shared libraries by its RPATH.
#
#   tools/gpu_native.sh BUNDLE OUT   writes OUT/cserps (the package, the
#                                    module in it): PYTHONPATH=OUT
#
# PYTHON      the Python to build for (default python3)
# CXX         the C++ compiler (default c++, else g++, else clang++)
# CUDA_PATH   colon-separated directories holding CUDA's and NCCL's
#             libraries (tools/gpu_check.sh finds them)
#
# Exits 3, saying what is missing, when this machine lacks a compiler,
# Python's headers or pybind11; 1 when the build fails.
set -euo pipefail
cd "$(dirname "$0")/.."

BUNDLE=$(cd "${1:?BUNDLE}" && pwd)
OUT=${2:?OUT}
PYTHON=${PYTHON:-python3}
CXX=${CXX:-$(command -v c++ || command -v g++ || command -v clang++ || echo c++)}
KIT=$BUNDLE/native

missing() {
  echo "gpu_native: $*" >&2
  exit 3
}

[ -f "$KIT/link_args" ] || missing "$KIT has no link_args: a bundle packed before it carried the native kit"
command -v "$CXX" >/dev/null || missing "no C++ compiler ($CXX)"
py_include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])') ||
  missing "$PYTHON does not run"
[ -f "$py_include/Python.h" ] || missing "no Python.h in $py_include (the Python's development headers)"
pybind_include=$("$PYTHON" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null ||
                 echo /usr/include)
[ -f "$pybind_include/pybind11/pybind11.h" ] || missing "no pybind11 for $PYTHON"
suffix=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

# The kit's headers first, then this machine's CUDA headers for any the
# kit lacks. -isystem /usr/include would reorder the compiler's own
# directories and break libstdc++'s #include_next.
includes=(-I. -I"$KIT/proto" -isystem "$KIT/include")
for dir in "$py_include" "$pybind_include" /usr/local/cuda/include; do
  if [ "$dir" != /usr/include ] && [ -d "$dir" ]; then includes+=(-isystem "$dir"); fi
done

# The link line: @KIT@ is the kit's directory, @SO@NAME a shared library
# found in the bundle's lib/ or in CUDA_PATH.
IFS=: read -r -a lib_dirs <<<"$BUNDLE/lib${CUDA_PATH:+:$CUDA_PATH}"
link=()
while read -r arg; do
  case "$arg" in
    @SO@*)
      name=${arg#@SO@}
      found=""
      for dir in "${lib_dirs[@]}"; do
        if [ -e "$dir/$name" ]; then found=$dir/$name; break; fi
      done
      [ -n "$found" ] || missing "no $name in ${lib_dirs[*]}"
      link+=("$found") ;;
    @KIT@*) link+=("$KIT${arg#@KIT@}") ;;
    *) link+=("$arg") ;;
  esac
done <"$KIT/link_args"
rpath=$(IFS=:; echo "${lib_dirs[*]}")

mkdir -p "$OUT"
rm -rf "$OUT/cserps"
cp -r python/cserps "$OUT/cserps"
read -r -a defines <"$KIT/defines"
# -ffp-contract=off as the build has it: cserps rounds as its servers do.
"$CXX" -O2 -fPIC -fvisibility=hidden -ffp-contract=off -pthread -std=c++17 "${defines[@]}" \
  "${includes[@]}" -c python/native/module.cc -o "$OUT/module.o" || exit 1
# DT_RPATH, not RUNPATH: the bundle's libraries load their own
# dependencies from it too.
"$CXX" -shared -o "$OUT/cserps/_native$suffix" "$OUT/module.o" "${link[@]}" \
  -Wl,--disable-new-dtags -Wl,-rpath,"$rpath" || exit 1
rm -f "$OUT/module.o"
echo "gpu_native: $OUT/cserps/_native$suffix for $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
