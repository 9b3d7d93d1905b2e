// The CPU backend's ops against double-precision references
// (internal/reference_ops.h): forwards directly, backwards against central
// finite differences of the reference, and fp16/bf16 storage against fp32.
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "common/fp16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cpu/internal/reference_ops.h"

namespace zo::backend {
namespace {

namespace ref = cpu_internal::reference;
using ref::Vec;

class OpsTest : public ::testing::Test {
 protected:
  std::vector<float> Random(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  Tensor In(const std::vector<float>& values, Shape shape, DType dtype = DType::kFloat32) {
    Tensor t = be_->Empty(dtype, std::move(shape));
    EXPECT_TRUE(be_->UploadFloat(values, t).ok());
    return t;
  }
  std::vector<float> Host(const Tensor& t) {
    std::vector<float> v(t.numel());
    EXPECT_TRUE(be_->DownloadFloat(t, absl::MakeSpan(v)).ok());
    return v;
  }

  std::unique_ptr<Backend> be_ = MakeCpuBackend();
  std::mt19937 rng_{20240611};
};

Vec ToDouble(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

double Dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

Vec Plus(const Vec& a, const Vec& b) {
  Vec y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = a[i] + b[i];
  return y;
}

// Central differences in double of loss() around x.
Vec FiniteDiff(const std::function<double(const Vec&)>& loss, Vec x) {
  constexpr double kH = 1e-6;
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + kH;
    const double up = loss(x);
    x[i] = x0 - kH;
    const double down = loss(x);
    x[i] = x0;
    g[i] = (up - down) / (2 * kH);
  }
  return g;
}

// |actual - expected| <= atol + rtol |expected| for every element.
void ExpectNear(const std::vector<float>& actual, const Vec& expected, double rtol, double atol,
                const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(actual[i] - expected[i]);
    if (!(err <= atol + rtol * std::abs(expected[i])) && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: " << actual[i] << " vs " << expected[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << actual.size() << " elements off";
}

constexpr double kFwdRtol = 1e-5, kFwdAtol = 2e-6;  // fp32 forward vs double
constexpr double kGradTol = 1e-4;                   // backward vs finite differences

void ExpectForward(const std::vector<float>& actual, const Vec& expected, const std::string& what) {
  ExpectNear(actual, expected, kFwdRtol, kFwdAtol, what);
}
void ExpectGrad(const std::vector<float>& actual, const Vec& expected, const std::string& what) {
  ExpectNear(actual, expected, kGradTol, kGradTol, what);
}

// ---------------------------------------------------------------- linear

TEST_F(OpsTest, LinearMatchesReferenceAndFiniteDifferences) {
  constexpr int kRows = 4, kIn = 5, kOut = 3;
  const std::vector<float> x = Random(kRows * kIn), w = Random(kOut * kIn), b = Random(kOut);
  const std::vector<float> r = Random(kRows * kOut), dw0 = Random(kOut * kIn), db0 = Random(kOut);
  const Tensor tx = In(x, {kRows, kIn}), tw = In(w, {kOut, kIn}), tb = In(b, {kOut});
  const Vec xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b), rd = ToDouble(r);

  ExpectForward(Host(be_->Linear(tx, tw, tb)), ref::Linear(xd, wd, &bd, kRows, kIn, kOut), "y");

  Tensor dw = In(dw0, {kOut, kIn}), db = In(db0, {kOut});
  const Tensor dx = be_->LinearBackward(tx, tw, In(r, {kRows, kOut}), true, dw, &db);
  ASSERT_TRUE(dx.defined());
  EXPECT_EQ(dx.shape(), (Shape{kRows, kIn}));
  auto loss = [&](const Vec& xv, const Vec& wv, const Vec& bv) {
    return Dot(rd, ref::Linear(xv, wv, &bv, kRows, kIn, kOut));
  };
  ExpectGrad(Host(dx), FiniteDiff([&](const Vec& v) { return loss(v, wd, bd); }, xd), "dx");
  ExpectGrad(Host(dw),
             Plus(ToDouble(dw0), FiniteDiff([&](const Vec& v) { return loss(xd, v, bd); }, wd)),
             "dw (accumulated)");
  ExpectGrad(Host(db),
             Plus(ToDouble(db0), FiniteDiff([&](const Vec& v) { return loss(xd, wd, v); }, bd)),
             "db (accumulated)");
}

TEST_F(OpsTest, LinearWithoutBiasAndWithoutDx) {
  constexpr int kRows = 3, kIn = 4, kOut = 2;
  const std::vector<float> x = Random(kRows * kIn), w = Random(kOut * kIn);
  const std::vector<float> r = Random(kRows * kOut), dw0 = Random(kOut * kIn);
  const Tensor tx = In(x, {kRows, kIn}), tw = In(w, {kOut, kIn});
  const Vec xd = ToDouble(x), wd = ToDouble(w);
  ExpectForward(Host(be_->Linear(tx, tw, Tensor())), ref::Linear(xd, wd, nullptr, kRows, kIn, kOut),
                "y");
  Tensor dw = In(dw0, {kOut, kIn});
  const Tensor dx = be_->LinearBackward(tx, tw, In(r, {kRows, kOut}), false, dw, nullptr);
  EXPECT_FALSE(dx.defined());
  const Vec gw = FiniteDiff(
      [&](const Vec& v) { return Dot(ToDouble(r), ref::Linear(xd, v, nullptr, kRows, kIn, kOut)); },
      wd);
  ExpectGrad(Host(dw), Plus(ToDouble(dw0), gw), "dw (accumulated)");
}

TEST_F(OpsTest, LinearShapeMismatchAbortsNamingShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS runs threads
  const Tensor x = be_->Zeros(DType::kFloat32, {2, 3}), w = be_->Zeros(DType::kFloat32, {4, 5});
  EXPECT_DEATH(be_->Linear(x, w, Tensor()), "Linear: x \\[2, 3\\], w \\[4, 5\\]");
}

// ---------------------------------------------------------------- embedding

TEST_F(OpsTest, EmbeddingMatchesReferenceAndFiniteDifferences) {
  constexpr int kVocab = 5, kC = 4, kBlock = 3, kPositions = 4;  // wpe may be longer than block
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 3, 4, 1};     // repeats, rows > block
  const int rows = static_cast<int>(tokens.size());
  const std::vector<float> wte = Random(kVocab * kC), wpe = Random(kPositions * kC);
  const std::vector<float> r = Random(rows * kC);
  const std::vector<float> dwte0 = Random(kVocab * kC), dwpe0 = Random(kPositions * kC);
  const Tensor twte = In(wte, {kVocab, kC}), twpe = In(wpe, {kPositions, kC});
  const Vec wted = ToDouble(wte), wped = ToDouble(wpe), rd = ToDouble(r);

