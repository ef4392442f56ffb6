// `lazyprefill simulate-serving`: a serving deployment under load (sim/serving.h), per hardware
// profile and method: latency percentiles, throughput, goodput and K/V use at arrival rates, or
// the highest rate that meets latency objectives.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "admission/request_log.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/io.h"
#include "model/presets.h"
#include "sim/deployment.h"
#include "sim/replay.h"
#include "sim/serving_capacity.h"
#include "sim/simulate.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

json pct_json(const sim::Percentiles& p) {
  return {{"p50", p.p50 * 1e3}, {"p90", p.p90 * 1e3}, {"p99", p.p99 * 1e3}, {"mean", p.mean * 1e3}};
}

json serving_metrics_json(const sim::ServingMetrics& m) {
  return {{"requests", m.requests},
          {"duration_s", m.duration_s},
          {"requests_per_s", m.requests_per_s},
          {"output_tokens_per_s", m.output_tokens_per_s},
          {"prompt_tokens_per_s", m.prompt_tokens_per_s},
          {"goodput_per_s", m.goodput_per_s},
          {"ttft_ms", pct_json(m.ttft)},
          {"itl_ms", pct_json(m.itl)},
          {"e2e_ms", pct_json(m.e2e)},
          {"queue_ms", pct_json(m.queue)},
          {"kv_utilisation_mean", m.kv_utilisation_mean},
          {"kv_utilisation_peak", m.kv_utilisation_peak},
          {"prompt_share_mean", m.prompt_tokens_computed_fraction_mean}};
}

// A run's requests as `serve --log-requests` lines (the fields a simulation has), in arrival order:
// read_requests takes it back as an arrival file.
std::string simulated_request_log(const sim::ServingRun& run, const std::string& method) {
  std::string out;
  uint64_t id = 0;
  for (const sim::RequestOutcome& o : run.requests) {
    RequestLogLine l;
    l.id = ++id;
    l.arrival_s = o.arrival_s, l.admitted_s = o.admitted_s, l.first_token_s = o.first_token_s,
    l.finished_s = o.finished_s;
    l.prompt_tokens = o.prompt_tokens, l.output_tokens = o.output_tokens;
    l.prune = method;
    l.prompt_tokens_computed_fraction = o.prompt_tokens_computed_fraction;
    l.cached_tokens = o.cached_tokens;
    l.simulated = true;
    out += request_log_line(l);
  }
  return out;
}

// The methods --prune names, each at --schedule where that fits it (else its own default), with the
// revivals its synthetic decoding draws; one line per pruning method saying where they come from.
std::vector<sim::ServingMethod> serving_methods(const SimulateServingArgs& a, const ModelConfig& c,
                                                std::vector<std::string>& revival_lines,
                                                Schedule& main_sched) {
  std::vector<Schedule> given;
  if (!a.schedule.empty()) given.push_back(schedule_from_arg(a.schedule));
  main_sched = given.empty() ? default_schedule() : given.front();
  const auto revival_model = sim::load_revivals(a.revival_model, a.revival_share);
  std::vector<sim::ServingMethod> methods;
  for (const std::string& name : split_list(a.prune)) {
    const PolicyKind kind = parse_policy(name);
    const Schedule sched = schedules_fitting(kind, given).front();
    const std::vector<PruneStep> steps = resolve_method(kind, sched, c.n_layer, c.global_layers());
    std::string label = name;
    if (kind != PolicyKind::None && sched.to_string() != main_sched.to_string())
      label += " " + sched.to_string();
    trace::Revivals revivals;
    if (kind != PolicyKind::None) {
      const sim::RevivalChoice rv =
          sim::choose_revivals(revival_model, a.revival_share, name, c.n_layer, steps, true);
      revivals = rv.share;
      revival_lines.push_back(name + ": " + rv.description);
    }
    methods.push_back(sim::serving_method({kind, sched}, c, std::move(revivals), label));
  }
  if (methods.empty()) usage_fail("--prune names no method");
  return methods;
}

json workload_json(const SimulateServingArgs& a, const sim::LengthDist& prompt,
                   const sim::LengthDist& output) {
  return {{"arrivals", a.cv == 1 ? "poisson" : fmt::format("gamma, cv {}", a.cv)},
          {"requests", a.requests},
          {"prompt_tokens", prompt.describe()},
          {"output_tokens", output.describe()},
          {"seed", a.seed},
          {"concurrency", a.concurrency > 0 ? json(a.concurrency) : json(nullptr)}};
}

