#include "sim/serving.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "model/error.h"
#include "pruning/policy.h"
#include "sim/layer_cost.h"
#include "sim/replay.h"

namespace lp::sim {

ServingMethod serving_method(const Method& method, int n_layer, trace::Revivals revivals, std::string name) {
  ServingMethod m;
  m.name = name.empty() ? std::string(method.policy_name()) : std::move(name);
  m.method = method;
  m.steps = resolve_method(method.policy, method.schedule, n_layer);
  m.drop_share = drop_share(method.schedule).value_or(0);
  if (method.policy != PolicyKind::None) m.revivals = std::move(revivals);
  return m;
}

double RequestOutcome::itl_s() const {
  return output_tokens > 1 ? (finished_s - first_token_s) / double(output_tokens - 1) : 0.0;
}

namespace {

// A request between its admission and its last token.
struct Active {
  size_t idx = 0;
  double reservation = 0, kv_used = 0, kv_next = 0;  // K/V held, and after this iteration
  int64_t prefilled = 0;  // prompt tokens computed (chunked prefill: those of earlier chunks)
  int64_t generated = 0;  // tokens out
  std::optional<trace::SyntheticSteps> steps;
  trace::Step step;  // its step in this iteration
  bool prefill_done = false;
  bool prefilled_now = false;  // its prefill (or last chunk) ran in this iteration
};

// The GEMMs of one layer of an iteration that some members run on their own (Engine::own_gemm_rows):
// their rows, and the row-priced ops of those rows, seconds.
struct OwnGemms {
  int64_t rows = 0;
  double s = 0;
};

// Costs iterations: the summed layer work of their members, consecutive layers with the same
// work and shape costed once. The row-priced ops (norms, GEMMs, RoPE, SwiGLU) run once over the
// rows of the members that share them and once per member that runs its own (OwnGemms).
class IterationCost {
 public:
  IterationCost(const ModelConfig& c, const hw::Profile& hw, const Precision& p, int tp)
      : c_(c), hw_(hw), tp_(tp), cc_(hw, p) {
    check_tp(c, hw, tp);
    g_ = tp_shard(c, tp);
    for (int l = 0; l < c.n_layer; ++l) lc_.push_back(g_.uniform() ? g_ : g_.layer(l));
    uniform_ = g_.uniform();
  }
  bool uniform() const { return uniform_; }  // every layer the same shape
  // The row-priced ops of `rows` rows at layer l.
  double rows_time(int l, int64_t rows) const {
    if (uniform_) return rows_only(rows);
    double t = 0;
    const auto add = [&t](const OpCost& oc) { t += oc.time_s; };
    cost_layer(
        cc_, hw_, tp_, lc_[size_t(l)], double(c_.n_embd), LayerWork{rows},
        [&](Op, const OpCost& oc) { add(oc); }, add, LayerPart::RowsOnly);
    return t;
  }
  // Work per run of layers: w[k] is the work of each of the len[k] layers from start[k], own[k]
  // the part of its rows in GEMMs of their own, moved[k] the rows gathered at its first layer
  // alone (w[k].moved stays 0).
  double operator()(const std::vector<LayerWork>& w, const std::vector<OwnGemms>& own,
                    const std::vector<int64_t>& moved, const std::vector<int>& start,
                    const std::vector<int>& len, int64_t new_rows, int64_t logit_rows) const {
    double t = 0;
    const auto sink = [&t](const OpCost& oc) { t += oc.time_s; };
    const auto op = [&t](Op, const OpCost& oc) { t += oc.time_s; };
    const double D = c_.n_embd;
    cost_embed(cc_, hw_, tp_, g_, new_rows, D, op, sink);
    for (size_t k = 0; k < w.size(); ++k) {
      if (w[k].rows <= 0) continue;
      const double before = t;
      t += rows_time(start[k], w[k].rows - own[k].rows) + own[k].s;
      const ModelConfig& g = uniform_ ? g_ : lc_[size_t(start[k])];
      cost_layer(cc_, hw_, tp_, g, D, w[k], op, sink, LayerPart::Rest);
      t += (t - before) * double(len[k] - 1);
      if (moved[k] > 0) t += op_cost(cc_, g, Op::Gather, {moved[k], 0, 0}).time_s;
    }
    cost_head(cc_, hw_, tp_, g_, logit_rows, double(c_.n_vocab), op, sink);
    return t;
  }