  const Tensor y = be_->Embedding(tokens, kBlock, twte, twpe);
  EXPECT_EQ(y.shape(), (Shape{rows, kC}));
  ExpectForward(Host(y), ref::Embedding(tokens, kBlock, wted, wped, kC), "y");

  Tensor dwte = In(dwte0, {kVocab, kC}), dwpe = In(dwpe0, {kPositions, kC});
  be_->EmbeddingBackward(tokens, kBlock, In(r, {rows, kC}), dwte, dwpe);
  const Vec gte = FiniteDiff(
      [&](const Vec& v) { return Dot(rd, ref::Embedding(tokens, kBlock, v, wped, kC)); }, wted);
  const Vec gpe = FiniteDiff(
      [&](const Vec& v) { return Dot(rd, ref::Embedding(tokens, kBlock, wted, v, kC)); }, wped);
  ExpectGrad(Host(dwte), Plus(ToDouble(dwte0), gte), "dwte (accumulated)");
  ExpectGrad(Host(dwpe), Plus(ToDouble(dwpe0), gpe), "dwpe (accumulated)");
}

TEST_F(OpsTest, EmbeddingOutOfRangeTokenAbortsNamingTokenAndRow) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS runs threads
  const Tensor wte = be_->Zeros(DType::kFloat32, {5, 2}), wpe = be_->Zeros(DType::kFloat32, {4, 2});
  const std::vector<int32_t> tokens = {0, 1, 5};
  EXPECT_DEATH(be_->Embedding(tokens, 4, wte, wpe), "token 5 at row 2");
}

// ---------------------------------------------------------------- layer norm

TEST_F(OpsTest, LayerNormMatchesReferenceAndFiniteDifferences) {
  constexpr int kRows = 3, kC = 6;
  constexpr float kEps = 1e-5f;
  const std::vector<float> x = Random(kRows * kC, -1.0f, 2.0f);  // non-zero row means
  const std::vector<float> gamma = Random(kC, 0.5f, 1.5f), beta = Random(kC);
  const std::vector<float> r = Random(kRows * kC), dg0 = Random(kC), db0 = Random(kC);
  const Tensor tx = In(x, {kRows, kC}), tg = In(gamma, {kC}), tb = In(beta, {kC});
  const Vec xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta), rd = ToDouble(r);

