#include "calibrate/calibrate_study.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>

#include "calibrate/measurement_points.h"
#include "calibrate/measurements.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "sim/replay.h"

namespace lp::calib {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

json or_null_pct(double x) {
  return std::isnan(x) ? json(nullptr) : json(100 * x);
}

std::map<std::string, std::string> parse_map(const std::vector<std::string>& items, const char* option) {
  std::map<std::string, std::string> m;
  for (const std::string& it : items) {
    const size_t eq = it.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == it.size())
      usage_fail("{} takes NAME=VALUE, got '{}'", option, escape_text(it));
    m[it.substr(0, eq)] = it.substr(eq + 1);
  }
  return m;
}

// The fitted document read back as the profile a later run loads, then (when asked) written: a
// document that does not read back is refused before anything is written.
void finish(CalibrateResult& res, hw::Profile fitted, const std::string& out) {
  res.fitted = std::move(fitted);
  res.profile = hw::parse_profile(res.document, out.empty() ? "the fitted profile" : out);
  if (!out.empty()) {
    write_file_atomic(out, json_text(res.document) + "\n", "profile");
    res.out = out;
  }
}

// The base profile (with the request's engine) into `res`; the name the provenance gives it: as the
// request wrote it, or a Profile's own.
std::string load_base(const CalibrateRequest& r, CalibrateResult& res) {
  res.base = r.base_profile ? *r.base_profile : hw::load_profile(r.base);
  if (!r.engine.empty()) res.base.engine = hw::engine_preset(r.engine);
  return r.base.empty() ? res.base.name : r.base;
}

// The runs are read before the base profile is loaded, as the CLI always did.
void calibrate_runs(const CalibrateRequest& r, CalibrateResult& res) {
  if (!fs::is_directory(r.runs)) usage_fail("--runs '{}' is not a folder", escape_text(r.runs));
  std::vector<fs::path> files;
  try {
    for (const auto& e : fs::directory_iterator(r.runs))
      if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  } catch (const fs::filesystem_error& e) {
    fail("--runs '{}': {}", escape_text(r.runs), e.code().message());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) fail("--runs '{}' holds no .json files", escape_text(r.runs));
  for (const fs::path& f : files) {
    const std::string text = read_input_file(f.string(), "run --json file", input_cap::kResults);
    nlohmann::json j;
    try {
      j = json_parse(text, f.string());
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", f.string(), e.what());
    }
    res.runs.push_back(measurement_from_run_json(j, f.filename().string()));
  }
  const std::string base_name = load_base(r, res);
  const hw::Profile fitted = calibrate(res.base, res.runs, &res.report);
  const std::string provenance =
      fmt::format("calibrated on {} by `lazyprefill calibrate --base {}` from {} runs in {}", today_utc(),
                  base_name, res.runs.size(), r.runs);
  res.document = fitted_profile_json(fitted, r.name.empty() ? res.base.name : r.name, provenance);
  finish(res, fitted, r.out);
}

// The profile's `calibration` record: the inputs with their hashes, what was fitted, the errors.
json calibration_record(const std::string& base_name, const hw::Profile& base, const hw::Profile& fitted,
                        const MeasurementSet& set, const PointSelection& sel, const MeasurementFit& fit) {
  json files = json::array();
  for (const MeasurementFile& f : set.files) {
    json entry = {{"path", f.path}, {"sha256", f.sha256}, {"records", f.records}};
    for (const auto& [path, sha] : f.side_files)
      entry["side_files"].push_back({{"path", path}, {"sha256", sha}});
    files.push_back(std::move(entry));
  }
  json fitted_params = json::array();
  for (const std::string& p : fit.params)
    fitted_params.push_back({{"name", p}, {"base", get_param(base, p)}, {"value", get_param(fitted, p)}});
  return {{"date", today_utc()},
          {"command", "lazyprefill calibrate --measurements"},
          {"base", base_name},
          {"files", files},
          {"points", sel.points.size()},
          {"ttft_points", fit.ttft_points},
          {"decode_points", fit.decode_points},
          {"fitted", fitted_params},
          {"cross_validation", fit.cv},
          {"optimizer", fit.stop.empty() ? "converged" : fit.stop},
          {"held_out_fits_unconverged", fit.heldout_unconverged},
          {"ttft_mape_pct",
           {{"base", or_null_pct(fit.ttft_mape_base)},
            {"fit", or_null_pct(fit.ttft_mape_fit)},
            {"held_out", or_null_pct(fit.ttft_mape_heldout)}}},
          {"decode_mape_pct",
           {{"base", or_null_pct(fit.decode_mape_base)},
            {"fit", or_null_pct(fit.decode_mape_fit)},
            {"held_out", or_null_pct(fit.decode_mape_heldout)}}}};
}

