#include "worker/train/streamed_weights.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/train/weight_file.h"

namespace zo::train {
namespace {

using Bytes = std::vector<absl::Span<const std::byte>>;

int64_t ByteSize(const model::Param& p, DType dtype) {
  return p.numel() * static_cast<int64_t>(DTypeSize(dtype));
}

// The window's two slots, each grown to the largest read into it, aligned
// for O_DIRECT. The window never has two reads of one slot in flight.
class ReadSlots {
 public:
  explicit ReadSlots(backend::Backend& backend) : backend_(backend) {}

  absl::StatusOr<std::byte*> Get(int slot, int64_t bytes) {
    if (slot < 0 || slot > 1) return absl::InternalError(absl::StrCat("no read slot ", slot));
    Slot& s = slots_[slot];
    if (bytes > s.bytes) {
      s.arena = backend_.AllocateHost(static_cast<size_t>(bytes + WeightFile::kAlignment - 1));
      s.data = AlignUp(s.arena.get(), WeightFile::kAlignment);
      s.bytes = bytes;
    }
    return s.data;
  }
  int64_t bytes() const { return slots_[0].bytes + slots_[1].bytes; }

 private:
  struct Slot {
    std::shared_ptr<std::byte> arena;
    std::byte* data = nullptr;
    int64_t bytes = 0;
  };
  backend::Backend& backend_;
  Slot slots_[2];
};

// The params' indices in the stage's order.
class ParamIndex {
 public:
  explicit ParamIndex(const std::vector<model::Param*>& params) {
    for (size_t i = 0; i < params.size(); ++i) index_[params[i]] = i;
  }
  absl::StatusOr<std::vector<size_t>> Of(absl::Span<const model::Param* const> params) const {
    std::vector<size_t> out;
    for (const model::Param* p : params) {
      auto it = index_.find(p);
      if (it == index_.end()) {
        return absl::InternalError(absl::StrCat(p->name, " is not among the stage's params"));
      }
      out.push_back(it->second);
    }
    return out;
  }

 private:
  std::map<const model::Param*, size_t> index_;
};

class HostCopy final : public StreamedWeights {
 public:
  explicit HostCopy(Stage stage) : StreamedWeights(std::move(stage)) {
    int64_t total = 0;
    for (const model::Param* p : stage_.params) total += ByteSize(*p, stage_.dtype);
    arena_ = stage_.backend->AllocateHost(static_cast<size_t>(total));
    int64_t offset = 0;
    for (const model::Param* p : stage_.params) {
      const int64_t bytes = ByteSize(*p, stage_.dtype);
      host_.emplace_back(arena_.get() + offset, static_cast<size_t>(bytes));
      offset += bytes;
    }
  }
  Kind kind() const override { return Kind::kHostCopy; }

  absl::StatusOr<bool> Pull(OffloadClient& client, int64_t step, double* loss_scale) override {
    // A pull that finds the version unchanged leaves host_ as it was: the
    // step before's weights, which are this step's. (After a failed pull
    // or a restore the client pulls whole and says changed.)
    return stage_.guard([&](PullCancellation* cancel) {
      return client.PullForStep(step, stage_.tensors, host_, loss_scale, cancel);
    });
  }
  model::HostWeights Weights(bool changed) override {
    model::HostWeights w;
    w.bytes.assign(host_.begin(), host_.end());
    w.changed = changed;
    return w;
  }
  int64_t host_bytes() const override {
    int64_t bytes = 0;
    for (const absl::Span<std::byte>& h : host_) bytes += static_cast<int64_t>(h.size());
    return bytes;
  }

 private:
  std::shared_ptr<std::byte> arena_;
  std::vector<absl::Span<std::byte>> host_;
};

class FromServers final : public StreamedWeights {
 public:
  explicit FromServers(Stage stage)
      : StreamedWeights(std::move(stage)), slots_(*stage_.backend), index_(stage_.params) {
    for (size_t i = 0; i < stage_.params.size(); ++i) {
      const int64_t n = stage_.params[i]->numel();
      if (n > 0 && (smallest_ < 0 || n < stage_.params[smallest_]->numel())) {
        smallest_ = static_cast<int>(i);
      }
    }
    if (smallest_ >= 0) {
      smallest_bytes_.resize(
          static_cast<size_t>(ByteSize(*stage_.params[smallest_], stage_.dtype)));
    }
  }
  Kind kind() const override { return Kind::kServers; }