// --capacity: per hardware and method the highest rate meeting the objectives.
void capacity_runs(const SimulateServingArgs& a, const ModelConfig& c, const std::vector<hw::Profile>& hws,
                   const sim::Precision& prec, const std::vector<sim::ServingMethod>& methods,
                   const std::vector<sim::ServingConfig>& cfgs, const sim::Objectives& obj, json& out,
                   std::string& text) {
  const auto prompt = sim::LengthDist::parse(a.prompt_tokens, "--prompt-tokens", "prompt_tokens");
  const auto output = sim::LengthDist::parse(a.output_tokens, "--output-tokens", "output_tokens");
  out["workload"] = workload_json(a, prompt, output);
  out["workload"]["seeds"] = a.seeds;
  sim::CapacityOptions co;
  co.objectives = obj;
  co.tolerance = a.tolerance;
  co.seeds = a.seeds;
  co.requests = a.requests;
  co.seed = a.seed;
  json caps = json::array();
  text += fmt::format("capacity at p90 TTFT <= {} and p90 ITL <= {} ({} requests x {} seeds, Poisson{})\n",
                      a.slo_ttft_ms > 0 ? fmt::format("{} ms", a.slo_ttft_ms) : "-",
                      a.slo_itl_ms > 0 ? fmt::format("{} ms", a.slo_itl_ms) : "-", a.requests, a.seeds,
                      a.cv == 1 ? "" : fmt::format(", cv {}", a.cv));
  text += fmt::format("{:<18} {:<9} {:>12} {:>20} {:>12} {:>12}\n", "hardware", "method", "req/s",
                      "over seeds", "TTFT p90 ms", "ITL p90 ms");
  for (size_t h = 0; h < hws.size(); ++h)
    for (const sim::ServingMethod& m : methods) {
      const hw::Profile& hw = hws[h];
      const sim::CapacityResult r =
          sim::find_capacity(c, hw, prec, m, cfgs[h], {1.0, a.cv}, prompt, output, co);
      json j = {{"hw", hw.name},
                {"method", m.name},
                {"met", r.met},
                {"rate_per_s", r.rate},
                {"rate_min_per_s", r.rate_min},
                {"rate_max_per_s", r.rate_max},
                {"resolution", r.bracket},
                {"simulations", r.simulations}};
      if (r.met) {
        j["at_rate"] = serving_metrics_json(r.at_rate);
        text += fmt::format("{:<18} {:<9} {:>12.4g} {:>20} {:>12.1f} {:>12.2f}\n", hw.name, m.name, r.rate,
                            fmt::format("{:.4g}-{:.4g}", r.rate_min, r.rate_max), r.at_rate.ttft.p90 * 1e3,
                            r.at_rate.itl.p90 * 1e3);
      } else {
        j["best_at_lowest_rate"] = serving_metrics_json(r.best);
        text += fmt::format(
            "{:<18} {:<9} {:>12} {:>20} {:>12.1f} {:>12.2f}  objectives unmet: best p90s at {} req/s\n",
            hw.name, m.name, "none", "-", r.best.ttft.p90 * 1e3, r.best.itl.p90 * 1e3, co.rate_lo);
      }
      caps.push_back(std::move(j));
    }
  out["capacity"] = std::move(caps);
}

// The requests to simulate: the arrival file's, or the drawn workload at each --rate (0: a file).
std::vector<std::pair<double, std::vector<sim::ServingRequest>>> request_runs(const SimulateServingArgs& a,
                                                                              json& out) {
  std::vector<std::pair<double, std::vector<sim::ServingRequest>>> runs;
  if (!a.arrival_file.empty()) {
    runs.emplace_back(0.0, sim::read_requests(a.arrival_file));
    out["workload"] = {{"arrival_file", a.arrival_file}, {"requests", runs.back().second.size()}};
    return runs;
  }
  const auto prompt = sim::LengthDist::parse(a.prompt_tokens, "--prompt-tokens", "prompt_tokens");
  const auto output = sim::LengthDist::parse(a.output_tokens, "--output-tokens", "output_tokens");
  auto unit = sim::make_workload(a.requests, {1.0, a.cv}, prompt, output, a.seed);
  if (!a.shared_prefix.empty()) {
    const auto [tokens, groups] = sim::parse_shared_prefix(a.shared_prefix, "--shared-prefix");
    sim::share_prefixes(unit, tokens, groups);
  }
  const std::vector<std::string> rate_list =
      a.rates.empty() ? std::vector<std::string>{a.concurrency > 0 ? "inf" : "1"} : a.rates;
  for (const std::string& rs : rate_list)
    for (const std::string& r : split_list(rs)) {
      char* end = nullptr;
      const double v = r == "inf" ? HUGE_VAL : std::strtod(r.c_str(), &end);
      if (r != "inf" && (!end || *end || !std::isfinite(v) || v <= 0))
        usage_fail("--rate: '{}' is not a positive number of requests/s (or inf)", escape_text(r));
      runs.emplace_back(v, sim::at_rate(unit, v));
    }
  out["workload"] = workload_json(a, prompt, output);
  if (!a.shared_prefix.empty()) out["workload"]["shared_prefix"] = a.shared_prefix;
  return runs;
}

