// Pruning schedules: the inline syntax, the file form, resolution against model depth, and the
// one rounding rule for how many tokens a step keeps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/error.h"
#include "pruning/schedule.h"

namespace lp {
namespace {

// Expects `f` to throw lp::Error whose one-line message contains `needle`. A failure names the
// caller's line (__builtin_FILE/LINE: clang 14 has no std::source_location).
template <class F>
void expect_error(F&& f, const std::string& needle, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  const ::testing::ScopedTrace trace(file, line, "expect_error called here");
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected: " << needle;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  }
}

// A scratch folder of its own per test process, removed at the end.
class ScheduleFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("lp_schedule_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::filesystem::path dir_;
};

std::vector<PruneStep> steps(std::initializer_list<PruneStep> l) {
  return l;
}

void expect_same(const Schedule& a, const Schedule& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    // Bit-for-bit: the written forms promise exact round trips.
    EXPECT_EQ(a.steps[i].at, b.steps[i].at) << "step " << i;
    EXPECT_EQ(a.steps[i].fraction, b.steps[i].fraction) << "step " << i;
    EXPECT_EQ(a.steps[i].share, b.steps[i].share) << "step " << i;
  }
}

TEST(ScheduleParse, DefaultInEveryForm) {
  const Schedule d = default_schedule();
  ASSERT_EQ(d.steps.size(), 3u);
  EXPECT_TRUE(d.steps[0].fraction);
  EXPECT_EQ(d.steps[0].at, 0.3);
  EXPECT_EQ(d.steps[2].share, 0.3);
  expect_same(parse_schedule("0.3:0.3,0.6:0.3,0.9:0.3"), d);
  // Percentages are read as exact decimals, so 30% is the very same double as 0.3.
  expect_same(parse_schedule("30%:30%,60%:30%,90%:30%"), d);
  expect_same(parse_schedule("  0.3 : 30% ,\t60%:0.3 , 0.9:0.3\n"), d);
  EXPECT_EQ(d.to_string(), "0.3:0.3,0.6:0.3,0.9:0.3");
}

TEST(ScheduleParse, LayersFractionsPercentagesAndNone) {
  const Schedule l = parse_schedule("8:0.3,17:0.3,26:0.3");
  ASSERT_EQ(l.steps.size(), 3u);
  EXPECT_FALSE(l.steps[1].fraction);
  EXPECT_EQ(l.steps[1].at, 17);
  EXPECT_EQ(resolve_schedule(l, 30), resolve_schedule(default_schedule(), 30));

  const Schedule one = parse_schedule("0.5:0.5");
  ASSERT_EQ(one.steps.size(), 1u);
  EXPECT_TRUE(one.steps[0].fraction);
  EXPECT_EQ(one.steps[0].at, 0.5);
  EXPECT_EQ(one.steps[0].share, 0.5);

  // Layer 0, share 0 (score but keep all), a share with many digits, a percentage with decimals,
  // ".5" and "5." style decimals, and layers mixed with depths.
  const Schedule m = parse_schedule("0:0, .25:12.5%, 20:0.123456, 0.75:5.%");
  ASSERT_EQ(m.steps.size(), 4u);
  EXPECT_FALSE(m.steps[0].fraction);
  EXPECT_EQ(m.steps[0].at, 0);
  EXPECT_EQ(m.steps[0].share, 0);
  EXPECT_TRUE(m.steps[1].fraction);
  EXPECT_EQ(m.steps[1].at, 0.25);
  EXPECT_EQ(m.steps[1].share, 0.125);
  EXPECT_EQ(m.steps[2].share, 0.123456);
  EXPECT_EQ(m.steps[3].share, 0.05);
  // A percentage of depth is a depth, even without a decimal point.
  EXPECT_TRUE(parse_schedule("8%:0.3").steps[0].fraction);
  EXPECT_EQ(parse_schedule("8%:0.3").steps[0].at, 0.08);

  EXPECT_TRUE(parse_schedule("none").steps.empty());
  EXPECT_TRUE(parse_schedule("  none ").steps.empty());
  EXPECT_TRUE(parse_schedule("").steps.empty());
  EXPECT_TRUE(parse_schedule(" \t").steps.empty());
  EXPECT_EQ(Schedule{}.to_string(), "none");
}

TEST(ScheduleParse, RejectsMalformedText) {
  expect_error([] { parse_schedule("abc"); }, "expected AT:SHARE");
  expect_error([] { parse_schedule("-0.3"); }, "expected AT:SHARE");
  expect_error([] { parse_schedule("0.3,0.5"); }, "must be the schedule's only step");
  expect_error([] { parse_schedule("0.3,0.3:0.5"); }, "must be the schedule's only step");
  expect_error([] { parse_schedule("1"); }, "drop share 1 must be in [0, 1)");
  expect_error([] { parse_schedule("100%"); }, "drop share 1 must be in [0, 1)");
  expect_error([] { parse_schedule("0.3:0.3;0.6:0.3"); }, "malformed share '0.3;0.6:0.3'");
  expect_error([] { parse_schedule("0.3:0.3:0.3"); }, "malformed share '0.3:0.3'");
  expect_error([] { parse_schedule("abc:0.3"); }, "malformed AT 'abc'");
  expect_error([] { parse_schedule("0.3x:0.3"); }, "malformed AT '0.3x'");
  expect_error([] { parse_schedule("0.3:0.3x"); }, "malformed share '0.3x'");
  expect_error([] { parse_schedule("0.3:0.3 junk"); }, "malformed share '0.3 junk'");
  expect_error([] { parse_schedule("1e-1:0.3"); }, "malformed AT '1e-1'");
  expect_error([] { parse_schedule("0.1.2:0.3"); }, "malformed AT '0.1.2'");
  expect_error([] { parse_schedule("0 .3:0.3"); }, "malformed AT '0 .3'");
  expect_error([] { parse_schedule(".:0.3"); }, "malformed AT '.'");
  expect_error([] { parse_schedule("%:0.3"); }, "malformed AT '%'");
  expect_error([] { parse_schedule(":0.3"); }, "malformed AT ''");
  expect_error([] { parse_schedule("0.3:"); }, "malformed share ''");
  expect_error([] { parse_schedule("+8:0.3"); }, "malformed AT '+8'");
  expect_error([] { parse_schedule("0.3:30%%"); }, "malformed share '30%%'");
  expect_error([] { parse_schedule("0.3:0.3,"); }, "step 2 is empty");
  expect_error([] { parse_schedule("0.3:0.3,,0.6:0.3"); }, "step 2 is empty");
  expect_error([] { parse_schedule(",0.3:0.3"); }, "step 1 is empty");
  expect_error([] { parse_schedule("None"); }, "expected AT:SHARE");
}

TEST(ScheduleParse, RejectsValuesOutOfRange) {
  expect_error([] { parse_schedule("-1:0.3"); }, "AT '-1' is negative");
  expect_error([] { parse_schedule("-0.3:0.3"); }, "AT '-0.3' is negative");
  expect_error([] { parse_schedule("0.3:-0.3"); }, "share '-0.3' is negative");
  expect_error([] { parse_schedule("0.3:1"); }, "share 1 must be in [0, 1)");
  expect_error([] { parse_schedule("0.3:1.0"); }, "share 1 must be in [0, 1)");
  expect_error([] { parse_schedule("0.3:100%"); }, "share 1 must be in [0, 1)");
  expect_error([] { parse_schedule("0.3:1.5"); }, "share 1.5 must be in [0, 1)");
  expect_error([] { parse_schedule("0.3:30"); }, "share 30 must be in [0, 1)");
  expect_error([] { parse_schedule("0.0:0.3"); }, "depth fraction 0 must be in (0, 1)");
  expect_error([] { parse_schedule("0%:0.3"); }, "depth fraction 0 must be in (0, 1)");
  expect_error([] { parse_schedule("100%:0.3"); }, "depth fraction 1 must be in (0, 1)");
  expect_error([] { parse_schedule("1.0:0.3"); }, "a layer index has no decimal point");
  expect_error([] { parse_schedule("8.0:0.3"); }, "a layer index has no decimal point");
  // The item is named, so a long schedule points at its bad step.
  expect_error([] { parse_schedule("0.3:0.3, 0.6:1.3, 0.9:0.3"); }, "schedule item '0.6:1.3'");
}

TEST(ScheduleParse, RejectsDuplicatesAndSameKindStepsOutOfOrder) {
  expect_error([] { parse_schedule("8:0.3,8:0.2"); }, "layer 8 appears twice (steps 1 and 2)");
  expect_error([] { parse_schedule("0.3:0.3,30%:0.2"); }, "depth 0.3 appears twice (steps 1 and 2)");
  expect_error([] { parse_schedule("17:0.3,8:0.3"); }, "step 2 (layer 8) comes after step 1 (layer 17)");
  expect_error([] { parse_schedule("0.6:0.3,0.3:0.3"); },
               "step 2 (depth 0.3) comes after step 1 (depth 0.6)");
  // Kinds interleaved: each kind is checked against its own previous step.
  expect_error([] { parse_schedule("10:0.3,0.5:0.3,5:0.3"); },
               "step 3 (layer 5) comes after step 1 (layer 10)");
  // A layer before a depth (or after) cannot be ordered without a model: resolution does it.
  EXPECT_EQ(parse_schedule("0.6:0.3,8:0.3").steps.size(), 2u);
  expect_error(
      [] { resolve_schedule(parse_schedule("0.6:0.3,8:0.3"), 30); },
      "schedule step 2 (layer 8) resolves to layer 8 on a 30-layer model, not after step 1's layer 17: "
      "pruning layers must increase (put the steps in increasing order for this model)");
}

TEST(ScheduleResolve, DefaultOnModelsOfManyDepths) {
  const Schedule d = default_schedule();
  // l = round(f * L) - 1, halves up.
  // L = 30: 0.3*30 = 9 -> 8;  0.6*30 = 18 -> 17;  0.9*30 = 27 -> 26.
  EXPECT_EQ(resolve_schedule(d, 30), steps({{8, 0.3}, {17, 0.3}, {26, 0.3}}));
  // L = 16: 4.8 -> 5 -> 4;  9.6 -> 10 -> 9;  14.4 -> 14 -> 13 (<= L-2 = 14).
  EXPECT_EQ(resolve_schedule(d, 16), steps({{4, 0.3}, {9, 0.3}, {13, 0.3}}));
  // L = 32: 9.6 -> 10 -> 9;  19.2 -> 19 -> 18;  28.8 -> 29 -> 28.
  EXPECT_EQ(resolve_schedule(d, 32), steps({{9, 0.3}, {18, 0.3}, {28, 0.3}}));
  // L = 80: 24 -> 23;  48 -> 47;  72 -> 71.
  EXPECT_EQ(resolve_schedule(d, 80), steps({{23, 0.3}, {47, 0.3}, {71, 0.3}}));
  // L = 4: 1.2 -> 1 -> 0;  2.4 -> 2 -> 1;  3.6 -> 4 -> 3, clamped to L-2 = 2. Still strictly
  // increasing, so it resolves: prune after each of layers 0, 1, 2; layer 3 sees 0.7^3 of the
  // tokens. Decided: a shallow model that can still fit every step gets them all.
  EXPECT_EQ(resolve_schedule(d, 4), steps({{0, 0.3}, {1, 0.3}, {2, 0.3}}));
  // L = 3: 0.9 -> 0;  1.8 -> 2 -> 1;  2.7 -> 3 -> 2, clamped to 1: meets step 2. An error.
  expect_error(
      [] { resolve_schedule(default_schedule(), 3); },
      "schedule step 3 (depth 0.9) resolves to layer 1 (clamped from 2) on a 3-layer model, not after "
      "step 2's layer 1");
  // L = 2: 0.6 -> 1 -> 0;  1.2 -> 1 -> 0: two steps at layer 0. Three pruning layers cannot fit
  // in a model whose only prunable layer is 0, so the default fails clearly rather than merging
  // steps (which would silently prune 51% at once).
  expect_error(
      [] { resolve_schedule(default_schedule(), 2); },
      "schedule step 2 (depth 0.6) resolves to layer 0 on a 2-layer model, not after step 1's layer 0");
  expect_error([] { resolve_schedule(default_schedule(), 2); },
               "(the model is too shallow for this schedule;");
  // L = 1: nothing follows the only layer.
  expect_error([] { resolve_schedule(default_schedule(), 1); },
               "a 1-layer model has no layer to prune after");
  expect_error([] { resolve_schedule(default_schedule(), 0); }, "model with 0 layers");
}

TEST(ScheduleResolve, RoundingAndClamping) {
  // Halves round up: 0.25 * 6 = 1.5 -> 2 -> layer 1.
  EXPECT_EQ(resolve_schedule(parse_schedule("0.25:0.5"), 6), steps({{1, 0.5}}));
  // 0.29 * 50 is 14.499999999999998 in doubles but means 14.5 -> 15 -> layer 14; same for
  // 0.145 * 100. Without the slack in resolve_schedule these would give layer 13.
  EXPECT_EQ(resolve_schedule(parse_schedule("0.29:0.5"), 50), steps({{14, 0.5}}));
  EXPECT_EQ(resolve_schedule(parse_schedule("0.145:0.5"), 100), steps({{14, 0.5}}));
  // Below the first layer clamps up to 0 (0.01 * 30 = 0.3 -> 0 -> -1); past L-2 clamps down
  // (0.99 * 30 = 29.7 -> 30 -> 29 -> 28).
  EXPECT_EQ(resolve_schedule(parse_schedule("0.01:0.1,0.99:0.2"), 30), steps({{0, 0.1}, {28, 0.2}}));
  // Absolute layers are never clamped.
  EXPECT_EQ(resolve_schedule(parse_schedule("28:0.3"), 30), steps({{28, 0.3}}));
  expect_error([] { resolve_schedule(parse_schedule("29:0.3"), 30); },
               "schedule step 1 (layer 29): a 30-layer model can prune after layers 0 to 28 only");
  // Mixed kinds in order resolve fine.
  EXPECT_EQ(resolve_schedule(parse_schedule("2:0.1,0.5:0.2,20:0.3"), 30),
            steps({{2, 0.1}, {14, 0.2}, {20, 0.3}}));
  // An empty schedule is valid at any depth, even 1.
  EXPECT_TRUE(resolve_schedule(Schedule{}, 1).empty());
  EXPECT_TRUE(resolve_schedule(parse_schedule("none"), 30).empty());
}

TEST(ScheduleResolve, ValidatesSchedulesBuiltInCode) {
  expect_error([] { resolve_schedule(Schedule{{{8, false, 1.0}}}, 30); }, "share 1 must be in [0, 1)");
  expect_error([] { resolve_schedule(Schedule{{{8, false, -0.1}}}, 30); }, "share -0.1 must be in [0, 1)");
  expect_error([] { resolve_schedule(Schedule{{{8, false, NAN}}}, 30); }, "share nan must be in [0, 1)");
  expect_error([] { resolve_schedule(Schedule{{{-1, false, 0.3}}}, 30); }, "layer -1 is negative");
  expect_error(
      [] {
        resolve_schedule(Schedule{{{8.5, false, 0.3}}}, 30);
      },
      "layer 8.5 is not a whole number");
  expect_error(
      [] {
        resolve_schedule(Schedule{{{1.0, true, 0.3}}}, 30);
      },
      "depth fraction 1 must be in (0, 1)");
  expect_error(
      [] {
        resolve_schedule(Schedule{{{8, false, 0.3}, {8, false, 0.3}}}, 30);
      },
      "resolves to layer 8 on a 30-layer model, not after step 1's layer 8");
}

// Sliding-window models (Gemma 3): depth fractions resolve to the nearest global layer a prune can
// follow; fractions that meet there become one step; absolute layers stay where they are written.
TEST(ScheduleResolve, FractionsMoveToGlobalLayersOnSlidingWindowModels) {
  const Schedule d = default_schedule();
  // Gemma 3 270M: 18 layers [LLLLLG] x 3, global 5, 11, 17 (17 is the last: nothing to prune after it).
  // 0.3 -> 4 -> 5;  0.6 -> 10 -> 11;  0.9 -> 15 -> 11 (17 is out of reach): 11 prunes 1 - 0.7 x 0.7.
  const std::vector<int> g18 = {5, 11, 17};
  const auto r18 = resolve_schedule(d, 18, g18);
  ASSERT_EQ(r18.size(), 2u);
  EXPECT_EQ(r18[0], (PruneStep{5, 0.3}));
  EXPECT_EQ(r18[1].layer, 11);
  EXPECT_NEAR(r18[1].share, 0.51, 1e-12);
  // Gemma 3 1B: 26 layers, global 5, 11, 17, 23. 0.3 -> 7 -> 5;  0.6 -> 15 -> 17;  0.9 -> 22 -> 23.
  EXPECT_EQ(resolve_schedule(d, 26, {5, 11, 17, 23}), steps({{5, 0.3}, {17, 0.3}, {23, 0.3}}));
  // Gemma 3 27B: 62 layers, global 5, 11, ..., 59. 0.3 -> 18 -> 17 (1 away; 23 is 5);
  // 0.6 -> 36 -> 35;  0.9 -> 55 -> 53 (2 away; 59 is 4).
  std::vector<int> g62;
  for (int l = 5; l < 62; l += 6) g62.push_back(l);
  EXPECT_EQ(resolve_schedule(d, 62, g62), steps({{17, 0.3}, {35, 0.3}, {53, 0.3}}));
  // Ties go to the earlier global layer: 0.5 of 16 -> 7, between 5 and 9.
  EXPECT_EQ(resolve_schedule(parse_schedule("0.5:0.2"), 16, {5, 9, 15}), steps({{5, 0.2}}));
  // Absolute layers are the user's: a local layer stays (docs/schedules.md says what it costs).
  EXPECT_EQ(resolve_schedule(parse_schedule("4:0.3,0.6:0.3"), 18, g18), steps({{4, 0.3}, {11, 0.3}}));
  // An absolute layer after the global layer a fraction moves to is an error naming the move.
  expect_error(
      [] {
        resolve_schedule(parse_schedule("12:0.3,0.7:0.3"), 18, {5, 11, 17});
      },
      "resolves to layer 11 (moved from sliding-window layer 12 to global layer 11) on a 18-layer "
      "model, not after step 1's layer 12");
  expect_error(
      [] {
        resolve_schedule(parse_schedule("6:0.3,0.45:0.3"), 18, {5, 11, 17});
      },
      "write absolute layers");
  // Two large shares that meet on a global layer would prune everything: refused, not rounded to 1.
  expect_error(
      [] {
        resolve_schedule(parse_schedule("0.6:0.999999999,0.65:0.999999999"), 18, {5, 11, 17});
      },
      "schedule step 2 (depth 0.65) moves to global layer 11 with the step before it, and together they "
      "would prune every token");
  // No global layer a prune can follow (the tiny gemma3: [LLLLLG]): fractions resolve as without
  // windows. No windows at all: the same.
  EXPECT_EQ(resolve_schedule(parse_schedule("0.5:0.3"), 6, {5}),
            resolve_schedule(parse_schedule("0.5:0.3"), 6));
  EXPECT_EQ(resolve_schedule(d, 30, {}), resolve_schedule(d, 30));
}

TEST(ScheduleRoundTrip, InlineText) {
  for (const char* text : {"0.3:0.3,0.6:0.3,0.9:0.3", "8:0.3,17:0.3,26:0.3", "0.5:0.5", "none", "0:0",
                           "0.001:0.999,3:0.123456789,0.9999:0.00001", "33.3%:12.5%,0.7:0.29"}) {
    const Schedule a = parse_schedule(text);
    const Schedule b = parse_schedule(a.to_string());
    expect_same(a, b);
    EXPECT_EQ(b.to_string(), a.to_string()) << text;
  }
  // Written percentages come back as fractions; tiny values print without an exponent.
  EXPECT_EQ(parse_schedule("30%:12.5%").to_string(), "0.3:0.125");
  EXPECT_EQ(parse_schedule("0.00001:0.00001").to_string(), "0.00001:0.00001");
  // Values that were never written as decimals (computed in code) round-trip too.
  const Schedule c{{{1.0 / 3, true, 2.0 / 7}, {20, false, 0.1 + 0.2}}};
  expect_same(parse_schedule(c.to_string()), c);
}

TEST_F(ScheduleFile, JsonRoundTripAndFormat) {
  const Schedule s = parse_schedule("8:0.3,0.6:0.3,26:12.5%");
  EXPECT_EQ(s.to_json().dump(),
            R"({"lazyprefill_schedule":1,"steps":[{"layer":8,"share":0.3},{"depth":0.6,"share":0.3},)"
            R"({"layer":26,"share":0.125}]})");
  expect_same(load_schedule_file(write("s.json", s.to_json().dump(2))), s);
  // Values computed in code survive the file too.
  const Schedule c{{{1.0 / 3, true, 2.0 / 7}, {20, false, 0.1 + 0.2}}};
  expect_same(load_schedule_file(write("c.json", c.to_json().dump())), c);
  expect_same(load_schedule_file(write("d.json", default_schedule().to_json().dump())), default_schedule());
  // No steps: a valid file meaning no pruning.
  EXPECT_TRUE(
      load_schedule_file(write("e.json", R"({"lazyprefill_schedule": 1, "steps": []})")).steps.empty());
  EXPECT_EQ(Schedule{}.to_json().dump(), R"({"lazyprefill_schedule":1,"steps":[]})");
}

TEST_F(ScheduleFile, ExampleFromTheDocs) {
  const std::string p = write("x.json", R"({"lazyprefill_schedule": 1, "steps": [
      {"layer": 8, "share": 0.3},
      {"depth": 0.6, "share": 0.3}]})");
  const Schedule s = load_schedule_file(p);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_FALSE(s.steps[0].fraction);
  EXPECT_TRUE(s.steps[1].fraction);
  EXPECT_EQ(resolve_schedule(s, 30), steps({{8, 0.3}, {17, 0.3}}));
}