  absl::StatusOr<bool> Pull(OffloadClient& client, int64_t step, double* loss_scale) override {
    if (smallest_ < 0) return false;  // only empty tensors: nothing to pull, ever
    // The version, its loss scale and whether it changed, for the price of
    // the smallest tensor; the window pulls the rest layer by layer.
    const std::vector<int> tensor = {stage_.tensors[smallest_]};
    const std::vector<absl::Span<std::byte>> dst = {absl::MakeSpan(smallest_bytes_)};
    ZO_ASSIGN_OR_RETURN(const bool changed, stage_.guard([&](PullCancellation* cancel) {
      return client.PullForStep(step, tensor, dst, loss_scale, cancel);
    }));
    client_ = &client;
    version_ = client.last_pulled_version();
    return changed;
  }
  model::HostWeights Weights(bool changed) override {
    model::HostWeights w;
    w.changed = changed;
    // The client and version of this step's first pull: a client swapped
    // between steps never meets a read in flight.
    w.read = [this, client = client_, version = version_](
                 absl::Span<const model::Param* const> params, int slot) {
      return Read(*client, version, params, slot);
    };
    return w;
  }
  int64_t host_bytes() const override {
    return static_cast<int64_t>(smallest_bytes_.size()) + slots_.bytes();
  }

 private:
  absl::StatusOr<Bytes> Read(OffloadClient& client, int64_t version,
                             absl::Span<const model::Param* const> params, int slot) {
    ZO_ASSIGN_OR_RETURN(const std::vector<size_t> index, index_.Of(params));
    int64_t need = 0;
    for (size_t i : index) need += ByteSize(*stage_.params[i], stage_.dtype);
    ZO_ASSIGN_OR_RETURN(std::byte* const data, slots_.Get(slot, need));
    std::vector<int> tensors;
    std::vector<absl::Span<std::byte>> dst;
    Bytes out;
    int64_t pos = 0;
    for (size_t i : index) {
      const auto bytes = static_cast<size_t>(ByteSize(*stage_.params[i], stage_.dtype));
      out.emplace_back(data + pos, bytes);
      if (bytes > 0) {  // a pull takes no empty tensor
        tensors.push_back(stage_.tensors[i]);
        dst.emplace_back(data + pos, bytes);
      }
      pos += static_cast<int64_t>(bytes);
    }
    if (!tensors.empty()) {
      ZO_RETURN_IF_ERROR(stage_
                             .guard([&](PullCancellation* cancel) {
                               return client.Pull(version, -1, tensors, dst, cancel);
                             })
                             .status());
    }
    return out;
  }

  ReadSlots slots_;
  const ParamIndex index_;
  int smallest_ = -1;  // into stage_.params
  std::vector<std::byte> smallest_bytes_;
  OffloadClient* client_ = nullptr;  // of the last Pull
  int64_t version_ = -1;
};

class InFile final : public StreamedWeights {
 public:
  static absl::StatusOr<std::unique_ptr<StreamedWeights>> Create(Stage stage,
                                                                 const WeightFileOptions& o) {
    std::vector<int64_t> sizes;
    for (const model::Param* p : stage.params) {
      ZO_RETURN_IF_ERROR(CheckWeightBuffer(o.buffer_elems, p->name, p->numel()));
      sizes.push_back(ByteSize(*p, stage.dtype));
    }
    ZO_ASSIGN_OR_RETURN(std::unique_ptr<WeightFile> file,
                        WeightFile::Create({.dir = o.dir, .io = o.io, .param_bytes = sizes}));
    return std::unique_ptr<StreamedWeights>(
        new InFile(std::move(stage), std::move(file), o.buffer_elems));
  }
  Kind kind() const override { return Kind::kFile; }

  absl::StatusOr<bool> Pull(OffloadClient& client, int64_t step, double* loss_scale) override {
    std::vector<OffloadClient::PullBatch> batches;
    for (const Batch& b : batches_) batches.push_back({b.tensors, b.dst});
    return stage_.guard([&](PullCancellation* cancel) {
      return client.PullForStepInBatches(
          step, batches,
          [&](size_t b) { return file_->Write(batches_[b].first, batches_[b].last, buffer_); },
          loss_scale, cancel);
    });
  }
  model::HostWeights Weights(bool changed) override {
    model::HostWeights w;
    w.changed = changed;
    w.read = [this](absl::Span<const model::Param* const> params, int slot) {
      return Read(params, slot);
    };
    return w;
  }
  int64_t host_bytes() const override { return buffer_bytes_ + slots_.bytes(); }