void calibrate_measurements(const CalibrateRequest& r, CalibrateResult& res) {
  const std::string base_name = load_base(r, res);
  const PointMapping map{parse_map(r.model_map, "--model-map"), parse_map(r.hw_map, "--hw-map"), r.weights,
                         r.compute, r.kv};
  for (const auto& [file_name, preset] : map.models) preset_config(preset);  // unknown presets fail here
  for (const auto& [file_name, profile] : map.hardware)
    if (profile != res.base.name) hw::load_profile(profile);
  sim::validate(sim::Precision{r.weights.empty() ? "bf16" : r.weights, r.compute.empty() ? "bf16" : r.compute,
                               r.kv.empty() ? "bf16" : r.kv});
  // Everything is read and checked before anything is fitted or written.
  const MeasurementSet set = read_measurement_set(r.measurements);
  const PointSelection sel = select_points(set, res.base, map);
  const hw::Profile fitted = fit_measurements(res.base, sel.points, r.fit, &res.fit);
  const MeasurementFit& fit = res.fit;

  res.records = set.records.size();
  res.files = set.files.size();
  res.repeated = set.repeated;
  res.unnamed_hw = sel.unnamed_hw;
  res.skipped = sel.skipped(res.base.name);
  res.notes = sel.notes;
  for (size_t i = 0; i < sel.points.size(); ++i) {
    const Point& p = sel.points[i];
    res.points.push_back({p.m->file, p.m->model, p.preset, p.m->record, p.ttft, p.m->prompt_tokens,
                          p.m->context_tokens, p.m->batch, p.m->tp, p.m->repetitions, p.measured_s,
                          fit.base_s[i], fit.fit_s[i], fit.heldout_s[i]});
  }
  res.calibration = calibration_record(base_name, res.base, fitted, set, sel, fit);
  std::string file_list;
  for (const MeasurementFile& f : set.files) file_list += (file_list.empty() ? "" : ", ") + f.path;
  const std::string provenance = fmt::format(
      "calibrated on {} by `lazyprefill calibrate --measurements` from {} points ({} TTFT, {} decode) in {}: "
      "fitted {}; held-out TTFT MAPE {} ({}); other values from {}. File hashes in 'calibration'.",
      today_utc(), sel.points.size(), fit.ttft_points, fit.decode_points, file_list,
      fmt::join(fit.params, ", "),
      fit.ttft_points ? fmt::format("{:.1f}%", 100 * fit.ttft_mape_heldout) : "n/a", fit.cv, base_name);
  res.document = fitted_profile_json(fitted, r.name.empty() ? res.base.name : r.name, provenance);
  res.document["calibration"] = res.calibration;
  finish(res, fitted, r.out);
}

}  // namespace

std::string today_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

CalibrateResult calibrate_profile(const CalibrateRequest& r) {
  if (r.runs.empty() && r.measurements.empty()) usage_fail("give --runs DIR or --measurements FILE...");
  if (!r.runs.empty() && !r.measurements.empty())
    usage_fail("give --runs DIR or --measurements FILE..., not both");
  if (r.base.empty() && !r.base_profile) usage_fail("--base is required: the profile to start from");
  if (!r.runs.empty()) {
    const std::pair<const char*, bool> measurement_only[] = {
        {"--model-map", !r.model_map.empty()}, {"--hw-map", !r.hw_map.empty()},   {"--fit", !r.fit.empty()},
        {"--weights", !r.weights.empty()},     {"--compute", !r.compute.empty()}, {"--kv", !r.kv.empty()},
        {"--engine", !r.engine.empty()}};
    for (const auto& [flag, given] : measurement_only)
      if (given) usage_fail("{} applies to --measurements, not to --runs' per-op fit", flag);
  }
  if (!r.out.empty()) {
    std::vector<std::string> inputs = r.measurements;
    if (!r.base.empty()) inputs.push_back(r.base);
    refuse_output_over_input(r.out, "--out", inputs);
  }
  CalibrateResult res;
  res.from_runs = !r.runs.empty();
  if (res.from_runs)
    calibrate_runs(r, res);
  else
    calibrate_measurements(r, res);
  return res;
}