 private:
  const ModelConfig& c_;
  const hw::Profile& hw_;
  int tp_;
  CostContext cc_;
  ModelConfig g_;
  std::vector<ModelConfig> lc_;
  bool uniform_ = true;
  mutable std::vector<double> rows_only_;  // [rows]: a layer's ops priced by rows alone, < 0 not yet

  double rows_only(int64_t rows) const {
    if (size_t(rows) < rows_only_.size() && rows_only_[size_t(rows)] >= 0) return rows_only_[size_t(rows)];
    return rows_only_priced(rows);
  }
  [[gnu::noinline]] double rows_only_priced(int64_t rows) const {
    double t = 0;
    const auto add = [&t](const OpCost& oc) { t += oc.time_s; };
    cost_layer(
        cc_, hw_, tp_, g_, double(c_.n_embd), LayerWork{rows}, [&](Op, const OpCost& oc) { add(oc); }, add,
        LayerPart::RowsOnly);
    if (rows < int64_t(1) << 16) {
      if (size_t(rows) >= rows_only_.size()) rows_only_.resize(size_t(rows) + 1, -1.0);
      rows_only_[size_t(rows)] = t;
    }
    return t;
  }
};

// The discrete-event simulation itself, for every policy but random-drop's shortening.
ServingRun simulate_requests(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                             const ServingMethod& m, const ServingConfig& cfg,
                             std::span<const ServingRequest> reqs) {
  const int L = c.n_layer;
  if (!(cfg.kv_budget_bytes > 0)) fail("the K/V budget must be positive, got {} bytes", cfg.kv_budget_bytes);
  if (cfg.max_batch_tokens < 1)
    fail("the iteration's token budget must be at least 1, got {}", cfg.max_batch_tokens);
  if (cfg.chunk_tokens < 0) fail("the prefill chunk must be positive, got {}", cfg.chunk_tokens);
  if (!(cfg.iteration_overhead_s >= 0) || !std::isfinite(cfg.iteration_overhead_s))
    fail("the iteration overhead must be a non-negative time, got {}", cfg.iteration_overhead_s);
  if (!(cfg.time_scale > 0) || !std::isfinite(cfg.time_scale))
    fail("the time scale must be a positive number, got {}", cfg.time_scale);
  const bool pruning = policy_traits(m.method.policy).prunes && !m.steps.empty();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const ServingRequest& r = reqs[i];
    if (i > 0 && r.arrival_s < reqs[i - 1].arrival_s) fail("request {}: arrivals are not sorted", i);
    if (!(r.arrival_s >= 0) || !std::isfinite(r.arrival_s))
      fail("request {}: arrival {} is negative", i, r.arrival_s);
    if (r.prompt_tokens < 1 || r.output_tokens < 1) fail("request {}: empty prompt or no output", i);
    if (r.prompt_tokens + r.output_tokens > c.n_ctx_train && c.n_ctx_train > 0)
      fail("request {}: {} prompt + {} output tokens exceed the model's context of {}", i, r.prompt_tokens,
           r.output_tokens, c.n_ctx_train);
    const double res = reservation_bytes(c, kv_layout(cfg), r.prompt_tokens, r.output_tokens, pruning);
    if (res > cfg.kv_budget_bytes)
      fail(
          "request {} ({} prompt + {} output tokens) needs {:.1f} MiB of K/V, more than the budget of {:.1f} "
          "MiB: "
          "it could never run",
          i, r.prompt_tokens, r.output_tokens, res / (1 << 20), cfg.kv_budget_bytes / (1 << 20));
  }
  std::vector<char> prune_at(size_t(L), 0);
  int first_prune = -1;
  if (pruning)
    for (const PruneStep& s : m.steps)
      if (s.layer >= 0 && s.layer < L) {
        prune_at[size_t(s.layer)] = 1;
        if (first_prune < 0 || s.layer < first_prune) first_prune = s.layer;
      }
  const double kv_token_layer = double(c.n_head_kv) * double(c.head_dim) * 2 * cfg.kv_element_bytes;
  const IterationCost cost(c, hw, p, cfg.tp);
  // The revival model's shares per (stage, step), computed once before the run (every request
  // asks the same, three times a decoding step): a table lookup, the model asked only past it.
  std::shared_ptr<const trace::RevivalTable> revivals;
  if (m.revivals) {
    int64_t max_steps = 0;
    for (const ServingRequest& r : reqs) max_steps = std::max(max_steps, r.output_tokens - 1);
    revivals = std::make_shared<const trace::RevivalTable>(m.revivals, m.steps.size(),
                                                           std::min<int64_t>(max_steps, int64_t(1) << 20));
  }

