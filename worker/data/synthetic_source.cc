#include "worker/data/synthetic_source.h"

#include <array>
#include <cctype>
#include <string_view>

#include "common/counter_rng.h"

namespace zo {
namespace {

constexpr std::array<std::string_view, 5> kDeterminers = {"the", "a", "every", "no", "my"};
constexpr std::array<std::string_view, 8> kAdjectives = {"old",   "quiet", "red",  "small",
                                                         "brave", "green", "dark", "bright"};
constexpr std::array<std::string_view, 10> kNouns = {"king",   "river", "stone", "bird",  "queen",
                                                     "garden", "sword", "ship",  "tower", "wolf"};
constexpr std::array<std::string_view, 8> kVerbs = {"sees",    "finds",  "loves",   "guards",
                                                    "follows", "builds", "carries", "hears"};
constexpr std::array<std::string_view, 4> kPrepositions = {"near", "under", "beyond", "with"};

// Draws from one seeded stream; a counter keeps it a pure function of the
// seed and the draw's index (so a longer text extends a shorter one).
class Draws {
 public:
  explicit Draws(uint64_t seed) : seed_(seed) {}

  // Uniform in [0, n).
  size_t Below(size_t n) { return UniformBelow(CounterRandom(seed_, next_++), n); }
  bool Chance(int percent) { return Below(100) < static_cast<size_t>(percent); }

  // An index in [0, n): with probability `percent` one of the two that `key`
  // prefers, otherwise any. This is the chain's learnable dependence.
  size_t Preferred(size_t n, size_t key, int percent) {
    if (Chance(percent)) return (key * 3 + Below(2)) % n;
    return Below(n);
  }

 private:
  const uint64_t seed_;
  uint64_t next_ = 0;
};

// Appends "det [adj] noun" and returns the noun's index; the noun follows
// `key`'s preference when one is given.
size_t AppendNounPhrase(Draws& draws, std::string& out, int key = -1) {
  out.append(kDeterminers[draws.Below(kDeterminers.size())]);
  out.push_back(' ');
  if (draws.Chance(50)) {
    out.append(kAdjectives[draws.Below(kAdjectives.size())]);
    out.push_back(' ');
  }
  const size_t noun = key < 0 ? draws.Below(kNouns.size())
                              : draws.Preferred(kNouns.size(), static_cast<size_t>(key), 70);
  out.append(kNouns[noun]);
  return noun;
}

void AppendSentence(Draws& draws, std::string& out) {
  const size_t first = out.size();
  const size_t subject = AppendNounPhrase(draws, out);
  out[first] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[first])));
  out.push_back(' ');
  const size_t verb = draws.Preferred(kVerbs.size(), subject, 80);
  out.append(kVerbs[verb]);
  out.push_back(' ');
  AppendNounPhrase(draws, out, static_cast<int>(verb));
  if (draws.Chance(30)) {
    out.push_back(' ');
    out.append(kPrepositions[draws.Below(kPrepositions.size())]);
    out.push_back(' ');
    AppendNounPhrase(draws, out);
  }
  out.push_back('.');
}

}  // namespace

std::string SyntheticText(size_t bytes, uint64_t seed) {
  Draws draws(seed);
  std::string out;
  out.reserve(bytes + 128);
  while (out.size() < bytes) {
    // Paragraphs of 3 to 6 sentences, so that '\n' too is something to predict.
    const size_t sentences = 3 + draws.Below(4);
    for (size_t i = 0; i < sentences; ++i) {
      AppendSentence(draws, out);
      out.push_back(i + 1 == sentences ? '\n' : ' ');
    }
  }
  out.resize(bytes);
  return out;
}

}  // namespace zo
