// LazyLLM pruning in the engine against an independent slow formulation: every token present
// at every layer (double-accumulating reference kernels), with masks that hide pruned keys and
// rows of pruned tokens frozen (not updated) after they are pruned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/session.h"
#include "kernels/context.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ref.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "pruning/select.h"
#include "tests/gguf_writer.h"
#include "tests/reference_model.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using testing::tensor_f32;

struct SlowResult {
  std::vector<float> last_logits;           // [V]
  std::vector<std::vector<double>> scores;  // per step: last token's scores over the active set
  std::vector<std::vector<float>> frozen;   // per step: hidden state of each pruned row
};

// active_after[k]: positions active after step k (from the engine); steps[k].layer its layer.
// All T rows are carried; a row inactive at layer l is neither updated nor attended to there.
SlowResult slow_pruned_forward(const GgufFile& f, const ModelConfig& c, const std::vector<int32_t>& ids,
                               const std::vector<int32_t>& pos, const std::vector<PruneStep>& steps,
                               const std::vector<std::vector<int32_t>>& active_after) {
  const int64_t T = int64_t(ids.size()), D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim,
                V = c.n_vocab;

  const auto emb = tensor_f32(f, "token_embd.weight");
  std::vector<float> x(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t) std::copy_n(emb.begin() + ids[t] * D, D, x.begin() + t * D);
  std::vector<char> active(static_cast<size_t>(T), 1);
  SlowResult out;
  size_t step = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    // Gather the active rows (the mask: inactive keys hidden, inactive rows not computed).
    std::vector<int64_t> rows;
    for (int64_t t = 0; t < T; ++t)
      if (active[t]) rows.push_back(t);
    const int64_t n = int64_t(rows.size());
    std::vector<float> xa(static_cast<size_t>(n * D)), q, k;
    std::vector<int32_t> pa(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(x.begin() + rows[i] * D, D, xa.begin() + i * D);
      pa[i] = pos[rows[i]];
    }
    testing::reference_layer(f, c, l, xa, pa, &q, &k);
    for (int64_t i = 0; i < n; ++i) std::copy_n(xa.begin() + i * D, D, x.begin() + rows[i] * D);
    if (step < steps.size() && steps[step].layer == l) {
      std::vector<double> s(static_cast<size_t>(n));
      ref::last_row_scores(q.data() + (n - 1) * H * Dh, k.data(), n, H, Hkv, Dh, s.data());
      out.scores.push_back(s);
      const std::set<int32_t> keep(active_after[step].begin(), active_after[step].end());
      std::vector<float> frozen;
      for (int64_t i = 0; i < n; ++i)
        if (!keep.count(pa[i])) {
          active[rows[i]] = 0;  // frozen from here on
          frozen.insert(frozen.end(), x.begin() + rows[i] * D, x.begin() + (rows[i] + 1) * D);
        }
      out.frozen.push_back(frozen);
      ++step;
    }
  }
  const int64_t last = T - 1;
  std::vector<float> xn(static_cast<size_t>(D));
  ref::rmsnorm(x.data() + last * D, tensor_f32(f, "output_norm.weight").data(), xn.data(), 1, D, c.rms_eps);
  out.last_logits.resize(static_cast<size_t>(V));
  const auto head = f.find_tensor("output.weight") ? tensor_f32(f, "output.weight") : emb;
  ref::matmul(xn.data(), head.data(), out.last_logits.data(), 1, D, V);
  return out;
}

using testing::rms;

struct PruneCase {
  int64_t T;
  PolicyKind policy;
  const char* schedule;  // inline schedule syntax
};

class PrunedForward : public ::testing::TestWithParam<PruneCase> {};

