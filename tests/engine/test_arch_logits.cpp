// The architectures after Llama against llama.cpp: tiny GGUFs of each (tests/tiny_arch.h, weights a
// function of tensor name and index) and llama.cpp's logits on the same files
// (tests/fixtures/arch/<arch>.json, made by tests/fixtures/arch/make_tiny_arch.py with
// llama-cpp-python 0.3.36). f32: every logit at every position within 1e-3 of llama.cpp's. int8
// on the Q8_0 file: as far from llama.cpp's f32 logits as llama.cpp's own Q8_0 run is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "engine/session.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "tests/test_util.h"
#include "tests/tiny_arch.h"
#include "traces/trace.h"

namespace lp {
namespace {

const nlohmann::json& fixture(const std::string& arch) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(arch);
  if (it == cache.end()) {
    std::ifstream in(testing::fixture_path("arch/" + arch + ".json"));
    if (!in) throw std::runtime_error("missing fixture arch/" + arch + ".json");
    it = cache.emplace(arch, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

CpuContext& ctx() {
  static CpuContext c(2);
  return c;
}

// All-row logits [T][V] of the fixture's prompt in one prefill.
// `stats` (if given) receives the pass's trace step (a mixture-of-experts model's routes included).
std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& ids, trace::Step* stats = nullptr) {
  Session s(ctx(), m, int64_t(ids.size()));
  std::vector<int32_t> pos(ids.size());
  std::vector<int64_t> rows(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) pos[i] = int32_t(i), rows[i] = int64_t(i);
  std::vector<float> logits(ids.size() * size_t(m.config().n_vocab));
  s.forward(ids, pos, rows, logits.data(), nullptr, stats);
  return logits;
}

// The positions whose experts (as sets) differ at some layer between two unpruned passes' routes.
std::vector<bool> rerouted(const trace::Step& a, const trace::Step& b, int64_t T, int64_t k) {
  std::vector<bool> out(static_cast<size_t>(T));
  for (size_t l = 0; l < a.routes->size(); ++l)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> x((*a.routes)[l].experts.begin() + t * k,
                             (*a.routes)[l].experts.begin() + (t + 1) * k);
      std::vector<int32_t> y((*b.routes)[l].experts.begin() + t * k,
                             (*b.routes)[l].experts.begin() + (t + 1) * k);
      std::sort(x.begin(), x.end());
      std::sort(y.begin(), y.end());
      if (x != y) out[size_t(t)] = true;
    }
  return out;
}

std::unique_ptr<Model> tiny(const std::string& arch, bool q8_0, DType dt, const testing::TempDir& dir) {
  const std::string path = dir.file("tiny-" + arch + (q8_0 ? "-q8_0" : "") + ".gguf");
  testing::tiny_arch_writer(arch, q8_0).write(path);
  return Model::load(path, dt, ctx());
}

// The files written here hold the bytes of the files llama.cpp ran: the fixture's sha256 of every
// tensor's bytes, F32 and Q8_0 (so the weight rule and our Q8_0 rounding are the script's).
TEST(TinyArch, FilesAreTheOnesLlamaCppRan) {
  for (const std::string& arch : testing::tiny_archs()) {
    std::string f32, q8;
    testing::tiny_arch_writer(arch, false, &f32);
    testing::tiny_arch_writer(arch, true, &q8);
    EXPECT_EQ(f32, fixture(arch)["tensors_sha256"].get<std::string>()) << arch;
    EXPECT_EQ(q8, fixture(arch)["q8_0"]["tensors_sha256"].get<std::string>()) << arch;
  }
}

// The largest |ours - llama.cpp f32| over the row, per position.
std::vector<double> row_errors(const std::vector<float>& got, const nlohmann::json& want, int64_t V) {
  std::vector<double> out;
  for (size_t t = 0; t < want.size(); ++t) {
    double worst = 0;
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst,
                       std::fabs(double(got[t * size_t(V) + size_t(v)]) - want[t][size_t(v)].get<double>()));
    out.push_back(worst);
  }
  return out;
}

class ArchLogits : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchLogits, F32MatchesLlamaCppAtEveryPosition) {
  const std::string arch = GetParam();
  const nlohmann::json& fx = fixture(arch);
  testing::TempDir dir;
  const auto m = tiny(arch, false, DType::F32, dir);
  const auto ids = fx["prompt"].get<std::vector<int32_t>>();
  const int64_t V = m->config().n_vocab;
  ASSERT_EQ(V, int64_t(fx["logits"][0].size()));
  const auto err = row_errors(all_logits(*m, ids), fx["logits"], V);
  for (size_t t = 0; t < err.size(); ++t) EXPECT_LT(err[t], 1e-3) << arch << " position " << t;
  std::printf("%s f32 vs llama.cpp: largest |logit difference| %.2e over %zu positions\n", arch.c_str(),
              *std::max_element(err.begin(), err.end()), err.size());
}

