// The CUDA kernels' arithmetic (kernels/cuda/device_math.h), function by function, against the
// scalar references (kernels/cpu/ref.h) and the engine's own selection and pruning counts: the
// online-softmax recurrence over any tiling, the selection keys' order over 200 random cases.
// The kernels themselves (indexing, tiles, barriers) run thread by thread on the host in the GPU
// suite's host build (lp_gpu_tests_on_host), and on a device in the GPU suite (label `gpu`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/moe.h"
#include "kernels/cpu/ref.h"
#include "kernels/cuda/capability.h"
#include "kernels/cuda/device_math.h"
#include "model/quant.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "tests/random_blocks.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using testing::randn;

namespace cm = lp::cuda_math;

TEST(CudaMath, RmsNormMatchesTheReference) {
  for (int64_t D : {1, 7, 576, 4096}) {
    const int64_t T = 3;
    const auto x = randn(size_t(T * D), 1, 2.0f), w = randn(size_t(D), 2);
    std::vector<float> want(x.size()), got(x.size());
    ref::rmsnorm(x.data(), w.data(), want.data(), T, D, 1e-5f);
    for (int64_t t = 0; t < T; ++t) {
      // The kernel: 32-lane partial sums in f32, then a tree over the lanes.
      float lanes[32] = {};
      for (int64_t i = 0; i < D; ++i) lanes[i % 32] += x[size_t(t * D + i)] * x[size_t(t * D + i)];
      for (int off = 16; off > 0; off /= 2)
        for (int l = 0; l < off; ++l) lanes[l] += lanes[l + off];
      const float scale = cm::rms_scale(lanes[0], D, 1e-5f);
      for (int64_t i = 0; i < D; ++i)
        got[size_t(t * D + i)] = cm::rms_apply(x[size_t(t * D + i)], scale, w[size_t(i)]);
    }
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 2e-5f * (1 + std::fabs(want[i]))) << D;
  }
}

TEST(CudaMath, RopeAtOriginalPositionsMatchesTheReference) {
  const int64_t H = 3, Dh = 64, rope_dim = 64;
  const std::vector<int32_t> pos = {0, 5, 17, 1000, 131071};  // pruned gathers: any positions
  const int64_t T = int64_t(pos.size());
  std::vector<float> factors(static_cast<size_t>(rope_dim / 2));
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + float(i % 5);
  for (const float* ff : {static_cast<const float*>(nullptr), static_cast<const float*>(factors.data())}) {
    const auto x = randn(size_t(T * H * Dh), 3);
    std::vector<float> want = x, got = x;
    ref::rope(want.data(), pos.data(), T, H, Dh, rope_dim, 500000.0f, ff);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < rope_dim / 2; ++i) {
        float c, s;
        cm::rope_cos_sin(pos[size_t(t)], i, rope_dim, 500000.0f, ff ? ff[i] : 1.0f, &c, &s);
        for (int64_t h = 0; h < H; ++h) {
          float* v = got.data() + (t * H + h) * Dh;
          cm::rope_rotate(v[2 * i], v[2 * i + 1], c, s, &v[2 * i], &v[2 * i + 1]);
        }
      }
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f * (1 + std::fabs(want[i])));
  }
}

TEST(CudaMath, SwigluMatchesTheReference) {
  const auto g = randn(1000, 4, 4.0f), u = randn(1000, 5);
  std::vector<float> want(1000);
  ref::swiglu(g.data(), u.data(), want.data(), 1000);
  for (size_t i = 0; i < 1000; ++i)
    EXPECT_NEAR(cm::silu_mul(g[i], u[i]), want[i], 1e-5f * (1 + std::fabs(want[i])));
}

