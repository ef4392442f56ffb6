// Fast CPU kernels against the scalar references (kernels/cpu/ref.h), on awkward shapes:
// single tokens, odd counts, gapped positions (what pruning produces), GQA groups of 1 and 3.
// Tolerances are derived from the arithmetic, not tuned: see each bound's comment.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ref.h"
#include "model/error.h"
#include "model/quant.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using testing::randn;

constexpr double kU = 1.0 / (1 << 24);  // f32 unit roundoff

Matrix make_matrix(const std::vector<float>& w, int64_t N, int64_t K, DType dt) {
  Matrix m;
  m.rows = N;
  m.cols = K;
  m.dtype = dt;
  if (dt == DType::F32) {
    m.f32.resize(N * K);
    std::copy(w.begin(), w.end(), m.f32.data());
  } else {
    m.bf16.resize(N * K);
    for (int64_t i = 0; i < N * K; ++i) m.bf16[i] = f32_to_bf16(w[i]);
  }
  return m;
}

class GemmTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, DType, int>> {};

TEST_P(GemmTest, MatchesReference) {
  const auto [M, K, N, dt, threads] = GetParam();
  const auto a = randn(M * K, 1), w = randn(N * K, 2);
  CpuContext ctx(threads);
  Gemm g;
  const Matrix W = make_matrix(w, N, K, dt);
  // Output written with a row stride wider than N, to check ldc is honoured.
  const int64_t ldc = N + 3;
  std::vector<float> c(size_t(M * ldc), -7.0f), ref(size_t(M * N));
  g.run(ctx, a.data(), M, K, W, c.data(), ldc);
  ref::matmul(a.data(), w.data(), ref.data(), M, K, N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double mag = 0;
      for (int64_t k = 0; k < K; ++k) mag += std::fabs(double(a[m * K + k]) * w[n * K + k]);
      // f32: a dot product of K terms has error <= K*u*sum|a_k w_k| (Higham, worst case).
      // bf16: each factor is rounded to 8 significant bits first (relative 2^-9 each), so the
      // products carry up to 2*2^-9 = 2^-8 relative error before the f32 accumulation.
      const double bound = (dt == DType::F32 ? 0.0 : 1.0 / 256) * mag + K * kU * mag + 1e-30;
      ASSERT_NEAR(c[m * ldc + n], ref[m * N + n], bound) << "m=" << m << " n=" << n;
    }
  for (int64_t m = 0; m < M; ++m) ASSERT_EQ(c[m * ldc + N], -7.0f) << "wrote past N";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Values(
        std::make_tuple(1, 64, 96, DType::F32, 2), std::make_tuple(33, 96, 160, DType::F32, 2),
        std::make_tuple(40, 96, 192, DType::F32, 1), std::make_tuple(17, 111, 19, DType::F32, 2),
        std::make_tuple(111, 576, 989, DType::F32, 2), std::make_tuple(2, 96, 64, DType::F32, 1),
        std::make_tuple(1, 64, 96, DType::BF16, 2), std::make_tuple(3, 577, 130, DType::BF16, 2),
        std::make_tuple(4, 577, 130, DType::F32, 2), std::make_tuple(5, 64, 70, DType::F32, 2),
        std::make_tuple(17, 111, 19, DType::BF16, 2), std::make_tuple(111, 576, 989, DType::BF16, 2)));

TEST(Ops, RmsNormMatchesReference) {
  for (int64_t T : {1, 2, 17}) {
    const int64_t D = 111;
    const auto x = randn(T * D, 3, 3.0f), w = randn(D, 4);
    std::vector<float> out(size_t(T * D)), ref(size_t(T * D));
    CpuContext ctx(2);
    rmsnorm(ctx, x.data(), w.data(), out.data(), T, D, 1e-5f);
    ref::rmsnorm(x.data(), w.data(), ref.data(), T, D, 1e-5f);
    // Sum of D squares (D*u relative), sqrt and two products: (D + 4) u relative.
    for (int64_t i = 0; i < T * D; ++i) ASSERT_NEAR(out[i], ref[i], (D + 4) * kU * std::fabs(ref[i]) + 1e-30);
  }
}

