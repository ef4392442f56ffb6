// The LazyLLM paper's two baselines (pruning/policy.h): static-paper against a slow reference that
// averages the last token's attention over the first layers itself, and random-drop against an
// unpruned run of the shortened prompt; random_drop's choice for uniformity and its ends.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/generate.h"
#include "engine/session.h"
#include "kernels/context.h"
#include "kernels/cpu/ref.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "pruning/method.h"
#include "pruning/policy.h"
#include "tests/gguf_writer.h"
#include "tests/reference_model.h"
#include "tests/test_util.h"

namespace lp {
namespace {

struct Tiny {
  testing::TempDir dir;
  std::string path;
  Tiny() {
    testing::TinyModelSpec spec;
    spec.n_layer = 4;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_embd = 64;
    path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  }
};

std::vector<int32_t> random_ids(int64_t T, int n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (auto& i : ids) i = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

// The paper's static pruning: the mean over layers 0..L of the last token's attention (mean over
// heads), computed here by the slow reference layer by layer on every token, ranks the prompt; the
// engine keeps exactly its top tokens (the last always; ties to the later position) after layer L.
TEST(PaperBaselines, StaticPaperKeepsTheTopOfTheScoresAveragedOverItsLayers) {
  const Tiny tiny;
  const GgufFile f = GgufFile::open(tiny.path);
  const ModelConfig c = config_from_gguf(f);
  CpuContext ctx(2);
  const auto m = Model::load(tiny.path, DType::F32, ctx);
  const int64_t T = 61;
  const int L = 2;  // scores from layers 0, 1 and 2, pruned after layer 2
  const double share = 0.4;
  const std::vector<int32_t> ids = random_ids(T, c.n_vocab, 11);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), 0);

  // Reference: every token through layers 0..L, the last row's scores at each, averaged.
  const auto emb = testing::tensor_f32(f, "token_embd.weight");
  std::vector<float> x(static_cast<size_t>(T * c.n_embd));
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(emb.begin() + ids[t] * c.n_embd, c.n_embd, x.begin() + t * c.n_embd);
  std::vector<double> mean(static_cast<size_t>(T), 0.0);
  for (int l = 0; l <= L; ++l) {
    std::vector<float> q, k;
    testing::reference_layer(f, c, l, x, pos, &q, &k);
    std::vector<double> s(static_cast<size_t>(T));
    ref::last_row_scores(q.data() + (T - 1) * c.n_head * c.head_dim, k.data(), T, c.n_head, c.n_head_kv,
                         c.head_dim, s.data());
    for (int64_t t = 0; t < T; ++t) mean[size_t(t)] += s[size_t(t)] / (L + 1);
  }
  const int64_t n_keep = tokens_kept(T, share);
  std::vector<int64_t> order(static_cast<size_t>(T - 1));  // every token but the last, best first
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return mean[size_t(a)] != mean[size_t(b)] ? mean[size_t(a)] > mean[size_t(b)] : a > b;
  });
  // The test means something only if the reference's boundary is clear of the f32 engine's error.
  ASSERT_GT(mean[size_t(order[size_t(n_keep - 2)])] - mean[size_t(order[size_t(n_keep - 1)])], 1e-5);
  std::set<int32_t> want(order.begin(), order.begin() + (n_keep - 1));
  want.insert(int32_t(T - 1));

  const std::vector<PruneStep> steps =
      resolve_method(PolicyKind::StaticPaper, parse_schedule("2:0.4"), c.n_layer);
  ASSERT_EQ(steps.size(), 1u);
  auto policy = make_policy(PolicyKind::StaticPaper);
  PruneRequest req{steps, policy.get()};
  trace::Step st;
  Session s(ctx, *m, T);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  const int64_t last = T - 1;
  s.forward(ids, pos, {&last, 1}, logits.data(), &req, &st);
  const auto kept = testing::kept_of(st);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(std::set<int32_t>(kept[0].begin(), kept[0].end()), want);
  // Layers 0..L ran on every token, the later ones on the kept.
  for (int l = 0; l < c.n_layer; ++l) EXPECT_EQ(st.queries[size_t(l)], l <= L ? T : n_keep) << l;

  // The pruning layer's scores alone (what frozen would use) pick another set on this prompt, so the
  // average is what was tested.
  std::vector<int64_t> by_last(static_cast<size_t>(T - 1));
  std::iota(by_last.begin(), by_last.end(), 0);
  const auto& last_scores = (*st.pruning)[0].scores;
  std::sort(by_last.begin(), by_last.end(), [&](int64_t a, int64_t b) {
    return last_scores[size_t(a)] != last_scores[size_t(b)] ? last_scores[size_t(a)] > last_scores[size_t(b)]
                                                            : a > b;
  });
  std::set<int32_t> frozen_set(by_last.begin(), by_last.begin() + (n_keep - 1));
  frozen_set.insert(int32_t(T - 1));
  EXPECT_NE(frozen_set, want);
}

