#!/usr/bin/env bash
# Builds the libFuzzer targets (`cmake --preset fuzz`, fuzz/) and runs each
# for a bounded time on a copy of its seed corpus (fuzz/corpus/<target>/; the
# copy keeps the repository's corpus as it is). Prints executions per target;
# exits non-zero when any target crashes, leaks, times out or fails to start.
# Crashing inputs are kept under build/fuzz/crashes/<target>/.
#
#   deploy/run-fuzzers.sh [SECONDS_PER_TARGET (20)] [TARGET...]
#
# Reproduce a crash: build/fuzz/fuzz/<target> build/fuzz/crashes/<target>/crash-...
set -euo pipefail

seconds="${1:-20}"
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/.."
root="$PWD"

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
build_start=$SECONDS
cmake --preset fuzz "${launcher[@]}" >/dev/null
cmake --build --preset fuzz
echo "run-fuzzers: built in $((SECONDS - build_start)) s"

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(ls fuzz/corpus)
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/zo-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=()
summary=""
for t in "${targets[@]}"; do
  bin="build/fuzz/fuzz/$t"
  [ -x "$bin" ] || { echo "run-fuzzers: no $bin" >&2; failed+=("$t"); continue; }
  mkdir -p "$work/$t/corpus" "build/fuzz/crashes/$t"
  cp -r "fuzz/corpus/$t/." "$work/$t/corpus/"
  log="$work/$t/log"
  rc=0
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb: a runaway
  # allocation is a finding, not a dead machine.
  (cd "$work/$t" && "$root/$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$root/build/fuzz/crashes/$t/" corpus) >"$log" 2>&1 \
    || rc=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  line="$(printf '%-28s %10s execs  %s s' "$t" "${execs:-?}" "$seconds")"
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    line="$line  FAILED (exit $rc)"
    echo "=== $t: exit $rc, last lines of its log:" >&2
    tail -n 60 "$log" >&2
  fi
  echo "run-fuzzers: $line"
  summary+="$line"$'\n'
done

echo
echo "run-fuzzers: ${#targets[@]} targets, ${seconds} s each"
printf '%s' "$summary"
if [ ${#failed[@]} -gt 0 ]; then
  echo "run-fuzzers: FAILED: ${failed[*]} (inputs under build/fuzz/crashes/)" >&2
  exit 1
fi