TEST(Ops, RopeMatchesReferenceAtGappedPositions) {
  const int64_t T = 17, nh = 3, Dh = 64;
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(t * t * 7 + 3);  // up to 1795, non-contiguous
  auto x = randn(T * nh * Dh, 5), ref = x;
  CpuContext ctx(2);
  const float ff[32] = {1, 1, 1, 2, 4, 8, 8, 8, 1, 1, 1, 1, 1, 1, 1, 1,
                        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (const float* factors : {static_cast<const float*>(nullptr), ff}) {
    const RopeTable tab = rope_table(pos.data(), T, Dh, 10000.0f, factors);
    auto y = x;
    rope(ctx, y.data(), T, nh * Dh, nh, Dh, tab);
    ref = x;
    ref::rope(ref.data(), pos.data(), T, nh, Dh, Dh, 10000.0f, factors);
    // cos/sin are rounded to f32 (u each) and the rotation adds two products: |err| <=
    // 4u * (|x0| + |x1|); bounded by 4u * 2 * max|x|.
    float mx = 0;
    for (float v : x) mx = std::max(mx, std::fabs(v));
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 8 * kU * mx);
  }
}

TEST(Ops, SwigluAndExpMatchReference) {
  const int64_t T = 3, F = 37;
  const auto g = randn(T * F, 6, 4.0f), u = randn(T * F, 7);
  std::vector<float> out(size_t(T * F)), ref(size_t(T * F));
  CpuContext ctx(2);
  swiglu(ctx, g.data(), F, u.data(), F, out.data(), F, T, F);
  ref::swiglu(g.data(), u.data(), ref.data(), T * F);
  // exp has relative error ~1e-7 (degree-7 polynomial + scaling); silu adds a divide and a
  // product: 16u relative covers it.
  for (int64_t i = 0; i < T * F; ++i) ASSERT_NEAR(out[i], ref[i], 16 * kU * std::fabs(ref[i]) + 1e-30);

  std::vector<float> xs;
  for (float x = -110.0f; x < 90.0f; x += 0.37f) xs.push_back(x);
  xs.push_back(-INFINITY);
  auto e = xs;
  exp_inplace(e.data(), int64_t(e.size()));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = std::exp(double(xs[i]));
    if (want < std::numeric_limits<float>::min()) {
      ASSERT_EQ(e[i], 0.0f) << xs[i];  // below the normal range: 0, never a subnormal (simd.h, kExpMin)
      continue;
    }
    if (want > 3.4028234663852886e38) {
      ASSERT_TRUE(std::isinf(e[i])) << xs[i];  // overflow region
      continue;
    }
    ASSERT_NEAR(e[i], want, 4 * kU * want) << "x=" << xs[i];
  }
}

// Attention: queries at positions q_pos over a cache that may already hold keys (decode) and
// whose positions are gapped (pruned prefill).
struct AttnCase {
  int64_t T, cached, H, Hkv, Dh;
  bool gapped;
};

// The values an f16 cache holds: the compiler's or the CPU's f16 rounding (to nearest even), not ours.
std::vector<float> f16_rounded(std::vector<float> x) {
  for (float& e : x) e = testing::f16_round(e);
  return x;
}

class AttentionTest : public ::testing::TestWithParam<std::tuple<AttnCase, KvType>> {};

