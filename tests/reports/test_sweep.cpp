// sweep's steps (reports/sweep.h) on typed inputs: what an interrupted output keeps, which
// configurations remain, and a row's figures against the replay they come from.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/error.h"
#include "model/presets.h"
#include "reports/sweep.h"
#include "sim/replay.h"

namespace lp::report {
namespace {

SweepGrid grid() {
  SweepGrid g;
  g.hws = {hw::load_profile("h100-sxm"), hw::load_profile("l4")};
  g.model_names = {"llama-2-7b"};
  g.models = {preset_config("llama-2-7b")};  // a 4,096-token context
  g.methods = {Method{}, Method{PolicyKind::LazyLLM, default_schedule()}};
  g.lengths = {1024, 4096, 8192};
  g.new_tokens = 1;
  return g;
}

TEST(Sweep, TheConfigurationsLeftInGridOrder) {
  const SweepGrid g = grid();
  const std::vector<SweepConfig> all = sweep_configs(g, {}, "g");
  ASSERT_EQ(all.size(), 8u);  // 2 profiles x 2 methods x the 2 lengths within the context
  EXPECT_EQ(all[0].hw, 0u);
  EXPECT_EQ(all[0].tokens, 1024);
  EXPECT_EQ(all[1].tokens, 4096);
  EXPECT_EQ(all[2].method, 1u);
  EXPECT_EQ(all[4].hw, 1u);
  const std::set<std::string> done = {
      sweep_key("l4", "llama-2-7b", "lazyllm", default_schedule().to_string(), 4096)};
  const std::vector<SweepConfig> left = sweep_configs(g, done, "g");
  ASSERT_EQ(left.size(), 7u);
  EXPECT_EQ(left.back().tokens, 1024);
  SweepGrid huge = g;
  huge.lengths.assign(size_t(1) << 21, 512);
  EXPECT_THROW(sweep_configs(huge, {}, "huge.json"), Error);
}

TEST(Sweep, AnInterruptedOutputKeepsItsWholeRows) {
  const SweepGrid g = grid();
  const std::vector<SweepRevivals> revivals(2);
  const std::vector<SweepConfig> all = sweep_configs(g, {}, "g");
  const std::string a = sweep_row(g, all[0], revivals), b = sweep_row(g, all[2], revivals);
  const std::string text = a + "\n" + b + "\n" + b.substr(0, b.size() / 2);  // killed mid-row
  const SweepProgress p = sweep_progress(text, "out.jsonl");
  EXPECT_EQ(p.whole_bytes, a.size() + b.size() + 2);
  EXPECT_EQ(p.done.size(), 2u);
  EXPECT_TRUE(p.done.count(sweep_key("h100-sxm", "llama-2-7b", "none", "none", 1024)));
  // A row's figures are the replay's, pruned beside unpruned.
  const nlohmann::json r = nlohmann::json::parse(b);
  const sim::Prediction pr =
      sim::replay_synthetic(g.models[0], "lazyllm", resolve_schedule(default_schedule(), g.models[0].n_layer),
                            1024, 0, {}, g.hws[0], g.precision, 1);
  const sim::Prediction base =
      sim::replay_synthetic(g.models[0], "none", {}, 1024, 0, {}, g.hws[0], g.precision, 1);
  EXPECT_DOUBLE_EQ(r["ttft_ms"].get<double>(), pr.ttft_s * 1e3);
  EXPECT_DOUBLE_EQ(r["speedup"].get<double>(), base.ttft_s / pr.ttft_s);
  EXPECT_EQ(r["policy"], "lazyllm");
}

// Layouts: each row costs one GPU of its layout; DeepSeek-V3 in fp8 does not fit TP 8 H100s and
// does over two pipeline stages (said, not refused); a layout the profile cannot host or the model
// cannot split is a row with the error and null figures, and the rest of the grid still runs.
// A row written before layouts existed resumes as tp1.
TEST(Sweep, LayoutsThatDoNotFitOrSplitAreRowsNotErrors) {
  SweepGrid g;
  g.hws = {hw::load_profile("h100-sxm")};
  g.model_names = {"deepseek-v3", "qwen3-8b"};
  g.models = {preset_config("deepseek-v3"), preset_config("qwen3-8b")};
  g.methods = {Method{}};
  g.lengths = {8192};
  g.precision = {"fp8", "fp8", "fp8"};
  g.layouts = {{8, 1, 1, 1}, {8, 1, 1, 2}, {1, 16, 1, 1}, {16, 1, 1, 1}};
  const std::vector<SweepConfig> all = sweep_configs(g, {}, "g");
  ASSERT_EQ(all.size(), 8u);
  std::vector<nlohmann::json> rows;
  for (const SweepConfig& cf : all)
    rows.push_back(nlohmann::json::parse(sweep_row(g, cf, std::vector<SweepRevivals>(2))));
  EXPECT_EQ(rows[0]["layout"], "tp8");
  EXPECT_FALSE(rows[0]["fits_in_memory"].get<bool>());
  EXPECT_EQ(rows[1]["layout"], "tp8 pp2");
  EXPECT_TRUE(rows[1]["fits_in_memory"].get<bool>());
  EXPECT_EQ(rows[2]["layout"], "tp1 dp16");
  EXPECT_TRUE(rows[2]["fits_in_memory"].get<bool>());
  EXPECT_TRUE(rows[3]["ttft_ms"].is_null());
  EXPECT_NE(rows[3]["error"].get<std::string>().find("max_tp 8"), std::string::npos) << rows[3];
  EXPECT_TRUE(rows[6]["ttft_ms"].is_null());  // qwen3-8b with data-parallel attention: a dense model
  EXPECT_NE(rows[6]["error"].get<std::string>().find("no experts"), std::string::npos) << rows[6];
  EXPECT_GT(rows[4]["ttft_ms"].get<double>(), 0);
  const SweepProgress old =
      sweep_progress(R"({"hw": "h100-sxm", "model": "qwen3-8b", "policy": "none", "schedule": "none", )"
                     R"("prompt_tokens": 8192})"
                     "\n",
                     "old.jsonl");
  EXPECT_TRUE(old.done.count(sweep_key("h100-sxm", "qwen3-8b", "none", "none", 8192, "tp1")));
}

}  // namespace
}  // namespace lp::report
