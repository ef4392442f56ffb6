#include "traces/synthetic.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace lp::trace {

Trace synthetic_trace(const ModelConfig& c, const std::string& policy, const std::vector<PruneStep>& steps,
                      int64_t prompt_tokens, int64_t new_tokens, const Revivals& revivals) {
  if (policy != "none" && policy != "lazyllm" && policy != "static" && policy != "random")
    fail("unknown pruning policy '{}' (expected none, lazyllm, static or random)", policy);
  if (prompt_tokens < 1) fail("--prompt-tokens must be at least 1, got {}", prompt_tokens);
  if (new_tokens < 0) fail("--new-tokens must be >= 0, got {}", new_tokens);
  const int L = c.n_layer;
  const bool prunes = policy != "none";
  Trace t;
  t.header.model = config_to_json(c);
  t.header.n_layer = L;
  t.header.policy = policy;
  t.header.prompt_tokens = prompt_tokens;
  t.header.dtype = "synthetic";
  t.header.tool_version = "synthetic";
  if (prunes)
    for (const PruneStep& s : steps) t.header.schedule_layers.emplace_back(s.layer, s.share);
  t.header.schedule = prunes ? "" : "none";

  // Active tokens per layer for a context of n tokens, and the tokens each pruning layer drops.
  const auto active = [&](int64_t n, std::vector<int64_t>& act, std::vector<int64_t>& dropped) {
    act.assign(size_t(L), n);
    dropped.assign(size_t(L), 0);
    int64_t cur = n;
    size_t k = 0;
    for (int l = 0; l < L; ++l) {
      act[size_t(l)] = cur;
      if (prunes && k < steps.size() && steps[k].layer == l) {
        const int64_t kept = tokens_kept(cur, steps[k++].share);
        dropped[size_t(l)] = cur - kept;
        cur = kept;
      }
    }
  };
  std::vector<int64_t> act, dropped, held;
  active(prompt_tokens, act, dropped);
  Step pre;
  pre.kind = "prefill";
  pre.new_tokens = prompt_tokens;
  pre.queries = act;
  pre.keys = act;
  pre.attended = act;
  for (int64_t a : act) pre.pairs.push_back(a * (a + 1) / 2);
  pre.revived.assign(size_t(L), 0);
  pre.aux_reads.assign(size_t(L), 0);
  pre.aux_writes = dropped;
  held = act;
  const std::vector<int64_t> prefill_act = act;
  t.steps.push_back(std::move(pre));

  for (int64_t s = 1; s <= new_tokens; ++s) {
    const int64_t n = prompt_tokens + s;
    if (policy == "static") {
      for (int l = 0; l < L; ++l) act[size_t(l)] = prefill_act[size_t(l)] + s;
      std::fill(dropped.begin(), dropped.end(), 0);
    } else {
      active(n, act, dropped);
    }
    Step d;
    d.kind = "decode";
    d.new_tokens = 1;
    d.revived.assign(size_t(L), 0);
    int64_t carried = 0;     // revived rows still running (they lack K/V at every layer they reach)
    size_t next_stage = 0;   // the schedule entry of the next pruning layer
    double key_share = 0.5;  // of the active keys, what a running row attends
    for (int l = 0; l < L; ++l) {
      // Revivals at the layer after a pruning layer: a share of the tokens still active there.
      const bool after_stage =
          prunes && l > 0 && next_stage < steps.size() && steps[next_stage].layer == l - 1;
      const size_t stage = after_stage ? next_stage++ : next_stage;
      if (policy == "lazyllm" || policy == "random") {
        if (after_stage && dropped[size_t(l - 1)] > 0) {
          const StageRevival r = revivals ? revivals(stage, s) : StageRevival{};
          if (!(r.share >= 0 && r.share <= 1) || !(r.survival <= 1) ||
              !(r.key_share >= 0 && r.key_share <= 1))
            fail(
                "revival share {} / survival {} / key share {} at pruning stage {}, decoding step {} must be "
                "in [0, 1]",
                r.share, r.survival, r.key_share, stage + 1, s);
          key_share = r.key_share;
          const double kept = double(act[size_t(l)]) / double(act[size_t(l - 1)]);
          const double survival = r.survival >= 0 ? r.survival : kept;
          const int64_t survivors =
              std::min(int64_t(std::llround(survival * double(carried))), act[size_t(l)] - 1);
          d.aux_writes[size_t(l - 1)] = carried - survivors;  // dropped again: their entries are overwritten
          // Revived from the tokens without K/V here, neither the new one nor a running row.
          const int64_t room = std::min(n - 1 - held[size_t(l)] - survivors, act[size_t(l)] - 1 - survivors);
          const int64_t rv = std::max<int64_t>(
              0, std::min(int64_t(std::llround(r.share * double(act[size_t(l)] - 1))), room));
          d.revived[size_t(l)] = rv;
          carried = survivors + rv;
        } else {
          carried = std::min(carried, act[size_t(l)] - 1);
        }
      }
      const int64_t rows = 1 + carried;
      held[size_t(l)] += rows;  // every row computed here gains K/V here
      d.queries.push_back(rows);
      d.keys.push_back(held[size_t(l)]);
      d.attended.push_back(act[size_t(l)]);  // the step's active set, the new token included
      // The new token sees every active key; a running revived row key_share of them.
      d.pairs.push_back(act[size_t(l)] + carried * int64_t(std::llround(key_share * double(act[size_t(l)]))));
      d.aux_reads.push_back(d.revived[size_t(l)]);
      d.aux_writes.push_back(0);
    }
    t.steps.push_back(std::move(d));
  }
  return t;
}

}  // namespace lp::trace
