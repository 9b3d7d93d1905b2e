#include "worker/pipeline/transport.h"

#include "absl/strings/str_cat.h"

namespace zo::pipeline {

std::string ToString(const MessageTag& tag) {
  return absl::StrCat(tag.kind == MessageTag::Kind::kActivation ? "activation" : "grad",
                      "(step=", tag.step, ", mb=", tag.micro_batch, ", chunk=", tag.chunk, ")");
}

}  // namespace zo::pipeline
