#include "calibrate/serving_benchmarks.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/math/tools/minima.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <tuple>

#include "calibrate/bobyqa.h"
#include "calibrate/measurements.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "sim/serving_workload.h"

namespace lp::calib {
namespace {

using json = nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Who wrote a record, for messages: "FILE: vllm bench serve result (record 2, dated ...)".
struct Source {
  std::string where;  // file and place in it
  std::string tool, version;
  std::string describe() const {
    return fmt::format("{}: {} result{}", where, tool, version.empty() ? "" : " (" + version + ")");
  }
};

[[noreturn]] void missing(const Source& s, const std::string& field) {
  fail("{} has no field '{}'", s.describe(), field);
}

double number_field(const json& o, const std::string& key, const Source& s) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) missing(s, key);
  if (!it->is_number() || !std::isfinite(it->get<double>()))
    fail("{}: field '{}' must be a number, got {}", s.describe(), key, json_text(*it, -1));
  return it->get<double>();
}
std::optional<double> opt_number(const json& o, const std::string& key, const Source& s) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  return number_field(o, key, s);
}
int64_t count_field(double v, const std::string& key, const Source& s, int64_t lo) {
  if (v != std::floor(v) || v < double(lo) || v > 1e12)
    fail("{}: field '{}' must be a whole number of at least {}, got {}", s.describe(), key, lo, v);
  return int64_t(v);
}

// The summary's percentiles must not decrease, and every time must be positive.
void check_summary(const LatencySummary& l, const std::string& name, const Source& s) {
  for (const double v : {l.mean, l.p50, l.p90, l.p99})
    if (!std::isnan(v) && !(v >= 0)) fail("{}: the {} {} s is negative", s.describe(), name, v);
  const double ps[] = {l.p50, l.p90, l.p99};
  const char* names[] = {"p50", "p90", "p99"};
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j)
      if (!std::isnan(ps[i]) && !std::isnan(ps[j]) && ps[j] < ps[i])
        fail("{}: the {} {} is below its {} ({} s < {} s): percentiles must not decrease", s.describe(), name,
             names[j], names[i], ps[j], ps[i]);
}

// Percentiles of per-request values, as sim::percentiles interpolates them (numpy's default).
LatencySummary summary_of(std::vector<double> v) {
  if (v.empty()) return {};
  const sim::Percentiles p = sim::percentiles(std::move(v));
  return {p.mean, p.p50, p.p90, p.p99};
}

std::vector<double> number_array(const json& o, const char* key, const Source& s) {
  std::vector<double> out;
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return out;
  if (!it->is_array()) fail("{}: field '{}' must be an array", s.describe(), key);
  for (const json& v : *it) {
    if (!v.is_number() || !std::isfinite(v.get<double>()))
      fail("{}: field '{}' must hold numbers", s.describe(), key);
    out.push_back(v.get<double>());
  }
  return out;
}

