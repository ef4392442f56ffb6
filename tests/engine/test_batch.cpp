// Continuous batching (engine/batch.h, engine/scheduler.h): a request's greedy output is the same
// alone (generate()) and batched with others, prefills and decoding steps mixed, every pruning
// policy; admission against the K/V budget, first come first served; the token budget; cancelling
// and stopping; what can never run is refused at submission.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "engine/generate.h"
#include "engine/scheduler.h"
#include "kernels/context.h"
#include "kernels/cpu/backend.h"
#include "model/error.h"
#include "pruning/schedule.h"
#include "tests/batch_check.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"
#include "tests/tiny_arch.h"

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
    spec.n_layer = 6;
    const auto path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
    m = Model::load(path, dt, ctx());
  }
  return *m;
}

SchedulerOptions options(const Model& m, int64_t budget, int64_t batch_tokens = 4096) {
  SchedulerOptions o;
  o.kv_budget_bytes = budget;
  o.max_batch_tokens = batch_tokens;
  o.make_backend = [&m](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<CpuBackend>(ctx(), m.config(), m.weights(), n_ctx);
  };
  return o;
}

using testing::BatchCase;
using testing::random_ids;

void expect_same_alone_and_batched(const Model& m, const std::vector<BatchCase>& cases,
                                   const Schedule& schedule, int64_t max_tokens, size_t at_once) {
  testing::expect_same_alone_and_batched(m, cases, schedule, max_tokens, at_once, options(m, 0).make_backend);
}

TEST(Batch, GreedyOutputIsTheSameAloneOrBatched) {
  const Model& m = tiny(DType::Int8);
  const int V = m.config().n_vocab;
  const std::vector<BatchCase> cases = {
      {random_ids(90, V, 1), PolicyKind::None},
      {random_ids(33, V, 2), PolicyKind::LazyLLM},
      {random_ids(150, V, 3), PolicyKind::RandomLayers},
      {random_ids(7, V, 4), PolicyKind::Frozen},
      {random_ids(60, V, 5), PolicyKind::LazyLLM},
      {random_ids(41, V, 6), PolicyKind::None},
      // The paper's baselines: static-paper's one step, random-drop's shorter prompt.
      {random_ids(70, V, 7), PolicyKind::StaticPaper, "2:0.5"},
      {random_ids(80, V, 8), PolicyKind::RandomDrop, "0.3"},
  };
  expect_same_alone_and_batched(m, cases, parse_schedule("1:0.4,3:0.4"), 10, 3);
}

// A mixture-of-experts model (the tiny qwen3moe, Q8_0 in int8): the batched iterations send every
// member's routed rows through one experts_batched call, which must give each member what its own
// experts() does.
TEST(Batch, MixtureOfExpertsOutputIsTheSameAloneOrBatched) {
  testing::TempDir dir;
  testing::tiny_arch_writer("qwen3moe", true).write(dir.file("moe.gguf"));
  const auto m = Model::load(dir.file("moe.gguf"), DType::Int8, ctx());
  const int V = m->config().n_vocab;
  const std::vector<BatchCase> cases = {{random_ids(40, V, 21), PolicyKind::None},
                                        {random_ids(25, V, 22), PolicyKind::LazyLLM},
                                        {random_ids(60, V, 23), PolicyKind::LazyLLM},
                                        {random_ids(9, V, 24), PolicyKind::None}};
  expect_same_alone_and_batched(*m, cases, parse_schedule("0:0.5"), 8, 2);
}

// The default model in int8 (what `serve` runs by default), LazyLLM and none.
TEST(RealModelBatch, GreedyOutputIsTheSameAloneOrBatched) {
  static std::unique_ptr<Model> m = Model::load(testing::real_model_path(), DType::Int8, ctx());
  const int V = m->config().n_vocab;
  std::vector<BatchCase> cases;
  for (int i = 0; i < 5; ++i)
    cases.push_back({random_ids(40 + 70 * i, V, 11 + i), i % 2 ? PolicyKind::LazyLLM : PolicyKind::None});
  expect_same_alone_and_batched(*m, cases, default_schedule(), 8, 2);
}

