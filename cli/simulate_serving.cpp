// `lazyprefill simulate-serving`: a serving deployment under load (sim::serving_study), per
// hardware profile and method: latency percentiles, throughput, goodput and K/V use at arrival
// rates, or the highest rate that meets latency objectives. The options become the request, the
// report becomes text or JSON here; the files it writes (--out, --log-requests) are the CLI's.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "cli/commands.h"
#include "model/error.h"
#include "model/io.h"
#include "sim/serving_study.h"

namespace lp::cli {
namespace {

// --rate's comma lists as numbers: inf, or a positive number of requests/s.
std::vector<double> parse_rates(const std::vector<std::string>& lists) {
  std::vector<double> out;
  for (const std::string& rs : lists)
    for (const std::string& r : split_list(rs)) {
      char* end = nullptr;
      const double v = r == "inf" ? HUGE_VAL : std::strtod(r.c_str(), &end);
      if (r != "inf" && (!end || *end || !std::isfinite(v) || v <= 0))
        usage_fail("--rate: '{}' is not a positive number of requests/s (or inf)", escape_text(r));
      out.push_back(v);
    }
  return out;
}

sim::ServingStudyRequest to_request(const SimulateServingArgs& a) {
  sim::ServingStudyRequest r;
  r.model = a.model;
  r.model_config = a.model_config;
  r.hws = load_profiles(a.hw, a.engine);
  if (!a.prefill_hw.empty()) r.prefill_hw = load_profiles(a.prefill_hw, a.engine).at(0);
  r.precision = a.precision;
  r.prune = a.prune;
  r.schedule = a.schedule;
  r.revival_model = a.revival_model;
  r.revival_share = a.revival_share;
  r.arrival_file = a.arrival_file;
  r.rates = parse_rates(a.rates);
  r.cv = a.cv;
  r.requests = a.requests;
  r.prompt_tokens = a.prompt_tokens;
  r.output_tokens = a.output_tokens;
  r.seed = a.seed;
  r.sched = a.sched;
  r.concurrency = a.concurrency;
  r.warmup = a.warmup, r.cooldown = a.cooldown;
  r.kv_budget_mib = a.kv_budget_mib;
  r.kv_element_bytes = a.kv_element_bytes;
  r.tp = a.tp, r.ep = a.ep, r.dp = a.dp, r.pp = a.pp;
  r.moe_imbalance = a.moe_imbalance;
  r.pp_link_gbs = a.pp_link_gbs;
  r.capacity = a.capacity;
  r.slo_ttft_ms = a.slo_ttft_ms, r.slo_itl_ms = a.slo_itl_ms;
  r.seeds = a.seeds;
  r.tolerance = a.tolerance;
  r.prefix_cache = a.prefix_cache;
  r.prefix_block_tokens = a.prefix_block_tokens;
  r.shared_prefix = a.shared_prefix;
  r.replicas = a.replicas;
  r.router = a.router;
  r.disaggregate = a.disaggregate;
  r.kv_link_gbs = a.kv_link_gbs;
  r.kv_link_us = a.kv_link_us;
  r.keep_requests = !a.log_requests.empty();
  return r;
}

std::string capacity_text(const SimulateServingArgs& a, const sim::ServingStudyReport& rep) {
  std::string text =
      fmt::format("capacity at p90 TTFT <= {} and p90 ITL <= {} ({} requests x {} seeds, Poisson{})\n",
                  a.slo_ttft_ms > 0 ? fmt::format("{} ms", a.slo_ttft_ms) : "-",
                  a.slo_itl_ms > 0 ? fmt::format("{} ms", a.slo_itl_ms) : "-", a.requests, a.seeds,
                  a.cv == 1 ? "" : fmt::format(", cv {}", a.cv));
  text += fmt::format("{:<18} {:<9} {:>12} {:>20} {:>12} {:>12}\n", "hardware", "method", "req/s",
                      "over seeds", "TTFT p90 ms", "ITL p90 ms");
  for (const sim::CapacityRun& c : rep.capacities) {
    const sim::CapacityResult& r = c.result;
    if (r.met)
      text += fmt::format("{:<18} {:<9} {:>12.4g} {:>20} {:>12.1f} {:>12.2f}\n", c.hw, c.method, r.rate,
                          fmt::format("{:.4g}-{:.4g}", r.rate_min, r.rate_max), r.at_rate.ttft.p90 * 1e3,
                          r.at_rate.itl.p90 * 1e3);
    else
      text += fmt::format(
          "{:<18} {:<9} {:>12} {:>20} {:>12.1f} {:>12.2f}  objectives unmet: best p90s at {} req/s\n", c.hw,
          c.method, "none", "-", r.best.ttft.p90 * 1e3, r.best.itl.p90 * 1e3, sim::CapacityOptions{}.rate_lo);
  }
  return text;
}

std::string runs_text(const sim::ServingStudyReport& rep) {
  std::string text = fmt::format("{:<18} {:<9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}\n",
                                 "hardware", "method", "rate/s", "req/s", "TTFT p50", "p90", "p99", "ITL p50",
                                 "p90", "queue p90", "goodput", "KV");
  for (const sim::ServingRunResult& r : rep.runs) {
    const sim::ServingMetrics& mm = r.metrics;
    text += fmt::format(
        "{:<18} {:<9} {:>8} {:>8.3f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.2f} {:>9.2f} {:>9.1f} {:>8} {:>5.0f}%\n",
        r.hw, r.method, r.rate > 0 ? fmt::format("{:.4g}", r.rate) : "file", mm.requests_per_s,
        mm.ttft.p50 * 1e3, mm.ttft.p90 * 1e3, mm.ttft.p99 * 1e3, mm.itl.p50 * 1e3, mm.itl.p90 * 1e3,
        mm.queue.p90 * 1e3, rep.slo.any() ? fmt::format("{:.3f}", mm.goodput_per_s) : "-",
        mm.kv_utilisation_mean * 100);
  }
  return text;
}

}  // namespace

int cmd_simulate_serving(const SimulateServingArgs& a) {
  const sim::ServingStudyRequest req = to_request(a);
  if (!a.out.empty()) refuse_output_over_input(a.out, "--out", {a.model, a.arrival_file, a.revival_model});
  if (!a.log_requests.empty()) {
    refuse_output_over_input(a.log_requests, "--log-requests",
                             {a.model, a.arrival_file, a.revival_model, a.out});
    if (a.capacity) usage_fail("--log-requests writes one run's requests; --capacity makes many");
    if (req.hws.size() != 1 || split_list(a.prune).size() != 1 || req.rates.size() > 1)
      usage_fail(
          "--log-requests writes one run's requests: give one --hw, one --prune method and one "
          "--rate (or --arrival-file)");
  }
  const sim::ServingStudyReport rep = sim::serving_study(req);
  const std::string dumped = rep.to_json().dump(2) + "\n";
  if (!a.out.empty()) write_file_atomic(a.out, dumped, "serving simulation");
  if (!a.log_requests.empty())
    write_file_atomic(a.log_requests, sim::simulated_request_log(rep.runs.at(0)), "request log");
  if (a.json_out)
    fmt::print("{}", dumped);
  else
    fmt::print("{}times in ms; ITL each request's mean; KV the mean share of the budget reserved\n",
               rep.capacity ? capacity_text(a, rep) : runs_text(rep));
  return 0;
}

}  // namespace lp::cli
