// ModelConfig: the shape of a decoder-only transformer of the Llama family and its descendants
// (Qwen2/2.5, Qwen3, Gemma 3), read from GGUF metadata ({arch}.* keys; docs/architectures.md says what each
// architecture's file holds and how llama.cpp computes it).
//
// Dimension names used throughout the project:
//   T tokens, D model width, H query heads, Hkv kv heads, Dh head width, F ffn width, V vocab,
//   L layers.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lp {

class GgufFile;

// The most experts a layer may have (released models: 8 to 384); a plausibility bound on the file's count.
inline constexpr int kMaxExperts = 1024;

struct ModelConfig {
  std::string arch;   // general.architecture: "llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen3moe"
  std::string name;   // general.name, informational
  int n_layer = 0;    // L
  int n_embd = 0;     // D
  int n_head = 0;     // H
  int n_head_kv = 0;  // Hkv (GQA when < H)
  int head_dim = 0;   // Dh
  int n_ff = 0;       // F
  int n_vocab = 0;    // V
  int n_ctx_train = 0;
  int rope_dim = 0;  // rotated dimensions per head (Dh for Llama)
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  // LM head reuses token_embd (no output.weight)
  bool has_rope_freqs = false;   // Llama 3.1 style per-dimension frequency factors
  bool attention_bias = false;   // q/k/v projections carry biases (Qwen2)
  // RoPE rotates the pairs (i, i + rope_dim/2) ("NEOX", Qwen) rather than (2i, 2i+1) (Llama, whose
  // GGUF Q/K rows are permuted for it). The engine runs one rotation: load_weights permutes a NEOX
  // model's Q/K rows (and their biases and norm weights) into the adjacent-pair order, which leaves
  // every q.k product, and so the model, unchanged (kernels/weights.h).
  bool rope_neox = false;
  bool qk_norm = false;  // per-head RMSNorm of q and k before RoPE (Qwen3), weights [Dh] each
  // Gemma 3's additions (docs/architectures.md section 5); the defaults are the Llama layout.
  float embed_scale = 1.0f;  // the embeddings times this (Gemma: sqrt(D), in f32)
  bool post_norms = false;   // RMSNorm of the attention and FFN outputs before each residual add
  bool gelu = false;         // the gated activation is GELU (tanh form): GeGLU, not SwiGLU
  float attn_scale = 0;      // attention logits' scale; 0: 1/sqrt(Dh)
  // Sliding-window layers: layer_window[l] > 0 hides from a query every key that many positions or
  // more before it (Gemma 3's local layers); empty: every layer global.
  std::vector<int> layer_window;
  // RoPE of the sliding-window layers: their own base, and no frequency scaling (Gemma 3); a global
  // layer's angle is pos * rope_freq_scale * rope_theta^(-2i/d) (1/rope.scaling.factor, linear).
  float rope_theta_local = 10000.0f;
  float rope_freq_scale = 1.0f;
  // Mixture of experts (Qwen3-MoE, Mixtral): every layer's FFN is n_expert gated MLPs of width n_ff_exp
  // behind a router; each token goes through the n_expert_used with the highest softmax(router)
  // probabilities, their outputs weighted by those probabilities renormalized to sum to 1 (as llama.cpp
  // runs both). n_expert 0: dense (the FFN of width n_ff). n_ff is then unused by the engine.
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  // What the simulator prices beyond what the engine runs (docs/architectures.md; the GGUF reader
  // refuses files that need them). Shared experts: every token also goes through n_expert_shared
  // gated MLPs of width n_ff_shexp, unweighted (DeepSeek-V3: 1 of 2,048; Llama 4: 1 of 8,192).
  int n_expert_shared = 0;
  int n_ff_shexp = 0;
  // The first n_layer_dense_lead layers have a dense FFN of width n_ff, the rest experts
  // (DeepSeek-V3's first_k_dense_replace 3). layer(l) gives each its own shape.
  int n_layer_dense_lead = 0;
  bool router_bias = false;  // a bias per expert on the router's logits (DeepSeek-V3, gpt-oss)
  bool expert_bias = false;  // biases on each expert's gate|up and down (gpt-oss)
  bool out_bias = false;     // the attention output projection has a bias (gpt-oss)
  bool attn_sinks = false;   // a learned logit per head joins every softmax row (gpt-oss)
  // Multi-head latent attention (DeepSeek V2/V3) when kv_lora_rank > 0: K/V cached as one latent of
  // kv_lora_rank plus a shared RoPE key of rope_dim per token and layer; queries through a latent of
  // q_lora_rank (0: a direct projection); head_dim is the query/key width (nope + rope_dim, 192) and
  // v_head_dim the value width (128). n_head_kv = n_head: the heads the latent expands to.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int v_head_dim = 0;  // 0: head_dim
  // The simulator's expert parallelism (sim::expert_parallel, applied by tp_shard): the experts
  // spread whole over `ep` GPUs of the tensor-parallel group, n_expert then a GPU's share; and the
  // busiest GPU's routed pairs over the mean (0: the expected busiest under uniform routing,
  // routed_pairs in model/ops.h). Never in a file.
  int ep = 1;
  double moe_imbalance = 0;
  // The simulator's data-parallel attention (sim::expert_parallel with dp > 1): `dp` groups of the
  // tensor-parallel GPUs each run their own requests' attention, and every group's rows meet at the
  // experts, spread over ep of the dp x tp GPUs with all-to-all dispatch and combine. The simulated
  // group's rows stand for every group's (equal load): a GPU's experts see dp times its rows.
  int dp = 1;
  // Chunked attention (Llama 4): layer_chunk[l] > 0 lets a query see only the keys of its own
  // chunk of that many positions (chunk c holds positions [c*C, (c+1)*C)); empty: none.
  std::vector<int> layer_chunk;
  // Per-layer widths for models with layer-wise scaling (OpenELM); empty when every layer has
  // the scalars above. Only the simulator uses them; the engine runs uniform models.
  std::vector<int> layer_n_head, layer_n_head_kv, layer_n_ff;

