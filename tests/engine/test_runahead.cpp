// KV-Runahead in the engine (engine/runahead.h) over an in-process link: ranks on threads, each
// with its own session and one thread, hand K/V layer by layer. Unpruned, the last rank's logits
// are bitwise the single process's, for even and uneven chunks and 2 or 3 ranks, and decoding
// goes on from the last rank's cache as from the single process's; with LazyLLM the last rank
// prunes over the whole prompt (exactly one process's pruning where the prefix stays kept); bad
// parts and a silent link are refused.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "engine/runahead.h"
#include "engine/sampler.h"
#include "kernels/context.h"
#include "model/error.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {
namespace {

// One direction between two threads: messages queued in order; recv waits up to `bound`.
class QueueLink : public KvLink {
 public:
  explicit QueueLink(std::chrono::milliseconds bound = std::chrono::milliseconds(60000)) : bound_(bound) {}
  void send(int layer, std::span<const std::byte> bytes) override {
    std::lock_guard lk(m_);
    q_.push_back({layer, std::vector<std::byte>(bytes.begin(), bytes.end())});
    cv_.notify_all();
  }
  void finish() override {}
  void recv(int layer, std::span<std::byte> out) override {
    std::unique_lock lk(m_);
    if (!cv_.wait_for(lk, bound_, [&] { return !q_.empty(); }))
      fail("KV-Runahead: no K/V for layer {} from the previous rank", layer);
    auto [l, b] = std::move(q_.front());
    q_.pop_front();
    if (l != layer || b.size() != out.size())
      fail("KV-Runahead: got layer {} ({} bytes), expected layer {} ({} bytes)", l, b.size(), layer,
           out.size());
    std::memcpy(out.data(), b.data(), b.size());
  }

 private:
  std::chrono::milliseconds bound_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<int, std::vector<std::byte>>> q_;
};

const Model& tiny(DType dt) {
  static CpuContext load_ctx(1);
  static testing::TempDir dir;
  static std::map<DType, std::unique_ptr<Model>> models;
  auto& m = models[dt];
  if (!m) {
    testing::TinyModelSpec spec;
    spec.n_layer = 5;
    m = Model::load(testing::write_tiny_model(dir.path() + "/tiny.gguf", spec), dt, load_ctx);
  }
  return *m;
}

std::vector<int32_t> prompt_of(const Model& m, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7919 + 13) % m.config().n_vocab);
  return ids;
}

