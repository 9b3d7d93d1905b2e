// The CPU backend's memory: host round trips in every dtype, size checks,
// rounding on UploadFloat and Cast.
#include "worker/backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/bf16.h"
#include "common/fp16.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zo::backend {
namespace {

using ::testing::HasSubstr;
using ::zo::testing::IsOk;
using ::zo::testing::StatusIs;

template <typename T>
std::vector<std::byte> Bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class CpuBackendTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be_ = MakeCpuBackend();
};

TEST_F(CpuBackendTest, Name) { EXPECT_EQ(be_->name(), "cpu"); }

TEST_F(CpuBackendTest, Fp32RoundTrip) {
  const std::vector<float> values = {1.0f, -0.1f, 3.0e38f, 1e-45f, -0.0f, 7.25f};
  Tensor t = be_->Empty(DType::kFloat32, {2, 3});
  EXPECT_EQ(t.nbytes(), 24);
  const std::vector<std::byte> in = Bytes(values);
  ASSERT_THAT(be_->Upload(in, t), IsOk());
  std::vector<std::byte> out(in.size());
  ASSERT_THAT(be_->Download(t, absl::MakeSpan(out)), IsOk());
  EXPECT_EQ(out, in);
  std::vector<float> f(values.size());
  ASSERT_THAT(be_->DownloadFloat(t, absl::MakeSpan(f)), IsOk());
  EXPECT_EQ(Bytes(f), in);
}

// Every 16-bit pattern but NaNs (whose payload quieting is convert.h's
// business) survives Upload then Download bit for bit.
void ExpectSixteenBitRoundTrip(Backend& be, DType dtype, float (*to_float)(uint16_t)) {
  std::vector<uint16_t> bits;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    if (!std::isnan(to_float(static_cast<uint16_t>(b)))) bits.push_back(static_cast<uint16_t>(b));
  }
  Tensor t = be.Empty(dtype, {static_cast<int64_t>(bits.size())});
  EXPECT_EQ(t.nbytes(), static_cast<int64_t>(bits.size() * 2));
  const std::vector<std::byte> in = Bytes(bits);
  ASSERT_THAT(be.Upload(in, t), IsOk());
  std::vector<std::byte> out(in.size());
  ASSERT_THAT(be.Download(t, absl::MakeSpan(out)), IsOk());
  EXPECT_EQ(out, in);
  std::vector<float> f(bits.size());
  ASSERT_THAT(be.DownloadFloat(t, absl::MakeSpan(f)), IsOk());
  for (size_t i = 0; i < bits.size(); ++i) {
    ASSERT_EQ(f[i], to_float(bits[i])) << "bits 0x" << std::hex << bits[i];
  }
}

TEST_F(CpuBackendTest, Fp16RoundTrip) {
  ExpectSixteenBitRoundTrip(*be_, DType::kFloat16, [](uint16_t b) { return HalfBitsToFloat(b); });
}

TEST_F(CpuBackendTest, Bf16RoundTrip) {
  ExpectSixteenBitRoundTrip(*be_, DType::kBFloat16, [](uint16_t b) { return Bf16BitsToFloat(b); });
}

TEST_F(CpuBackendTest, UploadFloatRoundsToTheDtype) {
  const std::vector<float> values = {1.0f / 3.0f, 1000.1f, -2.7182818f};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    Tensor t = be_->Empty(dtype, {3});
    ASSERT_THAT(be_->UploadFloat(values, t), IsOk());
    std::vector<float> got(3);
    ASSERT_THAT(be_->DownloadFloat(t, absl::MakeSpan(got)), IsOk());
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = dtype == DType::kFloat16 ? HalfBitsToFloat(FloatToHalfBits(values[i]))
                                                  : Bf16BitsToFloat(FloatToBf16Bits(values[i]));
      EXPECT_EQ(got[i], want) << DTypeName(dtype) << " " << values[i];
      EXPECT_NE(got[i], values[i]) << "not a value the test means to round";
    }
  }
}