  Tensor mean = be_->Empty(DType::kFloat32, {kRows}), rstd = be_->Empty(DType::kFloat32, {kRows});
  const Tensor y = be_->LayerNorm(tx, tg, tb, kEps, mean, rstd);
  const ref::LayerNormResult want = ref::LayerNorm(xd, gd, bd, kEps, kRows, kC);
  ExpectForward(Host(y), want.y, "y");
  ExpectForward(Host(mean), want.mean, "mean");
  ExpectForward(Host(rstd), want.rstd, "rstd");

  Tensor dg = In(dg0, {kC}), db = In(db0, {kC});
  const Tensor dx = be_->LayerNormBackward(tx, tg, mean, rstd, In(r, {kRows, kC}), dg, db);
  auto loss = [&](const Vec& xv, const Vec& gv, const Vec& bv) {
    return Dot(rd, ref::LayerNorm(xv, gv, bv, kEps, kRows, kC).y);
  };
  ExpectGrad(Host(dx), FiniteDiff([&](const Vec& v) { return loss(v, gd, bd); }, xd), "dx");
  ExpectGrad(Host(dg),
             Plus(ToDouble(dg0), FiniteDiff([&](const Vec& v) { return loss(xd, v, bd); }, gd)),
             "dgamma (accumulated)");
  ExpectGrad(Host(db),
             Plus(ToDouble(db0), FiniteDiff([&](const Vec& v) { return loss(xd, gd, v); }, bd)),
             "dbeta (accumulated)");
}

TEST_F(OpsTest, LayerNormWantsFp32MeanAndRstd) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS runs threads
  const Tensor x = be_->Zeros(DType::kFloat16, {2, 3}), g = be_->Zeros(DType::kFloat16, {3});
  Tensor mean = be_->Empty(DType::kFloat16, {2}), rstd = be_->Empty(DType::kFloat32, {2});
  EXPECT_DEATH(be_->LayerNorm(x, g, g, 1e-5f, mean, rstd), "LayerNorm: .*mean \\[2\\] fp16");
}

// ---------------------------------------------------------------- pointwise

TEST_F(OpsTest, GeluMatchesReferenceAndFiniteDifferences) {
  constexpr int kN = 24;
  const std::vector<float> x = Random(kN, -4.0f, 4.0f), r = Random(kN);
  const Tensor tx = In(x, {4, 6});
  const Vec xd = ToDouble(x), rd = ToDouble(r);
  ExpectForward(Host(be_->Gelu(tx)), ref::Gelu(xd), "y");
  ExpectGrad(Host(be_->GeluBackward(tx, In(r, {4, 6}))),
             FiniteDiff([&](const Vec& v) { return Dot(rd, ref::Gelu(v)); }, xd), "dx");
}

