// `lazyprefill validate --serving DIR`: the serving simulation against a measured load test. The
// steps (read the load test, calibrate, the machine's drift, every rate compared) are
// calibrate/serving_validation.h's; this renders their results as JSON and a table.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "calibrate/serving_validation.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

json calibration_json(const ValidateArgs& a, const calib::ServingCalibration& cal) {
  const auto rms = [](const std::map<std::string, double>& m) {
    json j = json::object();
    for (const auto& [k, v] : m) j[k] = v;
    return j;
  };
  const auto& lf = cal.lone_fit;
  return {{"base", a.base},
          {"points", cal.points},
          {"fitted", cal.fit.params},
          {"ttft_mape_fit", cal.fit.ttft_mape_fit},
          {"decode_mape_fit", cal.fit.decode_mape_fit},
          {"revival_share", cal.revival_share},
          {"revival_model", cal.revival_model ? json(cal.revival_model->origin) : json(nullptr)},
          {"decode_attention_compute", cal.decode_compute},
          {"lone_decodes", lf ? json{{"spans", lf->spans},
                                     {"listed_compute", lf->listed_compute},
                                     {"listed_memory", lf->listed_memory},
                                     {"pruning_stage_us", lf->stage_us},
                                     {"pruning_key_ns", lf->key_ns},
                                     {"scale_on_the_load_tests_lone_decodes", lf->scale},
                                     {"attention_rms_log_error_before", lf->attention_rms_before},
                                     {"attention_rms_log_error_after", lf->attention_rms_after},
                                     {"pruning_rms_log_error_before", lf->pruning_rms_before},
                                     {"pruning_rms_log_error_after", lf->pruning_rms_after}}
                              : json(nullptr)},
          {"decode_rms_log_error_before", rms(cal.decode_rms_before)},
          {"decode_rms_log_error_after", rms(cal.decode_rms_after)}};
}

json row_json(const calib::RateComparison& r) {
  json measured, predicted, error, uncertainty;
  for (const calib::Figure f : calib::kFigures) {
    const calib::FigureCheck& c = r.figures.at(f);
    measured[calib::figure_field(f)] = c.measured;
    predicted[calib::figure_field(f)] = c.predicted;
    error[calib::figure_key(f)] = c.error;
    json u = {{"predicted_band", {c.band_lo, c.band_hi}}};
    if (c.interval) {
      u["measured_interval_95"] = {c.interval->lo, c.interval->hi};
      u["measured_interval_open"] = {c.interval->lo_open, c.interval->hi_open};
    }
    u["consistent"] = c.consistent;
    uncertainty[calib::figure_key(f)] = std::move(u);
  }
  return {{"rate", r.rate},
          {"method", r.method},
          {"calibrated_on", r.calibrated_on},
          {"measured", std::move(measured)},
          {"predicted", std::move(predicted)},
          {"error", std::move(error)},
          {"uncertainty", std::move(uncertainty)},
          {"below_saturation", r.below_saturation}};
}

json outside_json(const calib::OutsideTarget& o) {
  json j = {{"rate", o.rate},
            {"method", o.method},
            {"figure", calib::figure_key(o.figure)},
            {"error", o.error},
            {"consistent", o.consistent}};
  if (o.sampling) {
    const calib::SamplingSpread& s = *o.sampling;
    json sp = {
        {"requests", s.requests}, {"draws", s.draws}, {"sample_size", s.sample_size}, {"stable", s.stable}};
    if (s.stable) {
      sp["long_run"] = s.long_run;
      sp["share_within_10pct"] = s.share_within_10pct;
      sp["sample_range_90"] = {s.lo, s.hi};
    }
    j["sampling"] = std::move(sp);
  }
  return j;
}

// A figure outside its target, one line: measured (with its interval), predicted, the band, and
// how well the rate's requests can pin it.
std::string outside_line(const calib::OutsideTarget& o, const calib::RateComparison& r, int64_t per_rate) {
  const calib::FigureCheck& c = r.figures.at(o.figure);
  const char* k = calib::figure_key(o.figure);
  std::string sampling;
  if (o.sampling && o.sampling->stable)
    sampling = fmt::format(
        "; {}-request {}s of the simulation's own {} Poisson requests at this rate fall within 10% "
        "of their long-run {:.4g} in {:.0f}% of {} draws (5-95%: {:.4g}-{:.4g})",
        per_rate, k, o.sampling->requests, o.sampling->long_run, 100 * o.sampling->share_within_10pct,
        o.sampling->draws, o.sampling->lo, o.sampling->hi);
  std::string interval;  // throughput has none
  if (c.interval)
    interval = fmt::format(" [95%: {}{:.4g}-{:.4g}{}]", c.interval->lo_open ? "<=" : "", c.interval->lo,
                           c.interval->hi, c.interval->hi_open ? "+" : "");
  return fmt::format(
      "  {} {} {}: measured {:.4g}{}, predicted {:.4g} ({:+.0f}%), {:.4g}-{:.4g} over the machine's "
      "drift: {}{}\n",
      o.rate, o.method, k, c.measured, interval, c.predicted, 100 * c.error, c.band_lo, c.band_hi,
      o.consistent ? "within the measurement's own uncertainty" : "outside its uncertainty", sampling);
}

