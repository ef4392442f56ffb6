#include "model/config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "model/error.h"
#include "model/gguf.h"
#include "model/json_checks.h"

namespace lp {

namespace {

// The architectures the engine runs: the Llama layout (token_embd, blk.N.attn_q/k/v/output,
// ffn_gate/up/down, RMSNorm, RoPE) and what each adds (docs/architectures.md). Mistral 7B ships as
// "llama".
constexpr std::string_view kSupportedArchs =
    "llama (Mixtral included), mistral, qwen2, qwen3, gemma3, qwen3moe";
bool supported_arch(const std::string& arch) {
  return arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3" ||
         arch == "qwen3moe";
}

int dim(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  const uint64_t v = f.get_uint(key);
  if (v < static_cast<uint64_t>(lo) || v > static_cast<uint64_t>(hi))
    fail("{}: metadata '{}' = {} is outside the plausible range [{}, {}]", f.path(), key, v, lo, hi);
  return static_cast<int>(v);
}

// Gemma 3's keys (docs/architectures.md section 5, as llama.cpp reads them): the sliding window and
// which layers have it, the local layers' RoPE base, the embedding and attention scales.
void read_gemma3(const GgufFile& f, ModelConfig& c) {
  const std::string a = "gemma3.";
  c.embed_scale = std::sqrt(float(c.n_embd));
  // The 27B model (62 layers) scales by 1/sqrt(D / H) (query_pre_attn_scalar 168), the others by
  // 1/sqrt(Dh): llama.cpp tells them apart by the layer count alone.
  if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(float(c.n_embd) / float(c.n_head));
  if (const auto cap = f.opt_float(a + "final_logit_softcapping"); cap && *cap != 0)
    fail("{}: {}final_logit_softcapping {} is not supported (Gemma 3 files have none)", f.path(), a, *cap);
  c.rope_theta_local = float(f.opt_float(a + "rope.freq_base_swa").value_or(10000.0));
  if (!(c.rope_theta_local > 0) || !std::isfinite(c.rope_theta_local))
    fail("{}: {}rope.freq_base_swa {} is invalid", f.path(), a, c.rope_theta_local);
  if (!f.has(a + "attention.sliding_window")) return;  // every layer global
  const uint64_t w = f.get_uint(a + "attention.sliding_window");
  if (w == 0 || w > uint64_t(c.n_ctx_train))
    fail("{}: {}attention.sliding_window {} is outside [1, context_length {}]", f.path(), a, w,
         c.n_ctx_train);
  // Which layers slide: a period P (the last layer of every P is global; 6 by default) or one flag
  // per layer (attention.sliding_window_pattern, as newer llama.cpp reads it).
  std::vector<bool> local(size_t(c.n_layer));
  const std::string pk = a + "attention.sliding_window_pattern";
  const GgufValue* pv = f.find(pk);
  if (pv && pv->type == GgufType::ARRAY) {
    const GgufArray& flags = f.get_array(pk);
    if (flags.elem_type != GgufType::BOOL || int64_t(flags.items.size()) != c.n_layer)
      fail("{}: {} must be {} booleans, one per layer", f.path(), pk, c.n_layer);
    for (size_t l = 0; l < flags.items.size(); ++l) local[l] = std::get<bool>(flags.items[l].v);
  } else {
    const uint64_t period = f.has(pk) ? f.get_uint(pk) : 6;
    if (period < 1 || period > uint64_t(c.n_layer) + 1)
      fail("{}: {} {} is outside [1, {}]", f.path(), pk, period, c.n_layer + 1);
    for (int l = 0; l < c.n_layer; ++l) local[size_t(l)] = uint64_t(l) % period < period - 1;
  }
  c.layer_window.assign(size_t(c.n_layer), 0);
  for (int l = 0; l < c.n_layer; ++l)
    if (local[size_t(l)]) c.layer_window[size_t(l)] = int(w);
}

// The experts' keys (qwen3moe; llama with expert_count: Mixtral): how many, how many a token uses, and
// their FFN width (expert_feed_forward_length, else feed_forward_length, Mixtral's). A file whose
// tensors disagree is refused by the shape checks that follow. llama.cpp gates both families by
// softmax and renormalizes the chosen experts' weights whatever the file says
// (expert_gating_func, expert_weights_norm and _scale are not read for them), and so does the engine.
void read_experts(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch + ".";
  c.n_expert = dim(f, a + "expert_count", 1, kMaxExperts);
  if (!f.has(a + "expert_used_count")) fail("{}: {}expert_used_count is missing", f.path(), a);
  const uint64_t used = f.get_uint(a + "expert_used_count");
  if (used < 1 || used > uint64_t(c.n_expert))
    fail("{}: {}expert_used_count {} is outside [1, expert_count {}]", f.path(), a, used, c.n_expert);
  c.n_expert_used = int(used);
  c.n_ff_exp =
      f.has(a + "expert_feed_forward_length") ? dim(f, a + "expert_feed_forward_length", 1, 1 << 18) : c.n_ff;
  if (f.has(a + "expert_shared_count") && f.get_uint(a + "expert_shared_count") > 0)
    fail("{}: {}expert_shared_count {}: shared experts are not supported", f.path(), a,
         f.get_uint(a + "expert_shared_count"));
}

// Shapes of a required tensor: ne[0] is the input width of a matrix [out][in].
void expect_shape(const GgufFile& f, const std::string& name, const std::vector<int64_t>& ne) {
  const GgufTensor& t = f.tensor(name);
  if (t.ne != ne)
    fail("{}: tensor '{}' has shape [{}], expected [{}]", f.path(), name, fmt::join(t.ne, ", "),
         fmt::join(ne, ", "));
}

// The vocabulary from token_embd's rows (checked against {arch}.vocab_size where the file has it), an
// untied head where output.weight exists, and the output norm's and head's shapes.
void read_vocabulary(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch + ".";
  const GgufTensor& emb = f.tensor("token_embd.weight");
  if (emb.ne.size() != 2 || emb.ne[0] != c.n_embd)
    fail("{}: token_embd.weight has shape [{}], expected [{}, vocab]", f.path(), fmt::join(emb.ne, ", "),
         c.n_embd);
  c.n_vocab = static_cast<int>(emb.ne[1]);
  if (f.has(a + "vocab_size") && f.get_uint(a + "vocab_size") != uint64_t(c.n_vocab))
    fail("{}: vocab_size {} differs from token_embd rows {}", f.path(), f.get_uint(a + "vocab_size"),
         c.n_vocab);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  expect_shape(f, "output_norm.weight", {c.n_embd});
  if (!c.tied_embeddings) expect_shape(f, "output.weight", {c.n_embd, c.n_vocab});
}

// The keys every architecture has: layers, width, query heads, training context, RoPE base and the
// norms' epsilon. The upper bounds are far above any released model but small enough that a corrupt
// value cannot drive an allocation past memory: plausibility checks, not limits of the format.
void read_common(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch + ".";
  c.name = f.opt_string("general.name").value_or("");
  c.n_layer = dim(f, a + "block_count", 1, 1024);
  c.n_embd = dim(f, a + "embedding_length", 1, 1 << 16);
  c.n_ff = dim(f, a + "feed_forward_length", 1, 1 << 18);
  c.n_head = dim(f, a + "attention.head_count", 1, 1024);
  c.n_ctx_train = dim(f, a + "context_length", 1, 1 << 24);
  c.rope_theta = static_cast<float>(f.opt_float(a + "rope.freq_base").value_or(10000.0));
  c.rms_eps = static_cast<float>(f.opt_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta) || !(c.rms_eps > 0) || c.rms_eps > 1)
    fail("{}: rope.freq_base {} or layer_norm_rms_epsilon {} is invalid", f.path(), c.rope_theta, c.rms_eps);
}

// The routed experts of a file the engine cannot run: count, top-k and width are required here.
void read_costed_experts(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch + ".";
  c.n_expert = dim(f, a + "expert_count", 1, kMaxExperts);
  c.n_expert_used = dim(f, a + "expert_used_count", 1, kMaxExperts);
  if (c.n_expert_used > c.n_expert)
    fail("{}: {}expert_used_count {} is outside [1, expert_count {}]", f.path(), a, c.n_expert_used,
         c.n_expert);
  c.n_ff_exp = dim(f, a + "expert_feed_forward_length", 1, 1 << 18);
}

// The routed experts' stacked tensors of layer prefix p (and their biases where `biases`).
void expect_experts(const GgufFile& f, const ModelConfig& c, const std::string& p, bool biases) {
  const int64_t D = c.n_embd, E = c.n_expert, Fe = c.n_ff_exp;
  expect_shape(f, p + "ffn_gate_inp.weight", {D, E});
  expect_shape(f, p + "ffn_gate_exps.weight", {D, Fe, E});
  expect_shape(f, p + "ffn_up_exps.weight", {D, Fe, E});
  expect_shape(f, p + "ffn_down_exps.weight", {Fe, D, E});
  if (!biases) return;
  expect_shape(f, p + "ffn_gate_exps.bias", {Fe, E});
  expect_shape(f, p + "ffn_up_exps.bias", {Fe, E});
  expect_shape(f, p + "ffn_down_exps.bias", {D, E});
}

// DeepSeek V2/V3 (general.architecture deepseek2, as llama.cpp's converter writes it): latent
// attention and routed plus shared experts after dense leading layers. Two forms of the attention
// keys exist: files converted since 2025 run MLA as one-head MQA over the latent (head_count_kv 1,
// key_length = kv_lora_rank + rope, value_length = kv_lora_rank, the heads' own widths in
// key_length_mla / value_length_mla, kv_b split into attn_k_b and attn_v_b); older files give
// head_count_kv = head_count, the heads' widths in key_length / value_length and one attn_kv_b.
// Either way the configuration is the model's: n_head_kv = n_head, head_dim 192, v_head_dim 128.
void read_deepseek2(const GgufFile& f, ModelConfig& c) {
  const std::string a = "deepseek2.";
  read_common(f, c);
  c.kv_lora_rank = dim(f, a + "attention.kv_lora_rank", 1, 1 << 16);
  c.q_lora_rank = f.has(a + "attention.q_lora_rank") ? dim(f, a + "attention.q_lora_rank", 0, 1 << 16) : 0;
  c.rope_dim = dim(f, a + "rope.dimension_count", 2, 1024);
  const bool mqa = f.has(a + "attention.key_length_mla");
  if (mqa) {
    c.head_dim = dim(f, a + "attention.key_length_mla", 1, 1024);
    c.v_head_dim = dim(f, a + "attention.value_length_mla", 1, 1024);
    const int kl = dim(f, a + "attention.key_length", 1, 1 << 17);
    if (int64_t(kl) != int64_t(c.kv_lora_rank) + c.rope_dim)
      fail(
          "{}: {}attention.key_length {} should be kv_lora_rank {} + rope.dimension_count {} (the cached "
          "latent "
          "and RoPE key)",
          f.path(), a, kl, c.kv_lora_rank, c.rope_dim);
  } else {
    c.head_dim = dim(f, a + "attention.key_length", 1, 1024);
    c.v_head_dim = dim(f, a + "attention.value_length", 1, 1024);
  }
  c.n_head_kv = c.n_head;
  read_costed_experts(f, c);
  c.n_layer_dense_lead =
      f.has(a + "leading_dense_block_count") ? dim(f, a + "leading_dense_block_count", 0, 1024) : 0;
  c.n_expert_shared =
      f.has(a + "expert_shared_count") ? dim(f, a + "expert_shared_count", 0, kMaxExperts) : 0;
  if (c.n_layer_dense_lead >= c.n_layer)
    fail("{}: {}leading_dense_block_count {} leaves no layer with experts (block_count {})", f.path(), a,
         c.n_layer_dense_lead, c.n_layer);
  const std::string first = "blk." + std::to_string(c.n_layer_dense_lead) + ".";
  if (c.n_expert_shared > 0) {  // the shared experts stacked in one MLP of n_expert_shared x n_ff_shexp
    const GgufTensor& sh = f.tensor(first + "ffn_gate_shexp.weight");
    if (sh.ne.size() != 2 || sh.ne[0] != c.n_embd || sh.ne[1] % c.n_expert_shared != 0)
      fail(
          "{}: tensor '{}ffn_gate_shexp.weight' has shape [{}], expected [{}, a multiple of "
          "expert_shared_count "
          "{}]",
          f.path(), first, fmt::join(sh.ne, ", "), c.n_embd, c.n_expert_shared);
    c.n_ff_shexp = int(sh.ne[1] / c.n_expert_shared);
  }
  c.router_bias = f.find_tensor(first + "exp_probs_b.bias") != nullptr;
  read_vocabulary(f, c);
  validate_config(c, f.path());

  const int64_t D = c.n_embd, H = c.n_head, ql = c.q_lora_rank, kl = c.kv_lora_rank;
  const int64_t nope = c.head_dim - c.rope_dim, v = c.v_head();
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expect_shape(f, p + "attn_norm.weight", {D});
    if (ql > 0) {
      expect_shape(f, p + "attn_q_a.weight", {D, ql});
      expect_shape(f, p + "attn_q_a_norm.weight", {ql});
      expect_shape(f, p + "attn_q_b.weight", {ql, H * c.head_dim});
    } else {
      expect_shape(f, p + "attn_q.weight", {D, H * c.head_dim});
    }
    expect_shape(f, p + "attn_kv_a_mqa.weight", {D, kl + c.rope_dim});
    expect_shape(f, p + "attn_kv_a_norm.weight", {kl});
    if (f.find_tensor(p + "attn_kv_b.weight")) {
      expect_shape(f, p + "attn_kv_b.weight", {kl, H * (nope + v)});
    } else {
      expect_shape(f, p + "attn_k_b.weight", {nope, kl, H});
      expect_shape(f, p + "attn_v_b.weight", {kl, v, H});
    }
    expect_shape(f, p + "attn_output.weight", {H * v, D});
    expect_shape(f, p + "ffn_norm.weight", {D});
    if (l < c.n_layer_dense_lead) {
      expect_shape(f, p + "ffn_gate.weight", {D, c.n_ff});
      expect_shape(f, p + "ffn_up.weight", {D, c.n_ff});
      expect_shape(f, p + "ffn_down.weight", {c.n_ff, D});
      continue;
    }
    expect_experts(f, c, p, false);
    if (c.router_bias) expect_shape(f, p + "exp_probs_b.bias", {c.n_expert});
    if (c.n_expert_shared > 0) {
      const int64_t S = int64_t(c.n_expert_shared) * c.n_ff_shexp;
      expect_shape(f, p + "ffn_gate_shexp.weight", {D, S});
      expect_shape(f, p + "ffn_up_shexp.weight", {D, S});
      expect_shape(f, p + "ffn_down_shexp.weight", {S, D});
    }
  }
}

