// Comparisons of the engine on the CUDA backend (kernels/cuda/cuda_backend.h) with the CPU backend,
// for the GPU suite (tests/gpu/test_gpu_ops.cpp) on a device and on host threads.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/session.h"
#include "kernels/cpu/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/quant.h"
#include "pruning/schedule.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {

// The tiny model both comparisons run on: 6 layers, 6 heads over 2 KV heads, width 96; the LM head
// tied to the embeddings unless `tied` is false.
inline std::string write_compare_model(const testing::TempDir& dir, bool tied = true) {
  testing::TinyModelSpec spec;
  spec.n_layer = 6;
  spec.n_head = 6;
  spec.n_head_kv = 2;
  spec.n_embd = 96;
  spec.tied = tied;
  return testing::write_tiny_model(dir.path() + (tied ? "/tiny.gguf" : "/tiny-untied.gguf"), spec);
}

// The arithmetic of --dtype int8 on the GPU as weights the CPU backend multiplies: every matrix
// of blocks dequantized and rounded to bf16 (the GPU's GEMM inputs), the embeddings dequantized to
// f32 (the GPU's lookup), and the LM head in f32 even when tied (the GPU's gemv_q multiplies the
// blocks' elements unrounded, by bf16 activations).
inline Weights int8_as_cpu_weights(const Weights& q) {
  const auto as = [](const Matrix& m, DType dt) {
    Matrix r;
    r.rows = m.rows;
    r.cols = m.cols;
    r.dtype = dt;
    std::vector<float> row(static_cast<size_t>(m.cols));
    if (dt == DType::F32)
      r.f32.resize(m.rows * m.cols);
    else
      r.bf16.resize(m.rows * m.cols);
    for (int64_t i = 0; i < m.rows; ++i) {
      m.row_f32(i, row.data());
      for (int64_t k = 0; k < m.cols; ++k) {
        if (dt == DType::F32)
          r.f32.data()[i * m.cols + k] = row[size_t(k)];
        else
          r.bf16.data()[i * m.cols + k] = f32_to_bf16(row[size_t(k)]);
      }
    }
    return r;
  };
  Weights w;
  w.dtype = DType::BF16;
  w.tok_embd = as(q.tok_embd, DType::F32);
  w.output = as(q.lm_head(), DType::F32);
  w.output_norm = q.output_norm;
  w.rope_freqs = q.rope_freqs;
  for (const LayerWeights& l : q.layers) {
    LayerWeights o;
    o.attn_norm = l.attn_norm;
    o.ffn_norm = l.ffn_norm;
    o.qkv_bias = l.qkv_bias;
    o.q_norm = l.q_norm;
    o.k_norm = l.k_norm;
    o.wqkv = as(l.wqkv, DType::BF16);
    o.wo = as(l.wo, DType::BF16);
    o.post_attn_norm = l.post_attn_norm;
    o.post_ffn_norm = l.post_ffn_norm;
    o.w_gate_up = as(l.w_gate_up, DType::BF16);
    o.w_down = as(l.w_down, DType::BF16);
    w.layers.push_back(std::move(o));
  }
  return w;
}

