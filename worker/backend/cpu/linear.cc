// Linear and its backward: every product through OpenBLAS sgemm.
#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "worker/backend/cpu/internal/cpu_backend_impl.h"

namespace zo::backend::cpu {
namespace {

// A leading dimension OpenBLAS accepts even for an empty matrix.
int Ld(int64_t n) { return static_cast<int>(std::max<int64_t>(n, 1)); }

}  // namespace

Tensor CpuBackend::Linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  CheckShape(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(1) &&
                 (!b.defined() || (b.rank() == 1 && b.dim(0) == w.dim(0))),
             "Linear", [&] {
               return absl::StrCat("x ", ShapeString(x.shape()), ", w ", ShapeString(w.shape()),
                                   ", b ", b.defined() ? ShapeString(b.shape()) : "undefined");
             });
  const int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor y = Empty(x.dtype(), {rows, out});
  float* py = Data(y);
  if (rows == 0 || out == 0) return y;
  if (in == 0) {
    std::fill(py, py + rows * out, 0.0f);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(out), static_cast<int>(in), 1.0f, Data(x), Ld(in), Data(w), Ld(in),
                0.0f, py, Ld(out));
  }
  if (b.defined()) {
    const float* pb = Data(b);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = py + r * out;
      for (int64_t o = 0; o < out; ++o) row[o] += pb[o];
    }
  }
  RoundTo(y.dtype(), py, y.numel());
  return y;
}

Tensor CpuBackend::LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, bool want_dx,
                                  Tensor& dw, Tensor* db) {
  CheckShape(x.rank() == 2 && w.rank() == 2 && dy.rank() == 2 && x.dim(1) == w.dim(1) &&
                 dy.dim(0) == x.dim(0) && dy.dim(1) == w.dim(0) && dw.shape() == w.shape() &&
                 (db == nullptr || (db->rank() == 1 && db->dim(0) == w.dim(0))),
             "LinearBackward", [&] {
               return absl::StrCat("x ", ShapeString(x.shape()), ", w ", ShapeString(w.shape()),
                                   ", dy ", ShapeString(dy.shape()), ", dw ",
                                   ShapeString(dw.shape()), ", db ",
                                   db != nullptr ? ShapeString(db->shape()) : "null");
             });
  const int64_t rows = x.dim(0), in = x.dim(1), out = w.dim(0);
  const float* pdy = Data(dy);
  Tensor dx;
  if (want_dx) {
    dx = Empty(x.dtype(), {rows, in});
    if (out == 0) {
      std::fill(Data(dx), Data(dx) + dx.numel(), 0.0f);
    } else if (rows > 0 && in > 0) {
      // dx[rows, in] = dy[rows, out] · w[out, in]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(in), static_cast<int>(out), 1.0f, pdy, Ld(out), Data(w), Ld(in),
                  0.0f, Data(dx), Ld(in));
      RoundTo(dx.dtype(), Data(dx), dx.numel());
    }
  }
  if (rows > 0 && in > 0 && out > 0) {
    // dw[out, in] += dy^T[out, rows] · x[rows, in]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(out),
                static_cast<int>(in), static_cast<int>(rows), 1.0f, pdy, Ld(out), Data(x), Ld(in),
                1.0f, Data(dw), Ld(in));
    RoundTo(dw.dtype(), Data(dw), dw.numel());
  }
  if (db != nullptr) {
    float* pdb = Data(*db);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = pdy + r * out;
      for (int64_t o = 0; o < out; ++o) pdb[o] += row[o];
    }
    RoundTo(db->dtype(), pdb, db->numel());
  }
  return dx;
}

}  // namespace zo::backend::cpu
