// Tests for costing_config_from_gguf: DeepSeek V2/V3 (deepseek2) and gpt-oss files, which the engine
// cannot run, costed from their metadata and tensor shapes (tests/costed_gguf.h writes them as
// llama.cpp's converter lays them out). The parameter count the configuration implies is checked
// against the elements the file's tensors actually hold: two independent counts of the same model.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "tests/costed_gguf.h"
#include "tests/gguf_writer.h"

#ifndef LP_SOURCE_DIR
#define LP_SOURCE_DIR "."
#endif

namespace lp {
namespace {

using testing::CostedSpec;
using testing::GgufWriter;
using testing::TempDir;

int64_t total_elems(const GgufFile& f) {
  int64_t n = 0;
  for (const auto& t : f.tensors()) n += t.n_elems;
  return n;
}

ModelConfig costed(const TempDir& dir, const GgufWriter& w) {
  const std::string path = dir.file("m.gguf");
  w.write(path);
  return costing_config_from_gguf(GgufFile::open(path));
}

std::string costing_error(const TempDir& dir, const GgufWriter& w) {
  try {
    costed(dir, w);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected lp::Error from costing_config_from_gguf";
  return "";
}

TEST(CostingGguf, DeepSeek2BothAttentionFormsGiveTheModelsConfiguration) {
  TempDir dir;
  for (bool mqa : {true, false}) {
    CostedSpec s;
    s.mqa_form = mqa;
    const GgufWriter w = testing::deepseek2_writer(s);
    w.write(dir.file("ds.gguf"));
    const GgufFile f = GgufFile::open(dir.file("ds.gguf"));
    const ModelConfig c = costing_config_from_gguf(f);
    SCOPED_TRACE(mqa ? "MQA form" : "kv_b form");
    EXPECT_EQ(c.arch, "deepseek2");
    EXPECT_EQ(c.n_layer, 3);
    EXPECT_EQ(c.n_head, 4);
    EXPECT_EQ(c.n_head_kv, 4);  // the heads the latent expands to, whatever head_count_kv says
    EXPECT_EQ(c.head_dim, 24);  // nope 16 + rope 8
    EXPECT_EQ(c.v_head(), 16);
    EXPECT_EQ(c.rope_dim, 8);
    EXPECT_EQ(c.q_lora_rank, 32);
    EXPECT_EQ(c.kv_lora_rank, 16);
    EXPECT_EQ(c.kv_token_elems(), 16 + 8);
    EXPECT_EQ(c.n_expert, 8);
    EXPECT_EQ(c.n_expert_used, 2);
    EXPECT_EQ(c.n_ff_exp, 16);
    EXPECT_EQ(c.n_expert_shared, 1);
    EXPECT_EQ(c.n_ff_shexp, 16);
    EXPECT_EQ(c.n_layer_dense_lead, 1);
    EXPECT_EQ(c.n_ff, 96);
    EXPECT_TRUE(c.router_bias);
    EXPECT_FALSE(c.tied_embeddings);
    EXPECT_EQ(c.n_vocab, 64);
    EXPECT_EQ(c.n_params(), total_elems(f));
    // One token multiplies 2 of the 8 experts: the idle 6 of each of the 2 MoE layers' experts.
    EXPECT_EQ(c.n_params() - c.n_active_params(), 2 * 6 * 3 * 64 * 16);
  }
}

TEST(CostingGguf, DeepSeek2WithoutQueryLatentAndTwoSharedExperts) {
  TempDir dir;
  CostedSpec s;  // DeepSeek-V2-Lite's layout: queries projected directly
  s.q_lora = 0;
  s.n_shared = 2;
  s.n_ff_shexp = 12;
  s.router_bias = false;
  const GgufWriter w = testing::deepseek2_writer(s);
  w.write(dir.file("lite.gguf"));
  const GgufFile f = GgufFile::open(dir.file("lite.gguf"));
  const ModelConfig c = costing_config_from_gguf(f);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.n_expert_shared, 2);
  EXPECT_EQ(c.n_ff_shexp, 12);
  EXPECT_FALSE(c.router_bias);
  EXPECT_EQ(c.n_params(), total_elems(f));
}

TEST(CostingGguf, GptOssSlidesOnEvenLayersWithBiasesAndSinks) {
  TempDir dir;
  CostedSpec s;
  s.n_layer = 4;
  const GgufWriter w = testing::gpt_oss_writer(s);
  w.write(dir.file("oss.gguf"));
  const GgufFile f = GgufFile::open(dir.file("oss.gguf"));
  const ModelConfig c = costing_config_from_gguf(f);
  EXPECT_EQ(c.arch, "gpt-oss");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.layer_window, (std::vector<int>{8, 0, 8, 0}));
  EXPECT_EQ(c.global_layers(), (std::vector<int>{1, 3}));
  EXPECT_TRUE(c.attention_bias && c.out_bias && c.attn_sinks && c.router_bias && c.expert_bias);
  EXPECT_EQ(c.n_expert_shared, 0);
  EXPECT_EQ(c.n_params(), total_elems(f));
  // The K/V a sliding layer keeps stops at its window; a global layer's grows.
  EXPECT_EQ(c.kv_kept(0, 1000), 8);
  EXPECT_EQ(c.kv_kept(1, 1000), 1000);
}

TEST(CostingGguf, GptOssFileAtThePresetsShapeCostsAsThePreset) {
  // gpt-oss-20b's attention and routing (model/presets.json) written as a file: the configuration read
  // back has the preset's windows, biases, sinks and head widths.
  const ModelConfig p = preset_config("gpt-oss-20b");
  CostedSpec s;
  s.n_layer = 2;  // two layers, a narrow residual stream and few experts keep the file small (4 MB);
  s.n_embd = 64;  // the attention's heads and the experts' routing are the preset's
  s.n_head = p.n_head;
  s.n_head_kv = p.n_head_kv;
  s.head_dim = p.head_dim;
  s.n_expert = 4;
  s.n_expert_used = p.n_expert_used;
  s.n_ff_exp = 32;
  s.window = p.window(0);
  s.n_ctx = p.n_ctx_train;
  s.n_vocab = 8;
  TempDir dir;
  const ModelConfig c = costed(dir, testing::gpt_oss_writer(s));
  EXPECT_EQ(c.window(0), p.window(0));
  EXPECT_EQ(c.window(1), p.window(1));
  EXPECT_EQ(c.attention_bias, p.attention_bias);
  EXPECT_EQ(c.out_bias, p.out_bias);
  EXPECT_EQ(c.attn_sinks, p.attn_sinks);
  EXPECT_EQ(c.router_bias, p.router_bias);
  EXPECT_EQ(c.expert_bias, p.expert_bias);
  EXPECT_EQ(c.q_dim(), p.q_dim());
  EXPECT_EQ(c.kv_dim(), p.kv_dim());
}

// Files written by llama.cpp's own writer (gguf-py 0.19.0, fuzz/corpus/make_arch_seeds.py), not by
// tests/gguf_writer: the keys and tensor names are the converter library's, the counts its layout's.
TEST(CostingGguf, FilesWrittenByGgufPy) {
  const std::string dir = std::string(LP_SOURCE_DIR) + "/fuzz/corpus/gguf/";
  {
    const GgufFile f = GgufFile::open(dir + "tiny-deepseek2.gguf");
    const ModelConfig c = costing_config_from_gguf(f);
    EXPECT_EQ(c.head_dim, 6);
    EXPECT_EQ(c.v_head(), 4);
    EXPECT_EQ(c.n_head_kv, 2);
    EXPECT_EQ(c.kv_token_elems(), 4 + 2);
    EXPECT_EQ(c.n_layer_dense_lead, 1);
    EXPECT_EQ(c.n_expert_shared, 1);
    EXPECT_EQ(c.n_ff_shexp, 4);
    EXPECT_TRUE(c.router_bias);
    EXPECT_EQ(c.n_params(), total_elems(f));
  }
  {
    const GgufFile f = GgufFile::open(dir + "tiny-gpt-oss.gguf");
    const ModelConfig c = costing_config_from_gguf(f);
    EXPECT_EQ(c.layer_window, (std::vector<int>{8, 0}));
    EXPECT_TRUE(c.attention_bias && c.out_bias && c.attn_sinks && c.router_bias && c.expert_bias);
    EXPECT_EQ(c.n_params(), total_elems(f));
  }
}

TEST(CostingGguf, EngineArchitecturesAreReadAsTheEngineReadsThem) {
  TempDir dir;
  const std::string path = testing::write_tiny_model(dir.file("tiny.gguf"));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(config_to_json(costing_config_from_gguf(f)), config_to_json(config_from_gguf(f)));
}

TEST(CostingGguf, TheEngineStillRefusesWhatItCannotRun) {
  TempDir dir;
  testing::deepseek2_writer(CostedSpec{}).write(dir.file("ds.gguf"));
  try {
    config_from_gguf(GgufFile::open(dir.file("ds.gguf")));
    ADD_FAILURE() << "the engine accepted a deepseek2 file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'deepseek2' is not supported"), std::string::npos) << e.what();
  }
}

