// Decoding over listed key sets, fitted on single requests measured op by op: LazyLLM's decoding
// attention (efficiency.attention.listed_compute / listed_memory) and the pruning stages' cost
// (efficiency.pruning_stage_us / pruning_key_ns), from `run --prune lazyllm --json` runs of a
// prompt stopped after several numbers of decoding steps, each set beside the replay of the same
// run's trace (`run --trace`) up to that step (tests/fixtures/serving/lone/, docs/serving.md).
//
// Both costs are linear in their parameters' inverses (time = F / (peak c) + B / (bw m) for the
// attention of listed rows, stages x stage + keys x key for the stages), so each is a linear
// least-squares fit of the measured op time, minus what the replay prices apart, on the relative
// error of each span of steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"
#include "traces/trace.h"

namespace lp::calib {

// One prompt run alone: its trace, and the op time its decoding steps took, measured after
// each of several step counts (cumulative from the first decoding step).
struct LoneDecodeRun {
  std::string name;                 // the trace's file name, for messages
  trace::Trace trace;               // the run's trace: its prefill and decoding steps
  std::vector<int64_t> steps;       // decoding steps measured, ascending, each <= the trace's
  std::vector<double> attention_s;  // attention's time over those steps (median of rounds)
  std::vector<double> pruning_s;    // score's and select's together
};

// The runs in `dir`: for each `<name>.trace.jsonl`, the files `<name>-n<N>-r<R>.json` (`run
// --json` with --max-new-tokens N: N - 1 decoding steps; R the round), their ops.decode.total
// attention, score and select times, the median over rounds of each N. Throws lp::Error naming
// the file for a missing or malformed one, a step count past the trace's, or fewer than 2 spans.
std::vector<LoneDecodeRun> load_lone_decodes(const std::string& dir);

struct LoneDecodeFit {
  double listed_compute = 0, listed_memory = 0;  // the fitted shares (profile's attention)
  double stage_us = 0, key_ns = 0;               // the fitted stage costs
  size_t spans = 0;                              // spans of steps fitted on (runs x step counts)
  double scale = 1;                              // set_lone_decodes's t, where a caller set one
  // RMS log error of the spans' attention and pruning times, before (the profile as given) and after.
  double attention_rms_before = 0, attention_rms_after = 0;
  double pruning_rms_before = 0, pruning_rms_after = 0;
};

// Fits the four parameters on `runs` and sets them in `hw` (model `c`, precision `p`: what the
// runs ran). A share that comes out past its bound (compute above 1, memory above
// hw::kMaxMemoryEfficiency) is held at the bound and the other refitted; a stage cost below
// zero is held at zero. Throws lp::Error when the spans cannot determine the shares.
// Sets `f`'s four parameters in `hw` with their time scaled by `t` (> 0): the shares divided by
// it, the stage costs multiplied. Throws lp::Error where a share would leave its bounds. What
// validate --serving fits on the load test's own lone decodes: the spans above give the costs'
// form, the server's requests their level (its streaming, and the machine on its day).
void set_lone_decodes(hw::Profile& hw, const LoneDecodeFit& f, double t = 1);
// The range of t that set_lone_decodes accepts for `f`.
std::pair<double, double> lone_decode_scale_range(const LoneDecodeFit& f);

LoneDecodeFit fit_lone_decodes(hw::Profile& hw, const ModelConfig& c, const sim::Precision& p,
                               const std::vector<LoneDecodeRun>& runs);

}  // namespace lp::calib
