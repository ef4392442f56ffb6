// The slow reference transformer layer the forward and pruning tests compare the engine with:
// the scalar reference kernels (double accumulation), unfused matrices read straight from the
// GGUF, no KV cache. Header-only; tests only.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/ref.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/quant.h"

namespace lp::testing {

inline std::vector<float> tensor_f32(const GgufFile& f, const std::string& name) {
  const GgufTensor& t = f.tensor(name);
  std::vector<float> v(static_cast<size_t>(t.n_elems));
  dequantize(t.type, t.data, v.data(), t.n_elems);
  return v;
}

// Runs layer l on n rows x [n][D] (updated in place) at positions pos[n], every row attending to
// the rows at or before its position. Returns q [n][H*Dh] and k [n][Hkv*Dh] after RoPE through
// q_out/k_out when given (the pruning test scores the last row with them).
inline void reference_layer(const GgufFile& f, const ModelConfig& c, int l, std::vector<float>& x,
                            const std::vector<int32_t>& pos, std::vector<float>* q_out = nullptr,
                            std::vector<float>* k_out = nullptr) {
  const int64_t n = int64_t(pos.size()), D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim,
                F = c.n_ff;
  const std::string p = "blk." + std::to_string(l) + ".";
  std::vector<float> xn(x.size()), tmp(x.size());
  ref::rmsnorm(x.data(), tensor_f32(f, p + "attn_norm.weight").data(), xn.data(), n, D, c.rms_eps);
  std::vector<float> q(static_cast<size_t>(n * H * Dh)), k(static_cast<size_t>(n * Hkv * Dh)), v(k.size()),
      o(q.size());
  ref::matmul(xn.data(), tensor_f32(f, p + "attn_q.weight").data(), q.data(), n, D, H * Dh);
  ref::matmul(xn.data(), tensor_f32(f, p + "attn_k.weight").data(), k.data(), n, D, Hkv * Dh);
  ref::matmul(xn.data(), tensor_f32(f, p + "attn_v.weight").data(), v.data(), n, D, Hkv * Dh);
  ref::rope(q.data(), pos.data(), n, H, Dh, c.rope_dim, c.rope_theta, nullptr);
  ref::rope(k.data(), pos.data(), n, Hkv, Dh, c.rope_dim, c.rope_theta, nullptr);
  ref::attention(q.data(), pos.data(), n, k.data(), v.data(), pos.data(), n, H, Hkv, Dh, o.data());
  ref::matmul(o.data(), tensor_f32(f, p + "attn_output.weight").data(), tmp.data(), n, H * Dh, D);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  ref::rmsnorm(x.data(), tensor_f32(f, p + "ffn_norm.weight").data(), xn.data(), n, D, c.rms_eps);
  std::vector<float> g(static_cast<size_t>(n * F)), u(g.size()), a(g.size());
  ref::matmul(xn.data(), tensor_f32(f, p + "ffn_gate.weight").data(), g.data(), n, D, F);
  ref::matmul(xn.data(), tensor_f32(f, p + "ffn_up.weight").data(), u.data(), n, D, F);
  ref::swiglu(g.data(), u.data(), a.data(), n * F);
  ref::matmul(a.data(), tensor_f32(f, p + "ffn_down.weight").data(), tmp.data(), n, F, D);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  if (q_out) *q_out = std::move(q);
  if (k_out) *k_out = std::move(k);
}

// Root mean square of a vector: the scale the tests' relative tolerances are stated against.
inline double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / double(v.size()));
}

}  // namespace lp::testing
