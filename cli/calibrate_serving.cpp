// `lazyprefill calibrate-serving`: an engine's scheduler parameters fitted to the user's own serving
// benchmarks (vllm bench serve, guidellm, AIPerf, genai-perf), with per-metric errors before the
// fit, after it and held out. The work is calib::calibrate_serving's
// (calibrate/calibrate_serving_study.h); the table is printed here.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "calibrate/calibrate_serving_study.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"

namespace lp::cli {
namespace {
using calib::Figure;
using calib::kFigures;
using calib::shown;

// A benchmark's file name and place, without its folders, for the table.
std::string short_name(const std::string& where) {
  const size_t slash = where.find_last_of('/');
  return (slash == std::string::npos ? where : where.substr(slash + 1)).substr(0, 34);
}

std::string fit_text(const calib::CalibrateServingResult& res) {
  const calib::ServingFit& fit = res.fit;
  std::string text = fmt::format(
      "{} on {} ({}): fitted kernel scale {:.3f}, iteration overhead {:.2f} ms, request overhead {:.2f} ms\n",
      res.model, res.hw.name, res.hw.engine.name, fit.scale, fit.iteration_s * 1e3, fit.request_s * 1e3);
  text += fmt::format("{:<34} {:<20} {:>10} {:>10} {:>10} {:>10}\n", "benchmark", "figure", "measured",
                      "uncal.", "calibr.", "held out");
  for (const calib::PointResult& p : fit.points)
    for (int f = 0; f < kFigures; ++f) {
      const Figure F = Figure(f);
      if (!std::isfinite(p.measured[f])) continue;
      text += fmt::format(
          "{:<34} {:<20} {:>10.2f} {:>10.2f} {:>10.2f} {:>10}\n", short_name(p.where), calib::figure_name(F),
          shown(F, p.measured[f]), shown(F, p.uncalibrated[f]), shown(F, p.calibrated[f]),
          std::isfinite(p.held_out[f]) ? fmt::format("{:.2f}", shown(F, p.held_out[f])) : "-");
    }
  text += "MAPE, %:";
  const auto pct = [](double v) { return std::isfinite(v) ? fmt::format("{:.1f}", v) : std::string("-"); };
  for (int f = 0; f < kFigures; ++f)
    if (std::isfinite(fit.mape_uncalibrated[f]))
      text += fmt::format(" {} {}/{}/{}", calib::figure_name(Figure(f)), pct(fit.mape_uncalibrated[f]),
                          pct(fit.mape_calibrated[f]), pct(fit.mape_held_out[f]));
  text += " (uncalibrated/calibrated/held out)\n";
  return text;
}

}  // namespace

int cmd_calibrate_serving(const CalibrateServingArgs& a) {
  calib::CalibrateServingRequest r;
  r.benchmarks = a.benchmarks;
  r.model = a.model;
  r.model_config = a.model_config;
  r.hw = a.hw;
  r.engine = a.engine;
  r.precision = a.precision;
  r.sched = a.sched;
  r.kv_budget_mib = a.kv_budget_mib;
  r.kv_fraction = a.kv_fraction;
  r.kv_element_bytes = a.kv_element_bytes;
  r.tp = a.tp;
  r.fit = a.fit;
  r.seed = a.seed;
  r.out = a.out;
  const calib::CalibrateServingResult res = calib::calibrate_serving(r);
  print_result(a.json_out, res.to_json(), fit_text(res));
  return 0;
}

}  // namespace lp::cli