  int window(int l) const { return layer_window.empty() ? 0 : layer_window[size_t(l)]; }
  int chunk(int l) const { return layer_chunk.empty() ? 0 : layer_chunk[size_t(l)]; }
  // With sliding-window or chunked layers, the layers that see every earlier key (Gemma 3's global
  // layers), where a depth fraction of a pruning schedule resolves (pruning/schedule.h); empty
  // without such layers.
  std::vector<int> global_layers() const;
  // Some layer has a sliding window or an attention chunk (Mistral 7B's every layer, Gemma 3's five of six).
  bool local_attention() const;
  // Of the first n positions, how many keys layer l lets the query at position n - 1 see (n, or its
  // window or chunk), and the (query, key) pairs the n queries attend together.
  int64_t visible_keys(int l, int64_t n) const;
  int64_t dense_pairs(int l, int64_t n) const;
  // K/V a layer must keep for n positions: a sliding window's or chunk's worth at most (what a
  // serving engine that frees keys no query will see again keeps; this engine keeps them all).
  int64_t kv_kept(int l, int64_t n) const;
  float rope_base(int l) const { return window(l) > 0 ? rope_theta_local : rope_theta; }
  float rope_scale(int l) const { return window(l) > 0 ? 1.0f : rope_freq_scale; }
  float attention_scale() const;
  bool moe() const { return n_expert > 0; }
  bool mla() const { return kv_lora_rank > 0; }
  int q_dim() const { return n_head * head_dim; }      // H*Dh
  int kv_dim() const { return n_head_kv * head_dim; }  // Hkv*Dh
  int v_head() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  int v_dim() const { return n_head * v_head(); }  // the attention output's width, O's input
  // Elements of K/V one token keeps in one layer: K and V of every KV head, or MLA's latent and
  // RoPE key.
  int64_t kv_token_elems() const { return mla() ? int64_t(kv_lora_rank) + rope_dim : 2 * int64_t(kv_dim()); }
  // Parameters in the matrices that a forward pass multiplies (per layer and LM head),
  // plus norms and embeddings.
  int64_t n_params() const;
  // Of n_params, layer l's (its attention, FFN or experts, norms); the rest is the embedding, the
  // final norm and an untied LM head.
  int64_t layer_params(int l) const;
  // Of those, what one token multiplies: n_params with only n_expert_used experts a layer (= n_params
  // for a dense model).
  int64_t n_active_params() const;
  // Of n_params, the routed and shared experts' (with their biases): what a separate expert weight
  // dtype (MXFP4 experts) stores.
  int64_t n_expert_params() const;
  int64_t layer_expert_params(int l) const;  // layer l's share of it
  bool uniform() const {
    return layer_n_head.empty() && layer_n_head_kv.empty() && layer_n_ff.empty() && n_layer_dense_lead == 0;
  }
  // Layer l's shape as a uniform config: the scalars replaced by that layer's widths (a dense
  // leading layer of a MoE model without its experts).
  ModelConfig layer(int l) const;
};

// A configuration as JSON (the keys of a trace header's `model` and of model/presets.json) and
// back. Reading requires arch, n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
// the rest is optional (defaults: n_ctx_train 0, rope_theta 10000, rms_eps 1e-5, untied, no
// biases, uniform layers). Throws lp::Error "<origin>: ..." for a missing or mistyped field or
// inconsistent dimensions.
nlohmann::json config_to_json(const ModelConfig& c);
ModelConfig config_from_json(const nlohmann::json& j, const std::string& origin);
// Every key config_from_json reads (the Python module's Model.replace refuses others).
std::vector<std::string> config_keys();

// Checks dimensions for consistency (positive, heads divide, per-layer arrays of n_layer entries);
// `origin` names the source in the one-line error.
void validate_config(const ModelConfig& c, const std::string& origin);

// Reads and validates the configuration. Throws lp::Error for an unsupported architecture,
// missing keys, inconsistent or absurd dimensions.
ModelConfig config_from_gguf(const GgufFile& f);

// The configuration the simulator costs from a GGUF: config_from_gguf's for the architectures the
// engine runs, and from metadata and tensor shapes alone for those it does not (deepseek2: DeepSeek
// V2/V3 and R1 with latent attention, shared experts and dense leading layers; gpt-oss: biases, sinks,
// alternating sliding windows). Throws lp::Error naming the file and the key or tensor at fault.
ModelConfig costing_config_from_gguf(const GgufFile& f);

// Names of the tensors a Llama-family model must have, for validation and inspect.
std::vector<std::string> required_tensor_names(const ModelConfig& c);

}  // namespace lp