TEST_F(OpsTest, ReluMatchesReferenceAndFiniteDifferences) {
  constexpr int kN = 24;
  std::vector<float> x = Random(kN);
  for (float& v : x) v += v >= 0 ? 0.05f : -0.05f;  // away from the kink
  const std::vector<float> r = Random(kN);
  const Tensor tx = In(x, {4, 6});
  const Vec xd = ToDouble(x), rd = ToDouble(r);
  ExpectForward(Host(be_->Relu(tx)), ref::Relu(xd), "y");
  ExpectGrad(Host(be_->ReluBackward(tx, In(r, {4, 6}))),
             FiniteDiff([&](const Vec& v) { return Dot(rd, ref::Relu(v)); }, xd), "dx");
  // Zero is not > 0: no gradient flows there.
  EXPECT_EQ(Host(be_->ReluBackward(In({0.0f}, {1, 1}), In({1.0f}, {1, 1})))[0], 0.0f);
}

TEST_F(OpsTest, AddAndAddInto) {
  const std::vector<float> a = Random(12), b = Random(12), y0 = Random(12);
  const Tensor ta = In(a, {3, 4}), tb = In(b, {3, 4});
  ExpectForward(Host(be_->Add(ta, tb)), ref::Add(ToDouble(a), ToDouble(b)), "a + b");
  Tensor y = In(y0, {3, 4});
  be_->AddInto(ta, y);
  be_->AddInto(tb, y);
  ExpectForward(Host(y), ref::Add(ref::Add(ToDouble(y0), ToDouble(a)), ToDouble(b)), "y += a + b");
}

TEST_F(OpsTest, CombineWeightsIsTheFormulaRoundedOnce) {
  const std::vector<float> last = Random(12), before = Random(12), grad = Random(12);
  Tensor out = be_->Empty(DType::kFloat32, {3, 4});
  be_->CombineWeights(In(last, {3, 4}), In(before, {3, 4}), In(grad, {3, 4}), 1.5f, -0.5f, 0.25f,
                      out);
  Vec want(12);
  for (size_t i = 0; i < want.size(); ++i) {
    want[i] = 1.5 * last[i] - 0.5 * before[i] - 0.25 * grad[i];
  }
  ExpectForward(Host(out), want, "a last + b before - c grad");
  // Undefined terms are left out.
  be_->CombineWeights(In(last, {3, 4}), Tensor(), Tensor(), 1, 0, 0, out);
  EXPECT_EQ(Host(out), last);
}

TEST_F(OpsTest, AddShapeMismatchAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS runs threads
  const Tensor a = be_->Zeros(DType::kFloat32, {3, 4}), b = be_->Zeros(DType::kFloat32, {4, 3});
  EXPECT_DEATH(be_->Add(a, b), "Add: a \\[3, 4\\], b \\[4, 3\\]");
}

// ---------------------------------------------------------------- attention

constexpr int kBatch = 2, kT = 5, kC = 8, kHeads = 2;

TEST_F(OpsTest, AttentionMatchesReferenceAndFiniteDifferences) {
  const std::vector<float> qkv = Random(kBatch * kT * 3 * kC, -1.5f, 1.5f);
  const std::vector<float> r = Random(kBatch * kT * kC);
  const Tensor tqkv = In(qkv, {kBatch * kT, 3 * kC});
  const Vec qd = ToDouble(qkv), rd = ToDouble(r);

  Tensor lse = be_->Empty(DType::kFloat32, {kBatch, kHeads, kT});
  const Tensor y = be_->Attention(tqkv, kBatch, kHeads, lse);
  const ref::AttentionResult want = ref::Attention(qd, kBatch, kT, kC, kHeads);
  EXPECT_EQ(y.shape(), (Shape{kBatch * kT, kC}));
  ExpectForward(Host(y), want.y, "y");
  ExpectForward(Host(lse), want.lse, "lse");

  const Tensor dqkv =
      be_->AttentionBackward(tqkv, y, lse, In(r, {kBatch * kT, kC}), kBatch, kHeads);
  EXPECT_EQ(dqkv.shape(), tqkv.shape());
  ExpectGrad(
      Host(dqkv),
      FiniteDiff([&](const Vec& v) { return Dot(rd, ref::Attention(v, kBatch, kT, kC, kHeads).y); },
                 qd),
      "dqkv");
}

