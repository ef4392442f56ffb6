// `sweep`'s steps over a grid (reports/sweep_grid.h): the configurations still to simulate, each
// configuration's row (one JSON line of the output), and which rows an interrupted run left whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "reports/sweep_grid.h"
#include "traces/synthetic.h"

namespace lp::report {

struct SweepConfig {
  size_t hw = 0, model = 0, method = 0, layout = 0;  // indices into the grid's lists
  int64_t tokens = 0;
};

// A row's identity: hardware, model, policy, schedule, prompt length, layout (SweepLayout::name;
// rows written before layouts existed are "tp1").
std::string sweep_key(const std::string& hw, const std::string& model, const std::string& policy,
                      const std::string& schedule, int64_t tokens, const std::string& layout = "tp1");

// The rows already in an output (`text`): their keys, and the bytes of whole rows (a line cut
// short by an interrupted run, and everything after it, is to be redone).
struct SweepProgress {
  std::set<std::string> done;
  size_t whole_bytes = 0;
};
SweepProgress sweep_progress(std::string_view text, const std::string& origin);

// Every configuration of the grid in grid order (model, hardware, layout, method, length) but those in
// `done` and those whose prompt and decoding steps exceed the model's context. Throws lp::Error
// naming `origin` when the grid names more than 2^22 configurations.
std::vector<SweepConfig> sweep_configs(const SweepGrid& g, const std::set<std::string>& done,
                                       const std::string& origin);

// What synthetic decoding revives for one (model, method), and the line that says so.
struct SweepRevivals {
  trace::Revivals share;
  std::string description;
};
// One configuration's output line (JSON, no newline): the pruned run beside the unpruned one, on
// one GPU of the layout (its memory against the GPU's: fits_in_memory). A layout the model cannot
// split or the profile cannot host gives a row with the figures null and "error": the one line
// simulate would print. `revivals` is [model][method], row-major.
std::string sweep_row(const SweepGrid& g, const SweepConfig& cf, const std::vector<SweepRevivals>& revivals);

}  // namespace lp::report
