#include "common/command_line.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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

namespace {

bool IsHelpFlag(absl::string_view arg) {
  for (absl::string_view help :
       {"-h", "-help", "--help", "-helpfull", "--helpfull", "-helpshort", "--helpshort"}) {
    if (arg == help) return true;
  }
  return false;
}

// `text` in lines of at most `width` characters after `indent`.
void AppendWrapped(std::string& out, absl::string_view text, size_t indent, size_t width) {
  size_t used = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (used > 0 && used + 1 + word.size() > width) {
      out += "\n";
      used = 0;
    }
    if (used == 0) {
      out.append(indent, ' ');
    } else {
      out += ' ';
      ++used;
    }
    absl::StrAppend(&out, word);
    used += word.size();
  }
  out += "\n";
}

}  // namespace

std::string HelpText(const std::string& usage, const std::string& main_file) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!flag->IsRetired() && absl::StrContains(flag->Filename(), main_file)) {
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  std::string out = absl::StrCat(usage, "\n\nflags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    std::string name(flag->Name());
    std::replace(name.begin(), name.end(), '_', '-');
    const std::string def = flag->DefaultValue();
    absl::StrAppend(&out, "  --", name, " (default: ",
                    flag->IsOfType<std::string>() ? absl::StrCat("\"", def, "\"") : def, ")\n");
    AppendWrapped(out, flag->Help(), 6, 74);
  }
  return out;
}

std::vector<char*> ParseFlags(int argc, char** argv, const std::string& usage,
                              const std::string& main_file, std::vector<std::string>& storage) {
  std::vector<char*> args = NormalizeFlagNames(argc, argv, storage);
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [main_file](absl::string_view path) {
    return absl::StrContains(path, main_file);
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  // A flag's file as absl reports it (to the filters above, and in the
  // output of --helpmatch and the like): relative to the repository, never
  // the directory it was built in. __FILE__ is absolute, or relative to the
  // build directory when ccache rewrites paths.
  config.normalize_filename = [](absl::string_view path) {
    absl::ConsumePrefix(&path, ZO_SOURCE_DIR "/");
    while (absl::ConsumePrefix(&path, "../") || absl::ConsumePrefix(&path, "./")) {
    }
    return std::string(path);
  };
  config.version_string = [] { return std::string("zo 0.1.0\n"); };
  absl::SetFlagsUsageConfig(config);
  for (int i = 1; i < argc && std::string_view(args[i]) != "--"; ++i) {
    if (IsHelpFlag(args[i])) {
      std::cout << HelpText(usage, main_file) << std::flush;
      std::exit(0);
    }
  }
  return absl::ParseCommandLine(argc, args.data());
}

}  // namespace zo