TEST_F(OpsTest, AttentionIsCausal) {
  std::vector<float> qkv = Random(kBatch * kT * 3 * kC);
  Tensor lse = be_->Empty(DType::kFloat32, {kBatch, kHeads, kT});
  const std::vector<float> before =
      Host(be_->Attention(In(qkv, {kBatch * kT, 3 * kC}), kBatch, kHeads, lse));
  // Change the key and value at position 3 of sequence 1 (both heads).
  constexpr int kSeq = 1, kPos = 3;
  for (int col = kC; col < 3 * kC; ++col) qkv[(kSeq * kT + kPos) * 3 * kC + col] += 5.0f;
  const std::vector<float> after =
      Host(be_->Attention(In(qkv, {kBatch * kT, 3 * kC}), kBatch, kHeads, lse));
  for (int row = 0; row < kBatch * kT; ++row) {
    const bool may_change = row >= kSeq * kT + kPos && row < (kSeq + 1) * kT;
    bool same = true;
    for (int col = 0; col < kC; ++col)
      same = same && before[row * kC + col] == after[row * kC + col];
    EXPECT_EQ(same, !may_change) << "row " << row;
  }
}

// ---------------------------------------------------------------- cross-entropy

TEST_F(OpsTest, CrossEntropyMatchesReferenceAndFiniteDifferences) {
  constexpr int kRows = 4, kVocab = 7;
  constexpr float kScale = 3.5f;
  const std::vector<int32_t> targets = {2, 0, 6, 2};
  const std::vector<float> logits = Random(kRows * kVocab, -3.0f, 3.0f);
  const Tensor tl = In(logits, {kRows, kVocab});
  const Vec ld = ToDouble(logits);

  const Tensor loss = be_->CrossEntropy(tl, targets);
  EXPECT_EQ(loss.shape(), Shape{1});
  EXPECT_EQ(loss.dtype(), DType::kFloat32);
  ExpectForward(Host(loss), {ref::CrossEntropy(ld, targets, kVocab)}, "loss");

  ExpectGrad(
      Host(be_->CrossEntropyBackward(tl, targets, kScale)),
      FiniteDiff([&](const Vec& v) { return kScale * ref::CrossEntropy(v, targets, kVocab); }, ld),
      "dlogits");
}

TEST_F(OpsTest, CrossEntropyIsStableForLargeLogits) {
  const std::vector<int32_t> targets = {1};
  const Tensor tl = In({1000.0f, 1001.0f, 999.0f}, {1, 3});
  const Vec ld = {1000.0, 1001.0, 999.0};
  ExpectForward(Host(be_->CrossEntropy(tl, targets)), {ref::CrossEntropy(ld, targets, 3)}, "loss");
  ExpectGrad(Host(be_->CrossEntropyBackward(tl, targets, 1.0f)),
             FiniteDiff([&](const Vec& v) { return ref::CrossEntropy(v, targets, 3); }, ld),
             "dlogits");
}

// ---------------------------------------------------------------- fp16 / bf16 storage

struct Output {
  std::string name;
  DType dtype;       // what the op returned
  DType want_dtype;  // what backend.h promises
  std::vector<float> values;
};

// Runs one op family on inputs whose values are representable in `round`,
// stored as `storage`, and returns every output.
using OpRun = std::function<std::vector<Output>(Backend&, DType round, DType storage)>;

