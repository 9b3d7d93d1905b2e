// The CPU backend's memory: fp32 arrays holding values of the tensor's dtype.
#include "worker/backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/convert.h"
#include "common/cpu_features.h"
#include "common/logging.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"

// A DYNAMIC_ARCH OpenBLAS's kernel selection (driver/others/dynamic.c). Weak:
// a build for one fixed CPU has neither, and then there is nothing to choose.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));

namespace zo::backend {
namespace cpu {
namespace {

absl::Status SizeMismatch(const char* what, const Tensor& t, size_t got, size_t want) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", got, " host ", "values/bytes for a ",
                                                 std::string(DTypeName(t.dtype())), " tensor ",
                                                 ShapeString(t.shape()), " that needs ", want));
}

// OpenBLAS picks its kernels by CPU model, and a release older than the
// CPU (Debian 12's 0.3.21 on Sapphire/Emerald Rapids) falls back to its
// generic SSE3 "Prescott" kernels: GEMMs 5x slower than its AVX-512 ones on
// the same core. Unless the user chose (OPENBLAS_CORETYPE), select the
// kernels for what this CPU runs. Must run before any BLAS call: between
// quit and init OpenBLAS has no kernels.
void ChooseOpenBlasKernels() {
  if (gotoblas_dynamic_init == nullptr || gotoblas_dynamic_quit == nullptr) return;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string chosen = openblas_get_corename();  // a copy: the name changes below
  if (chosen != "Prescott") return;
  const CpuFeatures& cpu = HostCpuFeatures();
  const char* core = SimdLevelSupportedBy(SimdLevel::kAvx512, cpu) ? "SkylakeX"
                     : cpu.avx2 && cpu.fma                         ? "Haswell"
                                                                   : nullptr;
  if (core == nullptr) return;
  // dynamic_init reads the choice from the environment; put it back after.
  setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  ZO_LOG(INFO) << "cpu backend: OpenBLAS does not know this CPU and chose its " << chosen
               << " kernels; switched to " << openblas_get_corename()
               << " (set OPENBLAS_CORETYPE to choose yourself)";
}

}  // namespace

void RoundTo(DType dtype, float* values, int64_t n) {
  if (dtype == DType::kFloat32 || n == 0) return;
  // Round through a small stack buffer so no allocation sits on the op path.
  constexpr int64_t kBlock = 2048;
  uint16_t bits[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const size_t m = static_cast<size_t>(std::min(kBlock, n - i));
    if (dtype == DType::kFloat16) {
      FloatToHalf(values + i, bits, m);
      HalfToFloat(bits, values + i, m);
    } else {
      FloatToBf16(values + i, bits, m);
      Bf16ToFloat(bits, values + i, m);
    }
  }
}

void ShapeError(const char* op, const std::string& what) {
  std::fprintf(stderr, "zo cpu backend: %s: %s\n", op, what.c_str());
  std::abort();
}

CpuBackend::CpuBackend(const CpuBackendOptions& options) {
  static std::once_flag kernels_chosen;
  std::call_once(kernels_chosen, ChooseOpenBlasKernels);
  if (options.blas_threads > 0) openblas_set_num_threads(options.blas_threads);
}

Tensor CpuBackend::Empty(DType dtype, Shape shape) {
  const int64_t n = NumElements(shape);
  // 64-byte aligned so SIMD loops and OpenBLAS see whole cache lines.
  const size_t bytes = static_cast<size_t>((std::max<int64_t>(n, 1) * 4 + 63) / 64 * 64);
  void* data = std::aligned_alloc(64, bytes);
  CheckShape(data != nullptr, "Empty",
             [&] { return absl::StrCat("out of memory allocating ", bytes, " bytes"); });
  // Counted as a device would hold it: n elements of the dtype.
  const int64_t counted = n * static_cast<int64_t>(DTypeSize(dtype));
  counts_->Allocated(counted);
  std::shared_ptr<void> storage(data, [counts = counts_, counted](void* p) {
    counts->Freed(counted);
    std::free(p);
  });
  return Tensor(dtype, std::move(shape), std::move(storage));
}

std::optional<Backend::Allocation> CpuBackend::allocation() const { return counts_->Get(); }

void CpuBackend::ResetPeakAllocation() { counts_->ResetPeak(); }

Tensor CpuBackend::Zeros(DType dtype, Shape shape) {
  Tensor t = Empty(dtype, std::move(shape));
  SetZero(t);
  return t;
}

void CpuBackend::SetZero(Tensor& t) { std::memset(t.storage(), 0, t.numel() * sizeof(float)); }

absl::Status CpuBackend::Upload(absl::Span<const std::byte> src, Tensor& dst) {
  const size_t want = static_cast<size_t>(dst.nbytes());
  if (src.size() != want) return SizeMismatch("Upload", dst, src.size(), want);
  const size_t n = static_cast<size_t>(dst.numel());
  // common/convert.h needs no alignment, so the wire bytes convert in place.
  const auto* bits = reinterpret_cast<const uint16_t*>(src.data());
  switch (dst.dtype()) {
    case DType::kFloat32:
      std::memcpy(Data(dst), src.data(), want);
      break;
    case DType::kFloat16:
      HalfToFloat(bits, Data(dst), n);
      break;
    case DType::kBFloat16:
      Bf16ToFloat(bits, Data(dst), n);
      break;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Download(const Tensor& src, absl::Span<std::byte> dst) {
  const size_t want = static_cast<size_t>(src.nbytes());
  if (dst.size() != want) return SizeMismatch("Download", src, dst.size(), want);
  const size_t n = static_cast<size_t>(src.numel());
  auto* bits = reinterpret_cast<uint16_t*>(dst.data());
  switch (src.dtype()) {
    case DType::kFloat32:
      std::memcpy(dst.data(), Data(src), want);
      break;
    case DType::kFloat16:
      FloatToHalf(Data(src), bits, n);
      break;
    case DType::kBFloat16:
      FloatToBf16(Data(src), bits, n);
      break;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::UploadFloat(absl::Span<const float> src, Tensor& dst) {
  if (static_cast<int64_t>(src.size()) != dst.numel()) {
    return SizeMismatch("UploadFloat", dst, src.size(), static_cast<size_t>(dst.numel()));
  }
  std::memcpy(Data(dst), src.data(), src.size() * sizeof(float));
  RoundTo(dst.dtype(), Data(dst), dst.numel());
  return absl::OkStatus();
}

absl::Status CpuBackend::DownloadFloat(const Tensor& src, absl::Span<float> dst) {
  if (static_cast<int64_t>(dst.size()) != src.numel()) {
    return SizeMismatch("DownloadFloat", src, dst.size(), static_cast<size_t>(src.numel()));
  }
  std::memcpy(dst.data(), Data(src), dst.size() * sizeof(float));
  return absl::OkStatus();
}

Tensor CpuBackend::Cast(const Tensor& src, DType dtype) {
  Tensor dst = Empty(dtype, src.shape());
  std::memcpy(Data(dst), Data(src), src.numel() * sizeof(float));
  RoundTo(dtype, Data(dst), dst.numel());
  return dst;
}

}  // namespace cpu

std::unique_ptr<Backend> MakeCpuBackend(const CpuBackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace zo::backend
