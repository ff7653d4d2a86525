#include "core/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "strata/units.h"

namespace strata::core {
namespace {
const nlohmann::json& EmptyObject() {
  static const nlohmann::json* empty = new nlohmann::json(nlohmann::json::object());
  return *empty;
}
std::string Brief(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
}  // namespace

std::string JsonReader::Path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const nlohmann::json* JsonReader::Find(std::string_view key) {
  known_.insert(std::string(key));
  auto it = obj_->find(std::string(key));
  if (it == obj_->end()) return nullptr;
  consumed_.insert(std::string(key));
  return &*it;
}

Status JsonReader::TypeError(std::string_view key, std::string_view expected,
                             const nlohmann::json& got) const {
  return InvalidArgumentError(Path(key) + ": expected " + std::string(expected) + ", got " + Brief(got));
}

Status JsonReader::Bool(std::string_view key, bool* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  if (!v->is_boolean()) return TypeError(key, "true or false", *v);
  *out = v->get<bool>();
  return OkStatus();
}

Status JsonReader::BoolOrAuto(std::string_view key, bool* out, bool* is_auto) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  if (v->is_string() && v->get<std::string>() == "auto") {
    *is_auto = true;
    return OkStatus();
  }
  if (!v->is_boolean()) return TypeError(key, "true, false or \"auto\"", *v);
  *out = v->get<bool>();
  *is_auto = false;
  return OkStatus();
}

Status JsonReader::Int(std::string_view key, int lo, int hi, int* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  double d;
  if (v->is_number_integer() || v->is_number_unsigned()) {
    d = v->get<double>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()) {
    d = v->get<double>();
  } else {
    return TypeError(key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", *v);
  }
  if (d < lo || d > hi) {
    return InvalidArgumentError(Path(key) + ": expected an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got " + Brief(*v));
  }
  *out = static_cast<int>(d);
  return OkStatus();
}

Status JsonReader::UInt64(std::string_view key, uint64_t* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  if (v->is_number_unsigned()) {
    *out = v->get<uint64_t>();
    return OkStatus();
  }
  if (v->is_number_integer() && v->get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v->get<int64_t>());
    return OkStatus();
  }
  return TypeError(key, "a non-negative integer", *v);
}

Status JsonReader::Double(std::string_view key, double lo, double hi, double* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  if (!v->is_number()) return TypeError(key, "a number", *v);
  double d = v->get<double>();
  if (!(d >= lo && d <= hi)) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), "a number in [%g, %g]", lo, hi);
    return InvalidArgumentError(Path(key) + ": expected " + buf + ", got " + Brief(*v));
  }
  *out = d;
  return OkStatus();
}

Status JsonReader::DoubleOrAuto(std::string_view key, double lo, double hi, double* out) {
  const auto* v = Find(key);
  if (v && v->is_string()) {
    if (v->get<std::string>() != "auto") {
      char range[64];
      std::snprintf(range, sizeof(range), "a number in [%g, %g] or \"auto\"", lo, hi);
      return InvalidArgumentError(Path(key) + ": expected " + range + ", got " + Brief(*v));
    }
    *out = -1;
    return OkStatus();
  }
  if (v && !v->is_number()) return TypeError(key, "a number or \"auto\"", *v);
  return Double(key, lo, hi, out);
}

Status JsonReader::String(std::string_view key, std::string* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  if (!v->is_string()) return TypeError(key, "a string", *v);
  *out = v->get<std::string>();
  return OkStatus();
}

Status JsonReader::Enum(std::string_view key, std::initializer_list<std::string_view> allowed,
                        std::string* out) {
  const auto* v = Find(key);
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "" : "|") + std::string(a);
  if (!v) return OkStatus();
  if (!v->is_string()) return TypeError(key, "one of " + list, *v);
  std::string s = v->get<std::string>();
  for (auto a : allowed) {
    if (s == a) {
      *out = s;
      return OkStatus();
    }
  }
  return InvalidArgumentError(Path(key) + ": expected one of " + list + ", got \"" + s + "\"");
}

