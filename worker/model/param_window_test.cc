// ParamWindow's prefetch: the next layer's upload goes on beside the layer
// in use when the budget holds both, Fetch waits for it and reports its
// failure, and nothing the window drops is the layer in use. Uploads here
// complete when the test says (a backend that holds their callbacks). And
// weights read from a file on demand, through two staging slots.
#include "worker/model/param_window.h"

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/dry_run_backend.h"
#include "worker/model/basic_layers.h"

namespace zo::model {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

// Asynchronous uploads finish only at Complete.
class HeldUploads final : public backend::DryRunBackend {
 public:
  void UploadAsync(absl::Span<const std::byte> src, backend::Tensor& dst,
                   std::function<void(absl::Status)> done) override {
    absl::Status checked = Upload(src, dst);
    std::lock_guard<std::mutex> lock(mu_);
    held_.push_back(
        [checked, done = std::move(done)](absl::Status s) { done(checked.ok() ? s : checked); });
  }
  int held() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(held_.size());
  }
  // Finishes every upload held so far with `status`.
  void Complete(const absl::Status& status) {
    std::vector<std::function<void(absl::Status)>> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done.swap(held_);
    }
    for (auto& d : done) d(status);
  }

 private:
  std::mutex mu_;
  std::vector<std::function<void(absl::Status)>> held_;
};

constexpr DType kDType = DType::kBFloat16;

class ParamWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"a", "b", "c"}) {
      layers_.push_back(std::make_unique<LinearLayer>(name, 8, 8));  // 72 params, 144 bytes
      layers_.back()->Bind(backend_, kDType, /*grads=*/false, /*values=*/false);
      for (const Param& p : layers_.back()->params()) {
        host_[&p].resize(static_cast<size_t>(p.numel()) * DTypeSize(kDType));
      }
    }
  }

  std::unique_ptr<ParamWindow> Window(int64_t budget) {
    auto window = std::make_unique<ParamWindow>(backend_, kDType, budget);
    window->Reset(Host());
    return window;
  }
  std::map<const Param*, absl::Span<const std::byte>> Host() const {
    std::map<const Param*, absl::Span<const std::byte>> host;
    for (auto& [param, bytes] : host_) host.emplace(param, bytes);
    return host;
  }
  Layer& L(int i) { return *layers_[i]; }
  int64_t Bytes() const { return ParamWindow::LayerBytes(*layers_[0], kDType); }

  HeldUploads backend_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::map<const Param*, std::vector<std::byte>> host_;
};

TEST_F(ParamWindowTest, ThePrefetchGoesOnBesideTheLayerInUseAndFetchWaitsForIt) {
  std::unique_ptr<ParamWindow> window = Window(2 * Bytes());
  ASSERT_THAT(window->Fetch(L(0)), IsOk());
  ASSERT_THAT(window->Prefetch(&L(1), L(0)), IsOk());
  EXPECT_EQ(backend_.held(), 2);  // b's weight and bias, on their way
  EXPECT_EQ(window->resident_bytes(), 2 * Bytes());
  EXPECT_EQ(window->prefetches(), 1);
  ASSERT_THAT(window->Prefetch(&L(1), L(0)), IsOk());  // already on its way
  EXPECT_EQ(window->prefetches(), 1);

  std::thread copy_engine([&] { backend_.Complete(absl::OkStatus()); });
  EXPECT_THAT(window->Fetch(L(1)), IsOk());
  copy_engine.join();
  EXPECT_EQ(window->fetches(), 2);
  EXPECT_TRUE(L(1).params()[0].value.defined());
}

TEST_F(ParamWindowTest, NoRoomBesideTheLayerInUseMeansNoPrefetch) {
  std::unique_ptr<ParamWindow> window = Window(2 * Bytes() - 1);
  ASSERT_THAT(window->Fetch(L(0)), IsOk());
  ASSERT_THAT(window->Prefetch(&L(1), L(0)), IsOk());
  EXPECT_EQ(window->prefetches(), 0);
  EXPECT_EQ(backend_.held(), 0);
  EXPECT_TRUE(L(0).params()[0].value.defined());
}

TEST_F(ParamWindowTest, ThePrefetchDropsTheLeastRecentlyUsedButNeverTheLayerInUse) {
  std::unique_ptr<ParamWindow> window = Window(2 * Bytes());
  ASSERT_THAT(window->Fetch(L(1)), IsOk());
  ASSERT_THAT(window->Fetch(L(0)), IsOk());  // a in use, b the least recently used
  ASSERT_THAT(window->Prefetch(&L(2), L(0)), IsOk());
  EXPECT_TRUE(L(0).params()[0].value.defined());
  EXPECT_FALSE(L(1).params()[0].value.defined());
  EXPECT_EQ(window->peak_resident_bytes(), 2 * Bytes());
  backend_.Complete(absl::OkStatus());
  EXPECT_THAT(window->Settle(), IsOk());
}

