// Shared command-line conventions of the zo binaries.
#ifndef ZO_COMMON_COMMAND_LINE_H_
#define ZO_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

namespace zo {

// Users type `--auth-token-file`; absl flags are C identifiers
// (`auth_token_file`). Returns argv with dashes in flag names turned into
// underscores (values untouched, nothing after a bare `--`), so both
// spellings work. The returned pointers live as long as `storage`.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage);

// Installs the usage message and limits `--help` to flags defined in files
// whose path contains `main_file` (absl otherwise lists its own too).
void SetUsage(const std::string& usage, const std::string& main_file);

}  // namespace zo

#endif  // ZO_COMMON_COMMAND_LINE_H_
