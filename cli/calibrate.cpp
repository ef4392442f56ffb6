// `lazyprefill calibrate`: fit a hardware profile's efficiencies to measured `run --json` outputs
// (per-op, every family) or to end-to-end measurements from other tools; the work is
// calib::calibrate_profile's (calibrate/calibrate_study.h), the tables are printed here.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "calibrate/calibrate_study.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"

namespace lp::cli {

namespace fs = std::filesystem;

namespace {

void print_measurement_fit(const calib::CalibrateResult& r) {
  const hw::Profile& base = r.base;
  const calib::MeasurementFit& fit = r.fit;
  fmt::print(
      "{} record(s) from {} file(s); {} point(s) on {}{}{}\n", r.records, r.files, r.points.size(), base.name,
      r.skipped.empty() ? "" : "; skipped: " + r.skipped,
      r.unnamed_hw ? fmt::format("; {} without a hardware name taken as {}", r.unnamed_hw, base.name) : "");
  if (r.repeated)
    fmt::print("  {} record(s) repeated an earlier point and were averaged into it (see the notes)\n",
               r.repeated);
  for (const auto& [note, k] : r.notes) fmt::print("  note ({} record(s)): {}\n", k, note);
  fmt::print("\n{:<34} {:<14} {:>6} {:>3} {:>3} {:>6} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "measurement",
             "preset", "tokens", "b", "tp", "what", "measured", "base", "fitted", "held-out", "error");
  for (const calib::CalibratedPoint& p : r.points) {
    const std::string where = fmt::format("{}:{}", fs::path(p.file).filename().string(), p.record);
    fmt::print(
        "{:<34} {:<14} {:>6} {:>3} {:>3} {:>6} {:>8.2f}ms {:>8.2f}ms {:>8.2f}ms {:>8.2f}ms {:>+7.1f}%\n",
        where, p.preset, p.ttft ? p.prompt_tokens : p.context_tokens, p.batch, p.tp,
        p.ttft ? "ttft" : "decode", p.measured_s * 1e3, p.base_s * 1e3, p.fit_s * 1e3, p.held_out_s * 1e3,
        100 * (p.held_out_s / p.measured_s - 1));
  }
  const hw::Profile& fitted = r.fitted;
  fmt::print("\n{:<18} {:>10} {:>12} {:>10} {:>10}  {}\n", "parameter", "elasticity", "independent", "base",
             "fitted", "");
  for (const calib::ParamCheck& c : fit.checks)
    fmt::print("{:<18} {:>10.3f} {:>12.3f} {:>10.4g} {:>10}  {}\n", c.name, c.sensitivity, c.independent,
               calib::get_param(base, c.name),
               c.fitted ? fmt::format("{:.4g}", calib::get_param(fitted, c.name)) : "-",
               c.fitted ? (c.at_bound ? "at its bound: the data push it to the limit (poorly determined)"
                           : std::isfinite(c.relative_error)
                               ? fmt::format("+-{:.1f}% (one standard error)", 100 * c.relative_error)
                               : std::string("no degree of freedom left for its uncertainty"))
                        : c.reason);
  const auto line = [&](const char* what, int n, double b, double f, double h) {
    if (n)
      fmt::print("{} MAPE over {} point(s): base {:.1f}%, fitted {:.1f}%, held out ({}) {:.1f}%\n", what, n,
                 100 * b, 100 * f, fit.cv, 100 * h);
  };
  fmt::print("\n");
  line("TTFT", fit.ttft_points, fit.ttft_mape_base, fit.ttft_mape_fit, fit.ttft_mape_heldout);
  line("decode", fit.decode_points, fit.decode_mape_base, fit.decode_mape_fit, fit.decode_mape_heldout);
  if (!fit.stop.empty())
    fmt::print("note: the optimiser stopped short of convergence ({}); the best point it found is kept\n",
               fit.stop);
  if (fit.heldout_unconverged)
    fmt::print("note: {} of the held-out fits stopped short of convergence (best points kept)\n",
               fit.heldout_unconverged);
  fmt::print("wrote {}\n", r.out);
}

}  // namespace

int cmd_calibrate(const CalibrateArgs& a) {
  calib::CalibrateRequest r;
  r.runs = a.runs;
  r.measurements = a.measurements;
  r.base = a.base;
  r.name = a.name;
  r.out = a.out;
  r.model_map = a.model_map;
  r.hw_map = a.hw_map;
  r.fit = a.fit;
  r.weights = a.weights;
  r.compute = a.compute;
  r.kv = a.kv;
  r.engine = a.engine;
  const calib::CalibrateResult res = calib::calibrate_profile(r);
  if (a.json_out) {
    print_result(true, res.to_json(), "");
  } else if (res.from_runs) {
    print_calibration(res.fitted, res.report, res.runs);
    fmt::print("\nwrote {}\n", res.out);
  } else {
    print_measurement_fit(res);
  }
  return 0;
}

}  // namespace lp::cli
