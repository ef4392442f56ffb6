#include "sim/fit_measurements.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "model/error.h"
#include "model/presets.h"
#include "sim/bobyqa.h"
#include "sim/replay.h"
#include "traces/schedule.h"
#include "traces/synthetic.h"

namespace lp::sim {
namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Lower case, '_' and ' ' as '-', runs of '-' collapsed, no '-' at either end.
std::string dashed(const std::string& s) {
  std::string out;
  for (char ch : lower(s)) {
    if (ch == '_' || ch == ' ') ch = '-';
    if (ch == '-' && (out.empty() || out.back() == '-')) continue;
    out += ch;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

std::string model_key(std::string s) {
  if (const size_t slash = s.find_last_of('/'); slash != std::string::npos) s.erase(0, slash + 1);
  s = dashed(s);
  if (s.ends_with(".gguf")) s.resize(s.size() - 5);
  if (s.starts_with("meta-")) s.erase(0, 5);
  return s;
}

double mape(const std::vector<Point>& pts, const std::vector<double>& pred, bool ttft, int* count) {
  double sum = 0;
  int n = 0;
  for (size_t i = 0; i < pts.size(); ++i)
    if (pts[i].ttft == ttft) {
      sum += std::fabs(pred[i] / pts[i].measured_s - 1);
      ++n;
    }
  if (count) *count = n;
  return n ? sum / n : std::numeric_limits<double>::quiet_NaN();
}

// A parameter is identified when a 10% change of it moves the predictions by at least 0.5% RMS
// in a way the parameters accepted before it cannot reproduce.
constexpr double kMinElasticity = 0.05;
// F-to-enter of forward stepwise regression: the drop in the squared log error a parameter brings,
// over the remaining error per degree of freedom. A parameter asked for with --fit needs only to
// pay for itself: F >= 2, about Akaike's criterion.
constexpr double kMinRequestedF = 2;

// Any other must reach the 5% point of F(1, dof): the square of Student's t at 0.975 (standard
// table; 1.96 for dof -> infinity).
double f_to_enter(double dof) {
  static constexpr double t975[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                    2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                    2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (dof < 1) return std::numeric_limits<double>::infinity();
  double t;
  if (dof <= 30) {
    t = t975[size_t(dof) - 1];
  } else {  // linear in 1/dof between 30 (2.042), 60 (2.000), 120 (1.980) and infinity (1.960)
    const double x = 1 / dof;
    t = x >= 1.0 / 60 ? 2.000 + (2.042 - 2.000) * (x - 1.0 / 60) / (1.0 / 30 - 1.0 / 60)
        : x >= 1.0 / 120 ? 1.980 + (2.000 - 1.980) * (x - 1.0 / 120) / (1.0 / 60 - 1.0 / 120)
                         : 1.960 + (1.980 - 1.960) * x / (1.0 / 120);
  }
  return t * t;
}

// Bounds of each parameter (in its own unit): shares of a peak, or microseconds.
std::pair<double, double> bounds(const std::string& name) {
  if (name == "overhead_us") return {0.01, 5000};
  if (name == "gemm.half_rows") return {0.01, 4096};
  return {0.01, 1};
}

}  // namespace

std::optional<std::string> match_preset(const std::string& file_name, const std::map<std::string, std::string>& map) {
  if (const auto it = map.find(file_name); it != map.end()) return it->second;
  const std::string key = model_key(file_name);
  std::optional<std::string> best;
  for (const std::string& p : preset_names()) {
    const bool match = key == p || (key.size() > p.size() && key.starts_with(p) && (key[p.size()] == '-' || key[p.size()] == '.'));
    if (match && (!best || p.size() > best->size())) best = p;  // the most specific
  }
  return best;
}

std::optional<std::string> match_profile(const std::string& file_name, const std::map<std::string, std::string>& map) {
  if (const auto it = map.find(file_name); it != map.end()) return it->second;
  const std::string key = dashed(file_name);
  for (const std::string& name : hw::builtin_profile_names()) {
    if (dashed(name) == key) return name;
    for (const std::string& alias : hw::load_profile(name).aliases)
      if (dashed(alias) == key) return name;
  }
  return std::nullopt;
}

Precision precision_for_dtype(const std::string& dtype) {
  const std::string d = dashed(dtype);
  Precision p;  // bf16 throughout
  const auto weights = [&](const char* w, const char* compute) {
    p.weights = w;
    p.compute = compute;
    p.kv = "f16";
    return p;
  };
  if (d.empty() || d == "auto" || d == "bf16" || d == "bfloat16") return p;
  if (d == "f16" || d == "fp16" || d == "float16" || d == "half") return {"f16", "f16", "f16"};
  if (d == "f32" || d == "fp32" || d == "float32" || d == "float") return {"f32", "f32", "f32"};
  if (d == "fp8" || d == "int8" || d == "w8a8" || d == "fp8-e4m3") return {"int8", "int8", "int8"};
  if (d == "q8-0") return weights("int8", "f16");
  if (d.starts_with("q2-k") || d.starts_with("q3-k") || d.starts_with("q4") || d.starts_with("q5") ||
      d.starts_with("q6-k") || d.starts_with("iq4") || d == "awq" || d == "gptq" || d == "int4")
    return weights("q4", "f16");
  fail("unknown weight type '{}' (known: bf16, f16, f32, fp8, int8, Q8_0, Q4_0/Q4_1/Q4_K/Q5/Q6_K, IQ4, awq, gptq; "
       "or give --weights/--compute/--kv)",
       dtype);
}

Point make_point(const Measurement& m, const std::string& preset, const ModelConfig& model, const Precision& p) {
  Point pt;
  pt.m = &m;
  pt.preset = preset;
  pt.model = model;
  pt.precision = p;
  pt.ttft = m.ttft_ms.has_value();
  pt.measured_s = (pt.ttft ? *m.ttft_ms : *m.decode_ms_per_token) * 1e-3;
  // "none", or "<policy> <schedule>" as run --json and the CSV write it.
  std::string policy = m.method, sched;
  if (const size_t sp = m.method.find(' '); sp != std::string::npos) {
    policy = m.method.substr(0, sp);
    sched = m.method.substr(sp + 1);
  }
  if (policy != "none" && policy != "lazyllm" && policy != "static" && policy != "random")
    fail("{}: record {}: method '{}' is not none, lazyllm, static or random", m.file, m.record, m.method);
  std::vector<PruneStep> steps;
  if (policy != "none") {
    try {
      steps = resolve_schedule(sched.empty() ? default_schedule() : schedule_from_arg(sched), model.n_layer);
    } catch (const Error& e) {
      fail("{}: record {}: {}", m.file, m.record, e.what());
    }
  }
  // A decode latency is a mean over the output: one step at the middle of it.
  const int64_t prompt = pt.ttft ? m.prompt_tokens : std::max<int64_t>(1, m.context_tokens + m.decode_tokens / 2);
  if (model.n_ctx_train > 0 && prompt + (pt.ttft ? 0 : 1) > model.n_ctx_train)
    fail("{}: record {}: {} tokens exceed {}'s context of {}", m.file, m.record, prompt, preset, model.n_ctx_train);
  pt.work = trace::synthetic_trace(model, policy, steps, prompt, pt.ttft ? 0 : 1);
  return pt;
}

double predict_point(const hw::Profile& hw, const Point& pt) {
  const Prediction r = replay(pt.work, pt.model, hw, pt.precision, pt.m->batch, pt.m->tp);
  return pt.ttft ? r.ttft_s : r.decode_step_s.at(0);
}

const std::vector<std::string>& fit_candidates() {
  static const std::vector<std::string> c = {"gemm.compute",   "overhead_us",    "attention.compute",
                                             "gemm.half_rows", "gemm.memory",    "interconnect"};
  return c;
}

double get_param(const hw::Profile& p, const std::string& name) {
  if (name == "gemm.compute") return p.eff(hw::Family::Gemm).compute;
  if (name == "attention.compute") return p.eff(hw::Family::Attention).compute;
  if (name == "gemm.memory") return p.eff(hw::Family::Gemm).memory;
  if (name == "gemm.half_rows") return p.eff(hw::Family::Gemm).half_rows;
  if (name == "interconnect") return p.interconnect_efficiency;
  if (name == "overhead_us") {
    double s = 0;
    for (const hw::Efficiency& e : p.efficiency) s += e.overhead_s;
    return s / hw::kNumFamilies * 1e6;
  }
  usage_fail("unknown parameter '{}' (known: gemm.compute, overhead_us, attention.compute, gemm.half_rows, gemm.memory, "
             "interconnect)",
             name);
}

void set_param(hw::Profile& p, const std::string& name, double v) {
  if (name == "gemm.compute") p.efficiency[size_t(hw::Family::Gemm)].compute = v;
  else if (name == "attention.compute") p.efficiency[size_t(hw::Family::Attention)].compute = v;
  else if (name == "gemm.memory") p.efficiency[size_t(hw::Family::Gemm)].memory = v;
  else if (name == "gemm.half_rows") p.efficiency[size_t(hw::Family::Gemm)].half_rows = v;
  else if (name == "interconnect") p.interconnect_efficiency = v;
  else if (name == "overhead_us")
    for (hw::Efficiency& e : p.efficiency) e.overhead_s = v * 1e-6;
  else get_param(p, name);  // the error
}

namespace {

struct Problem {
  const hw::Profile* base;
  const std::vector<Point>* points;
  std::vector<size_t> use;  // indices of the points to fit
  std::vector<std::string> params;
};

hw::Profile with(const Problem& pr, const double* x) {
  hw::Profile p = *pr.base;
  for (size_t k = 0; k < pr.params.size(); ++k) set_param(p, pr.params[k], std::exp(x[k]));
  return p;
}

double objective(unsigned n, const double* x, double* grad, void* data) {
  (void)n;
  (void)grad;
  const Problem& pr = *static_cast<const Problem*>(data);
  const hw::Profile p = with(pr, x);
  double sum = 0;
  for (size_t i : pr.use) {
    const Point& pt = (*pr.points)[i];
    const double r = std::log(predict_point(p, pt) / pt.measured_s);
    sum += r * r;
  }
  return sum;
}

// The base with `params` fitted to the points `use`.
hw::Profile fit_subset(const hw::Profile& base, const std::vector<Point>& points, const std::vector<size_t>& use,
                       const std::vector<std::string>& params) {
  Problem pr{&base, &points, use, params};
  const unsigned k = unsigned(params.size());
  std::vector<double> x(k), lo(k), hi(k);
  for (unsigned j = 0; j < k; ++j) {
    const auto [a, b] = bounds(params[j]);
    lo[j] = std::log(a);
    hi[j] = std::log(b);
    x[j] = std::clamp(std::log(std::max(get_param(base, params[j]), a)), lo[j], hi[j]);
  }
  minimize_bobyqa(k, x.data(), lo.data(), hi.data(), objective, &pr, 2000, 1e-7, "the fit");
  return with(pr, x.data());
}

}  // namespace

hw::Profile fit_measurements(const hw::Profile& base, const std::vector<Point>& points,
                             const std::vector<std::string>& requested, MeasurementFit* out) {
  const size_t n = points.size();
  if (n < 3) fail("{} usable measurement(s): calibration needs at least 3 points (one parameter and a held-out check)", n);
  MeasurementFit f;
  const auto predict_all = [&](const hw::Profile& p) {
    std::vector<double> v;
    for (const Point& pt : points) v.push_back(predict_point(p, pt));
    return v;
  };
  f.base_s = predict_all(base);

  // Forward stepwise selection: each round tries every remaining candidate (fitted together with
  // the accepted ones), and accepts the one that lowers the squared log error most, if it is
  // identifiable at that fit (independent elasticity) and the improvement is significant (F).
  const size_t max_params = n - 2;
  const size_t decode_points = size_t(std::count_if(points.begin(), points.end(), [](const Point& p) { return !p.ttft; }));
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  const auto sum_sq = [&](const hw::Profile& p) {
    double ss = 0;
    for (const Point& pt : points) {
      const double r = std::log(predict_point(p, pt) / pt.measured_s);
      ss += r * r;
    }
    return ss;
  };
  // d log(predicted) per relative change of the parameter, in units of its base value (so a
  // parameter fitted to its lower bound, an overhead near zero, keeps the elasticity it had):
  // central differences of +-5% of the base value around the value at `at`.
  const auto elasticities = [&](const hw::Profile& at, const std::string& name) {
    const auto [lo, hi] = bounds(name);
    const double ref = std::max(get_param(base, name), lo);
    const double v = get_param(at, name);
    const double a = std::max(lo, v - 0.05 * ref), b = std::min(hi, v + 0.05 * ref);
    hw::Profile up = at, down = at;
    set_param(up, name, b);
    set_param(down, name, a);
    std::vector<double> col(n);
    for (size_t i = 0; i < n; ++i)
      col[i] = (std::log(predict_point(up, points[i])) - std::log(predict_point(down, points[i]))) / ((b - a) / ref);
    return col;
  };
  // RMS of `col`, and of the part of it that the columns of `params` at `at` cannot reproduce.
  const auto independence = [&](const hw::Profile& at, const std::vector<double>& col,
                                const std::vector<std::string>& params) {
    std::vector<std::vector<double>> basis;  // orthonormal (Gram-Schmidt)
    for (const std::string& q : params) {
      std::vector<double> v = elasticities(at, q);
      for (const auto& o : basis) {
        double dot = 0;
        for (size_t i = 0; i < n; ++i) dot += v[i] * o[i];
        for (size_t i = 0; i < n; ++i) v[i] -= dot * o[i];
      }
      double vv = 0;
      for (double e : v) vv += e * e;
      if (vv <= 1e-30) continue;
      for (double& e : v) e /= std::sqrt(vv);
      basis.push_back(std::move(v));
    }
    std::vector<double> r = col;
    for (const auto& o : basis) {
      double dot = 0;
      for (size_t i = 0; i < n; ++i) dot += r[i] * o[i];
      for (size_t i = 0; i < n; ++i) r[i] -= dot * o[i];
    }
    double ss = 0, rr = 0;
    for (double e : col) ss += e * e;
    for (double e : r) rr += e * e;
    return std::pair{std::sqrt(ss / double(n)), std::sqrt(rr / double(n))};
  };

  std::vector<ParamCheck> checks;
  for (const std::string& name : fit_candidates()) {
    ParamCheck c;
    c.name = name;
    const bool wanted = requested.empty() || std::find(requested.begin(), requested.end(), name) != requested.end();
    if (!wanted) c.reason = "not requested";
    // Prefill GEMMs of short prompts can look memory-bound or row-starved; a TTFT-only fit would
    // use these to absorb their fixed costs and then mispredict every decoding step.
    if (wanted && (name == "gemm.memory" || name == "gemm.half_rows") && decode_points == 0)
      c.reason = "only decode latencies identify it (no decode points)";
    checks.push_back(c);
  }
  hw::Profile current = base;
  double ss_current = sum_sq(base);
  for (;;) {
    int best = -1;
    hw::Profile best_fit = base;
    double best_ss = 0;
    for (size_t k = 0; k < checks.size(); ++k) {
      ParamCheck& c = checks[k];
      if (c.fitted || c.reason == "not requested" || c.reason.starts_with("only decode")) continue;
      if (f.params.size() >= max_params) {
        c.reason = fmt::format("{} points identify at most {} parameters (n - 2)", n, max_params);
        continue;
      }
      std::vector<std::string> trial_params = f.params;
      trial_params.push_back(c.name);
      const hw::Profile trial = fit_subset(base, points, all, trial_params);
      const double ss = sum_sq(trial);
      // Identifiability at the current fit with the candidate at its base value: where the trial
      // drives it (to a bound, say) its elasticity may vanish although the data do depend on it.
      std::tie(c.sensitivity, c.independent) = independence(current, elasticities(current, c.name), f.params);
      const double dof = double(n - trial_params.size());
      const double gain = std::max(0.0, ss_current - ss);
      c.f_stat = ss > 1e-24 ? gain / (ss / dof) : (gain > 1e-24 ? std::numeric_limits<double>::infinity() : 0);
      if (c.independent < kMinElasticity) {
        c.reason = c.sensitivity < kMinElasticity
                       ? fmt::format("the points barely depend on it (RMS elasticity {:.3f} < {})", c.sensitivity,
                                     kMinElasticity)
                       : fmt::format("the parameters fitted before it already explain its effect (independent "
                                     "elasticity {:.3f} < {})",
                                     c.independent, kMinElasticity);
      } else if (!requested.empty() && c.f_stat < kMinRequestedF) {
        c.reason = fmt::format("it does not improve the fit (F = {:.2f} < {})", c.f_stat, kMinRequestedF);
      } else if (requested.empty() && c.f_stat < f_to_enter(dof)) {
        c.reason = fmt::format("it does not improve the fit significantly (F = {:.2f} < {:.2f}, the 5% point of "
                               "F(1, {:.0f}); --fit {} asks for it anyway)",
                               c.f_stat, f_to_enter(dof), dof, c.name);
      } else {
        c.reason.clear();
        if (best < 0 || ss < best_ss) {
          best = int(k);
          best_fit = trial;
          best_ss = ss;
        }
      }
    }
    if (best < 0) break;
    checks[size_t(best)].fitted = true;
    f.params.push_back(checks[size_t(best)].name);
    current = best_fit;
    ss_current = best_ss;
  }
  // The fitted parameters in candidate order (the rounds' order is in the report's reasons).
  std::vector<std::string> ordered;
  for (const ParamCheck& c : checks)
    if (c.fitted) ordered.push_back(c.name);
  f.params = ordered;
  f.checks = checks;
  for (const std::string& name : requested) {
    const auto it = std::find_if(f.checks.begin(), f.checks.end(), [&](const ParamCheck& c) { return c.name == name; });
    if (it == f.checks.end()) get_param(base, name);  // unknown name: the error lists the known ones
    if (!it->fitted) usage_fail("cannot fit {}: {}", name, it->reason);
  }
  if (f.params.empty()) {
    std::string why;
    for (const ParamCheck& c : f.checks)
      if (c.reason != "not requested") why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", c.name, c.reason);
    fail("these {} points identify no parameter of '{}' ({})", n, base.name, why);
  }

  const hw::Profile fitted = fit_subset(base, points, all, f.params);
  f.fit_s = predict_all(fitted);
  for (ParamCheck& c : f.checks)
    if (c.fitted) {
      const auto [lo, hi] = bounds(c.name);
      const double v = get_param(fitted, c.name);
      c.at_bound = v <= lo * 1.001 || v >= hi * 0.999;
    }

  // Cross-validation: every point predicted by a fit that did not see it.
  const size_t folds = n <= 30 ? n : 10;
  f.cv = n <= 30 ? "leave-one-out" : "10-fold";
  f.heldout_s.assign(n, 0);
  for (size_t k = 0; k < folds; ++k) {
    std::vector<size_t> train;
    for (size_t i = 0; i < n; ++i)
      if (i % folds != k) train.push_back(i);
    const hw::Profile p = fit_subset(base, points, train, f.params);
    for (size_t i = k; i < n; i += folds) f.heldout_s[i] = predict_point(p, points[i]);
  }
  f.ttft_mape_base = mape(points, f.base_s, true, &f.ttft_points);
  f.ttft_mape_fit = mape(points, f.fit_s, true, nullptr);
  f.ttft_mape_heldout = mape(points, f.heldout_s, true, nullptr);
  f.decode_mape_base = mape(points, f.base_s, false, &f.decode_points);
  f.decode_mape_fit = mape(points, f.fit_s, false, nullptr);
  f.decode_mape_heldout = mape(points, f.heldout_s, false, nullptr);
  if (out) *out = std::move(f);
  hw::Profile result = fitted;
  result.efficiency_default = false;
  return result;
}

}  // namespace lp::sim
