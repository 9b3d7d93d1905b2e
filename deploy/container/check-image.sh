#!/usr/bin/env bash
# Checks the image's runtime stage (Dockerfile) without a container
# registry: installs runtime-packages.txt into an empty Debian 12 root from
# Debian's package registry (mmdebstrap, as the stage's apt-get does on
# debian:12-slim), copies in the binaries a build made, and runs them there
# as the pods do (user 10001): every shared library resolves, and a
# zo-server started in the root answers zo-ctl.
#
#   bash deploy/container/check-image.sh [BUILD_DIR]     (default build/release; as root)
#
# zo-train built where the CUDA toolkit is may load libcublas*/libcudart*,
# which a GPU image takes from its CUDA base: those alone are allowed to be
# missing here.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build/release}" && pwd)
for b in zo-server zo-ctl zo-train; do
  [[ -x $build/bin/$b ]] || { echo "check-image: no $build/bin/$b; build first" >&2; exit 2; }
done
command -v mmdebstrap >/dev/null || {
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null
}

root=$(mktemp -d /tmp/zo-image.XXXXXX)
server_pid=
cleanup() {
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if mountpoint -q "$root/proc"; then
    umount "$root/proc" || umount -l "$root/proc"
  fi
  # Never through a proc still mounted there.
  mountpoint -q "$root/proc" || rm -rf --one-file-system "$root"
}
trap cleanup EXIT

packages=$(grep -v '^#' "$here/runtime-packages.txt" | paste -sd, -)
# The host's Debian sources when it has them (the same suites, updates and
# security included), else mmdebstrap's default mirror.
sources=()
[[ -f /etc/apt/sources.list.d/debian.sources ]] && sources=(/etc/apt/sources.list.d/debian.sources)
echo "check-image: a Debian 12 root with $(echo "$packages" | tr , ' ')"
mmdebstrap --quiet --variant=minbase --include="$packages" bookworm "$root" "${sources[@]}"
install -m 0755 "$build/bin/zo-server" "$build/bin/zo-ctl" "$build/bin/zo-train" "$root/usr/local/bin/"
mount -t proc proc "$root/proc"

failed=0
for b in zo-server zo-ctl zo-train; do
  missing=$(chroot "$root" ldd "/usr/local/bin/$b" | awk '/not found/ {print $1}' || true)
  [[ $b == zo-train ]] && missing=$(echo "$missing" | grep -v -E '^libcu(blas|blasLt|dart)\.' || true)
  if [[ -n $missing ]]; then
    echo "check-image: $b needs libraries runtime-packages.txt does not bring: $missing" >&2
    failed=1
  fi
done
((failed == 0)) || exit 1

run() { chroot --userspec=10001:10001 "$root" "$@"; }
run zo-ctl --help >/dev/null
# Not through run(): $! must be the server itself (chroot execs it).
chroot --userspec=10001:10001 "$root" zo-server --listen 127.0.0.1:0 --port-file /tmp/port \
  >"$root/tmp/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do
  [[ -s $root/tmp/port ]] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$root/tmp/server.log" >&2; exit 1; }
  sleep 0.1
done
port=$(cat "$root/tmp/port")
run zo-ctl jobs --server "127.0.0.1:$port"
echo "check-image: zo-server, zo-ctl and zo-train load in a root of runtime-packages.txt alone," \
  "and a zo-server there answers zo-ctl as user 10001"