TEST_P(PrunedForward, MatchesSlowMaskedFormulation) {
  const PruneCase pc = GetParam();
  testing::TempDir dir;
  testing::TinyModelSpec spec;
  spec.n_layer = 4;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.n_embd = 64;  // Dh = 16
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  const GgufFile f = GgufFile::open(path);
  const ModelConfig c = config_from_gguf(f);
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  std::mt19937 rng(uint32_t(pc.T) * 7 + 1);
  std::vector<int32_t> ids(static_cast<size_t>(pc.T)), pos(ids.size());
  for (auto& i : ids) i = int32_t(rng() % uint32_t(c.n_vocab));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  const auto steps = resolve_schedule(parse_schedule(pc.schedule), c.n_layer);
  auto policy = make_policy(pc.policy, 5);
  PruneRequest req{steps, policy.get()};
  trace::Step st;
  Session s(ctx, *m, pc.T);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  const int64_t last = pc.T - 1;
  s.forward(ids, pos, {&last, 1}, logits.data(), &req, &st);
  const auto kept_sets = testing::kept_of(st);

  // Bookkeeping: each step keeps tokens_kept(active, share), the last token always; each layer's
  // KV holds exactly the tokens computed there; every pruned token is in the Aux Cache once.
  ASSERT_EQ(kept_sets.size(), steps.size());
  int64_t active = pc.T, pruned = 0;
  size_t k = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(st.queries[size_t(l)], active) << "layer " << l;
    EXPECT_EQ(s.keys_held(l), active);
    if (k < steps.size() && steps[k].layer == l) {
      const int64_t kept = tokens_kept(active, steps[k].share);
      ASSERT_EQ(int64_t(kept_sets[k].size()), kept);
      EXPECT_EQ(kept_sets[k].back(), pos.back());
      pruned += active - kept;
      active = kept;
      ++k;
    }
  }
  EXPECT_EQ(s.aux().size(), pruned);
  EXPECT_EQ(std::set<int32_t>(s.aux().pos.begin(), s.aux().pos.end()).size(), size_t(pruned));

  const SlowResult want = slow_pruned_forward(f, c, ids, pos, steps, kept_sets);
  // Same tolerance argument as tests/engine/test_forward.cpp: per-op K*u relative error, a few layers.
  const double tol = 1e-4 * rms(want.last_logits);
  for (size_t j = 0; j < logits.size(); ++j) ASSERT_NEAR(logits[j], want.last_logits[j], tol) << j;
  // The Aux Cache holds the frozen hidden states, in pruning order.
  std::vector<float> frozen;
  for (const auto& fz : want.frozen) frozen.insert(frozen.end(), fz.begin(), fz.end());
  std::vector<float> held;  // the backend's states, entry by entry
  for (const int32_t p : s.aux().pos) {
    const std::vector<float> h = s.aux_state(p);
    held.insert(held.end(), h.begin(), h.end());
  }
  ASSERT_EQ(frozen.size(), held.size());
  const double htol = 1e-4 * rms(frozen) + 1e-30;
  for (size_t j = 0; j < frozen.size(); ++j) ASSERT_NEAR(held[j], frozen[j], htol);

  if (pc.policy == PolicyKind::LazyLLM) {
    // The engine's scores match the reference's (softmax probabilities: absolute 1e-5 covers
    // the f32 dot products' K*u error amplified by at most a factor ~2 through the softmax), and
    // the selection keeps the highest-scoring tokens by the reference's scores too.
    for (size_t i = 0; i < want.scores.size(); ++i) {
      ASSERT_EQ((*st.pruning)[i].scores.size(), want.scores[i].size());
      for (size_t j = 0; j < want.scores[i].size(); ++j)
        ASSERT_NEAR((*st.pruning)[i].scores[j], want.scores[i][j], 1e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PrunedForward,
                         ::testing::Values(PruneCase{1, PolicyKind::LazyLLM, "0:0.5"},
                                           PruneCase{2, PolicyKind::LazyLLM, "0:0.5"},
                                           PruneCase{17, PolicyKind::LazyLLM, "0:0.3,1:0.3,2:0.3"},
                                           PruneCase{111, PolicyKind::LazyLLM, "0.5:0.5"},
                                           PruneCase{111, PolicyKind::LazyLLM, "0:0.3,2:0.6"},
                                           PruneCase{17, PolicyKind::RandomLayers, "0:0.5,1:0.5"},
                                           PruneCase{111, PolicyKind::Frozen, "0:0.3,1:0.3,2:0.3"},
                                           PruneCase{40, PolicyKind::RandomLayers, "1:0.9"}),
                         [](const ::testing::TestParamInfo<PruneCase>& info) {
                           const PruneCase& c = info.param;
                           std::string name = "T" + std::to_string(c.T) + "_" + policy_name(c.policy) + "_" +
                                              c.schedule + std::string();
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name + "_" + std::to_string(info.index);
                         });

TEST(PrunedForwardExact, ZeroShareIsBitwiseTheUnprunedForward) {
  testing::TempDir dir;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", {});
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  std::vector<int32_t> ids(37), pos(37);
  for (int i = 0; i < 37; ++i) ids[size_t(i)] = (i * 13) % m->config().n_vocab, pos[size_t(i)] = i;
  const int64_t last = 36;
  std::vector<float> a(static_cast<size_t>(m->config().n_vocab)), b(a.size());
  Session s1(ctx, *m, 37), s2(ctx, *m, 37);
  s1.forward(ids, pos, {&last, 1}, a.data());
  const std::vector<PruneStep> steps = {{0, 0.0}, {1, 0.0}};
  auto policy = make_policy(PolicyKind::LazyLLM);
  PruneRequest req{steps, policy.get()};
  s2.forward(ids, pos, {&last, 1}, b.data(), &req);
  EXPECT_EQ(a, b);
  EXPECT_EQ(s2.aux().size(), 0);
}

TEST(PruningPolicy, SelectTopKeepsHighestAndLastAndBreaksTiesToLaterPositions) {
  const std::vector<int32_t> pos = {0, 3, 4, 9, 12};
  const std::vector<float> scores = {0.5f, 0.1f, 0.5f, 0.2f, 0.0f};
  EXPECT_EQ(select_top(pos, scores, 3), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(select_top(pos, scores, 2), (std::vector<int64_t>{2, 4}));  // tie 0.5: later position 4 wins
  EXPECT_EQ(select_top(pos, scores, 1), (std::vector<int64_t>{4}));
  EXPECT_EQ(select_top(pos, scores, 9), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_THROW(parse_policy("fastest"), Error);
}

// Against the definition, a full sort by (score descending, position descending): random scores
// with many ties, negatives, -0 beside +0 and infinities, at every n_keep.
TEST(PruningPolicy, SelectTopIsTheFullSortsTopOnAnyScores) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t n = 1 + trial * 7;
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end() - 1, rng);  // any order but the last (the newest token)
    for (int32_t& p : pos) p *= 3;
    std::vector<float> scores(pos.size());
    const std::vector<float> pool = {0.25f, -1.5f, 0.0f, -0.0f, 2.0f, -INFINITY, INFINITY, 1e-30f, -1e-30f};
    for (float& s : scores) s = pool[rng() % pool.size()];
    for (int64_t keep = 1; keep <= n + 1; ++keep) {
      std::vector<int64_t> idx(static_cast<size_t>(n - 1));
      std::iota(idx.begin(), idx.end(), 0);
      std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
        return scores[size_t(a)] != scores[size_t(b)] ? scores[size_t(a)] > scores[size_t(b)]
                                                      : pos[size_t(a)] > pos[size_t(b)];
      });
      idx.resize(size_t(std::min(keep, n) - 1));
      idx.push_back(n - 1);
      std::sort(idx.begin(), idx.end());
      ASSERT_EQ(select_top(pos, scores, keep), idx) << "n " << n << " keep " << keep;
    }
  }
}