// Every hardware x method x rate simulated; with --log-requests, the (one) run's requests written.
void simulated_runs(const SimulateServingArgs& a, const ModelConfig& c, const std::vector<hw::Profile>& hws,
                    const sim::Precision& prec, const std::vector<sim::ServingMethod>& methods,
                    const std::vector<sim::ServingConfig>& cfgs,
                    const std::optional<sim::Deployment>& deployment, const sim::Objectives& obj, json& out,
                    std::string& text) {
  const auto runs = request_runs(a, out);
  // Every run is of the same workload, so one check before any of them is simulated.
  if (!runs.empty() && a.warmup + a.cooldown >= int64_t(runs.front().second.size()))
    usage_fail("--warmup {} and --cooldown {} leave none of the {} requests to measure", a.warmup, a.cooldown,
               runs.front().second.size());
  json results = json::array();
  std::string request_log;
  text += fmt::format("{:<18} {:<9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}\n",
                      "hardware", "method", "rate/s", "req/s", "TTFT p50", "p90", "p99", "ITL p50", "p90",
                      "queue p90", "goodput", "KV");
  for (size_t h = 0; h < hws.size(); ++h)
    for (const sim::ServingMethod& m : methods)
      for (const auto& [rate, reqs] : runs) {
        const hw::Profile& hw = hws[h];
        const sim::ServingConfig& cfg = cfgs[h];
        const sim::ServingRun run = deployment ? sim::simulate_deployment(c, prec, m, *deployment, reqs)
                                               : sim::simulate_serving(c, hw, prec, m, cfg, reqs);
        // --warmup and --cooldown as shares of the requests this run holds (a pipeline's or
        // data-parallel group's share: the same share of its own).
        const size_t held = run.requests.size();
        const double sent = double(reqs.size());  // (a structured binding: clang 14 cannot capture it)
        const auto held_share = [held, sent](int64_t n) {
          return static_cast<size_t>(std::llround(double(n) * double(held) / sent));
        };
        const sim::ServingMetrics mm =
            sim::serving_metrics(run, obj, held_share(a.warmup), held - held_share(a.cooldown));
        if (!a.log_requests.empty()) request_log = simulated_request_log(run, m.name);
        json j = {{"hw", hw.name}, {"method", m.name}};
        j["rate_per_s"] = std::isinf(rate) ? json("inf") : rate > 0 ? json(rate) : json(nullptr);
        if (cfg.kv_mode == hw::Scheduling::Kv::OnDemand) j["preemptions"] = run.preemptions;
        j["metrics"] = serving_metrics_json(mm);
        j["iterations"] = run.iterations;
        if (deployment) {
          double bytes = 0, transfer = 0;
          int64_t handed = 0;
          for (const sim::RequestOutcome& o : run.requests)
            if (o.decode_replica >= 0)
              bytes += o.kv_bytes_after_prefill + o.aux_bytes, transfer += o.transfer_s, ++handed;
          j["deployment"] = {{"router", sim::router_name(deployment->router)},
                             {"replicas", deployment->decode ? 0 : deployment->serve.replicas},
                             {"prefill_instances", deployment->decode ? deployment->serve.replicas : 0},
                             {"decode_instances", deployment->decode ? deployment->decode->replicas : 0}};
          if (deployment->decode)
            j["handover"] = {{"requests", handed},
                             {"mean_mib", handed ? bytes / double(handed) / (1 << 20) : 0.0},
                             {"mean_ms", handed ? transfer / double(handed) * 1e3 : 0.0},
                             {"link_gbs", deployment->link_bytes_per_s / 1e9}};
        }
        if (cfg.prefix_cache) {
          double cached = 0, prompt = 0;
          for (const sim::RequestOutcome& o : run.requests)
            cached += double(o.cached_tokens), prompt += double(o.prompt_tokens);
          j["prompt_tokens_cached_share"] = prompt > 0 ? cached / prompt : 0.0;
        }
        json kv = json::array();
        for (const sim::KvPoint& p : run.kv)
          kv.push_back({p.t_s, p.reserved / (1 << 20), p.used / (1 << 20)});
        j["kv_mib_over_time"] = {{"columns", {"t_s", "reserved", "used"}}, {"points", std::move(kv)}};
        results.push_back(std::move(j));
        text += fmt::format(
            "{:<18} {:<9} {:>8} {:>8.3f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.2f} {:>9.2f} {:>9.1f} {:>8} "
            "{:>5.0f}%\n",
            hw.name, m.name, rate > 0 ? fmt::format("{:.4g}", rate) : "file", mm.requests_per_s,
            mm.ttft.p50 * 1e3, mm.ttft.p90 * 1e3, mm.ttft.p99 * 1e3, mm.itl.p50 * 1e3, mm.itl.p90 * 1e3,
            mm.queue.p90 * 1e3, obj.any() ? fmt::format("{:.3f}", mm.goodput_per_s) : "-",
            mm.kv_utilisation_mean * 100);
      }
  out["results"] = std::move(results);
  if (!a.log_requests.empty()) write_file_atomic(a.log_requests, request_log, "request log");
}

