// Test utility: tiny GGUF files of the architectures the simulator costs but the engine does not run
// (deepseek2, gpt-oss), laid out as llama.cpp's converter writes them (key names, tensor names and
// shapes: docs/architectures.md "Files the simulator costs"). Every tensor is f32 zeros: only the
// metadata and the shapes matter to costing_config_from_gguf.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/gguf_writer.h"

namespace lp::testing {

struct CostedSpec {
  int n_layer = 3, n_embd = 64, n_head = 4, n_ff = 96, n_vocab = 64, n_ctx = 4096;
  // deepseek2: latent attention, routed and shared experts after dense leading layers.
  int q_lora = 32, kv_lora = 16, rope = 8, nope = 16, v_head = 16;
  int n_expert = 8, n_expert_used = 2, n_ff_exp = 16, n_shared = 1, n_ff_shexp = 16, dense_lead = 1;
  bool mqa_form = true;  // since 2025: head_count_kv 1, key_length_mla, attn_k_b/attn_v_b
  bool router_bias = true;
  // gpt-oss: GQA of head_dim-wide heads, the even layers sliding over `window` keys.
  int n_head_kv = 2, head_dim = 16, window = 8;
};

inline void add_zeros(GgufWriter& w, const std::string& name, const std::vector<int64_t>& ne) {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  w.add_tensor_f32(name, ne, std::vector<float>(size_t(n), 0.0f));
}

inline void add_costed_common(GgufWriter& w, const std::string& arch, const CostedSpec& s) {
  w.add_string("general.architecture", arch);
  w.add_string("general.name", "tiny-" + arch);
  w.add_u32(arch + ".block_count", uint32_t(s.n_layer));
  w.add_u32(arch + ".context_length", uint32_t(s.n_ctx));
  w.add_u32(arch + ".embedding_length", uint32_t(s.n_embd));
  w.add_u32(arch + ".attention.head_count", uint32_t(s.n_head));
  w.add_f32(arch + ".rope.freq_base", 10000.0f);
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.add_u32(arch + ".expert_count", uint32_t(s.n_expert));
  w.add_u32(arch + ".expert_used_count", uint32_t(s.n_expert_used));
  w.add_u32(arch + ".expert_feed_forward_length", uint32_t(s.n_ff_exp));
  add_zeros(w, "token_embd.weight", {s.n_embd, s.n_vocab});
  add_zeros(w, "output_norm.weight", {s.n_embd});
  add_zeros(w, "output.weight", {s.n_embd, s.n_vocab});
}

inline void add_experts(GgufWriter& w, const std::string& p, const CostedSpec& s, bool biases) {
  const int64_t D = s.n_embd, E = s.n_expert, Fe = s.n_ff_exp;
  add_zeros(w, p + "ffn_gate_inp.weight", {D, E});
  add_zeros(w, p + "ffn_gate_exps.weight", {D, Fe, E});
  add_zeros(w, p + "ffn_up_exps.weight", {D, Fe, E});
  add_zeros(w, p + "ffn_down_exps.weight", {Fe, D, E});
  if (!biases) return;
  add_zeros(w, p + "ffn_gate_inp.bias", {E});
  add_zeros(w, p + "ffn_gate_exps.bias", {Fe, E});
  add_zeros(w, p + "ffn_up_exps.bias", {Fe, E});
  add_zeros(w, p + "ffn_down_exps.bias", {D, E});
}

inline GgufWriter deepseek2_writer(const CostedSpec& s) {
  GgufWriter w;
  const std::string a = "deepseek2.";
  add_costed_common(w, "deepseek2", s);
  w.add_u32(a + "feed_forward_length", uint32_t(s.n_ff));
  w.add_u32(a + "leading_dense_block_count", uint32_t(s.dense_lead));
  if (s.q_lora > 0) w.add_u32(a + "attention.q_lora_rank", uint32_t(s.q_lora));
  w.add_u32(a + "attention.kv_lora_rank", uint32_t(s.kv_lora));
  w.add_u32(a + "rope.dimension_count", uint32_t(s.rope));
  if (s.mqa_form) {
    w.add_u32(a + "attention.head_count_kv", 1);
    w.add_u32(a + "attention.key_length", uint32_t(s.kv_lora + s.rope));
    w.add_u32(a + "attention.value_length", uint32_t(s.kv_lora));
    w.add_u32(a + "attention.key_length_mla", uint32_t(s.nope + s.rope));
    w.add_u32(a + "attention.value_length_mla", uint32_t(s.v_head));
  } else {
    w.add_u32(a + "attention.head_count_kv", uint32_t(s.n_head));
    w.add_u32(a + "attention.key_length", uint32_t(s.nope + s.rope));
    w.add_u32(a + "attention.value_length", uint32_t(s.v_head));
  }
  w.add_u32(a + "expert_shared_count", uint32_t(s.n_shared));
  w.add_f32(a + "expert_weights_scale", 2.5f);
  const int64_t D = s.n_embd, H = s.n_head, kl = s.kv_lora, dh = s.nope + s.rope;
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add_zeros(w, p + "attn_norm.weight", {D});
    if (s.q_lora > 0) {
      add_zeros(w, p + "attn_q_a.weight", {D, s.q_lora});
      add_zeros(w, p + "attn_q_a_norm.weight", {s.q_lora});
      add_zeros(w, p + "attn_q_b.weight", {s.q_lora, H * dh});
    } else {
      add_zeros(w, p + "attn_q.weight", {D, H * dh});
    }
    add_zeros(w, p + "attn_kv_a_mqa.weight", {D, kl + s.rope});
    add_zeros(w, p + "attn_kv_a_norm.weight", {kl});
    if (s.mqa_form) {
      add_zeros(w, p + "attn_k_b.weight", {s.nope, kl, H});
      add_zeros(w, p + "attn_v_b.weight", {kl, s.v_head, H});
    } else {
      add_zeros(w, p + "attn_kv_b.weight", {kl, H * (s.nope + s.v_head)});
    }
    add_zeros(w, p + "attn_output.weight", {H * s.v_head, D});
    add_zeros(w, p + "ffn_norm.weight", {D});
    if (l < s.dense_lead) {
      add_zeros(w, p + "ffn_gate.weight", {D, s.n_ff});
      add_zeros(w, p + "ffn_up.weight", {D, s.n_ff});
      add_zeros(w, p + "ffn_down.weight", {s.n_ff, D});
      continue;
    }
    add_experts(w, p, s, false);
    if (s.router_bias) add_zeros(w, p + "exp_probs_b.bias", {s.n_expert});
    if (s.n_shared > 0) {
      const int64_t S = int64_t(s.n_shared) * s.n_ff_shexp;
      add_zeros(w, p + "ffn_gate_shexp.weight", {D, S});
      add_zeros(w, p + "ffn_up_shexp.weight", {D, S});
      add_zeros(w, p + "ffn_down_shexp.weight", {S, D});
    }
  }
  return w;
}