// Over an f16 cache too, against the reference over the keys rounded to f16 (testing::f16_round).
TEST(PruningPolicy, LastRowScoresMatchReferenceAndSumToOne) {
  for (const KvType type : {KvType::F32, KvType::F16}) {
    SCOPED_TRACE(kv_type_name(type));
    const int64_t S = 77, H = 6, Hkv = 2, Dh = 64;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> q(H * Dh), k(S * Hkv * Dh), v(k.size());
    for (auto* vec : {&q, &k, &v})
      for (auto& x : *vec) x = nd(rng);
    std::vector<int32_t> pos(S);
    std::iota(pos.begin(), pos.end(), 0);
    LayerKV kv;
    kv.init(S, Hkv, Dh, type);
    kv.append(k.data(), Hkv * Dh, v.data(), Hkv * Dh, pos.data(), S);
    if (type == KvType::F16)
      for (float& x : k) x = testing::f16_round(x);
    std::vector<float> got(S);
    std::vector<double> want(S);
    last_row_scores(q.data(), KeySet{kv}, H, got.data());
    ref::last_row_scores(q.data(), k.data(), S, H, Hkv, Dh, want.data());
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) {
      ASSERT_NEAR(got[s], want[s], 1e-5);
      sum += got[s];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);

    // Over a listed subset of slots: the same as scoring a cache holding only those keys.
    std::vector<int32_t> slots;
    std::vector<float> ks;
    for (int32_t s = 0; s < S; s += 3) {
      slots.push_back(s);
      ks.insert(ks.end(), k.begin() + s * Hkv * Dh, k.begin() + (s + 1) * Hkv * Dh);
    }
    const int64_t n = int64_t(slots.size());
    std::vector<float> sub(static_cast<size_t>(n));
    std::vector<double> sub_want(static_cast<size_t>(n));
    last_row_scores(q.data(), KeySet{kv, slots}, H, sub.data());
    ref::last_row_scores(q.data(), ks.data(), n, H, Hkv, Dh, sub_want.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(sub[i], sub_want[i], 1e-5);
  }
}

}  // namespace
}  // namespace lp
