// KV Prediction in the simulator (sim/kv_predict.h): the layer map, the predictor's FLOPs and
// weights from the two configurations' K/V widths, TTFT as the sum of its three parts, memory
// with both models, and the pairs that are refused.
#include <gtest/gtest.h>

#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "sim/kv_predict.h"

namespace lp {
namespace {

TEST(SimKvPredict, LayerMapUsesEveryAuxiliaryLayerInOrder) {
  const std::vector<int> m = sim::kv_predict_layer_map(36, 28);
  ASSERT_EQ(m.size(), 36u);
  EXPECT_EQ(m.front(), 0);
  EXPECT_EQ(m.back(), 27);
  for (size_t l = 1; l < m.size(); ++l) EXPECT_LE(m[l] - m[l - 1], 1) << l;  // in order, none skipped
  for (size_t l = 1; l < m.size(); ++l) EXPECT_GE(m[l], m[l - 1]) << l;
  EXPECT_EQ(sim::kv_predict_layer_map(4, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_THROW(sim::kv_predict_layer_map(4, 5), Error);
  EXPECT_THROW(sim::kv_predict_layer_map(4, 0), Error);
}

TEST(SimKvPredict, PartsAddUpAndThePredictorIsCountedFromTheWidths) {
  const ModelConfig base = preset_config("openelm-3b"), aux = preset_config("openelm-1.1b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const sim::Precision p{"bf16", "bf16", "bf16"};
  const int64_t n = 2048;
  const sim::KvPredictPrediction r = sim::predict_kv_prediction(base, aux, hw, p, n);
  EXPECT_NEAR(r.ttft_s, r.aux_prefill_s + r.predictor_s + r.base_token_s, 1e-15);
  // Two maps (K and V) per base layer: N x kv_aux(a(l)) by kv_aux x kv_base(l), 2 FLOPs a MAC.
  double flops = 0, weights = 0;
  for (int l = 0; l < base.n_layer; ++l) {
    const double ka = aux.layer(r.layer_map[size_t(l)]).kv_dim(), kb = base.layer(l).kv_dim();
    flops += 2 * 2.0 * double(n) * ka * kb;
    weights += 2 * ka * kb * 2;  // bf16
  }
  EXPECT_DOUBLE_EQ(r.predictor_flops, flops);
  EXPECT_DOUBLE_EQ(r.predictor_weight_bytes, weights);
  EXPECT_DOUBLE_EQ(r.memory.weights, double(base.n_params() + aux.n_params()) * 2 + weights);
  // The auxiliary model is smaller, so its prefill is cheaper than the base's; the base's one row
  // is cheaper still than its prefill.
  EXPECT_LT(r.aux_prefill_s, r.baseline_ttft_s);
  EXPECT_LT(r.base_token_s, r.baseline_ttft_s);
  EXPECT_LT(r.ttft_s, r.baseline_ttft_s);
  // Longer prompts: the prefill's quadratic attention grows the gap.
  const sim::KvPredictPrediction l = sim::predict_kv_prediction(base, aux, hw, p, 16 * n);
  EXPECT_GT(l.baseline_ttft_s / l.ttft_s, r.baseline_ttft_s / r.ttft_s);
}

TEST(SimKvPredict, PairsThatCannotWorkAreRefused) {
  const auto msg = [](const char* b, const char* a) {
    try {
      sim::check_kv_predict_pair(preset_config(b), b, preset_config(a), a);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(msg("openelm-3b", "openelm-1.1b"), "");
  EXPECT_EQ(msg("llama-3.1-70b", "llama-3.1-8b"), "");
  EXPECT_NE(msg("llama-3.1-8b", "smollm2-135m").find("vocabulary (49152 tokens) is not the base"),
            std::string::npos);
  EXPECT_NE(msg("smollm2-1.7b", "smollm2-135m").find("30 layers, more than"), std::string::npos);
  EXPECT_NE(msg("llama-3.1-8b", "llama-3.1-8b").find("not fewer than"), std::string::npos);
  EXPECT_NE(msg("llama-3.1-8b", "llama-3.1-70b").find("80 layers, more than"), std::string::npos);
}

}  // namespace
}  // namespace lp