// gpt-oss (general.architecture gpt-oss): GQA attention with biases and a sink logit per head,
// every layer's FFN experts with biases; the even layers slide over attention.sliding_window keys
// (llama.cpp's sliding-window pattern 2 for this architecture, the model card's alternating bands).
void read_gpt_oss(const GgufFile& f, ModelConfig& c) {
  const std::string a = "gpt-oss.";
  read_common(f, c);
  c.n_head_kv = dim(f, a + "attention.head_count_kv", 1, 1024);
  // The head width (64, not embedding_length / head_count): key_length, else the rotated width (the
  // whole head, as llama.cpp sizes these tensors).
  const std::string width_key =
      f.has(a + "attention.key_length") ? "attention.key_length" : "rope.dimension_count";
  c.head_dim = dim(f, a + width_key, 1, 1024);
  if (f.has(a + "attention.value_length") && f.get_uint(a + "attention.value_length") != uint64_t(c.head_dim))
    fail("{}: attention.value_length differs from key_length (not supported)", f.path());
  c.rope_dim = f.has(a + "rope.dimension_count") ? dim(f, a + "rope.dimension_count", 2, 1024) : c.head_dim;
  read_costed_experts(f, c);
  const int w = dim(f, a + "attention.sliding_window", 1, c.n_ctx_train);
  c.layer_window.assign(size_t(c.n_layer), 0);
  for (int l = 0; l < c.n_layer; l += 2) c.layer_window[size_t(l)] = w;
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.out_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
  c.attn_sinks = f.find_tensor("blk.0.attn_sinks.weight") != nullptr;
  c.router_bias = f.find_tensor("blk.0.ffn_gate_inp.bias") != nullptr;
  c.expert_bias = f.find_tensor("blk.0.ffn_gate_exps.bias") != nullptr;
  read_vocabulary(f, c);
  validate_config(c, f.path());

  const int64_t D = c.n_embd, Q = c.q_dim(), KV = c.kv_dim();
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expect_shape(f, p + "attn_norm.weight", {D});
    expect_shape(f, p + "attn_q.weight", {D, Q});
    expect_shape(f, p + "attn_k.weight", {D, KV});
    expect_shape(f, p + "attn_v.weight", {D, KV});
    expect_shape(f, p + "attn_output.weight", {Q, D});
    if (c.attention_bias) {
      expect_shape(f, p + "attn_q.bias", {Q});
      expect_shape(f, p + "attn_k.bias", {KV});
      expect_shape(f, p + "attn_v.bias", {KV});
    }
    if (c.out_bias) expect_shape(f, p + "attn_output.bias", {D});
    if (c.attn_sinks) expect_shape(f, p + "attn_sinks.weight", {c.n_head});
    expect_shape(f, p + "post_attention_norm.weight", {D});
    expect_experts(f, c, p, c.expert_bias);
    if (c.router_bias) expect_shape(f, p + "ffn_gate_inp.bias", {c.n_expert});
  }
}

}  // namespace

