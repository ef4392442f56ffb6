// `lazyprefill validate --serving DIR`: the serving simulation (sim/serving.h) against a measured
// load test (bench/serve_load.py's summary and the server's request logs, tests/fixtures/serving/).
// The hardware profile is calibrated on the requests of the lowest rate that ran alone (their
// prefill and decoding times, as single-request measurements), then every request of every rate is
// replayed through the simulated scheduler at its logged arrival time with its logged prompt and
// output lengths, and each rate's TTFT p50/p90, ITL p50 and throughput are compared with the log's
// own. Targets (issue 22): within 10% at every rate below saturation, the saturation throughput
// within 15%.
#include <fmt/format.h>

#include <algorithm>
#include <boost/math/tools/minima.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>

#include "calibrate/fit_measurements.h"
#include "calibrate/lone_decode.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/revival.h"
#include "sim/serving.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

using Logged = sim::LoggedRequest;

// A load test's log: its requests that did not end in an error, each with its times in order.
std::vector<Logged> read_logged(const std::string& path) {
  std::vector<Logged> out;
  for (const Logged& r : sim::read_request_log(path)) {
    if (r.error) continue;
    if (!(r.admitted_s >= r.arrival_s && r.first_token_s >= r.admitted_s &&
          r.finished_s >= r.first_token_s) ||
        r.prompt_tokens < 1 || r.output_tokens < 1)
      fail("{}:{}: times missing or out of order, or empty counts", path, r.line);
    out.push_back(r);
  }
  return out;
}

// Whether no other request of `log` was in the server between r's admission and `until`.
bool ran_alone(const std::vector<Logged>& log, const Logged& r, double until) {
  return std::none_of(log.begin(), log.end(), [&](const Logged& o) {
    return &o != &r && o.admitted_s < until && o.finished_s > r.admitted_s;
  });
}

double rel(double predicted, double measured) {
  return measured != 0 ? predicted / measured - 1 : 0;
}

struct GroupFigures {
  double ttft50 = 0, ttft90 = 0, itl50 = 0, throughput = 0;
};
GroupFigures figures(const std::vector<double>& ttft, const std::vector<double>& itl, double first_arrival,
                     double last_finish, size_t n) {
  GroupFigures g;
  const sim::Percentiles t = sim::percentiles(ttft), i = sim::percentiles(itl);
  g.ttft50 = t.p50, g.ttft90 = t.p90, g.itl50 = i.p50;
  g.throughput = last_finish > first_arrival ? double(n) / (last_finish - first_arrival) : 0;
  return g;
}

// How well `n` requests a rate pin a percentile there (sim::sample_quantile_spread), on the
// simulation's own long run: kLongRun Poisson requests at `rate` with the group's prompt and output
// lengths, each request's TTFT (or mean ITL) in ms. "stable": false where the simulation saturates
// at this rate (its throughput below 95% of the rate: no long run to draw from).
json sampling_spread(const ModelConfig& c, const hw::Profile& hw, const sim::Precision& prec,
                     const sim::ServingMethod& m, const sim::ServingConfig& cfg, double rate,
                     std::span<const Logged> group, bool itl, double q, size_t n) {
  constexpr int64_t kLongRun = 4000;
  constexpr int kDraws = 4000;
  std::vector<int64_t> prompts, outputs;
  for (const Logged& r : group)
    prompts.push_back(r.prompt_tokens), outputs.push_back(std::max<int64_t>(r.output_tokens, 1));
  const auto prompt = sim::LengthDist::from_samples(std::move(prompts)),
             output = sim::LengthDist::from_samples(std::move(outputs));
  const sim::ServingRun run = sim::simulate_serving(
      c, hw, prec, m, cfg, sim::make_workload(kLongRun, {rate, 1.0}, prompt, output, 1));
  const sim::ServingMetrics mm = sim::serving_metrics(run, {});
  json out = {{"requests", kLongRun},
              {"draws", kDraws},
              {"sample_size", n},
              {"stable", mm.requests_per_s >= 0.95 * rate}};
  if (!out["stable"].get<bool>()) return out;
  std::vector<double> v;
  for (const sim::RequestOutcome& o : run.requests)
    if (!itl)
      v.push_back(o.ttft_s() * 1e3);
    else if (o.output_tokens > 1)
      v.push_back(o.itl_s() * 1e3);
  if (v.size() < n) {  // too few requests with an ITL to draw from
    out["stable"] = false;
    return out;
  }
  const sim::SampleSpread sp = sim::sample_quantile_spread(std::move(v), q, n, 0.10, kDraws, 1);
  out["long_run"] = sp.population;
  out["share_within_10pct"] = sp.share_within;
  out["sample_range_90"] = {sp.lo, sp.hi};
  return out;
}

}  // namespace

