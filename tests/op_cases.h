// The table of op cases every backend is checked on and benchmarked with: op × awkward row counts
// (1, 17, 111, 989: what pruning leaves) × GQA ratio (1, 3, 6) × weight dtype, and the one-layer
// random model each case runs on. The checks are tests/backend_ops.h (gtest); the timings are
// bench/bench_backend_ops.cpp. Nothing here depends on a test framework.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/quant.h"

namespace lp::testing {

enum class OpKind {
  Embed,
  RmsNorm,
  MatmulQKV,
  MatmulO,
  MatmulGateUp,
  MatmulDown,
  LmHead,
  Rope,
  KvAppend,
  Attention,
  AttentionSubset,
  AttentionUnordered,
  Scores,
  SelectTop,
  SwiGLU,
  Residual,
  GatherRows,
  AuxStoreMerge,
  QkNorm,    // per-head RMSNorm of q and k (Qwen3, Gemma 3)
  PostNorm,  // RMSNorm of a layer's attention or FFN output (Gemma 3)
  Moe        // route and experts: the mixture-of-experts FFN (Qwen3-MoE, Mixtral), on op_model's moe model
};

// The ops whose result the later architectures' parts change (OpCase::later): the embedding scale,
// the QKV biases, the local layers' RoPE base, the sliding window and attention scale, GeGLU; and
// the ops only those architectures have.
inline bool has_later_parts(OpKind k) {
  switch (k) {
    case OpKind::Embed:
    case OpKind::MatmulQKV:
    case OpKind::Rope:
    case OpKind::Attention:
    case OpKind::AttentionSubset:
    case OpKind::AttentionUnordered:
    case OpKind::Scores:
    case OpKind::SelectTop:
    case OpKind::SwiGLU:
    case OpKind::QkNorm:
    case OpKind::PostNorm:
      return true;
    default:
      return false;
  }
}
inline bool only_later(OpKind k) {
  return k == OpKind::QkNorm || k == OpKind::PostNorm;
}

inline const char* op_name(OpKind k) {
  static const char* names[] = {
      "embed",   "rmsnorm",    "matmul_qkv", "matmul_o",  "matmul_gateup",    "matmul_down",
      "lm_head", "rope",       "kv_append",  "attention", "attention_subset", "attention_unordered",
      "scores",  "select_top", "swiglu",     "residual",  "gather_rows",      "aux_store_merge",
      "qk_norm", "post_norm",  "moe"};
  return names[int(k)];
}

struct OpCase {
  OpKind op;
  int64_t T;    // rows
  int gqa;      // H / Hkv
  DType dtype;  // of the weights
  // On op_model's later-parts model: Q/K/V biases, q/k and post norms, GeGLU, a sliding window, a
  // non-default attention scale and local RoPE base, scaled embeddings (Qwen2, Qwen3, Gemma 3).
  bool later = false;
};

inline std::string case_name(const OpCase& c) {
  return std::string(op_name(c.op)) + "_T" + std::to_string(c.T) + "_gqa" + std::to_string(c.gqa) + "_" +
         dtype_name(c.dtype) + (c.later ? "_later" : "");
}

// The table. Row counts are the ones pruning produces: a single token, odd and prime counts, and a
// long prefill. GEMMs run in both dtypes; the other ops do not read weights' dtype (f32 only).
inline std::vector<OpCase> op_cases() {
  std::vector<OpCase> out;
  for (int k = 0; k <= int(OpKind::Moe); ++k) {
    const OpKind op = OpKind(k);
    const bool gemm = op == OpKind::MatmulQKV || op == OpKind::MatmulO || op == OpKind::MatmulGateUp ||
                      op == OpKind::MatmulDown || op == OpKind::LmHead || op == OpKind::Moe;
    const bool heads = op == OpKind::Rope || op == OpKind::KvAppend || op == OpKind::Attention ||
                       op == OpKind::AttentionSubset || op == OpKind::AttentionUnordered ||
                       op == OpKind::Scores || op == OpKind::SelectTop || op == OpKind::MatmulQKV ||
                       op == OpKind::QkNorm;
    for (const bool later : {false, true}) {
      if (later ? !has_later_parts(op) : only_later(op)) continue;
      // The later parts do not interact with the weights' dtype or a long prefill's tiling (111 rows
      // over about 220 keys already cross several 64-key blocks of a 37-position window): fewer cases.
      const std::vector<int64_t> rows =
          later ? std::vector<int64_t>{1, 17, 111} : std::vector<int64_t>{1, 17, 111, 989};
      const std::vector<int> gqas = !heads  ? std::vector<int>{3}
                                    : later ? std::vector<int>{1, 6}
                                            : std::vector<int>{1, 3, 6};
      for (const int64_t T : rows)
        for (const int gqa : gqas)
          for (const DType dt :
               gemm && !later ? std::vector<DType>{DType::F32, DType::BF16} : std::vector<DType>{DType::F32})
            out.push_back({op, T, gqa, dt, later});
    }
  }
  return out;
}

inline std::vector<float> random_vec(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Positions with gaps, as pruning leaves them: 3 apart, starting at 5.
inline std::vector<int32_t> gapped_positions(int64_t T, int32_t first = 5, int32_t stride = 3) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) p[size_t(i)] = first + stride * int32_t(i);
  return p;
}

