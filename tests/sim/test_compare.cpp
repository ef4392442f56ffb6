// compare's rows (sim/compare.h) on typed inputs: which methods appear at which lengths, the
// plain prefill first at speedup 1, every speedup and fit derived from the row's own figures,
// tensor parallelism refused with its reason where the model does not split, and each LazyLLM
// row pointing at its schedule.
#include <gtest/gtest.h>

#include "model/error.h"
#include "model/presets.h"
#include "sim/compare.h"
#include "sim/kv_predict.h"
#include "sim/replay.h"
#include "traces/synthetic.h"

namespace lp::sim {
namespace {

TEST(Compare, EveryMethodAtEveryLengthAgainstThePlainPrefill) {
  const ModelConfig c = preset_config("llama-3.1-70b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  CompareOptions o;
  o.devices = 8;
  o.prompt_tokens = {4, 131072};
  o.schedules = {parse_schedule("0.3:0.3,0.6:0.3,0.9:0.3"), parse_schedule("0.1:0.5,0.3:0.5,0.5:0.5")};
  o.kv_predict = preset_config("llama-3.1-8b");
  o.kv_predict_name = "llama-3.1-8b";
  const Precision p{"fp8", "fp8", "fp8"};
  const Comparison cmp = compare_methods(c, hw, p, o);
  EXPECT_EQ(cmp.tp_refused, "");
  ASSERT_EQ(cmp.tables.size(), 2u);
  // 4 tokens over 8 devices: no KV-Runahead partition.
  EXPECT_EQ(cmp.tables[0].rows.size(), 6u);
  ASSERT_EQ(cmp.tables[1].rows.size(), 8u);
  const CompareTable& t = cmp.tables[1];
  EXPECT_EQ(t.prompt_tokens, 131072);
  EXPECT_EQ(t.rows[0].method, "baseline: one device");
  EXPECT_EQ(t.rows[0].speedup, 1.0);
  EXPECT_DOUBLE_EQ(t.rows[0].ttft_s,
                   replay(trace::synthetic_trace(c, "none", {}, 131072, 0), c, hw, p).ttft_s);
  for (const CompareRow& r : t.rows) {
    EXPECT_FALSE(r.refused) << r.method;
    EXPECT_DOUBLE_EQ(r.speedup, t.rows[0].ttft_s / r.ttft_s) << r.method;
    EXPECT_EQ(r.fits, r.memory_bytes <= hw.memory_capacity) << r.method;
    EXPECT_EQ(r.devices, r.family.find("parallelism") != std::string::npos ||
                                 r.family.find("Runahead") != std::string::npos
                             ? 8
                             : 1)
        << r.method;
  }
  EXPECT_EQ(t.rows[1].accuracy, CompareAccuracy::Schedule);
  EXPECT_EQ(t.rows[1].schedule, 0u);
  EXPECT_EQ(t.rows[2].schedule, 1u);
  EXPECT_EQ(t.rows[2].method, "LazyLLM 0.1:0.5,0.3:0.5,0.5:0.5");
  EXPECT_EQ(t.rows[4].method, "LazyLLM + TP 8");
  EXPECT_EQ(t.rows[4].schedule, 0u);  // the combinations use the first schedule
  EXPECT_LT(t.rows[4].ttft_s, t.rows[3].ttft_s);
  EXPECT_EQ(t.rows[6].accuracy, CompareAccuracy::RunaheadLastRank);
  EXPECT_NE(t.rows[5].note.find("chunks"), std::string::npos);
  EXPECT_EQ(t.rows[7].accuracy, CompareAccuracy::KvPrediction);
  EXPECT_DOUBLE_EQ(t.rows[7].ttft_s, predict_kv_prediction(c, *o.kv_predict, hw, p, 131072).ttft_s);
  // The 70B model at 128k on one H100 does not fit (weights and K/V); over 8 it does.
  EXPECT_FALSE(t.rows[0].fits);
  EXPECT_TRUE(t.rows[3].fits);
}

TEST(Compare, TensorParallelismThatDoesNotSplitIsRefusedWithItsReason) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  CompareOptions o;
  o.devices = 3;
  o.prompt_tokens = {8192};
  o.schedules = {default_schedule()};
  const Comparison cmp = compare_methods(c, hw::load_profile("h100-sxm"), Precision{}, o);
  EXPECT_NE(cmp.tp_refused.find("32 attention heads"), std::string::npos) << cmp.tp_refused;
  const CompareRow& tp = cmp.tables[0].rows[2];
  EXPECT_TRUE(tp.refused);
  EXPECT_EQ(tp.note, cmp.tp_refused);
  EXPECT_EQ(tp.ttft_s, 0);
  EXPECT_EQ(cmp.tables[0].rows.size(), 5u);  // no LazyLLM + TP row; KV-Runahead still runs
  EXPECT_EQ(cmp.tables[0].rows[3].method, "KV-Runahead 3");
  o.schedules.clear();
  EXPECT_THROW(compare_methods(c, hw::load_profile("h100-sxm"), Precision{}, o), Error);
}

}  // namespace
}  // namespace lp::sim
