// One op-test harness for every backend (in the manner of ggml's test-backend-ops): every case of
// the table (tests/op_cases.h: op × awkward row counts × GQA ratio × weight dtype), each run through the
// Backend interface (kernels/backend.h) and compared with the scalar references (kernels/cpu/ref.h,
// pruning/select.h). The CPU backend runs it in lp_tests (tests/kernels/test_backend_ops.cpp); the CUDA
// backend in the GPU suite, on a device and on host threads (tests/gpu/test_gpu_ops.cpp). Both backends run
// every case (the CUDA head-width limits, multiples of 4 up to 256, hold for the table); a backend that
// cannot should skip the case saying why.
//
// Tolerances come from the math: the normalised squared error sum((got - ref)^2) / sum(ref^2) of
// an op whose outputs accumulate K terms in f32 is at most (c K u)^2 with u = 2^-24, the worst-case
// relative error of a length-K f32 sum; c = 4 covers the few roundings around the sum. A bf16 GEMM
// rounds its inputs to bf16 and the reference does the same (ref::round_bf16), so the same bound
// holds. Moves (gathers, copies, K/V append, embedding) and the selection must be exact.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/ref.h"
#include "pruning/select.h"
#include "tests/op_cases.h"

namespace lp::testing {

// Normalised squared error of got against ref.
inline double nmse(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

inline double f32_bound(double K) {
  const double u = std::ldexp(1.0, -24);
  return (4 * K * u) * (4 * K * u);
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// Makes the backend under test for a model and a capacity in tokens.
using MakeOpBackend = std::function<std::unique_ptr<Backend>(const ModelConfig&, const Weights&, int64_t)>;

// Runs one case on a backend made by `make`; mismatches are gtest failures.
inline void run_op_case(const OpCase& oc, const MakeOpBackend& make) {
  const OpModel& om = case_model(oc);
  const ModelConfig& c = om.c;
  const Weights& w = om.w;
  const int64_t T = oc.T, D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
  const int64_t Q = H * Dh, KV = Hkv * Dh, QKV = Q + 2 * KV;
  std::mt19937 rng(uint32_t(T * 31 + oc.gqa));
  auto b = make(c, w, 2 * T + 2);
  const std::vector<int32_t> pos = row_positions(T);
  b->set_rows(pos);

  // A GEMM by W from the activation `in` (plus `bias` [N] where given): `run` multiplies and returns
  // the product.
  const auto gemm_case = [&](Tensor in, const Matrix& W, const std::function<std::vector<float>()>& run,
                             const std::vector<float>& bias = {}) {
    const int64_t K = W.cols, N = W.rows;
    const auto a = random_vec(size_t(T * K), rng);
    b->write(in, a);
    const auto got = run();
    std::vector<float> a_in = a, ref(static_cast<size_t>(T * N));
    if (W.dtype == DType::BF16)
      for (auto& x : a_in) x = ref::round_bf16(x);
    ref::matmul(a_in.data(), widened(W).data(), ref.data(), T, K, N);
    if (!bias.empty())
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) ref[size_t(t * N + n)] += bias[size_t(n)];
    const double e = nmse(got, to_double(ref));
    EXPECT_LE(e, f32_bound(double(K))) << case_name(oc) << " nmse " << e;
  };
  const auto layer_gemm = [&](Tensor in, Proj p, const Matrix& W, Tensor out) {
    gemm_case(in, W, [&] {
      b->matmul(p, 0);
      return b->read(out);
    });
  };

  // The K/V of `n` tokens at positions kpos appended (in this order) from random q|k|v rows; the
  // rows' q are left in the backend's qkv; returns the appended k, v rows ([n][KV] each).
  const auto fill_cache = [&](const std::vector<int32_t>& kpos, std::vector<float>& k,
                              std::vector<float>& v) {
    const int64_t n = int64_t(kpos.size());
    k.clear(), v.clear();
    b->set_rows(kpos);
    const auto rows = random_vec(size_t(n * QKV), rng);
    b->write(Tensor::QKV, rows);
    b->kv_append(0);
    for (int64_t t = 0; t < n; ++t) {
      k.insert(k.end(), rows.begin() + t * QKV + Q, rows.begin() + t * QKV + Q + KV);
      v.insert(v.end(), rows.begin() + t * QKV + Q + KV, rows.begin() + (t + 1) * QKV);
    }
  };

  switch (oc.op) {
    case OpKind::Embed: {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (auto& i : ids) i = int32_t(rng() % uint32_t(c.n_vocab));
      b->embed(ids);
      const auto got = b->read(Tensor::X);
      const auto table = widened(w.tok_embd);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D; ++i)
          ASSERT_EQ(got[size_t(t * D + i)], table[size_t(ids[size_t(t)] * D + i)] * c.embed_scale)
              << case_name(oc);
      return;
    }
    case OpKind::RmsNorm: {
      const auto x = random_vec(size_t(T * D), rng, 3.0f);
      b->write(Tensor::X, x);
      b->rmsnorm(Norm::Attn, 0);
      std::vector<float> ref(x.size());
      ref::rmsnorm(x.data(), w.layers[0].attn_norm.data(), ref.data(), T, D, c.rms_eps);
      const double e = nmse(b->read(Tensor::XN), to_double(ref));
      EXPECT_LE(e, f32_bound(double(D + 4))) << case_name(oc) << " nmse " << e;
      return;
    }
    case OpKind::MatmulQKV:  // with the layer's biases where the model has them
      return gemm_case(
          Tensor::XN, w.layers[0].wqkv,
          [&] {
            b->matmul(Proj::QKV, 0);
            return b->read(Tensor::QKV);
          },
          w.layers[0].qkv_bias);
    case OpKind::PostNorm: {  // each of the two output norms, in place on branch
      for (const Norm n : {Norm::PostAttn, Norm::PostFfn}) {
        const auto x = random_vec(size_t(T * D), rng, 3.0f);
        b->write(Tensor::Branch, x);
        b->post_norm(n, 0);
        std::vector<float> ref(x.size());
        const auto& wn = n == Norm::PostAttn ? w.layers[0].post_attn_norm : w.layers[0].post_ffn_norm;
        ref::rmsnorm(x.data(), wn.data(), ref.data(), T, D, c.rms_eps);
        const double e = nmse(b->read(Tensor::Branch), to_double(ref));
        EXPECT_LE(e, f32_bound(double(D + 4))) << case_name(oc) << " nmse " << e;
      }
      return;
    }
    case OpKind::QkNorm: {
      // q and k heads normed in place, each by its own weights; v untouched.
      const auto x = random_vec(size_t(T * QKV), rng, 3.0f);
      b->write(Tensor::QKV, x);
      b->qk_norm(0);
      const auto got = b->read(Tensor::QKV);
      std::vector<float> ref = x;
      for (int64_t t = 0; t < T; ++t) {
        ref::head_rmsnorm(ref.data() + t * QKV, 1, H, Dh, w.layers[0].q_norm.data(), c.rms_eps);
        ref::head_rmsnorm(ref.data() + t * QKV + Q, 1, Hkv, Dh, w.layers[0].k_norm.data(), c.rms_eps);
      }
      const double e = nmse(got, to_double(ref));
      EXPECT_LE(e, f32_bound(double(Dh + 4))) << case_name(oc) << " nmse " << e;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = Q + KV; i < QKV; ++i)
          ASSERT_EQ(got[size_t(t * QKV + i)], x[size_t(t * QKV + i)]) << case_name(oc) << " v changed";
      return;
    }
    case OpKind::Moe: {
      // The routes exactly as the reference's (the router is f32 in every dtype), the output within
      // the bound of its longest chain of sums (the D-term gate|up products, then Fe-term down ones).
      const int64_t k = c.n_expert_used, Fe = c.n_ff_exp;
      const auto xn = random_vec(size_t(T * D), rng);
      b->write(Tensor::XN, xn);
      b->route(0);
      const std::vector<int32_t> ids = b->routes();
      b->experts(0);
      const auto got = b->read(Tensor::Branch);
      const WidenedExperts ex = widened_experts(w.layers[0]);
      std::vector<float> ref(static_cast<size_t>(T * D));
      std::vector<int32_t> ref_ids(static_cast<size_t>(T * k));
      ref::moe(xn.data(), T, D, w.layers[0].router.f32.data(), ex.gate_up_p, ex.down_p, k, Fe, c.gelu,
               ref.data(), ref_ids.data(), oc.dtype == DType::BF16);
      EXPECT_EQ(ids, ref_ids) << case_name(oc);
      const double e = nmse(got, to_double(ref));
      EXPECT_LE(e, f32_bound(double(D + Fe + 8))) << case_name(oc) << " nmse " << e;
      return;
    }
    case OpKind::MatmulO:
      return layer_gemm(Tensor::Attn, Proj::O, w.layers[0].wo, Tensor::Branch);
    case OpKind::MatmulGateUp:
      return layer_gemm(Tensor::XN, Proj::GateUp, w.layers[0].w_gate_up, Tensor::FF);
    case OpKind::MatmulDown:
      return layer_gemm(Tensor::Act, Proj::Down, w.layers[0].w_down, Tensor::Branch);
    case OpKind::LmHead:
      return gemm_case(Tensor::XN, w.lm_head(), [&] {
        std::vector<float> logits(static_cast<size_t>(T * c.n_vocab));
        b->lm_head(logits.data());
        return logits;
      });
    case OpKind::Rope: {
      const auto x = random_vec(size_t(T * QKV), rng);
      b->write(Tensor::QKV, x);
      b->rope(0);
      const auto got = b->read(Tensor::QKV);
      std::vector<float> q(static_cast<size_t>(T * Q)), k(static_cast<size_t>(T * KV)), ref = x;
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(x.begin() + t * QKV, Q, q.begin() + t * Q);
        std::copy_n(x.begin() + t * QKV + Q, KV, k.begin() + t * KV);
      }
      ref::rope(q.data(), pos.data(), T, H, Dh, c.rope_dim, c.rope_base(0), nullptr, c.rope_scale(0));
      ref::rope(k.data(), pos.data(), T, Hkv, Dh, c.rope_dim, c.rope_base(0), nullptr, c.rope_scale(0));
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(q.begin() + t * Q, Q, ref.begin() + t * QKV);
        std::copy_n(k.begin() + t * KV, KV, ref.begin() + t * QKV + Q);
      }
      // The angle pos * theta^(-2i/d) carries a relative error of a few u, so a rotation at
      // position p is off by about p * u: the bound is the f32 one with K = the largest position.
      const double e = nmse(got, to_double(ref));
      EXPECT_LE(e, f32_bound(double(pos.back()) + 16)) << case_name(oc) << " nmse " << e;
      return;
    }
    case OpKind::KvAppend: {
      // Two appends, the second at positions between the first's (a revival): the backend's own
      // record of positions holds exactly both sets, and attention over them equals the
      // reference over plain arrays filled by ref::kv_append.
      std::vector<int32_t> first = gapped_positions(T, 0, 2), second = gapped_positions(T, 1, 2);
      std::vector<float> k1, v1, k2, v2;
      fill_cache(first, k1, v1);
      fill_cache(second, k2, v2);
      std::vector<float> kr(static_cast<size_t>(2 * T * KV)), vr(kr.size());
      std::vector<int32_t> kp(static_cast<size_t>(2 * T));
      int64_t n =
          ref::kv_append(k1.data(), v1.data(), first.data(), T, KV, kr.data(), vr.data(), kp.data(), 0);
      n = ref::kv_append(k2.data(), v2.data(), second.data(), T, KV, kr.data(), vr.data(), kp.data(), n);
      std::vector<int32_t> want(kp.begin(), kp.begin() + n);
      std::sort(want.begin(), want.end());
      EXPECT_EQ(b->kv_positions(0), want) << case_name(oc);
      return;
    }
    case OpKind::Attention:
    case OpKind::AttentionSubset:
    case OpKind::AttentionUnordered:
    case OpKind::Scores:
    case OpKind::SelectTop: {
      // The earlier tokens (tests/op_cases.h, key_layout), then the T rows (their q attend).
      const KeyLayout lay = key_layout(oc.op, pos);
      std::vector<float> kc, vc;
      for (const std::vector<int32_t>& batch : lay.earlier) {
        std::vector<float> k, v;
        fill_cache(batch, k, v);
        kc.insert(kc.end(), k.begin(), k.end());
        vc.insert(vc.end(), v.begin(), v.end());
      }
      // The rows: their K/V appended too, their q left for the attention.
      b->set_rows(pos);
      const auto rows = random_vec(size_t(T * QKV), rng);
      b->write(Tensor::QKV, rows);
      b->kv_append(0);
      for (int64_t t = 0; t < T; ++t) {
        kc.insert(kc.end(), rows.begin() + t * QKV + Q, rows.begin() + t * QKV + Q + KV);
        vc.insert(vc.end(), rows.begin() + t * QKV + Q + KV, rows.begin() + (t + 1) * QKV);
      }
      const std::vector<int32_t>& slots = lay.slots;
      const int64_t S = int64_t(slots.size());
      std::vector<float> ks(static_cast<size_t>(S * KV)), vs(ks.size()), q(static_cast<size_t>(T * Q));
      std::vector<int32_t> kpos(static_cast<size_t>(S));
      std::vector<int64_t> sl64(slots.begin(), slots.end());
      ref::gather_rows(kc.data(), sl64.data(), ks.data(), S, KV);
      ref::gather_rows(vc.data(), sl64.data(), vs.data(), S, KV);
      for (int64_t i = 0; i < S; ++i) kpos[size_t(i)] = lay.slot_pos[size_t(slots[size_t(i)])];
      for (int64_t t = 0; t < T; ++t) std::copy_n(rows.begin() + t * QKV, Q, q.begin() + t * Q);
      const std::span<const int32_t> given = lay.all_in_order ? std::span<const int32_t>{} : slots;
      if (oc.op == OpKind::Scores || oc.op == OpKind::SelectTop) {
        b->last_row_scores(0, given);
        const auto got = b->scores(S);
        std::vector<double> ref(static_cast<size_t>(S));
        ref::last_row_scores(q.data() + (T - 1) * Q, ks.data(), S, H, Hkv, Dh, ref.data(),
                             c.attention_scale(), kpos.data(), pos.back(), c.window(0));
        const double e = nmse(got, ref);
        EXPECT_LE(e, f32_bound(double(S + Dh))) << case_name(oc) << " nmse " << e;
        // After a scored attention over the same keys (the engine's order at a pruning layer; the CPU
        // backend then scores from the attention's logits).
        b->attention(0, given, true);
        b->last_row_scores(0, given);
        const double e_after = nmse(b->scores(S), ref);
        EXPECT_LE(e_after, f32_bound(double(S + Dh)))
            << case_name(oc) << " after attention, nmse " << e_after;
        if (oc.op == OpKind::SelectTop)
          for (const int64_t keep : {int64_t(1), (S + 1) / 2, S}) {
            // Exact: the same scores, the same order (ties to the later position).
            EXPECT_EQ(b->select_top(kpos, keep), select_top(kpos, got, keep))
                << case_name(oc) << " keep " << keep;
          }
        return;
      }
      b->attention(0, given, false);
      std::vector<float> ref(static_cast<size_t>(T * Q));
      ref::attention(q.data(), pos.data(), T, ks.data(), vs.data(), kpos.data(), S, H, Hkv, Dh, ref.data(),
                     c.attention_scale(), c.window(0));
      const double e = nmse(b->read(Tensor::Attn), to_double(ref));
      EXPECT_LE(e, f32_bound(double(S + Dh))) << case_name(oc) << " nmse " << e;
      return;
    }
    case OpKind::SwiGLU: {
      const auto ff = random_vec(size_t(T * 2 * F), rng, 2.0f);
      b->write(Tensor::FF, ff);
      b->swiglu();
      std::vector<float> ref(static_cast<size_t>(T * F));
      for (int64_t t = 0; t < T; ++t)
        (c.gelu ? ref::geglu : ref::swiglu)(ff.data() + t * 2 * F, ff.data() + t * 2 * F + F,
                                            ref.data() + t * F, F);
      const double e = nmse(b->read(Tensor::Act), to_double(ref));
      EXPECT_LE(e, f32_bound(8)) << case_name(oc) << " nmse " << e;  // exp and a division: a few u
      return;
    }
    case OpKind::Residual: {
      const auto x = random_vec(size_t(T * D), rng), y = random_vec(size_t(T * D), rng);
      b->write(Tensor::X, x);
      b->write(Tensor::Branch, y);
      b->residual();
      const auto got = b->read(Tensor::X);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], x[i] + y[i]) << case_name(oc);  // one rounding
      return;
    }
    case OpKind::GatherRows: {
      // Increasing rows (compaction after pruning), then reversed with a repeat (any order).
      const auto x = random_vec(size_t(T * D), rng);
      std::vector<int64_t> up, down;
      for (int64_t i = 0; i < T; i += 2) up.push_back(i);
      for (int64_t i = T - 1; i >= 0; i -= 3) down.push_back(i);
      down.push_back(0);
      for (const auto& rows : {up, down}) {
        b->set_rows(pos);
        b->write(Tensor::X, x);
        b->gather_rows(rows);
        b->set_rows(std::vector<int32_t>(rows.size(), 0));
        std::vector<float> want(rows.size() * size_t(D));
        ref::gather_rows(x.data(), rows.data(), want.data(), int64_t(rows.size()), D);
        EXPECT_EQ(b->read(Tensor::X), want) << case_name(oc);
      }
      return;
    }
    case OpKind::AuxStoreMerge: {
      // Every third row to the Aux Cache (entries in reverse order), then a merge of the other rows
      // and those entries, interleaved: exactly ref::copy_rows of both sources.
      const auto x = random_vec(size_t(T * D), rng);
      b->write(Tensor::X, x);
      std::vector<int64_t> rows, entries;
      for (int64_t i = 0; i < T; i += 3) rows.push_back(i);
      for (size_t i = 0; i < rows.size(); ++i) entries.push_back(int64_t(rows.size() - 1 - i));
      b->aux_store(rows, entries);
      std::vector<float> aux(rows.size() * size_t(D));
      ref::copy_rows(x.data(), rows.data(), aux.data(), entries.data(), int64_t(rows.size()), D);
      for (size_t e = 0; e < rows.size(); ++e)
        EXPECT_EQ(b->aux_state(int64_t(e)),
                  std::vector<float>(aux.begin() + e * D, aux.begin() + (e + 1) * D))
            << case_name(oc) << " entry " << e;
      // The first R current rows each followed by an entry, then the remaining rows.
      const int64_t R = int64_t(rows.size()), n_rows = T + R;
      RowMerge m;
      for (int64_t i = 0; i < T; ++i) m.x_src.push_back(i), m.x_dst.push_back(i + std::min(i, R));
      for (int64_t e = 0; e < R; ++e) m.aux_src.push_back(e), m.aux_dst.push_back(2 * e + 1);
      b->merge_rows(m, n_rows);
      b->set_rows(std::vector<int32_t>(static_cast<size_t>(n_rows), 0));
      std::vector<float> want(static_cast<size_t>(n_rows * D));
      ref::copy_rows(x.data(), m.x_src.data(), want.data(), m.x_dst.data(), T, D);
      ref::copy_rows(aux.data(), m.aux_src.data(), want.data(), m.aux_dst.data(), int64_t(m.aux_src.size()),
                     D);
      EXPECT_EQ(b->read(Tensor::X), want) << case_name(oc);
      return;
    }
  }
}

}  // namespace lp::testing