// The online-softmax recurrence: per (query row, head), key tiles of `tile` in order, logits in
// f32, f32 accumulators (tile sizes other than the kernel's, to check the recurrence itself).
std::vector<float> tiled_attention(const std::vector<float>& q, const std::vector<int32_t>& q_pos,
                                   const std::vector<float>& k, const std::vector<float>& v,
                                   const std::vector<int32_t>& k_pos, int64_t H, int64_t Hkv, int64_t Dh,
                                   int64_t tile) {
  const int64_t T = int64_t(q_pos.size()), S = int64_t(k_pos.size());
  const float scale = 1.0f / std::sqrt(float(Dh));
  std::vector<float> out(static_cast<size_t>(T * H * Dh));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      cm::OnlineSoftmax st;
      std::vector<float> acc(static_cast<size_t>(Dh), 0.0f), logit(static_cast<size_t>(tile));
      for (int64_t s0 = 0; s0 < S; s0 += tile) {
        const int64_t n = std::min(tile, S - s0);
        float tmax = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t s = s0 + j;
          if (!cm::visible(k_pos[size_t(s)], q_pos[size_t(t)])) {
            logit[size_t(j)] = -INFINITY;
            continue;
          }
          float dot = 0;
          for (int64_t d = 0; d < Dh; ++d)
            dot += q[size_t((t * H + h) * Dh + d)] * k[size_t((s * Hkv + g) * Dh + d)];
          logit[size_t(j)] = dot * scale;
          tmax = std::max(tmax, logit[size_t(j)]);
        }
        if (tmax == -INFINITY) continue;  // a tile with no visible key changes nothing
        const float alpha = cm::online_rescale(st, tmax);
        for (float& a : acc) a *= alpha;
        for (int64_t j = 0; j < n; ++j) {
          const float w = cm::online_weight(st, logit[size_t(j)]);
          st.l += w;
          for (int64_t d = 0; d < Dh; ++d) acc[size_t(d)] += w * v[size_t(((s0 + j) * Hkv + g) * Dh + d)];
        }
      }
      for (int64_t d = 0; d < Dh; ++d)
        out[size_t((t * H + h) * Dh + d)] = cm::online_finish(st, acc[size_t(d)]);
    }
  return out;
}

TEST(CudaMath, TiledOnlineSoftmaxAttentionMatchesTheReference) {
  struct Case {
    int64_t T, S, H, Hkv, Dh, tile;
  };
  // Awkward shapes: S not a multiple of the tile, one query row, 3 heads per KV head, a tile of 1.
  for (const Case c : {Case{5, 37, 6, 2, 16, 16}, Case{1, 130, 9, 3, 64, 64}, Case{8, 8, 4, 4, 8, 1},
                       Case{3, 200, 32, 8, 128, 64}}) {
    SCOPED_TRACE(::testing::Message() << c.T << "x" << c.S << " H" << c.H << "/" << c.Hkv << " Dh" << c.Dh);
    // Pruned keys: an increasing subset of positions; queries at the last positions, one of
    // them before every key (a row that sees nothing gives zeros).
    std::vector<int32_t> k_pos(static_cast<size_t>(c.S)), q_pos(static_cast<size_t>(c.T));
    for (int64_t s = 0; s < c.S; ++s) k_pos[size_t(s)] = int32_t(3 + 2 * s + (s % 3));
    for (int64_t t = 0; t < c.T; ++t) q_pos[size_t(t)] = k_pos[size_t(c.S - 1)] - int32_t(c.T - 1 - t) * 3;
    q_pos[0] = std::min(q_pos[0], 1);
    const auto q = randn(size_t(c.T * c.H * c.Dh), 7, 2.0f);
    const auto k = randn(size_t(c.S * c.Hkv * c.Dh), 8, 2.0f);
    const auto v = randn(size_t(c.S * c.Hkv * c.Dh), 9);
    std::vector<float> want(q.size());
    ref::attention(q.data(), q_pos.data(), c.T, k.data(), v.data(), k_pos.data(), c.S, c.H, c.Hkv, c.Dh,
                   want.data());
    const auto got = tiled_attention(q, q_pos, k, v, k_pos, c.H, c.Hkv, c.Dh, c.tile);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-5f * (1 + std::fabs(want[i])));
  }
}

