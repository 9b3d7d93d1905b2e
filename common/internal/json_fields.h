// Typed, checked access to the fields of JSON objects, for common/config.cc.
// One schema function per config struct drives both directions:
//
//   template <typename V>
//   void VisitAio(V& v, AioConfig& aio) {
//     v.Field("queue_depth", aio.queue_depth, AtLeast(1));
//   }
//
// With a JsonReader it fills the struct, checks each value and names the full
// key path in errors ("aio.queue_depth = 0: must be >= 1"); keys it never
// asked for are reported as unknown. With a JsonWriter it turns the struct
// back into JSON, so parsing and serialising cannot drift apart.
#ifndef ZO_COMMON_INTERNAL_JSON_FIELDS_H_
#define ZO_COMMON_INTERNAL_JSON_FIELDS_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace zo::config_internal {

using Json = nlohmann::json;
// The writer keeps keys in schema order, which reads better than sorted.
using OrderedJson = nlohmann::ordered_json;

// What reading one document produced besides the values.
struct Diagnostics {
  absl::Status status;  // the first error; reads after it do nothing
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
};

// "path = value: reason", the value as JSON, shortened when long.
absl::Status ValueError(const std::string& path, const Json& value, std::string_view reason);

// Checks return "" for a good value, otherwise why not ("must be > 0").
struct NoCheck {
  template <typename T>
  std::string operator()(const T&) const {
    return {};
  }
};

// A numeric interval; an infinite end is unbounded, an open end exclusive.
struct Bounds {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
  std::string operator()(double value) const;
};
inline Bounds AtLeast(double lo) { return {.lo = lo}; }
inline Bounds Above(double lo) { return {.lo = lo, .lo_open = true}; }
inline Bounds InRange(double lo, double hi) { return {.lo = lo, .hi = hi}; }
inline Bounds InHalfOpenRange(double lo, double hi) {
  return {.lo = lo, .hi = hi, .hi_open = true};
}

// One spelling of an enum value; matched case-insensitively when read.
template <typename E>
struct EnumEntry {
  E value;
  const char* name;
};

template <typename E, size_t N>
const char* NameOf(const std::array<EnumEntry<E>, N>& names, E value) {
  for (const EnumEntry<E>& entry : names) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

template <typename E, size_t N>
std::vector<const char*> NamesOf(const std::array<EnumEntry<E>, N>& names) {
  std::vector<const char*> spellings;
  for (const EnumEntry<E>& entry : names) spellings.push_back(entry.name);
  return spellings;
}

// Each converts `json` into `out`, or returns why it cannot ("expected a bool").
std::string ReadScalar(const Json& json, bool& out);
std::string ReadScalar(const Json& json, double& out);
std::string ReadScalar(const Json& json, std::string& out);
// Integers may be written as integral floats (1e9), as DeepSpeed users do.
std::string ReadInteger(const Json& json, int64_t min, int64_t max, int64_t& out);
template <typename T>
requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) std::string
    ReadScalar(const Json& json, T& out) {
  int64_t value = 0;
  std::string why =
      ReadInteger(json, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), value);
  if (why.empty()) out = static_cast<T>(value);
  return why;
}

// "must be one of A, B, C".
std::string OneOf(const std::vector<const char*>& names);

// What Object() does when its key is absent: visit an empty object (so that
// required keys inside are reported) or leave the defaults alone.
enum class IfAbsent { kVisitEmpty, kSkip };

// Reads one JSON object. Not thread-safe; lives for one parse.
class JsonReader {
 public:
  // `object` (a JSON object) sits at `path` ("" for the root). `object` and `diag` must outlive the
  // reader.
  JsonReader(const Json& object, std::string path, Diagnostics* diag);

  bool ok() const { return diag_->status.ok(); }
  std::string PathOf(std::string_view key) const;

  // True when `key` is present and not null: null counts as absent, as a
  // Python None does in DeepSpeed.
  bool Given(std::string_view key) const;