// With an f16 cache, the reference attends over the keys and values rounded to f16 (the inputs'
// rounding, the cache's only difference), within the same bound.
TEST_P(AttentionTest, MatchesReference) {
  const auto [p, type] = GetParam();
  const int64_t S = p.cached + p.T, Q = p.H * p.Dh, KV = p.Hkv * p.Dh;
  std::vector<int32_t> pos(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) pos[s] = int32_t(p.gapped ? 3 * s + (s % 2) : s);
  const auto q = randn(p.T * Q, 11);
  auto k = randn(S * KV, 12), v = randn(S * KV, 13);
  CpuContext ctx(2);
  LayerKV kv;
  kv.init(S + 5, p.Hkv, p.Dh, type);
  if (p.cached) kv.append(k.data(), KV, v.data(), KV, pos.data(), p.cached);
  kv.append(k.data() + p.cached * KV, KV, v.data() + p.cached * KV, KV, pos.data() + p.cached, p.T);
  std::vector<float> out(size_t(p.T * Q)), ref(size_t(p.T * Q));
  attention(ctx, q.data(), Q, pos.data() + p.cached, p.T, KeySet{kv}, p.H, out.data(), Q);
  if (type == KvType::F16) k = f16_rounded(k), v = f16_rounded(v);
  ref::attention(q.data(), pos.data() + p.cached, p.T, k.data(), v.data(), pos.data(), S, p.H, p.Hkv, p.Dh,
                 ref.data());
  // A score q.k/sqrt(Dh) carries error <= Dh*u*sum|q_d k_d|/sqrt(Dh) =: delta; softmax weights
  // then move by at most a factor e^(2 delta) ~ 1 + 2 delta, plus the polynomial exp (~8u) and
  // the sum; the output (a convex combination of values) moves by <= (2 delta + 16u + S*u)*max|v|.
  double max_qk = 0, max_v = 0;
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t h = 0; h < p.H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        double m = 0;
        for (int64_t d = 0; d < p.Dh; ++d)
          m += std::fabs(q[t * Q + h * p.Dh + d] * k[s * KV + (h / (p.H / p.Hkv)) * p.Dh + d]);
        max_qk = std::max(max_qk, m);
      }
  for (float x : v) max_v = std::max(max_v, double(std::fabs(x)));
  const double delta = p.Dh * kU * max_qk / std::sqrt(double(p.Dh));
  const double tol = (2 * delta + 16 * kU + S * kU) * max_v;
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], tol) << "i=" << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Combine(::testing::Values(AttnCase{1, 0, 4, 2, 64, false}, AttnCase{2, 0, 9, 3, 64, false},
                                         AttnCase{17, 0, 9, 3, 64, true}, AttnCase{111, 0, 4, 4, 64, false},
                                         AttnCase{1, 110, 9, 3, 64, true}, AttnCase{19, 40, 6, 2, 64, true},
                                         AttnCase{17, 5, 4, 2, 32, true}, AttnCase{111, 0, 2, 1, 48, false},
                                         AttnCase{33, 0, 6, 2, 16, false}, AttnCase{1, 300, 9, 3, 64, false},
                                         // Decoding past one key chunk (512): split by keys, merged.
                                         AttnCase{1, 1300, 9, 3, 64, false},
                                         AttnCase{4, 1100, 8, 2, 128, true}),
                       ::testing::Values(KvType::F32, KvType::F16)));

// An f16 cache holds each value as f16_round rounds it, including the signed zero, the largest
// finite f16, values past it (infinity) and subnormals; positions and order as an f32 cache.
TEST(Ops, F16CacheHoldsTheRoundedValues) {
  const std::vector<float> special = {0.0f, -0.0f, 65504.0f, 65520.0f, -1e6f, 6.0e-8f, 1.0f / 3, 3.14159f};
  const int64_t Hkv = 2, Dh = 4, KV = Hkv * Dh, T = 70;  // past one key block of 64
  auto k = randn(T * KV, 41), v = randn(T * KV, 42);
  std::copy(special.begin(), special.end(), k.begin());
  std::copy(special.rbegin(), special.rend(), v.begin() + KV);
  std::vector<int32_t> pos(T);
  std::iota(pos.begin(), pos.end(), 3);
  LayerKV kv;
  kv.init(T, Hkv, Dh, KvType::F16);
  kv.append(k.data(), KV, v.data(), KV, pos.data(), T);
  const auto kr = f16_rounded(k), vr = f16_rounded(v);
  for (int64_t s = 0; s < T; ++s)
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t d = 0; d < Dh; ++d) {
        const float key = f16_to_f32(kv.kt16[kv.kt_index(g, d, s)]);
        const float val = f16_to_f32(kv.v16[kv.v_index(g, s) + d]);
        ASSERT_EQ(std::bit_cast<uint32_t>(key), std::bit_cast<uint32_t>(kr[size_t(s * KV + g * Dh + d)]))
            << "key slot " << s;
        ASSERT_EQ(std::bit_cast<uint32_t>(val), std::bit_cast<uint32_t>(vr[size_t(s * KV + g * Dh + d)]))
            << "value slot " << s;
      }
}

