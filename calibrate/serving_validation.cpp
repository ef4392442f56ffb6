#include "calibrate/serving_validation.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/math/tools/minima.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"

namespace lp::calib {

using Logged = sim::LoggedRequest;

namespace {

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

// A lone request: it ran with no other in the server from its admission to its last token.
struct Lone {
  const LoadTest::Method* method;
  const Logged* r;
};
std::vector<Lone> lone_requests(const LoadTest& t) {
  std::vector<Lone> lone;
  for (const LoadTest::Method& ml : t.methods)
    for (int64_t i = 0; i < t.per_rate; ++i) {
      const Logged& r = ml.log[size_t(i)];
      if (ran_alone(ml.log, r, r.finished_s)) lone.push_back({&ml, &r});
    }
  return lone;
}

// Seconds: a rate's TTFT p50 and p90, ITL p50 and throughput, indexed by Figure.
struct GroupFigures {
  std::array<double, 4> v{};
  double of(Figure f) const { return v[size_t(f)]; }
};
GroupFigures figures(const std::vector<double>& ttft, const std::vector<double>& itl, double first_arrival,
                     double last_finish, size_t n) {
  const sim::Percentiles t = sim::percentiles(ttft), i = sim::percentiles(itl);
  return {{t.p50, t.p90, i.p50, last_finish > first_arrival ? double(n) / (last_finish - first_arrival) : 0}};
}

// How well `n` requests a rate pin a percentile there (sim::sample_quantile_spread), on the
// simulation's own long run: kLongRun Poisson requests at `rate` with the group's prompt and output
// lengths, each request's TTFT (or mean ITL) in ms. Not stable where the simulation saturates at
// this rate (its throughput below 95% of the rate: no long run to draw from).
SamplingSpread sampling_spread(const ServingCalibration& cal, const sim::ServingMethod& m, double rate,
                               std::span<const Logged> group, bool itl, double q, size_t n) {
  constexpr int64_t kLongRun = 4000;
  constexpr int kDraws = 4000;
  std::vector<int64_t> prompts, outputs;
  for (const Logged& r : group)
    prompts.push_back(r.prompt_tokens), outputs.push_back(std::max<int64_t>(r.output_tokens, 1));
  const auto prompt = sim::LengthDist::from_samples(std::move(prompts)),
             output = sim::LengthDist::from_samples(std::move(outputs));
  std::vector<sim::ServingRequest> reqs = sim::make_workload(kLongRun, {rate, 1.0}, prompt, output, 1);
  if (!group.empty() && group[0].cached_tokens >= 0)  // a prefix-cache log: its prompts with their hits
    for (size_t k = 0; k < reqs.size(); ++k)
      reqs[k].prompt_tokens = group[k % group.size()].prompt_tokens,
      reqs[k].cached_tokens = group[k % group.size()].cached_tokens;
  const sim::ServingRun run = sim::simulate_serving(cal.model, cal.hw, cal.precision, m, cal.config, reqs);
  const sim::ServingMetrics mm = sim::serving_metrics(run, {});
  SamplingSpread out;
  out.requests = kLongRun, out.draws = kDraws, out.sample_size = n;
  out.stable = mm.requests_per_s >= 0.95 * rate;
  if (!out.stable) return out;
  std::vector<double> v;
  for (const sim::RequestOutcome& o : run.requests)
    if (!itl)
      v.push_back(o.ttft_s() * 1e3);
    else if (o.output_tokens > 1)
      v.push_back(o.itl_s() * 1e3);
  if (v.size() < n) {  // too few requests with an ITL to draw from
    out.stable = false;
    return out;
  }
  const sim::SampleSpread sp = sim::sample_quantile_spread(std::move(v), q, n, 0.10, kDraws, 1);
  out.long_run = sp.population, out.share_within_10pct = sp.share_within, out.lo = sp.lo, out.hi = sp.hi;
  return out;
}

}  // namespace

namespace {
struct FigureNames {
  const char* key;    // of an error or an uncertainty
  const char* field;  // of a figure, with its unit
};
constexpr FigureNames kFigureNames[] = {{"ttft_p50", "ttft_p50_ms"},
                                        {"ttft_p90", "ttft_p90_ms"},
                                        {"itl_p50", "itl_p50_ms"},
                                        {"requests_per_s", "requests_per_s"}};
}  // namespace

const char* figure_key(Figure f) {
  return kFigureNames[size_t(f)].key;
}
const char* figure_field(Figure f) {
  return kFigureNames[size_t(f)].field;
}

LoadTest read_load_test(const std::string& dir_name) {
  const std::filesystem::path dir(dir_name);
  LoadTest t;
  t.dir = dir_name;
  const std::string summary_path = (dir / "serve_load_summary.json").string();
  const auto summary = json_parse<nlohmann::ordered_json>(
      read_input_file(summary_path, "load-test summary", input_cap::kResults), summary_path, true);
  if (summary.is_discarded() || !summary.is_object()) fail("{}: not a JSON object", summary_path);
  int64_t min_prompt = 1;
  try {
    t.rates = summary.at("load").at("rates").get<std::vector<double>>();
    t.per_rate = summary.at("load").at("requests_per_rate").get<int64_t>();
    min_prompt = summary.at("prompts").at("tokens").at("min").get<int64_t>();
    const auto argv = summary.at("argv").get<std::vector<std::string>>();
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--kv-budget-mib") t.kv_budget_mib = std::stoll(argv[i + 1]);
      if (argv[i] == "--max-batch-tokens") t.max_batch_tokens = std::stoll(argv[i + 1]);
    }
  } catch (const std::exception& e) {
    fail("{}: {}", summary_path, e.what());
  }
  if (t.rates.empty() || t.per_rate < 3)
    fail("{}: needs rates and at least 3 requests per rate", summary_path);
  for (const char* m : {"none", "lazyllm"}) {
    const std::string path = (dir / fmt::format("requests_{}.jsonl", m)).string();
    std::vector<Logged> log = read_logged(path);
    // The script's short preflight request is not one of the load's.
    log.erase(
        std::remove_if(log.begin(), log.end(), [&](const Logged& r) { return r.prompt_tokens < min_prompt; }),
        log.end());
    if (log.size() != t.rates.size() * size_t(t.per_rate))
      fail("{}: {} requests, but the summary's {} rates x {} make {}", path, log.size(), t.rates.size(),
           t.per_rate, t.rates.size() * size_t(t.per_rate));
    t.methods.push_back({m, std::move(log)});
  }
  return t;
}

