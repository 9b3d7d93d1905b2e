// What the tests of lent buffers (OffloadClient::PushBuffers and
// RegionPullBuffers; in_process_route_test, shared_memory_route_test) share:
// a bf16 job of several chunks, each step's gradients, and its weights.
#ifndef ZO_TESTS_SERVER_LENT_BUFFERS_H_
#define ZO_TESTS_SERVER_LENT_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/bf16.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "worker/client/offload_client.h"

namespace zo::testing {

// bf16, chunks of 4096 elements.
inline constexpr char kLentConfig[] = R"({"train_batch_size": 1, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zo": {"chunk_elems": 4096}})";
// Several chunks, a tensor across chunks, and one of no elements.
inline const std::vector<TensorSpec> kLentManifest = {
    {.name = "a", .shape = {5000}, .dtype = DType::kBFloat16},
    {.name = "b", .shape = {0}, .dtype = DType::kBFloat16},
    {.name = "c", .shape = {9000}, .dtype = DType::kBFloat16}};
inline const std::vector<int> kLentTensors = {0, 1, 2};

// Tensor `t`'s bf16 gradient of `step`: small integers, different per step
// and tensor.
inline std::vector<uint16_t> LentGradient(int64_t step, int t) {
  std::vector<uint16_t> g(static_cast<size_t>(NumElements(kLentManifest[t].shape)));
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = FloatToBf16Bits(static_cast<float>((i * 5 + step * 7 + t) % 23) - 11.0f);
  }
  return g;
}

inline absl::Span<const std::byte> BytesOf(const std::vector<uint16_t>& g) {
  return {reinterpret_cast<const std::byte*>(g.data()), g.size() * 2};
}

// Every tensor of `manifest` (16-bit) of version `version`, pulled into
// buffers of the test's own.
inline std::vector<std::vector<std::byte>> PulledTensors(OffloadClient& client, int64_t version,
                                                         const std::vector<TensorSpec>& manifest) {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<absl::Span<std::byte>> dst;
  std::vector<int> tensors;
  for (const TensorSpec& t : manifest) {
    tensors.push_back(static_cast<int>(tensors.size()));
    bytes.emplace_back(static_cast<size_t>(NumElements(t.shape)) * 2);
    dst.push_back(absl::MakeSpan(bytes.back()));
  }
  EXPECT_THAT(client.Pull(version, -1, tensors, dst).status(), IsOk());
  return bytes;
}

inline std::vector<std::vector<std::byte>> PulledWeights(OffloadClient& client, int64_t version) {
  return PulledTensors(client, version, kLentManifest);
}

// Tensors that start and end inside the update's gradient blocks (64 Ki
// elements) in chunks of four blocks: what a lent push
// (OffloadClient::PushLent) reads in place and what it copies.
inline const std::vector<TensorSpec> kBlockManifest = {
    {.name = "a", .shape = {100003}, .dtype = DType::kBFloat16},
    {.name = "b", .shape = {300000}, .dtype = DType::kBFloat16},
    {.name = "c", .shape = {70001}, .dtype = DType::kBFloat16}};

// Tensor `t`'s bf16 gradient of `step` in kBlockManifest, `scale` times
// small integers.
inline std::vector<uint16_t> BlockGradient(int64_t step, int t, float scale) {
  std::vector<uint16_t> g(static_cast<size_t>(NumElements(kBlockManifest[t].shape)));
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = FloatToBf16Bits(scale * static_cast<float>((i * 3 + step * 5 + t) % 29 - 14));
  }
  return g;
}

}  // namespace zo::testing

#endif  // ZO_TESTS_SERVER_LENT_BUFFERS_H_
