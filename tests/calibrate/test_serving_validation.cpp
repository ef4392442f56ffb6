// `validate --serving`'s pipeline (calibrate/serving_validation.h) on typed inputs: the load test
// read from the fixtures; a load test whose log is the simulation's own replay compares with no
// error at all, and one whose measured TTFTs at one rate are doubled shows exactly that rate
// outside its target by -50%; a machine made 20% slower at one rate shows as that drift.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "calibrate/serving_validation.h"
#include "model/error.h"
#include "model/presets.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp::calib {
namespace {

TEST(ServingValidation, ReadsTheLoadTestItWasGiven) {
  const LoadTest t = read_load_test(std::string(LP_SOURCE_DIR) + "/tests/fixtures/serving");
  EXPECT_EQ(t.rates, (std::vector<double>{0.1, 0.2, 0.3, 0.45, 0.6}));
  EXPECT_EQ(t.per_rate, 16);
  EXPECT_EQ(t.kv_budget_mib, 2048);  // from the summary's argv
  EXPECT_EQ(t.max_batch_tokens, 2048);
  ASSERT_EQ(t.methods.size(), 2u);
  for (const LoadTest::Method& m : t.methods) {
    EXPECT_EQ(m.log.size(), 80u) << m.name;  // the preflight request left out
    for (const sim::LoggedRequest& r : m.log) EXPECT_GE(r.prompt_tokens, 1189);
  }
}

TEST(ServingValidation, RefusesALoadTestItCannotUse) {
  testing::TempDir dir;
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.path() + "/" + name) << text;
  };
  const auto refusal = [&] {
    try {
      (void)read_load_test(dir.path());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal().find("serve_load_summary.json"), std::string::npos);  // none there
  write(
      "serve_load_summary.json",
      R"({"load": {"rates": [0.1], "requests_per_rate": 2}, "prompts": {"tokens": {"min": 1}}, "argv": []})");
  EXPECT_NE(refusal().find("at least 3 requests per rate"), std::string::npos) << refusal();
  write(
      "serve_load_summary.json",
      R"({"load": {"rates": [0.1], "requests_per_rate": 3}, "prompts": {"tokens": {"min": 1}}, "argv": []})");
  write(
      "requests_none.jsonl",
      R"({"arrival_s": 1, "admitted_s": 2, "first_token_s": 1.5, "finished_s": 3, "prompt_tokens": 5, "output_tokens": 2})"
      "\n");
  EXPECT_NE(refusal().find("requests_none.jsonl:1: times missing or out of order"), std::string::npos)
      << refusal();
  write(
      "requests_none.jsonl",
      R"({"arrival_s": 1, "admitted_s": 1, "first_token_s": 1.5, "finished_s": 3, "prompt_tokens": 5, "output_tokens": 2})"
      "\n");
  EXPECT_NE(refusal().find("1 requests, but the summary's 1 rates x 3 make 3"), std::string::npos)
      << refusal();
}

// A calibration made by hand: the default model's configuration on cpu-local, no fit.
ServingCalibration by_hand() {
  ServingCalibration cal;
  cal.model = preset_config("smollm2-135m");
  cal.precision = precision_for_dtype("Q4_1");
  cal.hw = hw::load_profile("cpu-local");
  for (const std::string name : {"none", "lazyllm"}) {
    const PolicyKind k = parse_policy(name);
    cal.methods[name] =
        sim::serving_method({k, k == PolicyKind::None ? Schedule{} : default_schedule()}, cal.model);
  }
  cal.config.kv_budget_bytes = 2048.0 * (1 << 20);
  cal.config.max_batch_tokens = 2048;
  return cal;
}

