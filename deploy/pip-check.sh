#!/usr/bin/env bash
# `pip install .` checked for real, on both Pythons zo meets (CI, .ci/run):
#
#   debian  /usr/bin/python3 in a venv with --system-site-packages, so
#           python3-torch (1.13, apt) is there: python/tests/test_packaging.py
#           installs zo into it and uses it from outside the tree.
#   pypi    a PyPI python (PYPI_PYTHON, default the python3 first on PATH; it
#           may be Debian's) in a plain venv with the current torch from
#           PyPI: test_packaging.py, then the whole python/tests suite
#           against the installed package and its zo-server / zo-ctl.
#
#   deploy/pip-check.sh [PYPI_PYTHON]
#
# The venvs stay in build/venv/ (the PyPI one holds torch with its CUDA
# wheels, about 5.5 GB: PyPI has no CPU-only torch; made once, about a
# minute), the CMake build in build/pip/ (pyproject.toml's build-dir), so a
# second run recompiles only the extension. Needs deploy/install-deps.sh's
# packages (python3-venv among them) and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
pypi_python=${1:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
# One compiler for both Pythons: scikit-build-core otherwise takes each one's
# sysconfig CC (Debian's says x86_64-linux-gnu-gcc, pyenv's gcc), and a
# changed compiler makes CMake start build/pip over.
export CC=${CC:-gcc} CXX=${CXX:-g++}
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH
mkdir -p build/venv

# make_venv NAME PYTHON [VENV_FLAGS...]: build/venv/NAME, remade when it is
# broken or its Python is not PYTHON's.
make_venv() {
  local name=$1 python=$2 venv=build/venv/$1
  shift 2
  local want
  want=$("$python" -c 'import sys; print(sys.version)')
  if [[ ! -x $venv/bin/python ]] ||
      [[ $("$venv/bin/python" -c 'import sys; print(sys.version)' 2>/dev/null) != "$want" ]]; then
    rm -rf "$venv"
    "$python" -m venv "$@" "$venv"
  fi
}

section() { printf '\npip-check: %s\n' "$*"; }

t0=$SECONDS
section "debian: /usr/bin/python3 with python3-torch"
make_venv debian /usr/bin/python3 --system-site-packages
build/venv/debian/bin/python -c 'import torch, pytest' ||
  { echo "pip-check: Debian's python3 lacks torch or pytest: deploy/install-deps.sh python" >&2; exit 1; }
ZO_PIP_VENV=$root/build/venv/debian build/venv/debian/bin/python -m pytest -q \
  -p no:cacheprovider -p no:hypothesispytest --rootdir python/tests python/tests/test_packaging.py
echo "pip-check: debian done in $((SECONDS - t0)) s"

t1=$SECONDS
section "pypi: $("$pypi_python" -c 'import sys; print(sys.executable, sys.version.split()[0])')" \
  "with torch from PyPI"
make_venv pypi "$("$pypi_python" -c 'import sys; print(sys.executable)')"
venv=$root/build/venv/pypi
# transformers and accelerate: zo.hf's Trainer route (python/tests/test_hf_trainer.py).
"$venv/bin/python" -c 'import torch, pytest, numpy, transformers, accelerate' 2>/dev/null ||
  "$venv/bin/python" -m pip install -q torch pytest numpy transformers accelerate
"$venv/bin/python" -c 'import torch; print("pip-check: torch", torch.__version__, torch.__file__)'
ZO_PIP_VENV=$venv "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir python/tests \
  python/tests/test_packaging.py
section "pypi: python/tests against the installed zo and its commands"
elsewhere=$(mktemp -d)
trap 'rm -rf "$elsewhere"' EXIT
(cd "$elsewhere" &&
  OMP_NUM_THREADS=1 ZO_SERVER_PATH=$venv/bin/zo-server ZO_CTL_PATH=$venv/bin/zo-ctl \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/python/tests" \
    --ignore "$root/python/tests/test_packaging.py" "$root/python/tests")
echo "pip-check: pypi done in $((SECONDS - t1)) s; all in $((SECONDS - t0)) s"