TEST(Ops, KvAppendKeepsSlotOrderAndRejectsBadRows) {
  LayerKV kv;
  kv.init(8, 1, 4);
  std::vector<float> k(8, 1.0f);
  const int32_t p[2] = {5, 9};
  kv.append(k.data(), 4, k.data(), 4, p, 2);
  EXPECT_TRUE(kv.sorted);
  const int32_t down[2] = {3, 2};
  EXPECT_THROW(kv.append(k.data(), 4, k.data(), 4, down, 2), Error);
  const int32_t negative[1] = {-1};
  EXPECT_THROW(kv.append(k.data(), 4, k.data(), 4, negative, 1), Error);
  const int32_t old[1] = {7};  // a revived token: before a held one
  kv.append(k.data(), 4, k.data(), 4, old, 1);
  EXPECT_FALSE(kv.sorted);
  EXPECT_EQ(kv.n, 3);
  EXPECT_EQ(std::vector<int32_t>(kv.pos.begin(), kv.pos.begin() + 3), (std::vector<int32_t>{5, 9, 7}));
  EXPECT_EQ(kv.cap, kKeyBlock);  // 8 rounded up to a key block
  std::vector<float> many(4 * 62, 1.0f);
  std::vector<int32_t> far(62);
  std::iota(far.begin(), far.end(), 100);
  EXPECT_THROW(kv.append(many.data(), 4, many.data(), 4, far.data(), 62), Error);  // 3 + 62 > 64
}

// Attention over a key subset listed by slot in a cache whose slots are out of position order
// (revived tokens appended late), against the reference over exactly those keys.
void attention_over_slot_list(KvType type);
TEST(Ops, AttentionOverSlotListMatchesReference) {
  for (const KvType type : {KvType::F32, KvType::F16}) {
    SCOPED_TRACE(kv_type_name(type));
    attention_over_slot_list(type);
  }
}

void attention_over_slot_list(KvType type) {
  const int64_t H = 9, Hkv = 3, Dh = 64, Q = H * Dh, KV = Hkv * Dh, S = 150;
  auto k = randn(S * KV, 31), v = randn(S * KV, 32);
  // Slot order: even positions first (as a pruned prefill would hold them), then the odd ones
  // appended later in two revival batches.
  std::vector<int32_t> order;
  for (int32_t p = 0; p < S; p += 2) order.push_back(p);
  for (int32_t p = 1; p < S; p += 4) order.push_back(p);
  for (int32_t p = 3; p < S; p += 4) order.push_back(p);
  LayerKV kv;
  kv.init(S, Hkv, Dh, type);
  std::vector<int32_t> slot_of(S);
  for (size_t j = 0; j < order.size(); ++j) slot_of[size_t(order[j])] = int32_t(j);
  size_t i = 0;
  for (size_t end : {size_t(S / 2), size_t(S / 2 + (S + 2) / 4), order.size()}) {
    std::vector<float> kb, vb;
    std::vector<int32_t> pb;
    for (; i < end; ++i) {
      const int32_t p = order[i];
      kb.insert(kb.end(), k.begin() + p * KV, k.begin() + (p + 1) * KV);
      vb.insert(vb.end(), v.begin() + p * KV, v.begin() + (p + 1) * KV);
      pb.push_back(p);
    }
    kv.append(kb.data(), KV, vb.data(), KV, pb.data(), int64_t(pb.size()));
  }
  ASSERT_FALSE(kv.sorted);
  // The active keys: positions not divisible by 3 (ascending), and three query rows among them.
  std::vector<int32_t> keys, slots;
  for (int32_t p = 0; p < S; ++p)
    if (p % 3 != 0) {
      keys.push_back(p);
      slots.push_back(slot_of[size_t(p)]);
    }
  const std::vector<int32_t> qpos = {1, 77, 149};
  const auto q = randn(int64_t(qpos.size()) * Q, 33);
  CpuContext ctx(2);
  std::vector<float> out(qpos.size() * Q);
  attention(ctx, q.data(), Q, qpos.data(), int64_t(qpos.size()), KeySet{kv, slots}, H, out.data(), Q);
  if (type == KvType::F16) k = f16_rounded(k), v = f16_rounded(v);
  std::vector<float> ks, vs;
  for (int32_t p : keys) {
    ks.insert(ks.end(), k.begin() + p * KV, k.begin() + (p + 1) * KV);
    vs.insert(vs.end(), v.begin() + p * KV, v.begin() + (p + 1) * KV);
  }
  std::vector<float> ref(out.size());
  ref::attention(q.data(), qpos.data(), int64_t(qpos.size()), ks.data(), vs.data(), keys.data(),
                 int64_t(keys.size()), H, Hkv, Dh, ref.data());
  for (size_t j = 0; j < out.size(); ++j) ASSERT_NEAR(out[j], ref[j], 2e-5) << "j=" << j;
  // Without a slot list an out-of-order cache is refused rather than misread.
  EXPECT_THROW(attention(ctx, q.data(), Q, qpos.data(), 1, KeySet{kv}, H, out.data(), Q), Error);
}