json CalibrateResult::to_json() const {
  const json written = out.empty() ? json(nullptr) : json(out);
  if (from_runs) {
    json j = calibration_json(fitted, report, runs);
    j["profile"] = written;
    return j;
  }
  json pts = json::array();
  for (const CalibratedPoint& p : points)
    pts.push_back({{"file", p.file},
                   {"record", p.record},
                   {"model", p.model},
                   {"preset", p.preset},
                   {"quantity", p.ttft ? "ttft" : "decode"},
                   {"prompt_tokens", p.prompt_tokens},
                   {"context_tokens", p.context_tokens},
                   {"batch", p.batch},
                   {"tp", p.tp},
                   {"measured_ms", p.measured_s * 1e3},
                   {"repetitions", p.repetitions},
                   {"base_ms", p.base_s * 1e3},
                   {"fit_ms", p.fit_s * 1e3},
                   {"held_out_ms", p.held_out_s * 1e3},
                   {"held_out_error_pct", 100 * (p.held_out_s / p.measured_s - 1)}});
  json checks = json::array();
  for (const ParamCheck& c : fit.checks)
    checks.push_back({{"name", c.name},
                      {"rms_elasticity", c.sensitivity},
                      {"independent_elasticity", c.independent},
                      {"fitted", c.fitted},
                      {"at_bound", c.at_bound},
                      {"relative_error",
                       c.fitted && std::isfinite(c.relative_error) ? json(c.relative_error) : json(nullptr)},
                      {"f_statistic", c.f_stat},
                      {"reason", c.reason}});
  return {{"profile", written}, {"calibration", calibration},
          {"skipped", skipped}, {"repetitions_merged", repeated},
          {"points", pts},      {"parameters", checks}};
}

json calibration_json(const hw::Profile& fitted, const CalibrationReport& rep,
                      const std::vector<RunMeasurement>& runs) {
  json fams = json::array();
  for (const FamilyFit& f : rep.families) {
    const hw::Efficiency& e = fitted.eff(f.family);
    fams.push_back({{"family", hw::family_name(f.family)},
                    {"samples", f.samples},
                    {"fitted", f.fitted},
                    {"half_rows_fitted", f.half_rows_fitted},
                    {"time_share", f.time_share},
                    {"compute", e.compute},
                    {"half_rows", e.half_rows},
                    {"memory", e.memory},
                    {"overhead_us", e.overhead_s * 1e6},
                    {"median_abs_error_pct", 100 * f.median_abs_err},
                    {"p90_abs_error_pct", 100 * f.p90_abs_err},
                    {"optimizer", f.stop.empty() ? "converged" : f.stop}});
  }
  json rs = json::array();
  for (size_t i = 0; i < rep.runs.size(); ++i)
    rs.push_back({{"run", runs[i].origin},
                  {"prompt_tokens", runs[i].prompt_tokens},
                  {"measured_ms", rep.runs[i].first * 1e3},
                  {"predicted_ms", rep.runs[i].second * 1e3},
                  {"error_pct", 100 * (rep.runs[i].second / rep.runs[i].first - 1)}});
  return {{"families", fams}, {"runs", rs}};
}

json fitted_profile_json(const hw::Profile& fitted, const std::string& name, const std::string& provenance) {
  json j = fitted.json;
  j["name"] = name;
  j["efficiency"] = hw::efficiency_json(fitted);
  j["sources"]["efficiency"] = provenance;
  if (fitted.engine.name != "custom") j["engine"] = fitted.engine.name;  // what the fit was costed with
  return j;
}

void write_fitted_profile(const std::string& path, const hw::Profile& fitted, const std::string& name,
                          const std::string& provenance) {
  write_file_atomic(path, json_text(fitted_profile_json(fitted, name, provenance)) + "\n", "profile");
}

}  // namespace lp::calib