TEST(Scheduler, AdmitsInArrivalOrderWithinTheKvBudget) {
  const Model& m = tiny(DType::Int8);
  const int V = m.config().n_vocab;
  Scheduler probe(m, options(m, 1));
  const int64_t one = probe.reservation_bytes(50, 6, false);
  Scheduler s(m, options(m, 2 * one + one / 2));  // room for two at a time
  std::vector<RequestRecord> done;
  for (int i = 0; i < 5; ++i) {
    RequestParams p;
    p.prompt = random_ids(50, V, uint32_t(20 + i));
    p.max_tokens = 6;
    p.stop_at_end_of_generation = false;
    p.on_finish = [&done](const RequestRecord& r) { done.push_back(r); };
    s.submit(std::move(p));
  }
  int64_t most = 0;
  while (s.step()) {
    most = std::max(most, s.running());
    EXPECT_LE(s.kv_bytes_reserved(), s.budget_bytes());
    EXPECT_LE(s.kv_bytes_in_use(), s.kv_bytes_reserved());
  }
  EXPECT_EQ(most, 2);
  ASSERT_EQ(done.size(), 5u);
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_EQ(done[i].finish, Finish::Length);
    if (i > 0) {
      EXPECT_LE(done[i - 1].admitted, done[i].admitted) << "not first come first served";
    }
  }
  EXPECT_EQ(s.kv_bytes_reserved(), 0);
}

TEST(Scheduler, TheTokenBudgetHoldsPrefillsBack) {
  const Model& m = tiny(DType::Int8);
  const int V = m.config().n_vocab;
  Scheduler s(m, options(m, int64_t(1) << 32, 100));
  for (int i = 0; i < 2; ++i) {
    RequestParams p;
    p.prompt = random_ids(80, V, uint32_t(30 + i));
    p.max_tokens = 4;
    s.submit(std::move(p));
  }
  ASSERT_TRUE(s.step());
  EXPECT_EQ(s.running(), 1);  // 80 + 80 > 100: the second waits for the next iteration
  EXPECT_EQ(s.queued(), 1);
  ASSERT_TRUE(s.step());
  EXPECT_EQ(s.running(), 2);  // 1 decoding row + 80 <= 100
  EXPECT_EQ(s.queued(), 0);
  // A prompt longer than the budget still runs, as its iteration's only prefill.
  RequestParams p;
  p.prompt = random_ids(300, V, 40);
  p.max_tokens = 2;
  Finish f = Finish::Error;
  p.on_finish = [&f](const RequestRecord& r) { f = r.finish; };
  s.submit(std::move(p));
  while (s.step()) {
  }
  EXPECT_EQ(f, Finish::Length);
}

TEST(Scheduler, CancelAndStopFreeTheRequest) {
  const Model& m = tiny(DType::Int8);
  const int V = m.config().n_vocab;
  Scheduler s(m, options(m, int64_t(1) << 32));
  std::map<uint64_t, RequestRecord> done;
  const auto req = [&](int n_stop) {
    RequestParams p;
    p.prompt = random_ids(30, V, 50);
    p.max_tokens = 20;
    p.stop_at_end_of_generation = false;
    p.policy = PolicyKind::LazyLLM;
    p.schedule = parse_schedule("1:0.5");
    auto count = std::make_shared<int>(0);
    p.on_token = [count, n_stop](int32_t) { return ++*count < n_stop; };
    p.on_finish = [&done](const RequestRecord& r) { done[r.id] = r; };
    return s.submit(std::move(p));
  };
  const uint64_t a = req(1000), b = req(3), c = req(1000);
  ASSERT_TRUE(s.step());
  EXPECT_EQ(s.running(), 3);
  s.cancel(a);
  ASSERT_TRUE(s.step());
  EXPECT_EQ(done.at(a).finish, Finish::Cancelled);
  EXPECT_EQ(done.at(a).output_tokens, 1);
  ASSERT_TRUE(s.step());
  EXPECT_EQ(done.at(b).finish, Finish::Stop);  // its callback said stop at its third token
  EXPECT_EQ(done.at(b).output_tokens, 3);
  EXPECT_EQ(s.running(), 1);
  s.cancel(c);
  s.cancel(12345);  // unknown: ignored
  EXPECT_FALSE(s.step());
  EXPECT_EQ(done.at(c).finish, Finish::Cancelled);
  EXPECT_LT(done.at(c).prompt_tokens_computed_fraction, 1.0);
  EXPECT_EQ(s.kv_bytes_reserved(), 0);
  EXPECT_EQ(s.running(), 0);
}