TEST(CudaMath, LastRowScoresMatchTheReference) {
  const int64_t S = 300, H = 9, Hkv = 3, Dh = 64;
  const auto q = randn(size_t(H * Dh), 10, 2.0f), k = randn(size_t(S * Hkv * Dh), 11, 2.0f);
  std::vector<double> want(static_cast<size_t>(S));
  ref::last_row_scores(q.data(), k.data(), S, H, Hkv, Dh, want.data());
  // The kernel: logits [H][S] in f32, per-head max and sum (f32), then per key the sum over heads.
  std::vector<float> logit(static_cast<size_t>(H * S));
  std::vector<float> m(static_cast<size_t>(H), -INFINITY), l(static_cast<size_t>(H), 0.0f);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < S; ++s) {
      float dot = 0;
      for (int64_t d = 0; d < Dh; ++d)
        dot += q[size_t(h * Dh + d)] * k[size_t((s * Hkv + h / (H / Hkv)) * Dh + d)];
      logit[size_t(h * S + s)] = dot / std::sqrt(float(Dh));
      m[size_t(h)] = std::max(m[size_t(h)], logit[size_t(h * S + s)]);
    }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < S; ++s) l[size_t(h)] += std::exp(logit[size_t(h * S + s)] - m[size_t(h)]);
  double total = 0;
  for (int64_t s = 0; s < S; ++s) {
    float score = 0;
    for (int64_t h = 0; h < H; ++h)
      score += cm::head_share(logit[size_t(h * S + s)], m[size_t(h)], l[size_t(h)], H);
    EXPECT_NEAR(score, want[size_t(s)], 1e-5 * (1 + want[size_t(s)]) + 1e-7);
    total += score;
  }
  EXPECT_NEAR(total, 1.0, 1e-4);  // a mean of probability distributions
}

// The device's routing of a row against the CPU backend's (kernels/cpu/moe.h route_top_k): the same
// experts in the same order, ties included (repeated logits go to the lower id), the weights within a
// few ulps; every k from 1 to E.
TEST(CudaMath, RouteRowPicksWhatTheCpuRoutingPicks) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t E = 1 + int64_t(rng() % 70), k = 1 + int64_t(rng() % uint32_t(E));
    std::vector<float> z(static_cast<size_t>(E));
    for (auto& v : z) v = rng() % 4 == 0 ? float(rng() % 3) : std::normal_distribution<float>(0, 3)(rng);
    std::vector<int32_t> want_ids(static_cast<size_t>(k)), got_ids(want_ids.size());
    std::vector<float> want_w(want_ids.size()), got_w(want_ids.size());
    route_top_k(z.data(), 1, E, k, want_ids.data(), want_w.data());
    cm::route_row(z.data(), E, k, got_ids.data(), got_w.data());
    ASSERT_EQ(got_ids, want_ids) << "trial " << trial << " E " << E << " k " << k;
    for (int64_t j = 0; j < k; ++j)
      ASSERT_NEAR(got_w[size_t(j)], want_w[size_t(j)], 1e-6f * (1 + want_w[size_t(j)]));
  }
  // One expert far ahead: all the weight; the others' probabilities underflow to 0, and the next pick
  // among them is the lowest id.
  const float z[4] = {0, -200, -200, -200};
  int32_t ids[2];
  float w[2];
  cm::route_row(z, 4, 2, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_FLOAT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], 0.0f);
}

TEST(CudaMath, SelectionKeysKeepWhatTheEnginesSelectionKeeps) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 2 + int64_t(rng() % 300);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::vector<float> scores(static_cast<size_t>(n));
    int32_t p = 0;
    for (int64_t i = 0; i < n; ++i) {
      p += 1 + int32_t(rng() % 4);
      pos[size_t(i)] = p;
      // Ties on purpose, zeros, negatives and tiny values.
      const int r = int(rng() % 6);
      scores[size_t(i)] = r == 0   ? 0.0f
                          : r == 1 ? 0.25f
                          : r == 2 ? -1e-30f
                          : r == 3 ? -0.0f
                                   : float(rng() % 1000) * 1e-4f;
    }
    const int64_t keep = 1 + int64_t(rng() % uint32_t(n));
    const auto want = select_top(pos, scores, keep);
    // The kernel: keys of all but the last token sorted descending, the first keep - 1 kept, the
    // last token always, then by position.
    std::vector<std::pair<uint64_t, int64_t>> keys;
    for (int64_t i = 0; i + 1 < n; ++i)
      keys.emplace_back(cm::selection_key(scores[size_t(i)], pos[size_t(i)]), i);
    std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<int64_t> got;
    for (int64_t i = 0; i < std::min<int64_t>(keep, n) - 1; ++i) got.push_back(keys[size_t(i)].second);
    got.push_back(n - 1);
    std::sort(got.begin(), got.end());
    if (keep >= n) {
      got.resize(size_t(n));
      std::iota(got.begin(), got.end(), 0);
    }
    ASSERT_EQ(got, want) << "trial " << trial;
  }
}