// static-paper never revives: decoding computes only each new token, every layer, and the share of
// the prompt computed stays what the prefill computed.
TEST(PaperBaselines, StaticPaperDecodingRevivesNothing) {
  const Tiny tiny;
  CpuContext ctx(2);
  const auto m = Model::load(tiny.path, DType::F32, ctx);
  GenerateOptions g;
  g.policy = PolicyKind::StaticPaper;
  g.schedule = parse_schedule("1:0.5");
  g.max_new_tokens = 8;
  g.stop_at_end_of_generation = false;
  g.record_steps = true;
  const GenerateResult r = generate(ctx, *m, random_ids(50, m->config().n_vocab, 3), g);
  EXPECT_EQ(r.revivals, 0);
  ASSERT_EQ(r.decode_stats.size(), 7u);
  for (const trace::Step& st : r.decode_stats)
    for (const int64_t q : st.queries) EXPECT_EQ(q, 1);
  EXPECT_DOUBLE_EQ(r.prompt_tokens_computed_fraction_after_generation, r.prompt_tokens_computed_fraction);
  EXPECT_DOUBLE_EQ(r.prompt_tokens_computed_fraction, (2.0 * 50 + 2.0 * 25) / (4.0 * 50));
}

// random-drop is an unpruned run of the shortened prompt, bit for bit; its fractions count the
// dropped tokens as computed nowhere.
TEST(PaperBaselines, RandomDropIsTheUnprunedRunOfTheShortenedPrompt) {
  const Tiny tiny;
  CpuContext ctx(2);
  const auto m = Model::load(tiny.path, DType::F32, ctx);
  const int64_t T = 80;
  const std::vector<int32_t> ids = random_ids(T, m->config().n_vocab, 5);
  GenerateOptions g;
  g.policy = PolicyKind::RandomDrop;
  g.schedule = parse_schedule("0.3");
  g.prune_seed = 9;
  g.max_new_tokens = 6;
  g.stop_at_end_of_generation = false;
  const GenerateResult dropped = generate(ctx, *m, ids, g);

  std::vector<int32_t> shorter;
  for (const int64_t i : random_drop(T, 0.3, 9)) shorter.push_back(ids[size_t(i)]);
  ASSERT_EQ(int64_t(shorter.size()), T - 24);  // floor(0.3 * 80) dropped
  GenerateOptions plain = g;
  plain.policy = PolicyKind::None;
  const GenerateResult want = generate(ctx, *m, shorter, plain);
  EXPECT_EQ(dropped.last_prefill_logits, want.last_prefill_logits);
  EXPECT_EQ(dropped.generated_ids, want.generated_ids);
  EXPECT_EQ(dropped.prompt_ids, ids);
  EXPECT_EQ(dropped.prompt_tokens_dropped, 24);
  EXPECT_DOUBLE_EQ(dropped.prompt_tokens_computed_fraction, 56.0 / 80.0);
  EXPECT_DOUBLE_EQ(dropped.prompt_tokens_computed_fraction_after_generation, 56.0 / 80.0);
  EXPECT_DOUBLE_EQ(dropped.all_tokens_computed_fraction, (56.0 + 5) / (80.0 + 5));

  // Another seed drops other tokens.
  g.prune_seed = 10;
  const GenerateResult other = generate(ctx, *m, ids, g);
  EXPECT_NE(other.last_prefill_logits, dropped.last_prefill_logits);
}