// a b c a b c with room for two: the least recently used rule drops each
// layer just before it is needed again (six uploads); once the window knows
// the order it drops the one needed furthest ahead (four); a step in another
// order goes back to the least recently used.
TEST_F(ParamWindowTest, AStepInTheRecordedOrderDropsTheLayerNeededFurthestAhead) {
  std::unique_ptr<ParamWindow> window = Window(2 * Bytes());
  auto step = [&](std::initializer_list<int> order) {
    window->Reset(Host());
    for (int i : order) ASSERT_THAT(window->Fetch(L(i)), IsOk());
  };
  step({0, 1, 2, 0, 1, 2});
  EXPECT_EQ(window->fetches(), 6);
  step({0, 1, 2, 0, 1, 2});
  EXPECT_EQ(window->fetches(), 10);
  step({0, 2, 1});  // strays at its second fetch
  EXPECT_EQ(window->fetches(), 13);
  EXPECT_FALSE(L(0).params()[0].value.defined());  // least recently used, though needed next
  EXPECT_TRUE(L(2).params()[0].value.defined());
}

// DPU's first steps and a skipped step pull the same version: the window
// keeps what it has on the device, but only for the same bytes in the same
// places.
TEST_F(ParamWindowTest, UnchangedHostBytesKeepTheLayersOnTheDevice) {
  std::unique_ptr<ParamWindow> window = Window(2 * Bytes());
  ASSERT_THAT(window->Fetch(L(0)), IsOk());
  ASSERT_THAT(window->Fetch(L(1)), IsOk());
  window->Reset(Host(), /*unchanged=*/true);
  EXPECT_EQ(window->resident_bytes(), 2 * Bytes());
  ASSERT_THAT(window->Fetch(L(0)), IsOk());
  EXPECT_EQ(window->fetches(), 2);  // nothing uploaded again

  std::vector<std::byte> elsewhere(host_.begin()->second.size());
  std::map<const Param*, absl::Span<const std::byte>> moved = Host();
  moved.begin()->second = elsewhere;
  window->Reset(std::move(moved), /*unchanged=*/true);
  EXPECT_EQ(window->resident_bytes(), 0);
  window->Reset(Host(), /*unchanged=*/false);
  EXPECT_EQ(window->resident_bytes(), 0);
}

TEST_F(ParamWindowTest, AFailedPrefetchIsFetchsErrorAndItsLayerIsFetchedAgain) {
  std::unique_ptr<ParamWindow> window = Window(2 * Bytes());
  ASSERT_THAT(window->Fetch(L(0)), IsOk());
  ASSERT_THAT(window->Prefetch(&L(1), L(0)), IsOk());
  backend_.Complete(absl::DataLossError("copy engine fault"));
  EXPECT_THAT(window->Fetch(L(1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("copy engine fault")));
  EXPECT_EQ(window->resident_bytes(), Bytes());  // b dropped: its bytes are not the weights
  EXPECT_THAT(window->Fetch(L(1)), IsOk());      // uploaded again, synchronously
  EXPECT_EQ(window->resident_bytes(), 2 * Bytes());
}

// Weights in a file: the window reads a layer into slot 0 for Fetch, whose
// upload is done when Fetch returns, and into slot 1 for the prefetch; the
// device gets the bytes read, and a reader's failure is Fetch's.
class ParamWindowReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"a", "b", "c"}) {
      layers_.push_back(std::make_unique<LinearLayer>(name, 8, 8));
      layers_.back()->Bind(*backend_, kDType, /*grads=*/false, /*values=*/false);
      for (const Param& p : layers_.back()->params()) {
        std::vector<std::byte>& bytes = file_[&p];
        bytes.resize(static_cast<size_t>(p.numel()) * DTypeSize(kDType));
        for (size_t i = 0; i < bytes.size(); ++i) {
          bytes[i] = static_cast<std::byte>((i * 7 + file_.size() * 13) & 0x3F);
        }
      }
    }
  }

  // Copies from file_ into the slot, as a file read would.
  HostWeightReader Reader() {
    return [this](absl::Span<const Param* const> params,
                  int slot) -> absl::StatusOr<std::vector<absl::Span<const std::byte>>> {
      slots_used_.push_back(slot);
      readers_.push_back(std::this_thread::get_id());
      if (!fail_.ok()) return fail_;
      std::vector<std::byte>& staging = slots_[slot];
      staging.clear();
      std::vector<size_t> at;
      for (const Param* p : params) {
        at.push_back(staging.size());
        staging.insert(staging.end(), file_.at(p).begin(), file_.at(p).end());
      }
      std::vector<absl::Span<const std::byte>> out;
      for (size_t i = 0; i < params.size(); ++i) {
        out.push_back(absl::MakeConstSpan(staging).subspan(at[i], file_.at(params[i]).size()));
      }
      return out;
    };
  }
  std::vector<std::byte> OnDevice(const Param& p) {
    std::vector<std::byte> bytes(static_cast<size_t>(p.value.nbytes()));
    EXPECT_THAT(backend_->Download(p.value, absl::MakeSpan(bytes)), IsOk());
    return bytes;
  }
  Layer& L(int i) { return *layers_[i]; }
  int64_t Bytes() const { return ParamWindow::LayerBytes(*layers_[0], kDType); }

  std::unique_ptr<backend::Backend> backend_ = backend::MakeCpuBackend();
  std::vector<std::unique_ptr<Layer>> layers_;
  std::map<const Param*, std::vector<std::byte>> file_;
  std::vector<std::byte> slots_[2];
  std::vector<int> slots_used_;
  std::vector<std::thread::id> readers_;  // the thread of each read
  absl::Status fail_;
};

