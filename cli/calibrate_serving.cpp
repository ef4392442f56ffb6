// `lazyprefill calibrate-serving`: an engine's scheduler parameters fitted to the user's own serving
// benchmarks (vllm bench serve, guidellm, AIPerf, genai-perf), with per-metric errors before the
// fit, after it and held out (calibrate/serving_benchmarks.h).
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "calibrate/serving_benchmarks.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/io.h"
#include "sim/cost.h"
#include "sim/replay.h"
#include "sim/simulate.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;
using calib::Figure;
using calib::kFigures;

json or_null(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

// A benchmark's file name and place, without its folders, for the table.
std::string short_name(const std::string& where) {
  const size_t slash = where.find_last_of('/');
  return (slash == std::string::npos ? where : where.substr(slash + 1)).substr(0, 34);
}

// ms for times, tokens/s for throughput, as the tools print them.
double shown(Figure f, double v) {
  return f == Figure::Throughput ? v : v * 1e3;
}

}  // namespace

int cmd_calibrate_serving(const CalibrateServingArgs& a) {
  std::string model_name;
  const ModelConfig c = sim::model_to_cost(a.model, a.model_config, &model_name);
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const hw::Profile hw = load_profiles(a.hw, a.engine).at(0);
  for_option("--tp", [&] { sim::check_tp(c, hw, a.tp); });
  if (!a.out.empty()) {
    std::vector<std::string> inputs = a.benchmarks;
    inputs.push_back(a.model);
    inputs.push_back(a.hw);
    refuse_output_over_input(a.out, "--out", inputs);
  }
  calib::ServingFitOptions o;
  o.seed = a.seed;
  o.fit_scale = o.fit_iteration = o.fit_request = false;
  for (const std::string& f : split_list(a.fit)) {
    if (f == "scale")
      o.fit_scale = true;
    else if (f == "iteration")
      o.fit_iteration = true;
    else if (f == "request")
      o.fit_request = true;
    else
      usage_fail("--fit: '{}' is not scale, iteration or request", escape_text(f));
  }
  std::vector<calib::ServingBenchmark> bs;
  for (const std::string& path : a.benchmarks)
    for (calib::ServingBenchmark& b : calib::read_serving_benchmarks(path)) bs.push_back(std::move(b));

  sim::ServingConfig cfg = sim::scheduler_config(a.sched, hw);
  cfg.tp = a.tp;
  cfg.kv_element_bytes = a.kv_element_bytes > 0 ? a.kv_element_bytes : sim::dtype_bytes(prec.kv, "--kv");
  if (a.kv_budget_mib > 0) {
    cfg.kv_budget_bytes = a.kv_budget_mib * double(1 << 20);
  } else {
    cfg.kv_budget_bytes = sim::memory_kv_budget(c, hw, prec, a.tp, a.kv_fraction);
    if (!(cfg.kv_budget_bytes > 0))
      fail("{}: the weights ({:.1f} GiB a device) leave no memory for K/V at --kv-fraction {}", hw.name,
           sim::weight_memory_bytes(c, sim::CostContext(hw, prec).dtypes) / double(a.tp) / double(1 << 30),
           a.kv_fraction);
  }
  const calib::ServingFit fit = calib::fit_serving_benchmarks(c, hw, prec, cfg, bs, o);

  json out;
  out["tool"] = "lazyprefill calibrate-serving";
  out["model"] = model_name;
  out["hw"] = hw.name;
  json sched = sim::scheduler_json(hw, cfg);
  sched["kv_budget_mib"] = cfg.kv_budget_bytes / double(1 << 20);
  out["scheduler"] = std::move(sched);
  out["definitions"] = {
      {"ttft", "send to first token"},
      {"itl",
       "each request's (latency - TTFT) / (output tokens - 1): vLLM's TPOT, guidellm's and AIPerf's ITL"},
      {"throughput", "output tokens per second over the benchmark"},
      {"error", "predicted / measured - 1; MAPE: the mean of its absolute values over the points, %"}};
  out["fitted"] = {{"iteration_overhead_ms", fit.iteration_s * 1e3},
                   {"request_overhead_ms", fit.request_s * 1e3},
                   {"kernel_scale", fit.scale},
                   {"fit", a.fit},
                   {"simulations", fit.simulations}};
  json pts = json::array();
  std::string text = fmt::format(
      "{} on {} ({}): fitted kernel scale {:.3f}, iteration overhead {:.2f} ms, request overhead {:.2f} ms\n",
      model_name, hw.name, hw.engine.name, fit.scale, fit.iteration_s * 1e3, fit.request_s * 1e3);
  text += fmt::format("{:<34} {:<20} {:>10} {:>10} {:>10} {:>10}\n", "benchmark", "figure", "measured",
                      "uncal.", "calibr.", "held out");
  for (const calib::PointResult& p : fit.points) {
    json fig = json::object();
    for (int f = 0; f < kFigures; ++f) {
      const Figure F = Figure(f);
      fig[calib::figure_name(F)] = {{"measured", or_null(shown(F, p.measured[f]))},
                                    {"uncalibrated", or_null(shown(F, p.uncalibrated[f]))},
                                    {"calibrated", or_null(shown(F, p.calibrated[f]))},
                                    {"held_out", or_null(shown(F, p.held_out[f]))}};
      if (!std::isfinite(p.measured[f])) continue;
      text += fmt::format(
          "{:<34} {:<20} {:>10.2f} {:>10.2f} {:>10.2f} {:>10}\n", short_name(p.where), calib::figure_name(F),
          shown(F, p.measured[f]), shown(F, p.uncalibrated[f]), shown(F, p.calibrated[f]),
          std::isfinite(p.held_out[f]) ? fmt::format("{:.2f}", shown(F, p.held_out[f])) : "-");
    }
    pts.push_back({{"benchmark", p.where},
                   {"rate_per_s", std::isinf(p.rate) ? json("inf") : json(p.rate)},
                   {"concurrency", p.concurrency},
                   {"figures", std::move(fig)}});
  }
  out["points"] = std::move(pts);
  json mape = json::object();
  text += "MAPE, %:";
  for (int f = 0; f < kFigures; ++f) {
    mape[calib::figure_name(Figure(f))] = {{"uncalibrated", or_null(fit.mape_uncalibrated[f])},
                                           {"calibrated", or_null(fit.mape_calibrated[f])},
                                           {"held_out", or_null(fit.mape_held_out[f])}};
    const auto pct = [](double v) { return std::isfinite(v) ? fmt::format("{:.1f}", v) : std::string("-"); };
    if (std::isfinite(fit.mape_uncalibrated[f]))
      text += fmt::format(" {} {}/{}/{}", calib::figure_name(Figure(f)), pct(fit.mape_uncalibrated[f]),
                          pct(fit.mape_calibrated[f]), pct(fit.mape_held_out[f]));
  }
  text += " (uncalibrated/calibrated/held out)\n";
  out["mape_percent"] = std::move(mape);

  if (!a.out.empty()) {
    nlohmann::ordered_json prof = hw.json;
    nlohmann::ordered_json eng = {{"preset", hw.engine.name == "custom" ? "lazyprefill" : hw.engine.name}};
    if (prof.contains("engine") && prof["engine"].is_object()) eng = prof["engine"];
    eng["iteration_us"] = fit.iteration_s * 1e6;
    eng["kernel_scale"] = fit.scale;
    eng["request_us"] = fit.request_s * 1e6;
    prof["engine"] = eng;
    prof["sources"]["engine"] = fmt::format("lazyprefill calibrate-serving on {} benchmark(s): {}", bs.size(),
                                            fmt::join(a.benchmarks, ", "));
    write_file_atomic(a.out, prof.dump(2) + "\n", "profile");
    out["profile"] = a.out;
  }
  if (a.json_out)
    fmt::print("{}\n", out.dump(2));
  else
    fmt::print("{}", text);
  return 0;
}

}  // namespace lp::cli
