#!/usr/bin/env bash
# Adds zo's Python package to the bundle deploy/gpu-bundle.sh made
# (.devbin/python/zo), its extension built here for the GPU machine's Python:
# that machine's python is not Debian's, so the extension is compiled against
# its headers and a pybind11, which can come from there or from here:
#
#   from the GPU host: tar czf pyinc.tgz -C /usr/include python3.12 x86_64-linux-gnu/python3.12
#                      tar czf pybind11.tgz -C $(python3 -c 'import torch, os;
#                          print(os.path.dirname(torch.__file__))')/include pybind11
#   or here, from a CPython of the same minor version (pyenv's) and PyPI's pybind11:
#                      tar czf pyinc.tgz -C ~/.pyenv/versions/3.12.1/include python3.12
#                      pip download --no-deps pybind11 && unzip pybind11-*.whl 'pybind11/include/*' &&
#                      tar czf pybind11.tgz -C pybind11/include pybind11
#   here:              deploy/gpu-python-bundle.sh pyinc.tgz pybind11.tgz .cpython-312-x86_64-linux-gnu.so
#   there:             bash .devbin/gpu-check.sh unpacks it (.devbin/python.tar.xz); then
#                      PYTHONPATH=.devbin/python LD_LIBRARY_PATH=.devbin/lib python3 ...
#
# Uses the static zo libraries of a CUDA build here (build/release); the
# shared libraries the extension needs beyond the bundle's go into its lib
# archive. (An Ubuntu host's python3.12/pyconfig.h includes the multiarch one
# beside it; Ubuntu's libpython3.12-dev .deb has both, if the host's tarball
# lacks it: dpkg-deb -x it and tar its usr/include the same way.)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# == 3 ]] || { sed -n '2,25p' "$0"; exit 2; }
pyinc=$(realpath "$1") pybind=$(realpath "$2") suffix=$3
build=build/release
[[ -f .devbin/lib.tar.xz ]] || { echo "gpu-python-bundle: run deploy/gpu-bundle.sh first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/include"
tar -C "$work/include" -xzf "$pyinc"
tar -C "$work" -xzf "$pybind"
pydir=$(find "$work/include" -maxdepth 1 -name 'python3*' -type d | head -1)
# The extension's libraries, as CMake links it for Debian's python.
libs=$(awk '/^build python\/zo\/_native/ {on = 1} on && /^  LINK_LIBRARIES = / {
         sub(/^  LINK_LIBRARIES = /, ""); print; exit}' "$build/build.ninja")
[[ -n $libs ]] || { echo "gpu-python-bundle: $build has no zo_native target (python3-pybind11?)" >&2; exit 1; }
mkdir -p .devbin/python/zo
out=$PWD/.devbin/python/zo/_native$suffix
echo "gpu-python-bundle: compiling python/native_module.cc for $(basename "$pydir")"
c++ -O2 -DNDEBUG -fPIC -fvisibility=hidden -pthread -std=c++20 -I"$work" -I"$PWD" -I"$PWD/$build" \
  -isystem "$pydir" -isystem "$work/include" -c python/native_module.cc -o "$work/native_module.o"
# shellcheck disable=SC2086  # the link line is a list of words
(cd "$build" && c++ -fPIC -shared -o "$out" "$work/native_module.o" $libs)
strip "$out"
# The package as the build tree lays it out (with its generated _version.py).
cp "$build"/python/zo/*.py "$build"/python/zo/py.typed "$build"/python/zo/_native.pyi .devbin/python/zo/
# Shared libraries the bundle lacks.
mkdir -p "$work/lib" && tar -C "$work" -xJf .devbin/lib.tar.xz
ldd "$out" | awk '/=>/ && $3 ~ /^\// {print $1, $3}' |
  grep -Ev '^(libcublas|(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux)[.-])' |
  while read -r name path; do [[ -e $work/lib/$name ]] || cp -L "$path" "$work/lib/$name"; done
tar -C "$work" -cJf .devbin/lib.tar.xz lib
XZ_OPT=-T0 tar -C .devbin -cJf .devbin/python.tar.xz python && rm -rf .devbin/python
du -sh .devbin