// ---- vllm bench serve --save-result (vllm/benchmarks/serve.py; benchmarks/benchmark_serving.py
// before it): summary fields in ms, per-request arrays (--save-detailed) in s.
ServingBenchmark from_vllm(const json& o, const std::string& path, int rec) {
  Source s{fmt::format("{} record {}", path, rec), "vllm bench serve",
           o.contains("date") && o["date"].is_string() ? "dated " + o["date"].get<std::string>() : ""};
  ServingBenchmark b;
  b.tool = s.tool;
  b.version =
      o.contains("vllm_version") && o["vllm_version"].is_string() ? o["vllm_version"].get<std::string>() : "";
  b.where = s.where;
  const auto rate = o.find("request_rate");
  if (rate == o.end()) missing(s, "request_rate");
  if (rate->is_string() && rate->get<std::string>() == "inf")
    b.rate = kInf;
  else
    b.rate = number_field(o, "request_rate", s);
  if (!(b.rate > 0)) fail("{}: the request rate must be positive, got {}", s.describe(), b.rate);
  // Gamma gaps of shape `burstiness` (1: Poisson): coefficient of variation 1 / sqrt(shape).
  if (const auto k = opt_number(o, "burstiness", s)) {
    if (!(*k > 0)) fail("{}: the burstiness must be positive, got {}", s.describe(), *k);
    b.cv = std::clamp(1 / std::sqrt(*k), 0.01, 100.0);
  }
  if (const auto c = opt_number(o, "max_concurrency", s))
    b.concurrency = count_field(*c, "max_concurrency", s, 1);
  b.completed = count_field(number_field(o, "completed", s), "completed", s, 1);
  b.duration_s = number_field(o, "duration", s);
  if (!(b.duration_s > 0)) fail("{}: the duration must be positive, got {}", s.describe(), b.duration_s);
  b.requests_per_s = number_field(o, "request_throughput", s);
  b.output_tokens_per_s = number_field(o, "output_throughput", s);
  b.prompt_tokens_mean = number_field(o, "total_input_tokens", s) / double(b.completed);
  b.output_tokens_mean = number_field(o, "total_output_tokens", s) / double(b.completed);
  const auto ms = [&](const std::string& stat, const std::string& metric) {
    const auto v = opt_number(o, stat + "_" + metric + "_ms", s);
    return v ? *v * 1e-3 : kNotGiven;
  };
  for (const auto& [metric, out] :
       {std::pair<const char*, LatencySummary*>{"ttft", &b.ttft}, {"tpot", &b.itl}, {"e2el", &b.e2e}}) {
    out->mean = ms("mean", metric);
    out->p50 = std::isnan(ms("p50", metric)) ? ms("median", metric) : ms("p50", metric);
    out->p90 = ms("p90", metric);
    out->p99 = ms("p99", metric);
  }
  // Per request (--save-detailed): lengths, and every figure from the requests themselves.
  const std::vector<double> in = number_array(o, "input_lens", s), out = number_array(o, "output_lens", s),
                            ttfts = number_array(o, "ttfts", s), lat = number_array(o, "latencies", s);
  if (!in.empty() && in.size() == out.size()) {
    for (size_t i = 0; i < in.size(); ++i) {
      if (out[i] < 1) continue;  // a failed request (output 0)
      b.prompt_tokens.push_back(count_field(in[i], "input_lens", s, 1));
      b.output_tokens.push_back(count_field(out[i], "output_lens", s, 1));
    }
    if (ttfts.size() == in.size() && lat.size() == in.size()) {
      std::vector<double> t, itl, e;
      for (size_t i = 0; i < in.size(); ++i) {
        if (out[i] < 1) continue;
        t.push_back(ttfts[i]), e.push_back(lat[i]);
        if (out[i] > 1) itl.push_back((lat[i] - ttfts[i]) / (out[i] - 1));
      }
      b.ttft = summary_of(t), b.itl = summary_of(itl), b.e2e = summary_of(e);
    }
  }
  if (std::isnan(b.ttft.p50) && std::isnan(b.ttft.mean)) missing(s, "median_ttft_ms");
  check_summary(b.ttft, "TTFT", s);
  check_summary(b.itl, "TPOT", s);
  check_summary(b.e2e, "latency", s);
  return b;
}

// ---- guidellm: 0.4-0.8 (metadata.guidellm_version, config.strategy) and 0.3 (args.strategy).
void guidellm_strategy(const json& st, ServingBenchmark& b, const Source& s) {
  if (!st.is_object()) fail("{}: its strategy is not an object", s.describe());
  const auto type = st.find("type_");
  if (type == st.end() || !type->is_string()) missing(s, "strategy.type_");
  const std::string t = type->get<std::string>();
  if (t == "synchronous") {
    b.concurrency = 1;
  } else if (t == "concurrent") {
    b.concurrency = count_field(number_field(st, "streams", s), "strategy.streams", s, 1);
  } else if (t == "throughput") {
    if (const auto c = opt_number(st, "max_concurrency", s))
      b.concurrency = count_field(*c, "max_concurrency", s, 1);
  } else if (t == "constant" || t == "poisson") {
    b.rate = number_field(st, "rate", s);
    if (!(b.rate > 0)) fail("{}: the strategy's rate must be positive, got {}", s.describe(), b.rate);
    b.cv = t == "poisson" ? 1.0 : 0.01;  // constant: evenly spaced (gamma gaps of cv 0.01)
  } else {
    fail(
        "{}: strategy '{}' is not one a load point can be simulated from (synchronous, concurrent, "
        "throughput, constant, poisson)",
        s.describe(), t);
  }
}