TEST(CudaMath, CountsAgreeWithTheHost) {
  for (int64_t n = 1; n < 3000; n += 7)
    for (double share : {0.0, 0.1, 0.3, 0.5, 0.7, 0.99})
      ASSERT_EQ(cm::tokens_kept(n, share), lp::tokens_kept(n, share)) << n << " " << share;
}

// open_device()'s refusal of a GPU the build's kernels do not cover (kernels/cuda/capability.h), by
// CMake's rules for CMAKE_CUDA_ARCHITECTURES entries and the kernels' own floor (sm_80's bf16 mma).
TEST(CudaMath, AGpuTheKernelsDoNotCoverIsRefusedNamingTheAlternatives) {
  using lp::cuda::unsupported_capability;
  // The default build (machine code and PTX for 8.0, 8.9 and 9.0): every GPU from 8.0 on, a later one
  // through the PTX of 9.0.
  for (const auto& [ma, mi] :
       std::vector<std::pair<int, int>>{{8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 0}})
    EXPECT_EQ(unsupported_capability("gpu", ma, mi, "80,89,90"), "") << ma << "." << mi;
  const std::string t4 = unsupported_capability("Tesla T4", 7, 5, "80,89,90");
  EXPECT_NE(t4.find("'Tesla T4' has compute capability 7.5"), std::string::npos) << t4;
  EXPECT_NE(t4.find("8.0 or newer"), std::string::npos) << t4;
  EXPECT_NE(t4.find("--backend cpu"), std::string::npos) << t4;
  // Machine code alone runs on its major at the same or a later minor; PTX alone on anything later.
  EXPECT_EQ(unsupported_capability("gpu", 8, 6, "80-real"), "");
  EXPECT_EQ(unsupported_capability("gpu", 9, 0, "80-virtual"), "");
  const std::string h100 = unsupported_capability("NVIDIA H100", 9, 0, "80-real;86-real");
  EXPECT_NE(h100.find("for compute capability 8.0, 8.6"), std::string::npos) << h100;
  EXPECT_NE(h100.find("-DCMAKE_CUDA_ARCHITECTURES=90"), std::string::npos) << h100;
  EXPECT_NE(h100.find("--backend cpu"), std::string::npos) << h100;
  EXPECT_NE(unsupported_capability("gpu", 8, 0, "86"), "");  // older than every entry
  // Arch-specific code (sm_90a) only on exactly 9.0.
  EXPECT_EQ(unsupported_capability("gpu", 9, 0, "90a"), "");
  EXPECT_NE(unsupported_capability("gpu", 10, 0, "90a"), "");
  // Lists CMake resolves itself are taken as covering the GPU (above the floor).
  EXPECT_EQ(unsupported_capability("gpu", 8, 9, "native"), "");
  EXPECT_EQ(unsupported_capability("gpu", 9, 0, "all-major"), "");
  EXPECT_NE(unsupported_capability("gpu", 7, 0, "native"), "");
}