// A load test whose log is what the simulation predicts: three rates of 8 requests, each rate's
// requests starting 1000 s after the last (every rate alone), and each rate's times scaled by
// `slow[g]` (a machine that slows down) or its TTFTs by `ttft_times[g]`.
LoadTest simulated(const ServingCalibration& cal, std::vector<double> slow, std::vector<double> ttft_times) {
  LoadTest t;
  t.rates = {0.05, 0.1, 0.2};
  t.per_rate = 8;
  for (const std::string name : {"none", "lazyllm"}) {
    LoadTest::Method m{name, {}};
    for (size_t g = 0; g < t.rates.size(); ++g) {
      std::vector<sim::ServingRequest> reqs;
      for (int i = 0; i < 8; ++i) reqs.push_back({i / t.rates[g], 600 + 97 * i, 4 + i % 3});
      sim::ServingConfig cfg = cal.config;
      cfg.time_scale = slow[g];
      const sim::ServingRun run =
          sim::simulate_serving(cal.model, cal.hw, cal.precision, cal.methods.at(name), cfg, reqs);
      const double start = 1000.0 * double(g + 1);
      for (const sim::RequestOutcome& o : run.requests) {
        sim::LoggedRequest r;
        r.arrival_s = start + o.arrival_s;
        r.admitted_s = start + o.admitted_s;
        const double ttft = (o.first_token_s - o.arrival_s) * ttft_times[g];
        r.first_token_s = r.arrival_s + ttft;
        r.finished_s = r.first_token_s + (o.finished_s - o.first_token_s);
        r.prompt_tokens = o.prompt_tokens, r.output_tokens = o.output_tokens;
        m.log.push_back(r);
      }
    }
    t.methods.push_back(std::move(m));
  }
  return t;
}

TEST(ServingValidation, ItsOwnReplayComparesWithNoErrorAndADoubledTtftShows) {
  const ServingCalibration cal = by_hand();
  const LoadTest same = simulated(cal, {1, 1, 1}, {1, 1, 1});
  const MachineDrift none = machine_drift(same, cal);
  EXPECT_NEAR(none.largest, 0, 1e-9);
  const RateComparisons exact = compare_rates(same, cal, none);
  ASSERT_EQ(exact.rows.size(), 6u);  // 2 methods x 3 rates
  EXPECT_TRUE(exact.within_targets);
  EXPECT_TRUE(exact.outside.empty());
  for (const RateComparison& r : exact.rows)
    for (const Figure f : kFigures) {
      // Arrivals moved by 1000 s change no gap, but they round: within a part in a billion.
      EXPECT_NEAR(r.figures.at(f).error, 0, 1e-9) << r.method << " " << r.rate << " " << figure_key(f);
      // A percentile's measured interval holds the prediction (throughput's zero-width band with no
      // drift holds it only to the last bit, which the arrivals' shift does not keep).
      if (f != Figure::Throughput) {
        EXPECT_TRUE(r.figures.at(f).consistent) << r.method << " " << figure_key(f);
      }
    }
  EXPECT_TRUE(exact.rows[0].calibrated_on && !exact.rows[1].calibrated_on);

  // Measured TTFTs doubled at the second rate: predicted/measured - 1 = -50% there, only there
  // (compared without a drift band: this log's drift would read the doubling as the machine's).
  const LoadTest doubled = simulated(cal, {1, 1, 1}, {1, 2, 1});
  const RateComparisons off = compare_rates(doubled, cal, none);
  EXPECT_FALSE(off.within_targets);
  for (const RateComparison& r : off.rows) {
    const double want = r.rate == 0.1 ? -0.5 : 0;
    EXPECT_NEAR(r.figures.at(Figure::TtftP50).error, want, 1e-6) << r.method << " " << r.rate;
    EXPECT_NEAR(r.figures.at(Figure::TtftP90).error, want, 1e-6) << r.method << " " << r.rate;
  }
  int ttft_outside = 0;
  for (const OutsideTarget& o : off.outside) {
    EXPECT_EQ(o.rate, 0.1);
    EXPECT_EQ(off.rows[o.row].rate, 0.1);
    EXPECT_EQ(off.rows[o.row].method, o.method);
    if (o.figure == Figure::TtftP50 || o.figure == Figure::TtftP90) {
      EXPECT_NEAR(o.error, 0.5, 1e-6);
      EXPECT_TRUE(o.sampling.has_value());  // a percentile: how well 8 requests pin it
      ++ttft_outside;
    }
  }
  EXPECT_EQ(ttft_outside, 4);  // p50 and p90, both methods
}

TEST(ServingValidation, AMachineThatSlowsDownShowsAsDrift) {
  const ServingCalibration cal = by_hand();
  const LoadTest t = simulated(cal, {1, 1.2, 1}, {1, 1, 1});
  const MachineDrift d = machine_drift(t, cal);
  EXPECT_NEAR(d.largest, 0.2, 1e-6);
  for (const DriftPoint& p : d.by_rate) EXPECT_NEAR(p.drift, p.rate == 0.1 ? 0.2 : 0, 1e-6) << p.method;
  EXPECT_EQ(d.by_rate.size(), 6u);
}

}  // namespace
}  // namespace lp::calib
