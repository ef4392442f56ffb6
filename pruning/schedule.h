// Pruning schedules: at which layers LazyLLM prunes, and what share of the active tokens it drops.
//
// A schedule is a list of steps (at, share). At pruning layer l (0-based) the last token's
// attention scores the tokens active at l, and the `share` of them with the lowest scores are not
// computed in layers l+1 ... L-1. A step's layer is given either as an absolute layer index or as
// a fraction of depth, so one schedule fits models of different depth; resolve_schedule() turns
// it into layer indices for one model. The written forms (inline text, JSON file) are documented
// in kScheduleSyntaxHelp and docs/schedules.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lp {

struct ScheduleStep {
  double at = 0;          // layer index (if !fraction; a whole number) or depth fraction in (0, 1)
  bool fraction = false;  // whether `at` is a depth fraction
  double share = 0;       // share of the active tokens pruned here, in [0, 1)
  // A share alone ("0.3"): tokens dropped before the model (random-drop); `at` is unused. Only
  // ever a schedule's one step; resolve_schedule() refuses it (see drop_share()).
  bool before_model = false;
};

struct Schedule {
  std::vector<ScheduleStep> steps;  // as written; an empty list means no pruning
  // The inline form ("0.3:0.3,0.6:0.3,0.9:0.3", "8:0.3", "none"). parse_schedule() of it gives
  // back exactly the same steps (bit for bit) for every valid schedule.
  std::string to_string() const;
  // The file form, {"lazyprefill_schedule": 1, "steps": [...]}; load_schedule_file() of its dump
  // gives back exactly the same steps.
  nlohmann::json to_json() const;
};

// The LazyLLM paper's schematic: prune 30% of the active tokens after 30%, 60% and 90% of depth.
Schedule default_schedule();

// For --help: the inline syntax and the file form, a few lines, no trailing newline.
extern const char* const kScheduleSyntaxHelp;

// The inline syntax (kScheduleSyntaxHelp). Throws lp::Error naming the offending item.
Schedule parse_schedule(std::string_view inline_text);
// The JSON file form. Throws lp::Error "PATH: ..." (a file that is not JSON or not shaped like a
// schedule gives "PATH: not a schedule file (...)").
Schedule load_schedule_file(const std::string& path);
// A command-line argument: the schedule file it names if that exists, else inline text. "none"
// and "" are always inline. An argument that looks like a path (has a '/' or ends in ".json")
// but names no file gives "no such schedule file" rather than an inline-syntax error.
Schedule schedule_from_arg(const std::string& arg);

// A step resolved against one model: prune after this 0-based layer.
struct PruneStep {
  int layer;
  double share;
  bool operator==(const PruneStep&) const = default;
};

// Resolves `s` for a model with n_layer layers. A depth fraction f maps to layer
// round(f * n_layer) - 1 (halves round up; with 30 layers 0.3 -> 8: the first 9 layers, 30% of
// depth, run on all tokens), clamped to [0, n_layer - 2]. Validates: every layer in
// [0, n_layer - 2] (a prune after the last layer would do nothing; absolute layers are never
// clamped), layers strictly increasing after resolution (so a clamp that makes two steps meet is
// an error for that model), share in [0, 1). An empty schedule is valid for any depth. A step
// before the model (random-drop's) has no layer: it is refused here, naming random-drop.
//
// A model with sliding-window layers (Gemma 3: five local layers to a global one) names the layers
// whose attention sees every earlier key in `global_layers` (ModelConfig::global_layers; empty: every
// layer does). A local layer's last-row scores cover only its window, so every token further back
// scores 0 and would be pruned first (docs/engine.md). So a depth fraction resolves there to the
// global layer nearest its layer (ties to the earlier; only layers a prune can follow, up to
// n_layer - 2), and fractions that land on the same global layer become one step pruning what they
// would have pruned together (shares a, b: 1 - (1 - a)(1 - b)). Absolute layers are never moved.
// Without a global layer a prune can follow, fractions resolve as above.
std::vector<PruneStep> resolve_schedule(const Schedule& s, int n_layer,
                                        const std::vector<int>& global_layers = {});

// The share a schedule drops before the model (its one step written as a share alone), if it does.
std::optional<double> drop_share(const Schedule& s);

// Products like 0.29 * 100 land a hair below the integer they stand for (28.999999999999996).
// Floors and roundings of such products get this relative slack, which is far above the
// product's rounding error (a few 1e-16) and far below any real fractional part of a share or
// depth written with up to 6 decimals times up to a million tokens or layers.
inline constexpr double kShareSlack = 1e-12;

[[noreturn]] void tokens_kept_fail(int64_t n_active, double share);
// How many of n_active tokens (>= 1) are kept after pruning `share` (in [0, 1)) of them:
// n_active - floor(share * n_active), but at least 1 (the last token is never pruned). Every
// policy uses this, so they all round the same way. Inline: a serving simulation asks it at every
// pruning stage of every request's decoding steps.
inline int64_t tokens_kept(int64_t n_active, double share) {
  if (n_active < 1 || !(share >= 0 && share < 1)) [[unlikely]]
    tokens_kept_fail(n_active, share);
  const double x = share * double(n_active);
  const auto pruned = int64_t(x + x * kShareSlack);  // x >= 0: the conversion's truncation is the floor
  return n_active - pruned > 1 ? n_active - pruned : 1;
}

}  // namespace lp