int64_t ModelConfig::n_params() const {
  int64_t total = int64_t(n_vocab) * n_embd * (tied_embeddings ? 1 : 2) + n_embd;
  for (int l = 0; l < n_layer; ++l) total += layer_params(l);
  return total;
}

int64_t ModelConfig::layer_params(int l) const {
  const int64_t D = n_embd;
  {
    const ModelConfig c = uniform() ? *this : layer(l);
    const int64_t H = c.n_head, Dh = c.head_dim, q = c.q_dim(), kv = c.kv_dim(), F = c.n_ff;
    int64_t attn = 0;
    if (c.mla()) {  // q (through its latent and norm, or direct), kv_a to the latent and RoPE key, its norm,
                    // kv_b
      const int64_t ql = c.q_lora_rank, kl = c.kv_lora_rank, nope = Dh - c.rope_dim;
      attn =
          (ql > 0 ? D * ql + ql + ql * q : D * q) + D * (kl + c.rope_dim) + kl + kl * H * (nope + c.v_head());
    } else {
      attn = D * q + 2 * D * kv + (c.attention_bias ? q + 2 * kv : 0) + (c.qk_norm ? 2 * Dh : 0);
    }
    attn += int64_t(c.v_dim()) * D + (c.out_bias ? D : 0) + (c.attn_sinks ? H : 0);
    int64_t ffn = 3 * D * F;
    if (c.moe()) {  // the routed experts (with their biases), the router, the shared experts
      const int64_t E = c.n_expert, Fe = c.n_ff_exp;
      ffn = E * (3 * D * Fe + (c.expert_bias ? 2 * Fe + D : 0)) + D * E + (c.router_bias ? E : 0) +
            int64_t(c.n_expert_shared) * 3 * D * c.n_ff_shexp;
    }
    return attn + ffn + 2 * D + (c.post_norms ? 2 * D : 0);
  }
}

