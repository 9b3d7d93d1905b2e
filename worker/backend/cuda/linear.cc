// Linear and its backward as cuBLASLt GEMMs: fp16/bf16 operands on tensor
// cores with fp32 accumulation (fp32 operands: plain fp32, no TF32, so the
// fp32 path is a reference). The bias add is the GEMM's epilogue; weight
// gradients accumulate in the GEMM (beta = 1) into fp32 tensors.
//
// Row-major [r, c] is column-major [c, r]: every product below is written
// for cuBLAS's column-major view of the row-major tensors.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/backend/cuda/internal/cuda_backend_impl.h"

namespace zo::backend::cuda {
namespace {

cudaDataType CudaType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// Owns the cuBLASLt descriptors of one call.
struct GemmDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~GemmDescriptors() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

void CudaBackend::Gemm(const char* op, cudaDataType a_type, const void* a, bool trans_a,
                       cudaDataType b_type, const void* b, bool trans_b, cudaDataType d_type,
                       void* d, int64_t m, int64_t n, int64_t k, const void* bias,
                       bool accumulate) {
  if (m == 0 || n == 0 || failed()) return;
  if (k == 0) {  // an empty sum: cuBLASLt wants k > 0
    if (!accumulate) {
      ZO_CUDA_OP(cudaMemsetAsync(d, 0, static_cast<size_t>(m * n) * (d_type == CUDA_R_32F ? 4 : 2),
                                 context_->stream),
                 "cudaMemsetAsync", op, [] { return std::string("k = 0"); });
    }
    return;
  }
  const auto what = [&] {
    return absl::StrCat("m ", m, ", n ", n, ", k ", k, trans_a ? ", A^T" : "",
                        trans_b ? ", B^T" : "");
  };
  // A failed cuBLASLt call is recorded and ends the GEMM.
  const auto lt_failed = [&](cublasStatus_t status, const char* call) {
    if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
      return false;
    Fail(CudaCallError(call, op, what(), cublasLtGetStatusString(status)));
    return true;
  };
  GemmDescriptors desc;
  if (lt_failed(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                "cublasLtMatmulDescCreate"))
    return;
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                   sizeof(epilogue));
    cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    const cudaDataType bias_type = d_type;
    cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                   sizeof(bias_type));
  }
  // Stored (pre-op) shapes, column-major.
  if (lt_failed(cublasLtMatrixLayoutCreate(&desc.a, a_type, trans_a ? k : m, trans_a ? m : k,
                                           trans_a ? k : m),
                "cublasLtMatrixLayoutCreate"))
    return;
  if (lt_failed(cublasLtMatrixLayoutCreate(&desc.b, b_type, trans_b ? n : k, trans_b ? k : n,
                                           trans_b ? n : k),
                "cublasLtMatrixLayoutCreate"))
    return;
  if (lt_failed(cublasLtMatrixLayoutCreate(&desc.d, d_type, m, n, m), "cublasLtMatrixLayoutCreate"))
    return;

  const GemmKey key{static_cast<int>(a_type),
                    static_cast<int>(b_type),
                    static_cast<int>(d_type),
                    trans_a,
                    trans_b,
                    m,
                    n,
                    k,
                    bias != nullptr,
                    accumulate};
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(plans_mu_);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      cublasLtMatmulPreference_t pref;
      if (lt_failed(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"))
        return;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes_, sizeof(workspace_bytes_));
      if (options_.deterministic) {
        // No split-K: each output is one reduction in a fixed order.
        const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                             &schemes, sizeof(schemes));
      }
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
          lt_, desc.op, desc.a, desc.b, desc.d, desc.d, pref, 1, &result, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      if (lt_failed(status, "cublasLtMatmulAlgoGetHeuristic")) return;
      if (found == 0) {
        Fail(CudaCallError("cublasLtMatmulAlgoGetHeuristic", op, what(),
                           "no algorithm for this GEMM"));
        return;
      }
      it = plans_.emplace(key, result.algo).first;
    }
    algo = it->second;
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (lt_failed(cublasLtMatmul(lt_, desc.op, &alpha, a, desc.a, b, desc.b, &beta, d, desc.d, d,
                               desc.d, &algo, workspace_, workspace_bytes_, context_->stream),
                "cublasLtMatmul"))
    return;
}