// Uniform over the tokens between the first and the last, which are always kept; as many kept as
// tokens_kept gives; the same for the same seed.
TEST(PaperBaselines, RandomDropChoosesUniformlyAndKeepsTheEnds) {
  const int64_t n = 12;
  const int trials = 20000;
  std::vector<int> seen(static_cast<size_t>(n), 0);
  std::set<std::vector<int64_t>> distinct;
  for (int s = 0; s < trials; ++s) {
    const std::vector<int64_t> k = random_drop(n, 0.5, uint64_t(s));
    ASSERT_EQ(k.size(), 6u);
    ASSERT_TRUE(std::is_sorted(k.begin(), k.end()));
    ASSERT_EQ(k.front(), 0);
    ASSERT_EQ(k.back(), n - 1);
    for (const int64_t i : k) ++seen[size_t(i)];
    if (distinct.size() < 1000) distinct.insert(k);
  }
  // Each of the 10 middle tokens is kept with probability 4/10; 5 standard deviations of the mean.
  const double p = 0.4, sd = std::sqrt(p * (1 - p) / trials);
  for (int64_t i = 1; i + 1 < n; ++i) EXPECT_NEAR(double(seen[size_t(i)]) / trials, p, 5 * sd) << i;
  EXPECT_GT(distinct.size(), 150u);  // C(10, 4) = 210 subsets, nearly all seen
  EXPECT_EQ(random_drop(n, 0.5, 42), random_drop(n, 0.5, 42));
  EXPECT_EQ(random_drop(n, 0.0, 1).size(), size_t(n));
  EXPECT_EQ(random_drop(1, 0.9, 1), std::vector<int64_t>{0});
  EXPECT_EQ(random_drop(2, 0.9, 1), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(random_drop(100, 0.99, 1).size(), 2u);
}

TEST(PaperBaselines, SchedulesMustFitThePolicy) {
  EXPECT_EQ(method_problem(PolicyKind::StaticPaper, parse_schedule("0.1:0.35")), "");
  EXPECT_NE(method_problem(PolicyKind::StaticPaper, default_schedule()).find("static-paper prunes once"),
            std::string::npos);
  EXPECT_NE(method_problem(PolicyKind::StaticPaper, parse_schedule("0.3")), "");
  EXPECT_EQ(method_problem(PolicyKind::RandomDrop, parse_schedule("0.3")), "");
  EXPECT_NE(method_problem(PolicyKind::RandomDrop, parse_schedule("2:0.3")).find("share dropped alone"),
            std::string::npos);
  EXPECT_NE(method_problem(PolicyKind::LazyLLM, parse_schedule("0.3")).find("only random-drop"),
            std::string::npos);
  EXPECT_THROW(resolve_schedule(parse_schedule("0.3"), 30), Error);
  EXPECT_TRUE(resolve_method(PolicyKind::RandomDrop, parse_schedule("0.3"), 30).empty());
  // A static-paper depth beyond the model's layers.
  EXPECT_THROW(resolve_method(PolicyKind::StaticPaper, parse_schedule("40:0.5"), 30), Error);
  // The written forms round-trip.
  const Schedule s = parse_schedule("25%");
  EXPECT_EQ(s.to_string(), "0.25");
  EXPECT_EQ(drop_share(s), 0.25);
  EXPECT_EQ(parse_schedule(s.to_string()).steps[0].share, 0.25);
  EXPECT_EQ(s.to_json()["steps"][0]["before_model"], true);
  // The old names: refused on the command line, read from files.
  EXPECT_NE(check_policy_arg("static").find("frozen"), std::string::npos);
  EXPECT_NE(check_policy_arg("random").find("random-drop"), std::string::npos);
  EXPECT_THROW(parse_policy("static"), Error);
  EXPECT_EQ(policy_in_file("static"), PolicyKind::Frozen);
  EXPECT_EQ(policy_in_file("random"), PolicyKind::RandomLayers);
  EXPECT_EQ(policy_in_file("fastest"), std::nullopt);
  for (const char* n : {"none", "lazyllm", "static-paper", "random-drop", "frozen", "random-layers"})
    EXPECT_EQ(policy_name(parse_policy(n)), std::string(n));
}

}  // namespace
}  // namespace lp
