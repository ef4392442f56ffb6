#include "model/ops.h"

namespace lp {

std::string_view op_name(Op op) {
  static constexpr std::array<std::string_view, kNumOps> names = {
      "embed",    "attn_norm", "qkv",    "rope", "attention", "score",  "select",      "o_proj",
      "ffn_norm", "gate_up",   "swiglu", "down", "residual",  "gather", "output_norm", "lm_head"};
  return names[static_cast<int>(op)];
}

int op_calls_per_layer(Op op) {
  return op == Op::Residual ? 2 : 1;
}

bool op_is_per_layer(Op op) {
  return op != Op::Embed && op != Op::OutputNorm && op != Op::LmHead;
}

namespace {
// GEMM of [T][K] x [K][N].
double gemm_flops(int64_t T, int64_t K, int64_t N) {
  return 2.0 * T * K * N;
}
double gemm_bytes(int64_t T, int64_t K, int64_t N, const OpDtypes& d) {
  return double(K) * N * d.weight_bytes + double(T) * K * d.act_bytes + double(T) * N * d.elem_bytes;
}
}  // namespace

double op_flops(const ModelConfig& c, Op op, const OpShape& s) {
  const int64_t T = s.tokens, D = c.n_embd, F = c.n_ff;
  switch (op) {
    case Op::Embed:
      return 0;
    case Op::AttnNorm:
    case Op::FfnNorm:
    case Op::OutputNorm:
      return 4.0 * T * D;  // square, sum, scale, weight
    case Op::QKV:
      return gemm_flops(T, D, c.q_dim() + 2 * c.kv_dim());
    case Op::Rope:
      return 3.0 * T * (c.n_head + c.n_head_kv) * c.rope_dim;  // 4 mul + 2 add per pair
    case Op::Attention:
      return double(s.attn_pairs) * c.n_head * (4.0 * c.head_dim + 5.0);
    case Op::OProj:
      return gemm_flops(T, c.q_dim(), D);
    case Op::GateUp:
      return gemm_flops(T, D, 2 * F);
    case Op::SwiGLU:
      return 5.0 * T * F;  // exp, add, div, two muls
    case Op::Down:
      return gemm_flops(T, F, D);
    case Op::Residual:
      return double(T) * D;
    // One query row over kv_tokens keys per head: dot (2 Dh), softmax (5), average (2).
    case Op::Score:
      return double(s.kv_tokens) * c.n_head * (2.0 * c.head_dim + 7.0);
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

double op_bytes(const ModelConfig& c, Op op, const OpShape& s, const OpDtypes& d) {
  const int64_t T = s.tokens, D = c.n_embd, F = c.n_ff;
  switch (op) {
    case Op::Embed:
      return double(T) * D * (d.weight_bytes + d.elem_bytes);
    case Op::AttnNorm:
    case Op::FfnNorm:
    case Op::OutputNorm:
      return double(T) * D * (d.elem_bytes + d.act_bytes) + D * 4.0;
    case Op::QKV:
      return gemm_bytes(T, D, c.q_dim() + 2 * c.kv_dim(), d);
    case Op::Rope:
      return 2.0 * T * (c.q_dim() + c.kv_dim()) * d.elem_bytes;
    case Op::Attention:
      // Q read, O written, the T new keys/values appended to the cache, and every key/value
      // attended read once.
      return double(T) * c.q_dim() * d.elem_bytes * 2 + 2.0 * (T + s.kv_tokens) * c.kv_dim() * d.kv_bytes;
    case Op::OProj:
      return gemm_bytes(T, c.q_dim(), D, d);
    case Op::GateUp:
      return gemm_bytes(T, D, 2 * F, d);
    case Op::SwiGLU:
      return double(T) * F * (2 * d.elem_bytes + d.act_bytes);
    case Op::Down:
      return gemm_bytes(T, F, D, d);
    case Op::Residual:
      return 3.0 * T * D * d.elem_bytes;
    case Op::Score:
      return double(s.kv_tokens) * c.kv_dim() * d.kv_bytes + double(s.kv_tokens) * 4;
    case Op::Select:  // scores read, kept indices written
      return double(s.kv_tokens) * 8;
    case Op::Gather:  // rows moved (kept ones compacted, pruned ones saved): read and written
      return 2.0 * T * D * d.elem_bytes;
    case Op::LmHead:
      return gemm_bytes(T, D, c.n_vocab, d);
    case Op::kCount:
      break;
  }
  return 0;
}

double prefill_flops(const ModelConfig& c, int64_t T, int64_t logit_rows) {
  double total = 0;
  OpShape s{T, causal_pairs(T), T};
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    if (op_is_per_layer(op) && op != Op::Score && op != Op::Select && op != Op::Gather)
      total += c.n_layer * op_flops(c, op, s) * op_calls_per_layer(op);
  }
  OpShape head{logit_rows, 0, 0};
  total += op_flops(c, Op::OutputNorm, head) + op_flops(c, Op::LmHead, head);
  return total;
}

}  // namespace lp
