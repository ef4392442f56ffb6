#include "traces/synthetic.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"
#include "pruning/policy.h"

namespace lp::trace {

namespace {
// std::llround for x >= 0 (halves away from zero), inline: a decoding step rounds a few of these
// for every request of a serving simulation. x - trunc(x) is exact below 2^52.
int64_t round_nonneg(double x) {
  const int64_t t = int64_t(x);
  return t + (x - double(t) >= 0.5 ? 1 : 0);
}
}  // namespace

RevivalTable::RevivalTable(const Revivals& r, size_t stages, int64_t max_steps) : by_stage(stages), rest(r) {
  if (r)
    for (size_t st = 0; st < stages; ++st)
      for (int64_t s = 1; s <= max_steps; ++s) by_stage[st].push_back(r(st, s));
}

SyntheticSteps::SyntheticSteps(const ModelConfig& c, const std::string& policy,
                               const std::vector<PruneStep>& steps, int64_t prompt_tokens, int64_t new_tokens,
                               Revivals revivals, double drop_share)
    : L_(c.n_layer),
      steps_(steps),
      prompt_tokens_(prompt_tokens),
      new_tokens_(new_tokens),
      revivals_(std::move(revivals)) {
  const PolicyKind kind = parse_policy(policy);
  if (prompt_tokens < 1) fail("a synthetic trace needs a prompt of at least 1 token, got {}", prompt_tokens);
  if (new_tokens < 0) fail("a synthetic trace's new tokens must be >= 0, got {}", new_tokens);
  if (kind == PolicyKind::RandomDrop) {  // a shorter prompt, unpruned
    prompt_tokens_ = random_drop_kept(prompt_tokens, drop_share);
    header_.prompt_tokens_dropped = prompt_tokens - prompt_tokens_;
    steps_.clear();
  }
  prunes_ = kind != PolicyKind::None && kind != PolicyKind::RandomDrop;
  frozen_ = policy_freezes(kind);
  revives_ = policy_revives(kind);
  header_.model = config_to_json(c);
  header_.n_layer = L_;
  header_.policy = policy;
  header_.prompt_tokens = prompt_tokens_;
  header_.dtype = "synthetic";
  header_.tool_version = "synthetic";
  if (prunes_)
    for (const PruneStep& s : steps) header_.schedule_layers.emplace_back(s.layer, s.share);
  header_.schedule = prunes_ ? "" : "none";
  for (int l = 0; l < L_; ++l) layers_.push_back(l);
  if (c.local_attention()) {
    local_.n_layer = L_;
    local_.layer_window = c.layer_window;
    local_.layer_chunk = c.layer_chunk;
  }
}

void SyntheticSteps::only_run_starts(const std::vector<int>& starts) {
  const auto begins = [&](int l) { return l >= L_ || std::binary_search(starts.begin(), starts.end(), l); };
  bool ok = !starts.empty() && starts.front() == 0 && std::is_sorted(starts.begin(), starts.end()) &&
            starts.back() < L_;
  if (prunes_)
    for (const PruneStep& st : steps_) ok = ok && begins(st.layer) && begins(st.layer + 1);
  if (!ok)
    fail("synthetic steps: runs of layers must start at 0 and at every pruning layer and the one after it");
  layers_ = starts;
}

// Active tokens per layer for a context of n tokens, and the tokens each pruning layer drops
// (dropped_ is zero at every other layer). Filled at every layer, or, for decoding steps, only at
// those next() computes (layers_): a serving simulation asks this for every request at every
// decoding step.
void SyntheticSteps::active(int64_t n, bool every_layer) {
  if (act_.empty()) act_.assign(size_t(L_), 0), dropped_.assign(size_t(L_), 0);
  int filled = 0;                               // layers filled, or
  size_t run = 0;                               // entries of layers_ filled
  const auto fill = [&](int upto, int64_t v) {  // the layers before `upto` not yet filled
    if (every_layer) {
      std::fill(act_.begin() + filled, act_.begin() + upto, v);
      filled = upto;
    } else {
      for (; run < layers_.size() && layers_[run] < upto; ++run) act_[size_t(layers_[run])] = v;
    }
  };
  int64_t cur = n;
  int from = 0;
  if (prunes_)
    for (const PruneStep& st : steps_) {
      if (st.layer < from || st.layer >= L_) continue;
      fill(st.layer + 1, cur);
      const int64_t kept = tokens_kept(cur, st.share);
      dropped_[size_t(st.layer)] = cur - kept;
      cur = kept;
      from = st.layer + 1;
    }
  fill(L_, cur);
}

bool SyntheticSteps::next(Step& out) {
  const int L = L_;
  if (next_ == 0) {
    active(prompt_tokens_, true);
    Step pre;
    pre.kind = "prefill";
    pre.new_tokens = prompt_tokens_;
    pre.queries = act_;
    pre.keys = act_;
    pre.attended = act_;
    for (int64_t a : act_) pre.pairs.push_back(a * (a + 1) / 2);
    if (local_.n_layer > 0)  // the kept rows' causal pairs in the share a window or chunk leaves
      for (int l = 0; l < L; ++l) {
        const double n = double(prompt_tokens_),
                     share = double(local_.dense_pairs(l, prompt_tokens_)) / (n * (n + 1) / 2);
        pre.pairs[size_t(l)] = std::max(pre.pairs[size_t(l)] > 0 ? act_[size_t(l)] : 0,
                                        round_nonneg(double(pre.pairs[size_t(l)]) * share));
      }
    pre.revived.assign(size_t(L), 0);
    pre.aux_reads.assign(size_t(L), 0);
    pre.aux_writes = dropped_;
    held_ = act_;
    prefill_act_ = act_;
    out = std::move(pre);
    ++next_;
    return true;
  }
  if (next_ > new_tokens_) return false;
  const int64_t s = next_++;
  const int64_t n = prompt_tokens_ + s;
  if (frozen_) {
    for (int l = 0; l < L; ++l) act_[size_t(l)] = prefill_act_[size_t(l)] + s;
    std::fill(dropped_.begin(), dropped_.end(), 0);
  } else {
    active(n, false);
  }
  // Filled in place: a serving simulation makes millions of these, and reusing `out`'s vectors
  // keeps that free of allocations.
  Step& d = out;
  d.kind = "decode";
  d.new_tokens = 1;
  // Each computed layer's entries are written below (revivals and Aux Cache writes zero where no
  // stage sets them).
  for (auto* v : {&d.queries, &d.keys, &d.attended, &d.pairs, &d.aux_reads, &d.revived, &d.aux_writes})
    v->resize(size_t(L));
  d.pruning.reset();
  d.revived_positions.reset();
  const bool revives = revives_;
  int64_t carried = 0;     // revived rows still running (they lack K/V at every layer they reach)
  size_t next_stage = 0;   // the schedule entry of the next pruning layer
  double key_share = 0.5;  // of the active keys, what a running row attends
  int64_t seen_act = -1, seen_keys = 0;
  double seen_share = -1;
  // Raw pointers: the loop below runs for every request at every decoding step of a serving
  // simulation, and through the vectors the compiler reloaded each one's data at every store.
  const int64_t* act = act_.data();
  const int64_t* dropped = dropped_.data();
  int64_t* held = held_.data();
  int64_t *revived = d.revived.data(), *queries = d.queries.data(), *keys = d.keys.data(),
          *attended = d.attended.data(), *pairs = d.pairs.data(), *aux_reads = d.aux_reads.data(),
          *aux_writes = d.aux_writes.data();
  for (const int l : layers_) {
    revived[l] = 0, aux_writes[l] = 0;  // set below where a stage revives or drops rows again
    // Revivals at the layer after a pruning layer: a share of the tokens still active there.
    const bool after_stage =
        prunes_ && l > 0 && next_stage < steps_.size() && steps_[next_stage].layer == l - 1;
    const size_t stage = after_stage ? next_stage++ : next_stage;
    if (revives) {
      if (after_stage && dropped[l - 1] > 0) {
        const StageRevival r = table_      ? (*table_)(stage, s)
                               : revivals_ ? revivals_(stage, s)
                                           : StageRevival{};
        if (!(r.share >= 0 && r.share <= 1) || !(r.survival <= 1) || !(r.key_share >= 0 && r.key_share <= 1))
          fail(
              "revival share {} / survival {} / key share {} at pruning stage {}, decoding step {} must be "
              "in [0, 1]",
              r.share, r.survival, r.key_share, stage + 1, s);
        key_share = r.key_share;
        double survival = r.survival;  // < 0: the stage's kept fraction, divided only then
        if (survival < 0) survival = double(act[l]) / double(act[l - 1]);
        const int64_t survivors = std::min(round_nonneg(survival * double(carried)), act[l] - 1);
        aux_writes[l - 1] = carried - survivors;  // dropped again: their entries are overwritten
        // Revived from the tokens without K/V here, neither the new one nor a running row.
        const int64_t room = std::min(n - 1 - held[l] - survivors, act[l] - 1 - survivors);
        const int64_t rv = std::max<int64_t>(0, std::min(round_nonneg(r.share * double(act[l] - 1)), room));
        revived[l] = rv;
        carried = survivors + rv;
      } else {
        carried = std::min(carried, act[l] - 1);
      }
    }
    const int64_t rows = 1 + carried;
    held[l] += rows;  // every row computed here gains K/V here
    queries[l] = rows;
    keys[l] = held[l];
    attended[l] = act[l];  // the step's active set, the new token included
    // The new token sees every active key; a running revived row key_share of them (rounded once
    // per run of layers with the same active set).
    if (carried > 0 && (act[l] != seen_act || key_share != seen_share)) {
      seen_act = act[l], seen_share = key_share;
      seen_keys = round_nonneg(key_share * double(seen_act));
    }
    pairs[l] = act[l] + (carried > 0 ? carried * seen_keys : 0);
    if (local_.n_layer > 0 && local_.visible_keys(l, n) < n) {
      const double share = visible_share(l, n);
      attended[l] = std::max<int64_t>(1, round_nonneg(double(act[l]) * share));
      pairs[l] = std::max(attended[l], round_nonneg(double(pairs[l]) * share));
    }
    aux_reads[l] = revived[l];
  }
  return true;
}

Trace synthetic_trace(const ModelConfig& c, const std::string& policy, const std::vector<PruneStep>& steps,
                      int64_t prompt_tokens, int64_t new_tokens, const Revivals& revivals,
                      double drop_share) {
  SyntheticSteps gen(c, policy, steps, prompt_tokens, new_tokens, revivals, drop_share);
  Trace t;
  t.header = gen.header();
  t.steps.reserve(size_t(new_tokens) + 1);
  Step s;
  while (gen.next(s)) t.steps.push_back(std::move(s));
  return t;
}

}  // namespace lp::trace