// The positions of a case's T rows: gapped, and after the T earlier tokens of the attention cases.
inline std::vector<int32_t> row_positions(int64_t T) {
  return gapped_positions(T, int32_t(3 * T + 7));
}

// The keys of an attention-family case (attention and its subset and unordered forms, scores,
// select_top): T earlier tokens at positions 0, 3, 6, ... appended before the T rows. Unordered:
// the earlier tokens arrive in two interleaved halves, the second at positions between the
// first's, so slots are not in position order. Subset: every other earlier token is left out of
// the keys (a decoding step's active set).
struct KeyLayout {
  std::vector<std::vector<int32_t>> earlier;  // the earlier tokens' positions, appended batch by batch
  std::vector<int32_t> slot_pos;              // the position in each slot, in arrival order, rows last
  std::vector<int32_t> slots;                 // the keys, by slot, in position order
  bool all_in_order = false;                  // the keys are every slot, in order: the op gets no list
};

inline KeyLayout key_layout(OpKind op, const std::vector<int32_t>& rows) {
  const int64_t T = int64_t(rows.size());
  const std::vector<int32_t> earlier = gapped_positions(T, 0, 3);
  KeyLayout k;
  if (op == OpKind::AttentionUnordered) {
    k.earlier.resize(2);
    for (size_t i = 0; i < earlier.size(); ++i) k.earlier[i % 2].push_back(earlier[i]);
    if (k.earlier[1].empty()) k.earlier.pop_back();
  } else {
    k.earlier = {earlier};
  }
  for (const auto& batch : k.earlier) k.slot_pos.insert(k.slot_pos.end(), batch.begin(), batch.end());
  k.slot_pos.insert(k.slot_pos.end(), rows.begin(), rows.end());
  std::vector<int32_t> order(k.slot_pos.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t x, int32_t y) { return k.slot_pos[size_t(x)] < k.slot_pos[size_t(y)]; });
  for (const int32_t s : order)
    if (!(op == OpKind::AttentionSubset && s < T && (k.slot_pos[size_t(s)] / 3) % 2)) k.slots.push_back(s);
  k.all_in_order = op == OpKind::Attention || op == OpKind::Scores || op == OpKind::SelectTop;
  return k;
}

// A one-layer model with random weights: 6 query heads of width `head_dim` over 6 / gqa KV heads,
// FFN 10 x head_dim, untied LM head; with `later` also the later architectures' parts (OpCase::later;
// the other weights are the same draws). The tests use width 16 (vocabulary 300: every case
// checks in milliseconds); the benchmarks also run width 64 (model width 384, FFN 640, vocabulary 8,192)
// where the per-head work is a real model's.
struct OpModel {
  ModelConfig c;
  Weights w;
};

inline Matrix random_matrix(int64_t rows, int64_t cols, DType dt, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(float(cols)));
  Matrix m;
  m.rows = rows, m.cols = cols, m.dtype = dt;
  if (dt == DType::F32) {
    m.f32.resize(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) m.f32[i] = nd(rng);
  } else {
    m.bf16.resize(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) m.bf16[i] = f32_to_bf16(nd(rng));
  }
  return m;
}

inline std::vector<float> widened(const Matrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.row_f32(r, out.data() + r * m.cols);  // int8: its blocks' values
  return out;
}