int64_t ModelConfig::n_active_params() const {
  int64_t idle = 0;  // the routed experts a token does not use
  for (int l = 0; l < n_layer; ++l) {
    const ModelConfig c = uniform() ? *this : layer(l);
    if (c.moe())
      idle += int64_t(c.n_expert - c.n_expert_used) *
              (3 * int64_t(c.n_embd) * c.n_ff_exp + (c.expert_bias ? 2 * int64_t(c.n_ff_exp) + c.n_embd : 0));
  }
  return n_params() - idle;
}

int64_t ModelConfig::n_expert_params() const {
  int64_t n = 0;
  for (int l = 0; l < n_layer; ++l) n += layer_expert_params(l);
  return n;
}

int64_t ModelConfig::layer_expert_params(int l) const {
  const ModelConfig c = uniform() ? *this : layer(l);
  if (!c.moe()) return 0;
  const int64_t D = c.n_embd, Fe = c.n_ff_exp;
  return int64_t(c.n_expert) * (3 * D * Fe + (c.expert_bias ? 2 * Fe + D : 0)) +
         int64_t(c.n_expert_shared) * 3 * D * c.n_ff_shexp;
}

std::vector<int> ModelConfig::global_layers() const {
  std::vector<int> out;
  const auto local = [&](int l) { return window(l) > 0 || chunk(l) > 0; };
  if (!local_attention()) return out;
  for (int l = 0; l < n_layer; ++l)
    if (!local(l)) out.push_back(l);
  return out;
}

bool ModelConfig::local_attention() const {
  for (int l = 0; l < n_layer; ++l)
    if (window(l) > 0 || chunk(l) > 0) return true;
  return false;
}

