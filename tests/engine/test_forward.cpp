// The forward pass on the tiny generated model against an independent slow formulation:
// a whole-prompt transformer written from the scalar reference kernels (double accumulation,
// no KV cache, no fused matrices), reading the weights straight from the GGUF.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "engine/generate.h"
#include "engine/session.h"
#include "kernels/context.h"
#include "kernels/cpu/ref.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "tests/gguf_writer.h"
#include "tests/reference_model.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using testing::tensor_f32;

// Logits [T][V] of a prompt at positions pos, all rows, computed the slow way.
std::vector<float> reference_forward(const GgufFile& f, const ModelConfig& c, const std::vector<int32_t>& ids,
                                     const std::vector<int32_t>& pos) {
  const int64_t T = int64_t(ids.size()), D = c.n_embd, V = c.n_vocab;

  const auto emb = tensor_f32(f, "token_embd.weight");
  std::vector<float> x(static_cast<size_t>(T * D)), xn(x.size()), tmp(x.size());
  for (int64_t t = 0; t < T; ++t) std::copy_n(emb.begin() + ids[t] * D, D, x.begin() + t * D);
  for (int l = 0; l < c.n_layer; ++l) testing::reference_layer(f, c, l, x, pos);
  ref::rmsnorm(x.data(), tensor_f32(f, "output_norm.weight").data(), xn.data(), T, D, c.rms_eps);
  std::vector<float> logits(static_cast<size_t>(T * V));
  const auto head = f.find_tensor("output.weight") ? tensor_f32(f, "output.weight") : emb;
  ref::matmul(xn.data(), head.data(), logits.data(), T, D, V);
  return logits;
}

std::vector<float> engine_forward(const Model& m, CpuContext& ctx, const std::vector<int32_t>& ids,
                                  const std::vector<int32_t>& pos) {
  Session s(ctx, m, int64_t(ids.size()) + 4);
  std::vector<int64_t> rows(ids.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<float> logits(ids.size() * size_t(m.config().n_vocab));
  s.forward(ids, pos, rows, logits.data());
  return logits;
}

using testing::rms;

using testing::random_ids;

struct ForwardCase {
  int64_t T;
  bool tied;
  bool gapped;  // positions with gaps, as a pruned prefill presents them
  GgmlType wtype;
};

class TinyForward : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(TinyForward, F32MatchesSlowReference) {
  const ForwardCase p = GetParam();
  testing::TempDir dir;
  testing::TinyModelSpec spec;
  spec.tied = p.tied;
  spec.weight_type = p.wtype;
  spec.n_head = 6;
  spec.n_head_kv = 2;
  spec.n_embd = 96;  // Dh = 16: exercises the non-64 attention path
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  const GgufFile f = GgufFile::open(path);
  const ModelConfig c = config_from_gguf(f);
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  const auto ids = random_ids(p.T, c.n_vocab, 7);
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(p.gapped ? 3 * i + i % 2 : i);
  const auto want = reference_forward(f, c, ids, pos);
  const auto got = engine_forward(*m, ctx, ids, pos);
  // Every op of the engine has relative error <= K*u (K <= 96 here, so ~6e-6) against the
  // double-accumulating reference; two layers, whose norms re-scale errors rather than grow
  // them, and the LM head add a few of these. 1e-4 of the logits' RMS bounds that with a
  // margin of ~5x, and is far below any real bug (a wrong position or mask moves logits by
  // O(RMS)).
  const double tol = 1e-4 * rms(want);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Cases, TinyForward,
                         ::testing::Values(ForwardCase{1, true, false, GgmlType::F32},
                                           ForwardCase{2, true, false, GgmlType::F32},
                                           ForwardCase{17, false, true, GgmlType::F16},
                                           ForwardCase{111, true, false, GgmlType::BF16},
                                           ForwardCase{111, true, false, GgmlType::F32},
                                           ForwardCase{33, true, false, GgmlType::F32},
                                           ForwardCase{40, false, true, GgmlType::F32}));

TEST(TinyForwardDecode, IncrementalDecodeMatchesOnePrefill) {
  testing::TempDir dir;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", {});
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  const int32_t V = m->config().n_vocab;
  const auto ids = random_ids(23, V, 3);
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);
  const auto all = engine_forward(*m, ctx, ids, pos);

  // Prefill 17 tokens, then 6 single-token steps.
  Session s(ctx, *m, 32);
  std::vector<float> logits(static_cast<size_t>(V));
  const int64_t last = 16;
  s.forward({ids.data(), 17}, {pos.data(), 17}, {&last, 1}, logits.data());
  const double tol = 1e-4 * rms(all);  // same arithmetic, only GEMM blocking differs
  for (int64_t j = 0; j < V; ++j) ASSERT_NEAR(logits[j], all[16 * V + j], tol);
  for (size_t t = 17; t < ids.size(); ++t) {
    const int64_t row = 0;
    s.forward({&ids[t], 1}, {&pos[t], 1}, {&row, 1}, logits.data());
    for (int64_t j = 0; j < V; ++j) ASSERT_NEAR(logits[j], all[t * V + j], tol) << "t=" << t;
  }
  EXPECT_EQ(s.n_cached(), 23);
}

