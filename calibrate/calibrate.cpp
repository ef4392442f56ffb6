#include "calibrate/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "calibrate/bobyqa.h"
#include "model/error.h"

namespace lp::calib {

using namespace sim;

namespace {
using json = nlohmann::json;

Op op_by_name(const std::string& name, const std::string& origin) {
  for (int i = 0; i < kNumOps; ++i)
    if (op_name(Op(i)) == name) return Op(i);
  fail("{}: unknown op '{}' in ops", origin, name);
}

void read_ops(const json& row, int layer, const std::string& origin, std::vector<OpSample>& out) {
  if (!row.is_object()) fail("{}: ops.prefill layer {} is not an object", origin, layer);
  for (const auto& [name, v] : row.items()) {
    OpSample s;
    s.op = op_by_name(name, origin);
    s.layer = layer;
    try {
      s.seconds = v.at("ms").get<double>() * 1e-3;
      s.flops = v.at("flop").get<double>();
      s.bytes = v.at("bytes").get<double>();
      s.rows = v.at("rows").get<double>();
      s.calls = v.at("calls").get<int64_t>();
    } catch (const json::exception& e) {
      fail("{}: ops.prefill op '{}' (layer {}): {}", origin, name, layer, e.what());
    }
    if (!(s.seconds >= 0) || !(s.flops >= 0) || !(s.bytes >= 0) || s.calls < 1 || !(s.rows >= 0))
      fail("{}: ops.prefill op '{}' (layer {}) has a negative or missing count", origin, name, layer);
    out.push_back(s);
  }
}

// The fitted parameters in an unconstrained-ish space: log compute, log(1 + half_rows), log
// memory, log(overhead + 1e-9).
struct Params {
  double compute, half_rows, memory, overhead_s;
};
std::array<double, 4> to_x(const hw::Efficiency& e) {
  return {std::log(e.compute), std::log1p(e.half_rows), std::log(e.memory), std::log(e.overhead_s + 1e-9)};
}
hw::Efficiency from_x(const double* x) {
  return {std::exp(x[0]), std::expm1(x[1]), std::exp(x[2]), std::max(0.0, std::exp(x[3]) - 1e-9)};
}

double sample_time(const hw::Profile& hw, const hw::Efficiency& e, const OpSample& s,
                   const std::string& compute, double share) {
  const std::string dtype = hw::family_dtype(op_family(s.op), compute);
  const double peak = hw.peak(dtype) * share;
  const double rows = s.op == Op::Score ? 1.0 : std::max(1.0, s.rows);
  const double c = s.flops > 0 ? s.flops / (peak * e.compute_for(dtype) * rows / (rows + e.half_rows)) : 0;
  const double m = s.bytes / (hw.memory_bandwidth * share * e.memory);
  // A select is where a pruning stage's fixed cost lands (as replay charges it).
  const double stage = s.op == Op::Select ? double(s.calls) * hw.pruning_stage_s : 0;
  return std::max(c, m) + double(s.calls) * e.overhead_s + stage;
}

struct FitData {
  const hw::Profile* hw;
  const std::vector<const OpSample*>* samples;
  const std::vector<double>* weights;
  const std::vector<std::string>* compute;
  const std::vector<double>* shares;
  hw::Efficiency base;
  bool fit_half_rows;
};

double huber(double r, double delta) {
  const double a = std::fabs(r);
  return a <= delta ? 0.5 * r * r : delta * (a - 0.5 * delta);
}

double objective(unsigned n, const double* x, double* grad, void* data) {
  (void)n;
  (void)grad;
  const FitData& d = *static_cast<const FitData*>(data);
  hw::Efficiency e = from_x(x);
  if (!d.fit_half_rows) e.half_rows = d.base.half_rows;
  e.compute_by_dtype = d.base.compute_by_dtype;
  double loss = 0;
  for (size_t i = 0; i < d.samples->size(); ++i) {
    const OpSample& s = *(*d.samples)[i];
    const double pred = sample_time(*d.hw, e, s, (*d.compute)[i], (*d.shares)[i]);
    loss += (*d.weights)[i] * huber(std::log(std::max(pred, 1e-12) / std::max(s.seconds, 1e-12)), 0.2);
  }
  return loss;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[size_t(std::min<double>(double(v.size() - 1), std::floor(q * double(v.size() - 1) + 0.5)))];
}
}  // namespace

RunMeasurement measurement_from_run_json(const json& j, const std::string& origin) {
  RunMeasurement m;
  m.origin = origin;
  try {
    const std::string dtype = j.at("dtype").get<std::string>();
    if (dtype != "f32" && dtype != "bf16" && dtype != "int8")
      fail("{}: 'dtype' must be f32, bf16 or int8, got '{}'", origin, dtype);
    m.compute = dtype;
    m.prompt_tokens = j.at("prompt_tokens").get<int64_t>();
    m.prefill_s = j.at("prefill_ms").get<double>() * 1e-3;
    // Older outputs have no threads; a CUDA run's threads are the host's, not the part's.
    if (j.contains("threads") && j.value("backend", "cpu") == "cpu") {
      m.threads = j.at("threads").get<int>();
      if (m.threads < 1) fail("{}: 'threads' must be at least 1, got {}", origin, m.threads);
    }
    const json& pre = j.at("ops").at("prefill");
    const json& layers = pre.at("layers");
    if (!layers.is_array() || layers.empty()) fail("{}: ops.prefill.layers is empty", origin);
    for (size_t l = 0; l < layers.size(); ++l) read_ops(layers[l], int(l), origin, m.ops);
    read_ops(pre.at("outside_layers"), -1, origin, m.ops);
  } catch (const json::exception& e) {
    fail("{}: not a `run --json` output with per-op timings ({})", origin, e.what());
  }
  if (!(m.prefill_s > 0) || m.prompt_tokens < 1)
    fail("{}: prefill_ms and prompt_tokens must be positive", origin);
  return m;
}

double predict_sample(const hw::Profile& hw, const OpSample& s, const std::string& compute, double share) {
  return sample_time(hw, hw.eff(op_family(s.op)), s, compute, share);
}

double predict_prefill(const hw::Profile& hw, const RunMeasurement& m) {
  const double share = hw::thread_share(hw, m.threads);
  double t = 0;
  for (const OpSample& s : m.ops) t += predict_sample(hw, s, m.compute, share);
  return t;
}

hw::Profile calibrate(const hw::Profile& base, const std::vector<RunMeasurement>& runs,
                      CalibrationReport* report) {
  if (runs.empty()) fail("calibrate: no runs to fit");
  hw::Profile p = base;
  p.efficiency_default = false;
  CalibrationReport rep;
  double total_time = 0;
  for (const RunMeasurement& r : runs)
    for (const OpSample& s : r.ops) total_time += s.seconds;
  for (int fi = 0; fi < hw::kNumFamilies; ++fi) {
    const hw::Family fam = hw::Family(fi);
    std::vector<const OpSample*> samples;
    std::vector<std::string> compute;
    std::vector<double> weights, shares;
    double fam_time = 0, rmin = 1e300, rmax = 0;
    for (const RunMeasurement& r : runs) {
      // Weights: each sample's share of its run's time in this family, so every run counts the
      // same (a long run measured while the machine was busy cannot drag the fit alone) and
      // within a run the fit follows where the time goes; a floor keeps small ops in view.
      double run_time = 0;
      size_t first = samples.size();
      for (const OpSample& s : r.ops)
        if (op_family(s.op) == fam && s.seconds > 0) {
          samples.push_back(&s);
          compute.push_back(r.compute);
          shares.push_back(hw::thread_share(base, r.threads));
          run_time += s.seconds;
          rmin = std::min(rmin, std::max(1.0, s.rows));
          rmax = std::max(rmax, std::max(1.0, s.rows));
        }
      fam_time += run_time;
      const size_t n = samples.size() - first;
      for (size_t i = first; i < samples.size(); ++i)
        weights.push_back(samples[i]->seconds / run_time + 0.1 / double(n));
    }
    FamilyFit fit;
    fit.family = fam;
    fit.samples = int(samples.size());
    fit.time_share = total_time > 0 ? fam_time / total_time : 0;
    // The experts: a family of their own only where a MoE run gives samples enough to fit (else the
    // GEMMs' efficiency prices them, as fitted above); no row for a dense model's runs.
    if (fam == hw::Family::Experts) {
      if (samples.empty()) continue;
      if (samples.size() >= 4) p.own_experts();
    }
    hw::Efficiency& e = fam == hw::Family::Experts && !p.experts_own ? p.efficiency[size_t(hw::Family::Gemm)]
                                                                     : p.efficiency[size_t(fi)];
    if (samples.size() >= 4) {
      FitData d{&p, &samples, &weights, &compute, &shares, e, rmax >= 4 * rmin};
      std::array<double, 4> x = to_x(e);
      const std::array<double, 4> lo = {std::log(1e-4), 0.0, std::log(1e-3), std::log(1e-9)};
      // Per-call overhead at most 100 us: more is never dispatch cost, only noise being absorbed.
      // Memory efficiency above 1 (caches serving the traffic, kMaxMemoryEfficiency) only for
      // the families that move activations an op before just wrote. GEMMs and attention stream
      // weights and K/V, whose prefill timings (compute-bound) do not identify it anyway: left
      // free, it drifted to 3x DRAM bandwidth and would have made decode steps look 3x cheaper.
      // GEMMs may exceed it too where samples show it: matrix-vector products (the prefill's
      // one-row LM head, decoding steps) only stream their weights in, and reads alone run
      // faster than the STREAM triad that sets the profile's bandwidth (here 27-33 GB/s against
      // 20.6). Those samples are what identify it; prefill-sized GEMMs never do.
      const bool gemv =
          fam == hw::Family::Gemm &&
          std::any_of(samples.begin(), samples.end(), [](const OpSample* s) { return s->rows <= 4; });
      const bool cached = fam == hw::Family::Elementwise || fam == hw::Family::DataMovement || gemv;
      const std::array<double, 4> hi = {0.0, std::log1p(1e5),
                                        cached ? std::log(hw::kMaxMemoryEfficiency) : 0.0, std::log(1e-4)};
      for (int k = 0; k < 4; ++k) x[size_t(k)] = std::clamp(x[size_t(k)], lo[size_t(k)], hi[size_t(k)]);
      const std::string what = fmt::format("calibrate: the {} fit", hw::family_name(fam));
      // A stop short of convergence (NLopt's ROUNDOFF_LIMITED on a noisy family, say) still
      // returns the best point seen; the report says how it stopped.
      fit.stop = describe_stop(
          minimize_bobyqa(4, x.data(), lo.data(), hi.data(), objective, &d, 4000, 1e-6, what.c_str()));
      hw::Efficiency fitted = from_x(x.data());
      if (!d.fit_half_rows) fitted.half_rows = e.half_rows;
      fitted.compute_by_dtype = e.compute_by_dtype;  // a dtype's own share is fitted end to end
      fitted.decode_compute = e.decode_compute;      // and decoding attention's, by validate --serving
      fitted.listed_compute = e.listed_compute, fitted.listed_memory = e.listed_memory;
      e = fitted;
      fit.fitted = true;
      fit.half_rows_fitted = d.fit_half_rows;
    }
    std::vector<double> errs;
    for (size_t i = 0; i < samples.size(); ++i)
      errs.push_back(
          std::fabs(sample_time(p, e, *samples[i], compute[i], shares[i]) / samples[i]->seconds - 1));
    fit.median_abs_err = quantile(errs, 0.5);
    fit.p90_abs_err = quantile(errs, 0.9);
    rep.families.push_back(fit);
  }
  for (const RunMeasurement& r : runs) rep.runs.emplace_back(r.prefill_s, predict_prefill(p, r));
  if (report) *report = std::move(rep);
  return p;
}

}  // namespace lp::calib
