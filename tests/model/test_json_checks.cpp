// Reading fields from a user's JSON (model/json_checks.h): every refusal is one error naming the
// place and the field, integers are never truncated or read from floats, and absent optional
// fields are not errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/error.h"
#include "model/json_checks.h"

namespace lp {
namespace {

using nlohmann::json;

template <class T>
std::string refusal(const json& j, const char* key) {
  try {
    (void)json_field<T>(j, key, "f.json: record 2");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for '" << key << "' in " << j.dump();
  return "";
}

TEST(JsonField, ReadsEachKindAndNamesTheFieldWhenItCannot) {
  const json j = json::parse(R"({"n": 7, "big": 4294967297, "x": 1.5, "s": "hi", "b": true, "neg": -3,
                                 "huge": 18446744073709551615, "v": [1, 2]})");
  EXPECT_EQ(json_field<int>(j, "n", "f"), 7);
  EXPECT_EQ(json_field<int64_t>(j, "big", "f"), 4294967297);
  EXPECT_DOUBLE_EQ(json_field<double>(j, "x", "f"), 1.5);
  EXPECT_DOUBLE_EQ(json_field<double>(j, "n", "f"), 7.0);  // an integer is a number
  EXPECT_EQ(json_field<std::string>(j, "s", "f"), "hi");
  EXPECT_TRUE(json_field<bool>(j, "b", "f"));
  EXPECT_EQ(json_field<std::vector<int>>(j, "v", "f"), (std::vector<int>{1, 2}));

  EXPECT_EQ(refusal<int>(j, "missing"), "f.json: record 2: missing field 'missing'");
  // 2^32 + 1 read as an int was 1: it is out of range instead.
  EXPECT_EQ(refusal<int>(j, "big"),
            "f.json: record 2: field 'big' must be a whole number in range, got 4294967297");
  EXPECT_EQ(refusal<int>(j, "x"), "f.json: record 2: field 'x' must be a whole number, got 1.5");
  EXPECT_EQ(refusal<uint32_t>(j, "neg"),
            "f.json: record 2: field 'neg' must be a whole number in range, got -3");
  EXPECT_EQ(refusal<int64_t>(j, "huge"),
            "f.json: record 2: field 'huge' must be a whole number in range, got 18446744073709551615");
  EXPECT_EQ(refusal<double>(j, "s"), "f.json: record 2: field 's' must be a number, got \"hi\"");
  EXPECT_EQ(refusal<std::string>(j, "n"), "f.json: record 2: field 'n' must be a string, got 7");
  EXPECT_EQ(refusal<bool>(j, "n"), "f.json: record 2: field 'n' must be true or false, got 7");
  EXPECT_EQ(refusal<std::vector<int>>(j, "s"),
            "f.json: record 2: field 's' must be of another type, got \"hi\"");
  json nan;
  nan["x"] = std::nan("");
  EXPECT_NE(refusal<double>(nan, "x").find("field 'x' must be a number"), std::string::npos);
}

TEST(JsonField, OptionalFieldsMayBeAbsentOrNullButNotWrong) {
  const json j = json::parse(R"({"a": null, "b": 3, "c": "x"})");
  EXPECT_FALSE(json_optional<int>(j, "a", "f").has_value());
  EXPECT_FALSE(json_optional<int>(j, "missing", "f").has_value());
  EXPECT_EQ(json_optional<int>(j, "b", "f"), 3);
  EXPECT_THROW(json_optional<int>(j, "c", "f"), Error);
  EXPECT_EQ(&json_member(j, "b", "f"), &j["b"]);
  EXPECT_THROW(json_member(j, "missing", "f"), Error);
}

// Nesting is counted in arrays and objects outside strings, up to the bound and not past it, before
// anything is parsed (issue 50): the levels in the bound are read, one more is refused by name.
TEST(JsonParse, BoundsTheNestingDepthBeforeParsing) {
  const auto nested = [](int levels) {
    return std::string(size_t(levels), '[') + std::string(size_t(levels), ']');
  };
  EXPECT_EQ(json_too_deep(nested(kMaxJsonDepth)), std::string_view::npos);
  EXPECT_EQ(json_too_deep(nested(kMaxJsonDepth + 1)), size_t(kMaxJsonDepth));  // the opening past it
  EXPECT_EQ(json_too_deep(nested(3), 2), 2u);
  // Brackets inside strings, escaped quotes included, are text.
  EXPECT_EQ(json_too_deep(R"({"a": "[[[\"[[[", "b": [1]})", 2), std::string_view::npos);
  EXPECT_EQ(json_too_deep(R"({"a": "\\", "b": [[1]]})", 2), 18u);  // "\\" ends the string
  EXPECT_EQ(json_parse(nested(kMaxJsonDepth), "f.json").size(), 1u);
  try {
    (void)json_parse("{\"x\": " + nested(1000000) + "}", "f.json");
    ADD_FAILURE() << "a million levels were parsed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "f.json: JSON nested deeper than 256 levels (at byte 261)");
  }
  // The parser's own errors pass through (lenient: a discarded value), as json::parse's do.
  EXPECT_THROW((void)json_parse("{\"a\": 1e400}", "f.json"), json::out_of_range);
  EXPECT_TRUE(json_parse("[1,", "f.json", true).is_discarded());
}

// Where a parse fails, as a path a refusal can name: the member or element being read, "" between
// members or at the top. Checked on every kind of parser error nlohmann reports: a number past
// double (out_of_range 406), a bad token, a truncated document, invalid UTF-8.
TEST(JsonErrorPath, NamesTheValueWhereTheParseFailed) {
  EXPECT_EQ(json_error_path(R"({"max_tokens": 1e400})"), "max_tokens");
  EXPECT_EQ(json_error_path(R"({"a": 1, "lazyprefill": {"prune": "x", "seed": 1e999}})"), "lazyprefill.seed");
  EXPECT_EQ(json_error_path(R"({"messages": [{"role": "user"}, {"content": tru}]})"), "messages[1].content");
  EXPECT_EQ(json_error_path(R"({"prompt": [1, 2, -1e500]})"), "prompt[2]");
  EXPECT_EQ(json_error_path("{\"prompt\": \"\xff\"}"), "prompt");
  EXPECT_EQ(json_error_path(R"({"a": 1 "b": 2})"), "");  // between members
  EXPECT_EQ(json_error_path(R"({"a": [1, 2)"), "a[2]");  // truncated inside the array
  EXPECT_EQ(json_error_path("[1, 2] x"), "");
  EXPECT_EQ(json_error_path(R"({"a": {"b": [true]}})"), "");  // parses
}

}  // namespace
}  // namespace lp