int64_t ModelConfig::visible_keys(int l, int64_t n) const {
  if (n <= 0) return 0;
  if (const int64_t W = window(l); W > 0) return std::min(n, W);
  if (const int64_t C = chunk(l); C > 0) return (n - 1) % C + 1;
  return n;
}

int64_t ModelConfig::dense_pairs(int l, int64_t n) const {
  if (n <= 0) return 0;
  if (const int64_t W = window(l); W > 0 && n > W) return W * (W + 1) / 2 + (n - W) * W;
  if (const int64_t C = chunk(l); C > 0 && n > C) {
    const int64_t r = n % C;
    return n / C * (C * (C + 1) / 2) + r * (r + 1) / 2;
  }
  return n * (n + 1) / 2;
}

int64_t ModelConfig::kv_kept(int l, int64_t n) const {
  if (const int64_t W = window(l); W > 0) return std::min(n, W);
  if (const int64_t C = chunk(l); C > 0) return std::min(n, C);
  return n;
}

float ModelConfig::attention_scale() const {
  return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(float(head_dim));
}

ModelConfig ModelConfig::layer(int l) const {
  ModelConfig c = *this;
  c.layer_n_head.clear();
  c.layer_n_head_kv.clear();
  c.layer_n_ff.clear();
  if (!layer_n_head.empty()) c.n_head = layer_n_head.at(size_t(l));
  if (!layer_n_head_kv.empty()) c.n_head_kv = layer_n_head_kv.at(size_t(l));
  if (!layer_n_ff.empty()) c.n_ff = layer_n_ff.at(size_t(l));
  c.n_layer_dense_lead = 0;
  if (l < n_layer_dense_lead) {  // a dense leading layer: no router, no experts
    c.n_expert = c.n_expert_used = c.n_ff_exp = c.n_expert_shared = c.n_ff_shexp = 0;
    c.router_bias = c.expert_bias = false;
  }
  return c;
}

namespace {
// The optional fields of a configuration's JSON, written when set and read with their types
// checked: what later architectures add (docs/model-presets.md).
constexpr std::pair<const char*, bool ModelConfig::*> kOptionalFlags[] = {
    {"attention_bias", &ModelConfig::attention_bias},
    {"qk_norm", &ModelConfig::qk_norm},
    {"rope_neox", &ModelConfig::rope_neox},
    {"post_norms", &ModelConfig::post_norms},
    {"gelu", &ModelConfig::gelu},
    {"router_bias", &ModelConfig::router_bias},
    {"expert_bias", &ModelConfig::expert_bias},
    {"out_bias", &ModelConfig::out_bias},
    {"attn_sinks", &ModelConfig::attn_sinks}};
constexpr std::pair<const char*, int ModelConfig::*> kOptionalCounts[] = {
    {"n_expert", &ModelConfig::n_expert},       {"n_expert_used", &ModelConfig::n_expert_used},
    {"n_ff_exp", &ModelConfig::n_ff_exp},       {"n_expert_shared", &ModelConfig::n_expert_shared},
    {"n_ff_shexp", &ModelConfig::n_ff_shexp},   {"n_layer_dense_lead", &ModelConfig::n_layer_dense_lead},
    {"q_lora_rank", &ModelConfig::q_lora_rank}, {"kv_lora_rank", &ModelConfig::kv_lora_rank},
    {"v_head_dim", &ModelConfig::v_head_dim}};
}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> keys = {"arch",
                                   "name",
                                   "n_layer",
                                   "n_embd",
                                   "n_head",
                                   "n_head_kv",
                                   "head_dim",
                                   "n_ff",
                                   "n_vocab",
                                   "n_ctx_train",
                                   "rope_theta",
                                   "rms_eps",
                                   "tied_embeddings",
                                   "rope_dim",
                                   "layer_window",
                                   "layer_chunk",
                                   "sliding_window",
                                   "sliding_window_pattern",
                                   "layer_n_head",
                                   "layer_n_head_kv",
                                   "layer_n_ff"};
  for (const auto& [key, field] : kOptionalFlags) keys.push_back(key);
  for (const auto& [key, field] : kOptionalCounts) keys.push_back(key);
  return keys;
}

nlohmann::json config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"arch", c.arch},
                      {"n_layer", c.n_layer},
                      {"n_embd", c.n_embd},
                      {"n_head", c.n_head},
                      {"n_head_kv", c.n_head_kv},
                      {"head_dim", c.head_dim},
                      {"n_ff", c.n_ff},
                      {"n_vocab", c.n_vocab},
                      {"n_ctx_train", c.n_ctx_train},
                      {"tied_embeddings", c.tied_embeddings},
                      {"name", c.name}};
  if (c.rope_dim != c.head_dim) j["rope_dim"] = c.rope_dim;
  for (const auto& [key, field] : kOptionalFlags)
    if (c.*field) j[key] = true;
  for (const auto& [key, field] : kOptionalCounts)
    if (c.*field != 0) j[key] = c.*field;
  if (!c.layer_window.empty()) j["layer_window"] = c.layer_window;
  if (!c.layer_chunk.empty()) j["layer_chunk"] = c.layer_chunk;
  if (!c.layer_n_head.empty()) j["layer_n_head"] = c.layer_n_head;
  if (!c.layer_n_head_kv.empty()) j["layer_n_head_kv"] = c.layer_n_head_kv;
  if (!c.layer_n_ff.empty()) j["layer_n_ff"] = c.layer_n_ff;
  return j;
}

