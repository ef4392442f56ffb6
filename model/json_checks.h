// Reading fields from JSON a user wrote, the one way every reader does it. nlohmann's get<int>()
// truncates 4294967297 to 1, and reading a float such as 3.9e19 as an integer is undefined
// behaviour; a missing or mistyped field must be one error naming the file and the field.
//   json_integer   an integer within [lo, hi], or nothing (the caller words its own refusal)
//   json_field     a required field of a type: "<where>: missing field 'k'" or
//                  "<where>: field 'k' must be <kind>, got <value>"
//   json_optional  the same for a field that may be absent (or null)
//   json_member    a required field as it is (an object or array the caller reads on)
//   json_parse     JSON text parsed after its nesting depth is checked (kMaxJsonDepth)
//   json_error_path  where a parse failed ("lazyprefill.seed"), for a refusal naming its field
//   json_text      a document as text, bytes that are not UTF-8 as U+FFFD
// `where` names the file and, where it helps, the place in it ("runs.json: record 3").
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "model/error.h"

namespace lp {

// The deepest nesting of arrays and objects any JSON input may have. The deepest the project reads
// or writes is 6 (an OpenAI chat request with content parts, a trace step); JSON schemas in tool
// definitions reach a few tens. A bound this far above any real input and far below what a
// recursive reader can take (nlohmann's copy and dump recurse per level) costs nothing to check:
// a request nested a million levels deep crashed `serve` before it (issue 50).
inline constexpr int kMaxJsonDepth = 256;

// The byte offset of the first '[' or '{' in `text` (outside strings) that opens level `limit` + 1,
// or std::string_view::npos. A linear scan, before anything is built; not a validator (the parser
// after it is).
size_t json_too_deep(std::string_view text, int limit = kMaxJsonDepth);

// Where nlohmann's parse of `text` fails: the path of the value being read, object keys joined by
// '.' and array indices in brackets ("lazyprefill.seed", "messages[0].content"), "" when the error
// is outside any member (or `text` parses). Lets a refusal of `{"max_tokens": 1e400}` name its
// field. Reads with nlohmann's SAX parser, which does not recurse.
std::string json_error_path(std::string_view text);

// nlohmann's parse of `text` once its depth is within kMaxJsonDepth: deeper is lp::Error
// "<where>: JSON nested deeper than 256 levels (at byte N)". The parser's own exceptions
// (json::parse_error, json::out_of_range for a number such as 1e400) pass through to the caller;
// with `lenient` it returns a discarded value instead, as json::parse(text, nullptr, false).
template <class Json = nlohmann::json>
Json json_parse(std::string_view text, std::string_view where, bool lenient = false) {
  if (const size_t at = json_too_deep(text); at != std::string_view::npos)
    fail("{}: JSON nested deeper than {} levels (at byte {})", where, kMaxJsonDepth, at);
  return Json::parse(text, nullptr, !lenient);
}

// The integer `v` holds when it is an integer (not a float, string, ...) within [lo, hi].
template <class Json>
std::optional<int64_t> json_integer(const Json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) return std::nullopt;
  // Non-negative JSON integers are unsigned: a huge one is out of range before the signed read.
  if (v.is_number_unsigned() && v.template get<uint64_t>() > uint64_t(INT64_MAX)) return std::nullopt;
  const int64_t x = v.template get<int64_t>();
  if (x < lo || x > hi) return std::nullopt;
  return x;
}

// `j` as text (indented by `indent`; -1: one line), bytes that are not UTF-8 (a Latin-1 name read from an
// input) as U+FFFD instead of nlohmann's exception: every document an input's strings reach is
// printed, written or handed to Python through it.
template <class Json>
std::string json_text(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// The value `v` of field `key` as a T, or lp::Error naming `where`, the field and what it holds.
template <class T, class Json>
T json_value(const Json& v, std::string_view key, std::string_view where) {
  const auto refuse = [&](const char* kind) {
    fail("{}: field '{}' must be {}, got {}", where, key, kind, json_text(v, -1));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) refuse("true or false");
    return v.template get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    // T's range as it fits in int64_t (a uint64_t field takes up to INT64_MAX).
    const auto x = json_integer(v, int64_t(std::numeric_limits<T>::lowest()),
                                int64_t(std::min<uintmax_t>(std::numeric_limits<T>::max(), INT64_MAX)));
    if (!x) refuse(v.is_number_integer() ? "a whole number in range" : "a whole number");
    return T(*x);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number() || !std::isfinite(v.template get<double>())) refuse("a number");
    return v.template get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) refuse("a string");
    return v.template get<std::string>();
  } else {
    try {
      return v.template get<T>();
    } catch (const nlohmann::json::exception&) {
      refuse("of another type");
    }
    return T{};  // not reached: refuse throws
  }
}

template <class Json>
const Json& json_member(const Json& j, const char* key, std::string_view where) {
  const auto it = j.find(key);
  if (it == j.end()) fail("{}: missing field '{}'", where, key);
  return *it;
}

template <class T, class Json>
T json_field(const Json& j, const char* key, std::string_view where) {
  const auto it = j.find(key);
  if (it == j.end()) fail("{}: missing field '{}'", where, key);
  return json_value<T>(*it, key, where);
}

template <class T, class Json>
std::optional<T> json_optional(const Json& j, const char* key, std::string_view where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return json_value<T>(*it, key, where);
}

}  // namespace lp