TEST_F(ParamWindowReaderTest, FetchAndPrefetchReadIntoTheirOwnSlots) {
  ParamWindow window(*backend_, kDType, 2 * Bytes());
  window.Reset(Reader());
  ASSERT_THAT(window.Fetch(L(0)), IsOk());
  ASSERT_THAT(window.Prefetch(&L(1), L(0)), IsOk());
  ASSERT_THAT(window.Fetch(L(1)), IsOk());
  EXPECT_EQ(slots_used_, (std::vector<int>{0, 1}));
  // Fetch reads where it stands; the prefetch's read goes on beside it.
  EXPECT_EQ(readers_[0], std::this_thread::get_id());
  EXPECT_NE(readers_[1], std::this_thread::get_id());
  for (int i : {0, 1}) {
    for (const Param& p : L(i).params()) EXPECT_EQ(OnDevice(p), file_.at(&p)) << p.name;
  }
  // Room for c: a is dropped, and c comes through slot 0.
  ASSERT_THAT(window.Fetch(L(2)), IsOk());
  EXPECT_EQ(slots_used_, (std::vector<int>{0, 1, 0}));
  for (const Param& p : L(2).params()) EXPECT_EQ(OnDevice(p), file_.at(&p)) << p.name;
  EXPECT_EQ(window.fetches(), 3);
}

TEST_F(ParamWindowReaderTest, AnUnchangedFileKeepsTheLayersAndAChangedOneDropsThem) {
  ParamWindow window(*backend_, kDType, 2 * Bytes());
  window.Reset(Reader());
  ASSERT_THAT(window.Fetch(L(0)), IsOk());
  window.Reset(Reader(), /*unchanged=*/true);
  EXPECT_EQ(window.resident_bytes(), Bytes());
  window.Reset(Reader(), /*unchanged=*/false);
  EXPECT_EQ(window.resident_bytes(), 0);
  // From bytes in memory to a file, the layers go even when unchanged.
  ASSERT_THAT(window.Fetch(L(0)), IsOk());
  window.Reset(std::map<const Param*, absl::Span<const std::byte>>{}, /*unchanged=*/true);
  EXPECT_EQ(window.resident_bytes(), 0);
}

TEST_F(ParamWindowReaderTest, AFailedPrefetchReadIsTheNextFetchsError) {
  ParamWindow window(*backend_, kDType, 2 * Bytes());
  window.Reset(Reader());
  ASSERT_THAT(window.Fetch(L(0)), IsOk());
  fail_ = absl::DataLossError("weights file: EIO");
  ASSERT_THAT(window.Prefetch(&L(1), L(0)), IsOk());
  EXPECT_THAT(window.Fetch(L(1)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("EIO")));
  EXPECT_EQ(window.resident_bytes(), Bytes());  // b dropped
  fail_ = absl::OkStatus();
  ASSERT_THAT(window.Fetch(L(1)), IsOk());
  for (const Param& p : L(1).params()) EXPECT_EQ(OnDevice(p), file_.at(&p)) << p.name;
}

TEST_F(ParamWindowReaderTest, AFailedReadIsFetchsErrorAndLeavesNothingResident) {
  ParamWindow window(*backend_, kDType, 2 * Bytes());
  window.Reset(Reader());
  fail_ = absl::DataLossError("weights file: short read");
  EXPECT_THAT(window.Fetch(L(0)), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("short read")));
  EXPECT_EQ(window.resident_bytes(), 0);
  fail_ = absl::OkStatus();
  ASSERT_THAT(window.Fetch(L(0)), IsOk());
  for (const Param& p : L(0).params()) EXPECT_EQ(OnDevice(p), file_.at(&p)) << p.name;
}

}  // namespace
}  // namespace zo::model
