// Deployments of several engines (sim/deployment.h): replicas behind a router against the single
// engine they are made of, the routers' rules checked from the outcomes, and disaggregated prefill
// and decode against a lone request's parts computed apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/deployment.h"
#include "sim/replay.h"
#include "sim/serving_metrics.h"
#include "sim/serving_workload.h"
#include "tests/sim/serving_world.h"

namespace lp {
namespace {

using sim::ServingRequest;

struct World : testing::ServingWorld {
  World() : ServingWorld(20) {}
  sim::Deployment replicas(int n, sim::Router r) const {
    sim::Deployment d;
    d.serve = {hw, cfg, n};
    d.router = r;
    return d;
  }
};

std::vector<ServingRequest> workload(int64_t n, double rate, uint64_t seed) {
  return sim::make_workload(n, {rate, 1}, sim::LengthDist::parse("512:4096", "p", "prompt_tokens"),
                            sim::LengthDist::parse("16:256", "o", "output_tokens"), seed);
}

// One replica is the engine itself, time for time.
TEST(Deployment, OneReplicaIsTheEngine) {
  World s;
  const auto reqs = workload(400, 6, 1);
  const sim::ServingRun one = sim::simulate_serving(s.c, s.hw, s.p, {}, s.cfg, reqs);
  for (const sim::Router r : {sim::Router::RoundRobin, sim::Router::LeastOutstanding}) {
    const sim::ServingRun dep = sim::simulate_deployment(s.c, s.p, {}, s.replicas(1, r), reqs);
    ASSERT_EQ(dep.requests.size(), one.requests.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_DOUBLE_EQ(dep.requests[i].first_token_s, one.requests[i].first_token_s) << i;
      EXPECT_DOUBLE_EQ(dep.requests[i].finished_s, one.requests[i].finished_s) << i;
    }
    EXPECT_EQ(dep.iterations, one.iterations);
  }
}

// Round robin: replica k serves requests k, k + R, ..., exactly as an engine given only those.
TEST(Deployment, RoundRobinIsEachReplicaOnItsShare) {
  World s;
  const auto reqs = workload(300, 12, 2);
  const sim::ServingRun dep =
      sim::simulate_deployment(s.c, s.p, {}, s.replicas(3, sim::Router::RoundRobin), reqs);
  for (int k = 0; k < 3; ++k) {
    std::vector<ServingRequest> share;
    for (size_t i = size_t(k); i < reqs.size(); i += 3) share.push_back(reqs[i]);
    const sim::ServingRun one = sim::simulate_serving(s.c, s.hw, s.p, {}, s.cfg, share);
    for (size_t j = 0; j < share.size(); ++j) {
      const sim::RequestOutcome& o = dep.requests[size_t(k) + 3 * j];
      EXPECT_EQ(o.replica, k);
      EXPECT_DOUBLE_EQ(o.finished_s, one.requests[j].finished_s);
    }
  }
}

// A replica of pipeline stages is that many virtual engines: round robin over one replica of two
// stages serves the even requests exactly as the engine simulated with that pipeline does (which
// deals the same way), all of them on replica 0.
TEST(Deployment, PipelineStagesAreVirtualEngines) {
  World s;
  s.cfg.pipeline.stages = 2;
  const auto reqs = workload(200, 10, 6);
  const sim::ServingRun dep =
      sim::simulate_deployment(s.c, s.p, {}, s.replicas(1, sim::Router::RoundRobin), reqs);
  const sim::ServingRun one = sim::simulate_serving(s.c, s.hw, s.p, {}, s.cfg, reqs);
  ASSERT_EQ(one.requests.size(), reqs.size() / 2);
  for (size_t j = 0; j < one.requests.size(); ++j) {
    EXPECT_DOUBLE_EQ(dep.requests[2 * j].first_token_s, one.requests[j].first_token_s) << j;
    EXPECT_DOUBLE_EQ(dep.requests[2 * j].finished_s, one.requests[j].finished_s) << j;
  }
  for (const sim::RequestOutcome& o : dep.requests) EXPECT_EQ(o.replica, 0);
}

// Least outstanding: when each request was sent, no other replica had fewer of the requests sent
// before it still unfinished.
TEST(Deployment, LeastOutstandingPicksTheLeastLoaded) {
  World s;
  const auto reqs = workload(600, 14, 3);
  const sim::ServingRun dep =
      sim::simulate_deployment(s.c, s.p, {}, s.replicas(4, sim::Router::LeastOutstanding), reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const double t = dep.requests[i].arrival_s;
    std::map<int, int64_t> load;
    for (int k = 0; k < 4; ++k) load[k] = 0;
    for (size_t j = 0; j < i; ++j)
      if (dep.requests[j].finished_s > t) ++load[dep.requests[j].replica];
    const int64_t least = std::min_element(load.begin(), load.end(), [](auto& a, auto& b) {
                            return a.second < b.second;
                          })->second;
    ASSERT_EQ(load[dep.requests[i].replica], least) << i;
  }
}

// Prefix-aware: a group's requests follow its cached document, so more of the prompts are found
// cached than when they are dealt in turn.
TEST(Deployment, PrefixRouterFollowsTheCache) {
  World s;
  s.cfg.prefix_cache = true;
  s.cfg.kv_budget_bytes = 8.0 * (1 << 30);  // about 15 documents a replica, of 41
  auto reqs = sim::make_workload(800, {8, 1}, sim::LengthDist::parse("64:256", "p", "prompt_tokens"),
                                 sim::LengthDist::parse("32", "o", "output_tokens"), 4);
  sim::share_prefixes(reqs, 4096, 41);  // coprime to 4: turns spread each group over every replica
  const auto cached = [&](sim::Router r) {
    const sim::ServingRun run = sim::simulate_deployment(s.c, s.p, {}, s.replicas(4, r), reqs);
    double hit = 0, all = 0;
    for (const sim::RequestOutcome& o : run.requests) {
      hit += double(o.cached_tokens), all += double(o.prompt_tokens);
      EXPECT_LE(o.cached_tokens, o.prompt_tokens);
    }
    return hit / all;
  };
  const double prefix = cached(sim::Router::Prefix), turns = cached(sim::Router::RoundRobin);
  EXPECT_GT(prefix, turns + 0.1);
  EXPECT_GT(prefix, 0.85);  // all but each group's first
}

// Disaggregated, one request alone: its first token is the prefill pool's (a prefill-only run on
// that hardware), the hand-over its K/V over the link (T x L x 2 x Hkv x Dh x 2 bytes, from the
// shape), and its decoding the decode hardware's lone decoding steps.
TEST(Deployment, DisaggregatedLoneRequestIsItsParts) {
  World s;
  const hw::Profile h200 = hw::load_profile("h200");
  sim::Deployment d;
  d.serve = {s.hw, s.cfg, 1};
  d.decode = sim::Pool{h200, s.cfg, 1};
  d.link_bytes_per_s = 25e9, d.link_latency_s = 20e-6;
  const int64_t T = 4096, O = 33;
  const ServingRequest r{0.5, T, O};
  const sim::ServingRun run = sim::simulate_deployment(s.c, s.p, {}, d, {&r, 1});
  const sim::RequestOutcome& o = run.requests[0];
  const ServingRequest prefill_only{0.5, T, 1};
  EXPECT_DOUBLE_EQ(o.ttft_s(),
                   sim::simulate_serving(s.c, s.hw, s.p, {}, s.cfg, {&prefill_only, 1}).requests[0].ttft_s());
  const double kv = double(T) * s.c.n_layer * 2 * s.c.n_head_kv * s.c.head_dim * 2;
  EXPECT_DOUBLE_EQ(o.kv_bytes_after_prefill, kv);
  EXPECT_NEAR(o.transfer_s, kv / 25e9 + 20e-6, 1e-12);
  const sim::Prediction dec = sim::replay_synthetic(s.c, "none", {}, T, O - 1, {}, h200, s.p);
  EXPECT_NEAR(o.finished_s - o.first_token_s - o.transfer_s, dec.decode_s, 1e-9 * dec.decode_s);
  EXPECT_EQ(o.decode_replica, 0);
}

// LazyLLM's pruned prefill hands over only the pairs it computed, and its Aux Cache.
TEST(Deployment, LazyLlmHandsOverLess) {
  World s;
  sim::Deployment d;
  d.serve = {s.hw, s.cfg, 1};
  d.decode = sim::Pool{s.hw, s.cfg, 1};
  const ServingRequest r{0, 8192, 16};
  const sim::ServingMethod lazy = sim::serving_method({PolicyKind::LazyLLM, default_schedule()}, s.c);
  const sim::RequestOutcome none = sim::simulate_deployment(s.c, s.p, {}, d, {&r, 1}).requests[0];
  const sim::RequestOutcome pruned = sim::simulate_deployment(s.c, s.p, lazy, d, {&r, 1}).requests[0];
  EXPECT_NEAR(pruned.kv_bytes_after_prefill / none.kv_bytes_after_prefill,
              pruned.prompt_tokens_computed_fraction, 0.01);
  EXPECT_GT(pruned.aux_bytes, 0);
  EXPECT_LT(pruned.transfer_s, none.transfer_s);
  EXPECT_EQ(none.aux_bytes, 0);
}

TEST(Deployment, RefusesWhatItCannotRun) {
  World s;
  const auto reqs = workload(10, 1, 5);
  sim::Deployment d = s.replicas(0, sim::Router::RoundRobin);
  EXPECT_THROW(sim::simulate_deployment(s.c, s.p, {}, d, reqs), Error);
  d = s.replicas(2, sim::Router::RoundRobin);
  d.decode = sim::Pool{s.hw, s.cfg, 0};
  EXPECT_THROW(sim::simulate_deployment(s.c, s.p, {}, d, reqs), Error);
  d.decode->replicas = 1;
  d.link_bytes_per_s = 0;
  EXPECT_THROW(sim::simulate_deployment(s.c, s.p, {}, d, reqs), UsageError);
  EXPECT_THROW(sim::parse_router("random"), UsageError);
}

// A closed loop over disaggregated pools: one client sends each request as the last one's final
// token leaves the decode pool; N clients never have more than N requests between send and
// finish, and hold N in flight on average (Little's law: throughput x mean latency over the run,
// every client busy from start to end but for the drain).
TEST(Deployment, DisaggregatedClosedLoop) {
  World s;
  const auto reqs = workload(120, 1e6, 7);
  sim::Deployment d = s.replicas(2, sim::Router::LeastOutstanding);
  d.decode = sim::Pool{s.hw, s.cfg, 2};
  d.serve.cfg.clients = 1;
  const sim::ServingRun one = sim::simulate_deployment(s.c, s.p, {}, d, reqs);
  for (size_t i = 1; i < reqs.size(); ++i)
    EXPECT_DOUBLE_EQ(one.requests[i].arrival_s, one.requests[i - 1].finished_s) << i;
  d.serve.cfg.clients = 6;
  const sim::ServingRun six = sim::simulate_deployment(s.c, s.p, {}, d, reqs);
  std::vector<std::pair<double, int>> edges;
  double busy = 0, end = 0;
  for (const sim::RequestOutcome& o : six.requests) {
    EXPECT_GT(o.finished_s, o.first_token_s);
    edges.push_back({o.arrival_s, 1});
    edges.push_back({o.finished_s, -1});
    busy += o.finished_s - o.arrival_s;
    end = std::max(end, o.finished_s);
  }
  std::sort(edges.begin(), edges.end());  // a finish before a send at the same time
  int in_flight = 0, most = 0;
  for (const auto& [t, e] : edges) most = std::max(most, in_flight += e);
  EXPECT_EQ(most, 6);
  EXPECT_GT(busy / end, 0.85 * 6);  // only the drain runs below six
}

}  // namespace
}  // namespace lp
