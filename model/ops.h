// The op list of a layer (the Llama layout and what later architectures add) and its FLOP and byte
// counts.
//
// One counting for the whole project: the engine's op timers, the benchmarks and the
// simulator all call op_flops / op_bytes. They are pure functions of the configuration and
// the shape of one op invocation.
//
// Conventions: a multiply-add is 2 FLOPs. Attention FLOPs count the two matrix products over
// the (query, key) pairs actually attended (QK^T and PV, 2*Dh each per head and pair) plus 5
// FLOPs per pair and head for scale, mask, max, exp and sum. Elementwise ops count the
// arithmetic per element as written in the reference kernels. Bytes are the minimum traffic:
// every operand read once and every result written once at the stated element sizes.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "model/config.h"

namespace lp {

// The ops as the engine executes them (QKV and gate/up are fused GEMMs). The CLI's per-op
// timings, the benchmarks and the simulator all use this list.
enum class Op : int {
  Embed,       // gather T rows of the embedding table
  AttnNorm,    // RMSNorm before attention
  QKV,         // [T][D] x [D][(H + 2 Hkv) Dh], the fused q, k, v projections (+ their biases, Qwen2)
  QKNorm,      // per-head RMSNorm of q and k (Qwen3); no work in a model without it
  Rope,        // rotate q and k at the tokens' original positions
  Attention,   // causal GQA over the keys each query sees
  Score,       // LazyLLM: the last token's attention over the active keys, mean over heads
  Select,      // choosing the kept tokens from the scores (or at random)
  OProj,       // [T][H Dh] x [H Dh][D]
  FfnNorm,     // RMSNorm before the MLP
  GateUp,      // [T][D] x [D][2F], the fused gate and up projections
  SwiGLU,      // silu(gate) * up
  Down,        // [T][F] x [F][D]
  Router,      // mixture of experts: [T][D] x [D][E] router logits, softmax and top-k per row
  Experts,     // the routed experts' gate|up, activation and down over the rows routed to each, summed
  Residual,    // one residual add (two per layer)
  PostNorm,    // RMSNorm of the attention or FFN output before its residual add (Gemma 3; two per layer)
  Gather,      // moving rows: compacting kept rows, Aux Cache writes of pruned ones and reads of revived ones
  OutputNorm,  // final RMSNorm on the rows that need logits
  LmHead,      // [R][D] x [D][V]
  kCount,
};

inline constexpr int kNumOps = static_cast<int>(Op::kCount);
std::string_view op_name(Op op);
bool op_is_per_layer(Op op);
int op_calls_per_layer(Op op);  // 2 for Residual, else 1

// Shape of one invocation.
struct OpShape {
  int64_t tokens = 0;      // rows computed (queries); for LmHead/OutputNorm the logit rows
  int64_t attn_pairs = 0;  // (query, key) pairs attended, for Attention
  int64_t kv_tokens = 0;   // keys read by Attention or scored by Score/Select
  int64_t experts = 0;     // Experts: the distinct experts run (0: expected_experts of the rows)
  // The rows are decoding rows: multi-head latent attention then attends in the latent (the
  // "absorbed" form serving engines decode with), a prefill over keys expanded per head.
  bool decoding = false;
  // Experts: the (row, expert) pairs this GPU computes, where a run's routing says (a trace's
  // routes); 0: routed_pairs of the rows.
  double routed = 0;
};

// Multi-head latent attention's two forms (DeepSeek-V2 section 2.1.2; vLLM's and SGLang's MLA
// backends): a prefill expands the latent to per-head keys of head_dim and values of v_head; a
// decoding row attends in the latent itself, keys of kv_lora_rank + rope_dim and values of
// kv_lora_rank shared by every head, its query and output moved through kv_b's halves instead (the
// same FLOPs per row as expanding the row's own K/V, so QKV counts them once for both forms).
inline int64_t attn_key_width(const ModelConfig& c, bool decoding) {
  return c.mla() && decoding ? int64_t(c.kv_lora_rank) + c.rope_dim : c.head_dim;
}
inline int64_t attn_value_width(const ModelConfig& c, bool decoding) {
  return c.mla() && decoding ? int64_t(c.kv_lora_rank) : c.v_head();
}
// The weights of QKV: q (through its latent), k and v, or MLA's q path, kv_a and kv_b.
inline int64_t qkv_weights(const ModelConfig& c) {
  const int64_t D = c.n_embd, q = c.q_dim();
  if (!c.mla()) return D * (q + 2 * int64_t(c.kv_dim()));
  const int64_t ql = c.q_lora_rank, kl = c.kv_lora_rank, nope = int64_t(c.head_dim) - c.rope_dim;
  return (ql > 0 ? D * ql + ql * q : D * q) + D * (kl + c.rope_dim) + kl * c.n_head * (nope + c.v_head());
}
// Per row, the elements QKV writes: q, k and v; or MLA's q latent, q, the K/V latent and its
// expansion to per-head keys and values.
inline int64_t qkv_outputs(const ModelConfig& c) {
  if (!c.mla()) return int64_t(c.q_dim()) + 2 * int64_t(c.kv_dim());
  const int64_t nope = int64_t(c.head_dim) - c.rope_dim;
  return int64_t(c.q_lora_rank) + c.q_dim() + c.kv_lora_rank + c.rope_dim +
         int64_t(c.n_head) * (nope + c.v_head());
}
// The shared experts' gated MLPs a row goes through, and their total width.
inline double shared_ffn_width(const ModelConfig& c) {
  return double(c.n_expert_shared) * c.n_ff_shexp;
}

// The distinct experts T rows reach with k of E each, routed uniformly at random: E (1 - (1 - k/E)^T).
// What the Experts op reads where the shape does not say (a simulation); a run counts its own. Under
// expert parallelism (c.ep > 1, c.n_expert a GPU's share of the E = n_expert * ep experts): the
// share of them on one GPU.
// Under data-parallel attention (c.dp > 1) the rows of all dp groups: dp T.
inline double expected_experts(const ModelConfig& c, int64_t T) {
  if (!c.moe() || T <= 0) return 0;
  const double E = double(c.n_expert) * std::max(c.ep, 1);
  return double(c.n_expert) *
         (1.0 - std::pow(1.0 - double(c.n_expert_used) / E, double(T) * std::max(c.dp, 1)));
}

// The (row, routed expert) pairs one GPU computes for T rows: T k, or under expert parallelism the
// busiest GPU's share: the mean T k / ep times the imbalance, c.moe_imbalance where given, else
// the expected busiest of ep GPUs when each pair lands on one at random, mean + sigma sqrt(2 ln ep)
// (sigma^2 = mean (1 - 1/ep)); at most T min(k, the GPU's experts).
// Under data-parallel attention the rows of all dp groups, dp T, are routed.
inline double routed_pairs(const ModelConfig& c, int64_t T) {
  const double rows = double(T) * std::max(c.dp, 1), pairs = rows * c.n_expert_used;
  if (c.ep <= 1 || T <= 0) return pairs;
  const double ep = c.ep, mean = pairs / ep;
  const double f =
      c.moe_imbalance > 0 ? c.moe_imbalance : 1.0 + std::sqrt(2.0 * std::log(ep) * (1.0 - 1.0 / ep) / mean);
  return std::min(mean * f, rows * std::min(c.n_expert_used, c.n_expert));
}

// Element sizes in bytes.
struct OpDtypes {
  double weight_bytes = 4;  // 4 f32, 2 bf16, 0.5625 for 4.5-bit quantized weights
  double act_bytes = 4;     // activations entering GEMMs
  double kv_bytes = 4;
  // Activations between ops (the residual stream, norm and RoPE inputs, GEMM outputs, attention's
  // Q and O): f32 in this engine and llama.cpp, the compute dtype in GPU serving engines.
  double elem_bytes = 4;
  double expert_weight_bytes = 0;  // the experts' weights where they differ (MXFP4 experts); 0: weight_bytes
  double experts_bytes() const { return expert_weight_bytes > 0 ? expert_weight_bytes : weight_bytes; }
  // The output layer's where it differs (a Q4_K_M file's is Q6_K: 0.82 bytes a weight against its
  // layers' 0.56); 0: weight_bytes.
  double head_weight_bytes = 0;
  double head_bytes() const { return head_weight_bytes > 0 ? head_weight_bytes : weight_bytes; }
};

// op_flops and op_bytes are inline: the serving simulation prices millions of iterations, and with
// the op known at the call site the switch folds away.
namespace detail {
// GEMM of [T][K] x [K][N].
inline double gemm_flops(int64_t T, int64_t K, int64_t N) {
  return 2.0 * T * K * N;
}
inline double gemm_bytes(int64_t T, int64_t K, int64_t N, const OpDtypes& d) {
  return double(K) * N * d.weight_bytes + double(T) * K * d.act_bytes + double(T) * N * d.elem_bytes;
}
}  // namespace detail

inline double op_flops(const ModelConfig& c, Op op, const OpShape& s) {
  using detail::gemm_flops;
  const int64_t T = s.tokens, D = c.n_embd, F = c.n_ff;
  switch (op) {
    case Op::Embed:
      return 0;
    case Op::AttnNorm:
    case Op::FfnNorm:
    case Op::OutputNorm:
      return 4.0 * T * D;  // square, sum, scale, weight
    case Op::QKV:          // a bias is one more add per output
      return 2.0 * double(T) * double(qkv_weights(c)) +
             (c.attention_bias ? double(T) * (c.q_dim() + 2 * c.kv_dim()) : 0.0);
    case Op::QKNorm:  // as RMSNorm, per head; MLA's norms of its two latents
      if (c.mla()) return 4.0 * T * (c.q_lora_rank + c.kv_lora_rank);
      return c.qk_norm ? 4.0 * T * (c.q_dim() + c.kv_dim()) : 0.0;
    case Op::Rope:  // 4 mul + 2 add per pair; MLA rotates one shared key
      return 3.0 * T * (c.n_head + (c.mla() ? 1 : c.n_head_kv)) * c.rope_dim;
    case Op::Attention:  // QK^T and PV over the pairs, 5 per pair for the softmax, a sink's 5 per row
      return double(s.attn_pairs) * c.n_head *
                 (2.0 * double(attn_key_width(c, s.decoding) + attn_value_width(c, s.decoding)) + 5.0) +
             (c.attn_sinks ? 5.0 * T * c.n_head : 0.0);
    case Op::OProj:
      return gemm_flops(T, c.v_dim(), D) + (c.out_bias ? double(T) * D : 0.0);
    case Op::GateUp:  // none in a mixture-of-experts model (Router and Experts instead)
      return c.moe() ? 0.0 : gemm_flops(T, D, 2 * F);
    case Op::SwiGLU:
      return c.moe() ? 0.0 : 5.0 * T * F;  // exp, add, div, two muls
    case Op::Down:
      return c.moe() ? 0.0 : gemm_flops(T, F, D);
    case Op::Router:  // the GEMM, then exp, sum and scale per logit (and a bias's add)
      return c.moe() ? gemm_flops(T, D, c.n_expert) + (c.router_bias ? 6.0 : 5.0) * T * c.n_expert : 0.0;
    case Op::Experts: {
      // Each row through k experts: gate|up, activation, down, weighted sum (and the biases' adds);
      // and through the shared experts, unweighted.
      if (!c.moe()) return 0.0;
      const double pairs = s.routed > 0 ? s.routed : routed_pairs(c, T), Fe = c.n_ff_exp,
                   Fs = shared_ffn_width(c);
      return pairs * (6.0 * D * Fe + 5.0 * Fe + 2.0 * D + (c.expert_bias ? 2.0 * Fe + D : 0.0)) +
             double(T) * (6.0 * D * Fs + 5.0 * Fs + (Fs > 0 ? D : 0.0));
    }
    case Op::Residual:
      return double(T) * D;
    case Op::PostNorm:
      return c.post_norms ? 4.0 * T * D : 0.0;
    // One query row over kv_tokens keys per head: dot (2 Dh), softmax (5), average (2).
    case Op::Score:  // MLA scores in the latent, as its decoding does
      return double(s.kv_tokens) * c.n_head * (2.0 * double(attn_key_width(c, true)) + 7.0);
    case Op::Select:  // comparisons, not floating-point arithmetic
    case Op::Gather:
      return 0;
    case Op::LmHead:
      return gemm_flops(T, D, c.n_vocab);
    case Op::kCount:
      break;
  }
  return 0;
}

inline double op_bytes(const ModelConfig& c, Op op, const OpShape& s, const OpDtypes& d) {
  using detail::gemm_bytes;
  const int64_t T = s.tokens, D = c.n_embd, F = c.n_ff;
  switch (op) {
    case Op::Embed:
      return double(T) * D * (d.weight_bytes + d.elem_bytes);
    case Op::AttnNorm:
    case Op::FfnNorm:
    case Op::OutputNorm:
      return double(T) * D * (d.elem_bytes + d.act_bytes) + D * 4.0;
    case Op::QKV:
      return double(qkv_weights(c)) * d.weight_bytes + double(T) * D * d.act_bytes +
             double(T) * double(qkv_outputs(c)) * d.elem_bytes +
             (c.attention_bias ? 4.0 * (c.q_dim() + 2 * c.kv_dim()) : 0.0);
    case Op::QKNorm:  // q and k read and written, two weight vectors (MLA: its two latents)
      if (c.mla())
        return 2.0 * T * (c.q_lora_rank + c.kv_lora_rank) * d.elem_bytes +
               4.0 * (c.q_lora_rank + c.kv_lora_rank);
      return c.qk_norm ? 2.0 * T * (c.q_dim() + c.kv_dim()) * d.elem_bytes + 8.0 * c.head_dim : 0.0;
    case Op::Rope:
      return 2.0 * T * (c.mla() ? double(c.n_head + 1) * c.rope_dim : double(c.q_dim() + c.kv_dim())) *
             d.elem_bytes;
    case Op::Attention: {
      // Q read, O written, the T new tokens' K/V appended to the cache, and every key/value
      // attended read once: from the cache, or for an MLA prefill as the per-head keys and values
      // QKV expanded.
      const double q =
          double(T) * c.n_head * (attn_key_width(c, s.decoding) + attn_value_width(c, s.decoding));
      const double kv_read = c.mla() && !s.decoding
                                 ? double(s.kv_tokens) * c.n_head * (c.head_dim + c.v_head()) * d.elem_bytes
                                 : double(s.kv_tokens) * double(c.kv_token_elems()) * d.kv_bytes;
      return q * d.elem_bytes + double(T) * double(c.kv_token_elems()) * d.kv_bytes + kv_read;
    }
    case Op::OProj:
      return gemm_bytes(T, c.v_dim(), D, d) + (c.out_bias ? 4.0 * D : 0.0);
    case Op::GateUp:
      return c.moe() ? 0.0 : gemm_bytes(T, D, 2 * F, d);
    case Op::SwiGLU:
      return c.moe() ? 0.0 : double(T) * F * (2 * d.elem_bytes + d.act_bytes);
    case Op::Down:
      return c.moe() ? 0.0 : gemm_bytes(T, F, D, d);
    case Op::Router:  // f32 router weights, the rows in, the logits out
      return c.moe() ? double(D) * c.n_expert * 4 + double(T) * D * d.act_bytes + double(T) * c.n_expert * 4
                     : 0.0;
    case Op::Experts: {
      // Each expert run read once (gate, up, down, their biases), the shared ones always; each
      // (row, expert) pair's row in, gate|up out, activation in and out, down out; the rows' sum
      // written.
      if (!c.moe()) return 0.0;
      const double Fe = c.n_ff_exp, Fs = shared_ffn_width(c),
                   pairs = s.routed > 0 ? s.routed : routed_pairs(c, T);
      const double ran = s.experts > 0 ? double(s.experts) : expected_experts(c, T);
      const auto per_row = [&](double F) {
        return D * d.act_bytes + 2 * F * d.elem_bytes + F * (d.elem_bytes + d.act_bytes) + D * d.elem_bytes;
      };
      return (ran * 3.0 * D * Fe + 3.0 * D * Fs) * d.experts_bytes() +
             (c.expert_bias ? ran * (2 * Fe + D) * 4 : 0.0) + pairs * per_row(Fe) +
             (Fs > 0 ? double(T) * per_row(Fs) : 0.0) + double(T) * D * d.elem_bytes;
    }
    case Op::Residual:
      return 3.0 * T * D * d.elem_bytes;
    case Op::PostNorm:  // in place: read and written, and the weight
      return c.post_norms ? 2.0 * T * D * d.elem_bytes + D * 4.0 : 0.0;
    case Op::Score:  // the keys read (MLA: its latent keys), a score written per key
      return double(s.kv_tokens) * double(c.mla() ? attn_key_width(c, true) : c.kv_dim()) * d.kv_bytes +
             double(s.kv_tokens) * 4;
    case Op::Select:  // scores read, kept indices written
      return double(s.kv_tokens) * 8;
    case Op::Gather:  // rows moved (kept ones compacted, pruned ones saved): read and written
      return 2.0 * T * D * d.elem_bytes;
    case Op::LmHead: {
      OpDtypes head = d;
      head.weight_bytes = d.head_bytes();
      return gemm_bytes(T, D, c.n_vocab, head);
    }
    case Op::kCount:
      break;
  }
  return 0;
}

// Causal pairs for a dense prompt of T tokens: T*(T+1)/2.
inline int64_t causal_pairs(int64_t T) {
  return T * (T + 1) / 2;
}

// FLOPs of a dense (unpruned) prefill of T tokens with logits for `logit_rows` rows.
double prefill_flops(const ModelConfig& c, int64_t T, int64_t logit_rows);

}  // namespace lp