// A StatusDistributionSummary's successful requests, in `unit` seconds.
LatencySummary guidellm_summary(const json& metrics, const char* name, double unit, const Source& s) {
  const auto it = metrics.find(name);
  if (it == metrics.end()) missing(s, std::string("metrics.") + name);
  const auto ok = it->find("successful");
  if (ok == it->end() || !ok->is_object()) missing(s, std::string("metrics.") + name + ".successful");
  LatencySummary l;
  if (const auto v = opt_number(*ok, "mean", s)) l.mean = *v * unit;
  if (const auto v = opt_number(*ok, "median", s)) l.p50 = *v * unit;
  if (const auto p = ok->find("percentiles"); p != ok->end() && p->is_object()) {
    if (const auto v = opt_number(*p, "p50", s)) l.p50 = *v * unit;
    if (const auto v = opt_number(*p, "p90", s)) l.p90 = *v * unit;
    if (const auto v = opt_number(*p, "p99", s)) l.p99 = *v * unit;
  }
  return l;
}

std::vector<ServingBenchmark> from_guidellm(const json& o, const std::string& path) {
  std::string version = "0.3 layout";
  if (const auto m = o.find("metadata"); m != o.end() && m->is_object() && m->contains("guidellm_version"))
    version = (*m)["guidellm_version"].is_string() ? (*m)["guidellm_version"].get<std::string>() : "";
  const json& benches = o["benchmarks"];
  if (!benches.is_array() || benches.empty()) fail("{}: guidellm report with no benchmarks", path);
  std::vector<ServingBenchmark> out;
  for (size_t i = 0; i < benches.size(); ++i) {
    const json& g = benches[i];
    Source s{fmt::format("{} benchmark {}", path, i + 1), "guidellm", version};
    if (!g.is_object()) fail("{} is not an object", s.describe());
    ServingBenchmark b;
    b.tool = s.tool, b.version = version, b.where = s.where;
    const json* strategy = nullptr;
    if (const auto c = g.find("config"); c != g.end() && c->is_object() && c->contains("strategy"))
      strategy = &(*c)["strategy"];
    else if (const auto a = g.find("args"); a != g.end() && a->is_object() && a->contains("strategy"))
      strategy = &(*a)["strategy"];
    if (!strategy) missing(s, version == "0.3 layout" ? "args.strategy" : "config.strategy");
    guidellm_strategy(*strategy, b, s);
    const auto metrics = g.find("metrics");
    if (metrics == g.end() || !metrics->is_object()) missing(s, "metrics");
    b.ttft = guidellm_summary(*metrics, "time_to_first_token_ms", 1e-3, s);
    b.itl = guidellm_summary(*metrics, "inter_token_latency_ms", 1e-3, s);
    b.e2e = guidellm_summary(*metrics, "request_latency", 1.0, s);
    check_summary(b.ttft, "TTFT", s);
    check_summary(b.itl, "ITL", s);
    check_summary(b.e2e, "latency", s);
    b.duration_s = number_field(g, "duration", s);
    if (!(b.duration_s > 0)) fail("{}: the duration must be positive, got {}", s.describe(), b.duration_s);
    // Per request: the successful requests' lengths, sent in order of their start.
    std::vector<std::pair<double, std::pair<int64_t, int64_t>>> reqs;
    double out_tokens = 0;
    if (const auto r = g.find("requests"); r != g.end() && r->is_object() && r->contains("successful")) {
      for (const json& q : (*r)["successful"]) {
        if (!q.is_object()) fail("{}: a request record is not an object", s.describe());
        const int64_t pt = count_field(number_field(q, "prompt_tokens", s), "prompt_tokens", s, 1);
        const int64_t ot = count_field(number_field(q, "output_tokens", s), "output_tokens", s, 0);
        const auto start = opt_number(q, "request_start_time", s) ? opt_number(q, "request_start_time", s)
                                                                  : opt_number(q, "start_time", s);
        reqs.push_back({start.value_or(double(reqs.size())), {pt, std::max<int64_t>(ot, 1)}});
        out_tokens += double(ot);
      }
    }
    std::stable_sort(reqs.begin(), reqs.end(),
                     [](const auto& a, const auto& c) { return a.first < c.first; });
    for (const auto& [t, lens] : reqs)
      b.prompt_tokens.push_back(lens.first), b.output_tokens.push_back(lens.second);
    const auto totals = metrics->find("request_totals");
    if (totals != metrics->end() && totals->is_object() && totals->contains("successful"))
      b.completed = count_field(number_field(*totals, "successful", s), "request_totals.successful", s, 1);
    else if (!reqs.empty())
      b.completed = int64_t(reqs.size());
    else
      missing(s, "metrics.request_totals.successful");
    const LatencySummary pt = guidellm_summary(*metrics, "prompt_token_count", 1, s),
                         ot = guidellm_summary(*metrics, "output_token_count", 1, s);
    b.prompt_tokens_mean = pt.mean, b.output_tokens_mean = ot.mean;
    if (std::isnan(b.prompt_tokens_mean) || std::isnan(b.output_tokens_mean))
      missing(s, "metrics.prompt_token_count.successful.mean");
    b.requests_per_s = double(b.completed) / b.duration_s;
    b.output_tokens_per_s =
        (reqs.empty() ? b.output_tokens_mean * double(b.completed) : out_tokens) / b.duration_s;
    out.push_back(std::move(b));
  }
  return out;
}

