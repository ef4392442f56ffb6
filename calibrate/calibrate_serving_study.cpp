#include "calibrate/calibrate_serving_study.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "sim/replay.h"
#include "sim/simulate.h"

namespace lp::calib {
namespace {
using json = nlohmann::ordered_json;

json or_null(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

ServingFitOptions fit_options(const std::string& spec, uint64_t seed) {
  ServingFitOptions o;
  o.seed = seed;
  o.fit_scale = o.fit_iteration = o.fit_request = false;
  for (const std::string& f : split_list(spec)) {
    if (f == "scale")
      o.fit_scale = true;
    else if (f == "iteration")
      o.fit_iteration = true;
    else if (f == "request")
      o.fit_request = true;
    else
      usage_fail("--fit: '{}' is not scale, iteration or request", escape_text(f));
  }
  return o;
}

// The server's profile with the fitted engine: the profile's own engine object (or its preset's
// name) with the fitted times and scale, and where they came from.
json fitted_engine_profile(const hw::Profile& hw, const ServingFit& fit,
                           const std::vector<std::string>& files, size_t runs) {
  json prof = hw.json;
  json eng = {{"preset", hw.engine.name == "custom" ? "lazyprefill" : hw.engine.name}};
  if (prof.contains("engine") && prof["engine"].is_object()) eng = prof["engine"];
  eng["iteration_us"] = fit.iteration_s * 1e6;
  eng["kernel_scale"] = fit.scale;
  eng["request_us"] = fit.request_s * 1e6;
  prof["engine"] = eng;
  prof["sources"]["engine"] =
      fmt::format("lazyprefill calibrate-serving on {} benchmark(s): {}", runs, fmt::join(files, ", "));
  return prof;
}

}  // namespace

double shown(Figure f, double v) {
  return f == Figure::Throughput ? v : v * 1e3;
}

CalibrateServingResult calibrate_serving(const CalibrateServingRequest& r) {
  check_range("--tp", r.tp, 1, 4096);
  if (r.kv_budget_mib) check_range("--kv-budget-mib", *r.kv_budget_mib, 1.0, double(int64_t(1) << 30));
  check_range("--kv-fraction", r.kv_fraction, 0.05, 1.0);
  if (r.kv_element_bytes != 0) check_range("--kv-element-bytes", r.kv_element_bytes, 0.5, 8.0);
  if (r.benchmarks.empty()) usage_fail("--benchmark is required: a serving benchmark's result file");
  for (const std::string& b : r.benchmarks)
    if (b.empty()) usage_fail("--benchmark: an empty path");
  if (r.hw.empty() && !r.hw_profile) usage_fail("--hw is required: the server's hardware profile");

  CalibrateServingResult res;
  res.fit_spec = r.fit;
  const ModelConfig c = sim::request_target(r.model, r.model_config, r.config, &res.model);
  sim::validate(r.precision);
  res.hw = r.hw_profile ? *r.hw_profile : hw::load_profile(r.hw);
  if (!r.engine.empty()) res.hw.engine = hw::engine_preset(r.engine);
  const hw::Profile& hw = res.hw;
  for_option("--tp", [&] { sim::check_tp(c, hw, r.tp); });
  if (!r.out.empty()) {
    std::vector<std::string> inputs = r.benchmarks;
    inputs.push_back(r.model);
    inputs.push_back(r.model_config);
    inputs.push_back(r.hw);
    refuse_output_over_input(r.out, "--out", inputs);
  }
  const ServingFitOptions o = fit_options(r.fit, r.seed);
  std::vector<ServingBenchmark> bs;
  for (const std::string& path : r.benchmarks)
    for (ServingBenchmark& b : read_serving_benchmarks(path)) bs.push_back(std::move(b));
  res.benchmarks = bs.size();

  sim::ServingConfig& cfg = res.config;
  cfg = sim::scheduler_config(r.sched, hw);
  cfg.tp = r.tp;
  cfg.kv_element_bytes =
      r.kv_element_bytes > 0 ? r.kv_element_bytes : sim::dtype_bytes(r.precision.kv, "--kv");
  if (r.kv_budget_mib) {
    cfg.kv_budget_bytes = *r.kv_budget_mib * double(1 << 20);
  } else {
    cfg.kv_budget_bytes = sim::memory_kv_budget(c, hw, r.precision, r.tp, r.kv_fraction);
    if (!(cfg.kv_budget_bytes > 0))
      fail("{}: the weights ({:.1f} GiB a device) leave no memory for K/V at --kv-fraction {}", hw.name,
           sim::weight_memory_bytes(c, sim::CostContext(hw, r.precision).dtypes) / double(r.tp) /
               double(1 << 30),
           r.kv_fraction);
  }
  res.fit = fit_serving_benchmarks(c, hw, r.precision, cfg, bs, o);

  // Read back before it is written: a document that does not read back is refused with nothing written.
  res.document = fitted_engine_profile(hw, res.fit, r.benchmarks, bs.size());
  res.profile = hw::parse_profile(res.document, r.out.empty() ? "the fitted profile" : r.out);
  if (!r.out.empty()) {
    write_file_atomic(r.out, json_text(res.document) + "\n", "profile");
    res.out = r.out;
  }
  return res;
}

json CalibrateServingResult::to_json() const {
  json j;
  j["tool"] = "lazyprefill calibrate-serving";
  j["model"] = model;
  j["hw"] = hw.name;
  json sched = sim::scheduler_json(hw, config);
  sched["kv_budget_mib"] = config.kv_budget_bytes / double(1 << 20);
  j["scheduler"] = std::move(sched);
  j["definitions"] = {
      {"ttft", "send to first token"},
      {"itl",
       "each request's (latency - TTFT) / (output tokens - 1): vLLM's TPOT, guidellm's and AIPerf's ITL"},
      {"throughput", "output tokens per second over the benchmark"},
      {"error", "predicted / measured - 1; MAPE: the mean of its absolute values over the points, %"}};
  j["fitted"] = {{"iteration_overhead_ms", fit.iteration_s * 1e3},
                 {"request_overhead_ms", fit.request_s * 1e3},
                 {"kernel_scale", fit.scale},
                 {"fit", fit_spec},
                 {"simulations", fit.simulations}};
  json pts = json::array();
  for (const PointResult& p : fit.points) {
    json fig = json::object();
    for (int f = 0; f < kFigures; ++f) {
      const Figure F = Figure(f);
      fig[figure_name(F)] = {{"measured", or_null(shown(F, p.measured[f]))},
                             {"uncalibrated", or_null(shown(F, p.uncalibrated[f]))},
                             {"calibrated", or_null(shown(F, p.calibrated[f]))},
                             {"held_out", or_null(shown(F, p.held_out[f]))}};
    }
    pts.push_back({{"benchmark", p.where},
                   {"rate_per_s", std::isinf(p.rate) ? json("inf") : json(p.rate)},
                   {"concurrency", p.concurrency},
                   {"figures", std::move(fig)}});
  }
  j["points"] = std::move(pts);
  json mape = json::object();
  for (int f = 0; f < kFigures; ++f)
    mape[figure_name(Figure(f))] = {{"uncalibrated", or_null(fit.mape_uncalibrated[f])},
                                    {"calibrated", or_null(fit.mape_calibrated[f])},
                                    {"held_out", or_null(fit.mape_held_out[f])}};
  j["mape_percent"] = std::move(mape);
  if (!out.empty()) j["profile"] = out;
  return j;
}

}  // namespace lp::calib
