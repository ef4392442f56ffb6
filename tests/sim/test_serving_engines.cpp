// Production engines' schedulers in the serving simulation (sim/serving.h, hw::Scheduling): the
// presets' documented defaults, host times, K/V held on demand with preemption, unmixed
// iterations, closed-loop clients and the workloads benchmarks draw. Each property from the
// arithmetic of the scheduler or from queueing theory, not from an earlier run's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "sim/serving.h"
#include "sim/serving_metrics.h"
#include "sim/serving_workload.h"
#include "tests/sim/serving_world.h"

namespace lp {
namespace {

using sim::ServingRequest;
using Kv = hw::Scheduling::Kv;

using World = testing::ServingWorld;

hw::Scheduling on(const std::string& engine, const std::string& part) {
  hw::Profile p = hw::load_profile(part);
  p.engine = hw::engine_preset(engine);
  return hw::scheduling_for(p);
}

// The values docs/simulator.md ("Engines' schedulers") cites from each engine's source.
TEST(EngineSchedulers, PresetsCarryTheEnginesDefaults) {
  const hw::Scheduling v = on("vllm", "h100-sxm");
  EXPECT_EQ(v.max_seqs, 1024);
  EXPECT_EQ(v.max_batch_tokens, 8192);
  EXPECT_EQ(v.chunk_tokens, 8192);
  EXPECT_EQ(v.kv, Kv::OnDemand);
  EXPECT_EQ(v.kv_block_tokens, 16);
  EXPECT_TRUE(v.mixed);
  EXPECT_DOUBLE_EQ(v.admit_layer_s, 0.8e-3);
  for (const char* small : {"a100-80gb", "l4"}) {  // A100s and parts under 70 GiB
    const hw::Scheduling s = on("vllm", small);
    EXPECT_EQ(s.max_seqs, 256) << small;
    EXPECT_EQ(s.max_batch_tokens, 2048) << small;
  }
  EXPECT_EQ(on("sglang", "h100-sxm").chunk_tokens, 8192);
  EXPECT_EQ(on("sglang", "h200").chunk_tokens, 8192);
  EXPECT_EQ(on("sglang", "b200").chunk_tokens, 16384);
  EXPECT_EQ(on("sglang", "l4").chunk_tokens, 2048);
  EXPECT_FALSE(on("sglang", "h100-sxm").mixed);
  const hw::Scheduling t = on("trtllm", "h100-sxm");
  EXPECT_EQ(t.max_seqs, 2048);
  EXPECT_EQ(t.max_batch_tokens, 8192);
  EXPECT_EQ(t.chunk_tokens, 0);
  EXPECT_EQ(t.kv, Kv::Reserve);
  EXPECT_EQ(t.kv_block_tokens, 32);
  const hw::Scheduling l = on("lazyprefill", "cpu-local");  // serve's own defaults
  EXPECT_EQ(l.max_batch_tokens, 2048);
  EXPECT_EQ(l.max_seqs, 0);
  EXPECT_EQ(l.kv_block_tokens, 64);
  EXPECT_EQ(l.kv, Kv::Reserve);
  EXPECT_THROW(hw::engine_preset("tgi"), UsageError);
}

// A profile's engine object: a preset's values for that part, the keys it gives over them; a bad
// key is one line naming it.
TEST(EngineSchedulers, ProfileFilesOverrideThePreset) {
  nlohmann::ordered_json j = hw::load_profile("a100-80gb").json;
  j["name"] = "mine";
  j["engine"] = {{"preset", "vllm"}, {"max_seqs", 64}, {"iteration_us", 500}, {"mixed", false}};
  const std::string path = ::testing::TempDir() + "lp_engine_profile.json";
  std::ofstream(path) << j.dump();
  const hw::Profile p = hw::load_profile(path);
  const hw::Scheduling s = hw::scheduling_for(p);
  EXPECT_EQ(s.max_seqs, 64);
  EXPECT_EQ(s.max_batch_tokens, 2048);  // the preset's on an A100, kept
  EXPECT_DOUBLE_EQ(s.iteration_s, 500e-6);
  EXPECT_FALSE(s.mixed);
  EXPECT_EQ(s.kv, Kv::OnDemand);
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::ordered_json>>{
           {"kv", "lazy"}, {"max_seqs", -1}, {"iteration_us", "fast"}, {"mixed", 1}, {"preset", "tgi"}}) {
    j["engine"] = {{key, value}};
    std::ofstream(path) << j.dump();
    try {
      hw::load_profile(path);
      ADD_FAILURE() << key;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'engine"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

// Host times add to every iteration: one request of O output tokens runs O iterations, each
// scheduling it once, and its prefill starts once.
TEST(EngineSchedulers, HostTimesAddToEveryIteration) {
  World s;
  const ServingRequest r{0, 1024, 17};
  const double bare = s.run({&r, 1}).requests[0].e2e_s();
  s.cfg.iteration_overhead_s = 1e-3;
  s.cfg.request_overhead_s = 0.5e-3;
  s.cfg.admit_layer_s = 0.1e-3;
  const double with = s.run({&r, 1}).requests[0].e2e_s();
  EXPECT_NEAR(with - bare, 17 * 1.5e-3 + s.c.n_layer * 0.1e-3, 1e-12);
}

// Held on demand with a budget nothing exceeds, K/V never decides anything: the run is the
// reserved run's, time for time.
TEST(EngineSchedulers, OnDemandWithRoomIsTheReservedRun) {
  World s;
  const auto reqs = sim::make_workload(300, {4, 1}, sim::LengthDist::parse("512:4096", "p", "prompt_tokens"),
                                       sim::LengthDist::parse("16:256", "o", "output_tokens"), 3);
  const sim::ServingRun reserved = s.run(reqs);
  s.cfg.kv_mode = Kv::OnDemand;
  const sim::ServingRun on_demand = s.run(reqs);
  ASSERT_EQ(reserved.requests.size(), on_demand.requests.size());
  EXPECT_EQ(on_demand.preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_DOUBLE_EQ(reserved.requests[i].first_token_s, on_demand.requests[i].first_token_s) << i;
    EXPECT_DOUBLE_EQ(reserved.requests[i].finished_s, on_demand.requests[i].finished_s) << i;
  }
  EXPECT_LT(on_demand.kv_reserved_peak, reserved.kv_reserved_peak);  // blocks held, not worst cases
}

// Two requests whose prompts fit but whose outputs do not: both admitted, and when the blocks run
// out the newer one is preempted (vLLM's running.pop()), the older finishing first; the newer one
// is computed again and still gives all its tokens. The budget is never exceeded.
TEST(EngineSchedulers, OnDemandPreemptsTheNewestAndRecomputesIt) {
  World s;
  s.cfg.kv_mode = Kv::OnDemand;
  s.cfg.kv_block = 16;
  const double per_token = double(s.c.n_layer) * double(s.c.kv_token_elems()) * s.cfg.kv_element_bytes;
  s.cfg.kv_budget_bytes = 400 * per_token;  // each needs 64 + 255 = 319 tokens' K/V at the end
  const std::vector<ServingRequest> reqs{{0, 64, 256}, {0, 64, 256}};
  const sim::ServingRun run = s.run(reqs);
  EXPECT_GE(run.requests[1].preemptions, 1);
  EXPECT_EQ(run.requests[0].preemptions, 0);
  EXPECT_LT(run.requests[0].finished_s, run.requests[1].finished_s);
  EXPECT_GT(run.requests[1].finished_s, run.requests[1].first_token_s);
  EXPECT_LE(run.kv_reserved_peak, s.cfg.kv_budget_bytes);
  // Reserved, the second waits for the first instead.
  s.cfg.kv_mode = Kv::Reserve;
  const sim::ServingRun reserved = s.run(reqs);
  EXPECT_DOUBLE_EQ(reserved.requests[1].admitted_s, reserved.requests[0].finished_s);
  EXPECT_EQ(reserved.preemptions, 0);
}

// Under load with too little K/V, many preemptions, and still every request ends with its tokens
// inside the budget.
TEST(EngineSchedulers, PreemptionUnderLoadKeepsEveryRequest) {
  World s;
  s.cfg.kv_mode = Kv::OnDemand;
  s.cfg.kv_block = 16;
  s.cfg.chunk_tokens = s.cfg.max_batch_tokens = 2048;
  s.cfg.kv_budget_bytes = 1.0 * (1 << 30);
  const auto reqs =
      sim::make_workload(200, {1e6, 1}, sim::LengthDist::parse("1000:3000", "p", "prompt_tokens"),
                         sim::LengthDist::parse("500:1500", "o", "output_tokens"), 5);
  const sim::ServingRun run = s.run(reqs);
  EXPECT_GT(run.preemptions, 10);
  EXPECT_LE(run.kv_reserved_peak, s.cfg.kv_budget_bytes);
  int64_t preempted = 0;
  for (const sim::RequestOutcome& o : run.requests) {
    EXPECT_GT(o.finished_s, o.first_token_s);
    EXPECT_GE(o.first_token_s, o.admitted_s);
    preempted += o.preemptions;
  }
  EXPECT_EQ(preempted, run.preemptions);
}

// K/V on demand in 16-token blocks with a prefix cache of 16-token blocks, a budget of `tokens`
// tokens' K/V.
World on_demand_with_cache(int64_t tokens) {
  World s;
  s.cfg.kv_mode = Kv::OnDemand;
  s.cfg.kv_block = s.cfg.prefix_block_tokens = 16;
  s.cfg.prefix_cache = true;
  s.cfg.kv_budget_bytes =
      double(tokens) * double(s.c.n_layer) * double(s.c.kv_token_elems()) * s.cfg.kv_element_bytes;
  return s;
}

// K/V on demand with a prefix cache (vLLM's automatic prefix caching): blocks are shared in place.
// Seven requests reading one request's 1,024-token prefix fit a budget that holds the prefix once
// and their own tokens (copies would need 7 x 1,104 tokens): every one is admitted on arrival with
// the prefix's 64 blocks as its hit, none preempted, the budget never exceeded, and each prefills
// only its own 16 tokens (its TTFT well under the cold one's).
TEST(EngineSchedulers, OnDemandPrefixCacheReadsSharedBlocksInPlace) {
  World s = on_demand_with_cache(1024 + 7 * 96 + 160);
  std::vector<ServingRequest> reqs(8, ServingRequest{0, 1040, 64});
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].shared_group = 0, reqs[i].shared_tokens = 1024;
    if (i > 0) reqs[i].arrival_s = 2.0;  // after the first finished
  }
  const sim::ServingRun run = s.run(reqs);
  EXPECT_EQ(run.preemptions, 0);
  EXPECT_LE(run.kv_reserved_peak, s.cfg.kv_budget_bytes);
  EXPECT_EQ(run.requests[0].cached_tokens, 0);
  ASSERT_LT(run.requests[0].finished_s, 2.0);
  for (size_t i = 1; i < reqs.size(); ++i) {
    EXPECT_EQ(run.requests[i].cached_tokens, 1024) << i;
    EXPECT_DOUBLE_EQ(run.requests[i].admitted_s, 2.0) << i;
    EXPECT_LT(run.requests[i].ttft_s(), 0.5 * run.requests[0].ttft_s()) << i;
  }
  // Without the cache the same budget cannot hold them together: they wait for one another.
  s.cfg.prefix_cache = false;
  const sim::ServingRun cold = s.run(reqs);
  EXPECT_GT(cold.requests.back().admitted_s, 2.0);
}

// Cached blocks no request pins give way before a running request is preempted: while a long
// request decodes, four short distinct ones come and go, their blocks filling the cache; the long
// one's growth to 2,700 tokens of a 3,200-token budget evicts them rather than preempting itself.
TEST(EngineSchedulers, OnDemandCacheEvictsBeforePreempting) {
  World s = on_demand_with_cache(3200);
  std::vector<ServingRequest> reqs{{0, 1500, 1200}};
  for (int i = 1; i <= 4; ++i) reqs.push_back({0.5 * i, 700, 16});
  const sim::ServingRun run = s.run(reqs);
  EXPECT_EQ(run.preemptions, 0);
  for (const sim::RequestOutcome& o : run.requests) EXPECT_GT(o.finished_s, o.first_token_s);
  EXPECT_GT(run.requests[0].finished_s, run.requests[4].finished_s);  // it outlived them all
  EXPECT_LE(run.kv_reserved_peak, s.cfg.kv_budget_bytes);
}

// SGLang's unmixed iterations: a prefill arriving while a request decodes takes an iteration of
// its own, and the decoding request gives no token in it.
TEST(EngineSchedulers, UnmixedIterationsPauseDecoding) {
  World s;
  const ServingRequest first{0, 512, 50};
  const double mid = s.run({&first, 1}).requests[0].first_token_s * 2;  // during its decoding
  const std::vector<ServingRequest> reqs{first, {mid, 512, 1}};
  const sim::ServingRun mixed = s.run(reqs);
  s.cfg.mixed = false;
  const sim::ServingRun apart = s.run(reqs);
  EXPECT_EQ(apart.iterations, mixed.iterations + 1);
  EXPECT_GT(apart.requests[0].e2e_s(), mixed.requests[0].e2e_s());
  EXPECT_LT(apart.requests[1].ttft_s(), mixed.requests[1].ttft_s());  // its prefill alone is shorter
}

// Closed loop (vllm bench serve --max-concurrency): never more than N in flight, each sent when a
// client is free, and in steady state Little's law, N = throughput x mean latency.
TEST(EngineSchedulers, ClosedLoopKeepsNInFlightAndObeysLittlesLaw) {
  World s;
  for (const int64_t n : {1, 8, 32}) {
    s.cfg.clients = n;
    const auto unit =
        sim::make_workload(3000, {1, 1}, sim::LengthDist::parse("normal:1500:300", "p", "prompt_tokens"),
                           sim::LengthDist::parse("64:256", "o", "output_tokens"), 11);
    const auto reqs = sim::at_rate(unit, HUGE_VAL);
    const sim::ServingRun run = s.run(reqs);
    std::vector<std::pair<double, int>> events;
    for (const sim::RequestOutcome& o : run.requests)
      events.push_back({o.arrival_s, 1}), events.push_back({o.finished_s, -1});
    std::sort(events.begin(), events.end());  // a finish before a send at the same time
    int in_flight = 0, most = 0;
    for (const auto& [t, d] : events) most = std::max(most, in_flight += d);
    EXPECT_EQ(most, n);
    const sim::ServingMetrics m = sim::serving_metrics(run, {});
    EXPECT_NEAR(m.requests_per_s * m.e2e.mean, double(n), 0.02 * double(n)) << n;
  }
  // Released at a rate, a request is sent no earlier than its release.
  s.cfg.clients = 4;
  const auto reqs = sim::make_workload(500, {20, 1}, sim::LengthDist::parse("2048", "p", "prompt_tokens"),
                                       sim::LengthDist::parse("128", "o", "output_tokens"), 2);
  const sim::ServingRun run = s.run(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_GE(run.requests[i].arrival_s, reqs[i].arrival_s);
}

TEST(EngineSchedulers, WorkloadsAsBenchmarksDrawThem) {
  const auto d = sim::LengthDist::parse("normal:1000:100", "--prompt-tokens", "prompt_tokens");
  const auto reqs = sim::make_workload(20000, {1, 1}, d, d, 4);
  double sum = 0, sq = 0;
  for (const ServingRequest& r : reqs)
    sum += double(r.prompt_tokens), sq += double(r.prompt_tokens) * double(r.prompt_tokens);
  const double mean = sum / double(reqs.size()), sd = std::sqrt(sq / double(reqs.size()) - mean * mean);
  EXPECT_NEAR(mean, 1000, 3);  // 4 standard errors of the mean (100 / sqrt(20000) = 0.7)
  EXPECT_NEAR(sd, 100, 2);
  const auto wide = sim::LengthDist::parse("normal:5:10", "--prompt-tokens", "prompt_tokens");
  for (const ServingRequest& r : sim::make_workload(2000, {1, 1}, wide, wide, 1)) {
    EXPECT_GE(r.prompt_tokens, 1);
    EXPECT_LE(r.prompt_tokens, wide.max());
  }
  for (const ServingRequest& r : sim::at_rate(reqs, HUGE_VAL)) EXPECT_EQ(r.arrival_s, 0);
  for (const char* bad : {"normal:abc", "normal:0:1", "normal:10:-1", "normal:10", "normal:1e30:1"})
    EXPECT_THROW(sim::LengthDist::parse(bad, "--prompt-tokens", "prompt_tokens"), Error) << bad;
}

TEST(EngineSchedulers, RefusesWhatItCannotModel) {
  World s;
  const ServingRequest r{0, 100, 10};
  s.cfg.kv_mode = Kv::OnDemand;
  s.cfg.clients = -1;
  EXPECT_THROW(s.run({&r, 1}), Error);
  s.cfg.clients = 0;
  s.cfg.request_overhead_s = -1;
  EXPECT_THROW(s.run({&r, 1}), Error);
}

}  // namespace
}  // namespace lp
