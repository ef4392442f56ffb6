#include "traces/synthetic.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace lp::trace {

Trace synthetic_trace(const ModelConfig& c, const std::string& policy, const std::vector<PruneStep>& steps,
                      int64_t prompt_tokens, int64_t new_tokens, double revival_share) {
  if (policy != "none" && policy != "lazyllm" && policy != "static" && policy != "random")
    fail("unknown pruning policy '{}' (expected none, lazyllm, static or random)", policy);
  if (prompt_tokens < 1) fail("--prompt-tokens must be at least 1, got {}", prompt_tokens);
  if (new_tokens < 0) fail("--new-tokens must be >= 0, got {}", new_tokens);
  if (!(revival_share >= 0 && revival_share <= 1)) fail("revival share must be in [0, 1], got {}", revival_share);
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
    int64_t carried = 0;  // revived rows still running
    for (int l = 0; l < L; ++l) {
      // Revivals at the layer after a pruning layer: a share of the tokens still active there.
      if (policy == "lazyllm" || policy == "random") {
        if (l > 0 && dropped[size_t(l - 1)] > 0) {
          const int64_t rv = std::min<int64_t>(int64_t(std::llround(revival_share * double(act[size_t(l)] - 1))),
                                               std::max<int64_t>(0, n - held[size_t(l)]));
          d.revived[size_t(l)] = rv;
          carried = std::min(carried, act[size_t(l)] - 1) + rv;
        } else {
          carried = std::min(carried, act[size_t(l)] - 1);
        }
      }
      held[size_t(l)] += 1 + d.revived[size_t(l)];
      const int64_t rows = 1 + carried;
      d.queries.push_back(rows);
      d.keys.push_back(held[size_t(l)]);
      d.attended.push_back(act[size_t(l)]);  // the step's active set, the new token included
      // The new token sees every active key; a revived row sees about half of them.
      d.pairs.push_back(act[size_t(l)] + carried * (act[size_t(l)] / 2));
      d.aux_reads.push_back(d.revived[size_t(l)]);
      d.aux_writes.push_back(0);
    }
    t.steps.push_back(std::move(d));
  }
  return t;
}

}  // namespace lp::trace
