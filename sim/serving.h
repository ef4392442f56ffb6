// Serving under load, discrete-event (docs/simulator.md, "Serving"): the scheduler `lazyprefill
// serve` runs (engine/scheduler.cpp), replayed on iterations the per-op cost model prices. Each
// iteration takes the FIFO queue's head while its K/V reservation fits the budget and its prompt
// the iteration's token budget (the first prefill of an iteration always fits the token budget),
// then runs one decoding row for every request that was running and the prefill of each admitted
// one together; its time is the ops of the summed work (sim/layer_cost.h: GEMMs over all rows,
// attention over each request's own keys) plus a fixed per-iteration overhead. A request's rows,
// keys and revivals per layer are those of its synthetic trace (traces/synthetic.h) under its
// method, so LazyLLM's pruned prefills and its revivals' extra decoding rows price each iteration.
// Chunked prefill (vLLM's): a prompt longer than the chunk runs in chunks of the token budget
// over several iterations, the decoding rows riding along; under LazyLLM only the last chunk can
// prune (scoring needs the last token), so every chunk before it is computed at every layer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "admission/admission.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "sim/cost.h"
#include "sim/layer_cost.h"
#include "sim/serving_workload.h"
#include "traces/synthetic.h"

namespace lp::sim {

struct ServingMethod {
  std::string name = "none";
  Method method;                 // the policy and the schedule it prunes by
  std::vector<PruneStep> steps;  // the schedule resolved for the model
  double drop_share = 0;         // random-drop: the share of each prompt dropped before the model
  trace::Revivals revivals;      // synthetic decoding's revivals (empty: none)
};
// `method` as the serving simulation runs it on model c: its schedule resolved
// (resolve_method: a lp::UsageError when it does not fit the policy) and random-drop's share,
// with the revivals given; named `name`, or the policy's name when that is "".
ServingMethod serving_method(const Method& method, const ModelConfig& c, trace::Revivals revivals = {},
                             std::string name = "");

struct ServingConfig {
  int64_t max_batch_tokens = 8192;  // rows per iteration (serve --max-batch-tokens)
  int64_t max_seqs = 0;             // > 0: requests running at once at most (AdmissionLimits::max_seqs)
  double kv_budget_bytes = 0;       // K/V reservations admitted at once (serve --kv-budget-mib)
  double kv_element_bytes = 2;      // bytes of one K or V element in the cache (2: the CPU's f16)
  int64_t kv_block = 64;            // cache capacity rounded up to this many tokens (the CPU layout)
  int64_t chunk_tokens = 0;         // > 0: chunked prefill, chunks of at most this many prompt tokens
  double iteration_overhead_s = 0;  // the scheduler's time per iteration beyond the batch
  double request_overhead_s = 0;    // host time per request an iteration schedules
  double admit_layer_s = 0;         // host time per layer of a request whose prefill starts
  // How K/V is held (hw::Scheduling::Kv): Reserve admits a request's worst case and holds it to
  // its end; OnDemand holds the blocks of its computed tokens (kv_block a block), a request admitted
  // while its first rows' blocks fit, and a step that finds too few free blocks preempts the most
  // recently admitted running request (blocks freed, back at the head of the queue, its prompt and
  // output so far computed again as one prefill when admitted again: vLLM's recompute).
  hw::Scheduling::Kv kv_mode = hw::Scheduling::Kv::Reserve;
  // Decoding rows ride with prefill work in one iteration; false: an iteration with prefill work
  // (an admission, or a chunked prefill's next chunk) runs it alone, the decoding requests waiting
  // (SGLang's default).
  bool mixed = true;
  // The clients (a closed loop): > 0, at most this many requests in flight; a request is sent at
  // its arrival time or, when every client is busy, as the next one becomes free, and its
  // latencies count from then (vllm bench serve --max-concurrency; with every arrival at 0, N
  // clients each sending its next request when its last one finishes). 0: open loop.
  int64_t clients = 0;
  // Every iteration's time multiplied by this: a machine that runs this much slower (> 1) or
  // faster than its profile says (validate --serving's sensitivity to the machine's drift).
  double time_scale = 1;
  int tp = 1;
  // Pipeline stages (stages > 1): pipeline.stages virtual engines, each its own scheduler over
  // its share of the requests (dealt round robin) and of the K/V, as vLLM runs a pipeline; an
  // iteration of one passes through every stage, and with all of them busy it waits on the
  // slowest: max(the stages' sum and hand-offs, stages x the slowest stage and its hand-off).
  // kv_budget_bytes is one GPU's, whose stage holds its layers' K/V of every virtual engine.
  Pipeline pipeline;
  int64_t kv_samples = 512;  // points of the K/V utilisation series kept (evenly over the run)
  // The prefix cache (`serve`'s, engine/prefix_cache.h, with the same policy: PrefixIndex and
  // admit_with_cache in admission/prefix_cache.h): blocks of the requests' sequences kept inside
  // the K/V budget, a prompt's cached prefix not computed but copied, at copy_bytes_per_s (0: the
  // profile's memory bandwidth, read and written). Requests say what they share
  // (ServingRequest::shared_group), or, replayed from a measured log, what they found.
  bool prefix_cache = false;
  int64_t prefix_block_tokens = 16;
  double copy_bytes_per_s = 0;
};

// What one request saw.
struct RequestOutcome {
  double arrival_s = 0, admitted_s = 0, first_token_s = 0, finished_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double prompt_tokens_computed_fraction = 1;  // of its prompt's (token, layer) pairs, the prefill computed
  int64_t cached_tokens = 0;                   // of its prompt, copied from the prefix cache
  int64_t preemptions = 0;                     // times preempted (ServingConfig::kv_mode OnDemand)
  // After its prefill, the K/V it holds (the pairs computed) and its Aux Cache, bytes: what a
  // disaggregated prefill hands to a decode instance.
  double kv_bytes_after_prefill = 0, aux_bytes = 0;
  double transfer_s = 0;  // disaggregated: the hand-over, from its first token to its decode instance
  int replica = 0, decode_replica = -1;  // the engines that served it (sim/deployment.h)
  double ttft_s() const { return first_token_s - arrival_s; }
  double queue_s() const { return admitted_s - arrival_s; }
  double e2e_s() const { return finished_s - arrival_s; }
  // Mean gap between its tokens after the first (0 for one token), as guidellm reports it.
  double itl_s() const;
};

struct KvPoint {
  double t_s = 0, reserved = 0, used = 0;  // bytes
};

struct ServingRun {
  std::vector<RequestOutcome> requests;  // in arrival order
  int64_t iterations = 0;
  double end_s = 0;             // the last request's finish
  double kv_capacity = 0;       // the budget, bytes
  std::vector<KvPoint> kv;      // utilisation over time (sampled)
  double kv_reserved_mean = 0;  // time-weighted over the run, bytes
  double kv_reserved_peak = 0;
  int64_t preemptions = 0;  // over the run (OnDemand K/V)
  // Groups that served alike (data-parallel attention's groups, ModelConfig::dp, times pipeline
  // stages' virtual engines): `requests` are the first one's, and the deployment's throughput is
  // this many times theirs (serving_metrics).
  int replicas = 1;
};

// A serving configuration with an engine's scheduler (hw::Engine::scheduling): its limits, K/V
// holding, mixed iterations and host times; the rest at their defaults.
ServingConfig serving_config(const hw::Scheduling& s);

// The K/V layout a configuration's reservations count in (lp::reservation_bytes, the policy the
// engine's scheduler runs: admission/admission.h).
inline KvLayout kv_layout(const ServingConfig& cfg) {
  return KvLayout{cfg.kv_element_bytes, cfg.kv_block, true};
}

// One GPU's K/V memory, `per_gpu_bytes`, as the budget of its tensor-parallel group in the terms
// reservations count (reservation_bytes prices every K/V head of every layer): times the ratio of
// a token's whole K/V to the share one of `tp` GPUs holds (tp where the K/V heads split tp ways,
// less where they are replicated, 1 for latent attention's cache, whole on every GPU).
double group_kv_budget(const ModelConfig& c, int tp, double per_gpu_bytes);
// The K/V budget of a tensor-parallel group of `tp` GPUs of `hw` that give `fraction` of their
// memory to weights and K/V (vLLM's gpu_memory_utilization): each GPU's share of the weights
// taken out (1 / (tp x pp) of them with `pp` pipeline stages), the rest as the group's budget
// (group_kv_budget; with stages, each virtual engine's: a stage's GPU holds its layers' K/V of
// all of them); 0 when the weights leave nothing.
double memory_kv_budget(const ModelConfig& c, const hw::Profile& hw, const Precision& p, int tp,
                        double fraction, int pp = 1);

// Runs the requests (sorted by arrival) through the scheduler; under data-parallel attention
// (c.dp > 1) every dp-th through the first group's (ServingRun::replicas). Throws lp::Error for a request
// whose reservation exceeds the K/V budget (it could never run), a budget of zero, or a bad
// configuration.
ServingRun simulate_serving(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                            const ServingMethod& m, const ServingConfig& cfg,
                            std::span<const ServingRequest> reqs);

}  // namespace lp::sim
