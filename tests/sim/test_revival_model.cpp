// The revival model (sim/revival.h): its fit recovers a known decay, its stages map by depth,
// bad traces and bad files are refused naming what is wrong, and on recorded traces of the real
// model it predicts runs it was not fitted on.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "calibrate/revivals.h"
#include "model/error.h"
#include "model/presets.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "traces/synthetic.h"

namespace lp {
namespace {

using json = nlohmann::json;

const std::vector<PruneStep> kSteps = {{9, 0.3}, {19, 0.3}, {28, 0.3}};  // each prunes 30%

// Per-stage truths, small enough that the tokens lacking K/V never cap the revivals.
sim::RevivalStage truth(size_t i) {
  sim::RevivalStage s;
  s.start = 0.03 / double(i + 1);
  s.floor = 0.004;
  s.tau_steps = 3.0 + 2.0 * double(i);
  return s;
}

trace::Trace known_trace(int64_t prompt, int64_t steps) {
  const ModelConfig c = preset_config("llama-2-7b");
  return trace::synthetic_trace(c, "lazyllm", kSteps, prompt, steps, [](size_t stage, int64_t step) {
    return trace::StageRevival{truth(stage).share(step), 0.6};
  });
}

TEST(RevivalModel, ShareFormulaIsTheDecayItDocuments) {
  sim::RevivalStage s;
  s.start = 0.5;
  s.floor = 0.1;
  s.tau_steps = 2;
  EXPECT_DOUBLE_EQ(s.share(1), 0.5);
  EXPECT_NEAR(s.share(3), 0.1 + 0.4 * std::exp(-1.0), 1e-15);
  EXPECT_NEAR(s.share(1000), 0.1, 1e-15);
}

TEST(RevivalModel, FitRecoversAKnownDecay) {
  const std::vector<trace::Trace> ts = {known_trace(6000, 40), known_trace(9000, 30)};
  // The observed shares are the truth up to rounding to whole tokens.
  const auto obs = calib::observed_revival_shares(ts[0]);
  ASSERT_EQ(obs.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    for (size_t s = 0; s < obs[i].size(); ++s) {
      const double active = double(ts[0].steps[s + 1].attended[size_t(kSteps[i].layer + 1)] - 1);
      EXPECT_NEAR(obs[i][s], truth(i).share(int64_t(s + 1)), 0.5 / active + 1e-12);  // whole tokens
    }
  const sim::RevivalModel m = calib::fit_revival_model(ts, {"a", "b"}, {"1", "2"});
  ASSERT_EQ(m.stages.size(), 3u);
  EXPECT_EQ(m.n_layer, 32);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(m.stages[i].layer, kSteps[i].layer);
    EXPECT_NEAR(m.stages[i].start, truth(i).start, 5e-4);
    EXPECT_NEAR(m.stages[i].floor, truth(i).floor, 5e-4);
    EXPECT_NEAR(m.stages[i].tau_steps, truth(i).tau_steps, 0.1 * truth(i).tau_steps);
    EXPECT_LT(m.stages[i].rms_error, 2e-4);
    EXPECT_EQ(m.stages[i].points, 40 + 30);
    if (i > 0) {  // stage 0 has no rows revived before it
      EXPECT_NEAR(m.stages[i].survival, 0.6, 0.01);
    }
  }
  EXPECT_LT(m.stages[0].survival, 0);
  // The fitted model regenerates the traces' counts closely.
  const auto shares = sim::revival_shares(m, 32, kSteps, false);
  const trace::Trace again =
      trace::synthetic_trace(preset_config("llama-2-7b"), "lazyllm", kSteps, 7000, 35, shares);
  const trace::Trace ref = known_trace(7000, 35);
  int64_t a = 0, b = 0;
  for (size_t s = 1; s < ref.steps.size(); ++s)
    for (size_t l = 0; l < 32; ++l) a += again.steps[s].revived[l], b += ref.steps[s].revived[l];
  EXPECT_NEAR(double(a), double(b), 0.02 * double(b));
  // Round trip through the file format.
  const sim::RevivalModel back =
      sim::parse_revival_model(json::parse(sim::revival_model_json(m).dump()), "x");
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(back.stages[i].share(5), m.stages[i].share(5));
}

TEST(RevivalModel, StagesMapByRelativeDepthAndLayerCountsNeedMap) {
  sim::RevivalModel m = calib::fit_revival_model({known_trace(6000, 20)}, {"a"}, {"1"});
  m.origin = "fitted.json";
  // 32 layers fitted; a 64-layer target without --map is refused, naming the file and both counts.
  try {
    sim::revival_shares(m, 64, {{20, 0.7}}, false);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("fitted.json"), std::string::npos) << w;
    EXPECT_NE(w.find("32-layer"), std::string::npos) << w;
    EXPECT_NE(w.find("64 layers"), std::string::npos) << w;
  }
  // With --map: layer 20 of 64 (depth 21/64 = 0.33) takes the stage at layer 9 of 32 (0.31).
  const auto f = sim::revival_shares(m, 64, {{20, 0.7}, {58, 0.7}}, true);
  EXPECT_DOUBLE_EQ(f(0, 3).share, m.stages[0].share(3));
  EXPECT_DOUBLE_EQ(f(1, 3).share, m.stages[2].share(3));
  // The built-in model is a prior for any model: it maps without --map.
  const sim::RevivalModel b = sim::load_revival_model("builtin");
  EXPECT_TRUE(b.builtin);
  EXPECT_NO_THROW(sim::revival_shares(b, b.n_layer + 7, {{5, 0.7}}, false));
}

TEST(RevivalModel, BadTracesAreRefused) {
  const auto refused = [](const std::vector<trace::Trace>& ts, const std::string& part) {
    std::vector<std::string> names, shas;
    for (size_t i = 0; i < ts.size(); ++i)
      names.push_back("t" + std::to_string(i) + ".jsonl"), shas.push_back("s");
    try {
      calib::fit_revival_model(ts, names, shas);
      ADD_FAILURE() << "accepted; expected: " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const ModelConfig c = preset_config("llama-2-7b");
  refused({trace::synthetic_trace(c, "none", {}, 100, 3)}, "none run has no revivals");
  refused({known_trace(500, 0)}, "no decoding steps");
  refused({known_trace(500, 3), trace::synthetic_trace(c, "lazyllm", {{10, 0.5}}, 500, 3)},
          "fit one schedule");
  refused(
      {known_trace(500, 3), trace::synthetic_trace(preset_config("llama-2-13b"), "lazyllm", kSteps, 500, 3)},
      "fit one model at a time");
  trace::Trace old = known_trace(500, 3);
  old.steps[2].attended.clear();  // a trace written before 'attended' existed
  refused({old}, "lacks 'attended'");
}

TEST(RevivalModel, BadFilesAreRefused) {
  const json good = sim::revival_model_json(calib::fit_revival_model({known_trace(3000, 10)}, {"a"}, {"1"}));
  const auto refused = [](json j, const std::string& part) {
    try {
      sim::parse_revival_model(j, "m.json");
      ADD_FAILURE() << "accepted; expected: " << part;
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("m.json"), std::string::npos) << w;
      EXPECT_NE(w.find(part), std::string::npos) << w;
    }
  };
  json j = good;
  j["lazyprefill_revival_model"] = 2;
  refused(j, "version 2");
  j["lazyprefill_revival_model"] = 4294967297ULL;  // 2^32 + 1: read as an int it was 1
  refused(j, "version 4294967297");
  j.erase("lazyprefill_revival_model");  // found by fuzz_json_inputs: the message read the missing key
  refused(j, "version (none)");
  j = good;
  j["n_layer"] = 3e10;  // a float: converting it to int was undefined behaviour
  refused(j, "'n_layer' must be a non-negative integer");
  j = good;
  j["stages"][1]["start"] = 1.5;
  refused(j, "'start' must be in [0, 1]");
  j = good;
  j["stages"][0]["layer"] = 40;
  refused(j, "'layer' 40");
  j = good;
  j["stages"] = json::array();
  refused(j, "non-empty");
  j = good;
  j.erase("n_layer");
  refused(j, "missing 'n_layer'");
  j = good;
  j["stages"][2]["tau_steps"] = "x";
  refused(j, "field 'tau_steps' must be a number, got \"x\"");
  refused(json::array(), "not a JSON object");
  EXPECT_THROW(sim::load_revival_model("/nonexistent/m.json"), Error);
}

// Recorded traces of the real model (SmolLM2-135M Q4_1, LazyLLM, tests/fixtures/revivals): the
// built-in model was fitted on the fit/ ones; on the held-out ones its synthetic decoding must
// come within 10% of replaying each trace, in KV at the end and in the mean decoding step.
TEST(RevivalModel, BuiltInPredictsHeldOutRecordedRuns) {
  const std::filesystem::path dir = std::filesystem::path(LP_SOURCE_DIR) / "tests/fixtures/revivals/held-out";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  const sim::RevivalModel m = sim::load_revival_model("builtin");
  const hw::Profile hw = hw::load_profile("cpu-local");
  const sim::Precision prec{"f32", "f32", "f32"};
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const trace::Trace t = trace::read_trace(e.path().string());
    SCOPED_TRACE(e.path().filename().string());
    const ModelConfig c = config_from_json(t.header.model, "trace");
    std::vector<PruneStep> steps;
    for (const auto& [l, s] : t.header.schedule_layers) steps.push_back({l, s});
    const int64_t dec = int64_t(t.steps.size()) - 1;
    const trace::Trace syn = trace::synthetic_trace(c, t.header.policy, steps, t.header.prompt_tokens, dec,
                                                    sim::revival_shares(m, c.n_layer, steps, false));
    const sim::Prediction pr = sim::replay(t, c, hw, prec), pm = sim::replay(syn, c, hw, prec);
    EXPECT_NEAR(pm.memory.kv / pr.memory.kv, 1.0, 0.10);
    EXPECT_NEAR(pm.decode_step_mean_s() / pr.decode_step_mean_s(), 1.0, 0.10);
    // calibrate-revivals' check (calib::check_revival_model) reports exactly these figures.
    const calib::RevivalCheck k = calib::check_revival_model(m, t, "held", hw, prec, false);
    EXPECT_EQ(k.decode_steps, dec);
    EXPECT_EQ(k.replayed.kv_bytes, pr.memory.kv);
    EXPECT_EQ(k.model.kv_bytes, pm.memory.kv);
    EXPECT_EQ(k.model.decode_step_mean_s, pm.decode_step_mean_s());
    EXPECT_EQ(k.replayed.aux_bytes, pr.memory.aux);
    EXPECT_LT(k.share_0.rows_per_step, k.model.rows_per_step);  // no revivals: the new token alone
    EXPECT_GE(k.worst_step_error,
              std::abs(calib::RevivalCheck::rel(pm.decode_step_mean_s(), pr.decode_step_mean_s())) - 1e-12);
    ++n;
  }
  const ModelConfig c = preset_config("smollm2-135m");
  EXPECT_THROW(
      calib::check_revival_model(m, trace::synthetic_trace(c, "none", {}, 64, 4), "plain", hw, prec, false),
      UsageError);
  EXPECT_GE(n, 2);
  for (const sim::RevivalSource& s : m.traces)  // none of them is one it was fitted on
    for (const auto& e : std::filesystem::directory_iterator(dir))
      EXPECT_EQ(s.file.find(e.path().filename().string()), std::string::npos) << s.file;
}

}  // namespace
}  // namespace lp
