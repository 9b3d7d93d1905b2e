#!/usr/bin/env bash
# Installs the Debian 12 packages zo needs to build, test and benchmark.
# Idempotent: when everything is present it changes nothing and says so.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build pkg-config
  # wire protocol and RPC
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # foundations
  libabsl-dev nlohmann-json3-dev libxxhash-dev
  # NVMe tier
  liburing-dev
  # CPU GEMMs for the CPU backend
  libopenblas-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev fio
  # test certificates (tests/server/tls_test.cc)
  openssl
  # the format check of .ci/run (deploy/check-format.sh)
  clang-format
  # the libFuzzer targets (fuzz/, deploy/run-fuzzers.sh)
  clang libclang-rt-14-dev
  # the Python package zo (python/) and its tests against PyTorch; venvs for
  # pip install . (deploy/pip-check.sh)
  python3-dev python3-pybind11 pybind11-dev python3-torch python3-pytest python3-numpy
  python3-venv
  # Prometheus metrics of zo-server and zo-train; a real Prometheus scrapes
  # them in tests/metrics
  prometheus-cpp-dev prometheus
  # deploy/ checked for real: a one-node Slurm cluster, systemd-analyze,
  # network namespaces and tc for the multi-host tests
  slurm-wlm munge systemd iproute2 python3-yaml
)

# kubectl for the deploy/k8s tests: Debian's kubernetes-client, only when no
# kubectl is on PATH (a kubectl package from elsewhere owns /usr/bin/kubectl,
# and the two would conflict).
command -v kubectl >/dev/null || packages+=(kubernetes-client)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo)" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
