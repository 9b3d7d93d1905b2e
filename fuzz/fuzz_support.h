// What the fuzz targets in this folder share: quiet logs, a scratch
// directory per process, the reference checkpoint the checkpoint targets
// read, and a check that aborts (so libFuzzer keeps the input) with a
// message.
#ifndef ZO_FUZZ_FUZZ_SUPPORT_H_
#define ZO_FUZZ_FUZZ_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "offload/checkpoint/checkpoint_test_util.h"

namespace zo::fuzz {

// Drops every log line: a config warning per input would flood the fuzzer's
// output. The messages are still formatted, so that code is exercised.
void QuietLogs();

// A directory under $TMPDIR (or /tmp) that this process owns; removed at exit.
const std::string& ScratchDir();

// Writes `bytes` to `path`, truncating; aborts when it cannot (a full disk
// is not a finding).
void WriteFileOrDie(const std::string& path, std::string_view bytes);
std::string ReadFileOrDie(const std::string& path);

// The job state of the reference checkpoint: 4 tensors (77 elements) in
// chunks of 32 on 2 servers, reproducible floats.
testing::FlatState ReferenceState();
// Writes the reference checkpoint's parts into `dir` and returns its
// checkpoint.json contents' meta (parts filled in). Byte-for-byte the same
// every time, so a checkpoint.json seed matches parts written later.
// `with_previous`: the parts carry a previous version's fp16 weights too
// (format 2) and the meta says so.
CheckpointMeta WriteReferenceParts(const std::string& dir, bool with_previous = false);

[[noreturn]] void Fail(std::string_view what, std::string_view detail = "");

}  // namespace zo::fuzz

// An invariant of the code under test; on violation prints and aborts.
#define ZO_FUZZ_CHECK(cond, detail)                                  \
  do {                                                               \
    if (!(cond)) ::zo::fuzz::Fail("check failed: " #cond, (detail)); \
  } while (0)

#endif  // ZO_FUZZ_FUZZ_SUPPORT_H_
