// The default model (SmolLM2-135M-Instruct, Q4_1) against llama.cpp, an independent
// implementation (tests/fixtures/smollm2_logits.json, made by tests/fixtures/make_reference.py
// from llama.cpp running an all-f32 copy of the same weights).
//
// These tests need the model in the cache (scripts/setup fetches it); they fail, never skip,
// when it is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "engine/generate.h"
#include "engine/session.h"
#include "kernels/context.h"
#include "tests/test_util.h"

namespace lp {
namespace {

nlohmann::json load_fixture(const std::string& name) {
  std::ifstream in(testing::fixture_path(name));
  if (!in) throw std::runtime_error("missing fixture " + name);
  return nlohmann::json::parse(in);
}
// llama.cpp on the all-F32 copy (and its Q4_1 greedy continuations and agreement figures).
const nlohmann::json& fixture() {
  static const nlohmann::json j = load_fixture("smollm2_logits.json");
  return j;
}
// llama.cpp on the Q4_1 file itself.
const nlohmann::json& q41_fixture() {
  static const nlohmann::json j = load_fixture("smollm2_logits_q41.json");
  return j;
}

CpuContext& ctx() {
  static CpuContext c(2);
  return c;
}

const Model& model(DType dt) {
  static std::unique_ptr<Model> f32, bf16, int8;
  auto& m = dt == DType::F32 ? f32 : dt == DType::BF16 ? bf16 : int8;
  if (!m) m = Model::load(testing::real_model_path(), dt, ctx());
  return *m;
}

// All-row logits [T][V] of a prompt in one prefill.
std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& ids) {
  Session s(ctx(), m, int64_t(ids.size()));
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<int64_t> rows(ids.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<float> logits(ids.size() * size_t(m.config().n_vocab));
  s.forward(ids, pos, rows, logits.data());
  return logits;
}

TEST(RealModel, PromptsTokenizeLikeLlamaCpp) {
  const Model& m = model(DType::F32);
  for (const auto& p : fixture()["prompts"]) {
    const auto ids = m.tokenizer().encode(p["text"].get<std::string>(), false, true);
    EXPECT_EQ(ids, p["ids"].get<std::vector<int32_t>>()) << p["name"];
  }
}

// Tolerance. Both engines compute the same f32 arithmetic over the same dequantized weights and
// differ only in summation order and exp/rsqrt implementations: each op's relative error is at
// most K*u (u = 2^-24, K <= 1536, i.e. <= 1e-4 worst case, ~sqrt(K)*u = 2.3e-6 typical). Thirty
// residual layers add these up; the logit scale (row std ~3, max ~30) turns relative error into
// absolute. Worst case 30 layers * 1e-4 * |max logit| ~ 0.1; we allow 0.02 absolute on every
// top-10 logit and row statistic, about 10x the typical bound (30 * 2.3e-6 * 30 = 2e-3) and 100x
// below the Q4_1-with-q8-activations differences llama.cpp itself shows (max 2.8, see
// q41_vs_f32 in the fixture), which is what a real bug (a wrong RoPE pair, a mask off by one)
// produces or worse.
constexpr double kLogitTol = 0.02;

TEST(RealModel, F32LogitsMatchLlamaCppAtEveryPosition) {
  const Model& m = model(DType::F32);
  const int64_t V = m.config().n_vocab;
  double worst = 0;
  int64_t positions = 0, top1_same = 0;
  for (const auto& p : fixture()["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto logits = all_logits(m, ids);
    const auto& rows = p["positions"];
    ASSERT_EQ(rows.size(), ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* row = logits.data() + t * V;
      const auto top_ids = rows[t]["top_ids"].get<std::vector<int32_t>>();
      const auto top_logits = rows[t]["top_logits"].get<std::vector<double>>();
      for (size_t k = 0; k < top_ids.size(); ++k) {
        const double d = std::fabs(row[top_ids[k]] - top_logits[k]);
        worst = std::max(worst, d);
        ASSERT_LE(d, kLogitTol) << p["name"] << " position " << t << " rank " << k;
      }
      double mx = -1e30, sum = 0, sq = 0;
      for (int64_t j = 0; j < V; ++j) {
        mx = std::max(mx, double(row[j]));
        sum += row[j];
      }
      const double mean = sum / double(V);
      double se = 0;
      for (int64_t j = 0; j < V; ++j) {
        sq += (row[j] - mean) * (row[j] - mean);
        se += std::exp(row[j] - mx);
      }
      ASSERT_NEAR(mx, rows[t]["max"].get<double>(), kLogitTol);
      ASSERT_NEAR(mean, rows[t]["mean"].get<double>(), kLogitTol);
      ASSERT_NEAR(std::sqrt(sq / double(V)), rows[t]["std"].get<double>(), kLogitTol);
      ASSERT_NEAR(mx + std::log(se), rows[t]["logsumexp"].get<double>(), kLogitTol);
      top1_same += std::max_element(row, row + V) - row == top_ids[0];
      ++positions;
    }
  }
  std::printf("f32 vs llama.cpp: %lld positions, worst top-10 logit diff %.5f, top-1 agreement %.4f\n",
              (long long)positions, worst, double(top1_same) / double(positions));
  // Near-ties in the top two can flip under any reordering of sums; allow at most 1%.
  EXPECT_GE(double(top1_same) / double(positions), 0.99);
}

TEST(RealModel, GreedyContinuationsMatchLlamaCpp) {
  const Model& m = model(DType::F32);
  for (const auto& p : fixture()["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto want = p["greedy_f32"].get<std::vector<int32_t>>();
    GenerateOptions opt;
    opt.max_new_tokens = int(want.size());
    opt.stop_at_end_of_generation = false;
    const GenerateResult r = generate(ctx(), m, ids, opt);
    EXPECT_EQ(r.generated_ids, want) << p["name"];
    EXPECT_EQ(r.text, p["greedy_f32_text"].get<std::string>()) << p["name"];
  }
}

// bf16 is the fast mode: report how often its top-1 agrees with f32, and require that it
// almost always does (bf16 rounds GEMM inputs to 8 significant bits).
TEST(RealModel, Bf16Top1AgreesWithF32) {
  int64_t positions = 0, same = 0;
  double worst = 0;
  for (const auto& p : fixture()["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto a = all_logits(model(DType::F32), ids), b = all_logits(model(DType::BF16), ids);
    const int64_t V = model(DType::F32).config().n_vocab;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* ra = a.data() + t * V;
      const float* rb = b.data() + t * V;
      same += (std::max_element(ra, ra + V) - ra) == (std::max_element(rb, rb + V) - rb);
      for (int64_t j = 0; j < V; ++j) worst = std::max(worst, double(std::fabs(ra[j] - rb[j])));
      ++positions;
    }
  }
  std::printf("bf16 vs f32: %lld positions, top-1 agreement %.4f, max logit diff %.3f\n",
              (long long)positions, double(same) / double(positions), worst);
  EXPECT_GE(double(same) / double(positions), 0.95);
}

// int8 mode on the Q4_1 file: the file's own blocks times 8-bit activations, the arithmetic
// llama.cpp runs for it. Against our f32 mode (the same weights dequantized) it differs only by the
// activations' rounding; llama.cpp's Q4_1 run against its f32 run of the same weights (the
// fixture's q41_vs_f32) shows what that costs: top-1 agreement 1.0, 1.0 and 0.963, logits within
// 1.6-2.8. Require over all positions at least llama.cpp's agreement less two points (one near-tie
// flip is 8 points of the 13-position prompt, so not per prompt), the logits within 2x llama.cpp's
// largest difference, and report both.
TEST(RealModel, Int8AgreesWithF32AsLlamaCppsQ41Does) {
  int64_t positions = 0, same = 0;
  double worst = 0, llama_worst = 0, llama_same = 0;
  for (const auto& p : fixture()["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto a = all_logits(model(DType::F32), ids), b = all_logits(model(DType::Int8), ids);
    const int64_t V = model(DType::F32).config().n_vocab;
    int64_t ps = 0, ss = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* ra = a.data() + t * V;
      const float* rb = b.data() + t * V;
      ss += (std::max_element(ra, ra + V) - ra) == (std::max_element(rb, rb + V) - rb);
      for (int64_t j = 0; j < V; ++j) worst = std::max(worst, double(std::fabs(ra[j] - rb[j])));
      ++ps;
    }
    const auto& q = fixture()["q41_vs_f32"][p["name"].get<std::string>()];
    llama_worst = std::max(llama_worst, q["max_abs_logit_diff"].get<double>());
    std::printf("int8 vs f32, %s: %lld positions, top-1 agreement %.4f (llama.cpp Q4_1 vs F32: %.4f)\n",
                p["name"].get<std::string>().c_str(), (long long)ps, double(ss) / double(ps),
                q["top1_agreement"].get<double>());
    llama_same += q["top1_agreement"].get<double>() * double(ps);
    positions += ps;
    same += ss;
  }
  std::printf(
      "int8 vs f32: %lld positions, top-1 agreement %.4f, max logit diff %.3f (llama.cpp Q4_1: %.3f)\n",
      (long long)positions, double(same) / double(positions), worst, llama_worst);
  EXPECT_GE(double(same) / double(positions), llama_same / double(positions) - 0.02);
  EXPECT_LE(worst, 2 * llama_worst);
}

// int8 mode against llama.cpp running the same Q4_1 file (smollm2_logits_q41.json: its own
// quantized matmuls, q8 activations times the file's blocks), position by position: the top-1
// token, and our logits at llama.cpp's top-10 ids against its values. Measured 2026-11-25: 96.1%
// top-1, logits within 1.65 (mean 0.25), about as far apart as each engine is from f32 (llama.cpp
// Q4_1 vs F32: 96.6%, within 2.85, mean 0.23-0.28). Two int8 engines do not track each other more
// closely than they track f32: an activation within float rounding of a half-step boundary rounds
// to a different 8-bit value under any change of summation order, and those flips compound over 30
// layers, so each engine is f32 plus its own rounding noise. Required: llama.cpp's own agreement
// with f32 less two points, and logits within its largest difference from f32 (a wrong scale or
// layout drops both far below: the Q4_1 minima scaled by 0.98 in the panels gave 2.1% top-1).
TEST(RealModel, Int8AgreesWithLlamaCppRunningTheSameQ41File) {
  int64_t positions = 0, same = 0;
  double worst = 0, sum = 0;
  int64_t n = 0;
  const auto& prompts = q41_fixture()["prompts"];
  ASSERT_EQ(prompts.size(), fixture()["prompts"].size());
  for (const auto& p : prompts) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto got = all_logits(model(DType::Int8), ids);
    const int64_t V = model(DType::Int8).config().n_vocab;
    ASSERT_EQ(p["positions"].size(), ids.size());
    int64_t ps = 0, ss = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* row = got.data() + t * V;
      const auto& want = p["positions"][t];
      const auto top = want["top_ids"].get<std::vector<int32_t>>();
      const auto val = want["top_logits"].get<std::vector<double>>();
      ss += (std::max_element(row, row + V) - row) == top[0];
      for (size_t k = 0; k < top.size(); ++k) {
        const double d = std::fabs(double(row[top[k]]) - val[k]);
        worst = std::max(worst, d);
        sum += d;
        ++n;
      }
      ++ps;
    }
    std::printf("int8 vs llama.cpp Q4_1, %s: %lld positions, top-1 agreement %.4f\n",
                p["name"].get<std::string>().c_str(), (long long)ps, double(ss) / double(ps));
    positions += ps;
    same += ss;
  }
  std::printf(
      "int8 vs llama.cpp Q4_1: %lld positions, top-1 agreement %.4f, logits at its top-10 within %.4f "
      "(mean %.4f)\n",
      (long long)positions, double(same) / double(positions), worst, sum / double(n));
  double llama_same = 0, llama_worst = 0;
  for (const auto& p : fixture()["prompts"]) {
    const auto& q = fixture()["q41_vs_f32"][p["name"].get<std::string>()];
    llama_same += q["top1_agreement"].get<double>() * double(p["ids"].size());
    llama_worst = std::max(llama_worst, q["max_abs_logit_diff"].get<double>());
  }
  EXPECT_GE(double(same) / double(positions), llama_same / double(positions) - 0.02);
  EXPECT_LE(worst, llama_worst);
}

// Greedy continuations of int8 mode and of llama.cpp running the same Q4_1 file: the number of
// leading tokens they share, reported; the first 4 must agree.
TEST(RealModel, Int8GreedyContinuationsBesideLlamaCppsQ41) {
  for (const auto& p : fixture()["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const auto want = p["greedy_q41"].get<std::vector<int32_t>>();
    GenerateOptions opt;
    opt.max_new_tokens = int(want.size());
    opt.stop_at_end_of_generation = false;
    const GenerateResult r = generate(ctx(), model(DType::Int8), ids, opt);
    size_t prefix = 0;
    while (prefix < want.size() && prefix < r.generated_ids.size() && r.generated_ids[prefix] == want[prefix])
      ++prefix;
    std::printf("int8 vs llama.cpp Q4_1, %s: %zu of %zu greedy tokens equal before the first difference\n",
                p["name"].get<std::string>().c_str(), prefix, want.size());
    EXPECT_GE(prefix, 4u) << p["name"];
  }
}

// Top-1 over one long passage (smollm2_agreement.json: 1,024 tokens of the Book of Ruth, llama.cpp's
// top-1 on the F32 copy and on the Q4_1 file at every position), enough positions to tell 96% from
// 99%. llama.cpp's own Q4_1 run agrees with its F32 run at 96.7% there, and all 34 of its flips
// are near-ties (the F32 row's top two within 0.175); 8-bit activations cost that much in either
// engine. Required: our f32 mode agrees with llama.cpp's F32 at 99% or more (the same arithmetic
// up to summation order); int8 agrees with our f32 at llama.cpp's Q4_1-vs-F32 agreement less two
// points, and with llama.cpp's Q4_1 run as well; and the int8 flips are near-ties, their f32
// margin within twice llama.cpp's largest flipped margin (a wrong scale flips decided positions
// too), but for at most 2 of the 1,024 positions. Why 2 and not 0: at an attention-sink position
// the 8-bit activations are chaotic. Position 2 of this passage carries a massive activation
// (22,672 in one channel of the residual by layer 11, |act| 2,857 into that layer's down
// projection); scaling its embedding by random factors within 1 +- 1e-6 moved our int8 logit of
// the f32 top token between 16.7 and 33.9 (f32: 28.135-28.137) over six draws (2026-11-25). So
// whether that position flips depends on the last bits of the f32 ops before the integer GEMMs,
// which differ between CPUs (oneDNN picks its kernels per CPU): it did not flip on a Sapphire
// Rapids Xeon, it does (margin 3.78) on an AMD EPYC Zen 4.
TEST(RealModel, Int8Top1OverALongPassageAsLlamaCppsQ41) {
  const nlohmann::json j = load_fixture("smollm2_agreement.json");
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  const auto want_f32 = j["top1_f32"].get<std::vector<int32_t>>();
  const auto want_q41 = j["top1_q41"].get<std::vector<int32_t>>();
  const auto llama_margin = j["margin_f32"].get<std::vector<double>>();
  ASSERT_EQ(want_f32.size(), ids.size());
  ASSERT_EQ(want_q41.size(), ids.size());
  ASSERT_EQ(llama_margin.size(), ids.size());
  double llama_flip_margin = 0;
  int64_t llama_same = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    llama_same += want_f32[t] == want_q41[t];
    if (want_f32[t] != want_q41[t]) llama_flip_margin = std::max(llama_flip_margin, llama_margin[t]);
  }
  const auto a = all_logits(model(DType::F32), ids), b = all_logits(model(DType::Int8), ids);
  const int64_t V = model(DType::F32).config().n_vocab;
  int64_t f32_vs_llama = 0, int8_vs_f32 = 0, int8_vs_llama = 0;
  double flip_margin = 0;             // the largest f32 margin of a flip
  std::vector<size_t> decided_flips;  // flips whose f32 margin is beyond twice llama.cpp's
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* ra = a.data() + t * V;
    const float* rb = b.data() + t * V;
    const int64_t ta = std::max_element(ra, ra + V) - ra, tb = std::max_element(rb, rb + V) - rb;
    f32_vs_llama += ta == want_f32[t];
    int8_vs_llama += tb == want_q41[t];
    int8_vs_f32 += ta == tb;
    if (ta != tb) flip_margin = std::max(flip_margin, double(ra[ta] - ra[tb]));
    if (ta != tb && ra[ta] - ra[tb] > 2 * llama_flip_margin) {
      decided_flips.push_back(t);
      std::printf("position %zu: int8 flips a decided f32 top-1 (margin %.3f)\n", t, double(ra[ta] - ra[tb]));
    }
  }
  const double n = double(ids.size());
  std::printf(
      "%zu positions: f32 vs llama.cpp F32 %.4f; int8 vs f32 %.4f (llama.cpp Q4_1 vs F32 %.4f); int8 vs "
      "llama.cpp Q4_1 %.4f; largest flipped f32 margin %.4f (llama.cpp's %.4f)\n",
      ids.size(), double(f32_vs_llama) / n, double(int8_vs_f32) / n, double(llama_same) / n,
      double(int8_vs_llama) / n, flip_margin, llama_flip_margin);
  EXPECT_GE(double(f32_vs_llama) / n, 0.99);
  EXPECT_GE(double(int8_vs_f32) / n, double(llama_same) / n - 0.02);
  EXPECT_GE(double(int8_vs_llama) / n, double(llama_same) / n - 0.02);
  EXPECT_LE(decided_flips.size(), 2u);
}

}  // namespace
}  // namespace lp