namespace {
// An integer field that fits an int: nlohmann's get<int>() would truncate 4294967297 to 1.
int int_value(const nlohmann::json& v, const std::string& what, const std::string& origin) {
  if (!v.is_number_integer()) fail("{}: {} must be an integer, got {}", origin, what, v.dump());
  const std::optional<int64_t> x = json_integer(v, INT32_MIN, INT32_MAX);
  if (!x) fail("{}: {} {} is out of range", origin, what, v.dump());
  return int(*x);
}
std::vector<int> int_array(const nlohmann::json& j, const char* key, const std::string& origin) {
  std::vector<int> out;
  if (!j.contains(key)) return out;
  if (!j[key].is_array()) fail("{}: {} must be an array of integers", origin, key);
  for (const auto& v : j[key]) out.push_back(int_value(v, key, origin));
  return out;
}
}  // namespace

ModelConfig config_from_json(const nlohmann::json& j, const std::string& origin) {
  ModelConfig c;
  if (!j.is_object()) fail("{}: a model configuration must be a JSON object", origin);
  try {
    c.arch = json_field<std::string>(j, "arch", origin);
    c.name = j.value("name", std::string());
    c.n_layer = json_field<int>(j, "n_layer", origin);
    if (c.n_layer > 1024) fail("{}: n_layer {} is over 1024", origin, c.n_layer);
    c.n_embd = json_field<int>(j, "n_embd", origin);
    c.n_head = json_field<int>(j, "n_head", origin);
    c.n_head_kv = json_field<int>(j, "n_head_kv", origin);
    c.head_dim = json_field<int>(j, "head_dim", origin);
    c.n_ff = json_field<int>(j, "n_ff", origin);
    c.n_vocab = json_field<int>(j, "n_vocab", origin);
    c.n_ctx_train = j.contains("n_ctx_train") ? json_field<int>(j, "n_ctx_train", origin) : 0;
    c.rope_dim = c.head_dim;
    c.rope_theta = j.value("rope_theta", 10000.0f);
    c.rms_eps = j.value("rms_eps", 1e-5f);
    c.tied_embeddings = j.value("tied_embeddings", false);
    for (const auto& [key, field] : kOptionalFlags) {
      if (j.contains(key) && !j[key].is_boolean())
        fail("{}: {} must be true or false, got {}", origin, key, j[key].dump());
      c.*field = j.value(key, false);
    }
    for (const auto& [key, field] : kOptionalCounts)
      c.*field = j.contains(key) ? int_value(j[key], key, origin) : 0;
    if (j.contains("rope_dim")) c.rope_dim = int_value(j["rope_dim"], "rope_dim", origin);
    c.layer_window = int_array(j, "layer_window", origin);
    c.layer_chunk = int_array(j, "layer_chunk", origin);
    // A window as a published config writes it: its size, and which layers slide (the last of
    // every sliding_window_pattern layers is global; absent: every layer slides, Mistral 7B v0.1).
    if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
      if (!c.layer_window.empty()) fail("{}: give sliding_window or layer_window, not both", origin);
      const int w = int_value(j["sliding_window"], "sliding_window", origin);
      if (w < 1) fail("{}: sliding_window must be at least 1, got {}", origin, w);
      const int period = j.contains("sliding_window_pattern")
                             ? int_value(j["sliding_window_pattern"], "sliding_window_pattern", origin)
                             : 0;
      if (period < 0 || period == 1 || period > c.n_layer + 1)
        fail("{}: sliding_window_pattern {} is outside [2, {}] (0 or absent: every layer slides)", origin,
             period, c.n_layer + 1);
      for (int l = 0; l < c.n_layer; ++l)
        c.layer_window.push_back(period == 0 || l % period < period - 1 ? w : 0);
    }
    c.layer_n_head = int_array(j, "layer_n_head", origin);
    c.layer_n_head_kv = int_array(j, "layer_n_head_kv", origin);
    c.layer_n_ff = int_array(j, "layer_n_ff", origin);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", origin, e.what());
  }
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0))
    fail("{}: rope_theta must be a positive finite number, got {}", origin, c.rope_theta);
  if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0))
    fail("{}: rms_eps must be a positive finite number, got {}", origin, c.rms_eps);
  validate_config(c, origin);
  return c;
}

