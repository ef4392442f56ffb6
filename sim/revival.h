// The revival model (docs/simulator.md, "Revivals in synthetic decoding"): how many of the tokens
// a pruning stage keeps in a decoding step must first be revived from the Aux Cache, as a share
// of that stage's active tokens, decaying with the step:
//
//   share_i(s) = floor_i + (start_i - floor_i) * exp(-(s - 1) / tau_i)     (s = 1, 2, ... decoding step)
//
// one (start, floor, tau) per pruning stage i, fitted by least squares to the shares recorded
// traces show (revived at the layer after the pruning layer / its active tokens other than the new
// one), and the share of the rows revived at earlier stages that the stage's selection keeps
// (`survival`: kept rows over running rows, summed over the traces' steps), and the share of the
// active keys a running revived row attends at the layers up to the next stage (`key_share`:
// revived rows sit early in the context, so causally they see fewer than half). Synthetic decoding
// (traces/synthetic.h) draws its revivals from it; a built-in model, fitted on the demo model's traces, is
// the default of simulate --prune, report and sweep. The fit to traces is calibrate/revivals.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "pruning/schedule.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace lp::sim {

struct RevivalStage {
  int layer = 0;           // the pruning layer it was fitted at
  double depth = 0;        // (layer + 1) / n_layer: where stages of another model map to
  double prune_share = 0;  // the schedule's share pruned there
  double survival = -1;    // share of the rows revived at earlier stages its selection keeps (-1: none seen)
  double key_share = 0.5;  // share of the active keys a running revived row attends, up to the next stage
  double start = 0;        // share at the first decoding step
  double floor = 0;        // share it decays to
  double tau_steps = 1;    // decay constant, in decoding steps
  static constexpr double kTauMin = 0.05, kTauMax = 1e4;  // the range a file and the fit may give tau
  double rms_error = 0;                                   // of the fit over its points (share units)
  int64_t points = 0;                                     // (trace, step) points it was fitted on
  double share(int64_t step) const;
};

struct RevivalSource {
  std::string file, sha256;
  int64_t prompt_tokens = 0, decode_steps = 0;
};

struct RevivalModel {
  std::string policy = "lazyllm";
  int n_layer = 0;
  std::string model;     // the model the traces were recorded on (header model.name)
  std::string schedule;  // the traces' schedule, inline form
  std::vector<RevivalStage> stages;
  std::vector<RevivalSource> traces;
  std::string tool_version, git_commit;
  std::string origin;  // the file it was read from, or "built-in"
  bool builtin = false;
};

nlohmann::ordered_json revival_model_json(const RevivalModel& m);
// Parses a revival model file's JSON; throws lp::Error naming `origin` and the field.
RevivalModel parse_revival_model(const nlohmann::json& j, const std::string& origin);
// Reads a revival model file (calibrate-revivals --out), or "builtin"/"" for the built-in one.
RevivalModel load_revival_model(const std::string& path_or_builtin);

// The share function synthetic decoding uses for a target model of `n_layer` layers pruning at
// `steps`: each target stage takes the fitted stage nearest in relative depth. A model fitted on
// another layer count needs `map` (the built-in model is a documented prior for any model and
// always maps); without it this throws lp::UsageError naming the file and both layer counts.
trace::Revivals revival_shares(const RevivalModel& m, int n_layer, const std::vector<PruneStep>& steps,
                               bool map);

// A constant share (the optimistic bound is 0).
trace::Revivals constant_revival_share(double share);

// How synthetic decoding revives tokens, and the line that says so in outputs.
struct RevivalChoice {
  trace::Revivals share;
  std::string description;
};
// The revival model the options name: a calibrate-revivals file, or "" / "builtin"; none when
// `share` >= 0 (a constant share replaces the model). Read once per command.
std::optional<RevivalModel> load_revivals(const std::string& model, double share);
// What one method's synthetic decoding revives: `model` (from load_revivals), else the constant
// `share` (0: the optimistic bound). Policies that do not revive get an empty share.
RevivalChoice choose_revivals(const std::optional<RevivalModel>& model, double share,
                              const std::string& policy, int n_layer, const std::vector<PruneStep>& steps,
                              bool map);

}  // namespace lp::sim
