// The serving policy (admission/admission.h) on typed inputs, the request log's one format
// (admission/request_log.h), and the conformance of its two
// executors: `serve`'s scheduler on real passes (engine/scheduler.h) and the serving simulation on
// costed time (sim/serving.h), fed the same arrivals, admit, batch and finish every request in the
// same iteration.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "admission/admission.h"
#include "admission/request_log.h"
#include "engine/scheduler.h"
#include "hwmodels/profile.h"
#include "kernels/context.h"
#include "kernels/cpu/backend.h"
#include "model/error.h"
#include "pruning/schedule.h"
#include "sim/serving.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {
namespace {

TEST(Reservation, IsTheWorstCaseKvInTheBackendsLayoutPlusTheAuxCache) {
  ModelConfig c;
  c.n_layer = 4, c.n_head_kv = 2, c.head_dim = 16, c.n_embd = 64;
  const double per_slot = 4.0 * 2 * 16 * 2 * 2;  // layers x Hkv x Dh x (K and V) x f16
  EXPECT_EQ(reservation_bytes(c, {2, 64}, 10, 6, false), 64 * per_slot);  // 16 slots round up to 64
  EXPECT_EQ(reservation_bytes(c, {2, 64}, 60, 5, false), 128 * per_slot);
  EXPECT_EQ(reservation_bytes(c, {2, 1}, 60, 5, false), 65 * per_slot);  // an exact layout
  EXPECT_EQ(reservation_bytes(c, {1, 1}, 60, 5, false), 65 * per_slot / 2);
  EXPECT_EQ(reservation_bytes(c, {2, 64}, 10, 6, true), 64 * per_slot + 10 * 64 * 4);  // + f32 states
}

// What a backend holds beside K/V (a GPU's: KvLayout::token_bytes, request_bytes), and its Aux
// Cache held for every token of capacity, counted once.
TEST(Reservation, CountsWhatTheBackendHoldsBesideKv) {
  ModelConfig c;
  c.n_layer = 4, c.n_head_kv = 2, c.head_dim = 16, c.n_embd = 64;
  const double per_slot = 4.0 * 2 * 16 * 2 * 2;
  const KvLayout gpu{.element_bytes = 2, .block = 1, .token_bytes = 300, .request_bytes = 5000};
  EXPECT_EQ(reservation_bytes(c, gpu, 10, 6, false), 16 * (per_slot + 300) + 5000);
  EXPECT_EQ(reservation_bytes(c, gpu, 10, 6, true), 16 * (per_slot + 300) + 5000 + 10 * 64 * 4);
  KvLayout aux_held = gpu;
  aux_held.aux_in_token_bytes = true;
  EXPECT_EQ(reservation_bytes(c, aux_held, 10, 6, true), 16 * (per_slot + 300) + 5000);
}

// How `serve --backend cuda` divides a GPU, worked by hand. The model: 2 layers of one 4-wide K/V
// head in f16 (32 bytes a token) and an 8-wide Aux Cache state (32 bytes a prompt token), so a
// pruned n-token request reserves 64 n; its prefill takes 1000 n + 5000 more. The GPU: 1,000,000
// bytes, 90% of them the server's, 100,000 of it the weights: 800,000 for requests.
TEST(DeviceMemoryPlan, KeepsRoomForTheLongestRequestsPrefillAndGivesTheRestToReservations) {
  ModelConfig c;
  c.n_layer = 2, c.n_head_kv = 1, c.head_dim = 4, c.n_embd = 8, c.n_ctx_train = 4096;
  const KvLayout kv{.element_bytes = 2, .block = 1};
  ASSERT_EQ(reservation_bytes(c, kv, 10, 0, true), 640);
  const DeviceMemory gpu{1e6, 1e6};
  const auto prefill = [](int64_t n) { return 1000.0 * double(n) + 5000; };
  // The most that fits: 1064 n + 5000 <= 800,000 gives n = 747.
  DeviceMemoryPlan p = plan_device_memory(c, kv, gpu, 0.9, 1e5, 0, prefill);
  EXPECT_DOUBLE_EQ(p.limit, 9e5);
  EXPECT_EQ(p.max_request_tokens, 747);
  EXPECT_DOUBLE_EQ(p.prefill, 752000);
  EXPECT_DOUBLE_EQ(p.kv_budget_bytes, 48000);
  // A shorter context leaves more to reservations: the model's own, and --max-model-len.
  c.n_ctx_train = 500;
  p = plan_device_memory(c, kv, gpu, 0.9, 1e5, 0, prefill);
  EXPECT_EQ(p.max_request_tokens, 500);
  EXPECT_DOUBLE_EQ(p.kv_budget_bytes, 800000 - 505000);
  p = plan_device_memory(c, kv, gpu, 0.9, 1e5, 100, prefill);
  EXPECT_EQ(p.max_request_tokens, 100);
  EXPECT_DOUBLE_EQ(p.kv_budget_bytes, 800000 - 105000);
  c.n_ctx_train = 4096;
  // Refused, each with the sizes: a --max-model-len that does not fit (1064 x 800 + 5000 > 800,000)
  // or beyond the model's context, more than the free memory, weights that leave no room for one
  // token, a share that is none or more than all.
  const auto refusal = [&](double util, double free, double weights, int64_t max_len) {
    try {
      (void)plan_device_memory(c, kv, {1e6, free}, util, weights, max_len, prefill);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(refusal(0.9, 1e6, 1e5, 800).find("a request of 800 tokens (--max-model-len) needs"),
            std::string::npos);
  EXPECT_NE(refusal(0.9, 1e6, 1e5, 5000).find("outside the model's context of 4096"), std::string::npos);
  EXPECT_NE(refusal(0.9, 8e5, 1e5, 0).find("but 0.00 GiB are free"), std::string::npos);
  EXPECT_NE(refusal(0.9, 1e6, 8.99e5, 0).find("do not fit in 90% of the GPU"), std::string::npos);
  for (const double bad : {0.0, 1.0, 1.5, std::nan("")})
    EXPECT_NE(refusal(bad, 1e6, 1e5, 0).find("--gpu-memory-utilization must be above 0"), std::string::npos);
}

TEST(Admission, FirstComeFirstServedWithinTheKvAndTokenBudgets) {
  // Whole prefills: the first always fits the token budget, later ones only within it.
  Admission a({1000, 100, 0}, 200, 3);  // 200 bytes reserved, 3 decoding rows
  EXPECT_FALSE(a.fits(801, 10));        // over the K/V budget
  EXPECT_TRUE(a.fits(800, 500));        // the first prefill, longer than the token budget
  a.take(100, 90);
  EXPECT_EQ(a.rows(), 93);
  EXPECT_EQ(a.reserved_bytes(), 300);
  EXPECT_TRUE(a.fits(100, 7));  // 100 rows exactly
  EXPECT_FALSE(a.fits(100, 8));
  a.take(100, 7);
  EXPECT_EQ(a.admitted(), 2);
  // Chunked prefills: admitted while rows are left, each taking its first chunk of them.
  Admission ch({1000, 100, 32}, 0, 80);
  EXPECT_EQ(ch.first_rows(500), 20);  // what the iteration has left
  ch.take(10, 500);
  EXPECT_EQ(ch.rows(), 100);
  EXPECT_FALSE(ch.fits(10, 5));
  Admission ch2({1000, 100, 32}, 0, 0);
  EXPECT_EQ(ch2.first_rows(500), 32);
  EXPECT_EQ(ch2.first_rows(12), 12);
  // A cap on running requests (max_num_seqs): 3 running and a cap of 5 admit two more.
  Admission capped({1000, 100, 0, 5}, 0, 3, 3);
  EXPECT_TRUE(capped.fits(10, 10));
  capped.take(10, 10);
  EXPECT_TRUE(capped.fits(10, 10));
  capped.take(10, 10);
  EXPECT_FALSE(capped.fits(10, 10));
  EXPECT_TRUE(Admission({1000, 100, 0, 0}, 0, 3, 1000).fits(10, 10));  // 0: no cap
  // What can never work is refused.
  EXPECT_THROW(Admission({0, 100, 0}, 0, 0), Error);
  EXPECT_THROW(Admission({1000, 0, 0}, 0, 0), Error);
}

CpuContext& ctx() {
  static CpuContext c(2);
  return c;
}

const Model& tiny() {
  static testing::TempDir dir;
  static std::unique_ptr<Model> m = [] {
    testing::TinyModelSpec spec;
    spec.n_layer = 4;
    return Model::load(testing::write_tiny_model(dir.path() + "/tiny.gguf", spec), DType::F32, ctx());
  }();
  return *m;
}

struct Arrival {
  int64_t iteration;  // arrives before this iteration begins
  int64_t prompt_tokens, output_tokens;
  int64_t group = -1, shared = 0;  // its prompt's first `shared` tokens are its group's document
};
struct Seen {
  int64_t admitted = -1, finished = -1;
  int64_t cached = 0;  // prompt tokens found in the prefix cache
  bool operator==(const Seen&) const = default;
};

// The engine's scheduler on the tiny model: request i submitted before iteration arrivals[i].iteration,
// each iteration one step(); the iteration of its prefill (its first token: prefills are whole) and
// of its finish.
std::vector<Seen> engine_run(const std::vector<Arrival>& arrivals, int64_t budget, int64_t batch_tokens,
                             bool lazyllm, bool cache = false) {
  SchedulerOptions o;
  o.prefix_cache = cache;
  o.kv_budget_bytes = budget;
  o.max_batch_tokens = batch_tokens;
  o.make_backend = [](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<CpuBackend>(ctx(), tiny().config(), tiny().weights(), n_ctx);
  };
  Scheduler s(tiny(), o);
  std::vector<Seen> seen(arrivals.size());
  int64_t it = 0;
  size_t next = 0, finished = 0;
  for (; finished < arrivals.size(); ++it) {
    for (; next < arrivals.size() && arrivals[next].iteration <= it; ++next) {
      RequestParams p;
      const Arrival& a = arrivals[next];
      if (a.group >= 0)
        p.prompt = testing::random_ids(int(a.shared), tiny().config().n_vocab, 1000 + uint32_t(a.group));
      const auto own =
          testing::random_ids(int(a.prompt_tokens - a.shared), tiny().config().n_vocab, uint32_t(next));
      p.prompt.insert(p.prompt.end(), own.begin(), own.end());
      p.max_tokens = arrivals[next].output_tokens;
      p.stop_at_end_of_generation = false;
      if (lazyllm) {
        p.policy = PolicyKind::LazyLLM;
        p.schedule = parse_schedule("1:0.5");
      }
      Seen* me = &seen[next];
      p.on_token = [me, &it](int32_t) {
        if (me->admitted < 0) me->admitted = it;
        return true;
      };
      p.on_finish = [me, &it, &finished](const RequestRecord& r) {
        EXPECT_NE(r.finish, Finish::Error) << r.error;
        me->finished = it;
        me->cached = r.cached_tokens;
        ++finished;
      };
      s.submit(std::move(p));
    }
    s.step();
    if (it > 1000) ADD_FAILURE() << "the engine never finished";
    if (it > 1000) break;
  }
  EXPECT_EQ(s.kv_bytes_reserved(), 0);
  return seen;
}

// The simulation of the same arrivals: every iteration made to take about 1000 s (an overhead that
// dwarfs the tiny model's costed microseconds), a request arriving 0.5 s before iteration k's
// start, so times read back as iteration numbers.
std::vector<Seen> sim_run(const std::vector<Arrival>& arrivals, int64_t budget, int64_t batch_tokens,
                          bool lazyllm, const KvLayout& kv, bool cache = false) {
  constexpr double kIteration = 1000;
  std::vector<sim::ServingRequest> reqs;
  for (const Arrival& a : arrivals) {
    reqs.push_back({std::max(0.0, double(a.iteration) * kIteration - 0.5), a.prompt_tokens, a.output_tokens});
    reqs.back().shared_group = a.group, reqs.back().shared_tokens = a.shared;
  }
  const sim::ServingMethod m =
      lazyllm ? sim::serving_method({PolicyKind::LazyLLM, parse_schedule("1:0.5")}, tiny().config())
              : sim::ServingMethod{};
  sim::ServingConfig cfg;
  cfg.kv_budget_bytes = double(budget);
  cfg.max_batch_tokens = batch_tokens;
  cfg.kv_element_bytes = kv.element_bytes;
  cfg.kv_block = kv.block;
  cfg.iteration_overhead_s = kIteration;
  cfg.prefix_cache = cache;
  cfg.copy_bytes_per_s = 1e30;  // the copies' time aside: iterations are numbers here
  sim::Precision p;
  p.weights = p.compute = "f32";
  p.kv = "f16";
  const sim::ServingRun run =
      sim::simulate_serving(tiny().config(), hw::load_profile("cpu-local"), p, m, cfg, reqs);
  std::vector<Seen> seen;
  for (const sim::RequestOutcome& o : run.requests)
    seen.push_back({int64_t(std::lround(o.admitted_s / kIteration)),
                    int64_t(std::lround(o.finished_s / kIteration)) - 1, o.cached_tokens});
  return seen;
}

// 24 requests of mixed lengths arriving over the first iterations, against a K/V budget that
// holds about six and a token budget of 64 rows (one prompt is longer): queueing behind the head, the
// first prefill that fills an iteration alone, decoding rows taking their share. Unpruned and with
// LazyLLM (whose reservations carry the Aux Cache).
TEST(AdmissionConformance, TheSchedulerAndTheSimulationAdmitAndFinishInTheSameIterations) {
  std::vector<Arrival> arrivals;
  std::mt19937 rng(5);
  for (int i = 0; i < 24; ++i)
    arrivals.push_back({i < 6 ? 0 : i / 2, 4 + int64_t(rng() % 60), 1 + int64_t(rng() % 12)});
  arrivals[9].prompt_tokens = 150;  // longer than the token budget: its iteration's only prefill
  const int64_t batch_tokens = 64;
  for (const bool lazyllm : {false, true}) {
    SCOPED_TRACE(lazyllm ? "lazyllm" : "none");
    SchedulerOptions probe_options;
    probe_options.make_backend = [](int64_t n_ctx) -> std::unique_ptr<Backend> {
      return std::make_unique<CpuBackend>(ctx(), tiny().config(), tiny().weights(), n_ctx);
    };
    const KvLayout kv = Scheduler(tiny(), probe_options).kv_layout();
    EXPECT_EQ(kv.block, 64);  // the CPU backend's, read from it
    const int64_t budget = int64_t(6.5 * reservation_bytes(tiny().config(), kv, 40, 8, lazyllm));
    const std::vector<Seen> engine = engine_run(arrivals, budget, batch_tokens, lazyllm);
    const std::vector<Seen> sim = sim_run(arrivals, budget, batch_tokens, lazyllm, kv);
    ASSERT_EQ(engine.size(), sim.size());
    int64_t waited = 0;
    for (size_t i = 0; i < engine.size(); ++i) {
      EXPECT_EQ(engine[i].admitted, sim[i].admitted) << "request " << i;
      EXPECT_EQ(engine[i].finished, sim[i].finished) << "request " << i;
      waited += engine[i].admitted > arrivals[i].iteration;
    }
    EXPECT_GE(waited, 5);  // the budgets bind: the property is not vacuous
  }
}

// The prefix cache under the same rule (admission/prefix_cache.h, the one policy of both): requests
// over four shared documents (48 to 110 tokens) arriving over the first iterations. Unpruned, with
// a budget that holds about ten requests, so that blocks are evicted as requests need the room:
// the scheduler and the simulation admit and finish each request in the same iteration and find
// the same cached tokens. With LazyLLM (its blocks' bytes are the engine's actual depths, the
// simulation's its schedule's share, so under pressure they would evict differently) with room
// for everything.
TEST(AdmissionConformance, ThePrefixCacheFindsTheSameHitsInBoth) {
  std::vector<Arrival> arrivals;
  std::mt19937 rng(9);
  for (int i = 0; i < 24; ++i) {
    const int64_t g = int64_t(rng() % 4), shared = 48 + 20 * g + (g == 3 ? 2 : 0);
    arrivals.push_back(
        {i < 4 ? 0 : i / 2, shared + 3 + int64_t(rng() % 30), 1 + int64_t(rng() % 12), g, shared});
  }
  SchedulerOptions probe_options;
  probe_options.make_backend = [](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<CpuBackend>(ctx(), tiny().config(), tiny().weights(), n_ctx);
  };
  const KvLayout kv = Scheduler(tiny(), probe_options).kv_layout();
  for (const bool lazyllm : {false, true}) {
    SCOPED_TRACE(lazyllm ? "lazyllm" : "none");
    const double one = reservation_bytes(tiny().config(), kv, 120, 8, lazyllm);
    const int64_t budget = int64_t((lazyllm ? 100 : 10) * one);
    const std::vector<Seen> engine = engine_run(arrivals, budget, 256, lazyllm, true);
    const std::vector<Seen> sim = sim_run(arrivals, budget, 256, lazyllm, kv, true);
    ASSERT_EQ(engine.size(), sim.size());
    int64_t hits = 0, waited = 0;
    for (size_t i = 0; i < engine.size(); ++i) {
      EXPECT_EQ(engine[i], sim[i]) << "request " << i << ": engine admitted " << engine[i].admitted
                                   << " finished " << engine[i].finished << " cached " << engine[i].cached
                                   << ", simulation " << sim[i].admitted << " " << sim[i].finished << " "
                                   << sim[i].cached;
      hits += engine[i].cached > 0;
      waited += engine[i].admitted > arrivals[i].iteration;
    }
    EXPECT_GE(hits, 10) << "waited " << waited;  // not vacuous: most requests find their document
    if (!lazyllm) {
      EXPECT_GE(waited, 3);
    }
  }
}

// The request log's line, written and read by its one owner (admission/request_log.h): what the
// server writes comes back whole; a simulated line carries no engine fields; what a reader
// refuses names the line.
TEST(RequestLog, ALineReadsBackAsItWasWritten) {
  RequestLogLine l;
  l.id = 7, l.endpoint = "chat";
  l.arrival_s = 1.5, l.admitted_s = 1.75, l.first_token_s = 2.5, l.finished_s = 4;
  l.prompt_tokens = 300, l.output_tokens = 12;
  l.finish = "error", l.error = "prefill: planted failure";
  l.prune = "lazyllm", l.schedule = "0.5:0.5";
  l.prompt_tokens_computed_fraction = 0.625;
  l.revivals = 3, l.kv_bytes_after_prefill = 1 << 20, l.aux_cache_bytes = 4096;
  l.cached_tokens = 256;
  const std::string text = request_log_line(l);
  ASSERT_EQ(text.back(), '\n');
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["ttft_s"], 1.0);  // derived from the times
  EXPECT_EQ(j["queue_s"], 0.25);
  const RequestLogLine r = parse_request_log_line(text, "log:1");
  EXPECT_EQ(r.id, 7u);
  EXPECT_EQ(r.endpoint, "chat");
  EXPECT_EQ(r.first_token_s, 2.5);
  EXPECT_EQ(r.output_tokens, 12);
  EXPECT_TRUE(r.failed());
  EXPECT_EQ(r.error, l.error);
  EXPECT_EQ(r.schedule, "0.5:0.5");
  EXPECT_EQ(r.prompt_tokens_computed_fraction, 0.625);
  EXPECT_EQ(r.revivals, 3);
  EXPECT_EQ(r.aux_cache_bytes, 4096);
  EXPECT_EQ(r.cached_tokens, 256);
  RequestLogLine s;
  s.arrival_s = 0.5, s.prompt_tokens = 10, s.output_tokens = 2, s.simulated = true;
  const auto sj = nlohmann::json::parse(request_log_line(s));
  EXPECT_FALSE(sj.contains("revivals") || sj.contains("finish") || sj.contains("endpoint"));
  EXPECT_TRUE(parse_request_log_line(request_log_line(s), "x").simulated);
  EXPECT_FALSE(parse_request_log_line(request_log_line(s), "x").failed());
  const auto refused = [](const std::string& line) {
    try {
      (void)parse_request_log_line(line, "f.jsonl:4");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused("[1]"), "f.jsonl:4: not a JSON object");
  EXPECT_EQ(refused(R"({"arrival_s": 1, "prompt_tokens": 3})"), "f.jsonl:4: no number 'output_tokens'");
  EXPECT_EQ(refused(R"({"arrival_s": -1, "prompt_tokens": 3, "output_tokens": 1})")
                .rfind("f.jsonl:4: arrival_s", 0),
            0u);
  EXPECT_EQ(refused(R"({"arrival_s": 1, "prompt_tokens": 3.5, "output_tokens": 1})")
                .rfind("f.jsonl:4: token counts", 0),
            0u);
  EXPECT_EQ(refused(R"({"arrival_s": 1, "prompt_tokens": 3, "output_tokens": 1, "cached_tokens": 4})"),
            "f.jsonl:4: cached_tokens must be a whole number from 0 to prompt_tokens (3), got 4");
  EXPECT_EQ(refused(R"({"arrival_s": 1, "prompt_tokens": 3, "output_tokens": 1, "cached_tokens": -1})")
                .rfind("f.jsonl:4: cached_tokens", 0),
            0u);
}

}  // namespace
}  // namespace lp
