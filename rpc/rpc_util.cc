#include "rpc/rpc_util.h"

#include <optional>
#include <string>

#include "proto/zo/v1/error.pb.h"
#include "rpc/error_detail.h"

namespace zo {

grpc::Status ToGrpcStatus(const absl::Status& given) {
  if (given.ok()) return grpc::Status::OK;
  const absl::Status s = RewordedForTesting(given);
  const std::optional<v1::ErrorDetail> detail = DetailOf(s);
  if (!detail.has_value()) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
  }
  v1::RpcStatus details;
  details.set_code(static_cast<int>(s.code()));
  details.set_message(std::string(s.message()));
  details.add_details()->PackFrom(*detail);
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  v1::RpcStatus details;
  if (s.error_details().empty() || !details.ParseFromString(s.error_details())) return out;
  for (const google::protobuf::Any& any : details.details()) {
    v1::ErrorDetail detail;
    if (any.Is<v1::ErrorDetail>() && any.UnpackTo(&detail))
      out = WithDetail(std::move(out), detail);
  }
  return out;
}

}  // namespace zo