TEST_F(ScheduleFile, RejectsFilesThatAreNotSchedules) {
  struct Case {
    const char* text;
    const char* why;
  };
  const Case cases[] = {
      {"0.3:0.3,0.6:0.3", "(not JSON: parse error at line 1"},
      {"", "(not JSON: "},
      {R"({"lazyprefill_schedule": 1, "steps": [})", "(not JSON: "},
      {"[1, 2]", "(expected a JSON object with \"lazyprefill_schedule\": 1 and \"steps\")"},
      {R"({"steps": []})", "(expected a JSON object with \"lazyprefill_schedule\""},
      {R"({"lazyprefill_schedule": 1})", "(\"steps\" must be an array)"},
      {R"({"lazyprefill_schedule": 1, "steps": {}})", "(\"steps\" must be an array)"},
      {R"({"lazyprefill_schedule": "1", "steps": []})",
       "(\"lazyprefill_schedule\" must be an integer version)"},
      {R"({"lazyprefill_schedule": 1, "steps": [], "note": "x"})", "(unknown key \"note\")"},
      {R"({"lazyprefill_schedule": 1, "steps": [8]})", "(step 1 is not an object)"},
      {R"({"lazyprefill_schedule": 1, "steps": [{"layer": 8, "share": 0.3, "shares": 0.1}]})",
       "(step 1: unknown key \"shares\""},
      {R"({"lazyprefill_schedule": 1, "steps": [{"layer": 8, "depth": 0.3, "share": 0.3}]})",
       "(step 1 must have exactly one of \"layer\" and \"depth\")"},
      {R"({"lazyprefill_schedule": 1, "steps": [{"layer": 2, "share": 0.1}, {"share": 0.3}]})",
       "(step 2 must have exactly one of \"layer\" and \"depth\")"},
      {R"({"lazyprefill_schedule": 1, "steps": [{"layer": 8}]})", "(step 1 has no \"share\")"},
      {R"({"lazyprefill_schedule": 1, "steps": [{"layer": 8.0, "share": 0.3}]})",
       "(step 1: \"layer\" must be an integer)"},
      {R"({"lazyprefill_schedule": 1, "steps": [{"layer": "8", "share": 0.3}]})",
       "(step 1: \"layer\" must be an integer)"},
      {R"({"lazyprefill_schedule": 1, "steps": [{"depth": "0.3", "share": 0.3}]})",
       "(step 1: \"depth\" must be a number)"},
      {R"({"lazyprefill_schedule": 1, "steps": [{"depth": 0.3, "share": null}]})",
       "(step 1: \"share\" must be a number)"},
      // Found by fuzz_schedule: a number JSON cannot hold escaped as a raw library exception.
      {R"({"lazyprefill_schedule": 1, "steps": [{"depth": 0.3, "share": 1e400}]})",
       "(not JSON: number overflow parsing '1e400')"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const std::string p = write("bad.json", c.text);
    expect_error([&] { load_schedule_file(p); }, p + ": not a schedule file " + c.why);
  }
}

TEST_F(ScheduleFile, RejectsBadValuesAndReadErrors) {
  const auto load = [&](const char* text) {
    const std::string p = write("v.json", text);
    return [p] { load_schedule_file(p); };
  };
  const std::string p = (dir_ / "v.json").string();
  expect_error(load(R"({"lazyprefill_schedule": 2, "steps": []})"),
               p + ": schedule file version 2 is not supported (this build reads version 1)");
  expect_error(load(R"({"lazyprefill_schedule": 1, "steps": [{"layer": -1, "share": 0.3}]})"),
               p + ": step 1: layer -1 is negative");
  expect_error(
      load(
          R"({"lazyprefill_schedule": 1, "steps": [{"depth": 0.3, "share": 0.1}, {"depth": 1.5, "share": 0.3}]})"),
      p + ": step 2: depth fraction 1.5 must be in (0, 1)");
  expect_error(load(R"({"lazyprefill_schedule": 1, "steps": [{"depth": 0, "share": 0.3}]})"),
               p + ": step 1: depth fraction 0 must be in (0, 1)");
  expect_error(load(R"({"lazyprefill_schedule": 1, "steps": [{"layer": 8, "share": 1}]})"),
               p + ": step 1: share 1 must be in [0, 1)");
  expect_error(
      load(
          R"({"lazyprefill_schedule": 1, "steps": [{"layer": 8, "share": 0.3}, {"layer": 8, "share": 0.3}]})"),
      p + ": layer 8 appears twice (steps 1 and 2)");
  expect_error(
      load(
          R"({"lazyprefill_schedule": 1, "steps": [{"depth": 0.6, "share": 0.3}, {"depth": 0.3, "share": 0.3}]})"),
      p + ": step 2 (depth 0.3) comes after step 1 (depth 0.6)");
  const std::string missing = (dir_ / "missing.json").string();
  expect_error([&] { load_schedule_file(missing); }, missing + ": cannot read schedule file");
  expect_error([&] { load_schedule_file(dir_.string()); },
               dir_.string() + ": is a directory, not a schedule file");
}

TEST_F(ScheduleFile, FromArgTakesAFileIfOneExistsElseInlineText) {
  const std::string p =
      write("s.json", R"({"lazyprefill_schedule": 1, "steps": [{"layer": 4, "share": 0.5}]})");
  const Schedule f = schedule_from_arg(p);
  ASSERT_EQ(f.steps.size(), 1u);
  EXPECT_EQ(f.steps[0].at, 4);
  expect_same(schedule_from_arg("0.3:0.3,0.6:0.3,0.9:0.3"), default_schedule());
  EXPECT_TRUE(schedule_from_arg("none").steps.empty());
  EXPECT_TRUE(schedule_from_arg("").steps.empty());
  // A mistyped path says so instead of complaining about the inline syntax.
  const std::string missing = (dir_ / "missing.json").string();
  expect_error([&] { schedule_from_arg(missing); }, missing + ": no such schedule file");
  expect_error([] { schedule_from_arg("sched.json"); }, "sched.json: no such schedule file");
  expect_error([] { schedule_from_arg("0.5:1.5"); }, "schedule item '0.5:1.5': share 1.5 must be in [0, 1)");
  const std::string bad = write("bad.json", "0.5:0.5");
  expect_error([&] { schedule_from_arg(bad); }, bad + ": not a schedule file (not JSON");
}

TEST(ScheduleHelp, ShowsTheDefaultAndItsExamplesParse) {
  const std::string help = kScheduleSyntaxHelp;
  EXPECT_NE(help.find(default_schedule().to_string()), std::string::npos);
  EXPECT_NE(help.find("8:0.3,17:0.3,26:0.3"), std::string::npos);
  EXPECT_EQ(resolve_schedule(parse_schedule("8:0.3,17:0.3,26:0.3"), 30),
            resolve_schedule(default_schedule(), 30));
  EXPECT_NE(help.find("\"lazyprefill_schedule\": 1"), std::string::npos);
  EXPECT_NE(help.find("none"), std::string::npos);
}

TEST(ScheduleTokensKept, RoundsTheSameWayEverywhere) {
  EXPECT_EQ(tokens_kept(1, 0.0), 1);
  EXPECT_EQ(tokens_kept(1, 0.3), 1);
  EXPECT_EQ(tokens_kept(1, 0.99), 1);
  EXPECT_EQ(tokens_kept(10, 0.0), 10);
  EXPECT_EQ(tokens_kept(111, 0.0), 111);
  EXPECT_EQ(tokens_kept(10, 0.3), 7);    // floor(3) = 3 pruned
  EXPECT_EQ(tokens_kept(111, 0.3), 78);  // 111 - floor(33.3) = 111 - 33
  EXPECT_EQ(tokens_kept(19, 0.5), 10);   // floor(9.5) = 9 pruned: odd counts keep the larger half
  EXPECT_EQ(tokens_kept(2, 0.5), 1);
  EXPECT_EQ(tokens_kept(3, 0.99), 1);       // floor(2.97) = 2 pruned
  EXPECT_EQ(tokens_kept(100, 0.99), 1);     // 99 pruned
  EXPECT_EQ(tokens_kept(1000, 0.9999), 1);  // floor(999.9) = 999 pruned
  // 0.29 * 100 is 28.999999999999996 and 0.57 * 100 is 56.99999999999999 in doubles; a share
  // written as a decimal still prunes what it says.
  EXPECT_EQ(tokens_kept(100, 0.29), 71);
  EXPECT_EQ(tokens_kept(100, 0.57), 43);
  EXPECT_EQ(tokens_kept(100, 0.14), 86);  // 14.000000000000002: no overshoot either
  EXPECT_EQ(tokens_kept(989, 0.3), 693);  // 989 - floor(296.7)
  EXPECT_EQ(tokens_kept(int64_t(1) << 40, 0.5), int64_t(1) << 39);
  // Progressive default on 111 tokens: 111 -> 78 -> 55 -> 39.
  EXPECT_EQ(tokens_kept(tokens_kept(tokens_kept(111, 0.3), 0.3), 0.3), 39);
  expect_error([] { tokens_kept(0, 0.3); }, "n_active 0 must be at least 1");
  expect_error([] { tokens_kept(10, 1.0); }, "share 1 must be in [0, 1)");
  expect_error([] { tokens_kept(10, -0.1); }, "share -0.1 must be in [0, 1)");
}

}  // namespace
}  // namespace lp
