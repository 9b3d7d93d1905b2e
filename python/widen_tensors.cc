#include "python/widen_tensors.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/convert.h"
#include "common/cpu_features.h"

namespace py = pybind11;

namespace zo::python {
namespace {

struct Pair {
  const uint16_t* src;
  float* dst;
  int64_t elems;
  bool bf16;
};

// What torch calls the tensor's dtype ("torch.bfloat16").
std::string DTypeOf(const py::handle& t) { return py::str(t.attr("dtype")).cast<std::string>(); }

void CheckTensor(const py::handle& t, const std::string& what) {
  if (!py::hasattr(t, "data_ptr")) throw py::type_error(what + " is not a torch tensor");
  if (!t.attr("is_cpu").cast<bool>() || !t.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error(what + " is not a contiguous CPU tensor");
  }
}

// Elements per piece a thread widens at a time: the work is shared in these.
constexpr int64_t kPieceElems = int64_t{1} << 16;

}  // namespace

void Widen(const py::list& sources, const py::list& destinations) {
  if (sources.size() != destinations.size()) {
    throw py::value_error(absl::StrCat("widen: ", sources.size(), " sources for ",
                                       destinations.size(), " destinations"));
  }
  std::vector<Pair> pairs;
  pairs.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const py::handle s = sources[i];
    const py::handle d = destinations[i];
    const std::string what = absl::StrCat("widen: pair ", i, ": ");
    CheckTensor(s, what + "the source");
    CheckTensor(d, what + "the destination");
    const std::string sd = DTypeOf(s);
    if (sd != "torch.bfloat16" && sd != "torch.float16") {
      throw py::value_error(what + "the source is " + sd + ", not torch.bfloat16 or torch.float16");
    }
    if (DTypeOf(d) != "torch.float32") {
      throw py::value_error(what + "the destination is " + DTypeOf(d) + ", not torch.float32");
    }
    const auto n = s.attr("numel")().cast<int64_t>();
    if (d.attr("numel")().cast<int64_t>() != n) {
      throw py::value_error(absl::StrCat(what, "the source has ", n, " elements, the destination ",
                                         d.attr("numel")().cast<int64_t>()));
    }
    pairs.push_back({reinterpret_cast<const uint16_t*>(s.attr("data_ptr")().cast<uintptr_t>()),
                     reinterpret_cast<float*>(d.attr("data_ptr")().cast<uintptr_t>()), n,
                     sd == "torch.bfloat16"});
  }
  // The pieces of every pair, shared out in turn.
  struct Piece {
    size_t pair;
    int64_t begin;
    int64_t end;
  };
  std::vector<Piece> pieces;
  for (size_t p = 0; p < pairs.size(); ++p) {
    for (int64_t b = 0; b < pairs[p].elems; b += kPieceElems) {
      pieces.push_back({p, b, std::min(pairs[p].elems, b + kPieceElems)});
    }
  }
  py::gil_scoped_release release;
  const int threads = static_cast<int>(std::min<size_t>(pieces.size(), HostThreads()));
  auto widen_every = [&](int first) {
    for (size_t i = static_cast<size_t>(first); i < pieces.size();
         i += static_cast<size_t>(threads)) {
      const Piece& piece = pieces[i];
      const Pair& p = pairs[piece.pair];
      const auto n = static_cast<size_t>(piece.end - piece.begin);
      if (p.bf16) {
        Bf16ToFloat(p.src + piece.begin, p.dst + piece.begin, n);
      } else {
        HalfToFloat(p.src + piece.begin, p.dst + piece.begin, n);
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(widen_every, t);
  if (threads > 0) widen_every(0);
  for (std::thread& t : helpers) t.join();
}

}  // namespace zo::python