// The whole pruned forward on the GPU against the CPU backend: the same kept tokens at every
// pruning layer and the same last-row logits. f32 weights: both exact up to summation order.
// bf16 weights: both round the GEMM inputs to bf16 and accumulate in f32, so a different summation
// order can flip a rounding of the next GEMM's input; the logits agree to a few bf16 ulps.
inline void compare_forward(const std::string& path, int64_t T, const char* schedule, PolicyKind kind,
                            DType dtype = DType::F32) {
  CpuContext ctx(2);
  const auto m = Model::load(path, dtype, ctx);
  const ModelConfig& c = m->config();
  std::mt19937 rng(static_cast<uint32_t>(T));
  std::vector<int32_t> ids(static_cast<size_t>(T)), pos(ids.size());
  for (auto& i : ids) i = int32_t(rng() % uint32_t(c.n_vocab));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  const auto steps = resolve_schedule(parse_schedule(schedule), c.n_layer, c.global_layers());
  auto p_cpu = make_policy(kind, 5), p_gpu = make_policy(kind, 5);
  PruneRequest r_cpu{steps, p_cpu.get()}, r_gpu{steps, p_gpu.get()};
  trace::Step s_cpu, s_gpu;
  const int64_t last = T - 1;
  std::vector<float> l_cpu(static_cast<size_t>(c.n_vocab)), l_gpu(l_cpu.size());
  // int8: the CPU backend over the blocks dequantized as the GPU reads them (int8_as_cpu_weights).
  const Weights as_cpu = dtype == DType::Int8 ? int8_as_cpu_weights(m->weights()) : Weights{};
  Session cpu(*m, dtype == DType::Int8
                      ? std::unique_ptr<Backend>(std::make_unique<CpuBackend>(ctx, c, as_cpu, T))
                      : std::unique_ptr<Backend>(std::make_unique<CpuBackend>(ctx, c, m->weights(), T)));
  cpu.forward(ids, pos, {&last, 1}, l_cpu.data(), &r_cpu, &s_cpu);
  Session gpu(*m, cuda::make_backend(c, m->weights(), T));
  gpu.forward(ids, pos, {&last, 1}, l_gpu.data(), &r_gpu, &s_gpu);
  const auto k_cpu = testing::kept_of(s_cpu), k_gpu = testing::kept_of(s_gpu);
  ASSERT_EQ(k_gpu.size(), k_cpu.size());
  for (size_t k = 0; k < k_cpu.size(); ++k) EXPECT_EQ(k_gpu[k], k_cpu[k]) << "step " << k;
  EXPECT_EQ(s_gpu.queries, s_cpu.queries);
  EXPECT_EQ(s_gpu.pairs, s_cpu.pairs);
  EXPECT_EQ(gpu.aux().size(), cpu.aux().size());
  // A mixture of experts: the same rows routed to the same experts at every layer.
  ASSERT_EQ(s_gpu.routes.has_value(), s_cpu.routes.has_value());
  if (s_cpu.routes)
    for (int l = 0; l < c.n_layer; ++l) {
      EXPECT_EQ((*s_gpu.routes)[size_t(l)].positions, (*s_cpu.routes)[size_t(l)].positions) << "layer " << l;
      EXPECT_EQ((*s_gpu.routes)[size_t(l)].experts, (*s_cpu.routes)[size_t(l)].experts) << "layer " << l;
    }
  // The device's has-KV bits: exactly the (token, layer) pairs the CPU computed.
  for (int l = 0; l < c.n_layer; ++l) {
    std::vector<int32_t> want;
    for (int32_t p = 0; p < int32_t(T); ++p)
      if (cpu.computed(l, p)) want.push_back(p);
    EXPECT_EQ(gpu.backend().kv_positions(l), want) << "layer " << l;
  }
  float worst = 0, scale = 0;
  for (size_t i = 0; i < l_cpu.size(); ++i) {
    worst = std::max(worst, std::fabs(l_gpu[i] - l_cpu[i]));
    scale = std::max(scale, std::fabs(l_cpu[i]));
  }
  // bf16: 3e-3 of (1 + the largest logit). On the tiny model the two bf16 paths differ by at most
  // 0.006 (scale 2.9, bound 0.012), while f32 weights on one side and bf16 on the other differ
  // by 0.017, which fails.
  const float tol = (dtype == DType::F32 ? 1e-3f : 3e-3f) * (1 + scale);  // int8: bf16 GEMMs as bf16
  EXPECT_LT(worst, tol) << path << " " << dtype_name(dtype);
  // The same argmax, unless the CPU's two best logits lie within the two paths' own disagreement
  // (2 x tol): such a near-tie is decided by summation order, not by the arithmetic under test
  // (the first GPU run met one with bf16 weights on the tiny random model). Then the GPU's pick
  // must be one of the tied candidates: within 2 x tol of the CPU's best.
  const auto a_cpu = size_t(std::max_element(l_cpu.begin(), l_cpu.end()) - l_cpu.begin());
  const auto a_gpu = size_t(std::max_element(l_gpu.begin(), l_gpu.end()) - l_gpu.begin());
  float second = -INFINITY;
  for (size_t i = 0; i < l_cpu.size(); ++i)
    if (i != a_cpu) second = std::max(second, l_cpu[i]);
  const float gap = l_cpu[a_cpu] - second;
  if (gap > 2 * tol)
    EXPECT_EQ(a_gpu, a_cpu) << path << " " << dtype_name(dtype) << ": top-2 gap " << gap << ", tolerance "
                            << tol;
  else {
    std::printf(
        "note: %s %s: the CPU's top-2 logits are %g apart (tolerance %g): the GPU picked %zu, the CPU %zu\n",
        path.c_str(), dtype_name(dtype), double(gap), double(tol), a_gpu, a_cpu);
    EXPECT_GE(l_cpu[a_gpu], l_cpu[a_cpu] - 2 * tol)
        << path << " " << dtype_name(dtype) << ": near-tie (gap " << gap << ") but the GPU picked token "
        << a_gpu << " at " << l_cpu[a_gpu] << " against the CPU's best " << l_cpu[a_cpu];
  }
}