  template <typename T, typename C = NoCheck>
  void Field(std::string_view key, T& value, C check = {}) {
    const auto [json, path] = Take(key);
    if (json != nullptr) ReadValue(*json, path, value, check);
  }

  // As Field, but the string "auto" (as Hugging Face writes) counts as absent.
  template <typename T, typename C = NoCheck>
  void AutoField(std::string_view key, T& value, C check = {}) {
    if (IsAuto(key)) {
      Take(key);
      return;
    }
    Field(key, value, check);
  }

  template <typename E, size_t N>
  void Enum(std::string_view key, E& value, const std::array<EnumEntry<E>, N>& names) {
    const auto [json, path] = Take(key);
    if (json == nullptr || !ok()) return;
    std::string text;
    std::string why = ReadScalar(*json, text);
    if (why.empty()) {
      for (const EnumEntry<E>& entry : names) {
        if (EqualsIgnoreCase(text, entry.name)) {
          value = entry.value;
          return;
        }
      }
      why = OneOf(NamesOf(names));
    }
    Fail(path, *json, why);
  }

  // Reads the nested object at `key` with `visit(JsonReader&, S&)`.
  template <typename S, typename F>
  void Object(std::string_view key, S& value, F&& visit,
              IfAbsent if_absent = IfAbsent::kVisitEmpty) {
    const auto [json, path] = Take(key);
    if (!ok() || (json == nullptr && if_absent == IfAbsent::kSkip)) return;
    if (json != nullptr && !json->is_object()) return Fail(path, *json, "expected an object");
    JsonReader child(json == nullptr ? EmptyObject() : *json, path, diag_);
    visit(child, value);
    child.Finish();
  }

  // Present: engaged and read as Object(); absent: nullopt.
  template <typename S, typename F>
  void OptionalObject(std::string_view key, std::optional<S>& value, F&& visit) {
    if (Given(key)) return Object(key, value.emplace(), visit);
    Take(key);
    value.reset();
  }

  // An array of objects at `key`, each read like Object() over a copy of
  // `initial` (the defaults its absent keys keep); absent: left alone.
  template <typename S, typename F>
  void ObjectArray(std::string_view key, std::vector<S>& values, const S& initial, F&& visit) {
    const auto [json, path] = Take(key);
    if (!ok() || json == nullptr) return;
    if (!json->is_array()) return Fail(path, *json, "expected an array of objects");
    std::vector<S> parsed(json->size(), initial);
    for (size_t i = 0; i < parsed.size() && ok(); ++i) {
      const std::string item_path = absl::StrCat(path, "[", i, "]");
      if (!(*json)[i].is_object()) return Fail(item_path, (*json)[i], "expected an object");
      JsonReader child((*json)[i], item_path, diag_);
      visit(child, parsed[i]);
      child.Finish();
    }
    if (ok()) values = std::move(parsed);
  }

  // Fails when `key` is absent, saying `why` it is needed.
  void Require(std::string_view key, std::string_view why);
  // Reads `old_key` as `new_key` (only one may be given); warns when asked to.
  void Rename(std::string_view old_key, std::string_view new_key, bool warn);
  // Known keys with no effect in zo: accepted with a note.
  void Ignore(std::span<const std::string_view> keys);
  void Ignore(std::initializer_list<std::string_view> keys) {
    Ignore(std::span<const std::string_view>(keys.begin(), keys.size()));
  }
  void IgnorePrefix(std::string_view prefix);
  // A key DeepSpeed no longer reads: accepted with a warning carrying `advice`.
  void Obsolete(std::string_view key, std::string_view advice);
  void Note(std::string note) { diag_->notes.push_back(std::move(note)); }

  // Warns about each key no call above asked for.
  void Finish();

 private:
  struct Found {
    const Json* json;  // null when absent
    std::string path;
  };

  static const Json& EmptyObject();
  static bool EqualsIgnoreCase(const std::string& a, const char* b);