int cmd_validate_serving(const ValidateArgs& a) {
  const std::filesystem::path dir(a.serving);
  const std::string summary_path = (dir / "serve_load_summary.json").string();
  const json summary = json_parse<json>(
      read_input_file(summary_path, "load-test summary", input_cap::kResults), summary_path, true);
  if (summary.is_discarded() || !summary.is_object()) fail("{}: not a JSON object", summary_path);
  std::vector<double> rates;
  int64_t per_rate = 0, kv_mib = 1024, max_batch = 2048, min_prompt = 1;
  try {
    rates = summary.at("load").at("rates").get<std::vector<double>>();
    per_rate = summary.at("load").at("requests_per_rate").get<int64_t>();
    min_prompt = summary.at("prompts").at("tokens").at("min").get<int64_t>();
    const auto argv = summary.at("argv").get<std::vector<std::string>>();
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--kv-budget-mib") kv_mib = std::stoll(argv[i + 1]);
      if (argv[i] == "--max-batch-tokens") max_batch = std::stoll(argv[i + 1]);
    }
  } catch (const std::exception& e) {
    fail("{}: {}", summary_path, e.what());
  }
  if (rates.empty() || per_rate < 3) fail("{}: needs rates and at least 3 requests per rate", summary_path);

  const std::string preset = a.model_config.empty() ? "smollm2-135m" : a.model_config;
  const ModelConfig c = preset_config(preset);
  const sim::Precision prec = calib::precision_for_dtype(a.serving_dtype);
  const Schedule sched = default_schedule();
  const std::vector<PruneStep> steps = resolve_schedule(sched, c.n_layer);
  struct MethodLog {
    std::string name;
    std::vector<Logged> log;
  };
  std::vector<MethodLog> methods;
  for (const char* m : {"none", "lazyllm"}) {
    const std::string path = (dir / fmt::format("requests_{}.jsonl", m)).string();
    std::vector<Logged> log = read_logged(path);
    // The script's short preflight request is not one of the load's.
    log.erase(
        std::remove_if(log.begin(), log.end(), [&](const Logged& r) { return r.prompt_tokens < min_prompt; }),
        log.end());
    if (log.size() != rates.size() * size_t(per_rate))
      fail("{}: {} requests, but the summary's {} rates x {} make {}", path, log.size(), rates.size(),
           per_rate, rates.size() * size_t(per_rate));
    methods.push_back({m, std::move(log)});
  }

  // Calibration: the lowest rate's requests that ran alone (no other request between their
  // admission and their last token), as single-request measurements: both methods' prefills and
  // the unpruned decoding.
  struct Lone {
    const MethodLog* method;
    const Logged* r;
  };
  std::vector<Lone> lone;
  for (const MethodLog& ml : methods)
    for (int64_t i = 0; i < per_rate; ++i) {
      const Logged& r = ml.log[size_t(i)];
      if (ran_alone(ml.log, r, r.finished_s)) lone.push_back({&ml, &r});
    }
  std::vector<calib::Measurement> ms;
  for (const Lone& l : lone) {
    const Logged& r = *l.r;
    const bool pruned = l.method->name != "none";
    calib::Measurement t;
    t.file = l.method->name;
    t.record = int(l.r - l.method->log.data()) + 1;
    t.framework = "lazyprefill serve";
    t.model = preset;
    t.hardware = a.base;
    t.dtype = a.serving_dtype;
    t.method = pruned ? "lazyllm " + sched.to_string() : "none";
    t.prompt_tokens = r.prompt_tokens;
    t.ttft_ms = (r.first_token_s - r.admitted_s) * 1e3;
    ms.push_back(t);
    // A pruned run's decoding steps revive tokens, which single-request points do not model
    // (calibrate leaves them out too); decoding attention's own share is fitted on them below,
    // through the serving simulation and its revival model.
    if (r.output_tokens > 1 && !pruned) {
      calib::Measurement d = t;
      d.ttft_ms.reset();
      d.prompt_tokens = 0;
      d.context_tokens = r.prompt_tokens;
      d.decode_tokens = r.output_tokens - 1;
      d.decode_ms_per_token = (r.finished_s - r.first_token_s) / double(r.output_tokens - 1) * 1e3;
      ms.push_back(d);
    }
  }
  if (ms.size() < 4)
    fail("{}: fewer than 2 requests of the lowest rate ran alone: nothing to calibrate on", a.serving);
  std::vector<calib::Point> points;
  for (const calib::Measurement& m : ms) points.push_back(calib::make_point(m, preset, c, prec));
  calib::MeasurementFit fit;
  // The fit starts with one row as the row count at which GEMMs and attention reach half their
  // share of peak: this engine's decoding rows run its packed integer kernels, bound by the
  // weights' bytes rather than starved of rows (docs/cpu-kernels.md), and the stepwise selection
  // from cpu-local's 62 and 88 rows (an f32 engine's) keeps TTFT and leaves decoding 3x off.
  hw::Profile base = hw::load_profile(a.base);
  calib::set_param(base, "gemm.half_rows", 1);
  calib::set_param(base, "attention.half_rows", 1);
  hw::Profile hw = calib::fit_measurements(base, points, {}, &fit);

  // Decoding over listed key sets and the pruning stages' cost, fitted on single LazyLLM requests
  // measured op by op (DIR/lone, calibrate/lone_decode.h): a lone request's mean time per token
  // cannot tell them from decoding attention's share of peak, fitted after them below.
  std::optional<calib::LoneDecodeFit> lone_fit;
  if (const std::filesystem::path lone_dir = dir / "lone"; std::filesystem::exists(lone_dir))
    lone_fit = calib::fit_lone_decodes(hw, c, prec, calib::load_lone_decodes(lone_dir.string()));

  // Revivals: a revival model fitted on traces of the load test's own prompts (DIR/revivals.json,
  // or --revival-model: a request revives most in its first decoding steps, docs/serving.md), or
  // with --revival-share-from-log the share of each stage's active tokens revived per decoding
  // step that gives the revivals the server counted (active after stage s: the product of the
  // kept shares so far; the built-in revival model was fitted on other prompts).
  double revived = 0, exposure = 0, active_per_token = 0, kept = 1;
  for (const PruneStep& st : steps) kept *= 1 - st.share, active_per_token += kept;
  for (const MethodLog& ml : methods)
    if (ml.name != "none")
      for (int64_t i = 0; i < per_rate; ++i) {
        const Logged& r = ml.log[size_t(i)];
        revived += double(r.revivals);
        exposure += double(r.output_tokens - 1) * double(r.prompt_tokens) * active_per_token;
      }
  const double revival_share = exposure > 0 ? revived / exposure : 0;
  std::optional<sim::RevivalModel> revival_model;
  if (!a.revival_model.empty())
    revival_model = sim::load_revival_model(a.revival_model);
  else if (const auto own = dir / "revivals.json"; !a.revival_share_from_log && std::filesystem::exists(own))
    revival_model = sim::load_revival_model(own.string());
  const auto serving_method = [&](const std::string& name) {
    sim::ServingMethod m;
    m.name = m.policy = name;
    if (name != "none") {
      m.steps = steps;
      m.revivals = revival_model ? sim::revival_shares(*revival_model, c.n_layer, steps, false)
                                 : sim::constant_revival_share(revival_share);
    }
    return m;
  };

  sim::ServingConfig cfg;
  cfg.kv_budget_bytes = double(kv_mib) * (1 << 20);
  cfg.max_batch_tokens = max_batch;
  cfg.kv_element_bytes = 2;  // the CPU backend's f16 cache

  // Decoding attention's share of peak (efficiency.attention.decode_compute): LazyLLM's decoding
  // steps attend with the rows they revive, hundreds in a step's first layers, each over keys
  // read back from memory, in small tiles that run at a third of prefill's rate on this engine
  // (docs/serving.md). Fitted on the same lone requests' decoding, both methods, through the
  // serving simulation: the share minimising the squared log error of each request's mean time
  // per token (Brent's method over its log).
  struct LoneDecode {
    const MethodLog* method;
    sim::ServingRequest req;
    double itl_s;
  };
  std::vector<LoneDecode> decodes;
  for (const Lone& l : lone)
    if (l.r->output_tokens > 1)
      decodes.push_back({l.method,
                         {0, l.r->prompt_tokens, l.r->output_tokens},
                         (l.r->finished_s - l.r->first_token_s) / double(l.r->output_tokens - 1)});
  const std::map<std::string, sim::ServingMethod> by_name = {{"none", serving_method("none")},
                                                             {"lazyllm", serving_method("lazyllm")}};
  // Per method, the RMS log error of the lone decodes' time per token under profile `p`.
  const auto decode_errors = [&](const hw::Profile& p) {
    std::map<std::string, std::pair<double, int>> sse;
    for (const LoneDecode& d : decodes) {
      const sim::ServingRun one =
          sim::simulate_serving(c, p, prec, by_name.at(d.method->name), cfg, std::span(&d.req, 1));
      const double e = std::log(one.requests[0].itl_s() / d.itl_s);
      sse[d.method->name].first += e * e;
      ++sse[d.method->name].second;
    }
    return sse;
  };
  const auto total = [](const std::map<std::string, std::pair<double, int>>& sse) {
    double s = 0;
    for (const auto& [m, v] : sse) s += v.first;
    return s;
  };
  const auto rms = [](const std::map<std::string, std::pair<double, int>>& sse) {
    json j = json::object();
    for (const auto& [m, v] : sse) j[m] = std::sqrt(v.first / std::max(v.second, 1));
    return j;
  };
  const json decode_rms_before = rms(decode_errors(hw));
  {
    hw::Profile trial = hw;
    const auto [x, err] = boost::math::tools::brent_find_minima(
        [&](double lx) {
          calib::set_param(trial, "attention.decode_compute", std::exp(lx));
          return total(decode_errors(trial));
        },
        std::log(0.005), std::log(1.0), 20);
    (void)err;
    calib::set_param(hw, "attention.decode_compute", std::exp(x));
  }
  const double decode_compute = calib::get_param(hw, "attention.decode_compute");
  // With the op-by-op fit: its level on the same lone LazyLLM decodes (a time scale on decoding
  // over listed keys and the pruning stages, Brent's method over its log). The form stays the
  // single runs'; the level is the load test's, whose lone decodes ran slower than the single runs
  // recorded hours later (docs/serving.md: not the server, which decodes as fast as `run`).
  if (lone_fit) {
    hw::Profile trial = hw;
    const auto [lo, hi] = calib::lone_decode_scale_range(*lone_fit);
    const auto [x, err] = boost::math::tools::brent_find_minima(
        [&](double lt) {
          calib::set_lone_decodes(trial, *lone_fit, std::exp(lt));
          return decode_errors(trial)["lazyllm"].first;
        },
        std::log(std::max(lo, 0.25)), std::log(std::min(hi, 4.0)), 20);
    (void)err;
    lone_fit->scale = std::exp(x);
    calib::set_lone_decodes(hw, *lone_fit, lone_fit->scale);
  }
  const json decode_rms_after = rms(decode_errors(hw));
  if (!a.profile_out.empty())
    write_fitted_profile(
        a.profile_out, hw, hw.name + "-serving",
        fmt::format("lazyprefill validate --serving {}: fitted on the lowest rate's lone requests",
                    a.serving));

  // The machine's drift between the load test's rates: per rate and method, the median of the
  // measured / predicted prefill time of the requests whose prefill ran alone, against the
  // calibration rate's. The replay is repeated with every iteration's time scaled by 1 -/+ the
  // largest drift seen, which bands each prediction by what the machine's speed alone moves.
  double drift = 0;
  json drift_by_rate = json::array();
  for (const MethodLog& ml : methods) {
    std::vector<std::vector<double>> ratio(rates.size());
    for (size_t i = 0; i < ml.log.size(); ++i) {
      const Logged& r = ml.log[i];
      if (!ran_alone(ml.log, r, r.first_token_s)) continue;  // its prefill alone
      const sim::ServingRequest one{0, r.prompt_tokens, 1};
      const double predicted =
          sim::simulate_serving(c, hw, prec, by_name.at(ml.name), cfg, {&one, 1}).requests[0].ttft_s();
      ratio[i / size_t(per_rate)].push_back((r.first_token_s - r.admitted_s) / predicted);
    }
    const double base = sim::percentiles(ratio[0]).p50;
    for (size_t g = 0; g < rates.size(); ++g) {
      if (ratio[g].size() < 3 || !(base > 0)) continue;
      const double d = sim::percentiles(ratio[g]).p50 / base - 1;
      drift_by_rate.push_back(
          {{"rate", rates[g]}, {"method", ml.name}, {"lone_prefills", ratio[g].size()}, {"drift", d}});
      drift = std::max(drift, std::fabs(d));
    }
  }

  json out;
  out["validation"] = "serving";
  out["fixtures"] = a.serving;
  out["model"] = preset;
  out["calibration"] = {
      {"base", a.base},
      {"points", points.size()},
      {"fitted", fit.params},
      {"ttft_mape_fit", fit.ttft_mape_fit},
      {"decode_mape_fit", fit.decode_mape_fit},
      {"revival_share", revival_share},
      {"revival_model", revival_model ? json(revival_model->origin) : json(nullptr)},
      {"decode_attention_compute", decode_compute},
      {"lone_decodes", lone_fit ? json{{"spans", lone_fit->spans},
                                       {"listed_compute", lone_fit->listed_compute},
                                       {"listed_memory", lone_fit->listed_memory},
                                       {"pruning_stage_us", lone_fit->stage_us},
                                       {"pruning_key_ns", lone_fit->key_ns},
                                       {"scale_on_the_load_tests_lone_decodes", lone_fit->scale},
                                       {"attention_rms_log_error_before", lone_fit->attention_rms_before},
                                       {"attention_rms_log_error_after", lone_fit->attention_rms_after},
                                       {"pruning_rms_log_error_before", lone_fit->pruning_rms_before},
                                       {"pruning_rms_log_error_after", lone_fit->pruning_rms_after}}
                                : json(nullptr)},
      {"decode_rms_log_error_before", decode_rms_before},
      {"decode_rms_log_error_after", decode_rms_after}};
  json rows = json::array();
  std::string text = fmt::format(
      "serving validation on {}: calibrated on {} single-request points of the lowest rate (fitted {}; "
      "{}; decoding attention at {:.3f} of peak, fitted on {} lone decodes), every request replayed at its "
      "logged arrival\n",
      a.serving, points.size(), fmt::join(fit.params, ", "),
      revival_model ? fmt::format("revivals from {}", revival_model->origin)
                    : fmt::format("revival share {:.4f} per stage and step from its log", revival_share),
      decode_compute, decodes.size());
  if (lone_fit)
    text += fmt::format(
        "decoding over listed keys fitted on {} spans of lone LazyLLM runs ({}/lone): {:.3f} of peak over "
        "rows x held keys plus the held K/V at {:.3f} of the bandwidth (attention RMS log error {:.3f} -> "
        "{:.3f}); pruning stages {:.0f} us + {:.1f} ns a key (RMS log error {:.3f} -> {:.3f}); their time "
        "x{:.3f} on the lone "
        "LazyLLM decodes above\n",
        lone_fit->spans, a.serving, lone_fit->listed_compute, lone_fit->listed_memory,
        lone_fit->attention_rms_before, lone_fit->attention_rms_after, lone_fit->stage_us, lone_fit->key_ns,
        lone_fit->pruning_rms_before, lone_fit->pruning_rms_after, lone_fit->scale);
  text += fmt::format("{:>6} {:<8} {:>17} {:>17} {:>15} {:>15}\n", "rate/s", "method", "TTFT p50 ms (err)",
                      "TTFT p90 ms (err)", "ITL p50 (err)", "req/s (err)");
  bool ok = true, all_consistent = true;
  double worst = 0;
  json outside = json::array();
  std::string outside_text;
  for (const MethodLog& ml : methods) {
    const sim::ServingMethod& m = by_name.at(ml.name);
    std::vector<sim::ServingRequest> reqs;
    for (const Logged& r : ml.log) reqs.push_back({r.arrival_s, r.prompt_tokens, r.output_tokens});
    const sim::ServingRun run = sim::simulate_serving(c, hw, prec, m, cfg, reqs);
    std::vector<sim::ServingRun> band;  // the replay on a machine `drift` faster and slower
    for (const double scale : {1 - drift, 1 + drift}) {
      sim::ServingConfig scaled = cfg;
      scaled.time_scale = scale;
      band.push_back(sim::simulate_serving(c, hw, prec, m, scaled, reqs));
    }
    double measured_sat = 0, predicted_sat = 0;
    std::vector<json> groups;
    for (size_t g = 0; g < rates.size(); ++g) {
      std::vector<double> mt, mi, pt, pi;
      double m_first = 1e300, m_last = 0, p_first = 1e300, p_last = 0;
      std::vector<std::vector<double>> bt(band.size()), bi(band.size());
      std::vector<double> b_first(band.size(), 1e300), b_last(band.size(), 0);
      for (size_t i = g * size_t(per_rate); i < (g + 1) * size_t(per_rate); ++i) {
        const Logged& r = ml.log[i];
        const sim::RequestOutcome& o = run.requests[i];
        mt.push_back(r.first_token_s - r.arrival_s);
        if (r.output_tokens > 1) mi.push_back((r.finished_s - r.first_token_s) / double(r.output_tokens - 1));
        m_first = std::min(m_first, r.arrival_s), m_last = std::max(m_last, r.finished_s);
        pt.push_back(o.ttft_s());
        if (o.output_tokens > 1) pi.push_back(o.itl_s());
        p_first = std::min(p_first, o.arrival_s), p_last = std::max(p_last, o.finished_s);
        for (size_t b = 0; b < band.size(); ++b) {
          const sim::RequestOutcome& ob = band[b].requests[i];
          bt[b].push_back(ob.ttft_s());
          if (ob.output_tokens > 1) bi[b].push_back(ob.itl_s());
          b_first[b] = std::min(b_first[b], ob.arrival_s), b_last[b] = std::max(b_last[b], ob.finished_s);
        }
      }
      const GroupFigures mf = figures(mt, mi, m_first, m_last, size_t(per_rate));
      const GroupFigures pf = figures(pt, pi, p_first, p_last, size_t(per_rate));
      // Each figure: the measured one's 95% interval (its percentile's order statistics; none for
      // throughput) and the prediction's band over the machine's drift.
      const sim::QuantileInterval ci_t50 = sim::quantile_interval(mt, 0.5),
                                  ci_t90 = sim::quantile_interval(mt, 0.9),
                                  ci_i50 = sim::quantile_interval(mi, 0.5);
      std::vector<GroupFigures> bf;
      for (size_t b = 0; b < band.size(); ++b)
        bf.push_back(figures(bt[b], bi[b], b_first[b], b_last[b], size_t(per_rate)));
      const auto band_of = [&](double GroupFigures::*f) {
        double lo = pf.*f, hi = pf.*f;
        for (const GroupFigures& x : bf) lo = std::min(lo, x.*f), hi = std::max(hi, x.*f);
        return std::pair{lo, hi};
      };
      json uncertainty = json::object();
      const auto figure_uncertainty = [&](const char* key, double GroupFigures::*f,
                                          const sim::QuantileInterval* ci, double unit) {
        const auto [lo, hi] = band_of(f);
        json u = {{"predicted_band", {lo * unit, hi * unit}}};
        bool overlap = lo <= mf.*f && mf.*f <= hi;  // throughput: the band holds the measured figure
        if (ci) {  // the band meets the interval (an open end reaches as far as it must)
          u["measured_interval_95"] = {ci->lo * unit, ci->hi * unit};
          u["measured_interval_open"] = {ci->lo_open, ci->hi_open};
          overlap = (ci->hi_open || lo <= ci->hi) && (ci->lo_open || hi >= ci->lo);
        }
        u["consistent"] = overlap;
        uncertainty[key] = u;
      };
      figure_uncertainty("ttft_p50", &GroupFigures::ttft50, &ci_t50, 1e3);
      figure_uncertainty("ttft_p90", &GroupFigures::ttft90, &ci_t90, 1e3);
      figure_uncertainty("itl_p50", &GroupFigures::itl50, &ci_i50, 1e3);
      figure_uncertainty("requests_per_s", &GroupFigures::throughput, nullptr, 1);
      measured_sat = std::max(measured_sat, mf.throughput);
      predicted_sat = std::max(predicted_sat, pf.throughput);
      groups.push_back({{"rate", rates[g]},
                        {"method", ml.name},
                        {"calibrated_on", g == 0},
                        {"measured",
                         {{"ttft_p50_ms", mf.ttft50 * 1e3},
                          {"ttft_p90_ms", mf.ttft90 * 1e3},
                          {"itl_p50_ms", mf.itl50 * 1e3},
                          {"requests_per_s", mf.throughput}}},
                        {"predicted",
                         {{"ttft_p50_ms", pf.ttft50 * 1e3},
                          {"ttft_p90_ms", pf.ttft90 * 1e3},
                          {"itl_p50_ms", pf.itl50 * 1e3},
                          {"requests_per_s", pf.throughput}}},
                        {"error",
                         {{"ttft_p50", rel(pf.ttft50, mf.ttft50)},
                          {"ttft_p90", rel(pf.ttft90, mf.ttft90)},
                          {"itl_p50", rel(pf.itl50, mf.itl50)},
                          {"requests_per_s", rel(pf.throughput, mf.throughput)}}},
                        {"uncertainty", std::move(uncertainty)}});
      text += fmt::format(
          "{:>6} {:<8} {:>9.0f} ({:+4.0f}%) {:>9.0f} ({:+4.0f}%) {:>7.1f} ({:+4.0f}%) {:>7.3f} "
          "({:+4.0f}%){}\n",
          rates[g], ml.name, mf.ttft50 * 1e3, 100 * rel(pf.ttft50, mf.ttft50), mf.ttft90 * 1e3,
          100 * rel(pf.ttft90, mf.ttft90), mf.itl50 * 1e3, 100 * rel(pf.itl50, mf.itl50), mf.throughput,
          100 * rel(pf.throughput, mf.throughput), g == 0 ? "  (calibration rate)" : "");
    }
    // Below saturation: a rate under the measured saturation throughput.
    for (size_t g = 0; g < groups.size(); ++g) {
      json& gj = groups[g];
      const bool below = gj["rate"].get<double>() < measured_sat;
      gj["below_saturation"] = below;
      if (below)
        for (const char* k : {"ttft_p50", "ttft_p90", "itl_p50", "requests_per_s"}) {
          const double e = std::fabs(gj["error"][k].get<double>());
          worst = std::max(worst, e);
          if (e <= 0.10) continue;
          ok = false;
          const json& u = gj["uncertainty"][k];
          const bool consistent = u["consistent"].get<bool>();
          outside.push_back({{"rate", gj["rate"]},
                             {"method", ml.name},
                             {"figure", k},
                             {"error", e},
                             {"consistent", consistent}});
          all_consistent = all_consistent && consistent;
          const std::string field = std::string(k) == "requests_per_s" ? k : std::string(k) + "_ms";
          // A percentile: how well the rate's requests can pin it, by the simulation's own long run.
          std::string sampling;
          if (field != "requests_per_s") {
            const std::span<const Logged> group(ml.log.data() + g * size_t(per_rate), size_t(per_rate));
            const json sp = sampling_spread(c, hw, prec, m, cfg, gj["rate"].get<double>(), group,
                                            std::string(k).starts_with("itl"),
                                            std::string(k).ends_with("90") ? 0.9 : 0.5, size_t(per_rate));
            outside.back()["sampling"] = sp;
            if (sp.value("stable", false))
              sampling = fmt::format(
                  "; {}-request {}s of the simulation's own {} Poisson requests at this rate fall within 10% "
                  "of their long-run {:.4g} in {:.0f}% of {} draws (5-95%: {:.4g}-{:.4g})",
                  per_rate, k, sp["requests"].get<int64_t>(), sp["long_run"].get<double>(),
                  100 * sp["share_within_10pct"].get<double>(), sp["draws"].get<int>(),
                  sp["sample_range_90"][0].get<double>(), sp["sample_range_90"][1].get<double>());
          }
          std::string interval;  // throughput has none
          if (u.contains("measured_interval_95"))
            interval = fmt::format(
                " [95%: {}{:.4g}-{:.4g}{}]", u["measured_interval_open"][0].get<bool>() ? "<=" : "",
                u["measured_interval_95"][0].get<double>(), u["measured_interval_95"][1].get<double>(),
                u["measured_interval_open"][1].get<bool>() ? "+" : "");
          outside_text += fmt::format(
              "  {} {} {}: measured {:.4g}{}, predicted {:.4g} ({:+.0f}%), {:.4g}-{:.4g} over the machine's "
              "drift: {}{}\n",
              gj["rate"].get<double>(), ml.name, k, gj["measured"][field].get<double>(), interval,
              gj["predicted"][field].get<double>(), 100 * gj["error"][k].get<double>(),
              u["predicted_band"][0].get<double>(), u["predicted_band"][1].get<double>(),
              consistent ? "within the measurement's own uncertainty" : "outside its uncertainty", sampling);
        }
      rows.push_back(gj);
    }
    const double sat_err = rel(predicted_sat, measured_sat);
    if (std::fabs(sat_err) > 0.15) ok = false;
    out["saturation"][ml.name] = {{"measured_requests_per_s", measured_sat},
                                  {"predicted_requests_per_s", predicted_sat},
                                  {"error", sat_err}};
    text += fmt::format(
        "{:>6} {:<8} saturation (highest throughput of a rate): measured {:.3f} req/s, predicted {:.3f} "
        "({:+.0f}%)\n",
        "", ml.name, measured_sat, predicted_sat, 100 * sat_err);
  }
  out["rates"] = std::move(rows);
  out["machine_drift"] = {{"largest", drift}, {"by_rate", std::move(drift_by_rate)}};
  out["worst_error_below_saturation"] = worst;
  out["within_targets"] = ok;
  out["outside_targets"] = outside;
  out["outside_targets_within_uncertainty"] = !ok && all_consistent;
  text += fmt::format("worst error below saturation {:.1f}% (target 10%); {}\n", 100 * worst,
                      ok ? "within the targets" : "NOT within the targets");
  if (!ok)
    text += fmt::format(
        "figures outside 10% below saturation, against the measured figure's 95% interval (order statistics "
        "of the rate's {} requests) and the prediction replayed on a machine {:.1f}% faster and slower (the "
        "largest drift of lone prefills between rates in this log):\n{}",
        per_rate, 100 * drift, outside_text);
  print_result(a.json_out, out, text);
  return 0;
}

}  // namespace lp::cli
