#include "sim/plan.h"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "model/error.h"
#include "sim/cost.h"
#include "sim/replay.h"

namespace lp::sim {

std::string Layout::describe() const {
  const std::string par =
      fmt::format("TP{}{}{}", tp, pp > 1 ? fmt::format(" PP{}", pp) : "", ep ? " EP" : "");
  if (!disaggregated()) return fmt::format("{} x {}", par, replicas);
  return fmt::format("prefill {} x {} + decode TP{}{} x {}", par, replicas, decode_tp, ep ? " EP" : "",
                     decode_instances);
}

std::vector<Layout> plan_layouts(const hw::Profile& hw, const PlanOptions& o, bool moe) {
  if (o.gpus < 1) usage_fail("--gpus must be at least 1, got {}", o.gpus);
  if (o.methods.empty()) usage_fail("the search needs at least one method");
  if (o.batch_tokens.empty() || o.max_seqs.empty())
    usage_fail("the search needs token budgets and request limits");
  for (const int pp : o.pp)
    if (pp < 1) usage_fail("pipeline stages must be at least 1, got {}", pp);
  // Tensor-parallel groups of powers of two within the interconnect (the sizes engines split heads by).
  std::vector<int> tps;
  for (int t = 1; t <= o.gpus && t <= std::max(hw.max_tp, 1); t *= 2) tps.push_back(t);
  std::vector<Layout> shapes;  // the GPUs' layouts, before budgets, limits and methods
  const auto with_ep = [&](Layout l) {
    const bool ep = moe && o.expert_parallel && std::min(l.tp, l.disaggregated() ? l.decode_tp : l.tp) > 1;
    if (!ep || !o.expert_only) shapes.push_back(l);
    if (ep) {
      l.ep = true;
      shapes.push_back(l);
    }
  };
  std::vector<int> pps = o.pp.empty() ? std::vector<int>{1} : o.pp;
  std::sort(pps.begin(), pps.end());
  pps.erase(std::unique(pps.begin(), pps.end()), pps.end());
  for (const int t : tps)
    for (const int pp : pps)
      if (o.gpus % (t * pp) == 0) {
        Layout l;
        l.tp = t, l.pp = pp, l.replicas = o.gpus / (t * pp);
        with_ep(l);
      }
  if (o.disaggregated)
    for (const int tp_p : tps)
      for (int P = 1; P * tp_p < o.gpus; ++P) {
        const int rest = o.gpus - P * tp_p;
        for (const int tp_d : tps)
          if (rest % tp_d == 0) {
            Layout l;
            l.tp = tp_p, l.replicas = P, l.decode_tp = tp_d, l.decode_instances = rest / tp_d;
            with_ep(l);
          }
      }
  const int64_t count = int64_t(shapes.size()) * int64_t(o.batch_tokens.size()) * int64_t(o.max_seqs.size()) *
                        int64_t(o.methods.size());
  if (count > o.max_layouts)
    usage_fail(
        "the search space holds {} layouts, over the limit of {} (fewer budgets, limits, stages or methods, "
        "or --max-layouts)",
        count, o.max_layouts);
  std::vector<Layout> out;
  for (const Layout& shape : shapes)
    for (const int64_t b : o.batch_tokens)
      for (const int64_t s : o.max_seqs)
        for (size_t m = 0; m < o.methods.size(); ++m) {
          Layout l = shape;
          l.max_batch_tokens = b, l.max_seqs = s, l.method = m;
          out.push_back(l);
        }
  return out;
}

namespace {

ServingConfig layout_config(const ServingConfig& base, const Layout& l, int tp, double kv) {
  ServingConfig cfg = base;
  cfg.tp = tp;
  cfg.pipeline = {};
  cfg.max_batch_tokens = l.max_batch_tokens;
  if (base.chunk_tokens > 0) cfg.chunk_tokens = l.max_batch_tokens;  // the budget's chunks, as vLLM's
  cfg.max_seqs = l.max_seqs;
  cfg.kv_budget_bytes = kv;
  cfg.clients = 0;
  cfg.prefix_cache = false;
  return cfg;
}

// The model as a layout runs it: with expert parallelism, whole experts over its (smaller)
// tensor-parallel group. Throws lp::UsageError when the experts do not divide.
ModelConfig layout_model(const ModelConfig& c, const Layout& l) {
  if (!l.ep) return c;
  return expert_parallel(c, l.disaggregated() ? std::min(l.tp, l.decode_tp) : l.tp);
}

// The deployment of a layout; nullopt when it does not fit (no K/V left, a TP, PP or EP the model
// cannot split).
std::optional<Deployment> deployment_of(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                        const ServingConfig& base, const Layout& l, double fraction) {
  Deployment d;
  d.router = Router::LeastOutstanding;
  try {
    for (const int tp : {l.tp, l.decode_tp})
      if (tp > 0) check_tp(c, hw, tp);
    if (l.pp > 1) (void)pipeline_starts(c.n_layer, l.pp);
  } catch (const Error&) {
    return std::nullopt;
  }
  const double kv = memory_kv_budget(c, hw, p, l.tp, fraction, l.pp);
  if (!(kv > 0)) return std::nullopt;
  d.serve = {hw, layout_config(base, l, l.tp, kv), l.replicas};
  if (l.pp > 1) {
    // Stages within a node hand their rows over its interconnect; a replica across nodes, over
    // the scale-out network.
    const bool in_node = l.tp * l.pp <= std::max(hw.max_tp, 1) || !(hw.scale_out_bandwidth > 0);
    d.serve.cfg.pipeline.stages = l.pp;
    d.serve.cfg.pipeline.link_bytes_per_s = std::max(
        in_node ? hw.interconnect_bandwidth * hw.interconnect_efficiency : hw.scale_out_bandwidth, 1e9);
    d.serve.cfg.pipeline.latency_s = in_node ? hw.interconnect_latency : hw.scale_out_latency;
  }
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

std::vector<LayoutRun> simulate_layouts(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                        const ServingConfig& base, const PlanOptions& o,
                                        const std::vector<Layout>& all, int rank, int ranks) {
  if (o.requests < 1) usage_fail("the search needs at least one request a simulation");
  for (const double s : o.load_shares)
    if (!(s > 0 && s <= 1)) usage_fail("a load share must be in (0, 1], got {}", s);
  if (ranks < 1 || rank < 0 || rank >= ranks) fail("rank {} of {} ranks", rank, ranks);
  const std::vector<ServingRequest> unit = make_workload(o.requests, {1, 1}, o.prompt, o.output, o.seed);
  std::vector<LayoutRun> runs(all.size());
  std::vector<size_t> mine;
  for (size_t i = size_t(rank); i < all.size(); i += size_t(ranks)) mine.push_back(i);
  tbb::parallel_for(size_t(0), mine.size(), [&](size_t k) {
    const Layout& l = all[mine[k]];
    LayoutRun& run = runs[mine[k]];
    ModelConfig lc;
    try {
      lc = layout_model(c, l);
    } catch (const Error&) {  // experts that do not divide
      return;
    }
    const std::optional<Deployment> d = deployment_of(lc, hw, p, base, l, o.memory_fraction);
    if (!d) return;
    const ServingMethod& m = o.methods[l.method];
    double saturated = 0;
    try {
      saturated =
          serving_metrics(simulate_deployment(lc, p, m, *d, at_rate(unit, HUGE_VAL)), {}).requests_per_s;
    } catch (const Error&) {  // a request it could never hold
      return;
    }
    run.fits = true;
    ++run.simulations;
    for (const double share : o.load_shares) {
      const double rate = share * saturated;
      if (!(rate > 0)) continue;
      const ServingMetrics mm =
          serving_metrics(simulate_deployment(lc, p, m, *d, at_rate(unit, rate)), o.objectives);
      ++run.simulations;
      PlanPoint pt;
      pt.rate = rate;
      pt.metrics = mm;
      pt.tokens_per_s_per_gpu = mm.output_tokens_per_s / double(l.gpus());
      pt.tokens_per_s_per_user = mm.itl.mean > 0 ? 1 / mm.itl.mean : 0;
      pt.meets = (o.objectives.ttft_p90_s <= 0 || mm.ttft.p90 <= o.objectives.ttft_p90_s) &&
                 (o.objectives.itl_p90_s <= 0 || mm.itl.p90 <= o.objectives.itl_p90_s);
      run.points.push_back(pt);
    }
  });
  return runs;
}

PlanResult plan_result(const std::vector<Layout>& all, const std::vector<LayoutRun>& runs,
                       const Objectives& objectives) {
  if (runs.size() != all.size()) fail("{} layouts' runs for {} layouts", runs.size(), all.size());
  PlanResult out;
  for (size_t i = 0; i < all.size(); ++i) {
    out.simulations += runs[i].simulations;
    if (!runs[i].fits) {
      ++out.layouts_refused;
      continue;
    }
    out.layouts.push_back(all[i]);
    for (PlanPoint pt : runs[i].points) {
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
    const double over = std::max(objectives.ttft_p90_s > 0 ? pt.metrics.ttft.p90 / objectives.ttft_p90_s : 0,
                                 objectives.itl_p90_s > 0 ? pt.metrics.itl.p90 / objectives.itl_p90_s : 0);
    if (over < worst_best) worst_best = over, out.best_reachable = i;
  }
  if (out.best) out.best_reachable.reset();
  return out;
}

// A share's bytes: per layout of the share, fits (1 byte), simulations (8), points (8) and the
// points' bytes; the processes are the same build (mpirun starts one executable), so a point's
// bytes are its object's.
static_assert(std::is_trivially_copyable_v<PlanPoint>);

std::string pack_layout_runs(const std::vector<LayoutRun>& runs, int rank, int ranks) {
  std::string out;
  const auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  for (size_t i = size_t(rank); i < runs.size(); i += size_t(ranks)) {
    const LayoutRun& r = runs[i];
    const char fits = r.fits ? 1 : 0;
    const uint64_t n = r.points.size();
    put(&fits, 1);
    put(&r.simulations, sizeof r.simulations);
    put(&n, sizeof n);
    put(r.points.data(), r.points.size() * sizeof(PlanPoint));
  }
  return out;
}

void unpack_layout_runs(const std::string& bytes, int rank, int ranks, std::vector<LayoutRun>& into) {
  size_t at = 0;
  const auto get = [&](void* p, size_t n) {
    if (bytes.size() - at < n)
      fail("rank {}'s share of the search ends early ({} bytes)", rank, bytes.size());
    std::memcpy(p, bytes.data() + at, n);
    at += n;
  };
  for (size_t i = size_t(rank); i < into.size(); i += size_t(ranks)) {
    LayoutRun& r = into[i];
    char fits = 0;
    uint64_t n = 0;
    get(&fits, 1);
    get(&r.simulations, sizeof r.simulations);
    get(&n, sizeof n);
    if (n > (bytes.size() - at) / sizeof(PlanPoint))
      fail("rank {}'s share of the search ends early ({} bytes)", rank, bytes.size());
    r.fits = fits != 0;
    r.points.resize(size_t(n));
    get(r.points.data(), size_t(n) * sizeof(PlanPoint));
  }
  if (at != bytes.size())
    fail("rank {}'s share of the search has {} bytes too many", rank, bytes.size() - at);
}

PlanResult plan(const ModelConfig& c, const hw::Profile& hw, const Precision& p, const ServingConfig& base,
                const PlanOptions& o) {
  const std::vector<Layout> all = plan_layouts(hw, o, c.moe());
  return plan_result(all, simulate_layouts(c, hw, p, base, o, all), o.objectives);
}

std::vector<LaunchConfig> launch_configs(const Layout& l, const std::string& model) {
  std::vector<LaunchConfig> out;
  // Each engine's flags for pipeline stages and expert parallelism (vLLM: experts over TP x DP,
  // SGLang and TensorRT-LLM: an EP size within the TP group).
  const std::string vllm_par =
      fmt::format("{}{}", l.pp > 1 ? fmt::format(" --pipeline-parallel-size {}", l.pp) : "",
                  l.ep ? " --enable-expert-parallel" : "");
  const auto sglang_par = [&](int tp) {
    return fmt::format("{}{}", l.pp > 1 ? fmt::format(" --pp-size {}", l.pp) : "",
                       l.ep ? fmt::format(" --ep-size {}", tp) : "");
  };
  const auto trt_par = [&](int tp) {
    return fmt::format("{}{}", l.pp > 1 ? fmt::format(" --pp_size {}", l.pp) : "",
                       l.ep ? fmt::format(" --ep_size {}", tp) : "");
  };
  if (!l.disaggregated()) {
    // vLLM spreads experts over every data-parallel rank's GPUs: replicas of their own EP groups
    // are separate servers.
    const std::string vllm_dp = l.ep ? "" : fmt::format(" --data-parallel-size {}", l.replicas);
    out.push_back(
        {"vllm",
         fmt::format(
             "vllm serve {} --tensor-parallel-size {}{}{} --max-num-batched-tokens {} "
             "--max-num-seqs {}{}",
             model, l.tp, vllm_par, vllm_dp, l.max_batch_tokens, l.max_seqs,
             l.ep && l.replicas > 1 ? fmt::format("  (x{} instances behind a router)", l.replicas) : "")});
    out.push_back(
        {"sglang", fmt::format("python -m sglang.launch_server --model-path {} --tp-size {}{} --dp-size {} "
                               "--chunked-prefill-size {} --max-running-requests {}",
                               model, l.tp, sglang_par(l.tp), l.replicas, l.max_batch_tokens, l.max_seqs)});
    out.push_back(
        {"trtllm",
         fmt::format("trtllm-serve {} --tp_size {}{} --max_num_tokens {} --max_batch_size {}{}", model, l.tp,
                     trt_par(l.tp), l.max_batch_tokens, l.max_seqs,
                     l.replicas > 1 ? fmt::format("  (x{} instances behind a router)", l.replicas) : "")});
    return out;
  }
  const int ep = std::min(l.tp, l.decode_tp);
  out.push_back(
      {"vllm",
       fmt::format("prefill x{0}: vllm serve {1} --tensor-parallel-size {2}{7} --max-num-batched-tokens {5} "
                   "--max-num-seqs {6} --kv-transfer-config '{{\"kv_connector\":\"NixlConnector\","
                   "\"kv_role\":\"kv_both\"}}'; decode x{3}: the same with --tensor-parallel-size {4}; "
                   "behind vLLM's disaggregated proxy",
                   l.replicas, model, l.tp, l.decode_instances, l.decode_tp, l.max_batch_tokens, l.max_seqs,
                   vllm_par)});
  out.push_back(
      {"sglang", fmt::format("prefill x{0}: python -m sglang.launch_server --model-path {1} --tp-size {2}{7} "
                             "--disaggregation-mode prefill --chunked-prefill-size {5}; decode x{3}: the "
                             "same with --tp-size {4} --disaggregation-mode decode --max-running-requests "
                             "{6}; python -m sglang_router.launch_router --pd-disaggregation",
                             l.replicas, model, l.tp, l.decode_instances, l.decode_tp, l.max_batch_tokens,
                             l.max_seqs, sglang_par(ep))});
  out.push_back(
      {"trtllm", fmt::format("trtllm-serve disaggregated -c disagg.yaml, with context_servers: "
                             "{{num_instances: {}, tensor_parallel_size: {}{}, max_num_tokens: {}}} and "
                             "generation_servers: {{num_instances: {}, tensor_parallel_size: {}{}, "
                             "max_batch_size: {}}}",
                             l.replicas, l.tp, l.ep ? fmt::format(", moe_expert_parallel_size: {}", ep) : "",
                             l.max_batch_tokens, l.decode_instances, l.decode_tp,
                             l.ep ? fmt::format(", moe_expert_parallel_size: {}", ep) : "", l.max_seqs)});
  return out;
}

}  // namespace lp::sim