// int8 on the Q8_0 file: each position within 1.5x llama.cpp's own Q8_0 distance from its f32 logits
// (plus 0.02 for a position where that distance is small), and at least 14 of 16 argmaxes of the f32
// run. Both quantize activations to 8 bits per block of 32; their rounding differs in the last bits.
// A mixture-of-experts model's router is discontinuous: where two experts' probabilities nearly tie,
// quantization noise can swap one for the other and move that position's logits by a whole expert's
// output (llama.cpp's own Q8_0 qwen3moe run does at position 5, 1.02 from f32). Which positions flip
// depends on the last bits, so there a position may exceed the bound only where our int8 run routed
// it (at some layer) to other experts than our f32 run did, and at most 2 positions do.
TEST_P(ArchLogits, Int8IsAsCloseAsLlamaCppsOwnQ8_0) {
  const std::string arch = GetParam();
  const nlohmann::json& fx = fixture(arch);
  testing::TempDir dir;
  const auto m = tiny(arch, true, DType::Int8, dir);
  const auto ids = fx["prompt"].get<std::vector<int32_t>>();
  const int64_t V = m->config().n_vocab;
  trace::Step q_step, f_step;
  const auto got = all_logits(*m, ids, &q_step);
  const auto err = row_errors(got, fx["logits"], V);
  const auto theirs = fx["q8_0"]["max_abs_diff_from_f32"].get<std::vector<double>>();
  const auto argmax = fx["argmax"].get<std::vector<int64_t>>();
  std::vector<bool> flipped(err.size());
  if (m->config().moe()) {
    all_logits(*tiny(arch, false, DType::F32, dir), ids, &f_step);
    flipped = rerouted(q_step, f_step, int64_t(ids.size()), m->config().n_expert_used);
  }
  int agree = 0, beyond = 0;
  for (size_t t = 0; t < err.size(); ++t) {
    if (err[t] >= 1.5 * theirs[t] + 0.02) {
      ++beyond;
      EXPECT_TRUE(flipped[t]) << arch << " position " << t << ": " << err[t]
                              << " from llama.cpp's f32 logits";
    }
    const float* row = got.data() + t * size_t(V);
    agree += std::max_element(row, row + V) - row == argmax[t];
  }
  EXPECT_GE(agree, 14) << arch;
  EXPECT_LE(beyond, 2) << arch;
  std::printf(
      "%s int8 on Q8_0: largest |logit - llama.cpp f32| %.4f (llama.cpp's own Q8_0: %.4f), argmax %d/%zu, "
      "%d positions rerouted and beyond 1.5x llama.cpp's\n",
      arch.c_str(), *std::max_element(err.begin(), err.end()),
      *std::max_element(theirs.begin(), theirs.end()), agree, err.size(), beyond);
}

