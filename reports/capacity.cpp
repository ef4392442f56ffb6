#include "reports/capacity.h"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>

#include "model/error.h"
#include "reports/plot.h"
#include "sim/replay.h"
#include "sim/serving_capacity.h"
#include "traces/synthetic.h"

namespace lp::report {

namespace {
using json = nlohmann::ordered_json;

// One method's prediction at prompt length N, its steps streamed (memory O(layers), whatever the
// decoding steps); the per-layer detail, which the report does not print, is dropped.
sim::Prediction method_prediction(const Request& r, const ReportedMethod& m, const hw::Profile& hw, int64_t N,
                                  int64_t new_tokens) {
  sim::Prediction p;
  if (m.trace) {
    const trace::Header h = sim::map_header(m.trace->header, r.model.n_layer, N);
    sim::Replayer rp(h, r.model, hw, r.precision, r.batch, r.tp, 0);
    if (r.pipeline.stages > 1) rp.set_pipeline(r.pipeline);
    for (const trace::Step& s : m.trace->steps) rp.add(sim::map_step(m.trace->header, s, r.model.n_layer, N));
    p = std::move(rp).finish();
  } else {
    p = sim::replay_synthetic(r.model, m.method.policy_name(), m.steps, N,
                              std::max<int64_t>(0, new_tokens - 1), m.revival, hw, r.precision, r.batch, r.tp,
                              0, drop_share(m.method.schedule).value_or(0), r.pipeline);
  }
  p.prefill_layers = {};
  return p;
}

// The memory a deployment may use on one device: the user's budget, never more than the device.
double budget_bytes(const Request& r, const hw::Profile& hw) {
  return r.mem_budget_gib ? std::min(*r.mem_budget_gib * 1073741824.0, hw.memory_capacity)
                          : hw.memory_capacity;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Op groups for the breakdown chart.
const std::vector<std::pair<std::string, std::vector<Op>>>& op_groups() {
  static const std::vector<std::pair<std::string, std::vector<Op>>> g = {
      {"qkv", {Op::QKV}},
      {"attention", {Op::Attention}},
      {"o_proj", {Op::OProj}},
      {"gate_up", {Op::GateUp}},
      {"down", {Op::Down}},
      {"router, experts", {Op::Router, Op::Experts}},
      {"norms, rope, swiglu, residual",
       {Op::AttnNorm, Op::QKNorm, Op::FfnNorm, Op::PostNorm, Op::Rope, Op::SwiGLU, Op::Residual}},
      {"pruning (score, select, gather)", {Op::Score, Op::Select, Op::Gather}},
      {"embed, LM head", {Op::Embed, Op::OutputNorm, Op::LmHead}}};
  return g;
}
// Serving capacity per hardware x method (the methods a server runs: not a recorded trace), then
// p90 TTFT and ITL along one grid of rates per hardware: 10 rates from a quarter of the lowest
// capacity found to 1.5 times the highest.
void add_serving(const Request& r, Report& rep) {
  const ServingSpec& s = *r.serving;
  rep.serving = s;
  const auto prompt = sim::LengthDist::parse(s.prompt_tokens, "--serving-prompt-tokens", "prompt_tokens");
  const auto output = sim::LengthDist::parse(s.output_tokens, "--serving-output-tokens", "output_tokens");
  std::vector<std::pair<size_t, size_t>> cells;
  std::vector<sim::ServingMethod> methods(r.methods.size());
  for (size_t m = 0; m < r.methods.size(); ++m) {
    const ReportedMethod& rm = r.methods[m];
    if (rm.trace) continue;
    sim::ServingMethod& sm = methods[m];
    sm.name = rm.name;
    sm.method = rm.method;
    sm.steps = rm.steps;  // resolved for the report's model already
    sm.drop_share = drop_share(rm.method.schedule).value_or(0);
    sm.revivals = rm.revival;
    for (size_t h = 0; h < r.hws.size(); ++h) cells.emplace_back(h, m);
  }
  std::sort(cells.begin(), cells.end());
  rep.serving_capacity.resize(cells.size());
  const auto config = [&](size_t h) {
    sim::ServingConfig cfg;
    cfg.max_batch_tokens = s.max_batch_tokens;
    cfg.tp = r.tp;
    cfg.pipeline = r.pipeline;
    cfg.kv_element_bytes = sim::dtype_bytes(r.precision.kv, "--kv");
    const double weights = method_prediction(r, r.methods[0], r.hws[h], 1, 0).memory.weights;
    // A GPU's K/V memory (given, or its memory less its weights) as its tensor-parallel group's
    // budget (group_kv_budget).
    cfg.kv_budget_bytes = sim::group_kv_budget(
        r.model, r.tp,
        s.kv_budget_gib ? *s.kv_budget_gib * double(1 << 30) : budget_bytes(r, r.hws[h]) - weights);
    if (!(cfg.kv_budget_bytes > 0))
      fail("{}: the weights ({:.1f} GiB) leave no memory for the K/V cache under the budget", r.hws[h].name,
           weights / double(1 << 30));
    return cfg;
  };
  sim::CapacityOptions co;
  co.objectives = s.objectives;
  co.requests = s.requests;
  co.seeds = s.seeds;
  co.tolerance = s.tolerance;
  tbb::parallel_for(size_t(0), cells.size(), [&](size_t k) {
    const auto [h, m] = cells[k];
    const sim::ServingConfig cfg = config(h);
    const sim::CapacityResult c =
        sim::find_capacity(r.model, r.hws[h], r.precision, methods[m], cfg, {1, 1}, prompt, output, co);
    ServingCapacity& x = rep.serving_capacity[k];
    x.hw = h, x.method = m, x.met = c.met, x.kv_budget_bytes = cfg.kv_budget_bytes;
    x.rate = c.rate, x.rate_min = c.rate_min, x.rate_max = c.rate_max, x.resolution = c.bracket;
    const sim::ServingMetrics& at = c.met ? c.at_rate : c.best;
    x.ttft_p90_ms = at.ttft.p90 * 1e3, x.itl_p90_ms = at.itl.p90 * 1e3;
  });
  const auto unit = sim::make_workload(s.requests, {1, 1}, prompt, output, 0);
  for (size_t h = 0; h < r.hws.size(); ++h) {
    double lo = 0, hi = 0;
    for (const ServingCapacity& x : rep.serving_capacity)
      if (x.hw == h && x.met) lo = lo > 0 ? std::min(lo, x.rate) : x.rate, hi = std::max(hi, x.rate);
    if (hi <= 0) lo = hi = co.rate_lo * 4;
    const double a = lo / 4, b = hi * 1.5;
    std::vector<double> grid;
    for (int i = 0; i < 10; ++i) grid.push_back(a * std::pow(b / a, i / 9.0));
    std::vector<size_t> mine;
    for (size_t k = 0; k < rep.serving_capacity.size(); ++k)
      if (rep.serving_capacity[k].hw == h) mine.push_back(k);
    for (size_t k : mine) {
      ServingCapacity& x = rep.serving_capacity[k];
      x.curve_rate = grid;
      x.curve_ttft_p90_ms.assign(grid.size(), 0);
      x.curve_itl_p90_ms.assign(grid.size(), 0);
    }
    const sim::ServingConfig cfg = config(h);
    tbb::parallel_for(size_t(0), mine.size() * grid.size(), [&](size_t i) {
      ServingCapacity& x = rep.serving_capacity[mine[i / grid.size()]];
      const size_t g = i % grid.size();
      const sim::ServingMetrics mm =
          sim::serving_metrics(sim::simulate_serving(r.model, r.hws[h], r.precision, methods[x.method], cfg,
                                                     sim::at_rate(unit, grid[g])),
                               s.objectives);
      x.curve_ttft_p90_ms[g] = mm.ttft.p90 * 1e3;
      x.curve_itl_p90_ms[g] = mm.itl.p90 * 1e3;
    });
  }
}

}  // namespace

std::vector<ReportedMethod> methods_to_report(const ModelConfig& c, const std::vector<std::string>& policies,
                                              const std::vector<Schedule>& given,
                                              const trace::Trace* recorded) {
  const auto wants = [&](const char* p) {
    return std::find(policies.begin(), policies.end(), p) != policies.end();
  };
  const auto method = [](std::string name, Method pm, std::vector<PruneStep> steps = {},
                         const trace::Trace* t = nullptr) {
    ReportedMethod m;  // field by field: the revival fields keep their defaults
    m.name = std::move(name);
    m.method = std::move(pm);
    m.steps = std::move(steps);
    m.trace = t;
    return m;
  };
  std::vector<ReportedMethod> out = {method("none", Method{})};
  std::vector<Schedule> scheds;
  if (recorded) {
    const std::string name = fmt::format("trace {} {}", recorded->header.policy, recorded->header.schedule);
    const Schedule recorded_schedule =
        recorded->header.schedule == "none" ? Schedule{} : parse_schedule(recorded->header.schedule);
    out.push_back(method(name, {parse_policy(recorded->header.policy), recorded_schedule}, {}, recorded));
    scheds.push_back(recorded_schedule);
  }
  const std::vector<Schedule> lazy =
      schedules_fitting(PolicyKind::LazyLLM, given,
                        recorded ? std::vector<Schedule>{} : std::vector<Schedule>{default_schedule()});
  if (wants("lazyllm"))
    for (const Schedule& s : lazy)
      out.push_back(method("lazyllm " + s.to_string(), {PolicyKind::LazyLLM, s},
                           resolve_schedule(s, c.n_layer, c.global_layers())));
  scheds.insert(scheds.end(), lazy.begin(), lazy.end());
  for (const PolicyKind k : {PolicyKind::Frozen, PolicyKind::RandomLayers})
    if (wants(policy_name(k)) && !scheds.empty() && !scheds.front().steps.empty() &&
        method_problem(k, scheds.front()).empty())
      out.push_back(method(fmt::format("{} {}", policy_name(k), scheds.front().to_string()),
                           {k, scheds.front()},
                           resolve_schedule(scheds.front(), c.n_layer, c.global_layers())));
  for (const PolicyKind k : {PolicyKind::StaticPaper, PolicyKind::RandomDrop})
    if (wants(policy_name(k)))
      for (const Schedule& s : schedules_fitting(k, given))
        out.push_back(method(fmt::format("{} {}", policy_name(k), s.to_string()), {k, s},
                             resolve_method(k, s, c.n_layer, c.global_layers())));
  return out;
}

Report build_report(const Request& r) {
  if (r.hws.empty()) fail("report: no hardware profile");
  if (r.methods.empty() || r.methods[0].method.policy != PolicyKind::None)
    fail("report: the first method must be none");
  if (r.lengths.empty()) usage_fail("a report needs at least one prompt length");
  if (r.batch < 1) usage_fail("a report's batch must be at least 1 sequence, got {}", r.batch);
  for (int64_t N : r.lengths) {
    if (N < 1) usage_fail("prompt length {} is not positive", N);
    if (r.model.n_ctx_train > 0 && N + std::max<int64_t>(0, r.new_tokens - 1) > r.model.n_ctx_train)
      usage_fail("prompt length {} (+ {} new tokens) exceeds the model's context of {} tokens", N,
                 r.new_tokens, r.model.n_ctx_train);
  }
  if (r.slo_ttft_ms && !(*r.slo_ttft_ms > 0)) usage_fail("the TTFT objective must be positive");
  if (r.mem_budget_gib && !(*r.mem_budget_gib > 0)) usage_fail("the memory budget must be positive");

  const size_t H = r.hws.size(), M = r.methods.size(), NL = r.lengths.size();
  // A report is read by people: its table has a column per length. Bounded before anything is
  // allocated (a sweep streams grids of any size).
  if (NL > kMaxLengths)
    usage_fail("{} prompt lengths, over the {} a report shows (use sweep for more)", NL, kMaxLengths);
  if (H * M * NL > kMaxCells)
    usage_fail(
        "{} hardware profiles x {} methods x {} lengths is {} results, over the {} a report holds (use "
        "sweep for more)",
        H, M, NL, H * M * NL, kMaxCells);

  Report rep;
  Provenance& prov = rep.provenance;
  prov.tool_version = r.tool_version;
  prov.git_commit = r.git_commit;
  prov.generated_utc = utc_now();
  prov.model = r.model;
  prov.model_source = r.model_source;
  for (const hw::Profile& p : r.hws)
    prov.hardware.push_back({p.name, p.description, p.engine.name, p.efficiency_default,
                             p.sources.count("efficiency") ? p.sources.at("efficiency") : "",
                             p.sources.count("peak_tflops") ? p.sources.at("peak_tflops") : ""});
  if (!r.trace_origin.empty()) prov.trace = r.trace_origin;
  for (const ReportedMethod& m : r.methods) {
    Provenance::MethodLine line{m.name, m.method, m.revivals, {}};
    if (line.pruned() && !r.eval.is_null())
      line.accuracy = accuracy_evidence(r.eval, m.method.policy_name(), m.method.schedule_text());
    prov.methods.push_back(std::move(line));
  }
  prov.precision = r.precision;
  prov.batch = r.batch;
  prov.tp = r.tp, prov.dp = r.model.dp, prov.ep = r.model.ep, prov.pp = r.pipeline.stages;
  prov.new_tokens = r.new_tokens;
  prov.slo_ttft_ms = r.slo_ttft_ms;
  prov.mem_budget_gib = r.mem_budget_gib;
  rep.prompt_lengths = r.lengths;

  std::vector<sim::Prediction> cells(H * M * NL);
  tbb::parallel_for(size_t(0), cells.size(), [&](size_t k) {
    const size_t h = k / (M * NL), m = (k / NL) % M, n = k % NL;
    cells[k] = method_prediction(r, r.methods[m], r.hws[h], r.lengths[n], r.new_tokens);
  });
  rep.results.resize(cells.size());
  for (size_t k = 0; k < cells.size(); ++k) {
    const size_t h = k / (M * NL), m = (k / NL) % M, n = k % NL;
    const sim::Prediction& p = cells[k];
    const sim::Prediction& b = cells[h * M * NL + n];  // none, same hardware and length
    const double budget = budget_bytes(r, r.hws[h]);
    const double per_seq = (p.memory.kv + p.memory.aux) / double(r.batch);
    const double free = budget - p.memory.weights - p.memory.activations;
    Result& x = rep.results[k];
    x.hw = h;
    x.method = m;
    x.prompt_tokens = r.lengths[n];
    x.ttft_ms = p.ttft_s * 1e3;
    x.baseline_ttft_ms = b.ttft_s * 1e3;
    x.speedup = b.ttft_s / p.ttft_s;
    x.prompt_tokens_computed_fraction = p.prompt_tokens_computed_fraction;
    x.prefill_flop = p.prefill_flops();
    for (const sim::OpCost& o : p.prefill_ops) x.prefill_bytes += o.bytes;
    x.decode_step_mean_ms = p.decode_step_mean_s() * 1e3;
    x.total_ms = p.total_s * 1e3;
    x.memory = p.memory;
    x.fits_in_memory = p.memory.total() <= budget;
    // Capped where a double still counts exactly (a 1 PiB device of 1-byte sequences fits 2^50:
    // never reached by a real profile, but a cast past int64_t would be undefined).
    x.concurrent_sequences =
        per_seq > 0 && free > 0 ? int64_t(std::min(std::floor(free / per_seq), 9007199254740992.0)) : 0;
    x.bound_op = p.prefill_bound_op();
    x.ops = p.prefill_ops;
  }

  // Per hardware and method: the longest prompt within the TTFT objective (bisection on the
  // prefill, which grows with the prompt) and the sequences that fit at the longest length.
  const int64_t ctx =
      r.model.n_ctx_train > 0 ? r.model.n_ctx_train : *std::max_element(r.lengths.begin(), r.lengths.end());
  const size_t nmax = size_t(std::max_element(r.lengths.begin(), r.lengths.end()) - r.lengths.begin());
  rep.capacity.resize(H * M);
  tbb::parallel_for(size_t(0), H * M, [&](size_t k) {
    const size_t h = k / M, m = k % M;
    const auto ttft_ms = [&](int64_t N) {
      return method_prediction(r, r.methods[m], r.hws[h], N, 0).ttft_s * 1e3;
    };
    Capacity& c = rep.capacity[k];
    c.hw = h;
    c.method = m;
    if (r.slo_ttft_ms) {
      const double slo = *r.slo_ttft_ms;
      if (ttft_ms(1) > slo) {
        c.slo_note =
            fmt::format("no prompt length meets {} ms (a 1-token prompt takes {:.3g} ms)", slo, ttft_ms(1));
      } else if (ttft_ms(ctx) <= slo) {
        c.max_prompt_tokens_within_slo = ctx;
        c.slo_note = fmt::format("the whole context ({} tokens) meets {} ms", ctx, slo);
      } else {
        int64_t lo = 1, hi = ctx;  // ttft(lo) <= slo < ttft(hi)
        while (hi - lo > 1) {
          const int64_t mid = lo + (hi - lo) / 2;
          (ttft_ms(mid) <= slo ? lo : hi) = mid;
        }
        c.max_prompt_tokens_within_slo = lo;
        c.slo_note = fmt::format("prompts up to {} tokens meet {} ms", lo, slo);
      }
    }
    c.longest_prompt_tokens = r.lengths[nmax];
    c.concurrent_sequences_at_longest = rep.result(h, m, nmax).concurrent_sequences;
    c.memory_budget_bytes = budget_bytes(r, r.hws[h]);
  });
  if (r.serving) add_serving(r, rep);
  return rep;
}

json Report::to_json() const {
  const Provenance& p = provenance;
  const auto bound = [](const sim::OpCost& o) { return o.memory_bound() ? "memory" : "compute"; };
  json results_json = json::array();
  for (const Result& x : results) {
    json ops = json::object();
    for (int i = 0; i < kNumOps; ++i) {
      const sim::OpCost& o = x.ops[size_t(i)];
      if (o.calls == 0) continue;
      ops[std::string(op_name(Op(i)))] = {
          {"time_ms", o.time_s * 1e3}, {"flop", o.flops}, {"bytes", o.bytes}, {"bound", bound(o)}};
    }
    results_json.push_back({{"hw", p.hardware[x.hw].name},
                            {"method", p.methods[x.method].name},
                            {"prompt_tokens", x.prompt_tokens},
                            {"ttft_ms", x.ttft_ms},
                            {"baseline_ttft_ms", x.baseline_ttft_ms},
                            {"speedup", x.speedup},
                            {"prompt_tokens_computed_fraction", x.prompt_tokens_computed_fraction},
                            {"prefill_flop", x.prefill_flop},
                            {"prefill_bytes", x.prefill_bytes},
                            {"decode_step_mean_ms", x.decode_step_mean_ms},
                            {"total_ms", x.total_ms},
                            {"memory_bytes", x.memory.to_json()},
                            {"fits_in_memory", x.fits_in_memory},
                            {"concurrent_sequences", x.concurrent_sequences},
                            {"bound_op", std::string(op_name(x.bound_op))},
                            {"bound", bound(x.ops[size_t(x.bound_op)])},
                            {"ops", ops}});
  }
  json capacity_json = json::array();
  for (const Capacity& c : capacity) {
    json j = {{"hw", p.hardware[c.hw].name}, {"method", p.methods[c.method].name}};
    if (p.slo_ttft_ms) {
      j["max_prompt_tokens_within_slo"] =
          c.max_prompt_tokens_within_slo ? json(*c.max_prompt_tokens_within_slo) : json(nullptr);
      j["slo_note"] = c.slo_note;
    }
    j["longest_prompt_tokens"] = c.longest_prompt_tokens;
    j["concurrent_sequences_at_longest"] = c.concurrent_sequences_at_longest;
    j["memory_budget_bytes"] = c.memory_budget_bytes;
    capacity_json.push_back(std::move(j));
  }
  json hws = json::array();
  for (const Provenance::HardwareLine& h : p.hardware)
    hws.push_back({{"name", h.name},
                   {"description", h.description},
                   {"engine", h.engine},
                   {"efficiency_default", h.efficiency_default},
                   {"efficiency_source", h.efficiency_source},
                   {"peak_source", h.peak_source}});
  json methods = json::array();
  for (const Provenance::MethodLine& m : p.methods) {
    json line = {{"name", m.name},
                 {"policy", m.method.policy_name()},
                 {"schedule", m.method.schedule_text()},
                 {"revivals", m.revivals}};
    if (m.pruned()) line["accuracy"] = json(accuracy_json(m.accuracy));
    methods.push_back(std::move(line));
  }
  const auto or_null = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  json prov = {
      {"tool_version", p.tool_version},
      {"git_commit", p.git_commit},
      {"generated_utc", p.generated_utc},
      {"model", {{"name", p.model.name}, {"source", p.model_source}, {"config", config_to_json(p.model)}}},
      {"hardware", hws},
      {"trace", or_null(p.trace)},
      {"methods", methods},
      {"precision",
       [&] {
         json j = {
             {"weights", p.precision.weights}, {"compute", p.precision.compute}, {"kv", p.precision.kv}};
         if (!p.precision.expert_weights.empty()) j["expert_weights"] = p.precision.expert_weights;
         return j;
       }()},
      {"batch", p.batch},
      {"parallelism", {{"tp", p.tp}, {"dp", p.dp}, {"ep", p.ep}, {"pp", p.pp}}},
      {"new_tokens", p.new_tokens},
      {"slo_ttft_ms", or_null(p.slo_ttft_ms)},
      {"mem_budget_gib", or_null(p.mem_budget_gib)}};
  json serving_json = nullptr;
  if (serving) {
    const ServingSpec& s = *serving;
    json caps = json::array();
    for (const ServingCapacity& x : serving_capacity)
      caps.push_back({{"hardware", p.hardware[x.hw].name},
                      {"method", p.methods[x.method].name},
                      {"met", x.met},
                      {"rate_per_s", x.met ? json(x.rate) : json(nullptr)},
                      {"rate_range_per_s", x.met ? json::array({x.rate_min, x.rate_max}) : json(nullptr)},
                      {"resolution", x.resolution},
                      {"ttft_p90_ms", x.ttft_p90_ms},
                      {"itl_p90_ms", x.itl_p90_ms},
                      {"kv_budget_bytes", x.kv_budget_bytes},
                      {"curve",
                       {{"rate_per_s", x.curve_rate},
                        {"ttft_p90_ms", x.curve_ttft_p90_ms},
                        {"itl_p90_ms", x.curve_itl_p90_ms}}}});
    const auto ms_or_null = [](double v) { return v > 0 ? json(v * 1e3) : json(nullptr); };
    serving_json = {{"objectives",
                     {{"ttft_p90_ms", ms_or_null(s.objectives.ttft_p90_s)},
                      {"itl_p90_ms", ms_or_null(s.objectives.itl_p90_s)}}},
                    {"arrivals", "poisson"},
                    {"prompt_tokens", s.prompt_tokens},
                    {"output_tokens", s.output_tokens},
                    {"requests", s.requests},
                    {"seeds", s.seeds},
                    {"max_batch_tokens", s.max_batch_tokens},
                    {"capacity", caps}};
  }
  return {{"lazyprefill_capacity_report", 2}, {"provenance", prov},        {"prompt_lengths", prompt_lengths},
          {"results", results_json},          {"capacity", capacity_json}, {"serving", serving_json}};
}

std::string Provenance::MethodLine::accuracy_words() const {
  return report::accuracy_words(accuracy);
}

std::string summary_text(const Report& rep) {
  const Provenance& prov = rep.provenance;
  std::string out = fmt::format("capacity report: {} ({}), batch {}, weights {} compute {} kv {}\n",
                                prov.model.name, prov.model_source, prov.batch, prov.precision.weights,
                                prov.precision.compute, prov.precision.kv);
  if (prov.new_tokens > 1)  // decoding is costed: say how revivals were modelled
    for (const Provenance::MethodLine& m : prov.methods)
      if (policy_revives(m.method.policy)) out += fmt::format("revivals ({}): {}\n", m.name, m.revivals);
  for (const Provenance::MethodLine& m : prov.methods)
    if (m.pruned()) out += fmt::format("accuracy ({}): {}\n", m.name, m.accuracy_words());
  for (size_t h = 0; h < prov.hardware.size(); ++h) {
    out += fmt::format("\n{}: TTFT in ms (speedup over none) per prompt length\n{:<40}",
                       prov.hardware[h].name, "method");
    for (int64_t n : rep.prompt_lengths) out += fmt::format(" {:>18}", n);
    out += "\n";
    for (size_t m = 0; m < prov.methods.size(); ++m) {
      if (m > 0) out += "\n";
      out += fmt::format("{:<40}", prov.methods[m].name.substr(0, 40));
      for (size_t n = 0; n < rep.prompt_lengths.size(); ++n) {
        const Result& x = rep.result(h, m, n);
        out += fmt::format(" {:>10.4g} ({:.2f}x)", x.ttft_ms, x.speedup);
      }
    }
    out += "\n";
    for (const Capacity& c : rep.capacity)
      if (c.hw == h) {
        out +=
            fmt::format("  {:<38} {} sequences fit at {} tokens", prov.methods[c.method].name.substr(0, 38),
                        c.concurrent_sequences_at_longest, c.longest_prompt_tokens);
        if (!c.slo_note.empty()) out += "; " + c.slo_note;
        out += "\n";
      }
    for (const ServingCapacity& x : rep.serving_capacity)
      if (x.hw == h)
        out += x.met ? fmt::format(
                           "  {:<38} serves {:.3g} requests/s within the serving objectives ({:.3g}-{:.3g} "
                           "over seeds; p90 TTFT {:.4g} ms, ITL {:.3g} ms)\n",
                           prov.methods[x.method].name.substr(0, 38), x.rate, x.rate_min, x.rate_max,
                           x.ttft_p90_ms, x.itl_p90_ms)
                     : fmt::format(
                           "  {:<38} meets the serving objectives at no rate (p90 TTFT {:.4g} ms, ITL "
                           "{:.3g} ms at the lowest)\n",
                           prov.methods[x.method].name.substr(0, 38), x.ttft_p90_ms, x.itl_p90_ms);
  }
  return out;
}

void check_validation(const nlohmann::json& v, const std::string& origin) {
  if (!v.is_object() || !v.contains("cases") || !v["cases"].is_array())
    fail("{}: not a `validate --json` output (no \"cases\" array)", origin);
  if (v.contains("ttft_mape") && !v["ttft_mape"].is_number())
    fail("{}: 'ttft_mape' must be a number", origin);
  size_t i = 0;
  for (const auto& k : v["cases"]) {
    ++i;
    if (!k.is_object()) fail("{}: case {} is not an object", origin, i);
    for (const char* f : {"measured_ttft_ms", "predicted_ttft_ms"})
      if (!k.contains(f) || !k[f].is_number() || !(k[f].get<double>() > 0) ||
          !std::isfinite(k[f].get<double>()))
        fail("{}: case {}: '{}' must be a positive number", origin, i, f);
    for (const char* f : {"policy", "schedule"})
      if (k.contains(f) && !k[f].is_string()) fail("{}: case {}: '{}' must be a string", origin, i, f);
  }
}

std::vector<std::pair<std::string, std::string>> report_charts(const Report& rep,
                                                               const nlohmann::json* validation) {
  std::vector<std::pair<std::string, std::string>> out;
  const Provenance& prov = rep.provenance;
  const size_t H = prov.hardware.size(), M = prov.methods.size(), NL = rep.prompt_lengths.size();
  const size_t pruned = M > 1 ? 1 : 0;  // the method the charts set against none
  const std::string& model = prov.model.name;
  // One hardware and method's results along the prompt lengths, as (x, y).
  const auto pts = [&](size_t h, size_t m, auto x_of, auto y_of) {
    std::vector<double> x, y;
    for (size_t n = 0; n < NL; ++n) {
      x.push_back(double(x_of(rep.result(h, m, n))));
      y.push_back(y_of(rep.result(h, m, n)));
    }
    return std::make_pair(x, y);
  };
  const auto tokens = [](const Result& x) { return x.prompt_tokens; };
  const auto ttft = [](const Result& x) { return x.ttft_ms; };
  std::vector<double> lengths(rep.prompt_lengths.begin(), rep.prompt_lengths.end());
  const bool wide = lengths.size() > 1 && *std::max_element(lengths.begin(), lengths.end()) >=
                                              4 * *std::min_element(lengths.begin(), lengths.end());
  {
    LineChart c;
    c.title = "Time to first token vs prompt length";
    c.subtitle = fmt::format("{}; dashed: no pruning, solid: {}", model, prov.methods[pruned].name);
    c.x = {"prompt length (tokens)", wide};
    c.x.ticks = lengths;
    c.y = {"TTFT (ms)", true};
    for (size_t h = 0; h < H; ++h) {
      const std::string& name = prov.hardware[h].name;
      auto [x0, y0] = pts(h, 0, tokens, ttft);
      c.series.push_back({name + " none", x0, y0, true, true, true, int(h)});
      if (M > 1) {
        auto [x1, y1] = pts(h, pruned, tokens, ttft);
        c.series.push_back({name + " pruned", x1, y1, true, true, false, int(h)});
      }
    }
    out.emplace_back("ttft-vs-prompt-length.svg", svg_line_chart(c));
  }
  {
    LineChart c;
    c.title = "TTFT speedup vs share of prompt (token, layer) pairs computed";
    c.subtitle = fmt::format("{}; every method and prompt length, one colour per hardware", model);
    c.x = {"share of prompt (token, layer) pairs computed", false, 0.0, 1.0};
    c.y = {"TTFT speedup over no pruning (x)", false};
    for (size_t h = 0; h < H; ++h) {
      Series s{prov.hardware[h].name, {}, {}, false, true, false, int(h)};
      for (size_t m = 1; m < M; ++m) {
        auto [x, y] = pts(
            h, m, [](const Result& r) { return r.prompt_tokens_computed_fraction; },
            [](const Result& r) { return r.speedup; });
        s.x.insert(s.x.end(), x.begin(), x.end());
        s.y.insert(s.y.end(), y.begin(), y.end());
      }
      c.series.push_back(std::move(s));
    }
    out.emplace_back("speedup-vs-share-computed.svg", svg_line_chart(c));
  }
  {
    const size_t longest = size_t(std::max_element(rep.prompt_lengths.begin(), rep.prompt_lengths.end()) -
                                  rep.prompt_lengths.begin());
    StackedBarChart c;
    c.title = fmt::format("Where the prefill time goes at {} tokens", rep.prompt_lengths[longest]);
    c.subtitle = "per op group, as a share of the unpruned TTFT on the same hardware";
    c.y = {"prefill time (% of unpruned TTFT)"};
    std::vector<const Result*> bars;
    for (size_t h = 0; h < H; ++h)
      for (size_t m : {size_t(0), pruned}) {
        bars.push_back(&rep.result(h, m, longest));
        c.categories.push_back(prov.hardware[h].name + (m == 0 ? " none" : " pruned"));
      }
    for (const auto& [name, ops] : op_groups()) {
      BarSegment seg{name, {}};
      for (const Result* b : bars) {
        double t = 0;
        for (Op op : ops)
          if (b->ops[size_t(op)].calls > 0) t += b->ops[size_t(op)].time_s * 1e3;
        seg.values.push_back(100 * t / b->baseline_ttft_ms);
      }
      // A group no bar has (the experts of a dense model) stays out of the legend.
      if (std::any_of(seg.values.begin(), seg.values.end(), [](double v) { return v > 0; }))
        c.segments.push_back(std::move(seg));
    }
    out.emplace_back("op-breakdown.svg", svg_stacked_bars(c, 860, 480));
  }
  if (!rep.serving_capacity.empty()) {
    const ServingSpec& s = *rep.serving;
    LineChart c;
    c.title = "p90 time to first token vs arrival rate (serving)";
    c.subtitle = fmt::format("{}; Poisson arrivals, prompts {}, outputs {}; dashed: no pruning", model,
                             s.prompt_tokens, s.output_tokens);
    c.x = {"arrival rate (requests/s)", true};
    c.y = {"p90 TTFT (ms)", true};
    for (const ServingCapacity& x : rep.serving_capacity)
      c.series.push_back({prov.hardware[x.hw].name + " " + prov.methods[x.method].name, x.curve_rate,
                          x.curve_ttft_p90_ms, true, true, x.method == 0, -1});
    if (s.objectives.ttft_p90_s > 0) {
      double lo = 1e300, hi = 0;
      for (const ServingCapacity& x : rep.serving_capacity)
        for (double v : x.curve_rate) lo = std::min(lo, v), hi = std::max(hi, v);
      if (hi > 0)
        c.series.push_back({"objective",
                            {lo, hi},
                            {s.objectives.ttft_p90_s * 1e3, s.objectives.ttft_p90_s * 1e3},
                            true,
                            false,
                            true,
                            -1});
    }
    out.emplace_back("serving-ttft-vs-rate.svg", svg_line_chart(c));
  }
  if (validation && validation->contains("cases")) {
    LineChart c;
    c.title = "Simulator: measured vs predicted TTFT (held-out cases)";
    c.subtitle = fmt::format("lazyprefill validate on this machine, held-out MAPE {:.1f}%",
                             validation->value("ttft_mape", 0.0));
    c.x = {"measured TTFT (ms)", true};
    c.y = {"predicted TTFT (ms)", true};
    c.diagonal = true;
    std::map<std::string, Series> by_policy;
    for (const auto& k : (*validation)["cases"]) {
      const std::string sched = k.value("schedule", std::string());
      const std::string pol = k.value("policy", std::string("case")) + (sched == "none" ? "" : " " + sched);
      Series& s = by_policy[pol];
      s.name = pol;
      s.lines = false;
      s.x.push_back(k["measured_ttft_ms"].get<double>());
      s.y.push_back(k["predicted_ttft_ms"].get<double>());
    }
    for (auto& [k, s] : by_policy) c.series.push_back(std::move(s));
    out.emplace_back("measured-vs-predicted.svg", svg_line_chart(c));
  }
  return out;
}

std::string report_html(const Report& rep, const std::vector<std::pair<std::string, std::string>>& charts,
                        const std::string& sections) {
  const Provenance& prov = rep.provenance;
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>lazyprefill capacity "
      "report</title>\n"
      "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
      "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px "
      "8px;text-align:right}"
      "th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}figure{margin:1.5em 0}"
      "code{background:#f4f4f4;padding:1px 4px}</style></head><body>\n";
  h += fmt::format("<h1>Capacity report: {}</h1>\n", xml_escape(prov.model.name));
  h += fmt::format(
      "<p>Model source <code>{}</code>; batch {}; weights {}, compute {}, KV {}; generated {} by lazyprefill "
      "{} ({}).</p>\n",
      xml_escape(prov.model_source), prov.batch, xml_escape(prov.precision.weights),
      xml_escape(prov.precision.compute), xml_escape(prov.precision.kv), xml_escape(prov.generated_utc),
      xml_escape(prov.tool_version), xml_escape(prov.git_commit));
  if (prov.trace)
    h += fmt::format(
        "<p>Pruning pattern from the recorded trace <code>{}</code>, mapped to each prompt length.</p>\n",
        xml_escape(*prov.trace));
  if (prov.new_tokens > 1)
    for (const Provenance::MethodLine& m : prov.methods)
      if (policy_revives(m.method.policy))
        h += fmt::format("<p>Revivals while decoding, {}: {}.</p>\n", xml_escape(m.name),
                         xml_escape(m.revivals));
  h += "<h2>Hardware</h2>\n<table><tr><th>profile</th><th>part</th><th>efficiencies</th></tr>\n";
  for (const Provenance::HardwareLine& x : prov.hardware)
    h += fmt::format("<tr><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>\n",
                     xml_escape(x.name), xml_escape(x.description),
                     x.efficiency_default ? "datasheet defaults" : xml_escape(x.efficiency_source));
  h += "</table>\n<h2>TTFT (ms) and speedup over no pruning</h2>\n";
  h += "<table><tr><th>hardware / method</th>";
  for (int64_t n : rep.prompt_lengths) h += fmt::format("<th>{} tokens</th>", n);
  h += "<th>accuracy</th></tr>\n";
  for (size_t hw = 0; hw < prov.hardware.size(); ++hw)
    for (size_t m = 0; m < prov.methods.size(); ++m) {
      h += fmt::format("<tr><td>{}</td>", xml_escape(prov.hardware[hw].name + " / " + prov.methods[m].name));
      for (size_t n = 0; n < rep.prompt_lengths.size(); ++n) {
        const Result& x = rep.result(hw, m, n);
        h += fmt::format("<td>{:.4g} ({:.2f}x)</td>", x.ttft_ms, x.speedup);
      }
      const Provenance::MethodLine& ml = prov.methods[m];
      h += fmt::format("<td style=\"text-align:left\">{}</td></tr>\n",
                       ml.pruned() ? xml_escape(ml.accuracy_words()) : "baseline");
    }
  h += "</table>\n<h2>Capacity</h2>\n<table><tr><th>hardware / method</th><th>longest prompt within the "
       "TTFT objective</th><th>sequences that fit at the longest length</th></tr>\n";
  for (const Capacity& c : rep.capacity)
    h += fmt::format("<tr><td>{} / {}</td><td>{}</td><td>{} at {} tokens</td></tr>\n",
                     xml_escape(prov.hardware[c.hw].name), xml_escape(prov.methods[c.method].name),
                     c.slo_note.empty() ? "no objective given" : xml_escape(c.slo_note),
                     c.concurrent_sequences_at_longest, c.longest_prompt_tokens);
  if (!rep.serving_capacity.empty()) {
    h +=
        "</table>\n<h2>Serving capacity (Poisson arrivals, p90 objectives)</h2>\n<table><tr><th>hardware / "
        "method</th><th>requests/s</th><th>over seeds</th><th>p90 TTFT (ms)</th><th>p90 ITL (ms)</th></tr>\n";
    for (const ServingCapacity& x : rep.serving_capacity)
      h += fmt::format("<tr><td>{} / {}</td><td>{}</td><td>{}</td><td>{:.4g}</td><td>{:.3g}</td></tr>\n",
                       xml_escape(prov.hardware[x.hw].name), xml_escape(prov.methods[x.method].name),
                       x.met ? fmt::format("{:.3g}", x.rate) : "objectives unmet",
                       x.met ? fmt::format("{:.3g}-{:.3g}", x.rate_min, x.rate_max) : "-", x.ttft_p90_ms,
                       x.itl_p90_ms);
  }
  h += "</table>\n" + sections + "<h2>Charts</h2>\n";
  for (const auto& [name, svg] : charts) {
    // Inline SVG in HTML takes no XML declaration.
    const std::string_view body =
        svg.starts_with("<?xml") ? std::string_view(svg).substr(svg.find("?>") + 2) : svg;
    h += fmt::format("<figure>{}<figcaption>{}</figcaption></figure>\n", body, name);
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace lp::report
