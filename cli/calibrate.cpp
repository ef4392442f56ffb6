// `lazyprefill calibrate`: fit a hardware profile's efficiencies to measured `run --json` outputs
// (per-op, every family) or to end-to-end measurements from other tools (calibrate/fit_measurements.h).
#include "calibrate/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "calibrate/fit_measurements.h"
#include "calibrate/measurement_points.h"
#include "calibrate/measurements.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/digest.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "sim/replay.h"

namespace lp::cli {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

// Pretty JSON; bytes that are not UTF-8 (a Latin-1 name in a measurement file) become U+FFFD.
std::string to_text(const json& j) {
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}
std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

int calibrate_runs(const CalibrateArgs& a) {
  if (!fs::is_directory(a.runs)) usage_fail("--runs '{}' is not a folder", a.runs);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(a.runs))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) fail("--runs '{}' holds no .json files", a.runs);
  std::vector<calib::RunMeasurement> runs;
  for (const fs::path& f : files) {
    const std::string text = read_input_file(f.string(), "run --json file", input_cap::kResults);
    nlohmann::json j;
    try {
      j = json_parse(text, f.string());
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", f.string(), e.what());
    }
    runs.push_back(calib::measurement_from_run_json(j, f.filename().string()));
  }
  const hw::Profile base = hw::load_profile(a.base);
  calib::CalibrationReport rep;
  const hw::Profile fitted = calib::calibrate(base, runs, &rep);
  const std::string name = a.name.empty() ? base.name : a.name;
  const std::string provenance =
      fmt::format("calibrated on {} by `lazyprefill calibrate --base {}` from {} runs in {}", today(), a.base,
                  runs.size(), a.runs);
  write_fitted_profile(a.out, fitted, name, provenance);
  if (a.json_out) {
    nlohmann::ordered_json j = calibration_json(fitted, rep, runs);
    j["profile"] = a.out;
    std::puts(to_text(j).c_str());
  } else {
    print_calibration(fitted, rep, runs);
    fmt::print("\nwrote {}\n", a.out);
  }
  return 0;
}

std::map<std::string, std::string> parse_map(const std::vector<std::string>& items, const char* option) {
  std::map<std::string, std::string> m;
  for (const std::string& it : items) {
    const size_t eq = it.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == it.size())
      usage_fail("{} takes NAME=VALUE, got '{}'", option, it);
    m[it.substr(0, eq)] = it.substr(eq + 1);
  }
  return m;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The profile's `calibration` record: the inputs with their hashes, what was fitted, the errors.
json calibration_record(const CalibrateArgs& a, const hw::Profile& base, const hw::Profile& fitted,
                        const calib::MeasurementSet& set, const calib::PointSelection& sel,
                        const calib::MeasurementFit& fit) {
  const auto pct = [](double x) { return std::isnan(x) ? json(nullptr) : json(100 * x); };
  json files = json::array();
  for (const calib::MeasurementFile& f : set.files) {
    json entry = {{"path", f.path}, {"sha256", f.sha256}, {"records", f.records}};
    for (const auto& [path, sha] : f.side_files)
      entry["side_files"].push_back({{"path", path}, {"sha256", sha}});
    files.push_back(std::move(entry));
  }
  json fitted_params = json::array();
  for (const std::string& p : fit.params)
    fitted_params.push_back(
        {{"name", p}, {"base", calib::get_param(base, p)}, {"value", calib::get_param(fitted, p)}});
  return {{"date", today()},
          {"command", "lazyprefill calibrate --measurements"},
          {"base", a.base},
          {"files", files},
          {"points", sel.points.size()},
          {"ttft_points", fit.ttft_points},
          {"decode_points", fit.decode_points},
          {"fitted", fitted_params},
          {"cross_validation", fit.cv},
          {"optimizer", fit.stop.empty() ? "converged" : fit.stop},
          {"held_out_fits_unconverged", fit.heldout_unconverged},
          {"ttft_mape_pct",
           {{"base", pct(fit.ttft_mape_base)},
            {"fit", pct(fit.ttft_mape_fit)},
            {"held_out", pct(fit.ttft_mape_heldout)}}},
          {"decode_mape_pct",
           {{"base", pct(fit.decode_mape_base)},
            {"fit", pct(fit.decode_mape_fit)},
            {"held_out", pct(fit.decode_mape_heldout)}}}};
}

json measurement_fit_json(const CalibrateArgs& a, const json& cal, const calib::MeasurementSet& set,
                          const calib::PointSelection& sel, const calib::MeasurementFit& fit,
                          const std::string& base) {
  json pts = json::array();
  for (size_t i = 0; i < sel.points.size(); ++i) {
    const calib::Point& p = sel.points[i];
    pts.push_back({{"file", p.m->file},
                   {"record", p.m->record},
                   {"model", p.m->model},
                   {"preset", p.preset},
                   {"quantity", p.ttft ? "ttft" : "decode"},
                   {"prompt_tokens", p.m->prompt_tokens},
                   {"context_tokens", p.m->context_tokens},
                   {"batch", p.m->batch},
                   {"tp", p.m->tp},
                   {"measured_ms", p.measured_s * 1e3},
                   {"repetitions", p.m->repetitions},
                   {"base_ms", fit.base_s[i] * 1e3},
                   {"fit_ms", fit.fit_s[i] * 1e3},
                   {"held_out_ms", fit.heldout_s[i] * 1e3},
                   {"held_out_error_pct", 100 * (fit.heldout_s[i] / p.measured_s - 1)}});
  }
  json checks = json::array();
  for (const calib::ParamCheck& c : fit.checks)
    checks.push_back({{"name", c.name},
                      {"rms_elasticity", c.sensitivity},
                      {"independent_elasticity", c.independent},
                      {"fitted", c.fitted},
                      {"at_bound", c.at_bound},
                      {"relative_error",
                       c.fitted && std::isfinite(c.relative_error) ? json(c.relative_error) : json(nullptr)},
                      {"f_statistic", c.f_stat},
                      {"reason", c.reason}});
  return {{"profile", a.out},
          {"calibration", cal},
          {"skipped", sel.skipped(base)},
          {"repetitions_merged", set.repeated},
          {"points", pts},
          {"parameters", checks}};
}