  ServingRun run;
  run.kv_capacity = cfg.kv_budget_bytes;
  run.requests.resize(reqs.size());
  std::deque<size_t> queue;
  std::vector<std::unique_ptr<Active>> running;
  // Runs of layers where every request's step does the same work (a uniform model's layers between
  // pruning layers: the pruning layer, and the layers after it to the next one, where revivals
  // enter at the first), each summed and costed once; a model whose layers differ, one run per
  // layer. Rows moved to and from the Aux Cache come at a run's first layer alone (moved[]).
  std::vector<int> seg_start, seg_len;
  {
    std::vector<int> cut{0};
    if (cost.uniform()) {
      for (int l = 0; l < L; ++l)
        if (prune_at[size_t(l)])
          for (int b : {l, l + 1}) cut.push_back(b);
    } else {
      for (int l = 1; l < L; ++l) cut.push_back(l);
    }
    std::sort(cut.begin(), cut.end());
    cut.erase(std::unique(cut.begin(), cut.end()), cut.end());
    while (!cut.empty() && cut.back() >= L) cut.pop_back();
    for (size_t k = 0; k < cut.size(); ++k) {
      seg_start.push_back(cut[k]);
      seg_len.push_back((k + 1 < cut.size() ? cut[k + 1] : L) - cut[k]);
    }
  }
  const size_t S = seg_start.size();
  std::vector<LayerWork> work(S);
  std::vector<OwnGemms> own(S);
  std::vector<int64_t> moved(S);                     // rows gathered at each run's first layer
  const int64_t own_from = hw.engine.own_gemm_rows;  // rows from which a member runs its own GEMMs
  const auto gemm_rows = [&](size_t k, int64_t q) {
    if (own_from > 0 && q >= own_from) own[k].rows += q, own[k].s += cost.rows_time(seg_start[k], q);
  };
  size_t next = 0, done = 0;
  double t = 0, reserved = 0, used = 0;
  const AdmissionLimits limits{cfg.kv_budget_bytes, cfg.max_batch_tokens, cfg.chunk_tokens};
  const KvLayout kv = kv_layout(cfg);
  int64_t kv_stride = 1;

  // One request's step into the iteration's work. `rows` of a chunk: its tokens (no pruning).
  // Scoring and selection as the policy's traits say, as the batch-1 replay costs them.
  const PolicyTraits traits = policy_traits(m.method.policy);
  // One request's step into the iteration's work; returns the K/V it holds after it, bytes.
  const bool listed = hw.eff(hw::Family::Attention).prices_listed();  // listed key sets priced apart
  const auto add_step = [&](const trace::Step& s, bool prefill) {
    // Raw pointers, as in SyntheticSteps::next: the stores into work[] are int64_t too, and through
    // the vectors the compiler reloaded every array at every layer.
    const int64_t *keys_at = s.keys.data(), *queries = s.queries.data(), *pairs = s.pairs.data(),
                  *attended = s.attended.empty() ? nullptr : s.attended.data(),
                  *aux_writes = s.aux_writes.data(), *aux_reads = s.aux_reads.data();
    int64_t held = 0;
    for (size_t k = 0; k < S; ++k) {
      const int l = seg_start[k];
      held += keys_at[l] * seg_len[k];
      const int64_t q = queries[l];
      if (q <= 0) continue;
      LayerWork& w = work[k];
      gemm_rows(k, q);
      const int64_t keys = prefill ? keys_at[l] : attended ? attended[l] : std::min(keys_at[l], pairs[l]);
      if (prefill)
        w.rows += q, w.pairs += pairs[l], w.keys += keys;
      else
        add_decoding(w, q, attended ? keys_at[l] : keys, keys, pairs[l], listed);
      const bool prunes_here = prune_at[size_t(l)] && traits.prunes;
      if (scores_at(traits, prefill, l, prunes_here, first_prune)) ++w.scorers, w.score_keys += keys;
      if (prunes_here) ++w.selects, w.select_keys += keys;
      moved[k] += prefill ? (aux_writes[l] > 0 ? q : 0) : aux_writes[l] + aux_reads[l];
    }
    return double(held) * kv_token_layer;
  };