// ---- AIPerf (profile_export_aiperf.json) and genai-perf (*_genai_perf.json): each metric an
// object {unit, avg, p50, p90, p99, ...}; the load in input_config (AIPerf: loadgen.*).
double unit_seconds(const std::string& unit, const std::string& metric, const Source& s) {
  if (unit == "ms") return 1e-3;
  if (unit == "s" || unit == "sec") return 1;
  if (unit == "us") return 1e-6;
  if (unit == "ns") return 1e-9;
  fail("{}: metric '{}' has unit '{}', not a time this importer converts (ns, us, ms, s, sec)", s.describe(),
       metric, unit);
}

LatencySummary perf_summary(const json& o, const char* name, const Source& s, bool required) {
  const auto it = o.find(name);
  if (it == o.end() || !it->is_object()) {
    if (required) missing(s, name);
    return {};
  }
  const auto unit = it->find("unit");
  if (unit == it->end() || !unit->is_string()) missing(s, std::string(name) + ".unit");
  const double k = unit_seconds(unit->get<std::string>(), name, s);
  LatencySummary l;
  if (const auto v = opt_number(*it, "avg", s)) l.mean = *v * k;
  if (const auto v = opt_number(*it, "p50", s)) l.p50 = *v * k;
  if (const auto v = opt_number(*it, "p90", s)) l.p90 = *v * k;
  if (const auto v = opt_number(*it, "p99", s)) l.p99 = *v * k;
  return l;
}
double perf_avg(const json& o, const char* name, const Source& s) {
  const auto it = o.find(name);
  if (it == o.end() || !it->is_object()) missing(s, name);
  return number_field(*it, "avg", s);
}

// AIPerf 0.13's load: input_config.phases, the profiling phase's {type: concurrency | poisson |
// constant | gamma, concurrency, rate}.
const json* aiperf_phase(const json& cfg) {
  const auto phases = cfg.find("phases");
  if (phases == cfg.end() || !phases->is_array()) return nullptr;
  for (const json& ph : *phases)
    if (ph.is_object() && ph.contains("kind") && ph["kind"] == "profiling") return &ph;
  return nullptr;
}