 private:
  // Consecutive params [first, last), pulled together into buffer_ laid out
  // as the file is, then written.
  struct Batch {
    size_t first = 0;
    size_t last = 0;
    std::vector<int> tensors;
    std::vector<absl::Span<std::byte>> dst;
  };

  InFile(Stage stage, std::unique_ptr<WeightFile> file, int64_t buffer_elems)
      : StreamedWeights(std::move(stage)),
        file_(std::move(file)),
        slots_(*stage_.backend),
        index_(stage_.params) {
    // As many whole params as buffer_elems parameters hold (at least one).
    const int64_t limit =
        std::max(buffer_elems * static_cast<int64_t>(DTypeSize(stage_.dtype)), int64_t{1});
    const size_t n = stage_.params.size();
    for (size_t first = 0; first < n;) {
      size_t last = first + 1;
      while (last < n && file_->RangeBytes(first, last + 1) <= limit) ++last;
      Batch batch;
      batch.first = first;
      batch.last = last;
      for (size_t i = first; i < last; ++i) batch.tensors.push_back(stage_.tensors[i]);
      batches_.push_back(std::move(batch));
      buffer_bytes_ = std::max(buffer_bytes_, file_->RangeBytes(first, last));
      first = last;
    }
    arena_ = stage_.backend->AllocateHost(
        static_cast<size_t>(buffer_bytes_ + WeightFile::kAlignment - 1));
    buffer_ = AlignUp(arena_.get(), WeightFile::kAlignment);
    for (Batch& b : batches_) {
      for (size_t i = b.first; i < b.last; ++i) {
        b.dst.emplace_back(buffer_ + (file_->offset(i) - file_->offset(b.first)),
                           static_cast<size_t>(file_->bytes(i)));
      }
    }
  }

  absl::StatusOr<Bytes> Read(absl::Span<const model::Param* const> params, int slot) {
    ZO_ASSIGN_OR_RETURN(const std::vector<size_t> index, index_.Of(params));
    // Runs of consecutive params, each one read; a layer's params are one run.
    std::vector<std::pair<size_t, size_t>> runs;
    for (size_t i : index) {
      if (!runs.empty() && runs.back().second == i) {
        ++runs.back().second;
      } else {
        runs.emplace_back(i, i + 1);
      }
    }
    int64_t need = 0;
    for (const auto& [first, last] : runs) need += file_->RangeBytes(first, last);
    ZO_ASSIGN_OR_RETURN(std::byte* const data, slots_.Get(slot, need));
    std::map<size_t, const std::byte*> at;
    int64_t pos = 0;
    for (const auto& [first, last] : runs) {
      ZO_RETURN_IF_ERROR(file_->Read(first, last, data + pos));
      for (size_t i = first; i < last; ++i) {
        at[i] = data + pos + (file_->offset(i) - file_->offset(first));
      }
      pos += file_->RangeBytes(first, last);
    }
    Bytes out;
    for (size_t i : index) out.emplace_back(at[i], static_cast<size_t>(file_->bytes(i)));
    return out;
  }

  std::unique_ptr<WeightFile> file_;
  std::vector<Batch> batches_;
  int64_t buffer_bytes_ = 0;  // the largest batch
  std::shared_ptr<std::byte> arena_;
  std::byte* buffer_ = nullptr;
  ReadSlots slots_;
  const ParamIndex index_;
};

}  // namespace

StreamedWeights::Kind StreamedWeights::KindFor(const std::vector<std::string>& routes, bool file) {
  if (file) return Kind::kFile;
  const bool near =
      std::all_of(routes.begin(), routes.end(), [](const std::string& r) { return r != "grpc"; });
  return near ? Kind::kServers : Kind::kHostCopy;
}

absl::StatusOr<std::unique_ptr<StreamedWeights>> StreamedWeights::Create(
    Kind kind, Stage stage, const WeightFileOptions& file) {
  switch (kind) {
    case Kind::kServers:
      return std::unique_ptr<StreamedWeights>(new FromServers(std::move(stage)));
    case Kind::kHostCopy:
      return std::unique_ptr<StreamedWeights>(new HostCopy(std::move(stage)));
    case Kind::kFile:
      return InFile::Create(std::move(stage), file);
  }
  return absl::InternalError("no such kind of streamed weights");
}

}  // namespace zo::train