// A decoding step past a pruning layer: the cache holds a random 70% of 700 positions in order,
// then revived ones appended out of order; the key set leaves some held keys out; the query rows
// (revived tokens and the new one, in position order, then the same rows shuffled) see the listed
// keys up to their positions, block by block and key by key. Against the reference over exactly
// the keys each row sees.
TEST(Ops, AttentionOverRevivedKeysMatchesReference) {
  // 24 revived rows (75 per kv group: split by rows) and 3 (12: split by keys, the chunks merged);
  // sparse: few listed keys.
  struct Case {
    KvType type;
    int n_revived;
    bool sparse;
  };
  for (const Case& c :
       {Case{KvType::F32, 24, false}, Case{KvType::F16, 24, false}, Case{KvType::F32, 24, true},
        Case{KvType::F16, 24, true}, Case{KvType::F32, 3, false}, Case{KvType::F16, 3, false}}) {
    const auto [type, n_revived, sparse] = c;
    SCOPED_TRACE(std::string(kv_type_name(type)) + ", revived " + std::to_string(n_revived) +
                 (sparse ? ", sparse" : ""));
    const int64_t H = 9, Hkv = 3, Dh = 64, Q = H * Dh, KV = Hkv * Dh, S = 700;
    auto k = randn(S * KV, 41), v = randn(S * KV, 42);
    std::mt19937 rng(43);
    std::bernoulli_distribution coin(0.7);
    std::vector<int32_t> held, rest;
    for (int32_t p = 0; p < S - 1; ++p) (coin(rng) ? held : rest).push_back(p);
    std::shuffle(rest.begin(), rest.end(), rng);
    std::vector<int32_t> revived(rest.begin(), rest.begin() + n_revived);
    std::sort(revived.begin(), revived.end());
    std::vector<int32_t> order = held;
    order.insert(order.end(), revived.begin(), revived.end());
    order.push_back(int32_t(S - 1));  // the new token
    LayerKV kv;
    kv.init(S, Hkv, Dh, type);
    std::vector<int32_t> slot_of(S, -1);
    for (size_t j = 0; j < order.size(); ++j) {
      kv.append(k.data() + order[j] * KV, KV, v.data() + order[j] * KV, KV, &order[j], 1);
      slot_of[size_t(order[j])] = int32_t(j);
    }
    ASSERT_FALSE(kv.sorted);
    // Listed: the rows, and the held positions but one in five (a decoding step's selection left
    // those out) or, with 24 rows, only two in five (three pruning layers on: each block's few
    // visible keys are gathered before the rows' work, attention.cpp's compaction).
    std::vector<int32_t> qpos = revived;
    qpos.push_back(int32_t(S - 1));
    std::vector<int32_t> keys, slots;
    for (int32_t p = 0; p < S; ++p)
      if (slot_of[size_t(p)] >= 0 &&
          ((sparse ? p % 5 < 2 : p % 5 != 2) || std::binary_search(qpos.begin(), qpos.end(), p))) {
        keys.push_back(p);
        slots.push_back(slot_of[size_t(p)]);
      }
    if (type == KvType::F16) k = f16_rounded(k), v = f16_rounded(v);
    std::vector<float> ks, vs;
    for (int32_t p : keys) {
      ks.insert(ks.end(), k.begin() + p * KV, k.begin() + (p + 1) * KV);
      vs.insert(vs.end(), v.begin() + p * KV, v.begin() + (p + 1) * KV);
    }
    for (const bool shuffled : {false, true}) {
      SCOPED_TRACE(shuffled ? "rows shuffled" : "rows in position order");
      if (shuffled) std::shuffle(qpos.begin(), qpos.end(), rng);
      const int64_t T = int64_t(qpos.size());
      const auto q = randn(T * Q, 44);
      CpuContext ctx(2);
      std::vector<float> out(size_t(T * Q)), ref(size_t(T * Q));
      attention(ctx, q.data(), Q, qpos.data(), T, KeySet{kv, slots}, H, out.data(), Q);
      for (int64_t t = 0; t < T; ++t)
        ref::attention(q.data() + t * Q, &qpos[size_t(t)], 1, ks.data(), vs.data(), keys.data(),
                       int64_t(keys.size()), H, Hkv, Dh, ref.data() + t * Q);
      for (size_t j = 0; j < out.size(); ++j) ASSERT_NEAR(out[j], ref[j], 2e-5) << "j=" << j;
    }
  }
}