ServingBenchmark from_perf(const json& o, const std::string& path) {
  const json* cfg =
      o.contains("input_config") && o["input_config"].is_object() ? &o["input_config"] : nullptr;
  const json* phase = cfg ? aiperf_phase(*cfg) : nullptr;
  const json* load = phase                                                              ? phase
                     : cfg && cfg->contains("loadgen") && (*cfg)["loadgen"].is_object() ? &(*cfg)["loadgen"]
                                                                                        : cfg;
  const bool aiperf = o.contains("aiperf_version") || (cfg && (cfg->contains("loadgen") || phase));
  const std::string version = o.contains("aiperf_version") && o["aiperf_version"].is_string()
                                  ? o["aiperf_version"].get<std::string>()
                                  : "";
  Source s{path, aiperf ? "aiperf" : "genai-perf", version};
  ServingBenchmark b;
  b.tool = s.tool, b.version = version, b.where = s.where;
  b.ttft = perf_summary(o, "time_to_first_token", s, true);
  b.itl = perf_summary(o, "inter_token_latency", s, true);
  b.e2e = perf_summary(o, "request_latency", s, false);
  check_summary(b.ttft, "TTFT", s);
  check_summary(b.itl, "ITL", s);
  check_summary(b.e2e, "latency", s);
  b.requests_per_s = perf_avg(o, "request_throughput", s);
  b.output_tokens_per_s = perf_avg(o, "output_token_throughput", s);
  b.prompt_tokens_mean = perf_avg(o, "input_sequence_length", s);
  b.output_tokens_mean = perf_avg(o, "output_sequence_length", s);
  if (o.contains("request_count"))
    b.completed = count_field(perf_avg(o, "request_count", s), "request_count.avg", s, 1);
  if (o.contains("benchmark_duration")) {
    const LatencySummary d = perf_summary(o, "benchmark_duration", s, true);
    b.duration_s = d.mean;
  }
  if (b.completed == 0 && b.duration_s > 0)
    b.completed = std::max<int64_t>(1, std::llround(b.requests_per_s * b.duration_s));
  if (b.completed == 0) missing(s, "request_count");
  if (b.duration_s <= 0) b.duration_s = double(b.completed) / b.requests_per_s;
  if (!load) missing(s, "input_config");
  if (const auto c = opt_number(*load, "concurrency", s))
    b.concurrency = count_field(*c, "concurrency", s, 1);
  if (const auto r = opt_number(*load, phase ? "rate" : "request_rate", s)) {
    if (!(*r > 0)) fail("{}: the request rate must be positive, got {}", s.describe(), *r);
    b.rate = *r;
    const auto mode = load->find(phase ? "type" : "request_rate_mode");
    b.cv = mode != load->end() && mode->is_string() && mode->get<std::string>() == "constant" ? 0.01 : 1.0;
  }
  if (b.concurrency == 0 && std::isinf(b.rate))
    fail("{}: input_config gives neither a concurrency nor a request rate", s.describe());
  return b;
}

// What every importer's record must hold before a workload is built from it.
void check_record(const ServingBenchmark& b) {
  const Source s{b.where, b.tool, b.version};
  constexpr double kMaxTokens = double(int64_t(1) << 24);
  if (b.completed < 1 || b.completed > (int64_t(1) << 24))
    fail("{}: {} completed requests is not in [1, 16777216]", s.describe(), b.completed);
  for (const auto& [v, name] :
       {std::pair{b.prompt_tokens_mean, "mean prompt"}, {b.output_tokens_mean, "mean output"}})
    if (!(v >= 1) || !(v <= kMaxTokens))
      fail("{}: the {} of {} tokens is not in [1, 16777216]", s.describe(), name, v);
  for (const auto& lens : {b.prompt_tokens, b.output_tokens})
    for (const int64_t n : lens)
      if (n < 1 || n > int64_t(kMaxTokens))
        fail("{}: a request of {} tokens is not in [1, 16777216]", s.describe(), n);
  for (const double v : {b.requests_per_s, b.output_tokens_per_s})
    if (!(v >= 0) || !std::isfinite(v)) fail("{}: a throughput of {} is not a rate", s.describe(), v);
}

}  // namespace

std::vector<ServingBenchmark> read_serving_benchmarks(const std::string& path) {
  const std::string text = read_input_file(path, "serving benchmark", input_cap::kResults);
  std::vector<ServingBenchmark> out;
  for (const auto& [rec, o] : json_values(path, text)) {
    if (!o.is_object()) fail("{}: record {}: not a JSON object", path, rec);
    if (o.contains("benchmarks")) {
      for (ServingBenchmark& b : from_guidellm(o, path)) out.push_back(std::move(b));
    } else if (o.contains("time_to_first_token") && o["time_to_first_token"].is_object()) {
      out.push_back(from_perf(o, path));
    } else if (o.contains("request_throughput") || o.contains("median_ttft_ms") ||
               o.contains("mean_ttft_ms")) {
      out.push_back(from_vllm(o, path, rec));
    } else {
      fail(
          "{}: record {}: not a serving benchmark this reads (vllm bench serve --save-result, a guidellm "
          "report, AIPerf's profile_export_aiperf.json or genai-perf's *_genai_perf.json)",
          path, rec);
    }
  }
  if (out.empty()) fail("{}: no serving benchmark in the file", path);
  for (const ServingBenchmark& b : out) check_record(b);
  return out;
}

