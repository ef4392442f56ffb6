// The prefix cache (engine/prefix_cache.h) in sessions and in the scheduler: without pruning a
// hit's output is the cold run's bit for bit; with LazyLLM a hit resumes what the earlier request
// left (tests/engine/test_revival.cpp holds that to the dense formulation); the cache lives in the
// K/V budget, evicts under pressure and never stalls a request; the policies without revival
// bypass it.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

#include "engine/prefix_cache.h"
#include "engine/scheduler.h"
#include "kernels/context.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/gemm.h"
#include "model/error.h"
#include "pruning/schedule.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {
namespace {

CpuContext& ctx() {
  static CpuContext c(2);
  return c;
}

const Model& tiny(DType dt) {
  static testing::TempDir dir;
  static std::map<DType, std::unique_ptr<Model>> models;
  auto& m = models[dt];
  if (!m) {
    testing::TinyModelSpec spec;
    spec.n_layer = 4;
    const auto path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
    m = Model::load(path, dt, ctx());
  }
  return *m;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int32_t> positions(int32_t from, size_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), from);
  return p;
}

// Without pruning, a session that loads a document's blocks saved by another request and computes
// only its question gives the logits of the session that computed everything, bit for bit, in the
// prefill and in every decoding step after it (each GEMM row and each query's attention is
// computed alone of the others in every dtype's kernels).
TEST(PrefixCache, AnUnprunedHitIsTheColdRunBitForBit) {
  for (const DType dt : {DType::Int8, DType::F32, DType::BF16}) {
    const Model& m = tiny(dt);
    const int32_t V = m.config().n_vocab;
    const std::vector<int32_t> doc = testing::random_ids(48, V, 1), q1 = testing::random_ids(9, V, 2),
                               q2 = testing::random_ids(7, V, 3);
    Session a(ctx(), m, 64), cold(ctx(), m, 64), warm(ctx(), m, 64);
    std::vector<float> la(static_cast<size_t>(V)), want(la.size()), got(la.size());
    const std::vector<int32_t> first = concat(doc, q1), second = concat(doc, q2);
    const int64_t last_a = int64_t(first.size()) - 1, last = int64_t(second.size()) - 1,
                  last_q = int64_t(q2.size()) - 1;
    a.forward(first, positions(0, first.size()), {&last_a, 1}, la.data());
    std::vector<TokenStates> blocks;
    for (int32_t b = 0; b < 3; ++b) {
      std::optional<TokenStates> st = a.save_states(b * 16, 16);
      ASSERT_TRUE(st && st->full(m.config().n_layer));
      blocks.push_back(std::move(*st));
    }
    const std::vector<const TokenStates*> ptrs = {&blocks[0], &blocks[1], &blocks[2]};
    warm.load_states(ptrs);
    EXPECT_EQ(warm.n_cached(), 48);
    cold.forward(second, positions(0, second.size()), {&last, 1}, want.data());
    warm.forward(q2, positions(48, q2.size()), {&last_q, 1}, got.data());
    ASSERT_EQ(got, want) << dtype_name(dt) << ": the prefill";
    for (int32_t step = 0; step < 4; ++step) {
      const int32_t tok = int32_t(std::max_element(want.begin(), want.end()) - want.begin());
      const int32_t p = int32_t(second.size()) + step;
      cold.decode_step(tok, p, want.data(), nullptr);
      warm.decode_step(tok, p, got.data(), nullptr);
      ASSERT_EQ(got, want) << dtype_name(dt) << ": decoding step " << step;
    }
  }
}