// A mixture-of-experts layer's experts widened to f32, as ref::moe takes them.
struct WidenedExperts {
  std::vector<std::vector<float>> gate_up, down;
  std::vector<const float*> gate_up_p, down_p;
};
inline WidenedExperts widened_experts(const LayerWeights& L) {
  WidenedExperts x;
  for (size_t e = 0; e < L.expert_gate_up.size(); ++e) {
    x.gate_up.push_back(widened(L.expert_gate_up[e]));
    x.down.push_back(widened(L.expert_down[e]));
  }
  for (size_t e = 0; e < x.gate_up.size(); ++e) {
    x.gate_up_p.push_back(x.gate_up[e].data());
    x.down_p.push_back(x.down[e].data());
  }
  return x;
}

// With `moe`, the layer's FFN is also 5 experts of width 2.5 x head_dim, 2 per token, behind an f32
// router (ModelConfig::moe).
inline const OpModel& op_model(int gqa, DType dt, int head_dim = 16, bool later = false, bool moe = false) {
  static std::map<std::tuple<int, int, int, bool, bool>, std::unique_ptr<OpModel>> models;
  auto& m = models[{gqa, int(dt), head_dim, later, moe}];
  if (m) return *m;
  m = std::make_unique<OpModel>();
  ModelConfig& c = m->c;
  c.arch = "llama";
  c.n_layer = 1, c.n_head = 6, c.n_head_kv = 6 / gqa, c.head_dim = head_dim, c.n_embd = 6 * head_dim;
  c.n_ff = 10 * head_dim, c.n_vocab = head_dim == 16 ? 300 : 8192, c.n_ctx_train = 8192;
  c.rope_dim = head_dim, c.rope_theta = 10000.0f, c.rms_eps = 1e-5f;
  std::mt19937 rng(uint32_t(17 * gqa + int(dt) + 1009 * (head_dim - 16)));
  std::uniform_real_distribution<float> un(0.5f, 1.5f);
  Weights& w = m->w;
  w.dtype = dt;
  w.tok_embd = random_matrix(c.n_vocab, c.n_embd, dt, rng);
  w.output = random_matrix(c.n_vocab, c.n_embd, dt, rng);
  w.output_norm.resize(size_t(c.n_embd));
  for (auto& v : w.output_norm) v = un(rng);
  LayerWeights L;
  L.attn_norm.resize(size_t(c.n_embd));
  L.ffn_norm.resize(size_t(c.n_embd));
  for (auto& v : L.attn_norm) v = un(rng);
  for (auto& v : L.ffn_norm) v = un(rng);
  L.wqkv = random_matrix((c.n_head + 2 * c.n_head_kv) * c.head_dim, c.n_embd, dt, rng);
  L.wo = random_matrix(c.n_embd, c.n_head * c.head_dim, dt, rng);
  L.w_gate_up = random_matrix(2 * c.n_ff, c.n_embd, dt, rng);
  L.w_down = random_matrix(c.n_embd, c.n_ff, dt, rng);
  if (later) {
    c.attention_bias = c.qk_norm = c.post_norms = c.gelu = true;
    c.embed_scale = 3.0f;
    c.attn_scale = 0.2f;
    c.layer_window = {37};  // the one layer slides: the cases' keys reach about 6 T positions back
    c.rope_theta_local = 1000.0f;
    std::normal_distribution<float> nd(0.0f, 0.5f);
    L.qkv_bias.resize(size_t(L.wqkv.rows));
    for (auto& v : L.qkv_bias) v = nd(rng);
    L.q_norm.resize(size_t(head_dim));
    L.k_norm.resize(size_t(head_dim));
    for (auto& v : L.q_norm) v = un(rng);
    for (auto& v : L.k_norm) v = un(rng);
    L.post_attn_norm.resize(size_t(c.n_embd));
    L.post_ffn_norm.resize(size_t(c.n_embd));
    for (auto& v : L.post_attn_norm) v = un(rng);
    for (auto& v : L.post_ffn_norm) v = un(rng);
  }
  if (moe) {
    c.n_expert = 5, c.n_expert_used = 2, c.n_ff_exp = 5 * head_dim / 2;
    L.router = random_matrix(c.n_expert, c.n_embd, DType::F32, rng);
    for (int e = 0; e < c.n_expert; ++e) {
      L.expert_gate_up.push_back(random_matrix(2 * c.n_ff_exp, c.n_embd, dt, rng));
      L.expert_down.push_back(random_matrix(c.n_embd, c.n_ff_exp, dt, rng));
    }
  }
  w.layers.push_back(std::move(L));
  return *m;
}

// The model a case runs on.
inline const OpModel& case_model(const OpCase& oc, int head_dim = 16) {
  return op_model(oc.gqa, oc.dtype, head_dim, oc.later, oc.op == OpKind::Moe);
}

}  // namespace lp::testing