// Runs the ranks on threads; returns the last rank's logits and its session (for decoding on).
std::vector<float> run_ranks(const Model& m, std::span<const int32_t> prompt,
                             const std::vector<int64_t>& chunks, std::unique_ptr<Session>* last_session,
                             std::vector<std::unique_ptr<CpuContext>>* ctxs,
                             const PruneRequest* prune = nullptr) {
  const int P = int(chunks.size());
  std::vector<std::unique_ptr<QueueLink>> links;
  for (int p = 0; p + 1 < P; ++p) links.push_back(std::make_unique<QueueLink>());
  std::vector<std::unique_ptr<Session>> sessions;
  int64_t start = 0;
  std::vector<RunaheadPart> parts;
  for (int p = 0; p < P; ++p) {
    parts.push_back({p, P, start, chunks[size_t(p)]});
    start += chunks[size_t(p)];
    sessions.push_back(std::make_unique<Session>(*(*ctxs)[size_t(p)], m, start + 8));
  }
  std::vector<float> logits(size_t(m.config().n_vocab));
  std::vector<std::string> errors(static_cast<size_t>(P));
  std::vector<std::thread> th;
  for (int p = 0; p < P; ++p)
    th.emplace_back([&, p] {
      try {
        runahead_prefill(*sessions[size_t(p)], prompt, parts[size_t(p)],
                         p > 0 ? links[size_t(p - 1)].get() : nullptr,
                         p + 1 < P ? links[size_t(p)].get() : nullptr, logits.data(), prune);
      } catch (const std::exception& e) {
        errors[size_t(p)] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int p = 0; p < P; ++p) EXPECT_EQ(errors[size_t(p)], "") << "rank " << p;
  *last_session = std::move(sessions.back());
  return logits;
}

TEST(Runahead, LogitsAreTheSingleProcessOnes) {
  for (const DType dt : {DType::Int8, DType::F32}) {
    const Model& m = tiny(dt);
    const int64_t n = 300;
    const std::vector<int32_t> prompt = prompt_of(m, n);
    CpuContext one(1);
    Session single(one, m, n + 8);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), 0);
    const int64_t last = n - 1;
    std::vector<float> want(size_t(m.config().n_vocab));
    single.forward(prompt, pos, {&last, 1}, want.data());
    for (const std::vector<int64_t>& chunks : {std::vector<int64_t>{150, 150}, std::vector<int64_t>{200, 100},
                                               std::vector<int64_t>{131, 97, 72}}) {
      SCOPED_TRACE(::testing::Message()
                   << "dtype " << int(dt) << ", " << chunks.size() << " ranks, first " << chunks[0]);
      std::vector<std::unique_ptr<CpuContext>> ctxs;
      for (size_t p = 0; p < chunks.size(); ++p) ctxs.push_back(std::make_unique<CpuContext>(1));
      std::unique_ptr<Session> tail;
      const std::vector<float> got = run_ranks(m, prompt, chunks, &tail, &ctxs);
      if (dt == DType::Int8) {
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
      } else {  // oneDNN's f32 blocking may depend on the row count
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << i;
      }
      EXPECT_EQ(argmax(got), argmax(want));
      // The last rank holds the whole prompt at every layer and decodes on like the single process.
      for (int l = 0; l < m.config().n_layer; ++l) EXPECT_EQ(tail->keys_held(l), n);
      if (dt == DType::Int8) {
        Session again(one, m, n + 8);
        std::vector<float> a(want.size()), b(want.size()), ref(want.size());
        again.forward(prompt, pos, {&last, 1}, ref.data());
        const int32_t next = argmax(ref);
        const int64_t row = 0;
        const int32_t p = int32_t(n);
        again.forward({&next, 1}, {&p, 1}, {&row, 1}, a.data());
        tail->forward({&next, 1}, {&p, 1}, {&row, 1}, b.data());
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
      }
    }
  }
}

// Keeps the earliest tokens (and the last): with shares small enough, every dropped token is in
// the last rank's chunk.
class KeepEarliest : public PruningPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::Frozen; }
  bool needs_scores() const override { return false; }
  std::vector<int64_t> select(int, std::span<const int32_t> pos, std::span<const float>,
                              int64_t n_keep) override {
    std::vector<int64_t> keep(size_t(n_keep - 1));
    std::iota(keep.begin(), keep.end(), 0);
    keep.push_back(int64_t(pos.size()) - 1);
    return keep;
  }
};

// Where no prefix token is dropped, the prefix's K/V is the same whoever computed it, so the last
// rank's pruning is one process's, to the bit (int8): the same keys scored, the same rows kept.
TEST(Runahead, PruningOnTheLastRankIsOneProcessesWhereThePrefixIsKept) {
  const Model& m = tiny(DType::Int8);
  const int64_t n = 300;
  const std::vector<int32_t> prompt = prompt_of(m, n);
  const std::vector<PruneStep> steps = {{1, 0.2}, {3, 0.2}};  // 300 -> 240 -> 192 active: > 150
  KeepEarliest policy;
  const PruneRequest req{steps, &policy};
  CpuContext one(1);
  Session single(one, m, n + 8);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  const int64_t last = n - 1;
  std::vector<float> want(size_t(m.config().n_vocab)), unpruned(want.size());
  single.forward(prompt, pos, {&last, 1}, want.data(), &req);
  Session plain(one, m, n + 8);
  plain.forward(prompt, pos, {&last, 1}, unpruned.data());
  ASSERT_NE(0, std::memcmp(want.data(), unpruned.data(), want.size() * sizeof(float)));  // it pruned
  std::vector<std::unique_ptr<CpuContext>> ctxs;
  for (int p = 0; p < 2; ++p) ctxs.push_back(std::make_unique<CpuContext>(1));
  std::unique_ptr<Session> tail;
  const std::vector<float> got = run_ranks(m, prompt, {150, 150}, &tail, &ctxs, &req);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
  // The last rank holds every prefix token at every layer, and its own kept rows.
  for (int l = 0; l < m.config().n_layer; ++l)
    EXPECT_EQ(tail->keys_held(l), single.keys_held(l)) << "layer " << l;
  EXPECT_EQ(tail->aux().size(), single.aux().size());
}