inline GgufWriter gpt_oss_writer(const CostedSpec& s) {
  GgufWriter w;
  const std::string a = "gpt-oss.";
  add_costed_common(w, "gpt-oss", s);
  w.add_u32(a + "feed_forward_length", uint32_t(s.n_ff_exp));
  w.add_u32(a + "attention.head_count_kv", uint32_t(s.n_head_kv));
  w.add_u32(a + "attention.key_length", uint32_t(s.head_dim));
  w.add_u32(a + "attention.value_length", uint32_t(s.head_dim));
  w.add_u32(a + "rope.dimension_count", uint32_t(s.head_dim));
  w.add_u32(a + "attention.sliding_window", uint32_t(s.window));
  const int64_t D = s.n_embd, Q = int64_t(s.n_head) * s.head_dim, KV = int64_t(s.n_head_kv) * s.head_dim;
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add_zeros(w, p + "attn_norm.weight", {D});
    add_zeros(w, p + "attn_q.weight", {D, Q});
    add_zeros(w, p + "attn_k.weight", {D, KV});
    add_zeros(w, p + "attn_v.weight", {D, KV});
    add_zeros(w, p + "attn_q.bias", {Q});
    add_zeros(w, p + "attn_k.bias", {KV});
    add_zeros(w, p + "attn_v.bias", {KV});
    add_zeros(w, p + "attn_output.weight", {Q, D});
    add_zeros(w, p + "attn_output.bias", {D});
    add_zeros(w, p + "attn_sinks.weight", {s.n_head});
    add_zeros(w, p + "post_attention_norm.weight", {D});
    add_experts(w, p, s, true);
  }
  return w;
}

}  // namespace lp::testing