Tensor CudaBackend::Ones(DType dtype, int64_t n) {
  std::lock_guard<std::mutex> lock(ones_mu_);
  Tensor& ones = ones_[static_cast<int>(dtype)];
  if (!ones.defined() || ones.numel() < n) {
    ones = Empty(dtype, {n});
    const std::vector<float> host(static_cast<size_t>(n), 1.0f);
    if (absl::Status s = UploadFloat(host, ones); !s.ok()) [[unlikely]]
      Fail(s);
  }
  return ones;
}

Tensor CudaBackend::Linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const auto describe = [&] {
    return absl::StrCat(Describe("x", x), ", ", Describe("w", w),
                        b.defined() ? ", " + Describe("b", b) : std::string());
  };
  CheckShape(x.rank() == 2 && w.rank() == 2 && w.dim(1) == x.dim(1) &&
                 (!b.defined() || b.shape() == Shape{w.dim(0)}),
             "Linear", describe);
  const int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor y = Empty(x.dtype(), {rows, out});
  // cuBLASLt wants A and B of one type and the bias in the output's: cast
  // the (rare) odd one out.
  const Tensor wx = w.dtype() == x.dtype() ? w : Cast(w, x.dtype());
  const Tensor bx = !b.defined() || b.dtype() == x.dtype() ? b : Cast(b, x.dtype());
  // y^T[out, rows] = w[out, in] · x^T[in, rows]: A is w's storage [in, out]
  // transposed, B is x's storage [in, rows].
  Gemm("Linear", CudaType(wx.dtype()), wx.storage(), /*trans_a=*/true, CudaType(x.dtype()),
       x.storage(), /*trans_b=*/false, CudaType(y.dtype()), y.storage(), out, rows, in,
       bx.defined() ? bx.storage() : nullptr, /*accumulate=*/false);
  return y;
}

Tensor CudaBackend::LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, bool want_dx,
                                   Tensor& dw, Tensor* db) {
  const auto describe = [&] {
    return absl::StrCat(Describe("x", x), ", ", Describe("w", w), ", ", Describe("dy", dy), ", ",
                        Describe("dw", dw), db != nullptr ? ", " + Describe("db", *db) : "");
  };
  CheckShape(x.rank() == 2 && w.rank() == 2 && dy.rank() == 2 && w.dim(1) == x.dim(1) &&
                 dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0) && dw.shape() == w.shape() &&
                 (db == nullptr || db->shape() == Shape{w.dim(0)}),
             "LinearBackward", describe);
  const int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  const Tensor dyx = dy.dtype() == x.dtype() ? dy : Cast(dy, x.dtype());
  // dw^T[in, out] += x^T[in, rows] · dy[rows, out]: A is x's storage, B is
  // dy's storage [out, rows] transposed.
  Gemm("LinearBackward(dw)", CudaType(x.dtype()), x.storage(), false, CudaType(dyx.dtype()),
       dyx.storage(), true, CudaType(dw.dtype()), dw.storage(), in, out, rows, nullptr,
       /*accumulate=*/true);
  if (db != nullptr) {
    // db[out] += dy^T[out, rows] · 1[rows]: a GEMV on cuBLASLt, which spreads
    // the rows over the whole GPU (a column-per-thread kernel cannot at
    // widths like 768), with the same exact products and fp32 sums.
    const Tensor ones = Ones(dyx.dtype(), rows);
    Gemm("LinearBackward(db)", CudaType(dyx.dtype()), dyx.storage(), false, CudaType(dyx.dtype()),
         ones.storage(), false, CudaType(db->dtype()), db->storage(), out, 1, rows, nullptr,
         /*accumulate=*/true);
  }
  if (!want_dx) return Tensor();
  Tensor dx = Empty(x.dtype(), x.shape());
  const Tensor wx = w.dtype() == x.dtype() ? w : Cast(w, x.dtype());
  // dx^T[in, rows] = w^T[in, out] · dy^T[out, rows]: both as stored.
  Gemm("LinearBackward(dx)", CudaType(wx.dtype()), wx.storage(), false, CudaType(dyx.dtype()),
       dyx.storage(), false, CudaType(dx.dtype()), dx.storage(), in, rows, out, nullptr,
       /*accumulate=*/false);
  return dx;
}

}  // namespace zo::backend::cuda