TEST(CudaMath, Bf16RoundsToNearestEven) {
  const auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  EXPECT_EQ(cm::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(cm::f32_to_bf16(bits(0x3f808000u)), 0x3f80);  // a tie: to the even mantissa
  EXPECT_EQ(cm::f32_to_bf16(bits(0x3f818000u)), 0x3f82);  // a tie: up to the even one
  EXPECT_EQ(cm::f32_to_bf16(bits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(cm::f32_to_bf16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(cm::bf16_to_f32(cm::f32_to_bf16(NAN))));
  EXPECT_EQ(cm::bf16_to_f32(0x3f80), 1.0f);
}

// The half -> f32 conversion the GPU's block reads use, for all 65,536 halves, against the CPU's.
TEST(CudaMath, HalfToFloatIsExactForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = f16_to_f32(uint16_t(h)), got = cuda_math::f16_to_f32(uint16_t(h));
    if (std::isnan(want))
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    else
      ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << std::hex << h << ": " << got << " vs " << want;
  }
}

// The f32 -> half rounding the GPU's f16 K/V cache stores with (the instruction there, by hand in
// the host emulation), against two implementations nobody here wrote (tests/test_util.h's f16_round:
// the compiler's _Float16, or F16C's vcvtps2ph under clang) and model/quant's: every value of a
// stride through all 2^32 patterns, and every half's neighbourhood (the value itself, the ties
// halfway to the next half and a pattern either side of each tie). NaNs must stay NaNs; everything
// else bit for bit.
TEST(CudaMath, FloatToHalfRoundsAsTheCpusCacheDoes) {
  const auto check = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    const uint16_t got = cuda_math::f32_to_f16(f), quant = f32_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(cuda_math::f16_to_f32(got))) << std::hex << u;
      return;
    }
    const float back = cuda_math::f16_to_f32(got), want = testing::f16_round(f);
    ASSERT_EQ(std::memcmp(&back, &want, 4), 0)
        << std::hex << "f32 " << u << " (" << f << "): " << back << " vs " << want;
    ASSERT_EQ(got, quant) << std::hex << "f32 " << u << " (" << f << ")";
  };
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 997) ASSERT_NO_FATAL_FAILURE(check(uint32_t(u)));
  for (uint32_t h = 0; h < 0x7c00; ++h)
    for (const uint32_t sign : {0u, 0x80000000u}) {
      const float lo = cuda_math::f16_to_f32(uint16_t(h)), hi = cuda_math::f16_to_f32(uint16_t(h + 1));
      const float mid = float((double(lo) + double(hi)) / 2);  // exact: two halves' mean fits an f32
      uint32_t a, b;
      std::memcpy(&a, &lo, 4);
      std::memcpy(&b, &mid, 4);
      for (const uint32_t u : {a, b - 1, b, b + 1}) ASSERT_NO_FATAL_FAILURE(check(u | sign));
    }
  for (const uint32_t u : {0x477fefffu, 0x477ff000u, 0x477ff001u})  // 65,520, the tie above 65,504
    for (const uint32_t sign : {0u, 0x80000000u}) ASSERT_NO_FATAL_FAILURE(check(u | sign));
}

// The elements of a row of blocks as the GPU's int8 kernels read them (8-element units, which must
// cover the row once), against model/quant's dequantizer of the whole row; the ggml type ids the
// GPU names are the file's.
TEST(CudaMath, BlockElementsAreWhatTheDequantizerGives) {
  EXPECT_EQ(int(cuda_math::kQ8_0), int(GgmlType::Q8_0));
  EXPECT_EQ(int(cuda_math::kQ4_0), int(GgmlType::Q4_0));
  EXPECT_EQ(int(cuda_math::kQ4_1), int(GgmlType::Q4_1));
  EXPECT_EQ(int(cuda_math::kQ4_K), int(GgmlType::Q4_K));
  EXPECT_EQ(int(cuda_math::kQ5_0), int(GgmlType::Q5_0));
  EXPECT_EQ(int(cuda_math::kQ5_1), int(GgmlType::Q5_1));
  EXPECT_EQ(int(cuda_math::kQ5_K), int(GgmlType::Q5_K));
  EXPECT_EQ(int(cuda_math::kQ6_K), int(GgmlType::Q6_K));
  for (const GgmlType t : testing::kQuantTypes) {
    EXPECT_TRUE(cuda_math::readable(int(t)));
    EXPECT_EQ(cuda_math::has_minima(int(t)), block_has_min(t));
    const int64_t K = 768;  // 24 blocks of 32, 3 super-blocks of 256
    const auto row = testing::random_q_rows(t, 1, K, 11);
    std::vector<float> want(static_cast<size_t>(K));
    dequantize(t, row.data(), want.data(), K);
    std::vector<int> seen(static_cast<size_t>(K));
    for (int64_t u = 0; u < K / 8; ++u) {
      int64_t k[2];
      float w[8];
      cuda_math::q_unit(row.data(), int(t), u, k, w);
      for (int e = 0; e < 8; ++e) {
        const int64_t at = k[e / 4] + e % 4;
        ASSERT_TRUE(at >= 0 && at < K) << "type " << int(t) << " unit " << u;
        ++seen[size_t(at)];
        ASSERT_NEAR(w[e], want[size_t(at)], 1e-6f * (1 + std::fabs(want[size_t(at)])))
            << "type " << int(t) << " element " << at;
      }
    }
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(seen[size_t(k)], 1) << "type " << int(t) << " element " << k;
  }
}

}  // namespace
}  // namespace lp