class Inputs {
 public:
  Inputs(Backend& be, DType round, DType storage) : be_(be), round_(round), storage_(storage) {}
  // Fresh, fixed random values for each call sequence.
  Tensor Random(Shape shape, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(NumElements(shape));
    for (float& x : v) x = dist(rng_);
    Tensor rounded = be_.Empty(round_, shape);
    EXPECT_TRUE(be_.UploadFloat(v, rounded).ok());
    return be_.Cast(rounded, storage_);
  }
  Tensor Accumulator(Shape shape) { return be_.Zeros(DType::kFloat32, std::move(shape)); }
  // An activation or its gradient: in the storage dtype.
  Output Out(std::string name, const Tensor& t) { return Get(std::move(name), t, storage_); }
  // A parameter gradient, statistic or loss: fp32.
  Output Fp32(std::string name, const Tensor& t) {
    return Get(std::move(name), t, DType::kFloat32);
  }

 private:
  Output Get(std::string name, const Tensor& t, DType want) {
    std::vector<float> v(t.numel());
    EXPECT_TRUE(be_.DownloadFloat(t, absl::MakeSpan(v)).ok());
    return Output{std::move(name), t.dtype(), want, std::move(v)};
  }

  Backend& be_;
  const DType round_, storage_;
  std::mt19937 rng_{7};
};

bool Representable(DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfBitsToFloat(FloatToHalfBits(v)) == v;
    case DType::kBFloat16:
      return Bf16BitsToFloat(FloatToBf16Bits(v)) == v;
    case DType::kFloat32:
      return true;
  }
  return false;
}

std::vector<std::pair<std::string, OpRun>> AllOps() {
  return {
      {"Linear",
       [](Backend& be, DType round, DType storage) {
         Inputs in(be, round, storage);
         const Tensor x = in.Random({6, 16}), w = in.Random({5, 16}), b = in.Random({5});
         const Tensor dy = in.Random({6, 5});
         Tensor dw = in.Accumulator({5, 16}), db = in.Accumulator({5});
         const Tensor dx = be.LinearBackward(x, w, dy, true, dw, &db);
         return std::vector<Output>{in.Out("y", be.Linear(x, w, b)), in.Out("dx", dx),
                                    in.Fp32("dw", dw), in.Fp32("db", db)};
       }},
      {"Embedding",
       [](Backend& be, DType round, DType storage) {
         Inputs in(be, round, storage);
         const std::vector<int32_t> tokens = {3, 1, 3, 0, 2, 2};
         const Tensor wte = in.Random({4, 8}), wpe = in.Random({4, 8}), dy = in.Random({6, 8});
         Tensor dwte = in.Accumulator({4, 8}), dwpe = in.Accumulator({4, 8});
         be.EmbeddingBackward(tokens, 4, dy, dwte, dwpe);
         return std::vector<Output>{in.Out("y", be.Embedding(tokens, 4, wte, wpe)),
                                    in.Fp32("dwte", dwte), in.Fp32("dwpe", dwpe)};
       }},
      {"LayerNorm",
       [](Backend& be, DType round, DType storage) {
         Inputs in(be, round, storage);
         const Tensor x = in.Random({4, 16}, -1.0f, 3.0f), g = in.Random({16}, 0.5f, 1.5f);
         const Tensor b = in.Random({16}), dy = in.Random({4, 16});
         Tensor mean = be.Empty(DType::kFloat32, {4}), rstd = be.Empty(DType::kFloat32, {4});
         Tensor dg = in.Accumulator({16}), db = in.Accumulator({16});
         const Tensor y = be.LayerNorm(x, g, b, 1e-5f, mean, rstd);
         const Tensor dx = be.LayerNormBackward(x, g, mean, rstd, dy, dg, db);
         return std::vector<Output>{in.Out("y", y),   in.Fp32("mean", mean), in.Fp32("rstd", rstd),
                                    in.Out("dx", dx), in.Fp32("dgamma", dg), in.Fp32("dbeta", db)};
       }},
      {"Pointwise",
       [](Backend& be, DType round, DType storage) {
         Inputs in(be, round, storage);
         const Tensor x = in.Random({4, 16}, -4.0f, 4.0f), dy = in.Random({4, 16});
         const Tensor b = in.Random({4, 16});
         Tensor acc = in.Random({4, 16});
         be.AddInto(x, acc);
         return std::vector<Output>{
             in.Out("gelu", be.Gelu(x)),  in.Out("dgelu", be.GeluBackward(x, dy)),
             in.Out("relu", be.Relu(x)),  in.Out("drelu", be.ReluBackward(x, dy)),
             in.Out("add", be.Add(x, b)), in.Out("add_into", acc)};
       }},
      {"Attention",
       [](Backend& be, DType round, DType storage) {
         Inputs in(be, round, storage);
         const Tensor qkv = in.Random({kBatch * kT, 3 * kC}, -2.0f, 2.0f);
         const Tensor dy = in.Random({kBatch * kT, kC});
         Tensor lse = be.Empty(DType::kFloat32, {kBatch, kHeads, kT});
         const Tensor y = be.Attention(qkv, kBatch, kHeads, lse);
         const Tensor dqkv = be.AttentionBackward(qkv, y, lse, dy, kBatch, kHeads);
         return std::vector<Output>{in.Out("y", y), in.Fp32("lse", lse), in.Out("dqkv", dqkv)};
       }},
      {"CrossEntropy",
       [](Backend& be, DType round, DType storage) {
         Inputs in(be, round, storage);
         const std::vector<int32_t> targets = {0, 5, 9, 3};
         const Tensor logits = in.Random({4, 10}, -4.0f, 4.0f);
         return std::vector<Output>{
             in.Fp32("loss", be.CrossEntropy(logits, targets)),
             in.Out("dlogits", be.CrossEntropyBackward(logits, targets, 512.0f))};
       }},
  };
}