// A request whose admission fails after its session is made (here its sampler refuses top_p 0, which
// the server's float check now keeps out) ends with its error and reserves nothing; the request
// beside it runs to its end and the budget returns to zero (issue 50: such requests once kept
// their reservation and never finished, until nothing else could be admitted).
TEST(Scheduler, AFailureAtAdmissionEndsTheRequestAndKeepsNoReservation) {
  const Model& m = tiny(DType::Int8);
  Scheduler s(m, options(m, int64_t(1) << 32));
  std::map<uint64_t, RequestRecord> done;
  const auto req = [&](float top_p) {
    RequestParams p;
    p.prompt = random_ids(12, m.config().n_vocab, 7);
    p.max_tokens = 3;
    p.stop_at_end_of_generation = false;
    p.sampler.top_p = top_p;
    p.on_finish = [&done](const RequestRecord& r) { done[r.id] = r; };
    return s.submit(std::move(p));
  };
  const uint64_t bad = req(0.0f), good = req(1.0f);
  while (s.step()) {
  }
  ASSERT_EQ(done.count(bad), 1u) << "the failed request never finished";
  EXPECT_EQ(done.at(bad).finish, Finish::Error);
  EXPECT_NE(done.at(bad).error.find("top-p"), std::string::npos) << done.at(bad).error;
  EXPECT_EQ(done.at(good).finish, Finish::Length);
  EXPECT_EQ(done.at(good).output_tokens, 3);
  EXPECT_EQ(s.kv_bytes_reserved(), 0);
  EXPECT_EQ(s.running(), 0);
}

// The CPU backend with a failure planted: its `n`-th pass of the chosen kind throws when the pass
// begins (embed: that member alone) or in the middle of the batch (swiglu: every member's state is
// then unknown).
struct FaultyBackend : CpuBackend {
  enum Where { PrefillStart, DecodeStart, DecodeMidBatch } where;
  int n;  // the pass of that kind that fails, from 1
  int seen = 0;
  FaultyBackend(const Model& m, int64_t n_ctx, Where w, int nth)
      : CpuBackend(ctx(), m.config(), m.weights(), n_ctx), where(w), n(nth) {}
  void embed(std::span<const int32_t> ids) override {
    const bool prefill = ids.size() > 1;
    if ((where == PrefillStart && prefill) || (where != PrefillStart && !prefill)) ++seen;
    if (where != DecodeMidBatch && seen == n) throw Error("planted failure");
    CpuBackend::embed(ids);
  }
  void swiglu() override {
    if (where == DecodeMidBatch && seen == n) throw Error("planted failure");
    CpuBackend::swiglu();
  }
};

