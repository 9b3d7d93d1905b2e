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

}  // namespace zo::testing

#endif  // ZO_TESTS_CLI_SAFETENSORS_FILE_H_
