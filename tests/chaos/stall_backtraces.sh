#!/bin/bash
# Runs the chaos soak and, if both dp ranks stop reporting steps for 40 s
# while the kills go on, saves gdb backtraces of every chaos-phase zo-train
# and their logs: how to catch the soak's rare hang in the act.
#
#   bash tests/chaos/stall_backtraces.sh [SECONDS] [OUT_DIR]   # from the repo root, after a build
#
# Needs gdb (apt-get install gdb). Exit status: the soak's.
set -u
seconds=${1:-150}
out=${2:-/tmp/zo-chaos-stall}
mkdir -p "$out"
ZO_CHAOS_SECONDS=$seconds build/release/tests/chaos_soak_test >"$out/soak.log" 2>&1 &
soak=$!
# The soak's scratch folder is named after its pid (FreshTempDir).
dir="${TEST_TMPDIR:-/tmp}/zo_chaos_soak_$soak"
until [[ -e "$dir/chaos/rank0.jsonl" ]]; do
  kill -0 $soak 2>/dev/null || break
  sleep 1
done
while kill -0 $soak 2>/dev/null; do
  sleep 5
  # The calm replay (a worker without --steps 1000000) is not watched.
  for p in $(pgrep -P $soak -f 'zo-train.*--steps'); do
    tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- '--steps 1000000' || break 2
  done
  now=$(date +%s)
  m0=$(stat -c %Y "$dir/chaos/rank0.jsonl" 2>/dev/null || echo "$now")
  m1=$(stat -c %Y "$dir/chaos/rank1.jsonl" 2>/dev/null || echo "$now")
  if ((now - m0 > 40 && now - m1 > 40)); then
    echo "stall at $(date) in $dir" >"$out/backtraces.txt"
    for p in $(pgrep -P $soak -f 'zo-train.*--steps 1000000'); do
      echo "=== zo-train pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline")" >>"$out/backtraces.txt"
      gdb -p "$p" -batch -ex 'thread apply all bt 30' >>"$out/backtraces.txt" 2>&1
    done
    cp "$dir"/chaos/worker*.log "$out/" 2>/dev/null
    echo "stall: backtraces in $out/backtraces.txt" >&2
    break
  fi
done
wait $soak
rc=$?
tail -3 "$out/soak.log"
exit $rc
