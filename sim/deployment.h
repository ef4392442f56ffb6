// Deployments of several engines (docs/simulator.md, "Deployments"): data-parallel replicas behind
// a router, and disaggregated prefill and decode pools with each request's K/V handed over between
// them. Every engine is the serving simulation's (sim/serving.h: one scheduler on costed
// iterations); the router decides where each request goes as it is sent, from the engines' state
// at that moment.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/serving.h"

namespace lp::sim {

// How a request picks its engine: in turn; the one with the fewest requests sent to it and not
// finished (ties: the lowest); the one whose prefix cache holds the longest start of its prompt
// (ties, and no prefix cache: the fewest outstanding), as the prefix-aware routers of SGLang and
// llm-d try first.
enum class Router { RoundRobin, LeastOutstanding, Prefix };
// "round-robin", "least-outstanding", "prefix"; lp::UsageError naming the known ones.
Router parse_router(const std::string& name);
const char* router_name(Router r);

// Identical engines: `replicas` of them, each `cfg` (its tensor-parallel group, scheduler and K/V
// budget) on `hw`.
struct Pool {
  hw::Profile hw;
  ServingConfig cfg;
  int replicas = 1;
};

struct Deployment {
  Pool serve;                  // aggregated: every request whole here; disaggregated: the prefill pool
  std::optional<Pool> decode;  // disaggregated: the decode pool
  Router router = Router::RoundRobin;
  // Disaggregated: the link a prefill instance hands a request's K/V over, bytes/s, and its latency
  // per transfer. Transfers do not contend for it.
  double link_bytes_per_s = 50e9, link_latency_s = 5e-6;
};

// Every request through the deployment, outcomes in arrival order with the engines that served
// them. Aggregated: each request is sent (at its arrival, or by serve.cfg.clients as they free) to
// the replica the router picks, and served there whole. Disaggregated: each is prefilled in the
// prefill pool (its first token there, its output then 1), its K/V and Aux Cache
// (RequestOutcome::kv_bytes_after_prefill, aux_bytes: under LazyLLM only the pairs it computed)
// handed over the link, and it is decoded by the decode instance the router picks (prefilled),
// which admits it as its own K/V budget allows; the prefill pool does not wait for the decode
// pool. Both pools step together in time order, so closed-loop clients (serve.cfg.clients) send
// their next request as the last one's final token leaves the decode pool. The run's rates are the whole
// deployment's (ServingRun::replicas 1: every request simulated). A replica with pipeline stages
// (cfg.pipeline) is that many virtual engines, as simulate_serving runs it, the router choosing among them.
// Throws lp::Error for a pool of no replicas, data-parallel attention inside a replica, a hand-over link of
// no bandwidth, or what simulate_serving refuses.
ServingRun simulate_deployment(const ModelConfig& c, const Precision& p, const ServingMethod& m,
                               const Deployment& d, std::span<const ServingRequest> reqs);

}  // namespace lp::sim