void validate_config(const ModelConfig& c, const std::string& origin) {
  const auto pos = [&](const char* what, int v) {
    if (v <= 0) fail("{}: {} must be positive, got {}", origin, what, v);
  };
  pos("n_layer", c.n_layer);
  pos("n_embd", c.n_embd);
  pos("head_dim", c.head_dim);
  pos("n_vocab", c.n_vocab);
  if (c.n_ctx_train < 0) fail("{}: n_ctx_train must not be negative, got {}", origin, c.n_ctx_train);
  if (c.n_expert < 0 || c.n_expert > kMaxExperts)
    fail("{}: n_expert {} is outside [0, {}]", origin, c.n_expert, kMaxExperts);
  if (c.moe()) {
    if (c.n_expert_used < 1 || c.n_expert_used > c.n_expert)
      fail("{}: n_expert_used {} is outside [1, n_expert {}]", origin, c.n_expert_used, c.n_expert);
    pos("n_ff_exp", c.n_ff_exp);
  } else {
    const bool moe_only = c.n_expert_used != 0 || c.n_ff_exp != 0 || c.n_expert_shared != 0 ||
                          c.n_layer_dense_lead != 0 || c.router_bias || c.expert_bias;
    if (moe_only)
      fail(
          "{}: n_expert_used, n_ff_exp, shared experts, dense leading layers and router or expert biases "
          "need n_expert > 0",
          origin);
  }
  if (c.n_expert_shared < 0 || c.n_expert_shared > kMaxExperts)
    fail("{}: n_expert_shared {} is outside [0, {}]", origin, c.n_expert_shared, kMaxExperts);
  if (c.n_expert_shared > 0) pos("n_ff_shexp", c.n_ff_shexp);
  if (c.n_expert_shared == 0 && c.n_ff_shexp != 0)
    fail("{}: n_ff_shexp {} without shared experts (n_expert_shared 0)", origin, c.n_ff_shexp);
  if (c.n_layer_dense_lead < 0 || (c.moe() && c.n_layer_dense_lead >= c.n_layer))
    fail("{}: n_layer_dense_lead {} is outside [0, n_layer {}) (every layer dense: n_expert 0)", origin,
         c.n_layer_dense_lead, c.n_layer);
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    fail("{}: rope_dim {} must be even and in [2, head_dim {}]", origin, c.rope_dim, c.head_dim);
  if (c.v_head_dim < 0) fail("{}: v_head_dim must not be negative, got {}", origin, c.v_head_dim);
  if (c.q_lora_rank < 0 || c.kv_lora_rank < 0)
    fail("{}: q_lora_rank {} and kv_lora_rank {} must not be negative", origin, c.q_lora_rank,
         c.kv_lora_rank);
  if (c.mla()) {
    // A latent compresses the model's width: a rank at or above it would be a wider projection.
    if (c.kv_lora_rank >= c.n_embd || c.q_lora_rank >= c.n_embd)
      fail("{}: latent ranks (q_lora_rank {}, kv_lora_rank {}) must be below n_embd {}", origin,
           c.q_lora_rank, c.kv_lora_rank, c.n_embd);
    if (c.rope_dim >= c.head_dim)
      fail("{}: with latent attention rope_dim {} must be below head_dim {} (the rest is the no-RoPE part)",
           origin, c.rope_dim, c.head_dim);
    if (c.n_head_kv != c.n_head)
      fail(
          "{}: with latent attention n_head_kv must equal n_head {} (the latent expands to every head), got "
          "{}",
          origin, c.n_head, c.n_head_kv);
    if (!c.uniform() && (!c.layer_n_head.empty() || !c.layer_n_head_kv.empty()))
      fail("{}: latent attention with per-layer head counts is not supported", origin);
  } else if (c.q_lora_rank > 0) {
    fail("{}: q_lora_rank {} without kv_lora_rank (latent attention needs both or kv_lora_rank alone)",
         origin, c.q_lora_rank);
  }
  for (const auto* v : {&c.layer_n_head, &c.layer_n_head_kv, &c.layer_n_ff, &c.layer_window, &c.layer_chunk})
    if (!v->empty() && int(v->size()) != c.n_layer)
      fail("{}: per-layer arrays must have n_layer = {} entries, got {}", origin, c.n_layer, v->size());
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.window(l) < 0 || c.chunk(l) < 0)
      fail("{}: layer {}: a window or chunk of {} (0: none; else at least 1)", origin, l,
           std::min(c.window(l), c.chunk(l)));
    if (c.window(l) > 0 && c.chunk(l) > 0)
      fail("{}: layer {} has both a sliding window and an attention chunk", origin, l);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    const ModelConfig x = c.uniform() ? c : c.layer(l);
    pos("n_head", x.n_head);
    pos("n_head_kv", x.n_head_kv);
    pos("n_ff", x.n_ff);
    if (x.n_head % x.n_head_kv != 0)
      fail("{}: layer {}: n_head {} is not a multiple of n_head_kv {}", origin, l, x.n_head, x.n_head_kv);
  }
}