TEST(CostingGguf, InconsistentFilesGetOneLineNamingTheField) {
  TempDir dir;
  struct Case {
    const char* what;
    std::function<void(GgufWriter&)> edit;
    bool gpt_oss;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"top-k above the experts",
       [](GgufWriter& w) { w.set("deepseek2.expert_used_count", testing::GgufWriterValue::u32(9)); }, false,
       "expert_used_count 9 is outside [1, expert_count 8]"},
      {"latent key width",
       [](GgufWriter& w) { w.set("deepseek2.attention.key_length", testing::GgufWriterValue::u32(30)); },
       false, "attention.key_length 30 should be kv_lora_rank 16 + rope.dimension_count 8"},
      {"latent rank at the width",
       [](GgufWriter& w) {
         w.set("deepseek2.attention.kv_lora_rank", testing::GgufWriterValue::u32(64));
         w.set("deepseek2.attention.key_length", testing::GgufWriterValue::u32(72));
       },
       false, "latent ranks (q_lora_rank 32, kv_lora_rank 64) must be below n_embd 64"},
      {"every layer dense",
       [](GgufWriter& w) { w.set("deepseek2.leading_dense_block_count", testing::GgufWriterValue::u32(3)); },
       false, "leading_dense_block_count 3 leaves no layer with experts"},
      {"missing rank", [](GgufWriter& w) { w.remove("deepseek2.attention.kv_lora_rank"); }, false,
       "missing metadata key 'deepseek2.attention.kv_lora_rank'"},
      {"shared expert width",
       [](GgufWriter& w) { w.set("deepseek2.expert_shared_count", testing::GgufWriterValue::u32(3)); }, false,
       "a multiple of expert_shared_count 3"},
      {"a missing expert tensor", [](GgufWriter& w) { w.remove_tensor("blk.2.ffn_up_exps.weight"); }, false,
       "missing tensor 'blk.2.ffn_up_exps.weight'"},
      {"window of 0",
       [](GgufWriter& w) { w.set("gpt-oss.attention.sliding_window", testing::GgufWriterValue::u32(0)); },
       true, "gpt-oss.attention.sliding_window' = 0 is outside"},
      {"no window", [](GgufWriter& w) { w.remove("gpt-oss.attention.sliding_window"); }, true,
       "missing metadata key 'gpt-oss.attention.sliding_window'"},
      {"experts of another width",
       [](GgufWriter& w) { w.set("gpt-oss.expert_feed_forward_length", testing::GgufWriterValue::u32(17)); },
       true, "tensor 'blk.0.ffn_gate_exps.weight' has shape [64, 16, 8], expected [64, 17, 8]"},
      {"an unknown architecture",
       [](GgufWriter& w) { w.set("general.architecture", testing::GgufWriterValue::string("falcon")); }, true,
       "'falcon' cannot be costed (the simulator reads: "},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    GgufWriter w =
        k.gpt_oss ? testing::gpt_oss_writer(CostedSpec{}) : testing::deepseek2_writer(CostedSpec{});
    k.edit(w);
    const std::string e = costing_error(dir, w);
    EXPECT_NE(e.find(k.needle), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace lp