TEST_F(CpuBackendTest, SizeMismatchIsInvalidArgument) {
  Tensor t = be_->Empty(DType::kFloat16, {2, 3});  // 6 values, 12 bytes
  std::vector<std::byte> bytes(11);
  EXPECT_THAT(be_->Upload(bytes, t),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Upload: 11")));
  EXPECT_THAT(be_->Download(t, absl::MakeSpan(bytes)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[2, 3]")));
  std::vector<float> floats(12);  // the byte count, not the element count
  EXPECT_THAT(be_->UploadFloat(floats, t),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("UploadFloat: 12")));
  EXPECT_THAT(be_->DownloadFloat(t, absl::MakeSpan(floats)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 6")));
}

TEST_F(CpuBackendTest, CastFp32ToFp16OverflowsToInf) {
  const std::vector<float> values = {70000.0f, -1e10f, 65504.0f, 65519.0f, 1.0f / 3.0f};
  Tensor src = be_->Empty(DType::kFloat32, {5});
  ASSERT_THAT(be_->UploadFloat(values, src), IsOk());
  const Tensor half = be_->Cast(src, DType::kFloat16);
  EXPECT_EQ(half.dtype(), DType::kFloat16);
  EXPECT_EQ(half.shape(), src.shape());
  std::vector<float> got(5);
  ASSERT_THAT(be_->DownloadFloat(half, absl::MakeSpan(got)), IsOk());
  constexpr float kInf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(got[0], kInf);
  EXPECT_EQ(got[1], -kInf);
  EXPECT_EQ(got[2], 65504.0f);
  EXPECT_EQ(got[3], 65504.0f);
  EXPECT_EQ(got[4], HalfBitsToFloat(FloatToHalfBits(1.0f / 3.0f)));
  std::vector<uint16_t> bits(5);
  ASSERT_THAT(be_->Download(half, absl::MakeSpan(reinterpret_cast<std::byte*>(bits.data()), 10)),
              IsOk());
  EXPECT_EQ(bits[0], 0x7C00);
  EXPECT_EQ(bits[1], 0xFC00);
  // The source is untouched; bf16 keeps the range.
  ASSERT_THAT(be_->DownloadFloat(src, absl::MakeSpan(got)), IsOk());
  EXPECT_EQ(got[0], 70000.0f);
  ASSERT_THAT(be_->DownloadFloat(be_->Cast(src, DType::kBFloat16), absl::MakeSpan(got)), IsOk());
  EXPECT_TRUE(std::isfinite(got[0]) && std::isfinite(got[1]));
  EXPECT_EQ(got[0], Bf16BitsToFloat(FloatToBf16Bits(70000.0f)));
}

TEST_F(CpuBackendTest, CountsLiveAndPeakBytesAsADeviceWouldHoldThem) {
  const std::unique_ptr<Backend> be = MakeCpuBackend();  // its own counts
  ASSERT_TRUE(be->allocation().has_value());
  EXPECT_EQ(be->allocation()->live_bytes, 0);
  {
    Tensor a = be->Empty(DType::kBFloat16, {3, 4});  // 24 bytes, though stored as fp32
    Tensor b = be->Zeros(DType::kFloat32, {5});      // 20
    Tensor shared = a;                               // a handle, not an allocation
    EXPECT_EQ(be->allocation()->live_bytes, 44);
    a = Tensor();
    EXPECT_EQ(be->allocation()->live_bytes, 44);  // `shared` still holds it
    shared = Tensor();
    EXPECT_EQ(be->allocation()->live_bytes, 20);
    EXPECT_EQ(be->allocation()->peak_bytes, 44);
    be->ResetPeakAllocation();
    EXPECT_EQ(be->allocation()->peak_bytes, 20);
    Tensor c = be->Cast(b, DType::kFloat16);  // ops allocate through Empty too
    EXPECT_EQ(be->allocation()->live_bytes, 30);
  }
  EXPECT_EQ(be->allocation()->live_bytes, 0);
  EXPECT_EQ(be->allocation()->peak_bytes, 30);
}

TEST_F(CpuBackendTest, ZerosAndSetZero) {
  Tensor t = be_->Zeros(DType::kBFloat16, {3, 4});
  std::vector<float> got(12, 1.0f);
  ASSERT_THAT(be_->DownloadFloat(t, absl::MakeSpan(got)), IsOk());
  EXPECT_EQ(got, std::vector<float>(12, 0.0f));
  ASSERT_THAT(be_->UploadFloat(std::vector<float>(12, 2.5f), t), IsOk());
  be_->SetZero(t);
  ASSERT_THAT(be_->DownloadFloat(t, absl::MakeSpan(got)), IsOk());
  EXPECT_EQ(got, std::vector<float>(12, 0.0f));
}

}  // namespace
}  // namespace zo::backend
