// Shared command-line conventions of the zo binaries.
#ifndef ZO_COMMON_COMMAND_LINE_H_
#define ZO_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace zo {

// The contents of the file named by flag --`flag` (config, PEM, token).
// NOT_FOUND "--<flag>: cannot read <path>" when it cannot be opened.
absl::StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path);

// A shared-secret token file: its contents without surrounding whitespace.
// INVALID_ARGUMENT "--<flag>: <path> is empty" when nothing is left.
absl::StatusOr<std::string> ReadTokenFile(const std::string& flag, const std::string& path);

// Users type `--auth-token-file`; absl flags are C identifiers
// (`auth_token_file`). Returns argv with dashes in flag names turned into
// underscores (values untouched, nothing after a bare `--`), so both
// spellings work. The returned pointers live as long as `storage`.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage);

// The text `--help` prints: `usage`, then each flag defined in a file whose
// path contains `main_file`, by name, spelled with dashes, with its default
// and help. No file paths: they would show where the binary was built.
std::string HelpText(const std::string& usage, const std::string& main_file);

// Parses the command line the way every zo binary does: flag names with dashes
// or underscores (NormalizeFlagNames), and `--help` (also -h, --helpfull,
// --helpshort) prints HelpText to stdout and exits 0 (absl would exit 1 and
// list its own flags with their build paths). Other errors exit as absl does.
// Returns the positional arguments, argv[0] first; they point into `storage`.
std::vector<char*> ParseFlags(int argc, char** argv, const std::string& usage,
                              const std::string& main_file, std::vector<std::string>& storage);

}  // namespace zo

#endif  // ZO_COMMON_COMMAND_LINE_H_
