#!/usr/bin/env bash
# Installs the Debian 12 packages zo needs, by purpose:
#
#   bash deploy/install-deps.sh build    compile zo (zo-server, zo-train, zo-ctl, the tests)
#   bash deploy/install-deps.sh python   build + the Python package and PyTorch
#   bash deploy/install-deps.sh test     python + what the test suite drives for real
#                                        (Prometheus, Slurm, munge, systemd, tc, kubectl, openssl)
#   bash deploy/install-deps.sh bench    build + Google Benchmark and fio (zo-bench nvme)
#   bash deploy/install-deps.sh all      everything (also with no argument): test, bench, and
#                                        the format check and fuzzers of .ci/run
#
# Idempotent: when everything is present it changes nothing and says so.
set -euo pipefail

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}

build=(
  # toolchain
  g++ cmake ninja-build pkg-config
  # wire protocol and RPC
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # foundations; Prometheus exposition of zo-server and zo-train
  libabsl-dev nlohmann-json3-dev libxxhash-dev prometheus-cpp-dev
  # NVMe tier
  liburing-dev
  # CPU GEMMs for the CPU backend
  libopenblas-dev
  # the unit tests, which the default presets build
  libgtest-dev libgmock-dev
)
python=(
  # the Python package zo (python/) and its tests against PyTorch
  python3-dev python3-pybind11 pybind11-dev python3-torch python3-pytest python3-numpy
  python3-venv
)
test_tools=(
  # test certificates (tests/server/tls_test.cc)
  openssl
  # a real Prometheus scrapes the metrics in tests/metrics
  prometheus
  # deploy/ checked for real: a one-node Slurm cluster, systemd-analyze,
  # network namespaces and tc for the multi-host tests
  slurm-wlm munge systemd iproute2 python3-yaml
)
bench=(
  # bench/*_benchmark (built when found) and zo-bench nvme's baseline
  libbenchmark-dev fio
)
ci_tools=(
  # the format check of .ci/run (deploy/check-format.sh)
  clang-format
  # the libFuzzer targets (fuzz/, deploy/run-fuzzers.sh)
  clang libclang-rt-14-dev
  # links the fuzz tree (clang) several times faster than GNU ld (CMake's
  # ZO_FAST_LINKER; GCC trees link with gold, from binutils)
  lld
)

purpose="${1:-all}"
case "$purpose" in
  build) packages=("${build[@]}") ;;
  python) packages=("${build[@]}" "${python[@]}") ;;
  test) packages=("${build[@]}" "${python[@]}" "${test_tools[@]}") ;;
  bench) packages=("${build[@]}" "${bench[@]}") ;;
  all) packages=("${build[@]}" "${python[@]}" "${test_tools[@]}" "${bench[@]}" "${ci_tools[@]}") ;;
  -h | --help) usage; exit 0 ;;
  *) echo "install-deps: unknown purpose '$purpose'" >&2; usage >&2; exit 2 ;;
esac

# kubectl for the deploy/k8s tests: Debian's kubernetes-client, only when no
# kubectl is on PATH (a kubectl package from elsewhere owns /usr/bin/kubectl,
# and the two would conflict).
case "$purpose" in
  test | all) command -v kubectl >/dev/null || packages+=(kubernetes-client) ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages for '$purpose' present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo)" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing for '$purpose': ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