json validation_json(const ValidateArgs& a, const std::string& preset, const calib::ServingCalibration& cal,
                     const calib::MachineDrift& drift, const calib::RateComparisons& cmp) {
  json out;
  out["validation"] = "serving";
  out["fixtures"] = a.serving;
  out["model"] = preset;
  out["calibration"] = calibration_json(a, cal);
  for (const calib::Saturation& s : cmp.saturation)
    out["saturation"][s.method] = {{"measured_requests_per_s", s.measured},
                                   {"predicted_requests_per_s", s.predicted},
                                   {"error", s.error}};
  json rows = json::array();
  for (const calib::RateComparison& r : cmp.rows) rows.push_back(row_json(r));
  out["rates"] = std::move(rows);
  json by_rate = json::array();
  for (const calib::DriftPoint& d : drift.by_rate)
    by_rate.push_back(
        {{"rate", d.rate}, {"method", d.method}, {"lone_prefills", d.lone_prefills}, {"drift", d.drift}});
  out["machine_drift"] = {{"largest", drift.largest}, {"by_rate", std::move(by_rate)}};
  out["worst_error_below_saturation"] = cmp.worst_below_saturation;
  out["within_targets"] = cmp.within_targets;
  json outside = json::array();
  for (const calib::OutsideTarget& x : cmp.outside) outside.push_back(outside_json(x));
  out["outside_targets"] = std::move(outside);
  out["outside_targets_within_uncertainty"] = cmp.outside_within_uncertainty;

  return out;
}

std::string validation_text(const ValidateArgs& a, const calib::LoadTest& t,
                            const calib::ServingCalibration& cal, const calib::MachineDrift& drift,
                            const calib::RateComparisons& cmp) {
  std::string text = fmt::format(
      "serving validation on {}: calibrated on {} single-request points of the lowest rate (fitted {}; "
      "{}; decoding attention at {:.3f} of peak, fitted on {} lone decodes), every request replayed at its "
      "logged arrival\n",
      a.serving, cal.points, fmt::join(cal.fit.params, ", "),
      cal.revival_model
          ? fmt::format("revivals from {}", cal.revival_model->origin)
          : fmt::format("revival share {:.4f} per stage and step from its log", cal.revival_share),
      cal.decode_compute, cal.lone_decodes);
  if (const auto& lf = cal.lone_fit)
    text += fmt::format(
        "decoding over listed keys fitted on {} spans of lone LazyLLM runs ({}/lone): {:.3f} of peak over "
        "rows x held keys plus the held K/V at {:.3f} of the bandwidth (attention RMS log error {:.3f} -> "
        "{:.3f}); pruning stages {:.0f} us + {:.1f} ns a key (RMS log error {:.3f} -> {:.3f}); their time "
        "x{:.3f} on the lone "
        "LazyLLM decodes above\n",
        lf->spans, a.serving, lf->listed_compute, lf->listed_memory, lf->attention_rms_before,
        lf->attention_rms_after, lf->stage_us, lf->key_ns, lf->pruning_rms_before, lf->pruning_rms_after,
        lf->scale);
  text += fmt::format("{:>6} {:<8} {:>17} {:>17} {:>15} {:>15}\n", "rate/s", "method", "TTFT p50 ms (err)",
                      "TTFT p90 ms (err)", "ITL p50 (err)", "req/s (err)");
  for (const calib::Saturation& s : cmp.saturation) {
    for (const calib::RateComparison& r : cmp.rows) {
      if (r.method != s.method) continue;
      const auto& f = r.figures;
      const auto& t50 = f.at(calib::Figure::TtftP50);
      const auto& t90 = f.at(calib::Figure::TtftP90);
      const auto& i50 = f.at(calib::Figure::ItlP50);
      const auto& thr = f.at(calib::Figure::Throughput);
      text += fmt::format(
          "{:>6} {:<8} {:>9.0f} ({:+4.0f}%) {:>9.0f} ({:+4.0f}%) {:>7.1f} ({:+4.0f}%) {:>7.3f} "
          "({:+4.0f}%){}\n",
          r.rate, r.method, t50.measured, 100 * t50.error, t90.measured, 100 * t90.error, i50.measured,
          100 * i50.error, thr.measured, 100 * thr.error, r.calibrated_on ? "  (calibration rate)" : "");
    }
    text += fmt::format(
        "{:>6} {:<8} saturation (highest throughput of a rate): measured {:.3f} req/s, predicted {:.3f} "
        "({:+.0f}%)\n",
        "", s.method, s.measured, s.predicted, 100 * s.error);
  }
  text +=
      fmt::format("worst error below saturation {:.1f}% (target 10%); {}\n", 100 * cmp.worst_below_saturation,
                  cmp.within_targets ? "within the targets" : "NOT within the targets");
  if (!cmp.within_targets) {
    std::string outside_text;
    for (const calib::OutsideTarget& x : cmp.outside)
      outside_text += outside_line(x, cmp.rows[x.row], t.per_rate);
    text += fmt::format(
        "figures outside 10% below saturation, against the measured figure's 95% interval (order statistics "
        "of the rate's {} requests) and the prediction replayed on a machine {:.1f}% faster and slower (the "
        "largest drift of lone prefills between rates in this log):\n{}",
        t.per_rate, 100 * drift.largest, outside_text);
  }
  return text;
}

}  // namespace

