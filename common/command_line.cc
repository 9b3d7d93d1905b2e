#include "common/command_line.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace zo {

absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFlagFile(flag, path);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", path, " is empty"));
  }
  return token;
}

std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  bool flags_done = false;
  for (size_t i = 1; i < storage.size(); ++i) {
    std::string& arg = storage[i];
    if (arg == "--") flags_done = true;
    if (flags_done || arg.size() < 3 || arg[0] != '-') continue;
    const size_t name_begin = arg[1] == '-' ? 2 : 1;
    // "-1e-3" is a value, not a flag.
    if (name_begin >= arg.size() ||
        !absl::ascii_isalpha(static_cast<unsigned char>(arg[name_begin]))) {
      continue;
    }
    const size_t name_end = std::min(arg.find('='), arg.size());
    for (size_t k = name_begin; k < name_end; ++k) {
      if (arg[k] == '-') arg[k] = '_';
    }
  }
  std::vector<char*> out;
  for (std::string& s : storage) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void SetUsage(const std::string& usage, const std::string& main_file) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [main_file](absl::string_view path) {
    return absl::StrContains(path, main_file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [] { return std::string("zo 0.1.0\n"); };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace zo
