#include "fuzz/fuzz_support.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace zo::fuzz {

void QuietLogs() {
  SetLogSink([](LogLevel, std::string_view) {});
}

namespace {

void RemoveScratch() {
  std::error_code ec;
  std::filesystem::remove_all(ScratchDir(), ec);
}

}  // namespace

const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/zo_fuzz_XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) Fail("mkdtemp failed", tmpl);
    auto* d = new std::string(tmpl);
    std::atexit(RemoveScratch);
    return d;
  }();
  return *dir;
}

void WriteFileOrDie(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) Fail("cannot write", path);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot read", path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

testing::FlatState ReferenceState() {
  return testing::MakeFlatState({{"embed", {5, 7}, DType::kFloat16},
                                 {"w", {6, 6}, DType::kFloat16},
                                 {"scale", {}, DType::kFloat16},
                                 {"b", {5}, DType::kFloat16}},
                                /*chunk_elems=*/32, /*num_servers=*/2, /*seed=*/3);
}

CheckpointMeta WriteReferenceParts(const std::string& dir, bool with_previous) {
  const testing::FlatState s = ReferenceState();
  CheckpointMeta meta = testing::TestMeta("ref", 3, s);
  std::vector<std::byte> previous;
  if (with_previous) {
    meta.has_previous = true;
    meta.previous_version = 2;
    meta.previous_loss_scale = 65536.0;
    meta.previous_dtype = "fp16";
    previous.resize(2 * s.master.size());
    for (size_t i = 0; i < previous.size(); ++i) previous[i] = static_cast<std::byte>(i * 29 + 1);
  }
  for (int server = 0; server < s.num_servers; ++server) {
    std::filesystem::remove(absl::StrCat(dir, "/", CheckpointPartFileName(server)));
    absl::StatusOr<CheckpointPartSummary> part =
        testing::WriteTestPart(dir, s, server, with_previous ? &previous : nullptr);
    if (!part.ok()) Fail("cannot write the reference checkpoint", part.status().ToString());
    meta.parts.push_back(*part);
  }
  return meta;
}

void Fail(std::string_view what, std::string_view detail) {
  std::fprintf(stderr, "zo fuzz: %.*s%s%.*s\n", static_cast<int>(what.size()), what.data(),
               detail.empty() ? "" : ": ", static_cast<int>(detail.size()), detail.data());
  std::abort();
}

}  // namespace zo::fuzz
