// `validate`'s pipeline (calibrate/local_validation.h) on typed inputs: cases "measured" from a
// known profile (each op sample's time from that profile's cost formula, each TTFT from the
// simulator's replay of the case's own trace), so every figure the pipeline reports is known from
// the math; and speedups from rounds a shared machine slowed, whose paired ratios have a known
// median and range.
#include <gtest/gtest.h>

#include <cmath>

#include "calibrate/local_validation.h"
#include "model/error.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/replay.h"
#include "traces/synthetic.h"

namespace lp::calib {
namespace {

const sim::Precision kF32{"f32", "f32", "f32"};

// A case as the engine would report it on a machine whose profile is `truth`.
MeasuredCase measure(const LocalCase& lc, const ModelConfig& c, const hw::Profile& truth,
                     const std::vector<double>& machine) {
  MeasuredCase m;
  m.c = lc;
  m.trace = trace::synthetic_trace(c, lc.policy, resolve_schedule(parse_schedule(lc.schedule), c.n_layer),
                                   lc.tokens, 0);
  const sim::Prediction p = sim::replay(m.trace, c, truth, kF32);
  m.run.origin = lc.label();
  m.run.compute = "f32";
  m.run.prompt_tokens = lc.tokens;
  m.run.prefill_s = p.ttft_s;
  for (int l = 0; l < c.n_layer; ++l)
    for (size_t i = 0; i < kNumOps; ++i) {
      const sim::OpCost& o = p.prefill_layers[size_t(l)][i];
      if (o.calls == 0) continue;
      OpSample s{Op(i), l, double(lc.tokens), o.flops, o.bytes, 0, o.calls};
      s.seconds = predict_sample(truth, s, "f32");
      m.run.ops.push_back(s);
    }
  for (double f : machine) m.rounds_prefill_s.push_back(p.ttft_s * f);
  return m;
}

std::vector<MeasuredCase> measure_all(const hw::Profile& truth, const std::vector<double>& machine) {
  const ModelConfig c = preset_config("smollm2-135m");
  std::vector<MeasuredCase> cases;
  for (const LocalCase& lc : local_cases(true)) cases.push_back(measure(lc, c, truth, machine));
  return cases;
}

TEST(LocalValidation, TheGridAlternatesCalibrationAndHeldOutCases) {
  for (bool quick : {true, false}) {
    const std::vector<LocalCase> cases = local_cases(quick);
    ASSERT_EQ(cases.size(), 16u);
    EXPECT_EQ(cases.back().tokens, quick ? 2048 : 8192);
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(cases[i].train, (i / 4 + i % 4) % 2 == 0) << i;
      EXPECT_EQ(cases[i].policy == "none", i % 4 == 0) << i;  // every length has its unpruned run
    }
  }
  EXPECT_EQ((LocalCase{512, "lazyllm", "0.3:0.3,0.6:0.3", true}.label()), "512-lazyllm-0.3_0.3+0.6_0.3");
}

TEST(LocalValidation, HeldOutCasesArePredictedFromTheirOwnTraces) {
  const hw::Profile truth = hw::load_profile("cpu-local");
  const std::vector<MeasuredCase> cases = measure_all(truth, {1.0, 1.3, 0.95});
  const ModelConfig c = preset_config("smollm2-135m");
  const LocalValidation v = validate_local(truth, c, kF32, cases);
  EXPECT_EQ(v.train.size(), 8u);
  ASSERT_EQ(v.held.size(), 8u);
  size_t h = 0;
  for (const MeasuredCase& m : cases) {
    if (m.c.train) continue;
    const HeldOutCase& x = v.held[h++];
    EXPECT_EQ(x.c.label(), m.c.label());
    EXPECT_DOUBLE_EQ(x.measured_ms, m.run.prefill_s * 1e3);
    // The base profile is the machine's own: its prediction is the measurement, exactly.
    EXPECT_DOUBLE_EQ(x.base_predicted_ms, x.measured_ms);
    // The fit, started there on samples the profile explains, stays there.
    EXPECT_NEAR(x.error_pct, 0, 0.5) << x.c.label();
    EXPECT_NEAR(x.error_pct, 100 * (x.predicted_ms / x.measured_ms - 1), 1e-9);
    // Each op's measured time is its samples' sum over the layers.
    for (const OpCheck& o : x.ops) {
      double sum = 0;
      for (const OpSample& s : m.run.ops)
        if (s.op == o.op) sum += s.seconds * 1e3;
      EXPECT_NEAR(o.measured_ms, sum, 1e-12 * sum) << op_name(o.op);
    }
    const OpCheck* w = x.worst_op();
    ASSERT_NE(w, nullptr);
    EXPECT_GT(w->measured_ms, 0.05 * x.measured_ms);
  }
  EXPECT_EQ(v.base_mape_pct, 0);
  EXPECT_LT(v.mape_pct, 0.5);
}

// A machine that ran the pruned cases 2x slow only in round 2 of 4: each speedup's paired ratios
// are the true one three times and half of it once; the median of four is the mean of the middle
// two (the true one), the range from half the true one to it; the fastest runs' ratio is the true one.
TEST(LocalValidation, SpeedupsAreTheMedianOfTheRoundsPairedRatios) {
  const hw::Profile truth = hw::load_profile("cpu-local");
  std::vector<MeasuredCase> cases = measure_all(truth, {1.0, 1.1, 1.2, 0.9});
  for (MeasuredCase& m : cases)
    if (m.c.policy != "none") m.rounds_prefill_s[1] *= 2;
  const LocalValidation v = validate_local(truth, preset_config("smollm2-135m"), kF32, cases);
  ASSERT_EQ(v.speedups.size(), 12u);  // three pruned schedules at four lengths
  int within = 0;
  for (const SpeedupCheck& s : v.speedups) {
    const MeasuredCase& m = *std::find_if(cases.begin(), cases.end(),
                                          [&](const MeasuredCase& x) { return x.c.label() == s.c.label(); });
    const MeasuredCase& none = *std::find_if(cases.begin(), cases.end(), [&](const MeasuredCase& x) {
      return x.c.policy == "none" && x.c.tokens == m.c.tokens;
    });
    const double truth_ratio = none.run.prefill_s / m.run.prefill_s;
    EXPECT_NEAR(s.measured, truth_ratio, 1e-12 * truth_ratio) << s.c.label();
    EXPECT_NEAR(s.measured_min, truth_ratio / 2, 1e-12 * truth_ratio);
    EXPECT_NEAR(s.measured_max, truth_ratio, 1e-12 * truth_ratio);
    EXPECT_DOUBLE_EQ(s.fastest_runs, truth_ratio);
    EXPECT_EQ(s.held_out, !m.c.train || !none.c.train);
    EXPECT_NEAR(s.error_points, 100 * (s.predicted - s.measured), 1e-9);
    EXPECT_NEAR(s.predicted, truth_ratio, 0.01 * truth_ratio) << s.c.label();
    within += s.within_range;
    EXPECT_LE(std::fabs(s.error_points), v.worst_points);
  }
  EXPECT_EQ(v.within_range, within);
  EXPECT_GE(v.worst_points, v.worst_points_held_out);
}

TEST(LocalValidation, RefusesCasesItCannotCompare) {
  const hw::Profile truth = hw::load_profile("cpu-local");
  const ModelConfig c = preset_config("smollm2-135m");
  std::vector<MeasuredCase> cases = measure_all(truth, {1.0, 1.0});
  const auto refusal = [&] {
    try {
      (void)validate_local(truth, c, kF32, cases);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  cases[5].rounds_prefill_s.pop_back();
  EXPECT_NE(refusal().find("the same number of rounds"), std::string::npos) << refusal();
  cases[5].rounds_prefill_s.push_back(cases[5].rounds_prefill_s[0]);
  EXPECT_EQ(refusal(), "accepted");
  for (MeasuredCase& m : cases) m.c.train = true;
  EXPECT_NE(refusal().find("some must be and some held out"), std::string::npos) << refusal();
}

}  // namespace
}  // namespace lp::calib