// Issue 50: nothing after admission loses a request or its reservation. A failure planted at each
// stage of one request's life (its admission, the start of its prefill, of a decoding step, the
// middle of a batched step, its token callback, its finish callback) ends that request with an
// error that names the stage; a request beside it runs to its end unless the batch itself failed;
// the K/V budget returns to zero every time.
TEST(Scheduler, AFailureAtAnyStageEndsItsRequestAndReleasesItsReservation) {
  const Model& m = tiny(DType::Int8);
  const int V = m.config().n_vocab;
  enum Stage { Admission, Prefill, Decode, MidBatch, Token, Finished };
  for (const Stage stage : {Admission, Prefill, Decode, MidBatch, Token, Finished}) {
    SCOPED_TRACE(stage);
    SchedulerOptions o = options(m, int64_t(1) << 32);
    o.make_backend = [&m, stage, made = std::make_shared<int>(0)](int64_t n_ctx) -> std::unique_ptr<Backend> {
      // The scheduler's probe of the K/V layout (capacity 1) and every request's but the first: sound.
      if (n_ctx == 1 || ++*made > 1)
        return std::make_unique<CpuBackend>(ctx(), m.config(), m.weights(), n_ctx);
      if (stage == Admission) throw Error("planted failure");
      // The first request's backend: its third decoding step fails.
      const auto w = stage == Prefill  ? FaultyBackend::PrefillStart
                     : stage == Decode ? FaultyBackend::DecodeStart
                                       : FaultyBackend::DecodeMidBatch;
      return std::make_unique<FaultyBackend>(m, n_ctx, w,
                                             stage == Prefill                       ? 1
                                             : stage == MidBatch || stage == Decode ? 3
                                                                                    : 1000);
    };
    Scheduler s(m, o);
    std::map<uint64_t, RequestRecord> done;
    const auto req = [&](uint32_t seed, bool faulty) {
      RequestParams p;
      p.prompt = random_ids(20, V, seed);
      p.max_tokens = 6;
      p.stop_at_end_of_generation = false;
      p.policy = PolicyKind::LazyLLM;
      p.schedule = parse_schedule("1:0.5");
      auto count = std::make_shared<int>(0);
      p.on_token = [count, faulty, stage](int32_t) {
        if (faulty && stage == Token && ++*count == 2) throw std::runtime_error("planted failure");
        return true;
      };
      p.on_finish = [&done, faulty, stage](const RequestRecord& r) {
        done[r.id] = r;
        if (faulty && stage == Finished) throw std::runtime_error("planted failure");
      };
      return s.submit(std::move(p));
    };
    const uint64_t bad = req(1, true), good = req(2, false);
    bool threw = false;
    for (int i = 0; i < 50; ++i) {
      try {
        if (!s.step()) break;
      } catch (const Error& e) {  // only a finish callback's failure comes out of step()
        EXPECT_EQ(stage, Finished) << e.what();
        EXPECT_NE(std::string(e.what()).find("finish callback: planted failure"), std::string::npos)
            << e.what();
        threw = true;
      }
    }
    EXPECT_EQ(threw, stage == Finished);
    ASSERT_EQ(done.count(bad), 1u) << "the failed request never finished";
    ASSERT_EQ(done.count(good), 1u);
    const RequestRecord& b = done.at(bad);
    if (stage == Finished) {
      EXPECT_EQ(b.finish, Finish::Length);
    } else {
      EXPECT_EQ(b.finish, Finish::Error);
      const char* named = stage == Admission  ? "admission: planted failure"
                          : stage == Prefill  ? "prefill: planted failure"
                          : stage == Decode   ? "decoding step: planted failure"
                          : stage == MidBatch ? "batch: planted failure"
                                              : "emitting a token: planted failure";
      EXPECT_EQ(b.error, named);
    }
    // The batch's failure ends both; every other failure is the one request's.
    EXPECT_EQ(done.at(good).finish, stage == MidBatch ? Finish::Error : Finish::Length);
    if (stage != MidBatch) {
      EXPECT_EQ(done.at(good).output_tokens, 6);
    }
    EXPECT_EQ(s.kv_bytes_reserved(), 0);
    EXPECT_EQ(s.running(), 0);
    EXPECT_EQ(s.queued(), 0);
  }
}

// Issue 58's bad input: a GPU failure mid-batch (lp::DeviceError, what the CUDA backend throws for a
// CUDA error) ends the batch's requests marked device_error (a server's 503); one that loses the
// device ends every request, the running, the queued (held back by the token budget) and any
// submitted later, and refuses new ones; one that does not leaves the scheduler serving. The K/V
// budget returns to zero either way.
TEST(Scheduler, AGpuFailureEndsItsBatchAndALostGpuEndsEverything) {
  const Model& m = tiny(DType::Int8);
  const int V = m.config().n_vocab;
  for (const bool lost : {false, true}) {
    SCOPED_TRACE(lost ? "lost" : "not lost");
    struct DeviceFault : CpuBackend {
      bool lost;
      int steps = 0;
      DeviceFault(const Model& m, int64_t n_ctx, bool l)
          : CpuBackend(ctx(), m.config(), m.weights(), n_ctx), lost(l) {}
      void swiglu() override {  // its first decoding step, mid-batch (beside the second request's prefill)
        if (rows() == 1 && ++steps == 6)
          throw DeviceError("CUDA error in swiglu: an illegal memory access", lost);
        CpuBackend::swiglu();
      }
    };
    SchedulerOptions o = options(m, int64_t(1) << 32, 21);  // one prefill an iteration (and 1 decoding row)
    o.make_backend = [&m, lost, made = std::make_shared<int>(0)](int64_t n_ctx) -> std::unique_ptr<Backend> {
      if (n_ctx == 1 || ++*made > 1)
        return std::make_unique<CpuBackend>(ctx(), m.config(), m.weights(), n_ctx);
      return std::make_unique<DeviceFault>(m, n_ctx, lost);
    };
    Scheduler s(m, o);
    std::map<uint64_t, RequestRecord> done;
    const auto req = [&](uint32_t seed) {
      RequestParams p;
      p.prompt = random_ids(20, V, seed);
      p.max_tokens = 6;
      p.stop_at_end_of_generation = false;
      p.on_finish = [&done](const RequestRecord& r) { done[r.id] = r; };
      return s.submit(std::move(p));
    };
    const uint64_t first = req(1), beside = req(2), queued = req(3);
    for (int i = 0; i < 50 && s.step(); ++i) {
    }
    ASSERT_EQ(done.size(), 3u);
    for (const uint64_t id : {first, beside}) {
      EXPECT_EQ(done.at(id).finish, Finish::Error) << id;
      EXPECT_TRUE(done.at(id).device_error) << id;
      EXPECT_NE(done.at(id).error.find("illegal memory access"), std::string::npos) << done.at(id).error;
    }
    EXPECT_EQ(done.at(queued).finish, lost ? Finish::Error : Finish::Length) << done.at(queued).error;
    EXPECT_EQ(done.at(queued).device_error, lost);
    if (lost) {
      EXPECT_NE(done.at(queued).error.find("the GPU cannot be used any more"), std::string::npos);
    }
    EXPECT_EQ(s.device_lost(), lost);
    EXPECT_EQ(s.kv_bytes_reserved(), 0);
    EXPECT_EQ(s.running(), 0);
    EXPECT_EQ(s.queued(), 0);
    if (lost) {
      EXPECT_THROW(req(4), DeviceError);
      EXPECT_NE(s.device_lost_reason().find("illegal memory access"), std::string::npos);
    } else {
      req(4);
      for (int i = 0; i < 50 && s.step(); ++i) {
      }
      EXPECT_EQ(done.size(), 4u);
      EXPECT_EQ(s.kv_bytes_reserved(), 0);
    }
  }
}

