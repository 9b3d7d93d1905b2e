#include "offload/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "offload/checkpoint/durable_file.h"
#include "offload/io/io_error.h"

namespace zo {
namespace {

using checkpoint_internal::CheckJobName;
using checkpoint_internal::kMetaFileName;
using checkpoint_internal::MetaFileText;
using checkpoint_internal::OpenPart;
using checkpoint_internal::ValidateMeta;

constexpr char kTmpSuffix[] = ".tmp";

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The version in a committed directory's name ("step-00000020" -> 20).
std::optional<int64_t> VersionOfDirName(const std::string& name) {
  if (!absl::StartsWith(name, "step-")) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return std::nullopt;
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v)) return std::nullopt;
  return v;
}

absl::Status WithContext(const absl::Status& s, const std::string& context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

std::string CheckpointDirName(int64_t version) { return absl::StrFormat("step-%08d", version); }

std::string CheckpointPartFileName(int server_index) {
  return absl::StrFormat("part-%05d.zop", server_index);
}

absl::StatusOr<std::string> BeginCheckpoint(const std::string& root, const std::string& job,
                                            int64_t version) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  if (version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint version ", version, " is < 0"));
  }
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::error_code ec;
  const bool made = std::filesystem::create_directories(job_dir, ec);
  if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("create checkpoint directory ", job_dir));
  if (made) ZO_RETURN_IF_ERROR(SyncPath(root));
  const std::string final_dir = absl::StrCat(job_dir, "/", CheckpointDirName(version));
  if (std::filesystem::exists(final_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint of job ", job, " at version ", version,
                                                 " already exists: ", final_dir));
  }
  const std::string tmp = final_dir + kTmpSuffix;
  // Stale attempts, this version's and others'.
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "step-") && absl::EndsWith(name, kTmpSuffix)) {
      stale.push_back(entry.path());
    }
  }
  if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("list ", job_dir));
  for (const std::filesystem::path& p : stale) {
    std::filesystem::remove_all(p, ec);
    if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("remove stale ", p.string()));
  }
  if (mkdir(tmp.c_str(), 0755) != 0) return ZO_ERRNO_STATUS(errno, absl::StrCat("mkdir ", tmp));
  return tmp;
}

absl::Status AbandonCheckpoint(const std::string& tmp_dir) {
  if (!absl::EndsWith(tmp_dir, kTmpSuffix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a temporary checkpoint directory: ", tmp_dir));
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp_dir, ec);
  if (ec) return ZO_ERRNO_STATUS(ec.value(), absl::StrCat("remove ", tmp_dir));
  return absl::OkStatus();
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& tmp_dir,
                                             const CheckpointMeta& meta) {
  const std::string context = absl::StrCat("cannot commit checkpoint ", tmp_dir);
  std::string dir = tmp_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string want_name = CheckpointDirName(meta.version) + kTmpSuffix;
  if (BaseName(dir) != want_name || BaseName(DirectoryOf(dir)) != meta.job) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": the directory of job ", meta.job,
                                                   " at version ", meta.version, " must be <root>/",
                                                   meta.job, "/", want_name));
  }
  absl::StatusOr<ShardMap> map = ValidateMeta(meta, context);
  if (!map.ok()) return map.status();
  for (int i = 0; i < meta.num_servers; ++i) {
    absl::StatusOr<std::unique_ptr<CheckpointPartReader>> part = OpenPart(dir, meta, *map, i);
    if (!part.ok())
      return WithContext(part.status(), absl::StrCat(context, ": part of server ", i));
  }
  {
    absl::StatusOr<std::unique_ptr<AtomicFileWriter>> out =
        AtomicFileWriter::Create(absl::StrCat(dir, "/", kMetaFileName));
    if (!out.ok()) return WithContext(out.status(), context);
    absl::Status s = (*out)->Append(MetaFileText(meta));
    if (s.ok()) s = (*out)->Commit();  // fsyncs the directory: parts and record are durable
    if (!s.ok()) return WithContext(s, context);
  }
  const std::string final_dir = dir.substr(0, dir.size() - (sizeof(kTmpSuffix) - 1));
  if (renameat2(AT_FDCWD, dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) {
      return absl::AlreadyExistsError(
          absl::StrCat(context, ": ", final_dir, " already exists (committed before?)"));
    }
    return ZO_ERRNO_STATUS(err, absl::StrCat(context, ": rename to ", final_dir));
  }
  ZO_RETURN_IF_ERROR(SyncPath(DirectoryOf(final_dir)));
  return final_dir;
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& root, const std::string& job) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::optional<int64_t> v = VersionOfDirName(name);  // rejects *.tmp
    if (v && entry.is_directory(ec)) found.emplace_back(*v, entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  for (const auto& [version, path] : found) {
    absl::StatusOr<CheckpointMeta> meta = ReadCheckpointMeta(path);
    if (meta.ok() && meta->version == version && meta->job == job) return path;
  }
  return absl::NotFoundError(absl::StrCat("no committed checkpoint of job ", job, " in ", job_dir));
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& root,
                                                          const std::string& job, int keep) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("keep ", keep, " checkpoints?"));
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::vector<std::pair<int64_t, std::string>> committed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    const std::optional<int64_t> v = VersionOfDirName(entry.path().filename().string());
    if (v && entry.is_directory(ec)) committed.emplace_back(*v, entry.path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", job_dir, ": ", ec.message()));
  std::sort(committed.begin(), committed.end(), std::greater<>());
  std::vector<std::string> removed;
  for (size_t i = static_cast<size_t>(keep); i < committed.size(); ++i) {
    std::filesystem::remove_all(committed[i].second, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot remove ", committed[i].second, ": ", ec.message()));
    }
    removed.push_back(committed[i].second);
  }
  return removed;
}

absl::StatusOr<std::vector<std::string>> RemoveJobCheckpoints(const std::string& root,
                                                              const std::string& job) {
  ZO_RETURN_IF_ERROR(CheckJobName(job));
  const std::string job_dir = absl::StrCat(root, "/", job);
  std::vector<std::string> removed;
  std::error_code ec;
  if (!std::filesystem::exists(job_dir, ec)) return removed;
  for (const auto& entry : std::filesystem::directory_iterator(job_dir, ec)) {
    if (entry.is_directory(ec)) removed.push_back(entry.path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", job_dir, ": ", ec.message()));
  std::sort(removed.begin(), removed.end());
  std::filesystem::remove_all(job_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", job_dir, ": ", ec.message()));
  return removed;
}

}  // namespace zo
