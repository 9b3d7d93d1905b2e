#include "server/lead_restore.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "rpc/error_detail.h"
#include "rpc/proto_convert.h"
#include "server/job_internal.h"
#include "server/state_checkpoint.h"

namespace zo {

LeadRestore::LeadRestore(Options options, RestoreActions actions)
    : options_(std::move(options)), spec_(*options_.spec), actions_(std::move(actions)) {}

absl::StatusOr<std::string> LeadRestore::Latest() const {
  if (options_.root.empty()) {
    return absl::NotFoundError("this zo-server was started without --checkpoint-dir");
  }
  return LatestCheckpoint(options_.root, spec_.name);
}

absl::StatusOr<v1::RestoreResponse> LeadRestore::Run(const std::string& path, bool rollback,
                                                     std::optional<int64_t> if_restores) {
  std::lock_guard lock(mu_);
  const RestorePosition before = actions_.position();
  if (if_restores.has_value() && before.restores_done != *if_restores) {
    v1::RestoreResponse response;
    response.set_already_restored(true);
    response.set_version(before.version);
    response.set_base_version(before.base_version);
    return response;
  }
  std::string dir = path;
  if (dir.empty()) {
    if (options_.root.empty()) {
      return absl::FailedPreconditionError(
          "no checkpoint path given and zo-server was started without --checkpoint-dir");
    }
    ZO_ASSIGN_OR_RETURN(dir, LatestCheckpoint(options_.root, spec_.name));
  }
  ZO_ASSIGN_OR_RETURN(const CheckpointMeta meta, ReadCheckpointMeta(dir));
  if (!SameManifest(meta.manifest, spec_.manifest)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir, " holds a different manifest than job ", spec_.name));
  }
  v1::RestorePartRequest request;
  request.set_job(spec_.name);
  request.set_path(dir);
  // Random, not generation + 1: a lead that restarted counts from 0 again
  // while a follower may be at 1 already, and a restore of the generation a
  // server is in aborts nothing there (its step would wait for the dead
  // lead forever). Generations are only ever compared for equality.
  int64_t generation;
  do {
    generation = static_cast<int64_t>(job_internal::NewIncarnation() >> 1);
  } while (generation == before.generation);
  request.set_generation(generation);
  request.set_rollback(rollback);
  // The lead stays "restoring" until every follower has its part: a worker
  // that found it healthy would resume at the restored version and pull it
  // from a follower that still holds the old ones.
  absl::Status status = actions_.restore_own_part(request);
  if (status.ok()) status = RestoreFollowers(request);
  if (status.ok()) status = actions_.restore_decider(meta);
  actions_.ended(status, dir);
  if (!status.ok()) return status;
  ZO_LOG(INFO) << "job " << spec_.name << ": restored version " << meta.version << " from " << dir
               << " (written by " << meta.num_servers << " servers, now " << spec_.servers.size()
               << ")";
  v1::RestoreResponse response;
  response.set_path(dir);
  response.set_version(meta.version);
  response.set_base_version(actions_.position().base_version);
  return response;
}

absl::Status LeadRestore::RestoreFollowers(const v1::RestorePartRequest& request) {
  const absl::Duration timeout = options_.peer_timeout * 10;
  for (size_t i = 1; i < spec_.servers.size(); ++i) {
    absl::Status status = options_.peers->RestorePart(spec_.servers[i], request, timeout);
    if (ReasonOf(status) == v1::ErrorDetail::NO_JOB) {
      // It restarted without its part: open it there again, then restore it.
      status = OpenPartOn(static_cast<int>(i));
      if (status.ok()) status = options_.peers->RestorePart(spec_.servers[i], request, timeout);
    }
    ZO_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::Status LeadRestore::OpenPartOn(int server) {
  v1::OpenJobRequest request;
  request.set_job(spec_.name);
  *request.mutable_manifest() = ManifestToProto(spec_.manifest);
  request.set_config_json(spec_.config_json);
  request.set_dp_world_size(spec_.dp_world_size);
  for (const std::string& s : spec_.servers) request.add_servers(s);
  request.set_server_index(server);
  request.set_init_fingerprint(spec_.init_fingerprint);
  request.set_by_lead(true);
  return options_.peers->OpenJob(spec_.servers[server], request, absl::Seconds(5)).status();
}

}  // namespace zo