// A prefill's rows split by rows, and a decoding row over 1,500 keys split by keys: the splits
// never depend on the thread count, so neither does a bit of the result.
TEST(Ops, ResultsDoNotDependOnThreadCount) {
  const int64_t S = 1500, H = 9, Hkv = 3, Dh = 64, Q = H * Dh, KV = Hkv * Dh;
  const auto q = randn(S * Q, 21), k = randn(S * KV, 22), v = randn(S * KV, 23);
  std::vector<int32_t> pos(S);
  std::iota(pos.begin(), pos.end(), 0);
  for (const int64_t T : {int64_t(33), int64_t(1)}) {
    const int64_t cached = T == 1 ? S - 1 : 0;
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
      CpuContext ctx(threads);
      LayerKV kv;
      kv.init(cached + T, Hkv, Dh);
      kv.append(k.data(), KV, v.data(), KV, pos.data(), cached + T);
      outs.emplace_back(size_t(T * Q));
      attention(ctx, q.data(), Q, pos.data() + cached, T, KeySet{kv}, H, outs.back().data(), Q);
    }
    EXPECT_EQ(outs[0], outs[1]) << T << " rows";
    EXPECT_EQ(outs[0], outs[2]) << T << " rows";
  }
}

// LazyLLM's scores from the logits a scored attention leaves are last_row_scores' over the same
// keys, to the last bit (the same products summed in the same order): over every held key in
// order, a listed subset of an out-of-order cache, and a sliding window; with rows split by keys
// (1 row) and not (40 rows).
TEST(Ops, ScoresFromAttentionLogitsAreTheScoringPasses) {
  const int64_t H = 9, Hkv = 3, Dh = 64, Q = H * Dh, KV = Hkv * Dh, S = 1200;
  const auto k = randn(S * KV, 51), v = randn(S * KV, 52), q = randn(40 * Q, 53);
  CpuContext ctx(2);
  for (const KvType type : {KvType::F32, KvType::F16})
    for (const int64_t T : {int64_t(1), int64_t(40)})
      for (const int32_t window : {0, 300})
        for (const bool listed : {false, true}) {
          SCOPED_TRACE(std::string(kv_type_name(type)) + " T=" + std::to_string(T) + " window " +
                       std::to_string(window) + (listed ? " listed" : " every key"));
          // Slot order: the even positions, then the odd ones (out of order: the revived), the rows'
          // positions last; listed: all but one in three of the earlier ones.
          std::vector<int32_t> order;
          for (int32_t p = 0; p < S - T; p += 2) order.push_back(p);
          for (int32_t p = 1; p < S - T; p += 2) order.push_back(p);
          for (int32_t p = int32_t(S - T); p < S; ++p) order.push_back(p);
          if (!listed) std::sort(order.begin(), order.end());
          LayerKV kv;
          kv.init(S, Hkv, Dh, type);
          std::vector<int32_t> slot_of(S);
          for (size_t j = 0; j < order.size(); ++j) {
            kv.append(k.data() + order[j] * KV, KV, v.data() + order[j] * KV, KV, &order[j], 1);
            slot_of[size_t(order[j])] = int32_t(j);
          }
          std::vector<int32_t> slots;
          if (listed)
            for (int32_t p = 0; p < S; ++p)
              if (p % 3 != 1 || p >= S - T) slots.push_back(slot_of[size_t(p)]);
          const KeySet ks{kv, slots};
          std::vector<int32_t> qpos(static_cast<size_t>(T));
          std::iota(qpos.begin(), qpos.end(), int32_t(S - T));
          std::vector<float> out(size_t(T * Q)), logits(size_t(H * kv.n));
          attention(ctx, q.data(), Q, qpos.data(), T, ks, H, out.data(), Q, 0, window, logits.data());
          std::vector<float> fused(size_t(ks.size())), scored(fused.size());
          last_row_scores_from_logits(logits.data(), ks, H, fused.data());
          last_row_scores(q.data() + (T - 1) * Q, ks, H, scored.data(), 0, qpos.back(), window);
          for (size_t i = 0; i < fused.size(); ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(fused[i]), std::bit_cast<uint32_t>(scored[i])) << "key " << i;
        }
}

}  // namespace
}  // namespace lp