// Generation with LazyLLM in prefill and decoding (re-selection and revival every step): one engine
// on both backends, so the same GenerateResult: the same greedy tokens and text, the same revivals,
// shares of (token, layer) pairs, K/V and Aux Cache bytes, and the same recorded steps (traces).
inline void compare_generate(const std::string& path, int64_t T, PolicyKind kind,
                             const char* schedule = "0.3:0.3,0.6:0.3,0.9:0.3") {
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  const std::vector<int32_t> ids = testing::random_ids(T, m->config().n_vocab, static_cast<uint32_t>(T) + 1);
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  opt.stop_at_end_of_generation = false;
  opt.policy = kind;
  opt.schedule = parse_schedule(schedule);
  opt.record_steps = true;
  const GenerateResult cpu = generate(ctx, *m, ids, opt);
  const GenerateResult gpu =
      generate(*m, ids, opt, [&](int64_t n) { return cuda::make_backend(m->config(), m->weights(), n); });
  EXPECT_EQ(gpu.generated_ids, cpu.generated_ids);
  EXPECT_EQ(gpu.text, cpu.text);
  EXPECT_EQ(gpu.revivals, cpu.revivals);
  EXPECT_EQ(gpu.decode_steps, cpu.decode_steps);
  EXPECT_DOUBLE_EQ(gpu.prompt_tokens_computed_fraction, cpu.prompt_tokens_computed_fraction);
  EXPECT_DOUBLE_EQ(gpu.all_tokens_computed_fraction, cpu.all_tokens_computed_fraction);
  EXPECT_DOUBLE_EQ(gpu.prompt_tokens_computed_fraction_after_generation,
                   cpu.prompt_tokens_computed_fraction_after_generation);
  EXPECT_EQ(gpu.kv_bytes_used, cpu.kv_bytes_used);
  EXPECT_EQ(gpu.aux_cache_bytes, cpu.aux_cache_bytes);
  EXPECT_EQ(gpu.prefill_stats.queries, cpu.prefill_stats.queries);
  ASSERT_EQ(gpu.decode_stats.size(), cpu.decode_stats.size());
  for (size_t i = 0; i < cpu.decode_stats.size(); ++i) {
    EXPECT_EQ(gpu.decode_stats[i].queries, cpu.decode_stats[i].queries) << "step " << i;
    EXPECT_EQ(gpu.decode_stats[i].attended, cpu.decode_stats[i].attended) << "step " << i;
    EXPECT_EQ(gpu.decode_stats[i].revived, cpu.decode_stats[i].revived) << "step " << i;
    EXPECT_EQ(testing::kept_of(gpu.decode_stats[i]), testing::kept_of(cpu.decode_stats[i])) << "step " << i;
    // A mixture of experts' routes (on the GPU a decoding step's stay on the device and the trace reads
    // them after the step's wait): the same rows to the same experts.
    ASSERT_EQ(gpu.decode_stats[i].routes.has_value(), cpu.decode_stats[i].routes.has_value());
    if (cpu.decode_stats[i].routes) {
      const auto &g = *gpu.decode_stats[i].routes, &h = *cpu.decode_stats[i].routes;
      ASSERT_EQ(g.size(), h.size());
      for (size_t l = 0; l < h.size(); ++l) {
        EXPECT_EQ(g[l].positions, h[l].positions) << "step " << i << ", layer " << l;
        EXPECT_EQ(g[l].experts, h[l].experts) << "step " << i << ", layer " << l;
      }
    }
  }
}

}  // namespace lp