TEST(TinyForwardDecode, ResultsDoNotDependOnThreadCount) {
  testing::TempDir dir;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", {});
  std::vector<std::vector<float>> out;
  for (int threads : {1, 2, 3}) {
    CpuContext ctx(threads);
    const auto m = Model::load(path, DType::BF16, ctx);
    const auto ids = random_ids(45, m->config().n_vocab, 5);
    std::vector<int32_t> pos(ids.size());
    std::iota(pos.begin(), pos.end(), 0);
    out.push_back(engine_forward(*m, ctx, ids, pos));
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(out[0], out[2]);
}

TEST(TinyForwardDecode, Bf16StaysCloseToF32) {
  testing::TempDir dir;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", {});
  CpuContext ctx(2);
  const auto m32 = Model::load(path, DType::F32, ctx);
  const auto m16 = Model::load(path, DType::BF16, ctx);
  const auto ids = random_ids(30, m32->config().n_vocab, 9);
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);
  const auto a = engine_forward(*m32, ctx, ids, pos), b = engine_forward(*m16, ctx, ids, pos);
  // bf16 keeps 8 significant bits: each GEMM input is off by <= 2^-9 relative, so products by
  // <= 2^-8; accumulated over two layers and the head, 2^-4 of the RMS is a loose but
  // meaningful bound (a bug such as unconverted activations gives errors of O(RMS)).
  const double tol = rms(a) / 16;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol);
  EXPECT_NE(a, b);  // the two modes really differ
}

TEST(TinyForwardDecode, RejectsBadInput) {
  testing::TempDir dir;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", {});
  CpuContext ctx(1);
  const auto m = Model::load(path, DType::F32, ctx);
  Session s(ctx, *m, 4);
  std::vector<float> logits(static_cast<size_t>(m->config().n_vocab));
  const int64_t row = 0;
  const int32_t bad_id = m->config().n_vocab, ok = 1, p0 = 0;
  EXPECT_THROW(s.forward({&bad_id, 1}, {&p0, 1}, {&row, 1}, logits.data()), Error);
  const std::vector<int32_t> five(5, ok), pos5 = {0, 1, 2, 3, 4};
  EXPECT_THROW(s.forward(five, pos5, {&row, 1}, logits.data()), Error);  // context full
  const std::vector<int32_t> two(2, ok), back = {3, 2};
  EXPECT_THROW(s.forward(two, back, {&row, 1}, logits.data()), Error);  // positions decrease
}

// The engine's K/V index: slots in arrival order, the per-position "has K/V" lookup, every slot in
// position order once a revival has appended out of order, and the at-most-once rule.
TEST(KvIndex, TracksSlotsAndRejectsHeldPositions) {
  KvIndex kv;
  const int32_t first[2] = {5, 9};
  kv.append(first, 0);
  EXPECT_TRUE(kv.sorted);
  EXPECT_EQ(kv.slots_in_order(), (std::vector<int32_t>{0, 1}));
  const int32_t again[1] = {9};
  EXPECT_THROW(kv.append(again, 3), InternalError);  // the at-most-once rule: a bug if ever broken
  const int32_t negative[1] = {-2};
  EXPECT_THROW(kv.append(negative, 3), Error);
  const int32_t old[1] = {7};  // a revived token: before a held one
  kv.append(old, 3);
  EXPECT_FALSE(kv.sorted);
  EXPECT_EQ(kv.n(), 3);
  EXPECT_EQ(kv.find(7), 2);
  EXPECT_EQ(kv.find(6), -1);
  EXPECT_EQ(kv.find(100), -1);
  EXPECT_EQ(kv.find(-1), -1);
  EXPECT_EQ(kv.slots_in_order(), (std::vector<int32_t>{0, 2, 1}));
  try {
    kv.append(again, 4);
    ADD_FAILURE() << "a held position was appended again";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 9 computed twice at layer 4"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lp
