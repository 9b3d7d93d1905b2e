#!/usr/bin/env bash
# Unit tests under AddressSanitizer + UndefinedBehaviorSanitizer, built in
# the fuzz tree (build/fuzz: clang, every library already instrumented with
# both by `cmake --preset fuzz`, so only the tests' own files compile here).
# The default set covers what parses bytes from outside, manages its own
# memory or I/O buffers, or runs on several threads, and fits CI's budget;
# the whole suite under ASan is `cmake --preset asan` (README).
#
#   deploy/run-sanitized-tests.sh [TEST_TARGET...]   # e.g. server/job_test
#
# Exits non-zero when a test fails or a sanitizer reports (UBSan aborts).
set -euo pipefail
cd "$(dirname "$0")/.."

# The wire's gradient parser, checkpoint files, the I/O engine and swap
# tiers, the snapshot and accumulator buffers, the threads that share them;
# a streaming stage's window, whose reader thread reads and uploads into
# slots the stage's thread reuses; the speculative update, whose step thread
# writes the state's second bank while pushes fill the accumulator; the
# DPU compensation's record, which the pool's workers fill tile by tile;
# the offload link, whose prefetch thread pulls and queues uploads that
# complete while the stage computes on the first of them; the in-process
# and same-host routes, whose servers read and write the worker's memory
# (lent gradients, a shared region) while the worker goes on.
tests=(
  server/gradient_piece_view_test offload/checkpoint_part_test offload/block_io_engine_test
  offload/swap_layout_test offload/tiered_state_test offload/thread_pool_test
  offload/tiered_state_speculation_test server/job_speculation_test
  server/gradient_accumulator_test server/param_versions_test server/param_versions_master_test
  server/param_versions_writing_test server/wait_list_test
  server/state_snapshot_test server/state_checkpoint_test server/job_test
  server/param_piece_wire_test server/offload_service_test server/pull_fills_test
  server/handler_pool_test server/lead_checkpoints_test server/own_checkpoint_part_test
  server/compensation_record_test
  rpc/byte_stream_call_test
  worker/model/param_window_test worker/model/param_streaming_test
  worker/train/offload_link_test worker/client/region_credits_test
  tests/in_process_route_test tests/shared_memory_route_test
)
[ $# -gt 0 ] && tests=("$@")

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
start=$SECONDS
cmake --preset fuzz "${launcher[@]}" >/dev/null
targets=()
for t in "${tests[@]}"; do targets+=("$(basename "$t")"); done
cmake --build build/fuzz --target "${targets[@]}"
echo "run-sanitized-tests: built ${#tests[@]} tests in $((SECONDS - start)) s"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for t in "${tests[@]}"; do
  t0=$SECONDS
  if build/fuzz/"$t" --gtest_brief=1 >"build/fuzz/$(basename "$t").log" 2>&1; then
    echo "run-sanitized-tests: $t passed in $((SECONDS - t0)) s"
  else
    echo "run-sanitized-tests: $t FAILED ($((SECONDS - t0)) s); its output:"
    tail -n 60 "build/fuzz/$(basename "$t").log"
    failed+=("$t")
  fi
done
echo "run-sanitized-tests: ${#tests[@]} tests in $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "run-sanitized-tests: failed: ${failed[*]}" >&2
  exit 1
fi