// Loading refuses blocks that do not follow one another from the start, or into a session that
// holds tokens.
// Several blocks read together (Session::save_blocks: one K/V read a layer and one Aux Cache read for
// all of them, what the prefix cache saves with) are each block's save_states, field for field,
// after a LazyLLM prefill (tokens at every depth, Aux Cache states) and after an unpruned one.
TEST(PrefixCache, BlocksReadTogetherAreEachBlocksOwnStates) {
  const Model& m = tiny(DType::F32);
  const ModelConfig& c = m.config();
  const std::vector<int32_t> ids = testing::random_ids(64, c.n_vocab, 4);
  const int64_t last = 63;
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  for (const PolicyKind kind : {PolicyKind::LazyLLM, PolicyKind::None}) {
    Session s(ctx(), m, 80);
    const auto steps = resolve_schedule(parse_schedule("1:0.5,2:0.5"), c.n_layer, c.global_layers());
    auto policy = make_policy(kind);
    const PruneRequest req{steps, policy.get()};
    s.forward(ids, positions(0, ids.size()), {&last, 1}, logits.data(),
              kind == PolicyKind::None ? nullptr : &req);
    const auto together = s.save_blocks(8, 16, 3);
    ASSERT_EQ(together.size(), 3u);
    for (int b = 0; b < 3; ++b) {
      const std::optional<TokenStates> alone = s.save_states(8 + 16 * b, 16);
      ASSERT_EQ(together[size_t(b)].has_value(), alone.has_value()) << "block " << b;
      if (!alone) continue;
      EXPECT_EQ(together[size_t(b)]->first, alone->first);
      EXPECT_EQ(together[size_t(b)]->depth, alone->depth) << "block " << b;
      EXPECT_EQ(together[size_t(b)]->kv, alone->kv) << "block " << b;
      EXPECT_EQ(together[size_t(b)]->aux, alone->aux) << "block " << b;
    }
    if (kind == PolicyKind::LazyLLM) {
      bool any_aux = false;
      for (const auto& st : together) any_aux = any_aux || (st && !st->aux.empty());
      EXPECT_TRUE(any_aux) << "no block holds Aux Cache states: the split of the states goes untested";
    }
  }
  Session s(ctx(), m, 80);
  EXPECT_THROW((void)s.save_blocks(0, 16, 1), Error);  // nothing held
}

TEST(PrefixCache, LoadingRefusesBlocksOutOfPlace) {
  const Model& m = tiny(DType::F32);
  Session a(ctx(), m, 64);
  const std::vector<int32_t> ids = testing::random_ids(32, m.config().n_vocab, 5);
  const int64_t last = 31;
  std::vector<float> logits(size_t(m.config().n_vocab));
  a.forward(ids, positions(0, 32), {&last, 1}, logits.data());
  const std::optional<TokenStates> b1 = a.save_states(16, 16);
  ASSERT_TRUE(b1);
  Session s(ctx(), m, 64);
  const TokenStates* second_only[] = {&*b1};
  EXPECT_THROW(s.load_states(second_only), Error);
  EXPECT_THROW(a.load_states(second_only), Error);
  EXPECT_THROW(a.save_states(20, 16), Error);  // past what it holds
}

// Each token's deeper state: the merge of a block before and after a request revived some of it.
TEST(PrefixCache, DeeperStatesTakeEachTokensDeeperState) {
  const int L = 3;
  const int64_t D = 2, row = 4;  // bytes of one K (or V) row
  const auto make = [&](std::vector<uint16_t> depth, uint8_t tag) {
    TokenStates t;
    t.depth = depth;
    t.kv.resize(L);
    for (int l = 0; l < L; ++l) {
      std::vector<std::byte> k, v;
      for (size_t i = 0; i < depth.size(); ++i)
        if (depth[i] > l)
          for (int64_t b = 0; b < row; ++b) {
            k.push_back(std::byte(tag + 10 * i + l));
            v.push_back(std::byte(tag + 10 * i + l + 100));
          }
      t.kv[size_t(l)] = k;
      t.kv[size_t(l)].insert(t.kv[size_t(l)].end(), v.begin(), v.end());
    }
    for (size_t i = 0; i < depth.size(); ++i)
      if (depth[i] < L) t.aux.insert(t.aux.end(), {float(tag + i), float(tag + i)});
    return t;
  };
  const TokenStates a = make({3, 1, 2}, 0), b = make({3, 3, 1}, 1);
  const std::optional<TokenStates> m = deeper_states(a, b, L, D);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->depth, (std::vector<uint16_t>{3, 3, 2}));
  const TokenStates want = [&] {  // token 0 and 2 from a, token 1 from b
    TokenStates w = make({3, 3, 2}, 0);
    for (int l = 0; l < L; ++l) {
      // token 1's rows are b's: its tag is 1 more
      const size_t n = size_t(l < 2 ? 3 : 2);
      auto& kv = w.kv[size_t(l)];
      for (int64_t b2 = 0; b2 < row; ++b2) {
        kv[size_t(row) + size_t(b2)] = std::byte(1 + 10 + l);
        kv[n * size_t(row) + size_t(row) + size_t(b2)] = std::byte(1 + 10 + l + 100);
      }
    }
    return w;
  }();
  EXPECT_EQ(m->kv, want.kv);
  EXPECT_EQ(m->aux, (std::vector<float>{2, 2}));  // token 2's, from a
  const std::optional<TokenStates> other_way = deeper_states(b, a, L, D);
  ASSERT_TRUE(other_way);
  EXPECT_EQ(other_way->depth, m->depth);    // (a tie keeps the first one's: its own K/V)
  EXPECT_FALSE(deeper_states(a, a, L, D));  // nothing deeper
}

