// Reading integers from JSON a user wrote. nlohmann's get<int>() truncates 4294967297 to 1, and
// reading a float such as 3.9e19 as an integer is undefined behaviour; every reader of counts,
// sizes and versions goes through json_integer instead and words its own refusal.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace lp {

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

}  // namespace lp