  // Looks `key` up through renames; null when absent. Sets the name used.
  const Json* Lookup(std::string_view key, std::string* name) const;
  // Lookup() that also marks the key as known.
  Found Take(std::string_view key);
  bool IsAuto(std::string_view key) const;
  void Fail(const std::string& path, const Json& value, std::string_view why);

  template <typename T, typename C>
  void ReadValue(const Json& json, const std::string& path, T& value, const C& check) {
    if (!ok()) return;
    T parsed{};
    std::string why = ReadScalar(json, parsed);
    if (why.empty()) why = check(parsed);
    if (!why.empty()) return Fail(path, json, why);
    value = std::move(parsed);
  }

  template <typename T, typename C>
  void ReadValue(const Json& json, const std::string& path, std::vector<T>& value, const C& check) {
    if (!json.is_array()) return Fail(path, json, "expected an array");
    std::vector<T> parsed(json.size());
    ReadElements(json, path, std::span<T>(parsed), check);
    if (ok()) value = std::move(parsed);
  }

  template <typename T, size_t N, typename C>
  void ReadValue(const Json& json, const std::string& path, std::array<T, N>& value,
                 const C& check) {
    if (!json.is_array() || json.size() != N) {
      return Fail(path, json, absl::StrCat("expected an array of ", N, " values"));
    }
    std::array<T, N> parsed{};
    ReadElements(json, path, std::span<T>(parsed), check);
    if (ok()) value = parsed;
  }

  template <typename T, typename C>
  void ReadElements(const Json& json, const std::string& path, std::span<T> out, const C& check) {
    for (size_t i = 0; i < out.size(); ++i) {
      ReadValue(json[i], absl::StrCat(path, "[", i, "]"), out[i], check);
    }
  }

  const Json& object_;
  const std::string path_;
  Diagnostics* const diag_;
  std::set<std::string, std::less<>> known_;
  std::map<std::string, std::string, std::less<>> renamed_;  // new name -> old name
};

// Writes one JSON object; the same schema calls as JsonReader, minus the checks.
class JsonWriter {
 public:
  const OrderedJson& json() const { return out_; }
  OrderedJson& json() { return out_; }

  bool Given(std::string_view) const { return true; }

  template <typename T, typename C = NoCheck>
  void Field(std::string_view key, const T& value, C = {}) {
    out_[std::string(key)] = value;
  }
  template <typename T, typename C = NoCheck>
  void AutoField(std::string_view key, const T& value, C check = {}) {
    Field(key, value, check);
  }
  template <typename E, size_t N>
  void Enum(std::string_view key, E value, const std::array<EnumEntry<E>, N>& names) {
    out_[std::string(key)] = NameOf(names, value);
  }
  template <typename S, typename F>
  void Object(std::string_view key, S& value, F&& visit, IfAbsent = IfAbsent::kVisitEmpty) {
    JsonWriter child;
    visit(child, value);
    out_[std::string(key)] = std::move(child.out_);
  }
  template <typename S, typename F>
  void OptionalObject(std::string_view key, std::optional<S>& value, F&& visit) {
    if (value.has_value()) Object(key, *value, visit);
  }
  template <typename S, typename F>
  void ObjectArray(std::string_view key, std::vector<S>& values, const S&, F&& visit) {
    if (values.empty()) return;
    OrderedJson array = OrderedJson::array();
    for (S& value : values) {
      JsonWriter child;
      visit(child, value);
      array.push_back(std::move(child.out_));
    }
    out_[std::string(key)] = std::move(array);
  }

  // Reading-only concerns.
  void Require(std::string_view, std::string_view) {}
  void Rename(std::string_view, std::string_view, bool) {}
  void Ignore(std::span<const std::string_view>) {}
  void Ignore(std::initializer_list<std::string_view>) {}
  void IgnorePrefix(std::string_view) {}
  void Obsolete(std::string_view, std::string_view) {}
  void Note(const std::string&) {}

 private:
  OrderedJson out_ = OrderedJson::object();
};

}  // namespace zo::config_internal

#endif  // ZO_COMMON_INTERNAL_JSON_FIELDS_H_
