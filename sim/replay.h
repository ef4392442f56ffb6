// Trace replay: the predicted time and memory of the work a trace records (traces/README.md),
// on a hardware profile, for a model configuration that may differ from the one that recorded
// it (docs/simulator.md: layers map by relative depth, token counts by share of the prompt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/policy.h"
#include "sim/cost.h"
#include "sim/layer_cost.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace lp::sim {

// Memory at its peak (end of the generation: KV only grows), bytes.
struct Memory {
  double weights = 0, kv = 0, aux = 0, activations = 0;
  double total() const { return weights + kv + aux + activations; }
  // {weights, kv, aux_cache, activations, total}, bytes: what simulate and report print.
  nlohmann::ordered_json to_json() const;
};

struct Prediction {
  std::string hw;
  int tp = 1;                    // GPUs the model is spread over; times and memory are one GPU's
  int pp = 1;                    // pipeline stages; memory is the fullest stage's GPU's
  int pp_microbatches = 1;       // the prefill's chunks through the stages (Pipeline::microbatches)
  OpCost prefill_pp, decode_pp;  // the hand-offs between stages (pp > 1), in the step times
  // With micro-batches the prefill's ops and hand-offs sum to the stages' busy time, more than the
  // TTFT they overlap into; prefill_busy_s is that sum (= ttft_s without micro-batches).
  double prefill_busy_s = 0;
  double ttft_s = 0;                           // the prefill step
  double prompt_tokens_computed_fraction = 1;  // of the prompt's (token, layer) pairs, the prefill computed
  int64_t decode_steps = 0;                    // decoding steps costed
  double decode_s = 0;                         // their time, summed
  std::vector<double> decode_step_s;  // one per decoding step, the first keep_steps (Replayer) of them
  double total_s = 0;
  std::vector<OpCosts> prefill_layers;  // [L] per-op costs of the prefill
  OpCosts prefill_ops{};                // the prefill, summed over layers (and embed / LM head)
  OpCosts decode_ops{};                 // every decoding step, summed
  OpCost prefill_comm, decode_comm;     // tensor-parallel all-reduces and all-gathers (tp > 1)
  Memory memory;
  double prefill_flops() const;
  double decode_step_mean_s() const;  // 0 without decoding steps
  // The op with the most prefill time.
  Op prefill_bound_op() const;
};

// A trace's counts mapped onto a model with `n_layer` layers and a prompt of `prompt_tokens`
// (0: the trace's own): target layer l reads source layer floor((l + 0.5) * L_src / n_layer);
// per-layer token counts (queries, keys, revivals, Aux Cache traffic) scale by prompt_tokens /
// the trace's prompt length, pairs by its square, and decoding steps keep their one new token.
// Pruning layers map the same way. A trace that already matches is returned unchanged.
trace::Trace map_trace(const trace::Trace& t, int n_layer, int64_t prompt_tokens);
// The same one step at a time (a trace streamed through a Replayer): the header, and each step
// of a trace whose header is `h`.
trace::Header map_header(const trace::Header& h, int n_layer, int64_t prompt_tokens);
trace::Step map_step(const trace::Header& h, const trace::Step& s, int n_layer, int64_t prompt_tokens);

// The shape one GPU computes under tensor parallelism of degree `tp` (docs/simulator.md, "Tensor
// parallelism"): H/tp query heads, Hkv/tp KV heads (one, replicated, when Hkv < tp), F/tp of the
// FFN width and ceil(V/tp) of the vocabulary, per layer. Throws lp::UsageError naming what does
// not divide; tp 1 returns `c`.
ModelConfig tp_shard(const ModelConfig& c, int tp);
// `c` deployed with expert parallelism over `ep` of its tensor-parallel GPUs (docs/simulator.md
// "Expert parallelism"): tp_shard then gives each GPU n_expert / ep whole experts (split tp / ep
// ways), and its routed pairs are the busiest GPU's (`imbalance` x the mean; 0: the expected
// busiest under uniform routing). With `dp` > 1, data-parallel attention: dp groups of `tp` GPUs
// each attend their own requests and the experts spread over ep of all dp x tp GPUs (ep 1: all of
// them), rows dispatched to them and combined back all-to-all (docs/simulator.md "Data-parallel
// attention"). Throws lp::UsageError for a dense model, an ep that does not divide the experts
// (or, in tp_shard, the GPUs), or an imbalance below 1.
ModelConfig expert_parallel(const ModelConfig& c, int ep, double imbalance = 0, int dp = 1, int tp = 1);
// Checks that `hw` can host `tp` GPUs (its max_tp) and that `c` splits over them.
void check_tp(const ModelConfig& c, const hw::Profile& hw, int tp);

