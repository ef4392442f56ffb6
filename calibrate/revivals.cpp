#include "calibrate/revivals.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "calibrate/bobyqa.h"
#include "model/error.h"
#include "pruning/policy.h"
#include "sim/replay.h"
#include "traces/synthetic.h"

namespace lp::calib {

using sim::RevivalModel;
using sim::RevivalStage;

namespace {

struct StagePoints {
  std::vector<double> step, share;
};

double stage_sse(unsigned n, const double* x, double* grad, void* data) {
  (void)n;
  (void)grad;
  const auto& p = *static_cast<const StagePoints*>(data);
  RevivalStage st;
  st.start = x[0];
  st.floor = x[1];
  st.tau_steps = x[2];
  double sse = 0;
  for (size_t i = 0; i < p.step.size(); ++i) {
    const double r = st.share(int64_t(p.step[i])) - p.share[i];
    sse += r * r;
  }
  return sse;
}

}  // namespace

std::vector<std::vector<double>> observed_revival_shares(const trace::Trace& t) {
  const int L = t.header.n_layer;
  const size_t P = t.header.schedule_layers.size();
  std::vector<std::vector<double>> out(P);
  for (size_t s = 1; s < t.steps.size(); ++s) {
    const trace::Step& st = t.steps[s];
    for (size_t i = 0; i < P; ++i) {
      const int l = t.header.schedule_layers[i].first + 1;
      double share = std::numeric_limits<double>::quiet_NaN();
      if (l < L && size_t(l) < st.attended.size() && st.attended[size_t(l)] > 1)
        share = double(st.revived[size_t(l)]) / double(st.attended[size_t(l)] - 1);
      out[i].push_back(share);
    }
  }
  return out;
}

RevivalModel fit_revival_model(const std::vector<trace::Trace>& traces, const std::vector<std::string>& names,
                               const std::vector<std::string>& sha256s) {
  if (traces.empty()) usage_fail("calibrate-revivals needs at least one trace");
  const trace::Trace& t0 = traces[0];
  RevivalModel m;
  m.policy = t0.header.policy;
  m.n_layer = t0.header.n_layer;
  m.model = t0.header.model.value("name", std::string());
  m.schedule = t0.header.schedule;
  for (size_t k = 0; k < traces.size(); ++k) {
    const trace::Trace& t = traces[k];
    const std::string& name = names.at(k);
    const std::optional<PolicyKind> kind = policy_in_file(t.header.policy);  // the trace reader checked it
    if (!kind || !policy_revives(*kind))
      fail("{}: a {} run has no revivals to fit (record one with run --prune lazyllm --trace)", name,
           t.header.policy);
    if (t.header.policy != m.policy)
      fail("{}: a {} run, but {} is a {} run: fit one policy at a time", name, t.header.policy, names[0],
           m.policy);
    if (t.header.n_layer != m.n_layer)
      fail("{}: {} layers, but {} has {}: fit one model at a time", name, t.header.n_layer, names[0],
           m.n_layer);
    if (t.header.schedule_layers != t0.header.schedule_layers)
      fail("{}: schedule {} differs from {} in {}: fit one schedule at a time", name, t.header.schedule,
           t0.header.schedule, names[0]);
    if (t.steps.size() < 2) fail("{}: no decoding steps (record with run --max-new-tokens 2 or more)", name);
    for (size_t s = 1; s < t.steps.size(); ++s)
      if (t.steps[s].attended.empty())
        fail("{}: decoding step {} lacks 'attended' (a trace written before it existed): record it again",
             name, s);
    m.traces.push_back({name, sha256s.at(k), t.header.prompt_tokens, int64_t(t.steps.size()) - 1});
  }
  const size_t P = t0.header.schedule_layers.size();
  if (P == 0) fail("{}: its schedule has no pruning layer", names[0]);
  std::vector<StagePoints> pts(P);
  std::vector<double> running(P, 0), kept(P, 0);        // rows revived earlier reaching / passing each stage
  std::vector<double> row_pairs(P, 0), row_keys(P, 0);  // running rows' pairs / (rows x active keys)
  for (const trace::Trace& t : traces) {
    for (size_t s = 1; s < t.steps.size(); ++s)
      for (size_t i = 0; i < P; ++i) {
        const int p = t.header.schedule_layers[i].first;
        if (p + 1 >= m.n_layer) continue;
        const trace::Step& st = t.steps[s];
        running[i] += double(st.queries[size_t(p)] - 1);
        kept[i] += double(st.queries[size_t(p) + 1] - 1 - st.revived[size_t(p) + 1]);
        const int end = i + 1 < P ? t.header.schedule_layers[i + 1].first + 1 : m.n_layer;
        for (int l = p + 1; l < end; ++l) {
          row_pairs[i] += double(st.pairs[size_t(l)] - st.attended[size_t(l)]);
          row_keys[i] += double(st.queries[size_t(l)] - 1) * double(st.attended[size_t(l)]);
        }
      }
    const auto obs = observed_revival_shares(t);
    for (size_t i = 0; i < P; ++i)
      for (size_t s = 0; s < obs[i].size(); ++s)
        if (std::isfinite(obs[i][s])) {
          pts[i].step.push_back(double(s + 1));
          pts[i].share.push_back(obs[i][s]);
        }
  }
  for (size_t i = 0; i < P; ++i) {
    RevivalStage st;
    st.layer = t0.header.schedule_layers[i].first;
    st.prune_share = t0.header.schedule_layers[i].second;
    st.depth = double(st.layer + 1) / double(m.n_layer);
    st.points = int64_t(pts[i].step.size());
    if (running[i] > 0) st.survival = std::clamp(kept[i] / running[i], 0.0, 1.0);
    if (row_keys[i] > 0) st.key_share = std::clamp(row_pairs[i] / row_keys[i], 0.0, 1.0);
    if (st.points > 0) {
      // Start from the first step's mean share decaying to the last steps' mean.
      double first = 0, last = 0;
      int64_t nf = 0, nl = 0;
      const double smax = *std::max_element(pts[i].step.begin(), pts[i].step.end());
      for (size_t k = 0; k < pts[i].step.size(); ++k) {
        if (pts[i].step[k] == 1) first += pts[i].share[k], ++nf;
        if (pts[i].step[k] >= 0.75 * smax) last += pts[i].share[k], ++nl;
      }
      double x[3] = {nf ? first / double(nf) : pts[i].share[0], nl ? last / double(nl) : 0, 4};
      x[2] = std::clamp(smax / 4, 1.0, RevivalStage::kTauMax);
      const double lo[3] = {0, 0, RevivalStage::kTauMin}, hi[3] = {1, 1, RevivalStage::kTauMax};
      for (int d = 0; d < 3; ++d) x[d] = std::clamp(x[d], lo[d], hi[d]);
      const std::string what = fmt::format("the revival fit at pruning layer {}", st.layer);
      const OptimizerStatus os = minimize_bobyqa(3, x, lo, hi, stage_sse, &pts[i], 4000, 1e-10, what.c_str());
      st.start = x[0];
      st.floor = x[1];
      st.tau_steps = x[2];
      st.rms_error = std::sqrt(os.best / double(st.points));
    }
    m.stages.push_back(st);
  }
  return m;
}

namespace {
double rows_per_step(const trace::Trace& t) {
  if (t.steps.size() < 2) return 0;
  double rows = 0;
  for (size_t s = 1; s < t.steps.size(); ++s)
    for (int64_t q : t.steps[s].queries) rows += double(q);
  return rows / double(t.steps.size() - 1);
}
}  // namespace

RevivalCheck check_revival_model(const sim::RevivalModel& m, const trace::Trace& t, const std::string& name,
                                 const hw::Profile& hw, const sim::Precision& p, bool map) {
  if (t.header.policy == "none" || t.header.schedule_layers.empty())
    usage_fail("{}: an unpruned run; --held-out takes pruned runs", name);
  if (t.steps.size() < 2) usage_fail("{}: no decoding steps to compare", name);
  ModelConfig c = config_from_json(t.header.model, name + ": header model");
  if (c.n_ctx_train <= 0) c.n_ctx_train = int(t.header.prompt_tokens + int64_t(t.steps.size()));
  std::vector<PruneStep> steps;
  for (const auto& [layer, share] : t.header.schedule_layers) steps.push_back({layer, share});
  RevivalCheck r;
  r.trace = name;
  r.prompt_tokens = t.header.prompt_tokens;
  r.decode_steps = int64_t(t.steps.size()) - 1;
  const trace::Trace modelled =
      trace::synthetic_trace(c, t.header.policy, steps, t.header.prompt_tokens, r.decode_steps,
                             sim::revival_shares(m, c.n_layer, steps, map));
  const trace::Trace bound =
      trace::synthetic_trace(c, t.header.policy, steps, t.header.prompt_tokens, r.decode_steps);
  const sim::Prediction pr = sim::replay(t, c, hw, p);
  const sim::Prediction pm = sim::replay(modelled, c, hw, p);
  const sim::Prediction pb = sim::replay(bound, c, hw, p);
  const auto figures = [](const sim::Prediction& x, const trace::Trace& tr) {
    return RevivalCheck::Figures{x.memory.kv, x.memory.aux, rows_per_step(tr), x.decode_step_mean_s()};
  };
  r.replayed = figures(pr, t);
  r.model = figures(pm, modelled);
  r.share_0 = figures(pb, bound);
  for (size_t s = 0; s < pr.decode_step_s.size(); ++s)
    r.worst_step_error =
        std::max(r.worst_step_error, std::abs(RevivalCheck::rel(pm.decode_step_s[s], pr.decode_step_s[s])));
  return r;
}

}  // namespace lp::calib