Status JsonReader::Bytes(std::string_view key, uint64_t* out) { return Amount(key, "bytes", out); }

Status JsonReader::Count(std::string_view key, uint64_t* out) { return Amount(key, "parameters", out); }

Status JsonReader::Amount(std::string_view key, std::string_view unit, uint64_t* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  const bool bytes = unit == "bytes";
  const std::string sized = bytes ? "a size like \"64MiB\"" : "a count like \"100M\"";
  if (v->is_string()) {
    const std::string text = v->get<std::string>();
    // A count also takes a binary size ("64MiB" as 64Mi parameters), as it did when these
    // keys were read as bytes.
    auto r = bytes ? ParseBytes(text) : ParseCount(text);
    if (!r.ok() && !bytes && ParseBytes(text).ok()) r = ParseBytes(text);
    if (!r.ok()) return InvalidArgumentError(Path(key) + ": " + r.status().message());
    *out = *r;
    return OkStatus();
  }
  if (v->is_number()) {
    double d = v->get<double>();
    if (d < 0 || std::floor(d) != d || d > 1.8e19) {
      return TypeError(key, "a whole number of " + std::string(unit) + " >= 0 or " + sized, *v);
    }
    *out = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(d);
    return OkStatus();
  }
  return TypeError(key, "a number of " + std::string(unit) + " or " + sized, *v);
}

Status JsonReader::StringOrList(std::string_view key, std::vector<std::string>* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  if (v->is_string()) {
    *out = {v->get<std::string>()};
    return OkStatus();
  }
  if (!v->is_array()) return TypeError(key, "a path or a list of paths", *v);
  std::vector<std::string> paths;
  for (const auto& e : *v) {
    if (!e.is_string() || e.get<std::string>().empty())
      return TypeError(key, "a list of non-empty paths", *v);
    paths.push_back(e.get<std::string>());
  }
  *out = std::move(paths);
  return OkStatus();
}

Status JsonReader::DoublePair(std::string_view key, double lo, double hi, std::vector<double>* out) {
  const auto* v = Find(key);
  if (!v) return OkStatus();
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_number() || !(*v)[1].is_number()) {
    return TypeError(key, "a list of two numbers", *v);
  }
  double a = (*v)[0].get<double>(), b = (*v)[1].get<double>();
  if (!(a >= lo && a <= hi && b >= lo && b <= hi)) {
    return InvalidArgumentError(Path(key) + ": values must be in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got " + Brief(*v));
  }
  *out = {a, b};
  return OkStatus();
}

Result<JsonReader> JsonReader::ObjectOrEmpty(std::string_view key) {
  const auto* v = Find(key);
  if (!v) return JsonReader(EmptyObject(), Path(key));
  if (!v->is_object()) return TypeError(key, "an object", *v);
  return JsonReader(*v, Path(key));
}

Status JsonReader::Unsupported(std::string_view key, std::string_view hint) {
  if (!Find(key)) return OkStatus();
  std::string msg = Path(key) + ": not supported yet by strata";
  if (!hint.empty()) msg += " (" + std::string(hint) + ")";
  msg += "; remove the key (see docs/config.md)";
  return InvalidArgumentError(std::move(msg));
}

Status JsonReader::Ignore(std::string_view key) {
  Find(key);
  return OkStatus();
}

Status JsonReader::Finish() const {
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    if (consumed_.count(it.key())) continue;
    std::string msg = Path(it.key()) + ": unknown key";
    // A typo is at most a third of the key away (two edits for short keys).
    size_t best = std::max<size_t>(2, it.key().size() / 3) + 1;
    std::string guess;
    for (const std::string& k : known_) {
      const size_t d = EditDistance(it.key(), k);
      if (d < best && !obj_->contains(k)) best = d, guess = k;
    }
    if (!guess.empty()) msg += "; did you mean \"" + Path(guess) + "\"?";
    return InvalidArgumentError(msg + " (see docs/config.md for the keys strata accepts)");
  }
  return OkStatus();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

}  // namespace strata::core