TEST(Scheduler, RefusesWhatCanNeverRun) {
  const Model& m = tiny(DType::Int8);
  Scheduler s(m, options(m, int64_t(1) << 16));
  const auto submit = [&](std::vector<int32_t> ids, int64_t max_tokens) {
    RequestParams p;
    p.prompt = std::move(ids);
    p.max_tokens = max_tokens;
    s.submit(std::move(p));
  };
  EXPECT_THROW(submit({}, 4), Error);
  EXPECT_THROW(submit({1, 2}, 0), Error);
  EXPECT_THROW(submit({1, m.config().n_vocab}, 4), Error);
  EXPECT_THROW(submit({1, 2}, m.config().n_ctx_train), Error);
  try {
    submit(random_ids(400, m.config().n_vocab, 1), 100);  // K/V over the 64 KiB budget
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("over the whole budget"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(s.step());
  // --max-model-len: prompt + max_tokens within it, or refused naming it.
  SchedulerOptions o = options(m, int64_t(1) << 16);
  o.max_request_tokens = 8;
  Scheduler bounded(m, o);
  RequestParams p;
  p.prompt = {1, 2, 3};
  p.max_tokens = 5;
  bounded.submit(p);
  p.max_tokens = 6;
  try {
    bounded.submit(p);
    FAIL() << "accepted beyond max_request_tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceed the context a request may hold here (--max-model-len) of 8"),
              std::string::npos)
        << e.what();
  }
}

// Log-probabilities (RequestParams::top_logprobs): the log-softmax of the logits, computed here in
// long double, and the k most likely, ties to the lower id; through the scheduler, each token's
// before the token itself, the greedy token the most likely, the first one the prefill's logits'.
TEST(Logprobs, FromTheMathAndThroughTheScheduler) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 3.0f, -1.0f};
  long double z = 0;
  for (const float x : logits) z += std::exp((long double)x);
  const TokenLogprobs lp = token_logprobs(logits, 1, 3);
  EXPECT_NEAR(lp.logprob, double(2.0L - std::log(z)), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 2);  // the tie at 3.0: the lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 1);
  EXPECT_NEAR(lp.top[0].second, double(3.0L - std::log(z)), 1e-6);
  EXPECT_EQ(token_logprobs(logits, 0, 50).top.size(), logits.size());  // at most every token
  EXPECT_THROW(token_logprobs(logits, 5, 1), Error);

  const Model& m = tiny(DType::F32);
  const std::vector<int32_t> prompt = random_ids(30, m.config().n_vocab, 3);
  std::vector<float> first(static_cast<size_t>(m.config().n_vocab));
  {
    Session s(ctx(), m, 64);
    std::vector<int32_t> pos(prompt.size());
    std::iota(pos.begin(), pos.end(), 0);
    const int64_t last = int64_t(prompt.size()) - 1;
    s.forward(prompt, pos, {&last, 1}, first.data());
  }
  Scheduler sched(m, options(m, int64_t(64) << 20));
  RequestParams p;
  p.prompt = prompt;
  p.max_tokens = 5;
  p.stop_at_end_of_generation = false;
  p.top_logprobs = 4;
  std::vector<TokenLogprobs> got;
  std::vector<int32_t> tokens;
  p.on_logprobs = [&](const TokenLogprobs& x) {
    EXPECT_EQ(got.size(), tokens.size());  // before its token
    got.push_back(x);
  };
  p.on_token = [&](int32_t t) {
    tokens.push_back(t);
    return true;
  };
  sched.submit(std::move(p));
  while (sched.step()) {
  }
  ASSERT_EQ(got.size(), 5u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, tokens[i]);
    ASSERT_EQ(got[i].top.size(), 4u);
    EXPECT_EQ(got[i].top[0].first, tokens[i]);  // greedy
    EXPECT_EQ(got[i].top[0].second, got[i].logprob);
    for (size_t k = 1; k < 4; ++k) EXPECT_LE(got[i].top[k].second, got[i].top[k - 1].second);
    EXPECT_LE(got[i].logprob, 0.0f);
  }
  long double zf = 0, mx = *std::max_element(first.begin(), first.end());
  for (const float x : first) zf += std::exp((long double)x - mx);
  EXPECT_NEAR(got[0].logprob, double((long double)first[size_t(tokens[0])] - mx - std::log(zf)), 1e-5);
  RequestParams bad;
  bad.prompt = prompt;
  bad.top_logprobs = 21;
  EXPECT_THROW(sched.submit(std::move(bad)), Error);
}

