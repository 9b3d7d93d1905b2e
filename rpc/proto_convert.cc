#include "rpc/proto_convert.h"

#include "absl/strings/str_cat.h"

namespace zo {

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FP32;
    case DType::kFloat16:
      return v1::DTYPE_FP16;
    case DType::kBFloat16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return DType::kFloat32;
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    case v1::DTYPE_BF16:
      return DType::kBFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", static_cast<int>(dtype), " is not fp32, fp16 or bf16"));
  }
}

v1::Manifest ManifestToProto(const std::vector<TensorSpec>& tensors) {
  v1::Manifest manifest;
  for (const TensorSpec& t : tensors) {
    v1::TensorSpec* spec = manifest.add_tensors();
    spec->set_name(t.name);
    for (int64_t d : t.shape) spec->add_shape(d);
    spec->set_dtype(DTypeToProto(t.dtype));
    spec->set_group(t.group);
  }
  return manifest;
}

void CompensationTermsToProto(const CompensationTerms& terms, v1::TensorCompensation* out) {
  out->set_tensor(terms.tensor);
  out->set_elems(terms.elems);
  out->set_v_sum(terms.v_sum);
  out->set_keep(terms.keep);
  out->set_momentum(terms.momentum);
  out->set_previous_keep(terms.previous_keep);
  out->set_gain(terms.gain);
  out->set_inv_sqrt_bias2(terms.inv_sqrt_bias2);
  out->set_eps(terms.eps);
}

CompensationTerms CompensationTermsFromProto(const v1::TensorCompensation& p) {
  return {.tensor = p.tensor(),
          .elems = p.elems(),
          .v_sum = p.v_sum(),
          .keep = p.keep(),
          .momentum = p.momentum(),
          .previous_keep = p.previous_keep(),
          .gain = p.gain(),
          .inv_sqrt_bias2 = p.inv_sqrt_bias2(),
          .eps = p.eps()};
}

}  // namespace zo
