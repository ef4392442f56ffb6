// Prompt -> prefill -> sampled continuation, with the timings `run` reports, on any backend.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/session.h"

namespace lp {

struct GenerateOptions {
  int max_new_tokens = 64;
  SamplerParams sampler;
  bool stop_at_end_of_generation = true;
  // Token pruning in the prefill and in every decoding step (Session::decode_step: re-selection
  // by the new token's attention, revival from the Aux Cache; static keeps the prefill's set).
  PolicyKind policy = PolicyKind::None;
  Schedule schedule = default_schedule();
  uint64_t prune_seed = 0;
  bool record_steps = false;  // keep the trace step of every decoding step (for traces)
  // Teacher forcing (continuation NLL in `eval`): when not empty, these tokens are fed one by one
  // instead of sampled ones, max_new_tokens and stopping at end of generation are ignored, and
  // the result holds each forced token's log-probability and the greedy choice at its place.
  std::vector<int32_t> forced_ids;
  // Time every op on an asynchronous backend (a GPU: the device is synchronised around each op, so
  // TTFT grows by the lost overlap). A synchronous backend (the CPU) always times its ops.
  bool gpu_op_timers = false;
  // Before the timed prefill, run the same prefill (same policy and seed) and one decoding step,
  // then empty the caches (Session::reset): a GPU's first launches load kernel modules, create the
  // cuBLAS handle and grow the allocator's pool, one-off costs a serving process has paid before
  // its first request (llama-bench likewise runs a warm-up). The result is unchanged by it.
  bool warmup = false;
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;  // as given (with random-drop, before the drop)
  // random-drop: the prompt's tokens the model never saw (the prefill and decoding ran on the
  // others, positions renumbered as for a shorter prompt); 0 for every other policy.
  int64_t prompt_tokens_dropped = 0;
  std::vector<int32_t> generated_ids;
  std::string text;   // decoded generated tokens
  double ttft_s = 0;  // prefill + first token sampled
  double prefill_s = 0;
  double decode_s = 0;       // all decoding steps after the first token
  double warmup_s = 0;       // the untimed warm-up (GenerateOptions::warmup), 0 without one
  int64_t decode_steps = 0;  // forward passes after prefill
  OpTimers prefill_ops, decode_ops;
  OpTimers decode_steady_ops;                  // the decoding steps after the first kSteadyAfterSteps
  std::vector<double> decode_step_s;           // each decoding step's time
  std::vector<float> last_prefill_logits;      // [V] logits of the last prompt token
  std::vector<PruneStep> prune_steps;          // the schedule resolved for this model
  trace::Step prefill_stats;                   // the prefill's trace step, with its detail
  std::vector<trace::Step> decode_stats;       // one per decoding step, when record_steps
  double prompt_tokens_computed_fraction = 1;  // share of prompt (token, layer) pairs the prefill computed
  // The paper's "% of prompt tokens computed" (its Table 2): prompt (token, layer) pairs computed by
  // the end of generation, in the prefill or revived by a decoding step, over prompt tokens x
  // layers. (Generated tokens are computed at every layer as they are made, so a decoding step's
  // rows beyond its new token are all revived prompt tokens.)
  double prompt_tokens_computed_fraction_after_generation = 1;
  // Every (token, layer) pair computed, prompt and generated, over a dense run's: (prompt + decoded
  // tokens) x layers. Not a figure the paper reports.
  double all_tokens_computed_fraction = 1;
  int64_t revivals = 0;
  int64_t kv_bytes_used = 0;  // after prefill, over all layers
  int kv_element_bytes = 4;   // of one cached value: 2 for the CPU backend's f16 cache
  int64_t aux_cache_bytes = 0;
  // With forced_ids: log p(forced_ids[i] | prompt, forced_ids[0..i)) in nats, and the argmax of
  // the logits it was read from (what greedy decoding would have chosen there).
  std::vector<double> forced_logprobs;
  std::vector<int32_t> forced_argmax;
};

// The decoding loop every generator shares (generate(), KV-Runahead's last rank). From `first`, the
// token chosen after a prefill of `prompt_tokens` tokens, it feeds each token back, one decoding
// step at a time (with `prune`: LazyLLM's re-selection and revival; without: a plain pass), and
// asks `choose(i, logits)` for the i-th token, until the end of generation or n_new tokens.
// LazyLLM's revivals cluster in the first decoding steps; the steps after this many are its steady
// state (docs/engine.md, "Decoding cost with revival"), timed apart.
inline constexpr int64_t kSteadyAfterSteps = 32;
struct DecodeLoop {
  int64_t n_new = 0;                      // tokens to generate, `first` included
  bool stop_at_end_of_generation = true;  // the tokenizer's end-of-generation tokens end it
  const PruneRequest* prune = nullptr;    // the prefill's pruning, re-selecting at every step
  OpTimers* ops = nullptr;                // per-op timers of the steps, or none
  OpTimers* steady_ops = nullptr;         // with ops: the same for the steps after kSteadyAfterSteps
  bool record_steps = false;              // keep every step's trace step
};
struct Decoded {
  std::vector<int32_t> ids;  // the generated tokens, `first` included
  std::string text;          // their text, a final end-of-generation token left out
  int64_t steps = 0;         // decoding steps run (forward passes after the prefill)
  int64_t revivals = 0;
  double computed = 0;  // (token, layer) pairs the steps computed
  double seconds = 0;
  std::vector<double> step_seconds;  // each step's
  std::vector<trace::Step> stats;    // one per step, with record_steps
};
Decoded decode_tokens(Session& s, const Model& m, int64_t prompt_tokens, int32_t first,
                      std::vector<float>& logits, const DecodeLoop& o,
                      const std::function<int32_t(size_t i, std::span<const float>)>& choose);

// Makes the backend a generation runs on, for a capacity of n_ctx tokens.
using BackendFactory = std::function<std::unique_ptr<Backend>(int64_t n_ctx)>;

// Throws lp::Error for an empty prompt or one that does not fit the model's context.
GenerateResult generate(const Model& m, std::span<const int32_t> prompt_ids, const GenerateOptions& opt,
                        const BackendFactory& make_backend);
// On the CPU backend.
GenerateResult generate(CpuContext& ctx, const Model& m, std::span<const int32_t> prompt_ids,
                        const GenerateOptions& opt);

// Timing cases on a shared machine: every case `rounds` times, the cases alternated within each
// round (a slow minute spreads over all of them instead of landing on one), each case's fastest
// run kept (noise only ever adds time) with every round's prefill time, for ratios of two cases
// within a round. `progress(round, case, its fastest run so far)` after each run.
struct Rounds {
  std::vector<GenerateResult> fastest;
  std::vector<std::vector<double>> prefill_s;  // [case][round]
};
Rounds generate_rounds(
    CpuContext& ctx, const Model& m, const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<GenerateOptions>& opts, int rounds,
    const std::function<void(int round, size_t i, const GenerateResult& fastest)>& progress = {});

}  // namespace lp