// allreduce_cost and allgather_cost, the ring collectives: sim/layer_cost.h.

// Costs a trace step by step on `hw` for model `c` (whose n_layer must equal the header's: map
// first), holding O(layers) state, so a generation of any length streams through it; per-step
// decode times are kept for the first `keep_steps` steps only. `batch` sequences run the same
// work together: every op's rows, pairs and keys scale by it (GEMMs read their weights once for
// all), as do K/V, Aux Cache and activation memory. With `tp` > 1 the model is spread over tp
// GPUs (tp_shard) and the collectives are added to each step; times and memory are one GPU's.
// Throws lp::Error when the layer counts differ, batch < 1 or tp cannot be hosted.
class Replayer {
 public:
  Replayer(const trace::Header& h, const ModelConfig& c, const hw::Profile& hw, const Precision& p,
           int64_t batch = 1, int tp = 1, size_t keep_steps = SIZE_MAX);
  // Spread the layers over pipeline stages (before the first add): each step hands its rows from
  // stage to stage, and memory is the fullest stage's. Throws as pipeline_starts.
  void set_pipeline(const Pipeline& p);
  void add(const trace::Step& s);
  // The prediction, with the memory held at the end (K/V from the last step's keys).
  Prediction finish() &&;

 private:
  // A layer's recorded routing into `w` (LayerWork::experts, ::routed): the busiest GPU's pairs and
  // its distinct experts, for `rows` rows; nothing where the routes do not match the rows (a trace
  // mapped onto another prompt length).
  void routed_work(const trace::Routes& r, int64_t rows, LayerWork& w) const;
  // Layer l's work in step s, every sequence of the batch.
  LayerWork layer_work(const trace::Step& s, int l, bool prefill) const;
  // The prefill in Pipeline::microbatches chunks through the stages: its span (the TTFT), the ops,
  // collectives and hand-offs added to the prediction's sums.
  double chunked_prefill(const trace::Step& s);
  const hw::Profile& hw_;
  const ModelConfig& c_;
  int64_t B_;
  int tp_;
  size_t keep_steps_;
  CostContext cc_;
  PolicyTraits traits_;          // the trace's policy
  ModelConfig g_;                // one GPU's shape
  std::vector<ModelConfig> lc_;  // per layer
  std::vector<char> prune_at_;
  int first_prune_ = -1;
  bool routes_ = false;  // the trace's routes are this model's experts (used where a step has them)
  int64_t prompt_tokens_ = 0, dropped_ = 0, steps_ = 0;
  double peak_act_ = 0, aux_entries_ = 0;
  std::vector<int64_t> last_keys_;
  Pipeline pipe_;
  std::vector<int> stage_starts_{0};
  Prediction r_;
};

// A run's steps costed on every profile beside the same work unpruned (every token at every layer,
// the same prompt as given, random-drop's dropped tokens included, and as many decoding steps), as
// `simulate` reports it. The steps stream (memory O(layers) whatever their number): `next` gives
// them one at a time in the header `src`'s shape, mapped onto `costed` (map_step) when `map`.
// Throws lp::Error when the prompt and the decoding steps exceed the model's context (checked
// before any step when `known_steps` >= 0, else as they come).
struct PairedPrediction {
  Prediction pruned, unpruned;
};
struct PairedReplay {
  int64_t decode_steps = 0;
  std::vector<PairedPrediction> per_hw;  // in the profiles' order
};
PairedReplay replay_beside_unpruned(const std::function<bool(trace::Step&)>& next, const trace::Header& src,
                                    const trace::Header& costed, bool map, const ModelConfig& c,
                                    const std::vector<hw::Profile>& hws, const Precision& p, int tp,
                                    size_t keep_steps, int64_t known_steps, const Pipeline& pipe = {});

// Replays synthetic steps (trace::SyntheticSteps) as they are made: memory O(layers) whatever
// `decode_steps`; per-step decode times kept for the first `keep_steps`; random-drop's
// `drop_share` as trace::SyntheticSteps takes it.
Prediction replay_synthetic(const ModelConfig& c, const std::string& policy,
                            const std::vector<PruneStep>& steps, int64_t prompt_tokens, int64_t decode_steps,
                            const trace::Revivals& revivals, const hw::Profile& hw, const Precision& p,
                            int64_t batch = 1, int tp = 1, size_t keep_steps = 0, double drop_share = 0,
                            const Pipeline& pipe = {});

// Replays a whole trace held in memory (Replayer over its steps, every step's time kept).
Prediction replay(const trace::Trace& t, const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                  int64_t batch = 1, int tp = 1);

}  // namespace lp::sim
