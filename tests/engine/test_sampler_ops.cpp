// Sampling and op counting.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "model/error.h"
#include "model/ops.h"

namespace lp {
namespace {

TEST(Sampler, GreedyTakesArgmaxAndLowestIdOnTies) {
  Sampler s({0.0f, 1.0f, 0});
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 2.0f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{5.0f, 1.0f, 5.0f}), 0);
}

// argmax is the one-pass scan's answer (the first index of the largest value; a NaN is never
// chosen, but a NaN at 0, which nothing beats, gives 0) over awkward vectors: ties, +0 and -0,
// infinities, NaNs, lengths around the vector widths.
TEST(Sampler, ArgmaxIsTheOnePassScan) {
  const auto scan = [](const std::vector<float>& x) {
    int32_t best = 0;
    for (size_t i = 1; i < x.size(); ++i)
      if (x[i] > x[best]) best = int32_t(i);
    return best;
  };
  std::mt19937 rng(5);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, nan, 1.0f, 1.0f};
  for (size_t n : {1, 2, 7, 15, 16, 17, 33, 64, 1000, 49152})
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      for (float& v : x) v = float(int(rng() % 7)) - 3;  // many ties
      for (int k = 0; k < trial % 5; ++k) x[rng() % n] = specials[rng() % 7];
      ASSERT_EQ(argmax(x), scan(x)) << "n " << n << " trial " << trial;
    }
  EXPECT_EQ(argmax(std::vector<float>{nan, 5.0f, 6.0f}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-inf, -inf}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-0.0f, 0.0f}), 0);
}

TEST(Sampler, SameSeedSameTokensAndTopPRestricts) {
  const std::vector<float> logits = {2.0f, 1.9f, 1.8f, -5.0f, 0.5f};
  std::vector<int32_t> a, b;
  Sampler s1({1.0f, 1.0f, 123}), s2({1.0f, 1.0f, 123});
  for (int i = 0; i < 200; ++i) {
    a.push_back(s1.sample(logits));
    b.push_back(s2.sample(logits));
  }
  EXPECT_EQ(a, b);
  std::map<int32_t, int> seen;
  for (int32_t t : a) ++seen[t];
  EXPECT_GE(seen.size(), 3u);  // temperature 1 really samples

  // p(0) = e^2 / sum ~ 0.35 here, so top_p 0.3 keeps only token 0.
  Sampler nucleus({1.0f, 0.3f, 7});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(nucleus.sample(logits), 0);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(Sampler({-1.0f, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler({1.0f, 1.5f, 0}), Error);
}

// op_flops against counts worked out from the model's shape by hand (SmolLM2-135M).
TEST(OpCounting, SmolLM2PrefillFlopsFromTheMath) {
  ModelConfig c;
  c.n_layer = 30;
  c.n_embd = 576;
  c.n_head = 9;
  c.n_head_kv = 3;
  c.head_dim = 64;
  c.rope_dim = 64;
  c.n_ff = 1536;
  c.n_vocab = 49152;
  // Per token per layer, matrices: q 576*576, k and v 576*192 each, o 576*576, gate/up/down
  // 576*1536 each = 3,538,944 multiply-adds = 7,077,888 FLOPs.
  EXPECT_DOUBLE_EQ(op_flops(c, Op::QKV, {1, 0, 0}) + op_flops(c, Op::OProj, {1, 0, 0}) +
                       op_flops(c, Op::GateUp, {1, 0, 0}) + op_flops(c, Op::Down, {1, 0, 0}),
                   7077888.0);
  // Attention at T = 4: 10 causal pairs * 9 heads * (4*64 + 5).
  EXPECT_EQ(causal_pairs(4), 10);
  EXPECT_DOUBLE_EQ(op_flops(c, Op::Attention, {4, 10, 4}), 10.0 * 9 * 261);
  // LM head for one row: 2 * 576 * 49152.
  EXPECT_DOUBLE_EQ(op_flops(c, Op::LmHead, {1, 0, 0}), 56623104.0);
  // The whole prefill is the sum of its parts.
  const int64_t T = 2048;
  double per_layer = 0;
  for (int i = 0; i < kNumOps; ++i)
    if (op_is_per_layer(Op(i)) && Op(i) != Op::Score && Op(i) != Op::Select && Op(i) != Op::Gather)
      per_layer += op_flops(c, Op(i), {T, causal_pairs(T), T}) * (Op(i) == Op::Residual ? 2 : 1);
  EXPECT_DOUBLE_EQ(prefill_flops(c, T, 1), 30 * per_layer + op_flops(c, Op::OutputNorm, {1, 0, 0}) +
                                               op_flops(c, Op::LmHead, {1, 0, 0}));
  // Bytes: at least the bf16 weights of the fused gate/up matrix.
  EXPECT_GT(op_bytes(c, Op::GateUp, {T, 0, 0}, {2, 2, 2}), 576.0 * 3072 * 2);
  // The output layer at its own bytes a weight where it differs from the layers' (Q4_K_M's Q6_K
  // head: 210 / 256 bytes a weight, its layers' Q4_K 144 / 256), else at theirs: for one row, the
  // weights plus the row's activations (34 / 32 int8 bytes a value) plus the logits in f32.
  OpDtypes q{144.0 / 256, 34.0 / 32, 2, 4};
  EXPECT_DOUBLE_EQ(op_bytes(c, Op::LmHead, {1, 0, 0}, q),
                   576.0 * 49152 * 144 / 256 + 576 * 34.0 / 32 + 49152 * 4);
  q.head_weight_bytes = 210.0 / 256;
  EXPECT_DOUBLE_EQ(op_bytes(c, Op::LmHead, {1, 0, 0}, q),
                   576.0 * 49152 * 210 / 256 + 576 * 34.0 / 32 + 49152 * 4);
  EXPECT_DOUBLE_EQ(op_bytes(c, Op::GateUp, {1, 0, 0}, q),
                   576.0 * 3072 * 144 / 256 + 576 * 34.0 / 32 + 3072 * 4);
}

}  // namespace
}  // namespace lp