ModelConfig config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  if (!supported_arch(c.arch))
    fail("{}: general.architecture '{}' is not supported (supported: {})", f.path(), c.arch, kSupportedArchs);
  const std::string a = c.arch + ".";
  const bool gemma = c.arch == "gemma3";
  const bool qwen3 = c.arch == "qwen3" || c.arch == "qwen3moe";
  c.rope_neox = c.arch == "qwen2" || qwen3 || gemma;
  c.qk_norm = qwen3 || gemma;
  c.post_norms = c.gelu = gemma;
  read_common(f, c);
  c.n_head_kv =
      f.has(a + "attention.head_count_kv") ? dim(f, a + "attention.head_count_kv", 1, 1024) : c.n_head;
  // The head width: attention.key_length where the file has it (Qwen3's 16 x 128 heads are wider
  // than its 1,024-wide model), else embedding_length / head_count.
  if (f.has(a + "attention.key_length")) {
    c.head_dim = dim(f, a + "attention.key_length", 1, 1024);
  } else {
    if (c.n_embd % c.n_head != 0)
      fail("{}: embedding_length {} is not a multiple of head_count {}", f.path(), c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
  }
  if (f.has(a + "attention.value_length") && f.get_uint(a + "attention.value_length") != uint64_t(c.head_dim))
    fail("{}: attention.value_length differs from key_length (not supported)", f.path());
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: head_count {} is not a multiple of head_count_kv {}", f.path(), c.n_head, c.n_head_kv);
  c.rope_dim = f.has(a + "rope.dimension_count") ? dim(f, a + "rope.dimension_count", 2, 1024) : c.head_dim;
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
    fail("{}: rope.dimension_count {} does not fit head width {}", f.path(), c.rope_dim, c.head_dim);
  if (f.has(a + "rope.scaling.type")) {
    const std::string& st = f.get_string(a + "rope.scaling.type");
    if (gemma && st == "linear") {  // Gemma 3 4B and up: the global layers' positions scaled by 1/factor
      const double factor = f.opt_float(a + "rope.scaling.factor").value_or(1.0);
      if (!(factor >= 1 && factor <= 1024))
        fail("{}: {}rope.scaling.factor {} is outside [1, 1024]", f.path(), a, factor);
      c.rope_freq_scale = float(1.0 / factor);
    } else if (st != "none" && st != "llama3") {
      fail("{}: rope scaling '{}' is not supported", f.path(), st);
    }
  }
  if (gemma) read_gemma3(f, c);
  if (c.arch == "qwen3moe" || (f.has(a + "expert_count") && f.get_uint(a + "expert_count") > 0))
    read_experts(f, c);

  read_vocabulary(f, c);
  c.has_rope_freqs = f.find_tensor("rope_freqs.weight") != nullptr;

  // Shapes of every required tensor: ne[0] is the input width of a matrix [out][in].
  auto expect = [&](const std::string& name, const std::vector<int64_t>& ne) { expect_shape(f, name, ne); };
  const int64_t D = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff;
  // Q/K/V biases (Qwen2): all three or none, the same in every layer.
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  if (c.has_rope_freqs) expect("rope_freqs.weight", {c.rope_dim / 2});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expect(p + "attn_norm.weight", {D});
    expect(p + "attn_q.weight", {D, Q});
    expect(p + "attn_k.weight", {D, KV});
    expect(p + "attn_v.weight", {D, KV});
    expect(p + "attn_output.weight", {Q, D});
    for (const char* b : {"attn_q.bias", "attn_k.bias", "attn_v.bias"}) {
      const bool has = f.find_tensor(p + b) != nullptr;
      if (has != c.attention_bias)
        fail("{}: tensor '{}{}' is {} where blk.0 {} Q/K/V biases", f.path(), p, b,
             has ? "present" : "missing", c.attention_bias ? "has" : "has no");
    }
    if (c.attention_bias) {
      expect(p + "attn_q.bias", {Q});
      expect(p + "attn_k.bias", {KV});
      expect(p + "attn_v.bias", {KV});
    }
    if (c.qk_norm) {
      expect(p + "attn_q_norm.weight", {c.head_dim});
      expect(p + "attn_k_norm.weight", {c.head_dim});
    }
    if (c.post_norms) {
      expect(p + "post_attention_norm.weight", {D});
      expect(p + "post_ffw_norm.weight", {D});
    }
    expect(p + "ffn_norm.weight", {D});
    if (c.moe()) {
      // The experts stacked in 3-D tensors (llama.cpp's converters since 2024; files with one tensor
      // per expert, blk.N.ffn_gate.E.weight, are refused by the missing name).
      const int64_t E = c.n_expert, Fe = c.n_ff_exp;
      expect(p + "ffn_gate_inp.weight", {D, E});
      expect(p + "ffn_gate_exps.weight", {D, Fe, E});
      expect(p + "ffn_up_exps.weight", {D, Fe, E});
      expect(p + "ffn_down_exps.weight", {Fe, D, E});
      continue;
    }
    expect(p + "ffn_gate.weight", {D, F});
    expect(p + "ffn_up.weight", {D, F});
    expect(p + "ffn_down.weight", {F, D});
  }
  return c;
}

ModelConfig costing_config_from_gguf(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  if (arch != "deepseek2" && arch != "gpt-oss") {
    if (!supported_arch(arch))
      fail("{}: general.architecture '{}' cannot be costed (the simulator reads: {}, deepseek2, gpt-oss)",
           f.path(), arch, kSupportedArchs);
    return config_from_gguf(f);
  }
  ModelConfig c;
  c.arch = arch;
  if (arch == "deepseek2")
    read_deepseek2(f, c);
  else
    read_gpt_oss(f, c);
  return c;
}

std::vector<std::string> required_tensor_names(const ModelConfig& c) {
  std::vector<std::string> n = {"token_embd.weight", "output_norm.weight"};
  if (!c.tied_embeddings) n.push_back("output.weight");
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const char* s : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"})
      n.push_back(p + s + ".weight");
    for (const char* s : {"ffn_gate", "ffn_up", "ffn_down"})
      n.push_back(p + s + (c.moe() ? "_exps.weight" : ".weight"));
    if (c.moe()) n.push_back(p + "ffn_gate_inp.weight");
    if (c.attention_bias)
      for (const char* s : {"attn_q.bias", "attn_k.bias", "attn_v.bias"}) n.push_back(p + s);
    if (c.qk_norm)
      for (const char* s : {"attn_q_norm.weight", "attn_k_norm.weight"}) n.push_back(p + s);
    if (c.post_norms)
      for (const char* s : {"post_attention_norm.weight", "post_ffw_norm.weight"}) n.push_back(p + s);
  }
  return n;
}

}  // namespace lp