ServingCalibration calibrate_serving(const LoadTest& t, const ServingValidationOptions& o) {
  ServingCalibration cal;
  cal.model = preset_config(o.preset);
  cal.precision = precision_for_dtype(o.dtype);
  cal.schedule = default_schedule();
  const ModelConfig& c = cal.model;
  const sim::Precision& prec = cal.precision;
  const std::vector<PruneStep> steps = resolve_schedule(cal.schedule, c.n_layer, c.global_layers());

  // The lowest rate's requests that ran alone (no other request between their admission and their
  // last token), as single-request measurements: both methods' prefills and the unpruned decoding.
  const std::vector<Lone> lone = lone_requests(t);
  std::vector<Measurement> ms;
  for (const Lone& l : lone) {
    const Logged& r = *l.r;
    const bool pruned = l.method->name != "none";
    Measurement m;
    m.file = l.method->name;
    m.record = int(l.r - l.method->log.data()) + 1;
    m.framework = "lazyprefill serve";
    m.model = o.preset;
    m.hardware = o.base;
    m.dtype = o.dtype;
    m.method = pruned ? "lazyllm " + cal.schedule.to_string() : "none";
    m.prompt_tokens = r.prompt_tokens;
    m.ttft_ms = (r.first_token_s - r.admitted_s) * 1e3;
    ms.push_back(m);
    // A pruned run's decoding steps revive tokens, which single-request points do not model
    // (calibrate leaves them out too); decoding attention's own share is fitted on them below,
    // through the serving simulation and its revival model.
    if (r.output_tokens > 1 && !pruned) {
      Measurement d = m;
      d.ttft_ms.reset();
      d.prompt_tokens = 0;
      d.context_tokens = r.prompt_tokens;
      d.decode_tokens = r.output_tokens - 1;
      d.decode_ms_per_token = (r.finished_s - r.first_token_s) / double(r.output_tokens - 1) * 1e3;
      ms.push_back(d);
    }
  }
  if (ms.size() < 4)
    fail("{}: fewer than 2 requests of the lowest rate ran alone: nothing to calibrate on", t.dir);
  std::vector<Point> points;
  for (const Measurement& m : ms) points.push_back(make_point(m, o.preset, c, prec));
  cal.points = points.size();
  // The fit starts with one row as the row count at which GEMMs and attention reach half their
  // share of peak: this engine's decoding rows run its packed integer kernels, bound by the
  // weights' bytes rather than starved of rows (docs/cpu-kernels.md), and the stepwise selection
  // from cpu-local's 62 and 88 rows (an f32 engine's) keeps TTFT and leaves decoding 3x off.
  hw::Profile base = hw::load_profile(o.base);
  set_param(base, "gemm.half_rows", 1);
  set_param(base, "attention.half_rows", 1);
  cal.hw = fit_measurements(base, points, {}, &cal.fit);
  hw::Profile& hw = cal.hw;

  // Decoding over listed key sets and the pruning stages' cost, fitted on single LazyLLM requests
  // measured op by op (DIR/lone, calibrate/lone_decode.h): a lone request's mean time per token
  // cannot tell them from decoding attention's share of peak, fitted after them below.
  const std::filesystem::path dir(t.dir);
  if (const std::filesystem::path lone_dir = dir / "lone"; std::filesystem::exists(lone_dir))
    cal.lone_fit = fit_lone_decodes(hw, c, prec, load_lone_decodes(lone_dir.string()));

  // Revivals: a revival model fitted on traces of the load test's own prompts (DIR/revivals.json,
  // or --revival-model: a request revives most in its first decoding steps, docs/serving.md), or
  // the share of each stage's active tokens revived per decoding step that gives the revivals the
  // server counted (active after stage s: the product of the kept shares so far; the built-in
  // revival model was fitted on other prompts).
  double revived = 0, exposure = 0, active_per_token = 0, kept = 1;
  for (const PruneStep& st : steps) kept *= 1 - st.share, active_per_token += kept;
  for (const LoadTest::Method& ml : t.methods)
    if (ml.name != "none")
      for (int64_t i = 0; i < t.per_rate; ++i) {
        const Logged& r = ml.log[size_t(i)];
        revived += double(r.revivals);
        exposure += double(r.output_tokens - 1) * double(r.prompt_tokens) * active_per_token;
      }
  cal.revival_share = exposure > 0 ? revived / exposure : 0;
  if (!o.revival_model.empty())
    cal.revival_model = sim::load_revival_model(o.revival_model);
  else if (const auto own = dir / "revivals.json"; !o.revival_share_from_log && std::filesystem::exists(own))
    cal.revival_model = sim::load_revival_model(own.string());
  for (const std::string name : {"none", "lazyllm"}) {
    const PolicyKind k = parse_policy(name);
    cal.methods[name] = sim::serving_method(
        {k, k == PolicyKind::None ? Schedule{} : cal.schedule}, c,
        cal.revival_model ? sim::revival_shares(*cal.revival_model, c.n_layer, steps, false)
                          : sim::constant_revival_share(cal.revival_share));
  }
  cal.config.kv_budget_bytes = double(t.kv_budget_mib) * (1 << 20);
  cal.config.max_batch_tokens = t.max_batch_tokens;
  cal.config.kv_element_bytes = 2;  // the CPU backend's f16 cache
  // A log of a server with the prefix cache says what each prompt found (cached_tokens): replayed.
  for (const LoadTest::Method& ml : t.methods)
    for (const Logged& r : ml.log) cal.config.prefix_cache = cal.config.prefix_cache || r.cached_tokens >= 0;

  // Decoding attention's share of peak (efficiency.attention.decode_compute): LazyLLM's decoding
  // steps attend with the rows they revive, hundreds in a step's first layers, each over keys
  // read back from memory, in small tiles that run at a third of prefill's rate on this engine
  // (docs/serving.md). Fitted on the same lone requests' decoding, both methods, through the
  // serving simulation: the share minimising the squared log error of each request's mean time
  // per token (Brent's method over its log).
  struct LoneDecode {
    const LoadTest::Method* method;
    sim::ServingRequest req;
    double itl_s;
  };
  std::vector<LoneDecode> decodes;
  for (const Lone& l : lone)
    if (l.r->output_tokens > 1)
      decodes.push_back({l.method,
                         {0, l.r->prompt_tokens, l.r->output_tokens},
                         (l.r->finished_s - l.r->first_token_s) / double(l.r->output_tokens - 1)});
  cal.lone_decodes = decodes.size();
  // Per method, the summed squared log error of the lone decodes' time per token under `p`, and
  // their count.
  const auto decode_errors = [&](const hw::Profile& p) {
    std::map<std::string, std::pair<double, int>> sse;
    for (const LoneDecode& d : decodes) {
      const sim::ServingRun one =
          sim::simulate_serving(c, p, prec, cal.methods.at(d.method->name), cal.config, std::span(&d.req, 1));
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
    std::map<std::string, double> out;
    for (const auto& [m, v] : sse) out[m] = std::sqrt(v.first / std::max(v.second, 1));
    return out;
  };
  cal.decode_rms_before = rms(decode_errors(hw));
  {
    hw::Profile trial = hw;
    const auto [x, err] = boost::math::tools::brent_find_minima(
        [&](double lx) {
          set_param(trial, "attention.decode_compute", std::exp(lx));
          return total(decode_errors(trial));
        },
        std::log(0.005), std::log(1.0), 20);
    (void)err;
    set_param(hw, "attention.decode_compute", std::exp(x));
  }
  cal.decode_compute = get_param(hw, "attention.decode_compute");
  // With the op-by-op fit: its level on the same lone LazyLLM decodes (a time scale on decoding
  // over listed keys and the pruning stages, Brent's method over its log). The form stays the
  // single runs'; the level is the load test's, whose lone decodes ran slower than the single runs
  // recorded hours later (docs/serving.md: not the server, which decodes as fast as `run`).
  if (cal.lone_fit) {
    hw::Profile trial = hw;
    const auto [lo, hi] = lone_decode_scale_range(*cal.lone_fit);
    const auto [x, err] = boost::math::tools::brent_find_minima(
        [&](double lt) {
          set_lone_decodes(trial, *cal.lone_fit, std::exp(lt));
          return decode_errors(trial)["lazyllm"].first;
        },
        std::log(std::max(lo, 0.25)), std::log(std::min(hi, 4.0)), 20);
    (void)err;
    cal.lone_fit->scale = std::exp(x);
    set_lone_decodes(hw, *cal.lone_fit, cal.lone_fit->scale);
  }
  cal.decode_rms_after = rms(decode_errors(hw));
  return cal;
}

MachineDrift machine_drift(const LoadTest& t, const ServingCalibration& cal) {
  // Per rate and method, the median of the measured / predicted prefill time of the requests whose
  // prefill ran alone, against the calibration rate's.
  MachineDrift d;
  for (const LoadTest::Method& ml : t.methods) {
    std::vector<std::vector<double>> ratio(t.rates.size());
    for (size_t i = 0; i < ml.log.size(); ++i) {
      const Logged& r = ml.log[i];
      if (!ran_alone(ml.log, r, r.first_token_s)) continue;  // its prefill alone
      sim::ServingRequest one{0, r.prompt_tokens, 1};
      one.cached_tokens = r.cached_tokens;  // a prefix-cache log's hit (ServingConfig::prefix_cache)
      const double predicted = sim::simulate_serving(cal.model, cal.hw, cal.precision,
                                                     cal.methods.at(ml.name), cal.config, {&one, 1})
                                   .requests[0]
                                   .ttft_s();
      ratio[i / size_t(t.per_rate)].push_back((r.first_token_s - r.admitted_s) / predicted);
    }
    const double base = sim::percentiles(ratio[0]).p50;
    for (size_t g = 0; g < t.rates.size(); ++g) {
      if (ratio[g].size() < 3 || !(base > 0)) continue;
      const double x = sim::percentiles(ratio[g]).p50 / base - 1;
      d.by_rate.push_back({t.rates[g], ml.name, ratio[g].size(), x});
      d.largest = std::max(d.largest, std::fabs(x));
    }
  }
  return d;
}

RateComparisons compare_rates(const LoadTest& t, const ServingCalibration& cal, const MachineDrift& drift) {
  RateComparisons out;
  bool all_consistent = true;
  const size_t n = size_t(t.per_rate);
  for (const LoadTest::Method& ml : t.methods) {
    const sim::ServingMethod& m = cal.methods.at(ml.name);
    std::vector<sim::ServingRequest> reqs;
    for (const Logged& r : ml.log) {
      reqs.push_back({r.arrival_s, r.prompt_tokens, r.output_tokens});
      reqs.back().cached_tokens = r.cached_tokens;  // replayed as logged where the cache was on
    }
    const sim::ServingRun run = sim::simulate_serving(cal.model, cal.hw, cal.precision, m, cal.config, reqs);
    std::vector<sim::ServingRun> band;  // the replay on a machine `drift` faster and slower
    for (const double scale : {1 - drift.largest, 1 + drift.largest}) {
      sim::ServingConfig scaled = cal.config;
      scaled.time_scale = scale;
      band.push_back(sim::simulate_serving(cal.model, cal.hw, cal.precision, m, scaled, reqs));
    }
    double measured_sat = 0, predicted_sat = 0;
    const size_t first_row = out.rows.size();
    for (size_t g = 0; g < t.rates.size(); ++g) {
      std::vector<double> mt, mi, pt, pi;
      double m_first = 1e300, m_last = 0, p_first = 1e300, p_last = 0;
      std::vector<std::vector<double>> bt(band.size()), bi(band.size());
      std::vector<double> b_first(band.size(), 1e300), b_last(band.size(), 0);
      for (size_t i = g * n; i < (g + 1) * n; ++i) {
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
      const GroupFigures mf = figures(mt, mi, m_first, m_last, n);
      const GroupFigures pf = figures(pt, pi, p_first, p_last, n);
      std::vector<GroupFigures> bf;
      for (size_t b = 0; b < band.size(); ++b) bf.push_back(figures(bt[b], bi[b], b_first[b], b_last[b], n));
      // Each figure: the measured one's 95% interval (its percentile's order statistics; none for
      // throughput) and the prediction's band over the machine's drift.
      RateComparison row;
      row.rate = t.rates[g];
      row.method = ml.name;
      row.calibrated_on = g == 0;
      for (const Figure f : kFigures) {
        const double unit = f == Figure::Throughput ? 1 : 1e3;
        FigureCheck fc;
        fc.measured = mf.of(f) * unit;
        fc.predicted = pf.of(f) * unit;
        fc.error = rel(pf.of(f), mf.of(f));
        double lo = pf.of(f), hi = pf.of(f);
        for (const GroupFigures& x : bf) lo = std::min(lo, x.of(f)), hi = std::max(hi, x.of(f));
        fc.band_lo = lo * unit, fc.band_hi = hi * unit;
        bool overlap = lo <= mf.of(f) && mf.of(f) <= hi;  // throughput: the band holds the measured figure
        if (f != Figure::Throughput) {  // the band meets the interval (an open end reaches as far as it must)
          const sim::QuantileInterval ci =
              sim::quantile_interval(f == Figure::ItlP50 ? mi : mt, f == Figure::TtftP90 ? 0.9 : 0.5);
          fc.interval = sim::QuantileInterval{ci.lo * unit, ci.hi * unit, ci.lo_open, ci.hi_open};
          overlap = (ci.hi_open || lo <= ci.hi) && (ci.lo_open || hi >= ci.lo);
        }
        fc.consistent = overlap;
        row.figures[f] = fc;
      }
      measured_sat = std::max(measured_sat, mf.of(Figure::Throughput));
      predicted_sat = std::max(predicted_sat, pf.of(Figure::Throughput));
      out.rows.push_back(std::move(row));
    }
    // Below saturation: a rate under the measured saturation throughput.
    for (size_t g = 0; g < t.rates.size(); ++g) {
      RateComparison& row = out.rows[first_row + g];
      row.below_saturation = row.rate < measured_sat;
      if (!row.below_saturation) continue;
      for (const Figure f : kFigures) {
        const FigureCheck& fc = row.figures.at(f);
        const double e = std::fabs(fc.error);
        out.worst_below_saturation = std::max(out.worst_below_saturation, e);
        if (e <= 0.10) continue;
        out.within_targets = false;
        OutsideTarget o{first_row + g, row.rate, ml.name, f, e, fc.consistent, std::nullopt};
        all_consistent = all_consistent && fc.consistent;
        // A percentile: how well the rate's requests can pin it, by the simulation's own long run.
        if (f != Figure::Throughput) {
          const std::span<const Logged> group(ml.log.data() + g * n, n);
          o.sampling = sampling_spread(cal, m, row.rate, group, f == Figure::ItlP50,
                                       f == Figure::TtftP90 ? 0.9 : 0.5, n);
        }
        out.outside.push_back(std::move(o));
      }
    }
    const double sat_err = rel(predicted_sat, measured_sat);
    if (std::fabs(sat_err) > 0.15) out.within_targets = false;
    out.saturation.push_back({ml.name, measured_sat, predicted_sat, sat_err});
  }
  out.outside_within_uncertainty = !out.within_targets && all_consistent;
  return out;
}

}  // namespace lp::calib
