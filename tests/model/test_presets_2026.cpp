// Issue 53's layer kinds and presets: the counts against the research file's hand computations
// (docs/research/model-configs-2026.md §21, checked there against the published totals), the
// window and chunk arithmetic against enumeration, latent attention's and the experts' op counts
// against their definitions, and the bad configurations each refused with one line naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/error.h"
#include "model/ops.h"
#include "model/presets.h"

namespace lp {
namespace {

struct Counts {
  const char* name;
  int64_t total, active;  // §21's computed figures (active: embedding and head included)
  double published_b;     // the published total, billions (text model)
};

TEST(Presets2026, ParameterCountsAreThePublishedComputations) {
  const Counts counts[] = {
      {"llama-3.2-1b", 1235814400, 1235814400, 1.23},
      {"llama-3.2-3b", 3212749824, 3212749824, 3.21},
      {"llama-3.3-70b", 70553706496, 70553706496, 70.6},
      {"llama-4-scout", 107769861120, 17172894720, 107.8},  // 109B with the vision encoder
      {"qwen3-0.6b", 596049920, 596049920, 0.6},
      {"qwen3-8b", 8190735360, 8190735360, 8.2},
      {"qwen3-32b", 32762123264, 32762123264, 32.8},
      {"qwen3-30b-a3b", 30532122624, 3353032704, 30.5},
      {"qwen3-235b-a22b", 235093634560, 22190763520, 235},
      {"gemma-3-1b", 999885952, 999885952, 1.0},
      {"gemma-3-4b", 3880263168, 3880263168, 3.88},      // 4.3B with SigLIP
      {"gemma-3-12b", 11766034176, 11766034176, 11.77},  // 12.2B with SigLIP
      {"gemma-3-27b", 27009346304, 27009346304, 27.0},
      {"mistral-small-24b", 23572403200, 23572403200, 23.57},  // the checkpoint's bf16 bytes / 2
      {"mixtral-8x7b", 46702792704, 12879925248, 46.7},
      {"mixtral-8x22b", 140630071296, 39161468928, 141},
      {"deepseek-v3", 671026419200, 37552297472, 671},
      {"deepseek-r1", 671026419200, 37552297472, 671},
      // OpenAI's 3.6B and 5.1B active leave out the input embedding (201,088 x 2,880).
      {"gpt-oss-20b", 20914757184, 3608307264 + 579133440, 21},
      {"gpt-oss-120b", 116829156672, 5132849472 + 579133440, 117},
  };
  for (const Counts& k : counts) {
    SCOPED_TRACE(k.name);
    const ModelConfig c = preset_config(k.name);
    EXPECT_EQ(c.n_params(), k.total);
    EXPECT_EQ(c.n_active_params(), k.active);
    EXPECT_NEAR(double(c.n_params()) / 1e9, k.published_b, 0.01 * k.published_b);
  }
}

TEST(Presets2026, LayerKindsAreThePublishedPatterns) {
  const ModelConfig g = preset_config("gemma-3-27b");  // global where (l + 1) % 6 == 0
  std::vector<int> want;
  for (int l = 5; l < 62; l += 6) want.push_back(l);
  EXPECT_EQ(g.global_layers(), want);
  EXPECT_EQ(g.window(0), 1024);
  const ModelConfig o = preset_config("gpt-oss-20b");  // even layers slide, odd are global
  EXPECT_EQ(o.window(0), 128);
  EXPECT_EQ(o.window(1), 0);
  EXPECT_EQ(o.global_layers().size(), 12u);
  const ModelConfig s = preset_config("llama-4-scout");  // NoPE layers 3, 7, ... global
  EXPECT_EQ(s.chunk(0), 8192);
  EXPECT_EQ(s.chunk(3), 0);
  EXPECT_EQ(s.global_layers().size(), 12u);
  const ModelConfig m = preset_config("mistral-7b");  // Mistral 7B v0.1: every layer slides
  EXPECT_TRUE(m.local_attention());
  EXPECT_TRUE(m.global_layers().empty());
  EXPECT_FALSE(preset_config("llama-3.1-8b").local_attention());

  const ModelConfig d = preset_config("deepseek-v3");
  EXPECT_FALSE(d.uniform());
  EXPECT_FALSE(d.layer(2).moe());
  EXPECT_TRUE(d.layer(3).moe());
  EXPECT_EQ(d.layer(3).n_expert_shared, 1);
  EXPECT_EQ(d.kv_token_elems(), 512 + 64);  // against 2 x 128 x 192 for its heads
  EXPECT_EQ(preset_config("qwen3-8b").kv_token_elems(), 2 * 8 * 128);
  EXPECT_NE(describe_layers(d).find("latent attention (512 + 64)"), std::string::npos);
  EXPECT_EQ(describe_layers(preset_config("llama-3.2-1b")), "dense");
}

// dense_pairs, visible_keys and kv_kept against a query-by-query enumeration of what each layer
// lets a query at position p see.
TEST(Presets2026, WindowAndChunkCountsAreTheEnumeratedOnes) {
  ModelConfig c;
  c.n_layer = 3;
  c.layer_window = {0, 5, 0};
  c.layer_chunk = {0, 0, 7};
  const auto sees = [&](int l, int64_t p, int64_t k) {  // may the query at p see the key at k <= p?
    if (c.window(l) > 0) return p - k < c.window(l);
    if (c.chunk(l) > 0) return p / c.chunk(l) == k / c.chunk(l);
    return true;
  };
  for (int l = 0; l < 3; ++l)
    for (int64_t n = 1; n <= 40; ++n) {
      int64_t pairs = 0, last = 0;
      for (int64_t p = 0; p < n; ++p)
        for (int64_t k = 0; k <= p; ++k)
          if (sees(l, p, k)) pairs += 1, last += p == n - 1;
      EXPECT_EQ(c.dense_pairs(l, n), pairs) << l << " " << n;
      EXPECT_EQ(c.visible_keys(l, n), last) << l << " " << n;
    }
  EXPECT_EQ(c.kv_kept(0, 100), 100);
  EXPECT_EQ(c.kv_kept(1, 100), 5);
  EXPECT_EQ(c.kv_kept(2, 100), 7);
  EXPECT_EQ(c.kv_kept(1, 3), 3);
}

// Latent attention's op counts from its definition (DeepSeek-V2 section 2.1): the projections the
// same per row in both forms, attention in the latent when decoding, the latent in memory.
TEST(Presets2026, LatentAttentionCountsAreItsDefinition) {
  const ModelConfig c = preset_config("deepseek-v3");
  const double D = 7168, H = 128, ql = 1536, kl = 512, rd = 64, Dh = 192, vh = 128;
  const double qkv_w = D * ql + ql * H * Dh + D * (kl + rd) + kl * H * (Dh - rd + vh);
  EXPECT_DOUBLE_EQ(op_flops(c, Op::QKV, {10, 0, 0}), 2 * 10 * qkv_w);
  EXPECT_DOUBLE_EQ(op_flops(c, Op::OProj, {10, 0, 0}), 2 * 10 * H * vh * D);
  OpShape prefill{100, 5050, 100}, decode{1, 100, 100, 0, true};
  EXPECT_DOUBLE_EQ(op_flops(c, Op::Attention, prefill), 5050 * H * (2 * (Dh + vh) + 5));
  EXPECT_DOUBLE_EQ(op_flops(c, Op::Attention, decode), 100 * H * (2 * (kl + rd) + 2 * kl + 5));
  const OpDtypes d{1, 2, 1, 2};  // fp8 weights and K/V, bf16 activations
  // Decoding reads the latent once for every head: 576 bytes a key in fp8, and appends its own.
  EXPECT_DOUBLE_EQ(op_bytes(c, Op::Attention, decode, d),
                   1 * H * ((kl + rd) + kl) * 2 + 1 * (kl + rd) * 1 + 100 * (kl + rd) * 1);
  // A prefill reads the keys and values expanded per head.
  EXPECT_DOUBLE_EQ(op_bytes(c, Op::Attention, prefill, d),
                   100 * H * (Dh + vh) * 2 + 100 * (kl + rd) * 1 + 100 * H * (Dh + vh) * 2);
}

// A MoE layer's FLOPs: k routed experts and the shared ones per row; the weights read are those
// of the experts the rows reach (E (1 - (1 - k/E)^T)) and every shared expert's.
TEST(Presets2026, ExpertCountsIncludeTheSharedExperts) {
  const ModelConfig c = preset_config("deepseek-v3").layer(10);
  const double D = 7168, Fe = 2048, k = 8, E = 256;
  const double per_expert = 6 * D * Fe + 5 * Fe;
  EXPECT_DOUBLE_EQ(op_flops(c, Op::Experts, {4, 0, 0}), 4 * (k * (per_expert + 2 * D) + per_expert + D));
  const OpDtypes d{1, 1, 1, 2};
  const double reached = E * (1 - std::pow(1 - k / E, 8.0));  // a decoding iteration of 8 requests
  const double weights = op_bytes(c, Op::Experts, {8, 0, 0}, d) - op_bytes(c, Op::Experts, {8, 0, 0, 1}, d);
  EXPECT_NEAR(weights, (reached - 1) * 3 * D * Fe, 1e-3);
  EXPECT_LT(reached, 64);  // 8 rows x 8 experts reach fewer than 64 distinct ones, far from 256
  EXPECT_GT(op_bytes(c, Op::Experts, {1, 0, 0, 8}, d), (8 + 1) * 3 * D * Fe);  // and the shared one
}

nlohmann::json tiny_moe() {
  return {{"arch", "x"},        {"n_layer", 4},   {"n_embd", 64},       {"n_head", 4},
          {"n_head_kv", 2},     {"head_dim", 16}, {"n_ff", 128},        {"n_vocab", 100},
          {"n_ctx_train", 512}, {"n_expert", 8},  {"n_expert_used", 2}, {"n_ff_exp", 32}};
}

TEST(Presets2026, InconsistentLayerKindsAreRefusedNamingTheField) {
  const auto refused = [](const nlohmann::json& j, const std::vector<std::string>& words) {
    SCOPED_TRACE(j.dump());
    try {
      config_from_json(j, "m.json");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      for (const std::string& w : words) EXPECT_NE(what.find(w), std::string::npos) << what << " lacks " << w;
    }
  };
  config_from_json(tiny_moe(), "m.json");  // the base is valid
  auto j = tiny_moe();
  j["n_expert_used"] = 9;
  refused(j, {"m.json", "n_expert_used 9", "n_expert 8"});
  j = tiny_moe();
  j["sliding_window"] = 0;
  refused(j, {"m.json", "sliding_window", "at least 1"});
  j = tiny_moe();
  j["sliding_window"] = 16;
  j["sliding_window_pattern"] = 1;  // every layer global: not a pattern
  refused(j, {"m.json", "sliding_window_pattern 1", "[2, 5]"});
  j["sliding_window_pattern"] = 2;
  EXPECT_EQ(config_from_json(j, "m.json").layer_window, (std::vector<int>{16, 0, 16, 0}));
  j = tiny_moe();
  j["layer_window"] = {4, -1, 0, 0};
  refused(j, {"m.json", "layer 1", "window"});
  j = tiny_moe();
  j["kv_lora_rank"] = 64;  // not below n_embd
  j["rope_dim"] = 8;
  j["n_head_kv"] = 4;
  refused(j, {"m.json", "kv_lora_rank 64", "n_embd 64"});
  j["kv_lora_rank"] = 32;
  j["n_head_kv"] = 2;
  refused(j, {"m.json", "n_head_kv", "n_head 4"});
  j["n_head_kv"] = 4;
  config_from_json(j, "m.json");
  j["rope_dim"] = 16;  // the whole head rotated leaves no no-RoPE part
  refused(j, {"m.json", "rope_dim 16", "head_dim 16"});
  j = tiny_moe();
  j["n_expert_shared"] = 1;
  refused(j, {"m.json", "n_ff_shexp"});
  j = tiny_moe();
  j["n_layer_dense_lead"] = 4;
  refused(j, {"m.json", "n_layer_dense_lead 4", "n_layer 4"});
  j = tiny_moe();
  j.erase("n_expert");
  j.erase("n_expert_used");
  j.erase("n_ff_exp");
  j["n_expert_shared"] = 1;
  j["n_ff_shexp"] = 8;
  refused(j, {"m.json", "need n_expert > 0"});
  j = tiny_moe();
  j["layer_window"] = {4, 0, 0, 0};
  j["layer_chunk"] = {4, 0, 0, 0};
  refused(j, {"m.json", "layer 0", "both"});
  j = tiny_moe();
  j["attn_sinks"] = "yes";
  refused(j, {"m.json", "attn_sinks", "true or false"});
}

}  // namespace
}  // namespace lp