int cmd_validate_serving(const ValidateArgs& a) {
  const calib::LoadTest t = calib::read_load_test(a.serving);
  calib::ServingValidationOptions o;
  o.preset = a.model_config.empty() ? "smollm2-135m" : a.model_config;
  o.base = a.base;
  o.dtype = a.serving_dtype;
  o.revival_model = a.revival_model;
  o.revival_share_from_log = a.revival_share_from_log;
  const calib::ServingCalibration cal = calib::calibrate_serving(t, o);
  if (!a.profile_out.empty())
    calib::write_fitted_profile(
        a.profile_out, cal.hw, cal.hw.name + "-serving",
        fmt::format("lazyprefill validate --serving {}: fitted on the lowest rate's lone requests",
                    a.serving));
  const calib::MachineDrift drift = calib::machine_drift(t, cal);
  const calib::RateComparisons cmp = calib::compare_rates(t, cal, drift);
  json j = validation_json(a, o.preset, cal, drift, cmp);
  std::string text = validation_text(a, t, cal, drift, cmp);
  if (!a.prefix_load.empty()) {
    // The prefix cache's load test on the same calibration: its server's budgets, its logged hits.
    const calib::LoadTest p = calib::read_load_test(a.prefix_load);
    calib::ServingCalibration pc = cal;
    pc.config.kv_budget_bytes = double(p.kv_budget_mib) * (1 << 20);
    pc.config.max_batch_tokens = p.max_batch_tokens;
    pc.config.prefix_cache = true;
    const calib::MachineDrift pd = calib::machine_drift(p, pc);
    const calib::RateComparisons pcmp = calib::compare_rates(p, pc, pd);
    json pj = validation_json(a, o.preset, pc, pd, pcmp);
    pj["fixtures"] = a.prefix_load;
    double cached = 0, prompt = 0;
    for (const calib::LoadTest::Method& m : p.methods)
      for (const sim::LoggedRequest& r : m.log)
        cached += double(std::max<int64_t>(r.cached_tokens, 0)), prompt += double(r.prompt_tokens);
    pj["prompt_tokens_cached_share"] = prompt > 0 ? cached / prompt : 0.0;
    j["prefix_cache"] = std::move(pj);
    text += fmt::format(
        "\nprefix cache: {} ({:.0f}% of the prompts' tokens found cached, as logged), replayed on the "
        "calibration "
        "above with those hits\n",
        a.prefix_load, prompt > 0 ? 100 * cached / prompt : 0.0);
    ValidateArgs pa = a;
    pa.serving = a.prefix_load;
    const std::string ptext = validation_text(pa, p, pc, pd, pcmp);
    text += ptext.substr(ptext.rfind('\n', ptext.find("rate/s")) + 1);  // its table and verdict
  }
  print_result(a.json_out, j, text);
  return 0;
}

}  // namespace lp::cli