std::vector<sim::ServingRequest> benchmark_workload(const ServingBenchmark& b, uint64_t seed) {
  const int64_t n = b.prompt_tokens.empty() ? b.completed : int64_t(b.prompt_tokens.size());
  const auto fixed = [](double mean) {
    sim::LengthDist d;
    d.lo = d.hi = std::max<int64_t>(1, std::llround(mean));
    return d;
  };
  std::vector<sim::ServingRequest> reqs =
      sim::make_workload(n, {std::isinf(b.rate) ? 1.0 : b.rate, b.cv}, fixed(b.prompt_tokens_mean),
                         fixed(b.output_tokens_mean), seed);
  for (size_t i = 0; i < b.prompt_tokens.size() && i < reqs.size(); ++i)
    reqs[i].prompt_tokens = b.prompt_tokens[i], reqs[i].output_tokens = b.output_tokens[i];
  if (std::isinf(b.rate))
    for (sim::ServingRequest& r : reqs) r.arrival_s = 0;
  return reqs;
}

const char* figure_name(Figure f) {
  switch (f) {
    case Figure::TtftP50:
      return "ttft_p50";
    case Figure::TtftP90:
      return "ttft_p90";
    case Figure::ItlP50:
      return "itl_p50";
    case Figure::ItlP90:
      return "itl_p90";
    default:
      return "output_tokens_per_s";
  }
}

double measured(const ServingBenchmark& b, Figure f) {
  switch (f) {
    case Figure::TtftP50:
      return b.ttft.p50;
    case Figure::TtftP90:
      return b.ttft.p90;
    case Figure::ItlP50:
      return b.itl.p50;
    case Figure::ItlP90:
      return b.itl.p90;
    default:
      return b.output_tokens_per_s;
  }
}

double simulated(const sim::ServingMetrics& m, Figure f) {
  switch (f) {
    case Figure::TtftP50:
      return m.ttft.p50;
    case Figure::TtftP90:
      return m.ttft.p90;
    case Figure::ItlP50:
      return m.itl.p50;
    case Figure::ItlP90:
      return m.itl.p90;
    default:
      return m.output_tokens_per_s;
  }
}

namespace {

struct FitProblem {
  const ModelConfig& c;
  const hw::Profile& hw;
  const sim::Precision& p;
  const sim::ServingConfig& cfg;
  std::vector<std::vector<sim::ServingRequest>> workloads;
  std::span<const ServingBenchmark> bs;
  const ServingFitOptions& o;
  int64_t simulations = 0;

  // The parameters the fit moves: host time per iteration and per scheduled request, kernel scale.
  struct Params {
    double iteration_s = 0, scale = 1, request_s = 0;
  };

  // Every figure of benchmark k at `x`.
  std::array<double, kFigures> predict(size_t k, const Params& x) {
    sim::ServingConfig run_cfg = cfg;
    run_cfg.iteration_overhead_s = x.iteration_s;
    run_cfg.time_scale = x.scale;
    run_cfg.request_overhead_s = x.request_s;
    run_cfg.clients = bs[k].concurrency;
    ++simulations;
    const sim::ServingRun run = sim::simulate_serving(c, hw, p, sim::ServingMethod{}, run_cfg, workloads[k]);
    const sim::ServingMetrics m = sim::serving_metrics(run, {});
    std::array<double, kFigures> out{};
    for (int f = 0; f < kFigures; ++f) out[size_t(f)] = simulated(m, Figure(f));
    return out;
  }
  // The objective over the benchmarks `use` marks: squared log ratios of every figure given.
  double loss(const std::vector<char>& use, const Params& x) {
    double sum = 0;
    for (size_t k = 0; k < bs.size(); ++k) {
      if (!use[k]) continue;
      const auto pred = predict(k, x);
      for (int f = 0; f < kFigures; ++f) {
        const double m = measured(bs[k], Figure(f));
        if (!(m > 0) || !(pred[size_t(f)] > 0)) continue;
        const double e = std::log(pred[size_t(f)] / m);
        sum += e * e;
      }
    }
    return sum;
  }
  Params base() const { return {cfg.iteration_overhead_s, cfg.time_scale, cfg.request_overhead_s}; }

