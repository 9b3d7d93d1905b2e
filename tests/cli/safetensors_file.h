// Reads a safetensors file by the format's definition (8-byte little-endian
// header length, JSON header, data), independently of the exporter, so the
// CLI tests can check what `zo-ctl export` wrote.
#ifndef ZO_TESTS_CLI_SAFETENSORS_FILE_H_
#define ZO_TESTS_CLI_SAFETENSORS_FILE_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/sharding.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zo::testing {

struct Safetensors {
  nlohmann::json header;
  std::string data;
};

// Empty header when the file is shorter than its header length says.
inline Safetensors ParseSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  if (bytes.size() >= 8) std::memcpy(&n, bytes.data(), 8);
  if (bytes.size() < 8 + n) return {};
  return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

// The file holds exactly `master` (fp32, manifest order), each tensor with
// dtype F32, its shape and its byte range.
inline void ExpectFp32Export(const Safetensors& file, const std::vector<TensorSpec>& manifest,
                             const std::vector<float>& master) {
  ASSERT_EQ(file.data.size(), master.size() * 4);
  EXPECT_EQ(std::memcmp(file.data.data(), master.data(), file.data.size()), 0);
  int64_t begin = 0;
  for (const TensorSpec& t : manifest) {
    const nlohmann::json& e = file.header.at(t.name);
    EXPECT_EQ(e.at("dtype"), "F32");
    EXPECT_EQ(e.at("shape").get<std::vector<int64_t>>(), t.shape);
    const int64_t end = begin + 4 * NumElements(t.shape);
    EXPECT_EQ(e.at("data_offsets"), nlohmann::json({begin, end})) << t.name;
    begin = end;
  }
}

}  // namespace zo::testing

#endif  // ZO_TESTS_CLI_SAFETENSORS_FILE_H_