// ---- the scheduler ----

SchedulerOptions options(const Model& m, int64_t budget, bool cache = true) {
  SchedulerOptions o;
  o.kv_budget_bytes = budget;
  o.max_batch_tokens = 4096;
  o.prefix_cache = cache;
  o.make_backend = [&m](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<CpuBackend>(ctx(), m.config(), m.weights(), n_ctx);
  };
  return o;
}

struct Done {
  std::vector<int32_t> tokens;
  RequestRecord rec;
};

// Runs the prompts one after another (each to its end before the next), greedy, through `s`; at
// every step the reservations and the cache together stay inside the budget.
std::vector<Done> one_by_one(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts,
                             PolicyKind policy, const std::string& schedule, int64_t max_tokens = 6) {
  std::vector<Done> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestParams p;
    p.prompt = prompts[i];
    p.max_tokens = max_tokens;
    p.stop_at_end_of_generation = false;
    p.policy = policy;
    p.schedule = schedule.empty() ? Schedule{} : parse_schedule(schedule);
    p.on_token = [&out, i](int32_t t) {
      out[i].tokens.push_back(t);
      return true;
    };
    p.on_finish = [&out, i](const RequestRecord& r) { out[i].rec = r; };
    s.submit(std::move(p));
    while (s.step()) EXPECT_LE(s.kv_bytes_reserved() + s.prefix_cache_bytes(), s.budget_bytes());
    EXPECT_EQ(out[i].rec.finish, Finish::Length) << out[i].rec.error;
  }
  return out;
}

std::vector<std::vector<int32_t>> questions_over_one_document(const Model& m, int64_t doc_tokens, int n) {
  const int32_t V = m.config().n_vocab;
  const std::vector<int32_t> doc = testing::random_ids(doc_tokens, V, 11);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) prompts.push_back(concat(doc, testing::random_ids(5 + i, V, 20 + uint32_t(i))));
  return prompts;
}

// Several questions over one document, without pruning: the same tokens with the cache as
// without; the second and later requests find the document's full blocks; the counters count
// tokens (vLLM's prefix_cache_queries and _hits).
TEST(PrefixCache, TheSchedulerServesAHitAsTheColdRun) {
  const Model& m = tiny(DType::Int8);
  const auto prompts = questions_over_one_document(m, 70, 4);
  Scheduler on(m, options(m, int64_t(64) << 20)), off(m, options(m, int64_t(64) << 20, false));
  EXPECT_TRUE(on.prefix_cache());
  EXPECT_FALSE(off.prefix_cache());
  const auto with = one_by_one(on, prompts, PolicyKind::None, "");
  const auto without = one_by_one(off, prompts, PolicyKind::None, "");
  int64_t queried = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(with[i].tokens, without[i].tokens) << "request " << i;
    EXPECT_EQ(with[i].rec.cached_tokens, i == 0 ? 0 : 64) << "request " << i;  // 4 full blocks of the 70
    EXPECT_EQ(without[i].rec.cached_tokens, 0);
    queried += int64_t(prompts[i].size());
  }
  EXPECT_EQ(on.prefix_cache_counters().queries, queried);
  EXPECT_EQ(on.prefix_cache_counters().hits, 3 * 64);
  EXPECT_EQ(off.prefix_cache_counters().queries, 0);
  EXPECT_GT(on.prefix_cache_blocks(), 4);  // the document's, and each sequence's own after it
  EXPECT_EQ(on.kv_bytes_reserved(), 0);
}

// The same prompt twice: all but its last block come from the cache (the last token is computed
// for its logits), and the output is the same.
TEST(PrefixCache, AWholePromptCachedStillComputesItsLastToken) {
  const Model& m = tiny(DType::Int8);
  const std::vector<int32_t> prompt = testing::random_ids(48, m.config().n_vocab, 31);
  Scheduler s(m, options(m, int64_t(64) << 20));
  const auto out = one_by_one(s, {prompt, prompt}, PolicyKind::None, "");
  EXPECT_EQ(out[1].rec.cached_tokens, 32);
  EXPECT_EQ(out[1].tokens, out[0].tokens);
}

