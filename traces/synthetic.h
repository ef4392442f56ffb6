// Synthetic traces: the counts a policy's run would record, made from a schedule without running
// a model, so the simulator can cost prompt lengths and models nobody ran. Assumptions
// (docs/simulator.md):
//   - Prefill: exactly the engine's counts. At each pruning layer tokens_kept() of the active
//     tokens stay; a layer's queries and keys are its active tokens; its causal pairs are
//     T_l (T_l + 1) / 2 whichever tokens were kept (pairs within a set depend only on its size);
//     pruned tokens are written to the Aux Cache once.
//   - Decoding: every step re-selects with the same shares from all tokens (static keeps the
//     prefill's set plus the new tokens), the new token runs through every layer and attends to
//     the step's active set; `revivals(i, s).share` of the tokens active after the i-th pruning
//     layer are revived there in decoding step s, capped by the tokens that lack K/V there (none
//     by default: the optimistic bound, when the selected tokens already have K/V; the fitted
//     revival model of sim/revival.h is what the CLI uses). Revived rows run on through the
//     following layers, adding K/V at each, until a later pruning layer drops them (it keeps
//     `survival` of them). Measured traces replace this where they exist.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "pruning/schedule.h"
#include "traces/trace.h"

namespace lp::trace {

// What decoding does at pruning stage `stage` (0-based, schedule order) in decoding step `step`
// (1-based): `share` of the stage's active tokens other than the new one are revived there from
// the Aux Cache, and `survival` of the rows revived at earlier stages and still running are kept
// by its selection (< 0: the stage's kept fraction, as for any token); each running row attends
// `key_share` of the active keys at the layers up to the next pruning layer (causally: about half
// if revived positions were spread evenly). All in [0, 1].
struct StageRevival {
  double share = 0;
  double survival = -1;
  double key_share = 0.5;
};
using Revivals = std::function<StageRevival(size_t stage, int64_t step)>;

// A Revivals asked ahead for decoding steps 1..max_steps of each of `stages` stages: what many
// SyntheticSteps of one serving simulation share (every request asks the same, at each stage of
// each decoding step), read as a table; the steps past it ask `rest`.
struct RevivalTable {
  RevivalTable(const Revivals& r, size_t stages, int64_t max_steps);
  std::vector<std::vector<StageRevival>> by_stage;  // [stage][step - 1]
  Revivals rest;
  StageRevival operator()(size_t stage, int64_t step) const {
    if (stage < by_stage.size() && step >= 1 && step <= int64_t(by_stage[stage].size()))
      return by_stage[stage][size_t(step - 1)];
    return rest ? rest(stage, step) : StageRevival{};
  }
};

// The synthetic steps one at a time, O(layers) state: the prefill, then `new_tokens` decoding
// steps. policy: a policy_name (pruning/policy.h). random-drop's `drop_share` of the prompt is
// dropped before the model (random_drop_kept tokens remain, as a shorter unpruned prompt; the
// header's prompt_tokens_dropped says how many went). Throws lp::Error for a bad argument (a
// revival share outside [0, 1] included, when the step that draws it is made). An empty
// `revivals` revives nothing.
class SyntheticSteps {
 public:
  SyntheticSteps(const ModelConfig& c, const std::string& policy, const std::vector<PruneStep>& steps,
                 int64_t prompt_tokens, int64_t new_tokens, Revivals revivals = {}, double drop_share = 0);
  const Header& header() const { return header_; }
  // Decoding steps from now on only at the first layer of each run of layers that `starts` (ascending,
  // from 0) begins: every layer of a run then holds the same counts, which needs each pruning
  // layer, and the layer after it (where revivals enter), to begin a run. The other layers' entries
  // of a decoding step are left as they were. A serving simulation reads one layer per run (next()
  // went from 33% to 21% of BM_ServingSim/100000's time under perf). Throws lp::Error for runs
  // that break that rule.
  void only_run_starts(const std::vector<int>& starts);
  // Revivals from `t` instead of the constructor's (the same function, tabulated).
  void use_table(std::shared_ptr<const RevivalTable> t) { table_ = std::move(t); }
  // The next step into `out`; false after the last.
  bool next(Step& out);

 private:
  void active(int64_t n, bool every_layer);
  int L_;
  bool frozen_ = false, revives_ = false;
  std::vector<PruneStep> steps_;
  int64_t prompt_tokens_, new_tokens_;
  Revivals revivals_;
  std::shared_ptr<const RevivalTable> table_;
  bool prunes_ = false;
  Header header_;
  int64_t next_ = 0;  // 0: the prefill, s: decoding step s
  std::vector<int64_t> act_, dropped_, held_, prefill_act_;
  std::vector<int> layers_;  // the layers a decoding step computes (every one, or run starts)
  // Sliding-window and chunked layers (ModelConfig::layer_window, layer_chunk): a query sees only
  // the active keys inside its window or chunk, the same share of them as of its positions.
  ModelConfig local_;  // the windows and chunks alone; n_layer 0 when every layer is global
  double visible_share(int l, int64_t n) const { return double(local_.visible_keys(l, n)) / double(n); }
};

// Every step at once (SyntheticSteps collected).
Trace synthetic_trace(const ModelConfig& c, const std::string& policy, const std::vector<PruneStep>& steps,
                      int64_t prompt_tokens, int64_t new_tokens, const Revivals& revivals = {},
                      double drop_share = 0);

}  // namespace lp::trace
