#!/usr/bin/env bash
# Prepares everything a GPU machine without network needs for
# deploy/gpu-check.sh, in one go, from a CUDA build here (build/release):
#
#   .devbin/  the bundle (deploy/gpu-bundle.sh) and zo's Python package built
#             for the GPU machine's CPython (deploy/gpu-python-bundle.sh),
#             from a CPython of that minor version's headers here and PyPI's
#             pybind11;
#   .whl/     (with --anchors) DeepSpeed as a wheel and the packages it needs
#             that the GPU image lacks, plus those Python headers, for part
#             anchors (bench/anchors/README.md, "On a GPU").
#
#   deploy/gpu-prepare.sh [--anchors] [--python PYTHON_WITH_HEADERS]
#
# PYTHON_WITH_HEADERS defaults to pyenv's newest 3.12 (the H200 image runs
# CPython 3.12). Both folders are git-ignored (.git/info/exclude); a device
# call carries them: carry [".devbin", ".whl"] and runs, for example,
#   PARTS="bench pytest hfgpt2 anchors" BENCH_DTYPES=bf16 bash deploy/gpu-check.sh
# with OUT pointing at a folder that is tarred into the tool's $OUT after
# (the tool brings back 8 files at most).
set -euo pipefail
cd "$(dirname "$0")/.."
anchors=0
python=$(find ~/.pyenv/versions -maxdepth 3 -path "*/3.12.*/bin/python3" 2>/dev/null | sort -V | tail -1 || true)
while [[ $# -gt 0 ]]; do
  case $1 in
    --anchors) anchors=1 ;;
    --python) python=$2; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu-prepare: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $python && -x $python ]] ||
  { echo "gpu-prepare: no CPython 3.12 with headers found; name one with --python" >&2; exit 1; }
inc=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[[ -f $inc/Python.h ]] || { echo "gpu-prepare: $python has no Python.h in $inc" >&2; exit 1; }
tag=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
minor=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bash deploy/gpu-bundle.sh
tar czf "$work/pyinc.tgz" -C "$(dirname "$inc")" "$(basename "$inc")"
python3 -m pip download -q --no-deps -d "$work" pybind11
(cd "$work" && unzip -q pybind11-*.whl 'pybind11/include/*' &&
  tar czf pybind11.tgz -C pybind11/include pybind11)
bash deploy/gpu-python-bundle.sh "$work/pyinc.tgz" "$work/pybind11.tgz" "$tag"

if [[ $anchors == 1 ]]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
  rm -rf .whl && mkdir -p .whl/pyinc
  tar -C .whl/pyinc -xzf "$work/pyinc.tgz"
  python3 -m pip download -q --no-deps -d "$work" deepspeed==0.19.8
  "$python" -m pip wheel -q --no-deps -w .whl "$work"/deepspeed-0.19.8.tar.gz
  # With their own needs resolved (pydantic pins its pydantic-core).
  python3 -m pip download -q --only-binary=:all: --python-version "$minor" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform any -d .whl hjson pydantic
fi
du -sh .devbin .whl 2>/dev/null