  while (done < reqs.size()) {
    while (next < reqs.size() && reqs[next].arrival_s <= t) queue.push_back(next++);
    if (queue.empty() && running.empty()) {
      t = reqs[next].arrival_s;
      continue;
    }
    // Admission, as the engine's scheduler admits (admission/admission.h), after the iteration's
    // decoding rows and, chunked, the next chunks of the prefills under way.
    int64_t rows = 0;
    for (const auto& a : running) rows += a->prefill_done ? 1 : 0;
    for (const auto& a : running)
      if (!a->prefill_done)  // chunked prefills still running take their next chunk first
        rows += std::min({cfg.chunk_tokens, reqs[a->idx].prompt_tokens - a->prefilled,
                          std::max<int64_t>(cfg.max_batch_tokens - rows, 0)});
    Admission admission(limits, reserved, rows);
    while (!queue.empty()) {
      const ServingRequest& h = reqs[queue.front()];
      const double res = reservation_bytes(c, kv, h.prompt_tokens, h.output_tokens, pruning);
      if (!admission.fits(res, h.prompt_tokens)) break;
      admission.take(res, h.prompt_tokens);
      auto a = std::make_unique<Active>();
      a->idx = queue.front();
      queue.pop_front();
      a->reservation = res;
      reserved += res;
      a->steps.emplace(c, m.method.policy_name(), m.steps, h.prompt_tokens, h.output_tokens - 1,
                       revivals ? trace::Revivals{} : m.revivals);
      if (revivals) a->steps->use_table(revivals);
      a->steps->only_run_starts(seg_start);  // add_step reads the first layer of each run
      RequestOutcome& o = run.requests[a->idx];
      o.arrival_s = h.arrival_s, o.admitted_s = t;
      o.prompt_tokens = h.prompt_tokens, o.output_tokens = h.output_tokens;
      running.push_back(std::move(a));
    }

    // The batch: every running request's step (a chunk for a chunked prefill before its last).
    static_assert(std::is_trivially_copyable_v<LayerWork> && std::is_trivially_copyable_v<OwnGemms>);
    std::memset(static_cast<void*>(work.data()), 0, work.size() * sizeof(LayerWork));  // LayerWork{}: zeros
    std::memset(static_cast<void*>(own.data()), 0, own.size() * sizeof(OwnGemms));
    std::fill(moved.begin(), moved.end(), 0);
    int64_t new_rows = 0, logit_rows = 0, budget = cfg.max_batch_tokens;
    for (const auto& a : running) budget -= a->prefill_done ? 1 : 0;
    for (auto& a : running) {
      const ServingRequest& r = reqs[a->idx];
      if (a->prefill_done) {
        a->steps->next(a->step);
        a->kv_next = add_step(a->step, false);
        new_rows += 1, logit_rows += 1;
        continue;
      }
      const int64_t left = r.prompt_tokens - a->prefilled;
      const int64_t chunk =
          cfg.chunk_tokens > 0 ? std::min({cfg.chunk_tokens, left, std::max<int64_t>(budget, 0)}) : left;
      if (chunk <= 0) continue;  // no budget left this iteration
      budget -= chunk;
      new_rows += chunk;
      if (chunk < left) {  // an earlier chunk: every layer, attending the prefix and itself
        const int64_t pre = a->prefilled;
        for (size_t k = 0; k < S; ++k) {
          LayerWork& w = work[k];
          gemm_rows(k, chunk);
          w.rows += chunk;
          w.pairs += chunk * pre + chunk * (chunk + 1) / 2;
          w.keys += pre + chunk;
        }
        a->prefilled += chunk;
        continue;
      }
      // The prefill (whole, or its last chunk): the synthetic prefill of the whole prompt; a last
      // chunk of `chunk` rows after `pre` computed ones keeps the same share of its rows at each
      // layer, attends every earlier token (their K/V exist at every layer) and its own kept rows.
      a->steps->next(a->step);
      if (a->prefilled == 0) {
        a->kv_next = add_step(a->step, true);
      } else {
        const int64_t pre = a->prefilled, T = r.prompt_tokens;
        trace::Step& s = a->step;
        for (int l = 0; l < L; ++l) {
          const int64_t q = (s.queries[size_t(l)] * chunk + T - 1) / T;
          s.queries[size_t(l)] = q;
          s.pairs[size_t(l)] = q * pre + q * (q + 1) / 2;
          s.keys[size_t(l)] = pre + q;
          if (s.aux_writes[size_t(l)] > 0)
            s.aux_writes[size_t(l)] = std::max<int64_t>(s.aux_writes[size_t(l)] * chunk / T, 1);
        }
        a->kv_next = add_step(s, true);
      }
      a->prefilled = r.prompt_tokens;
      a->prefilled_now = true;
      logit_rows += 1;
    }
    const double dt =
        (cost(work, own, moved, seg_start, seg_len, new_rows, logit_rows) + cfg.iteration_overhead_s) *
        cfg.time_scale;
    // K/V utilisation over the iteration (what it held at its start), time-weighted.
    run.kv_reserved_mean += reserved * dt;
    run.kv_reserved_peak = std::max(run.kv_reserved_peak, reserved);
    if (run.iterations % kv_stride == 0) {
      run.kv.push_back({t, reserved, used});
      if (int64_t(run.kv.size()) >= 2 * std::max<int64_t>(cfg.kv_samples, 1)) {
        for (size_t i = 0; 2 * i < run.kv.size(); ++i) run.kv[i] = run.kv[2 * i];
        run.kv.resize((run.kv.size() + 1) / 2);
        kv_stride *= 2;
      }
    }
    t += dt;
    ++run.iterations;

    // Tokens out; finished requests leave.
    for (auto& a : running) {
      const ServingRequest& r = reqs[a->idx];
      RequestOutcome& o = run.requests[a->idx];
      if (!a->prefill_done) {
        if (!a->prefilled_now) continue;  // a chunk before the last
        a->prefilled_now = false;
        a->prefill_done = true;
        o.first_token_s = t;
        o.prompt_share = trace::prefill_computed_fraction(a->step, r.prompt_tokens);
      }
      ++a->generated;
      used += a->kv_next - a->kv_used;
      a->kv_used = a->kv_next;
      if (a->generated >= r.output_tokens) o.finished_s = t;
    }
    for (size_t i = 0; i < running.size();) {
      Active& a = *running[i];
      if (a.prefill_done && a.generated >= reqs[a.idx].output_tokens) {
        reserved -= a.reservation;
        used -= a.kv_used;
        running[i] = std::move(running.back());
        running.pop_back();
        ++done;
      } else {
        ++i;
      }
    }
  }
  run.end_s = t;
  const double span = run.requests.empty() ? 0 : t - run.requests.front().arrival_s;
  if (span > 0) run.kv_reserved_mean /= span;
  return run;
}

}  // namespace

ServingRun simulate_serving(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                            const ServingMethod& m, const ServingConfig& cfg,
                            std::span<const ServingRequest> reqs) {
  if (!policy_traits(m.method.policy).drops_prompt) return simulate_requests(c, hw, p, m, cfg, reqs);
  // random-drop: every request's prompt shorter before the model, then served unpruned; the
  // outcomes keep the prompts as sent, and the share of their pairs computed says what was dropped.
  std::vector<ServingRequest> shorter(reqs.begin(), reqs.end());
  for (ServingRequest& r : shorter)
    if (r.prompt_tokens >= 1) r.prompt_tokens = random_drop_kept(r.prompt_tokens, m.drop_share);
  ServingMethod plain = m;
  plain.steps.clear();
  plain.revivals = {};
  ServingRun run = simulate_requests(c, hw, p, plain, cfg, shorter);
  for (size_t i = 0; i < run.requests.size() && i < reqs.size(); ++i) {
    RequestOutcome& o = run.requests[i];
    o.prompt_share *= double(o.prompt_tokens) / double(reqs[i].prompt_tokens);
    o.prompt_tokens = reqs[i].prompt_tokens;
  }
  return run;
}

}  // namespace lp::sim
