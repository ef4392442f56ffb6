// lazyprefill._core's calibrate and calibrate_serving (nanobind) over the calibrate room's calls
// (calibrate/calibrate_study.h, calibrate/calibrate_serving_study.h), as module.cpp binds the
// simulator's: keyword arguments with the CLI's names and defaults, typed results in SI units (shares,
// not percent), to_dict()/to_json() the CLI's --json documents, and the fitted profile as a Profile
// to pass back to simulate or simulate_serving. docs/python.md.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <string>
#include <vector>

#include "calibrate/calibrate_serving_study.h"
#include "calibrate/calibrate_study.h"
#include "convert.h"
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace lp::py {
namespace {

// A profile argument: a built-in name or a .json path (kept as given: the provenance names it), or a
// Profile.
void profile_from(const nb::handle& h, const char* what, std::string& name,
                  std::optional<hw::Profile>& profile) {
  if (nb::isinstance<hw::Profile>(h))
    profile = nb::cast<hw::Profile>(h);
  else if (nb::isinstance<nb::str>(h))
    name = nb::cast<std::string>(h);
  else
    throw nb::type_error(fmt::format("{}: expected a profile name, a .json path or a Profile", what).c_str());
}

// NAME=VALUE pairs as the CLI takes them (--model-map), from a dict or from strings.
std::vector<std::string> pairs_from(const nb::handle& h, const char* what) {
  if (!nb::isinstance<nb::dict>(h)) return strings_from(h, what);
  std::vector<std::string> out;
  for (auto [k, v] : nb::borrow<nb::dict>(h)) {
    if (!nb::isinstance<nb::str>(k) || !nb::isinstance<nb::str>(v))
      throw nb::type_error(fmt::format("{}: expected a dict of names to names", what).c_str());
    out.push_back(nb::cast<std::string>(k) + "=" + nb::cast<std::string>(v));
  }
  return out;
}

// A comma list or a list of strings, as the CLI's --fit.
std::vector<std::string> list_from(const nb::handle& h, const char* what) {
  std::vector<std::string> out;
  for (const std::string& s : strings_from(h, what))
    for (std::string& part : split_list(s)) out.push_back(std::move(part));
  return out;
}

// Where a result was written: None for nowhere.
std::optional<std::string> written(const std::string& path) {
  if (path.empty()) return std::nullopt;
  return path;
}

// The end-to-end fit's three errors; NaNs for the per-op fit, which has none.
nb::tuple mapes(const calib::CalibrateResult& r, double base, double fit, double held_out) {
  if (r.from_runs) base = fit = held_out = std::nan("");
  return nb::make_tuple(base, fit, held_out);
}

double share(double percent) {
  return percent / 100;
}

template <class F>
nb::object per_point(const std::vector<calib::CalibratedPoint>& points, F f) {
  std::vector<double> v;
  for (const calib::CalibratedPoint& p : points) v.push_back(f(p));
  return to_numpy(std::move(v), {points.size()});
}

// One of calibrate-serving's per-point figures as [points, figures] (s for times, tokens/s for
// throughput); NaN where a benchmark does not give the figure.
template <class F>
nb::object per_figure(const calib::ServingFit& fit, F f) {
  std::vector<double> v;
  for (const calib::PointResult& p : fit.points)
    for (int k = 0; k < calib::kFigures; ++k) v.push_back(f(p)[k]);
  return to_numpy(std::move(v), {fit.points.size(), size_t(calib::kFigures)});
}
nb::object mape(const double (&m)[calib::kFigures]) {
  std::vector<double> v;
  for (double x : m) v.push_back(share(x));
  return to_numpy(std::move(v), {size_t(calib::kFigures)});
}

}  // namespace

void bind_calibrate(nb::module_& m) {
  using calib::CalibrateResult;
  using calib::CalibrateServingResult;

  // ---- calibrate
  nb::class_<calib::FamilyFit>(m, "FamilyFit", "calibrate --runs: one op family's fit")
      .def_prop_ro("family", [](const calib::FamilyFit& f) { return std::string(hw::family_name(f.family)); })
      .def_ro("samples", &calib::FamilyFit::samples)
      .def_ro("fitted", &calib::FamilyFit::fitted, "False: too few samples, the base's values kept")
      .def_ro("half_rows_fitted", &calib::FamilyFit::half_rows_fitted)
      .def_ro("time_share", &calib::FamilyFit::time_share, "share of the measured time in this family")
      .def_ro("median_abs_error", &calib::FamilyFit::median_abs_err, "|predicted / measured - 1|, a share")
      .def_ro("p90_abs_error", &calib::FamilyFit::p90_abs_err)
      .def_prop_ro("optimizer", [](const calib::FamilyFit& f) {
        return f.stop.empty() ? std::string("converged") : f.stop;
      });

  nb::class_<calib::CalibratedPoint>(m, "CalibratedPoint", "calibrate --measurements: one measured figure")
      .def_ro("file", &calib::CalibratedPoint::file)
      .def_ro("record", &calib::CalibratedPoint::record, "1-based: the array element or the line")
      .def_ro("model", &calib::CalibratedPoint::model, "as the file names it")
      .def_ro("preset", &calib::CalibratedPoint::preset)
      .def_prop_ro("quantity",
                   [](const calib::CalibratedPoint& p) { return std::string(p.ttft ? "ttft" : "decode"); })
      .def_ro("prompt_tokens", &calib::CalibratedPoint::prompt_tokens)
      .def_ro("context_tokens", &calib::CalibratedPoint::context_tokens)
      .def_ro("batch", &calib::CalibratedPoint::batch)
      .def_ro("tp", &calib::CalibratedPoint::tp)
      .def_ro("repetitions", &calib::CalibratedPoint::repetitions)
      .def_ro("measured_s", &calib::CalibratedPoint::measured_s, "TTFT, or seconds per generated token")
      .def_ro("base_s", &calib::CalibratedPoint::base_s, "the base profile's prediction")
      .def_ro("fit_s", &calib::CalibratedPoint::fit_s, "the fitted profile's")
      .def_ro("held_out_s", &calib::CalibratedPoint::held_out_s, "the fit without this point's");

  nb::class_<calib::ParamCheck>(m, "ParameterCheck", "calibrate --measurements: one candidate parameter")
      .def_ro("name", &calib::ParamCheck::name)
      .def_ro("rms_elasticity", &calib::ParamCheck::sensitivity)
      .def_ro("independent_elasticity", &calib::ParamCheck::independent)
      .def_ro("fitted", &calib::ParamCheck::fitted)
      .def_ro("at_bound", &calib::ParamCheck::at_bound)
      .def_prop_ro(
          "relative_error",
          [](const calib::ParamCheck& c) -> std::optional<double> {
            if (!c.fitted || !std::isfinite(c.relative_error)) return std::nullopt;
            return c.relative_error;
          },
          "one standard error, relative (None: not fitted, or no degree of freedom left)")
      .def_ro("f_statistic", &calib::ParamCheck::f_stat)
      .def_ro("reason", &calib::ParamCheck::reason, "why it was not fitted");

  nb::class_<CalibrateResult>(
      m, "Calibration", "calibrate's result: the fitted profile and how well it fits (shares, not percent)")
      .def_prop_ro(
          "profile", [](const CalibrateResult& r) { return r.profile; },
          "the fitted Profile, as a run given the written file loads it")
      .def_ro("base", &CalibrateResult::base)
      .def_prop_ro(
          "out", [](const CalibrateResult& r) { return written(r.out); }, "the file written, or None")
      .def_prop_ro(
          "source",
          [](const CalibrateResult& r) { return std::string(r.from_runs ? "runs" : "measurements"); },
          "'runs' (the per-op fit) or 'measurements' (the end-to-end fit)")
      // --runs
      .def_prop_ro(
          "families", [](const CalibrateResult& r) { return r.report.families; }, "runs: per op family")
      .def_prop_ro(
          "runs",
          [](const CalibrateResult& r) {
            std::vector<std::string> v;
            for (const calib::RunMeasurement& m : r.runs) v.push_back(m.origin);
            return v;
          },
          "runs: the run files' names, in the arrays' order")
      .def_prop_ro(
          "predicted_s",
          [](const CalibrateResult& r) {
            std::vector<double> v;
            for (const auto& [measured, predicted] : r.report.runs) v.push_back(predicted);
            return to_numpy(std::move(v));
          },
          "runs: each run's prefill as the fitted profile predicts it")
      // --measurements
      .def_ro("points", &CalibrateResult::points, "measurements: the points fitted")
      .def_prop_ro(
          "fitted_parameters", [](const CalibrateResult& r) { return r.fit.params; },
          "measurements: in candidate order")
      .def_prop_ro(
          "parameters", [](const CalibrateResult& r) { return r.fit.checks; },
          "measurements: every candidate")
      .def_prop_ro(
          "base_s",
          [](const CalibrateResult& r) { return per_point(r.points, [](auto& p) { return p.base_s; }); },
          "measurements: per point")
      .def_prop_ro(
          "fit_s",
          [](const CalibrateResult& r) { return per_point(r.points, [](auto& p) { return p.fit_s; }); },
          "measurements: per point")
      .def_prop_ro(
          "held_out_s",
          [](const CalibrateResult& r) { return per_point(r.points, [](auto& p) { return p.held_out_s; }); },
          "measurements: per point")
      .def_prop_ro(
          "measured_s",
          [](const CalibrateResult& r) {
            if (!r.from_runs) return per_point(r.points, [](auto& p) { return p.measured_s; });
            std::vector<double> v;
            for (const auto& [measured, predicted] : r.report.runs) v.push_back(measured);
            return to_numpy(std::move(v));
          },
          "per run (runs: prefill) or per point (measurements)")
      .def_prop_ro(
          "cross_validation",
          [](const CalibrateResult& r) -> std::optional<std::string> {
            if (r.from_runs) return std::nullopt;
            return r.fit.cv;
          },
          "measurements: 'leave-one-out' or '10-fold' (None for runs)")
      .def_prop_ro(
          "ttft_mape",
          [](const CalibrateResult& r) {
            return mapes(r, r.fit.ttft_mape_base, r.fit.ttft_mape_fit, r.fit.ttft_mape_heldout);
          },
          "measurements: (base, fitted, held out) mean |predicted / measured - 1|; NaNs without TTFTs and "
          "for runs")
      .def_prop_ro(
          "decode_mape",
          [](const CalibrateResult& r) {
            return mapes(r, r.fit.decode_mape_base, r.fit.decode_mape_fit, r.fit.decode_mape_heldout);
          },
          "measurements: as ttft_mape, over the decode latencies")
      .def_ro("skipped", &CalibrateResult::skipped, "measurements: what was left out and why")
      .def_ro("notes", &CalibrateResult::notes, "measurements: the importers' notes -> records")
      .def_ro("records", &CalibrateResult::records)
      .def_ro("repetitions_merged", &CalibrateResult::repeated)
      .def(
          "to_dict", [](const CalibrateResult& r) { return to_python(r.to_json()); },
          "`lazyprefill calibrate --json`'s document")
      .def(
          "to_json", [](const CalibrateResult& r, int indent) { return json_text(r.to_json(), indent); },
          "indent"_a = 2);

  m.def(
      "calibrate",
      [](const nb::handle& base, const std::optional<std::string>& runs, const nb::handle& measurements,
         const std::optional<std::string>& out, const std::optional<std::string>& name,
         const nb::handle& model_map, const nb::handle& hw_map, const nb::handle& fit,
         const std::optional<std::string>& weights, const std::optional<std::string>& compute,
         const std::optional<std::string>& kv, const std::optional<std::string>& engine) {
        calib::CalibrateRequest r;
        profile_from(base, "base", r.base, r.base_profile);
        r.runs = runs.value_or("");
        r.measurements = strings_from(measurements, "measurements");
        r.out = out.value_or("");
        r.name = name.value_or("");
        r.model_map = pairs_from(model_map, "model_map");
        r.hw_map = pairs_from(hw_map, "hw_map");
        r.fit = list_from(fit, "fit");
        r.weights = weights.value_or("");
        r.compute = compute.value_or("");
        r.kv = kv.value_or("");
        r.engine = engine.value_or("");
        nb::gil_scoped_release unlocked;
        return calib::calibrate_profile(r);
      },
      nb::kw_only(), "base"_a, "runs"_a = nb::none(), "measurements"_a = nb::none(), "out"_a = nb::none(),
      "name"_a = nb::none(), "model_map"_a = nb::none(), "hw_map"_a = nb::none(), "fit"_a = nb::none(),
      "weights"_a = nb::none(), "compute"_a = nb::none(), "kv"_a = nb::none(), "engine"_a = nb::none(),
      "`lazyprefill calibrate` (docs/measurements.md): a profile fitted to run --json outputs (runs: a "
      "folder) or "
      "to end-to-end measurements (measurements: a file or a list); model_map and hw_map a dict or "
      "NAME=VALUE "
      "strings; with out, the fitted profile written there.");

  // ---- calibrate-serving
  nb::class_<CalibrateServingResult>(
      m, "ServingCalibration",
      "calibrate_serving's result: the engine's fitted times, each figure measured and predicted")
      .def_ro("model", &CalibrateServingResult::model)
      .def_prop_ro("hw", [](const CalibrateServingResult& r) { return r.hw.name; })
      .def_prop_ro("engine", [](const CalibrateServingResult& r) { return r.hw.engine.name; })
      .def_prop_ro(
          "profile", [](const CalibrateServingResult& r) { return r.profile; },
          "the profile with the fitted engine, as a run given the written file loads it")
      .def_prop_ro(
          "out", [](const CalibrateServingResult& r) { return written(r.out); }, "the file written, or None")
      .def_prop_ro("kernel_scale", [](const CalibrateServingResult& r) { return r.fit.scale; })
      .def_prop_ro(
          "iteration_overhead_s", [](const CalibrateServingResult& r) { return r.fit.iteration_s; }, "s")
      .def_prop_ro(
          "request_overhead_s", [](const CalibrateServingResult& r) { return r.fit.request_s; }, "s")
      .def_prop_ro("simulations", [](const CalibrateServingResult& r) { return r.fit.simulations; })
      .def_prop_ro(
          "figures",
          [](const CalibrateServingResult&) {
            std::vector<std::string> v;
            for (int k = 0; k < calib::kFigures; ++k) v.emplace_back(calib::figure_name(calib::Figure(k)));
            return v;
          },
          "the arrays' second axis: p50 and p90 TTFT and ITL (s), throughput (output tokens/s)")
      .def_prop_ro(
          "benchmarks",
          [](const CalibrateServingResult& r) {
            std::vector<std::string> v;
            for (const calib::PointResult& p : r.fit.points) v.push_back(p.where);
            return v;
          },
          "the arrays' first axis")
      .def_prop_ro(
          "rate",
          [](const CalibrateServingResult& r) {
            std::vector<double> v;
            for (const calib::PointResult& p : r.fit.points) v.push_back(p.rate);
            return to_numpy(std::move(v));
          },
          "requests/s per benchmark (inf: all at once)")
      .def_prop_ro(
          "measured",
          [](const CalibrateServingResult& r) {
            return per_figure(r.fit, [](auto& p) { return p.measured; });
          },
          "[benchmarks, figures]; NaN where the benchmark does not give it")
      .def_prop_ro("uncalibrated",
                   [](const CalibrateServingResult& r) {
                     return per_figure(r.fit, [](auto& p) { return p.uncalibrated; });
                   })
      .def_prop_ro("calibrated",
                   [](const CalibrateServingResult& r) {
                     return per_figure(r.fit, [](auto& p) { return p.calibrated; });
                   })
      .def_prop_ro(
          "held_out",
          [](const CalibrateServingResult& r) {
            return per_figure(r.fit, [](auto& p) { return p.held_out; });
          },
          "each benchmark predicted by the fit of the others (NaN with one)")
      .def_prop_ro(
          "mape_uncalibrated", [](const CalibrateServingResult& r) { return mape(r.fit.mape_uncalibrated); },
          "[figures], mean |predicted / measured - 1| (a share)")
      .def_prop_ro("mape_calibrated",
                   [](const CalibrateServingResult& r) { return mape(r.fit.mape_calibrated); })
      .def_prop_ro("mape_held_out", [](const CalibrateServingResult& r) { return mape(r.fit.mape_held_out); })
      .def(
          "to_dict", [](const CalibrateServingResult& r) { return to_python(r.to_json()); },
          "`lazyprefill calibrate-serving --json`'s document")
      .def(
          "to_json",
          [](const CalibrateServingResult& r, int indent) { return json_text(r.to_json(), indent); },
          "indent"_a = 2);

  const calib::CalibrateServingRequest ds;
  m.def(
      "calibrate_serving",
      [](const nb::handle& benchmark, const nb::handle& hw, const std::optional<std::string>& model,
         const nb::handle& model_config, const std::optional<std::string>& engine, const std::string& weights,
         const std::string& compute, const std::string& kv, const std::optional<std::string>& expert_weights,
         std::optional<int64_t> max_batch_tokens, std::optional<int64_t> chunk_tokens,
         std::optional<int64_t> max_seqs, std::optional<int64_t> kv_block_tokens,
         std::optional<double> iteration_overhead_ms, std::optional<double> request_overhead_ms,
         const std::optional<std::string>& kv_mode, std::optional<bool> mixed, int tp,
         std::optional<double> kv_budget_mib, double kv_fraction, std::optional<double> kv_element_bytes,
         const nb::handle& fit, uint64_t seed, const std::optional<std::string>& out) {
        calib::CalibrateServingRequest r;
        r.benchmarks = strings_from(benchmark, "benchmark");
        profile_from(hw, "hw", r.hw, r.hw_profile);
        target_from(model, model_config, r);
        r.engine = engine.value_or("");
        r.precision = sim::Precision(weights, compute, kv, expert_weights.value_or(""));
        r.sched = {
            max_batch_tokens,    chunk_tokens,         max_seqs, kv_block_tokens, iteration_overhead_ms,
            request_overhead_ms, kv_mode.value_or(""), mixed};
        r.tp = tp;
        r.kv_budget_mib = kv_budget_mib;
        r.kv_fraction = kv_fraction;
        r.kv_element_bytes = kv_element_bytes.value_or(0);
        r.fit = fmt::format("{}", fmt::join(list_from(fit, "fit"), ","));
        r.seed = seed;
        r.out = out.value_or("");
        nb::gil_scoped_release unlocked;
        return calib::calibrate_serving(r);
      },
      nb::kw_only(), "benchmark"_a, "hw"_a, "model"_a = nb::none(), "model_config"_a = nb::none(),
      "engine"_a = nb::none(), "weights"_a = ds.precision.weights, "compute"_a = ds.precision.compute,
      "kv"_a = ds.precision.kv, "expert_weights"_a = nb::none(), "max_batch_tokens"_a = nb::none(),
      "chunk_tokens"_a = nb::none(), "max_seqs"_a = nb::none(), "kv_block_tokens"_a = nb::none(),
      "iteration_overhead_ms"_a = nb::none(), "request_overhead_ms"_a = nb::none(), "kv_mode"_a = nb::none(),
      "mixed"_a = nb::none(), "tp"_a = ds.tp, "kv_budget_mib"_a = nb::none(),
      "kv_fraction"_a = ds.kv_fraction, "kv_element_bytes"_a = nb::none(), "fit"_a = ds.fit,
      "seed"_a = ds.seed, "out"_a = nb::none(),
      "`lazyprefill calibrate-serving` (docs/cli.md): an engine's scheduler fitted to serving "
      "benchmark files (benchmark: a path or a list); with out, the profile with the fitted engine written "
      "there.");
}

}  // namespace lp::py
