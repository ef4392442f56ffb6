#include "cli/calibration_output.h"

#include <fmt/format.h>

#include <cmath>

#include "model/json_checks.h"

namespace lp::cli {

using json = nlohmann::ordered_json;

void print_calibration(const hw::Profile& fitted, const calib::CalibrationReport& rep,
                       const std::vector<calib::RunMeasurement>& runs) {
  fmt::print("{:<14} {:>7} {:>6} {:>8} {:>9} {:>7} {:>10} {:>9} {:>9}\n", "family", "samples", "time%",
             "compute", "half_rows", "memory", "overhead", "median|e|", "p90|e|");
  for (const calib::FamilyFit& f : rep.families) {
    const hw::Efficiency& e = fitted.eff(f.family);
    fmt::print(
        "{:<14} {:>7} {:>5.1f}% {:>8.3f} {:>9.1f} {:>7.3f} {:>8.1f}us {:>8.1f}% {:>8.1f}%{}\n",
        hw::family_name(f.family), f.samples, 100 * f.time_share, e.compute, e.half_rows, e.memory,
        e.overhead_s * 1e6, 100 * f.median_abs_err, 100 * f.p90_abs_err,
        !f.fitted ? "  (too few samples: base kept)" : (!f.half_rows_fitted ? "  (half_rows kept)" : ""));
    if (!f.stop.empty())
      fmt::print("{:<14} the optimiser stopped short of convergence ({}): best point kept\n", "", f.stop);
  }
  fmt::print("\n{:<40} {:>8} {:>12} {:>12} {:>8}\n", "run", "tokens", "measured ms", "predicted ms", "error");
  for (size_t i = 0; i < rep.runs.size(); ++i)
    fmt::print("{:<40} {:>8} {:>12.1f} {:>12.1f} {:>+7.1f}%\n", runs[i].origin, runs[i].prompt_tokens,
               rep.runs[i].first * 1e3, rep.runs[i].second * 1e3,
               100 * (rep.runs[i].second / rep.runs[i].first - 1));
}

void print_result(bool json_out, const nlohmann::ordered_json& out, const std::string& text) {
  if (json_out)
    fmt::print("{}\n", json_text(out));
  else
    fmt::print("{}", text);
}

}  // namespace lp::cli