class LowPrecisionTest : public ::testing::TestWithParam<DType> {};

TEST_P(LowPrecisionTest, OutputsRepresentableAndCloseToFp32) {
  const DType dtype = GetParam();
  // Half an ulp of the storage format is 2^-11 (fp16) or 2^-8 (bf16); allow
  // a few for intermediates stored at that precision (attention's y, which
  // its backward reads).
  const double tol = dtype == DType::kFloat16 ? 4e-3 : 3e-2;
  std::unique_ptr<Backend> be = MakeCpuBackend();
  for (const auto& [op, run] : AllOps()) {
    const std::vector<Output> low = run(*be, dtype, dtype);
    const std::vector<Output> high = run(*be, dtype, DType::kFloat32);
    ASSERT_EQ(low.size(), high.size());
    for (size_t k = 0; k < low.size(); ++k) {
      const std::string what = op + " " + low[k].name;
      EXPECT_EQ(low[k].dtype, low[k].want_dtype) << what;
      int unrepresentable = 0;
      for (float v : low[k].values) unrepresentable += Representable(low[k].dtype, v) ? 0 : 1;
      EXPECT_EQ(unrepresentable, 0) << what;
      double max_abs = 0.0;
      for (float v : high[k].values) max_abs = std::max(max_abs, std::abs(static_cast<double>(v)));
      ExpectNear(low[k].values, ToDouble(high[k].values), tol, tol * max_abs, what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, LowPrecisionTest,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// ---------------------------------------------------------------- threads

TEST(OpsThreadTest, ConcurrentCallsGiveTheSequentialResults) {
  std::unique_ptr<Backend> be = MakeCpuBackend();
  const std::vector<std::pair<std::string, OpRun>> ops = AllOps();
  std::vector<std::vector<Output>> sequential;
  for (const auto& [op, run] : ops)
    sequential.push_back(run(*be, DType::kFloat32, DType::kFloat32));
  constexpr int kThreads = 4;
  std::vector<std::vector<std::vector<Output>>> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int rep = 0; rep < 5; ++rep) {
        results[i].clear();
        for (const auto& [op, run] : ops)
          results[i].push_back(run(*be, DType::kFloat32, DType::kFloat32));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    for (size_t k = 0; k < ops.size(); ++k) {
      for (size_t o = 0; o < sequential[k].size(); ++o) {
        EXPECT_EQ(results[i][k][o].values, sequential[k][o].values)
            << ops[k].first << " " << sequential[k][o].name << " on thread " << i;
      }
    }
  }
}

}  // namespace
}  // namespace zo::backend
