#include "sim/plan.h"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "model/error.h"
#include "sim/cost.h"
#include "sim/replay.h"

namespace lp::sim {

std::string Layout::describe() const {
  if (!disaggregated()) return fmt::format("TP{} x {}", tp, replicas);
  return fmt::format("prefill TP{} x {} + decode TP{} x {}", tp, replicas, decode_tp, decode_instances);
}

std::vector<Layout> plan_layouts(const hw::Profile& hw, const PlanOptions& o) {
  if (o.gpus < 1) usage_fail("--gpus must be at least 1, got {}", o.gpus);
  if (o.methods.empty()) usage_fail("the search needs at least one method");
  if (o.batch_tokens.empty() || o.max_seqs.empty())
    usage_fail("the search needs token budgets and request limits");
  // Tensor-parallel groups of powers of two within the interconnect (the sizes engines split heads by).
  std::vector<int> tps;
  for (int t = 1; t <= o.gpus && t <= std::max(hw.max_tp, 1); t *= 2) tps.push_back(t);
  std::vector<std::pair<std::pair<int, int>, std::pair<int, int>>> shapes;  // (tp, n), (decode tp, decode n)
  for (const int t : tps)
    if (o.gpus % t == 0) shapes.push_back({{t, o.gpus / t}, {0, 0}});
  if (o.disaggregated)
    for (const int tp_p : tps)
      for (int P = 1; P * tp_p < o.gpus; ++P) {
        const int rest = o.gpus - P * tp_p;
        for (const int tp_d : tps)
          if (rest % tp_d == 0) shapes.push_back({{tp_p, P}, {tp_d, rest / tp_d}});
      }
  const int64_t count = int64_t(shapes.size()) * int64_t(o.batch_tokens.size()) * int64_t(o.max_seqs.size()) *
                        int64_t(o.methods.size());
  if (count > o.max_layouts)
    usage_fail(
        "the search space holds {} layouts, over the limit of {} (fewer budgets, limits or methods, or "
        "--max-layouts)",
        count, o.max_layouts);
  std::vector<Layout> out;
  for (const auto& [agg, dis] : shapes)
    for (const int64_t b : o.batch_tokens)
      for (const int64_t s : o.max_seqs)
        for (size_t m = 0; m < o.methods.size(); ++m)
          out.push_back({agg.first, agg.second, dis.first, dis.second, b, s, m});
  return out;
}

namespace {

ServingConfig layout_config(const ServingConfig& base, const Layout& l, int tp, double kv) {
  ServingConfig cfg = base;
  cfg.tp = tp;
  cfg.max_batch_tokens = l.max_batch_tokens;
  if (base.chunk_tokens > 0) cfg.chunk_tokens = l.max_batch_tokens;  // the budget's chunks, as vLLM's
  cfg.max_seqs = l.max_seqs;
  cfg.kv_budget_bytes = kv;
  cfg.clients = 0;
  cfg.prefix_cache = false;
  return cfg;
}

// The deployment of a layout; nullopt when it does not fit (no K/V left, a TP the model cannot split).
std::optional<Deployment> deployment_of(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                        const ServingConfig& base, const Layout& l, double fraction) {
  Deployment d;
  d.router = Router::LeastOutstanding;
  for (const int tp : {l.tp, l.decode_tp}) {
    if (tp == 0) continue;
    try {
      check_tp(c, hw, tp);
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  const double kv = memory_kv_budget(c, hw, p, l.tp, fraction);
  if (!(kv > 0)) return std::nullopt;
  d.serve = {hw, layout_config(base, l, l.tp, kv), l.replicas};
  if (l.disaggregated()) {
    const double kv_d = memory_kv_budget(c, hw, p, l.decode_tp, fraction);
    if (!(kv_d > 0)) return std::nullopt;
    d.decode = Pool{hw, layout_config(base, l, l.decode_tp, kv_d), l.decode_instances};
    const double per_gpu = hw.scale_out_bandwidth > 0 ? hw.scale_out_bandwidth : hw.interconnect_bandwidth;
    d.link_bytes_per_s = std::max(per_gpu, 1e9) * double(std::min(l.tp, l.decode_tp));
    d.link_latency_s = hw.scale_out_latency;
  }
  return d;
}

}  // namespace

PlanResult plan(const ModelConfig& c, const hw::Profile& hw, const Precision& p, const ServingConfig& base,
                const PlanOptions& o) {
  if (o.requests < 1) usage_fail("the search needs at least one request a simulation");
  for (const double s : o.load_shares)
    if (!(s > 0 && s <= 1)) usage_fail("a load share must be in (0, 1], got {}", s);
  PlanResult out;
  const std::vector<Layout> all = plan_layouts(hw, o);
  const std::vector<ServingRequest> unit = make_workload(o.requests, {1, 1}, o.prompt, o.output, o.seed);
  std::vector<std::vector<PlanPoint>> per(all.size());
  std::vector<char> fits(all.size(), 0);
  std::vector<int64_t> sims(all.size(), 0);
  tbb::parallel_for(size_t(0), all.size(), [&](size_t i) {
    const Layout& l = all[i];
    const std::optional<Deployment> d = deployment_of(c, hw, p, base, l, o.memory_fraction);
    if (!d) return;
    const ServingMethod& m = o.methods[l.method];
    double saturated = 0;
    try {
      saturated =
          serving_metrics(simulate_deployment(c, p, m, *d, at_rate(unit, HUGE_VAL)), {}).requests_per_s;
    } catch (const Error&) {  // a request it could never hold
      return;
    }
    fits[i] = 1;
    ++sims[i];
    for (const double share : o.load_shares) {
      const double rate = share * saturated;
      if (!(rate > 0)) continue;
      const ServingMetrics mm =
          serving_metrics(simulate_deployment(c, p, m, *d, at_rate(unit, rate)), o.objectives);
      ++sims[i];
      PlanPoint pt;
      pt.rate = rate;
      pt.metrics = mm;
      pt.tokens_per_s_per_gpu = mm.output_tokens_per_s / double(l.gpus());
      pt.tokens_per_s_per_user = mm.itl.mean > 0 ? 1 / mm.itl.mean : 0;
      pt.meets = (o.objectives.ttft_p90_s <= 0 || mm.ttft.p90 <= o.objectives.ttft_p90_s) &&
                 (o.objectives.itl_p90_s <= 0 || mm.itl.p90 <= o.objectives.itl_p90_s);
      per[i].push_back(pt);
    }
  });
  for (size_t i = 0; i < all.size(); ++i) {
    out.simulations += sims[i];
    if (!fits[i]) {
      ++out.layouts_refused;
      continue;
    }
    out.layouts.push_back(all[i]);
    for (PlanPoint pt : per[i]) {
      pt.layout = out.layouts.size() - 1;
      out.points.push_back(pt);
    }
  }
  // The frontier: fastest per user first, each point kept while it gives more per GPU than every faster one.
  std::vector<size_t> order(out.points.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return out.points[a].tokens_per_s_per_user > out.points[b].tokens_per_s_per_user;
  });
  double most = -1;
  for (const size_t i : order)
    if (out.points[i].tokens_per_s_per_gpu > most)
      most = out.points[i].tokens_per_s_per_gpu, out.frontier.push_back(i);
  // The best within the objectives; else the one closest to them.
  double worst_best = HUGE_VAL;
  for (size_t i = 0; i < out.points.size(); ++i) {
    const PlanPoint& pt = out.points[i];
    if (pt.meets && (!out.best || pt.tokens_per_s_per_gpu > out.points[*out.best].tokens_per_s_per_gpu))
      out.best = i;
    const double over =
        std::max(o.objectives.ttft_p90_s > 0 ? pt.metrics.ttft.p90 / o.objectives.ttft_p90_s : 0,
                 o.objectives.itl_p90_s > 0 ? pt.metrics.itl.p90 / o.objectives.itl_p90_s : 0);
    if (over < worst_best) worst_best = over, out.best_reachable = i;
  }
  if (out.best) out.best_reachable.reset();
  return out;
}

std::vector<LaunchConfig> launch_configs(const Layout& l, const std::string& model) {
  std::vector<LaunchConfig> out;
  if (!l.disaggregated()) {
    out.push_back({"vllm", fmt::format("vllm serve {} --tensor-parallel-size {} --data-parallel-size {} "
                                       "--max-num-batched-tokens {} --max-num-seqs {}",
                                       model, l.tp, l.replicas, l.max_batch_tokens, l.max_seqs)});
    out.push_back(
        {"sglang", fmt::format("python -m sglang.launch_server --model-path {} --tp-size {} --dp-size {} "
                               "--chunked-prefill-size {} --max-running-requests {}",
                               model, l.tp, l.replicas, l.max_batch_tokens, l.max_seqs)});
    out.push_back(
        {"trtllm",
         fmt::format("trtllm-serve {} --tp_size {} --max_num_tokens {} --max_batch_size {}{}", model, l.tp,
                     l.max_batch_tokens, l.max_seqs,
                     l.replicas > 1 ? fmt::format("  (x{} instances behind a router)", l.replicas) : "")});
    return out;
  }
  out.push_back(
      {"vllm",
       fmt::format("prefill x{0}: vllm serve {1} --tensor-parallel-size {2} --max-num-batched-tokens {5} "
                   "--max-num-seqs {6} --kv-transfer-config '{{\"kv_connector\":\"NixlConnector\","
                   "\"kv_role\":\"kv_both\"}}'; decode x{3}: the same with --tensor-parallel-size {4}; "
                   "behind vLLM's disaggregated proxy",
                   l.replicas, model, l.tp, l.decode_instances, l.decode_tp, l.max_batch_tokens,
                   l.max_seqs)});
  out.push_back(
      {"sglang", fmt::format("prefill x{0}: python -m sglang.launch_server --model-path {1} --tp-size {2} "
                             "--disaggregation-mode prefill --chunked-prefill-size {5}; decode x{3}: the "
                             "same with --tp-size {4} --disaggregation-mode decode --max-running-requests "
                             "{6}; python -m sglang_router.launch_router --pd-disaggregation",
                             l.replicas, model, l.tp, l.decode_instances, l.decode_tp, l.max_batch_tokens,
                             l.max_seqs)});
  out.push_back(
      {"trtllm",
       fmt::format("trtllm-serve disaggregated -c disagg.yaml, with context_servers: "
                   "{{num_instances: {}, tensor_parallel_size: {}, max_num_tokens: {}}} and "
                   "generation_servers: {{num_instances: {}, tensor_parallel_size: {}, "
                   "max_batch_size: {}}}",
                   l.replicas, l.tp, l.max_batch_tokens, l.decode_instances, l.decode_tp, l.max_seqs)});
  return out;
}

}  // namespace lp::sim
