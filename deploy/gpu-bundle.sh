#!/usr/bin/env bash
# Packs what the GPU checks need into .devbin/ (git-ignored): the gpu-labelled
# test binaries, zo-bench and zo-train from a CUDA build of this machine, and
# the shared libraries they use that a GPU machine's image may lack (gRPC,
# protobuf, Abseil, OpenBLAS, ...; not glibc/libstdc++, not cuBLASLt, which
# the GPU machine's CUDA or PyTorch install provides). deploy/gpu-check.sh
# runs them there. This is how the checks reach a GPU host that is not
# Debian: build here, carry the bundle, run. Everything travels xz-packed
# (bin.tar.xz, lib.tar.xz: about 20 MB against 62 unpacked, for a device
# tool that carries 64 MiB at most); gpu-check.sh unpacks it.
#
#   deploy/gpu-bundle.sh [build dir, default build/release]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
bins=("$build/worker/backend/cuda_backend_test" "$build/worker/model/model_stage_gpu_test"
      "$build/worker/pipeline/gpu_transport_test"
      "$build/tests/zo_train_e2e_test" "$build/worker/train/trainer_test"
      "$build/bin/zo-bench" "$build/bin/zo-train"
      "$build/bin/zo-server")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "gpu-bundle: $b is missing: build with CUDA first" >&2; exit 1; }
done
mkdir -p .git/info
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >>.git/info/exclude
rm -rf .devbin && mkdir -p .devbin/lib
cp "${bins[@]}" .devbin/
strip .devbin/* 2>/dev/null || true
ldd "${bins[@]}" | awk '/=>/ && $3 ~ /^\// {print $1, $3}' | sort -u |
  grep -Ev '^(libcublas|(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux)[.-])' |
  while read -r name path; do cp -L "$path" ".devbin/lib/$name"; done
tar -C .devbin -cJf .devbin/lib.tar.xz lib && rm -rf .devbin/lib
names=()
for b in "${bins[@]}"; do names+=("$(basename "$b")"); done
XZ_OPT=-T0 tar -C .devbin -cJf .devbin/bin.tar.xz "${names[@]}"
(cd .devbin && rm -f "${names[@]}")
cp deploy/gpu-check.sh .devbin/
du -sh .devbin