// The real LazyLLM policy, pruning prefix tokens too: the last rank attends only the kept ones at
// the later layers, its own dropped rows go to its Aux Cache, and decoding with re-selection goes
// on from its cache (reviving its own rows, reusing the prefix's K/V it holds).
TEST(Runahead, LazyLlmOnTheLastRankPrunesThePrefixItHoldsAndDecodesOn) {
  const Model& m = tiny(DType::Int8);
  const int64_t n = 300;
  const std::vector<int32_t> prompt = prompt_of(m, n);
  const std::vector<PruneStep> steps = {{1, 0.5}, {3, 0.5}};
  std::unique_ptr<PruningPolicy> policy = make_policy(PolicyKind::LazyLLM);
  const PruneRequest req{steps, policy.get()};
  std::vector<std::unique_ptr<CpuContext>> ctxs;
  for (int p = 0; p < 2; ++p) ctxs.push_back(std::make_unique<CpuContext>(1));
  std::unique_ptr<Session> tail, full;
  const std::vector<float> pruned = run_ranks(m, prompt, {180, 120}, &tail, &ctxs, &req);
  const std::vector<float> unpruned = run_ranks(m, prompt, {180, 120}, &full, &ctxs);
  EXPECT_NE(0, std::memcmp(pruned.data(), unpruned.data(), pruned.size() * sizeof(float)));
  // Layers 0-1: everything; then the prefix's 180 imported and at most the own rows kept.
  EXPECT_EQ(tail->keys_held(1), n);
  const int64_t own_kept = tail->keys_held(2) - 180;
  EXPECT_LT(own_kept, 120);
  EXPECT_GE(own_kept, 1);
  for (int l = 2; l < m.config().n_layer; ++l) EXPECT_TRUE(tail->computed(l, int32_t(n - 1)));
  EXPECT_EQ(tail->aux().size(), 120 - tail->keys_held(4) + 180);  // each dropped own row, once
  // Decoding with re-selection from here: three steps, no token-layer pair computed twice (the
  // session throws if one is).
  std::vector<float> logits = pruned;
  for (int i = 0; i < 3; ++i) {
    const int32_t tok = argmax(logits), p = int32_t(n + i);
    ASSERT_NO_THROW(tail->decode_step(tok, p, logits.data(), &req));
    EXPECT_TRUE(std::isfinite(logits[0]));
  }
}

TEST(Runahead, BadPartsAndASilentLinkAreRefused) {
  const Model& m = tiny(DType::Int8);
  const std::vector<int32_t> prompt = prompt_of(m, 40);
  CpuContext c(1);
  Session s(c, m, 64);
  std::vector<float> logits(size_t(m.config().n_vocab));
  QueueLink a(std::chrono::milliseconds(50)), b;
  const auto msg = [&](RunaheadPart part, KvLink* prev, KvLink* next) {
    try {
      s.reset();
      runahead_prefill(s, prompt, part, prev, next, logits.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({0, 2, 0, 50}, nullptr, &b).find("not inside the prompt"), std::string::npos);
  EXPECT_NE(msg({0, 2, 0, 0}, nullptr, &b).find("not inside the prompt"), std::string::npos);
  EXPECT_NE(msg({1, 2, 0, 20}, &a, nullptr).find("only rank 0"), std::string::npos);
  EXPECT_NE(msg({0, 2, 0, 40}, nullptr, &b).find("the last rank, and only it"), std::string::npos);
  // Rank 1 of 2 whose rank 0 never sends: a clear error after the link's bound, no hang.
  EXPECT_NE(msg({1, 2, 20, 20}, &a, nullptr).find("no K/V for layer 0"), std::string::npos);
}

}  // namespace
}  // namespace lp
