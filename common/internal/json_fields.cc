#include "common/internal/json_fields.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace zo::config_internal {
namespace {

constexpr size_t kMaxValueChars = 80;

// HF configs write "auto" everywhere; only the batch keys understand it here.
std::string TypeError(const Json& json, std::string_view expected) {
  std::string why = absl::StrCat("expected ", std::string(expected));
  if (json.is_string() && json.get_ref<const std::string&>() == "auto") {
    absl::StrAppend(&why, " (\"auto\" is only understood for the batch-size keys)");
  }
  return why;
}

}  // namespace

absl::Status ValueError(const std::string& path, const Json& value, std::string_view reason) {
  std::string text = value.dump();
  if (text.size() > kMaxValueChars) text = text.substr(0, kMaxValueChars) + "...";
  return absl::InvalidArgumentError(absl::StrCat(path, " = ", text, ": ", std::string(reason)));
}

std::string Bounds::operator()(double value) const {
  const bool below = lo_open ? value <= lo : value < lo;
  const bool above = hi_open ? value >= hi : value > hi;
  if (!below && !above) return {};
  if (std::isfinite(lo) && std::isfinite(hi)) {
    return absl::StrCat("must be in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]");
  }
  if (std::isfinite(lo)) return absl::StrCat("must be ", lo_open ? "> " : ">= ", lo);
  return absl::StrCat("must be ", hi_open ? "< " : "<= ", hi);
}

std::string ReadScalar(const Json& json, bool& out) {
  if (!json.is_boolean()) return TypeError(json, "true or false");
  out = json.get<bool>();
  return {};
}

std::string ReadScalar(const Json& json, double& out) {
  if (!json.is_number()) return TypeError(json, "a number");
  out = json.get<double>();
  return {};
}

std::string ReadScalar(const Json& json, std::string& out) {
  if (!json.is_string()) return TypeError(json, "a string");
  out = json.get<std::string>();
  return {};
}

std::string ReadInteger(const Json& json, int64_t min, int64_t max, int64_t& out) {
  const std::string out_of_range = absl::StrCat("out of range [", min, ", ", max, "]");
  if (json.is_number_unsigned()) {
    const uint64_t value = json.get<uint64_t>();
    if (value > static_cast<uint64_t>(max)) return out_of_range;
    out = static_cast<int64_t>(value);
  } else if (json.is_number_integer()) {
    out = json.get<int64_t>();
  } else if (json.is_number_float()) {
    const double value = json.get<double>();
    if (std::trunc(value) != value) return "expected an integer";
    // 2^63 is the first double past int64's range.
    if (value < static_cast<double>(min) || value >= 9223372036854775808.0) return out_of_range;
    out = static_cast<int64_t>(value);
  } else {
    return TypeError(json, "an integer");
  }
  if (out < min || out > max) return out_of_range;
  return {};
}

std::string OneOf(const std::vector<const char*>& names) {
  return absl::StrCat("must be one of ", absl::StrJoin(names, ", "));
}

JsonReader::JsonReader(const Json& object, std::string path, Diagnostics* diag)
    : object_(object), path_(std::move(path)), diag_(diag) {}

std::string JsonReader::PathOf(std::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", std::string(key));
}

const Json& JsonReader::EmptyObject() {
  static const Json* const kEmpty = new Json(Json::object());
  return *kEmpty;
}

bool JsonReader::EqualsIgnoreCase(const std::string& a, const char* b) {
  return absl::EqualsIgnoreCase(a, b);
}

const Json* JsonReader::Lookup(std::string_view key, std::string* name) const {
  const auto renamed = renamed_.find(key);
  *name = renamed == renamed_.end() ? std::string(key) : renamed->second;
  const auto it = object_.find(*name);
  return (it == object_.end() || it->is_null()) ? nullptr : &*it;
}

bool JsonReader::Given(std::string_view key) const {
  std::string name;
  return Lookup(key, &name) != nullptr;
}

JsonReader::Found JsonReader::Take(std::string_view key) {
  std::string name;
  const Json* json = Lookup(key, &name);
  known_.insert(name);
  return {json, PathOf(name)};
}

bool JsonReader::IsAuto(std::string_view key) const {
  std::string name;
  const Json* json = Lookup(key, &name);
  return json != nullptr && json->is_string() && json->get_ref<const std::string&>() == "auto";
}

void JsonReader::Fail(const std::string& path, const Json& value, std::string_view why) {
  if (ok()) diag_->status = ValueError(path, value, why);
}

void JsonReader::Require(std::string_view key, std::string_view why) {
  if (ok() && !Given(key)) {
    diag_->status =
        absl::InvalidArgumentError(absl::StrCat(PathOf(key), ": required ", std::string(why)));
  }
}

void JsonReader::Rename(std::string_view old_key, std::string_view new_key, bool warn) {
  if (object_.contains(std::string(old_key))) known_.insert(std::string(old_key));
  if (!ok() || !Given(old_key)) return;
  if (Given(new_key)) {
    diag_->status =
        absl::InvalidArgumentError(absl::StrCat("'", PathOf(old_key), "' is the old name of '",
                                                PathOf(new_key), "': give only one of them"));
    return;
  }
  renamed_.emplace(std::string(new_key), std::string(old_key));
  known_.insert(std::string(new_key));  // a null under the new name is no unknown key
  if (warn) {
    diag_->warnings.push_back(absl::StrCat("'", PathOf(old_key), "' was renamed '", PathOf(new_key),
                                           "' in DeepSpeed; using its value"));
  }
}

void JsonReader::Ignore(std::span<const std::string_view> keys) {
  for (std::string_view key : keys) {
    if (!object_.contains(std::string(key))) continue;
    known_.insert(std::string(key));
    Note(absl::StrCat("DeepSpeed key '", PathOf(key), "' accepted; it has no effect in zo"));
  }
}

void JsonReader::IgnorePrefix(std::string_view prefix) {
  for (const auto& [key, value] : object_.items()) {
    if (!known_.contains(key) && key.starts_with(prefix)) Ignore({std::string_view(key)});
  }
}

void JsonReader::Obsolete(std::string_view key, std::string_view advice) {
  if (!object_.contains(std::string(key))) return;
  known_.insert(std::string(key));
  diag_->warnings.push_back(absl::StrCat(
      "'", PathOf(key), "' is no longer read by DeepSpeed and is ignored; ", std::string(advice)));
}

void JsonReader::Finish() {
  for (const auto& [key, value] : object_.items()) {
    if (!known_.contains(key)) {
      diag_->warnings.push_back(absl::StrCat("unknown key '", PathOf(key), "' ignored"));
    }
  }
}

}  // namespace zo::config_internal
