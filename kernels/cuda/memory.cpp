#include "kernels/cuda/memory.h"

#include <algorithm>

#include "kernels/kv_type.h"

namespace lp::cuda {
namespace {

// Per token of capacity: each layer's slot position and position slot (4 + 4 bytes).
double kv_index_bytes(const ModelConfig& c) {
  return double(c.n_layer) * 8;
}
double aux_token_bytes(const ModelConfig& c) {
  return double(c.n_embd) * 4;
}
// Per key a decoding step holds at its largest, n_ctx keys: a listed key set's slots, a second row
// index, the deferred selection's active positions; the selection's sort buffers (CUB: keys,
// order, their sorted copies and its scratch) and its scores.
constexpr double kDecodeKeyBytes = 4 + 8 + 12, kSelectionKeyBytes = 6 * 8 + 4 + 4;

}  // namespace

BackendMemory backend_memory(const ModelConfig& c, DType dtype, int64_t n_ctx, int64_t ffn_chunk_rows) {
  const double KV = double(c.n_head_kv) * c.head_dim;
  BackendMemory m;
  m.kv =
      double(n_ctx) * (double(c.n_layer) * 2.0 * KV * kv_type_bytes(kv_type_for(dtype)) + kv_index_bytes(c));
  m.aux = double(n_ctx) * aux_token_bytes(c);
  // The activations of the largest step, a prefill of all n_ctx tokens at once (reserve and mm's
  // bf16 copy: x, x2, xn and the residual branch, qkv and its q, k, v, the attention output,
  // positions, indices, scores; gate|up and SwiGLU for a chunk of rows where the FFN runs
  // chunked, else for all of them), with what a decoding step adds over n_ctx keys.
  const double Q = double(c.n_head) * c.head_dim, F = c.moe() ? 0.0 : double(c.n_ff), D = double(c.n_embd);
  const double ffn_rows = double(ffn_chunk_rows > 0 ? std::min(n_ctx, ffn_chunk_rows) : n_ctx);
  const double ffn_bytes = 4 * 3 * F * ffn_rows;
  // mm's bf16 copy of a GEMM's input: the prompt's rows of xn or the attention output, or a chunk's
  // activations.
  const double bf16_copy =
      dtype != DType::F32 ? 2 * std::max(double(n_ctx) * std::max(D, Q), ffn_rows * F) : 0;
  // A mixture-of-experts layer: the router's logits, each row's k routes and weights, and for each of
  // its k (row, expert) pairs the grouped input, gate|up, activation and output, two indices and
  // a weight (run_experts), and the experts' bf16 copies.
  const double E = double(c.n_expert), k = double(c.n_expert_used), Fe = double(c.n_ff_exp);
  const double moe =
      c.moe() ? 4 * E + 8 * k + k * (4 * (2 * D + 3 * Fe) + 20) + (dtype != DType::F32 ? 2 * k * Fe : 0) : 0;
  const double prefill = 4 * (4 * D + 3 * Q + 4 * KV) + 24 + moe;
  m.activations = double(n_ctx) * (prefill + kDecodeKeyBytes + kSelectionKeyBytes) + ffn_bytes + bf16_copy +
                  double(c.n_vocab) * 4 /* logits */;
  // --dtype int8: the largest layer matrix (an expert's gate|up in a MoE model) dequantized to bf16
  // for a prefill GEMM.
  m.dequantized =
      dtype == DType::Int8 ? 2 * std::max({(Q + 2 * KV) * D, Q * D, 2 * F * D, D * F, 2 * Fe * D}) : 0;
  m.library = 256.0 * 1048576;
  return m;
}

double batch_leader_bytes(const ModelConfig& c, DType dtype, int64_t n) {
  const double Q = double(c.n_head) * c.head_dim, KV = double(c.n_head_kv) * c.head_dim, D = double(c.n_embd);
  const double in = std::max(D, Q), out = std::max(Q + 2 * KV, D);
  const double rows = double(n) * (4 * in + 4 * out + (dtype != DType::F32 ? 2 * in : 0));
  // Its tables of the members' row addresses (the batched row ops and K/V appends: 8 addresses a
  // row in one launch, a head's each in Qwen3's q/k norms; in an arena that doubles).
  const double per_row = std::max(8.0, c.qk_norm ? double(c.n_head + c.n_head_kv) : 0.0);
  const double tables = double(n) * per_row * 8 * 2;
  const BackendMemory one = backend_memory(c, dtype, 1, 0);
  return rows + tables + one.dequantized + double(kBatchRoomBytes);
}

Backend::Held held_bytes(const ModelConfig& c, DType dtype, int64_t ffn_chunk_rows) {
  Backend::Held h;
  h.token_bytes = kv_index_bytes(c) + aux_token_bytes(c) + kDecodeKeyBytes + kSelectionKeyBytes;
  h.aux_in_token_bytes = true;  // allocated with the backend, pruned or not
  h.request_bytes = backend_memory(c, dtype, kHeldRows, ffn_chunk_rows).activations;
  return h;
}

}  // namespace lp::cuda