// With LazyLLM the later questions resume what the earlier ones left: they find the document's
// pruned blocks, compute less of the prompt than a cold run does, and finish; their blocks are
// the Pruned kind's, apart from the unpruned requests' (which find none of them).
TEST(PrefixCache, LazyLlmRequestsResumeTheDocumentsPrunedState) {
  const Model& m = tiny(DType::Int8);
  const auto prompts = questions_over_one_document(m, 64, 4);
  Scheduler s(m, options(m, int64_t(64) << 20));
  const auto lazy = one_by_one(s, prompts, PolicyKind::LazyLLM, "0:0.5,2:0.5");
  for (size_t i = 1; i < prompts.size(); ++i) {
    EXPECT_EQ(lazy[i].rec.cached_tokens, 64) << i;
    EXPECT_LT(lazy[i].rec.prompt_tokens_computed_fraction, lazy[0].rec.prompt_tokens_computed_fraction) << i;
  }
  const auto plain = one_by_one(s, {prompts[0]}, PolicyKind::None, "");
  EXPECT_EQ(plain[0].rec.cached_tokens, 0);  // a pruned state is not a full one
  // The policies whose decoding does not revive as LazyLLM's does bypass the cache.
  const auto frozen = one_by_one(s, {prompts[1]}, PolicyKind::Frozen, "0:0.5");
  EXPECT_EQ(frozen[0].rec.cached_tokens, 0);
}

// Under pressure: a budget that holds one request's reservation and little more. The cache's
// blocks make room for each new request (evicted, least recently used first), every request
// finishes, and the budget holds at every step; a request whose own hit would not fit beside its
// reservation computes its prompt in full rather than wait.
TEST(PrefixCache, EvictionMakesRoomAndNothingWaitsOnTheCache) {
  const Model& m = tiny(DType::Int8);
  Scheduler probe(m, options(m, int64_t(64) << 20));
  const int64_t one = probe.reservation_bytes(80, 6, false);
  Scheduler s(m, options(m, one + one / 4));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i)
    prompts.push_back(testing::random_ids(80, m.config().n_vocab, 40 + uint32_t(i)));
  prompts.push_back(prompts[5]);  // its hit plus its reservation is over the budget
  const auto out = one_by_one(s, prompts, PolicyKind::None, "");
  EXPECT_GT(s.prefix_cache_counters().evictions, 0);
  EXPECT_EQ(out.back().tokens, out[5].tokens);
  EXPECT_EQ(out.back().rec.cached_tokens, 0);  // its own hit stood in the way
  for (size_t i = 0; i + 1 < out.size(); ++i) EXPECT_EQ(out[i].rec.cached_tokens, 0);
  EXPECT_EQ(s.kv_bytes_reserved(), 0);
  EXPECT_GT(s.prefix_cache_bytes(), 0);
}

// A cap on the cache (serve --prefix-cache-mib; on a GPU the budget is the device's while the
// blocks are in host memory): whatever room the budget leaves, the cache holds at most the cap,
// evicting the least recently used; and hits still come within it.
TEST(PrefixCache, ACapBoundsTheCacheWhateverTheBudgetLeaves) {
  const Model& m = tiny(DType::Int8);
  SchedulerOptions uncapped = options(m, int64_t(64) << 20);
  Scheduler free_run(m, uncapped);
  const auto prompts = questions_over_one_document(m, 64, 3);
  (void)one_by_one(free_run, prompts, PolicyKind::None, "");
  const int64_t whole = free_run.prefix_cache_bytes();
  ASSERT_GT(whole, 0);
  SchedulerOptions capped = uncapped;
  capped.prefix_cache_max_bytes = whole * 2 / 3;
  Scheduler s(m, capped);
  std::vector<Done> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    out[i] = one_by_one(s, {prompts[i]}, PolicyKind::None, "")[0];
    EXPECT_LE(s.prefix_cache_bytes(), capped.prefix_cache_max_bytes) << "after request " << i;
  }
  EXPECT_GT(s.prefix_cache_bytes(), 0);
  EXPECT_GT(out.back().rec.cached_tokens, 0);  // the document's blocks, kept within the cap
}

}  // namespace
}  // namespace lp