  // The fitted parameters over the benchmarks `use` marks, from the base configuration's: in the
  // coordinates the search moves (log scale; times in ms), by Brent's method for one parameter
  // and BOBYQA for more.
  Params fit(const std::vector<char>& use) {
    struct Coord {
      double Params::*field;
      double lo, hi;
      bool log;
    };
    std::vector<Coord> coords;
    if (o.fit_scale) coords.push_back({&Params::scale, std::log(0.1), std::log(10.0), true});
    if (o.fit_iteration) coords.push_back({&Params::iteration_s, 0, 1000, false});
    if (o.fit_request) coords.push_back({&Params::request_s, 0, 100, false});
    const Params start = base();
    const auto at = [&](const double* v) {
      Params x = start;
      for (size_t i = 0; i < coords.size(); ++i)
        x.*coords[i].field = coords[i].log ? std::exp(v[i]) : v[i] * 1e-3;
      return x;
    };
    if (coords.size() == 1) {
      const auto r = boost::math::tools::brent_find_minima([&](double v) { return loss(use, at(&v)); },
                                                           coords[0].lo, coords[0].hi, 30);
      return at(&r.first);
    }
    struct Data {
      FitProblem* self;
      const std::vector<char>* use;
      const decltype(at)* point;
    } d{this, &use, &at};
    std::vector<double> v, lo, hi;
    for (const Coord& k : coords) {
      const double x0 = start.*k.field;
      v.push_back(k.log ? std::log(std::clamp(x0, 0.1, 10.0)) : std::clamp(x0 * 1e3, k.lo, k.hi));
      lo.push_back(k.lo), hi.push_back(k.hi);
    }
    minimize_bobyqa(
        unsigned(coords.size()), v.data(), lo.data(), hi.data(),
        [](unsigned, const double* x, double*, void* data) {
          auto* dd = static_cast<Data*>(data);
          return dd->self->loss(*dd->use, (*dd->point)(x));
        },
        &d, 300, 1e-4, "calibrate-serving");
    return at(v.data());
  }
};

// Mean absolute percentage error of one figure over the points that measured it.
double mape(const std::vector<PointResult>& pts, int f, const double (PointResult::*pred)[kFigures]) {
  double sum = 0;
  int n = 0;
  for (const PointResult& p : pts) {
    const double m = p.measured[f], x = (p.*pred)[f];
    if (!(m > 0) || std::isnan(x)) continue;
    sum += std::abs(x / m - 1), ++n;
  }
  return n ? sum / n * 100 : kNotGiven;
}

}  // namespace

ServingFit fit_serving_benchmarks(const ModelConfig& c, const hw::Profile& hw, const sim::Precision& p,
                                  const sim::ServingConfig& cfg, std::span<const ServingBenchmark> bs,
                                  const ServingFitOptions& o) {
  if (bs.empty()) fail("no serving benchmark to fit");
  if (!o.fit_iteration && !o.fit_scale)
    usage_fail("nothing to fit: neither the iteration time nor the scale");
  FitProblem prob{c, hw, p, cfg, {}, bs, o};
  for (const ServingBenchmark& b : bs) prob.workloads.push_back(benchmark_workload(b, o.seed));
  ServingFit out;
  std::vector<char> all(bs.size(), 1);
  const FitProblem::Params fitted = prob.fit(all);
  out.iteration_s = fitted.iteration_s, out.scale = fitted.scale, out.request_s = fitted.request_s;
  for (size_t k = 0; k < bs.size(); ++k) {
    PointResult r;
    r.where = bs[k].where, r.rate = bs[k].rate, r.concurrency = bs[k].concurrency;
    const auto unc = prob.predict(k, prob.base());
    const auto cal = prob.predict(k, fitted);
    std::array<double, kFigures> held{};
    held.fill(kNotGiven);
    if (bs.size() > 1) {
      std::vector<char> others(bs.size(), 1);
      others[k] = 0;
      held = prob.predict(k, prob.fit(others));
    }
    for (int f = 0; f < kFigures; ++f) {
      r.measured[f] = measured(bs[k], Figure(f));
      r.uncalibrated[f] = unc[size_t(f)], r.calibrated[f] = cal[size_t(f)], r.held_out[f] = held[size_t(f)];
    }
    out.points.push_back(r);
  }
  for (int f = 0; f < kFigures; ++f) {
    out.mape_uncalibrated[f] = mape(out.points, f, &PointResult::uncalibrated);
    out.mape_calibrated[f] = mape(out.points, f, &PointResult::calibrated);
    out.mape_held_out[f] = bs.size() > 1 ? mape(out.points, f, &PointResult::held_out) : kNotGiven;
  }
  out.simulations = prob.simulations;
  return out;
}

}  // namespace lp::calib
