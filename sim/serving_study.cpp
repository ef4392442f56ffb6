#include "sim/serving_study.h"

#include <fmt/format.h>

#include <cmath>

#include "admission/request_log.h"
#include "model/error.h"
#include "model/io.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "sim/deployment.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "sim/simulate.h"

namespace lp::sim {
namespace {
using json = nlohmann::ordered_json;

json pct_json(const Percentiles& p) {
  return {{"p50", p.p50 * 1e3}, {"p90", p.p90 * 1e3}, {"p99", p.p99 * 1e3}, {"mean", p.mean * 1e3}};
}

json serving_metrics_json(const ServingMetrics& m) {
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

// The methods `prune` names, each at `schedule` where that fits it (else its own default), with the
// revivals its synthetic decoding draws; one line per pruning method saying where they come from.
std::vector<ServingMethod> serving_methods(const ServingStudyRequest& r, const ModelConfig& c,
                                           std::vector<std::string>& revival_lines, Schedule& main_sched) {
  std::vector<Schedule> given;
  if (!r.schedule.empty()) given.push_back(schedule_from_arg(r.schedule));
  main_sched = given.empty() ? default_schedule() : given.front();
  const auto revival_model = load_revivals(r.revival_model, r.revival_share);
  std::vector<ServingMethod> methods;
  for (const std::string& name : split_list(r.prune)) {
    const PolicyKind kind = parse_policy(name);
    const Schedule sched = schedules_fitting(kind, given).front();
    const std::vector<PruneStep> steps = resolve_method(kind, sched, c.n_layer, c.global_layers());
    std::string label = name;
    if (kind != PolicyKind::None && sched.to_string() != main_sched.to_string())
      label += " " + sched.to_string();
    trace::Revivals revivals;
    if (kind != PolicyKind::None) {
      const RevivalChoice rv = choose_revivals(revival_model, r.revival_share, name, c.n_layer, steps, true);
      revivals = rv.share;
      revival_lines.push_back(name + ": " + rv.description);
    }
    methods.push_back(serving_method({kind, sched}, c, std::move(revivals), label));
  }
  if (methods.empty()) usage_fail("--prune names no method");
  return methods;
}

json workload_json(const ServingStudyRequest& r, const LengthDist& prompt, const LengthDist& output) {
  return {{"arrivals", r.cv == 1 ? "poisson" : fmt::format("gamma, cv {}", r.cv)},
          {"requests", r.requests},
          {"prompt_tokens", prompt.describe()},
          {"output_tokens", output.describe()},
          {"seed", r.seed},
          {"concurrency", r.concurrency ? json(*r.concurrency) : json(nullptr)}};
}

// capacity: per hardware and method the highest rate meeting the objectives.
void capacity_runs(const ServingStudyRequest& r, const ModelConfig& c, const std::vector<hw::Profile>& hws,
                   const std::vector<ServingMethod>& methods, const std::vector<ServingConfig>& cfgs,
                   ServingStudyReport& out) {
  const auto prompt = LengthDist::parse(r.prompt_tokens, "--prompt-tokens", "prompt_tokens");
  const auto output = LengthDist::parse(r.output_tokens, "--output-tokens", "output_tokens");
  out.workload = workload_json(r, prompt, output);
  out.workload["seeds"] = r.seeds;
  CapacityOptions co;
  co.objectives = out.slo;
  co.tolerance = r.tolerance;
  co.seeds = r.seeds;
  co.requests = r.requests;
  co.seed = r.seed;
  for (size_t h = 0; h < hws.size(); ++h)
    for (const ServingMethod& m : methods)
      out.capacities.push_back(
          {hws[h].name, m.name,
           find_capacity(c, hws[h], r.precision, m, cfgs[h], {1.0, r.cv}, prompt, output, co)});
}

// The requests to simulate: the arrival file's, or the drawn workload at each rate (0: a file).
std::vector<std::pair<double, std::vector<ServingRequest>>> request_runs(const ServingStudyRequest& r,
                                                                         json& workload) {
  std::vector<std::pair<double, std::vector<ServingRequest>>> runs;
  if (!r.arrival_file.empty()) {
    runs.emplace_back(0.0, read_requests(r.arrival_file));
    workload = {{"arrival_file", r.arrival_file}, {"requests", runs.back().second.size()}};
    return runs;
  }
  const auto prompt = LengthDist::parse(r.prompt_tokens, "--prompt-tokens", "prompt_tokens");
  const auto output = LengthDist::parse(r.output_tokens, "--output-tokens", "output_tokens");
  auto unit = make_workload(r.requests, {1.0, r.cv}, prompt, output, r.seed);
  if (!r.shared_prefix.empty()) {
    const auto [tokens, groups] = parse_shared_prefix(r.shared_prefix, "--shared-prefix");
    share_prefixes(unit, tokens, groups);
  }
  const std::vector<double> rates =
      r.rates.empty() ? std::vector<double>{r.concurrency ? HUGE_VAL : 1.0} : r.rates;
  for (const double v : rates) runs.emplace_back(v, at_rate(unit, v));
  workload = workload_json(r, prompt, output);
  if (!r.shared_prefix.empty()) workload["shared_prefix"] = r.shared_prefix;
  return runs;
}

// Every hardware x method x rate simulated.
void simulated_runs(const ServingStudyRequest& r, const ModelConfig& c, const std::vector<hw::Profile>& hws,
                    const std::vector<ServingMethod>& methods, const std::vector<ServingConfig>& cfgs,
                    const std::optional<Deployment>& deployment, ServingStudyReport& out) {
  const auto runs = request_runs(r, out.workload);
  // Every run is of the same workload, so one check before any of them is simulated.
  if (!runs.empty() && r.warmup + r.cooldown >= int64_t(runs.front().second.size()))
    usage_fail("--warmup {} and --cooldown {} leave none of the {} requests to measure", r.warmup, r.cooldown,
               runs.front().second.size());
  for (size_t h = 0; h < hws.size(); ++h)
    for (const ServingMethod& m : methods)
      for (const auto& [rate, reqs] : runs) {
        const ServingConfig& cfg = cfgs[h];
        ServingRun run = deployment ? simulate_deployment(c, r.precision, m, *deployment, reqs)
                                    : simulate_serving(c, hws[h], r.precision, m, cfg, reqs);
        // warmup and cooldown as shares of the requests this run holds (a pipeline's or
        // data-parallel group's share: the same share of its own).
        const size_t held = run.requests.size();
        const double sent = double(reqs.size());  // (a structured binding: clang 14 cannot capture it)
        const auto held_share = [held, sent](int64_t n) {
          return static_cast<size_t>(std::llround(double(n) * double(held) / sent));
        };
        ServingRunResult res;
        res.hw = hws[h].name;
        res.method = m.name;
        res.rate = rate;
        res.metrics = serving_metrics(run, out.slo, held_share(r.warmup), held - held_share(r.cooldown));
        res.iterations = run.iterations;
        if (cfg.kv_mode == hw::Scheduling::Kv::OnDemand) res.preemptions = run.preemptions;
        if (deployment) {
          double bytes = 0, transfer = 0;
          int64_t handed = 0;
          for (const RequestOutcome& o : run.requests)
            if (o.decode_replica >= 0)
              bytes += o.kv_bytes_after_prefill + o.aux_bytes, transfer += o.transfer_s, ++handed;
          res.deployment = {{"router", router_name(deployment->router)},
                            {"replicas", deployment->decode ? 0 : deployment->serve.replicas},
                            {"prefill_instances", deployment->decode ? deployment->serve.replicas : 0},
                            {"decode_instances", deployment->decode ? deployment->decode->replicas : 0}};
          if (deployment->decode)
            res.handover = {{"requests", handed},
                            {"mean_mib", handed ? bytes / double(handed) / (1 << 20) : 0.0},
                            {"mean_ms", handed ? transfer / double(handed) * 1e3 : 0.0},
                            {"link_gbs", deployment->link_bytes_per_s / 1e9}};
        }
        if (cfg.prefix_cache) {
          double cached = 0, prompt = 0;
          for (const RequestOutcome& o : run.requests)
            cached += double(o.cached_tokens), prompt += double(o.prompt_tokens);
          res.prompt_tokens_cached_share = prompt > 0 ? cached / prompt : 0.0;
        }
        res.kv = std::move(run.kv);
        if (r.keep_requests) res.requests = std::move(run.requests);
        out.runs.push_back(std::move(res));
      }
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

// The request's ranges (the CLI leaves them to this) and the options that exclude or need others.
void check_request(const ServingStudyRequest& r) {
  if (r.hws.empty()) usage_fail("--hw names no hardware profile");
  if (r.revival_share != -1) check_range("--revival-share", r.revival_share, 0.0, 1.0);
  check_range("--cv", r.cv, 0.01, 100.0);
  check_range("--requests", r.requests, int64_t(1), int64_t(1) << 24);
  check_range("--warmup", r.warmup, int64_t(0), int64_t(1) << 24);
  check_range("--cooldown", r.cooldown, int64_t(0), int64_t(1) << 24);
  if (r.concurrency) check_range("--concurrency", *r.concurrency, int64_t(1), int64_t(1) << 24);
  check_range("--kv-budget-mib", r.kv_budget_mib, 1.0, double(int64_t(1) << 30));
  if (r.kv_element_bytes != 0) check_range("--kv-element-bytes", r.kv_element_bytes, 0.5, 8.0);
  check_range("--tp", r.tp, 1, 4096);
  check_range("--pp", r.pp, 1, 4096);
  check_positive("--pp-link-gbs", r.pp_link_gbs);
  if (r.slo_ttft_ms != 0) check_range("--slo-ttft-p90-ms", r.slo_ttft_ms, 1e-3, 1e9);
  if (r.slo_itl_ms != 0) check_range("--slo-itl-p90-ms", r.slo_itl_ms, 1e-3, 1e9);
  check_range("--seeds", r.seeds, 1, 64);
  check_range("--tolerance", r.tolerance, 1e-4, 0.5);
  check_range("--prefix-block-tokens", r.prefix_block_tokens, int64_t(1), int64_t(4096));
  check_range("--replicas", r.replicas, 1, 4096);
  if (r.kv_link_gbs != 0) check_range("--kv-link-gbs", r.kv_link_gbs, 1e-3, 1e6);
  if (r.kv_link_us != -1) check_range("--kv-link-us", r.kv_link_us, 0.0, 1e7);
  for (const double v : r.rates)
    if (!(v > 0)) usage_fail("--rate: {} is not a positive number of requests/s (or inf)", v);
  if (!r.arrival_file.empty()) {
    if (!r.rates.empty()) usage_fail("--rate and --arrival-file exclude each other");
    if (!r.shared_prefix.empty()) usage_fail("--shared-prefix and --arrival-file exclude each other");
  }
  if (r.capacity && !r.shared_prefix.empty()) usage_fail("--shared-prefix and --capacity exclude each other");
  if (r.disaggregate.empty() && (r.prefill_hw || r.kv_link_gbs != 0 || r.kv_link_us != -1))
    usage_fail("--prefill-hw, --kv-link-gbs and --kv-link-us need --disaggregate");
  if (!r.disaggregate.empty() && r.replicas > 1)
    usage_fail("--disaggregate and --replicas exclude each other");
}

}  // namespace

ServingConfig scheduler_config(const SchedulerOverrides& o, const hw::Profile& hw) {
  if (o.max_batch_tokens)
    check_range("--max-batch-tokens", *o.max_batch_tokens, int64_t(1), int64_t(1) << 24);
  if (o.max_seqs) check_range("--max-seqs", *o.max_seqs, int64_t(0), int64_t(1) << 24);
  if (o.kv_block_tokens) check_range("--kv-block-tokens", *o.kv_block_tokens, int64_t(1), int64_t(1) << 20);
  if (o.chunk_tokens) check_range("--chunk-tokens", *o.chunk_tokens, int64_t(0), int64_t(1) << 24);
  if (o.iteration_overhead_ms) check_range("--iteration-overhead-ms", *o.iteration_overhead_ms, 0.0, 1e4);
  if (o.request_overhead_ms) check_range("--request-overhead-ms", *o.request_overhead_ms, 0.0, 1e4);
  if (!o.kv_mode.empty() && o.kv_mode != "reserve" && o.kv_mode != "on-demand")
    usage_fail("--kv-mode must be reserve or on-demand, got '{}'", escape_text(o.kv_mode));
  ServingConfig cfg = serving_config(hw::scheduling_for(hw));
  if (o.max_batch_tokens) cfg.max_batch_tokens = *o.max_batch_tokens;
  if (o.max_seqs) cfg.max_seqs = *o.max_seqs;
  if (o.chunk_tokens) cfg.chunk_tokens = *o.chunk_tokens;
  // vLLM's chunks are what is left of the iteration's budget: a budget given is its chunk too.
  if (o.max_batch_tokens && !o.chunk_tokens && cfg.chunk_tokens > 0) cfg.chunk_tokens = *o.max_batch_tokens;
  if (o.kv_block_tokens) cfg.kv_block = *o.kv_block_tokens;
  if (!o.kv_mode.empty())
    cfg.kv_mode = o.kv_mode == "reserve" ? hw::Scheduling::Kv::Reserve : hw::Scheduling::Kv::OnDemand;
  if (o.mixed) cfg.mixed = *o.mixed;
  if (o.iteration_overhead_ms) cfg.iteration_overhead_s = *o.iteration_overhead_ms * 1e-3;
  if (o.request_overhead_ms) cfg.request_overhead_s = *o.request_overhead_ms * 1e-3;
  return cfg;
}

nlohmann::ordered_json scheduler_json(const hw::Profile& hw, const ServingConfig& cfg) {
  return {{"engine", hw.engine.name},
          {"max_batch_tokens", cfg.max_batch_tokens},
          {"max_seqs", cfg.max_seqs},
          {"kv_element_bytes", cfg.kv_element_bytes},
          {"kv_mode", cfg.kv_mode == hw::Scheduling::Kv::Reserve ? "reserve" : "on-demand"},
          {"kv_block_tokens", cfg.kv_block},
          {"chunk_tokens", cfg.chunk_tokens},
          {"mixed", cfg.mixed},
          {"iteration_overhead_ms", cfg.iteration_overhead_s * 1e3},
          {"request_overhead_ms", cfg.request_overhead_s * 1e3},
          {"admit_layer_ms", cfg.admit_layer_s * 1e3},
          {"kernel_scale", cfg.time_scale},
          {"concurrency", cfg.clients},
          {"tp", cfg.tp}};
}

json ServingRunResult::to_json() const {
  json j = {{"hw", hw}, {"method", method}};
  j["rate_per_s"] = std::isinf(rate) ? json("inf") : rate > 0 ? json(rate) : json(nullptr);
  if (preemptions) j["preemptions"] = *preemptions;
  j["metrics"] = serving_metrics_json(metrics);
  j["iterations"] = iterations;
  if (!deployment.is_null()) j["deployment"] = deployment;
  if (!handover.is_null()) j["handover"] = handover;
  if (prompt_tokens_cached_share) j["prompt_tokens_cached_share"] = *prompt_tokens_cached_share;
  json points = json::array();
  for (const KvPoint& p : kv) points.push_back({p.t_s, p.reserved / (1 << 20), p.used / (1 << 20)});
  j["kv_mib_over_time"] = {{"columns", {"t_s", "reserved", "used"}}, {"points", std::move(points)}};
  return j;
}

json CapacityRun::to_json() const {
  const CapacityResult& r = result;
  json j = {{"hw", hw},
            {"method", method},
            {"met", r.met},
            {"rate_per_s", r.rate},
            {"rate_min_per_s", r.rate_min},
            {"rate_max_per_s", r.rate_max},
            {"resolution", r.bracket},
            {"simulations", r.simulations}};
  if (r.met)
    j["at_rate"] = serving_metrics_json(r.at_rate);
  else
    j["best_at_lowest_rate"] = serving_metrics_json(r.best);
  return j;
}

json ServingStudyReport::to_json() const {
  json out;
  out["tool"] = "lazyprefill simulate-serving";
  out["model"] = model;
  out["scheduler"] = scheduler;
  if (!schedulers.is_null()) out["schedulers"] = schedulers;
  out["schedule"] = schedule;
  out["revivals"] = revivals;
  if (!objectives.is_null()) out["objectives"] = objectives;
  out["workload"] = workload;
  if (capacity) {
    json caps = json::array();
    for (const CapacityRun& c : capacities) caps.push_back(c.to_json());
    out["capacity"] = std::move(caps);
  } else {
    json results = json::array();
    for (const ServingRunResult& r : runs) results.push_back(r.to_json());
    out["results"] = std::move(results);
  }
  return out;
}

std::string simulated_request_log(const ServingRunResult& run) {
  std::string out;
  uint64_t id = 0;
  for (const RequestOutcome& o : run.requests) {
    RequestLogLine l;
    l.id = ++id;
    l.arrival_s = o.arrival_s, l.admitted_s = o.admitted_s, l.first_token_s = o.first_token_s,
    l.finished_s = o.finished_s;
    l.prompt_tokens = o.prompt_tokens, l.output_tokens = o.output_tokens;
    l.prune = run.method;
    l.prompt_tokens_computed_fraction = o.prompt_tokens_computed_fraction;
    l.cached_tokens = o.cached_tokens;
    l.simulated = true;
    out += request_log_line(l);
  }
  return out;
}

ServingStudyReport serving_study(const ServingStudyRequest& r) {
  check_request(r);
  ServingStudyReport out;
  const ModelConfig c = expert_parallel(request_target(r.model, r.model_config, r.config, &out.model), r.ep,
                                        r.moe_imbalance, r.dp, r.tp);
  Precision prec = r.precision;
  validate(prec);
  const std::vector<hw::Profile>& hws = r.hws;
  for (const hw::Profile& hw : hws) for_option("--tp", [&] { check_tp(c, hw, r.tp); });
  Schedule main_sched;
  const std::vector<ServingMethod> methods = serving_methods(r, c, out.revivals, main_sched);

  // Each profile's engine schedules (hw::scheduling_for), what the options give overriding it.
  const auto config_for = [&](const hw::Profile& hw) {
    ServingConfig cfg = scheduler_config(r.sched, hw);
    cfg.clients = r.concurrency.value_or(0);
    cfg.kv_budget_bytes = r.kv_budget_mib * double(1 << 20);
    cfg.kv_element_bytes = r.kv_element_bytes > 0 ? r.kv_element_bytes : dtype_bytes(prec.kv, "--kv");
    cfg.prefix_cache = r.prefix_cache;
    cfg.prefix_block_tokens = r.prefix_block_tokens;
    cfg.tp = r.tp;
    cfg.pipeline = {r.pp, r.pp_link_gbs * 1e9};
    return cfg;
  };
  std::vector<ServingConfig> cfgs;
  for (const hw::Profile& hw : hws) cfgs.push_back(config_for(hw));
  std::optional<Deployment> deployment;
  if (r.replicas > 1 || !r.disaggregate.empty()) {
    if (hws.size() != 1) usage_fail("--replicas and --disaggregate take one --hw");
    if (r.capacity) usage_fail("--capacity searches one engine's rates; drop --replicas and --disaggregate");
    // Data-parallel attention is one engine's inner split, which the router cannot see; pipeline
    // stages run as virtual engines it routes to (sim/deployment.h).
    if (r.dp > 1) usage_fail("--replicas and --disaggregate take engines without --dp");
    Deployment d;
    d.router = parse_router(r.router);
    if (r.disaggregate.empty()) {
      d.serve = {hws[0], cfgs[0], r.replicas};
    } else {
      const auto [P, D] = parse_instances(r.disaggregate);
      const hw::Profile pre = r.prefill_hw ? *r.prefill_hw : hws[0];
      for_option("--tp", [&] { check_tp(c, pre, r.tp); });
      d.serve = {pre, config_for(pre), P};
      d.decode = Pool{hws[0], cfgs[0], D};
      d.link_bytes_per_s = r.kv_link_gbs > 0 ? r.kv_link_gbs * 1e9 : pre.scale_out_bandwidth * double(r.tp);
      d.link_latency_s = r.kv_link_us >= 0 ? r.kv_link_us * 1e-6 : pre.scale_out_latency;
      if (!(d.link_bytes_per_s > 0))
        usage_fail("--disaggregate: {} has no scale-out network; give --kv-link-gbs", pre.name);
    }
    deployment = d;
  }
  pipeline_starts(c.n_layer, r.pp);
  out.slo = {r.slo_ttft_ms * 1e-3, r.slo_itl_ms * 1e-3};
  if (r.capacity && !out.slo.any()) usage_fail("--capacity needs --slo-ttft-p90-ms and/or --slo-itl-p90-ms");
  if (r.capacity && (r.warmup > 0 || r.cooldown > 0))
    usage_fail("--warmup and --cooldown measure simulated runs; --capacity counts every request");
  if (r.capacity && !r.arrival_file.empty())
    usage_fail("--capacity draws its own arrivals; drop --arrival-file");
  if (r.capacity && r.concurrency)
    usage_fail("--capacity searches open-loop arrival rates; drop --concurrency");

  // The first profile's scheduler; "schedulers" gives every profile's where they differ.
  const auto layout = [&](json j) {
    j["kv_budget_mib"] = r.kv_budget_mib, j["dp"] = c.dp, j["ep"] = c.ep, j["pp"] = r.pp;
    return j;
  };
  out.scheduler = layout(scheduler_json(hws.front(), cfgs.front()));
  if (hws.size() > 1) {
    json all = json::object();
    for (size_t h = 0; h < hws.size(); ++h) all[hws[h].name] = layout(scheduler_json(hws[h], cfgs[h]));
    out.schedulers = std::move(all);
  }
  out.schedule = main_sched.to_string();
  if (out.slo.any())
    out.objectives = {{"ttft_p90_ms", r.slo_ttft_ms > 0 ? json(r.slo_ttft_ms) : json(nullptr)},
                      {"itl_p90_ms", r.slo_itl_ms > 0 ? json(r.slo_itl_ms) : json(nullptr)}};
  out.capacity = r.capacity;
  if (r.capacity)
    capacity_runs(r, c, hws, methods, cfgs, out);
  else
    simulated_runs(r, c, hws, methods, cfgs, deployment, out);
  return out;
}

}  // namespace lp::sim