// "P:D", whole numbers from 1 (at most 4096 each); lp::UsageError naming --disaggregate.
std::pair<int, int> parse_instances(const std::string& s) {
  const size_t colon = s.find(':');
  const auto part = [&](const std::string& v) {
    if (v.empty() || v.size() > 4 || v.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(v) < 1 || std::stoi(v) > 4096)
      usage_fail("--disaggregate: '{}' is not P:D (prefill and decode instances, 1 to 4096 each)",
                 escape_text(s));
    return std::stoi(v);
  };
  if (colon == std::string::npos) part("");
  return {part(s.substr(0, colon)), part(s.substr(colon + 1))};
}
}  // namespace

int cmd_simulate_serving(const SimulateServingArgs& a) {
  std::string model_name;
  const ModelConfig c = sim::expert_parallel(sim::model_to_cost(a.model, a.model_config, &model_name), a.ep,
                                             a.moe_imbalance, a.dp, a.tp);
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const std::vector<hw::Profile> hws = load_profiles(a.hw, a.engine);
  for (const hw::Profile& hw : hws) for_option("--tp", [&] { sim::check_tp(c, hw, a.tp); });
  if (!a.out.empty()) refuse_output_over_input(a.out, "--out", {a.model, a.arrival_file, a.revival_model});
  if (!a.log_requests.empty())
    refuse_output_over_input(a.log_requests, "--log-requests",
                             {a.model, a.arrival_file, a.revival_model, a.out});
  std::vector<std::string> revival_lines;
  Schedule main_sched;
  const std::vector<sim::ServingMethod> methods = serving_methods(a, c, revival_lines, main_sched);

  // Each profile's engine schedules (hw::scheduling_for), what the options give overriding it.
  const auto config_for = [&](const hw::Profile& hw) {
    sim::ServingConfig cfg = scheduler_config(a.sched, hw);
    cfg.clients = a.concurrency;
    cfg.kv_budget_bytes = a.kv_budget_mib * double(1 << 20);
    cfg.kv_element_bytes = a.kv_element_bytes > 0 ? a.kv_element_bytes : sim::dtype_bytes(prec.kv, "--kv");
    cfg.prefix_cache = a.prefix_cache;
    cfg.prefix_block_tokens = a.prefix_block_tokens;
    cfg.tp = a.tp;
    cfg.pipeline = {a.pp, a.pp_link_gbs * 1e9};
    return cfg;
  };
  std::vector<sim::ServingConfig> cfgs;
  for (const hw::Profile& hw : hws) cfgs.push_back(config_for(hw));
  std::optional<sim::Deployment> deployment;
  if (a.replicas > 1 || !a.disaggregate.empty()) {
    if (hws.size() != 1) usage_fail("--replicas and --disaggregate take one --hw");
    if (a.capacity) usage_fail("--capacity searches one engine's rates; drop --replicas and --disaggregate");
    // Data-parallel attention is one engine's inner split, which the router cannot see; pipeline
    // stages run as virtual engines it routes to (sim/deployment.h).
    if (a.dp > 1) usage_fail("--replicas and --disaggregate take engines without --dp");
    sim::Deployment d;
    d.router = sim::parse_router(a.router);
    if (a.disaggregate.empty()) {
      d.serve = {hws[0], cfgs[0], a.replicas};
    } else {
      const auto [P, D] = parse_instances(a.disaggregate);
      const hw::Profile pre = a.prefill_hw.empty() ? hws[0] : load_profiles(a.prefill_hw, a.engine).at(0);
      for_option("--tp", [&] { sim::check_tp(c, pre, a.tp); });
      d.serve = {pre, config_for(pre), P};
      d.decode = sim::Pool{hws[0], cfgs[0], D};
      d.link_bytes_per_s = a.kv_link_gbs > 0 ? a.kv_link_gbs * 1e9 : pre.scale_out_bandwidth * double(a.tp);
      d.link_latency_s = a.kv_link_us >= 0 ? a.kv_link_us * 1e-6 : pre.scale_out_latency;
      if (!(d.link_bytes_per_s > 0))
        usage_fail("--disaggregate: {} has no scale-out network; give --kv-link-gbs", pre.name);
    }
    deployment = d;
  }
  sim::pipeline_starts(c.n_layer, a.pp);
  sim::Objectives obj{a.slo_ttft_ms * 1e-3, a.slo_itl_ms * 1e-3};
  if (a.capacity && !obj.any()) usage_fail("--capacity needs --slo-ttft-p90-ms and/or --slo-itl-p90-ms");
  if (a.capacity && (a.warmup > 0 || a.cooldown > 0))
    usage_fail("--warmup and --cooldown measure simulated runs; --capacity counts every request");
  if (a.capacity && !a.arrival_file.empty())
    usage_fail("--capacity draws its own arrivals; drop --arrival-file");
  if (a.capacity && a.concurrency > 0)
    usage_fail("--capacity searches open-loop arrival rates; drop --concurrency");
  if (!a.log_requests.empty()) {
    if (a.capacity) usage_fail("--log-requests writes one run's requests; --capacity makes many");
    size_t n_rates = 0;
    for (const std::string& rs : a.rates) n_rates += split_list(rs).size();
    if (hws.size() != 1 || methods.size() != 1 || n_rates > 1)
      usage_fail(
          "--log-requests writes one run's requests: give one --hw, one --prune method and one "
          "--rate (or --arrival-file)");
  }

  json out;
  out["tool"] = "lazyprefill simulate-serving";
  out["model"] = model_name;
  // The first profile's scheduler; "schedulers" gives every profile's where they differ.
  const auto layout = [&](json j) {
    j["kv_budget_mib"] = a.kv_budget_mib, j["dp"] = c.dp, j["ep"] = c.ep, j["pp"] = a.pp;
    return j;
  };
  out["scheduler"] = layout(scheduler_json(hws.front(), cfgs.front()));
  if (hws.size() > 1) {
    json all = json::object();
    for (size_t h = 0; h < hws.size(); ++h) all[hws[h].name] = layout(scheduler_json(hws[h], cfgs[h]));
    out["schedulers"] = std::move(all);
  }
  out["schedule"] = main_sched.to_string();
  out["revivals"] = revival_lines;
  if (obj.any())
    out["objectives"] = {{"ttft_p90_ms", a.slo_ttft_ms > 0 ? json(a.slo_ttft_ms) : json(nullptr)},
                         {"itl_p90_ms", a.slo_itl_ms > 0 ? json(a.slo_itl_ms) : json(nullptr)}};
  std::string text;
  if (a.capacity)
    capacity_runs(a, c, hws, prec, methods, cfgs, obj, out, text);
  else
    simulated_runs(a, c, hws, prec, methods, cfgs, deployment, obj, out, text);
  const std::string dumped = out.dump(2) + "\n";
  if (!a.out.empty()) write_file_atomic(a.out, dumped, "serving simulation");
  if (a.json_out)
    fmt::print("{}", dumped);
  else
    fmt::print("{}times in ms; ITL each request's mean; KV the mean share of the budget reserved\n", text);
  return 0;
}

}  // namespace lp::cli