// The prompt's own log-probabilities (OpenAI's echo, lm-eval's loglikelihood): token t + 1 given
// the tokens to t, from one prefill that computes every row, as the log-softmax of a session's
// logits for every row computed here in long double; then decoding goes on as usual. Refused with
// pruning (the pruned rows have no logits).
TEST(Logprobs, ThePromptsOwnFromEveryRowsLogits) {
  const Model& m = tiny(DType::F32);
  const int64_t V = m.config().n_vocab;
  const std::vector<int32_t> prompt = random_ids(24, m.config().n_vocab, 8);
  std::vector<float> rows(prompt.size() * size_t(V));
  {
    Session s(ctx(), m, 64);
    std::vector<int32_t> pos(prompt.size());
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<int64_t> all(prompt.size());
    std::iota(all.begin(), all.end(), 0);
    s.forward(prompt, pos, all, rows.data());
  }
  Scheduler sched(m, options(m, int64_t(64) << 20));
  std::vector<TokenLogprobs> got;
  int tokens = 0;
  RequestParams p;
  p.prompt = prompt;
  p.max_tokens = 3;
  p.stop_at_end_of_generation = false;
  p.top_logprobs = 2;
  p.prompt_logprobs = true;
  p.on_prompt_logprobs = [&](std::span<const TokenLogprobs> lps) {
    EXPECT_EQ(tokens, 0);  // before the first token
    got.assign(lps.begin(), lps.end());
  };
  p.on_token = [&](int32_t) {
    ++tokens;
    return true;
  };
  sched.submit(std::move(p));
  while (sched.step()) {
  }
  EXPECT_EQ(tokens, 3);
  ASSERT_EQ(got.size(), prompt.size() - 1);
  for (size_t t = 0; t + 1 < prompt.size(); ++t) {
    const float* row = rows.data() + t * size_t(V);
    long double mx = *std::max_element(row, row + V), z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp((long double)row[v] - mx);
    EXPECT_EQ(got[t].token, prompt[t + 1]);
    EXPECT_NEAR(got[t].logprob, double((long double)row[prompt[t + 1]] - mx - std::log(z)), 1e-5) << t;
    EXPECT_EQ(got[t].top.size(), 2u);
  }
  // The logits count in the reservation: a budget that holds the K/V but not them refuses.
  const int64_t kv_only = sched.reservation_bytes(int64_t(prompt.size()), 3, false);
  Scheduler small(m, options(m, kv_only + int64_t(prompt.size()) * V * 4 - 1));
  RequestParams big;
  big.prompt = prompt;
  big.max_tokens = 3;
  big.prompt_logprobs = true;
  EXPECT_THROW(small.submit(big), Error);
  big.prompt_logprobs = false;
  EXPECT_NO_THROW(small.submit(big));
  RequestParams pruned;
  pruned.prompt = prompt;
  pruned.prompt_logprobs = true;
  pruned.policy = PolicyKind::LazyLLM;
  pruned.schedule = parse_schedule("1:0.5");
  EXPECT_THROW(sched.submit(std::move(pruned)), Error);
}

}  // namespace
}  // namespace lp