void print_measurement_fit(const CalibrateArgs& a, const hw::Profile& base, const hw::Profile& fitted,
                           const calib::MeasurementSet& set, const calib::PointSelection& sel,
                           const calib::MeasurementFit& fit) {
  const std::string skipped = sel.skipped(base.name);
  fmt::print("{} record(s) from {} file(s); {} point(s) on {}{}{}\n", set.records.size(), set.files.size(),
             sel.points.size(), base.name, skipped.empty() ? "" : "; skipped: " + skipped,
             sel.unnamed_hw
                 ? fmt::format("; {} without a hardware name taken as {}", sel.unnamed_hw, base.name)
                 : "");
  if (set.repeated)
    fmt::print("  {} record(s) repeated an earlier point and were averaged into it (see the notes)\n",
               set.repeated);
  for (const auto& [note, k] : sel.notes) fmt::print("  note ({} record(s)): {}\n", k, note);
  fmt::print("\n{:<34} {:<14} {:>6} {:>3} {:>3} {:>6} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "measurement",
             "preset", "tokens", "b", "tp", "what", "measured", "base", "fitted", "held-out", "error");
  for (size_t i = 0; i < sel.points.size(); ++i) {
    const calib::Point& p = sel.points[i];
    const std::string where = fmt::format("{}:{}", fs::path(p.m->file).filename().string(), p.m->record);
    fmt::print(
        "{:<34} {:<14} {:>6} {:>3} {:>3} {:>6} {:>8.2f}ms {:>8.2f}ms {:>8.2f}ms {:>8.2f}ms {:>+7.1f}%\n",
        where, p.preset, p.ttft ? p.m->prompt_tokens : p.m->context_tokens, p.m->batch, p.m->tp,
        p.ttft ? "ttft" : "decode", p.measured_s * 1e3, fit.base_s[i] * 1e3, fit.fit_s[i] * 1e3,
        fit.heldout_s[i] * 1e3, 100 * (fit.heldout_s[i] / p.measured_s - 1));
  }
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
  fmt::print("wrote {}\n", a.out);
}

int calibrate_measurements(const CalibrateArgs& a) {
  hw::Profile base = hw::load_profile(a.base);
  if (!a.engine.empty()) base.engine = hw::engine_preset(a.engine);
  calib::PointMapping map{parse_map(a.model_map, "--model-map"), parse_map(a.hw_map, "--hw-map"), a.weights,
                          a.compute, a.kv};
  for (const auto& [file_name, preset] : map.models) preset_config(preset);  // unknown presets fail here
  for (const auto& [file_name, profile] : map.hardware)
    if (profile != base.name) hw::load_profile(profile);
  sim::validate(sim::Precision{a.weights.empty() ? "bf16" : a.weights, a.compute.empty() ? "bf16" : a.compute,
                               a.kv.empty() ? "bf16" : a.kv});
  // Everything is read and checked before anything is fitted or written.
  const calib::MeasurementSet set = calib::read_measurement_set(a.measurements);
  const calib::PointSelection sel = calib::select_points(set, base, map);
  calib::MeasurementFit fit;
  const hw::Profile fitted = calib::fit_measurements(base, sel.points, a.fit, &fit);

  const json cal = calibration_record(a, base, fitted, set, sel, fit);
  std::string file_list;
  for (const calib::MeasurementFile& f : set.files) file_list += (file_list.empty() ? "" : ", ") + f.path;
  const std::string provenance = fmt::format(
      "calibrated on {} by `lazyprefill calibrate --measurements` from {} points ({} TTFT, {} decode) in {}: "
      "fitted {}; "
      "held-out TTFT MAPE {} ({}); other values from {}. File hashes in 'calibration'.",
      today(), sel.points.size(), fit.ttft_points, fit.decode_points, file_list, join(fit.params),
      fit.ttft_points ? fmt::format("{:.1f}%", 100 * fit.ttft_mape_heldout) : "n/a", fit.cv, a.base);
  json prof = fitted_profile_json(fitted, a.name.empty() ? base.name : a.name, provenance);
  prof["calibration"] = cal;
  write_file_atomic(a.out, to_text(prof) + "\n", "profile");
  if (a.json_out)
    std::puts(to_text(measurement_fit_json(a, cal, set, sel, fit, base.name)).c_str());
  else
    print_measurement_fit(a, base, fitted, set, sel, fit);
  return 0;
}

}  // namespace

int cmd_calibrate(const CalibrateArgs& a) {
  if (a.runs.empty() && a.measurements.empty()) usage_fail("give --runs DIR or --measurements FILE...");
  std::vector<std::string> inputs = a.measurements;
  inputs.push_back(a.base);
  refuse_output_over_input(a.out, "--out", inputs);
  return a.runs.empty() ? calibrate_measurements(a) : calibrate_runs(a);
}

}  // namespace lp::cli