// LazyLLM at a sliding-window layer (docs/engine.md): the last token's attention there covers only
// its window, so the keys outside it score 0 and the window is kept first; the ties among the zeros
// go to the later positions, as everywhere. Gemma 3's layer 0 is local (window 6): of 16 tokens,
// the half kept is the window (10..15) and the two latest of the rest.
TEST(ArchLazyLLM, ALocalLayerKeepsTheLastTokensWindowFirst) {
  testing::TempDir dir;
  const auto m = tiny("gemma3", false, DType::F32, dir);
  ASSERT_EQ(m->config().window(0), 6);
  const auto ids = fixture("gemma3")["prompt"].get<std::vector<int32_t>>();
  const int64_t T = int64_t(ids.size()), last = T - 1;
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  auto policy = make_policy(PolicyKind::LazyLLM);
  const auto steps =
      resolve_schedule(parse_schedule("0:0.5"), m->config().n_layer);  // prune half after layer 0
  const PruneRequest req{steps, policy.get()};
  Session s(ctx(), *m, T);
  trace::Step st;
  std::vector<float> logits(size_t(m->config().n_vocab));
  s.forward(ids, pos, {&last, 1}, logits.data(), &req, &st);
  const auto kept = testing::kept_of(st);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0], (std::vector<int32_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  // The scores themselves: zero exactly outside the window, positive inside, summing to 1.
  const std::vector<float>& sc = (*st.pruning)[0].scores;
  ASSERT_EQ(int64_t(sc.size()), T);
  double sum = 0;
  for (int64_t i = 0; i < T; ++i) {
    if (i < T - 6)
      EXPECT_EQ(sc[size_t(i)], 0.0f) << "position " << i;
    else
      EXPECT_GT(sc[size_t(i)], 0.0f) << "position " << i;
    sum += sc[size_t(i)];
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
}

// LazyLLM over a mixture-of-experts model (docs/engine.md): a pruned token is not a row, so it is not
// routed; a revived one is routed at the layer it returns to; and every (token, layer) is routed at
// most once over the generation, as it is computed at most once. A prompt of 16 halved after layer 0
// and 12 decoding steps whose re-selection revives tokens at layer 1.
TEST(ArchLazyLLM, PrunedTokensSkipTheirExpertsAndRevivedOnesAreRouted) {
  testing::TempDir dir;
  const auto m = tiny("qwen3moe", false, DType::F32, dir);
  const ModelConfig& c = m->config();
  const auto ids = fixture("qwen3moe")["prompt"].get<std::vector<int32_t>>();
  const int64_t T = int64_t(ids.size()), last = T - 1, steps = 12;
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  auto policy = make_policy(PolicyKind::LazyLLM);
  const auto schedule = resolve_schedule(parse_schedule("0:0.5"), c.n_layer);
  const PruneRequest req{schedule, policy.get()};
  Session s(ctx(), *m, T + steps);
  std::vector<trace::Step> st(size_t(steps + 1));
  std::vector<float> logits(size_t(c.n_vocab));
  s.forward(ids, pos, {&last, 1}, logits.data(), &req, &st[0]);
  for (int64_t i = 0; i < steps; ++i) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    s.decode_step(next, int32_t(T + i), logits.data(), &req, &st[size_t(i + 1)]);
  }
  // Prefill: layer 0 routes all 16 tokens, layer 1 only the 8 kept.
  ASSERT_TRUE(st[0].routes);
  EXPECT_EQ((*st[0].routes)[0].positions.size(), size_t(T));
  EXPECT_EQ((*st[0].routes)[1].positions, testing::kept_of(st[0])[0]);
  int64_t revived = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    std::vector<int32_t> routed;  // every position routed at layer l over the generation
    for (const trace::Step& x : st) {
      const trace::Routes& r = (*x.routes)[size_t(l)];
      EXPECT_EQ(int64_t(r.positions.size()), x.queries[size_t(l)]) << "layer " << l;  // the rows, no more
      ASSERT_EQ(r.experts.size(), r.positions.size() * size_t(c.n_expert_used));
      for (const int32_t e : r.experts) EXPECT_TRUE(e >= 0 && e < c.n_expert);
      routed.insert(routed.end(), r.positions.begin(), r.positions.end());
      // A revived token is routed in the step that revives it.
      if (x.revived_positions)
        for (const int32_t p : (*x.revived_positions)[size_t(l)]) {
          EXPECT_TRUE(std::binary_search(r.positions.begin(), r.positions.end(), p))
              << "layer " << l << " " << p;
          ++revived;
        }
    }
    std::sort(routed.begin(), routed.end());
    EXPECT_EQ(std::adjacent_find(routed.begin(), routed.end()), routed.end())
        << "a token routed twice, layer " << l;
    for (int32_t p = 0; p < int32_t(T + steps); ++p)  // routed exactly where computed
      EXPECT_EQ(std::binary_search(routed.begin(), routed.end(), p), s.computed(l, p))
          << "layer " << l << " " << p;
  }
  EXPECT_GT(revived, 0) << "the decoding steps revived nothing: the test does not reach revival";
}

INSTANTIATE_TEST_SUITE_P(Tiny, ArchLogits,
                         ::testing::Values("qwen2", "qwen3", "gemma3", "qwen3moe", "mixtral"));

}  // namespace
}  // namespace lp
