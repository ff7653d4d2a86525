// Reads one JSON object of the config with a key path for error messages, and
// checks at Finish() that every key present was consumed (no key is ignored silently).
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::core {

class JsonReader {
 public:
  // `obj` must outlive the reader. `path` is the dotted key path of `obj` ("" at top).
  JsonReader(const nlohmann::json& obj, std::string path) : obj_(&obj), path_(std::move(path)) {}

  std::string Path(std::string_view key) const;

  // Each reader leaves *out unchanged when the key is absent.
  Status Bool(std::string_view key, bool* out);
  // true, false, or the string "auto" (*is_auto set, *out left alone).
  Status BoolOrAuto(std::string_view key, bool* out, bool* is_auto);
  Status Int(std::string_view key, int lo, int hi, int* out);
  Status UInt64(std::string_view key, uint64_t* out);
  Status Double(std::string_view key, double lo, double hi, double* out);
  // A number in [lo, hi], or the string "auto", read as -1.
  Status DoubleOrAuto(std::string_view key, double lo, double hi, double* out);
  Status String(std::string_view key, std::string* out);
  Status Enum(std::string_view key, std::initializer_list<std::string_view> allowed, std::string* out);
  // A number of bytes, or a string with a unit ("64MiB"); DeepSpeed writes 5e8.
  Status Bytes(std::string_view key, uint64_t* out);
  // A number of parameters (elements): a whole number (DeepSpeed writes 1e9), or a
  // string "100M" (ParseCount; "64MiB" is read as 64Mi parameters).
  Status Count(std::string_view key, uint64_t* out);
  // A string, or a list of strings.
  Status StringOrList(std::string_view key, std::vector<std::string>* out);
  // A list of exactly two numbers in [lo, hi].
  Status DoublePair(std::string_view key, double lo, double hi, std::vector<double>* out);
  // A reader over the sub-object at key (an empty object when absent).
  Result<JsonReader> ObjectOrEmpty(std::string_view key);
  // A DeepSpeed key whose feature strata has not built: present is an error.
  Status Unsupported(std::string_view key, std::string_view hint);
  // A key accepted and deliberately without effect (e.g. steps_per_print).
  Status Ignore(std::string_view key);
  // Unknown keys (not consumed) are InvalidArgument naming the first of them, with
  // "did you mean" for a known key of this object within a small edit distance
  // (a misspelling, British spelling or a dropped underscore).
  Status Finish() const;

 private:
  const nlohmann::json* Find(std::string_view key);
  // Bytes and Count: `unit` names what the number counts in the errors.
  Status Amount(std::string_view key, std::string_view unit, uint64_t* out);
  Status TypeError(std::string_view key, std::string_view expected, const nlohmann::json& got) const;

  const nlohmann::json* obj_;
  std::string path_;
  std::set<std::string, std::less<>> consumed_;
  std::set<std::string, std::less<>> known_;  // every key asked for, present or not
};

// The Damerau-Levenshtein (optimal string alignment) distance, case-insensitive.
size_t EditDistance(std::string_view a, std::string_view b);

}  // namespace strata::core
