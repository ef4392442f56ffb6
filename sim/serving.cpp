#include "sim/serving.h"

#include <algorithm>
#include <cmath>

#include "admission/prefix_cache.h"
#include "model/error.h"
#include "pruning/policy.h"
#include "sim/layer_cost.h"
#include "sim/replay.h"
#include "sim/serving_loop.h"

namespace lp::sim {

ServingMethod serving_method(const Method& method, const ModelConfig& c, trace::Revivals revivals,
                             std::string name) {
  ServingMethod m;
  m.name = name.empty() ? std::string(method.policy_name()) : std::move(name);
  m.method = method;
  m.steps = resolve_method(method.policy, method.schedule, c.n_layer, c.global_layers());
  m.drop_share = drop_share(method.schedule).value_or(0);
  if (method.policy != PolicyKind::None) m.revivals = std::move(revivals);
  return m;
}

double RequestOutcome::itl_s() const {
  return output_tokens > 1 ? (finished_s - first_token_s) / double(output_tokens - 1) : 0.0;
}

namespace {
using namespace detail;

ServingRun simulate_requests(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                             const ServingMethod& m, const ServingConfig& cfg,
                             std::span<const ServingRequest> reqs) {
  return EventLoop(c, hw, p, m, cfg, reqs).run();
}

}  // namespace

namespace {
// One group's requests served (random-drop's prompts shortened first).
ServingRun serve_requests(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                          const ServingMethod& m, const ServingConfig& cfg,
                          std::span<const ServingRequest> reqs) {
  if (!policy_traits(m.method.policy).drops_prompt) return simulate_requests(c, hw, p, m, cfg, reqs);
  const DroppedPrompts d = drop_prompts(m, reqs);
  ServingRun run = simulate_requests(c, hw, p, d.plain, cfg, d.reqs);
  restore_prompts(run, reqs);
  return run;
}
}  // namespace

ServingConfig serving_config(const hw::Scheduling& s) {
  ServingConfig cfg;
  cfg.max_seqs = s.max_seqs;
  cfg.max_batch_tokens = s.max_batch_tokens;
  cfg.chunk_tokens = s.chunk_tokens;
  cfg.kv_mode = s.kv;
  cfg.kv_block = s.kv_block_tokens;
  cfg.mixed = s.mixed;
  cfg.iteration_overhead_s = s.iteration_s;
  cfg.request_overhead_s = s.request_s;
  cfg.admit_layer_s = s.admit_layer_s;
  cfg.time_scale = s.kernel_scale;
  return cfg;
}

double memory_kv_budget(const ModelConfig& c, const hw::Profile& hw, const Precision& p, int tp,
                        double fraction, int pp) {
  const double weights = weight_memory_bytes(c, CostContext(hw, p).dtypes) / double(tp * std::max(pp, 1));
  const double per_gpu = fraction * hw.memory_capacity - weights;
  return per_gpu > 0 ? group_kv_budget(c, tp, per_gpu) : 0;
}

double group_kv_budget(const ModelConfig& c, int tp, double per_gpu_bytes) {
  const ModelConfig g = tp_shard(c, tp);
  double whole = 0, one = 0;
  for (int l = 0; l < c.n_layer; ++l)
    whole += double(c.layer(l).kv_token_elems()), one += double(g.layer(l).kv_token_elems());
  return one > 0 ? per_gpu_bytes * whole / one : per_gpu_bytes;
}

ServingRun simulate_serving(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                            const ServingMethod& m, const ServingConfig& cfg,
                            std::span<const ServingRequest> reqs) {
  // Data-parallel attention: requests dealt round robin to the dp groups (SGLang's and vLLM's
  // default), the first group's run standing for every group's (equal load: its iterations cost
  // c.dp groups' rows at the experts). Pipeline stages: as many virtual engines, dealt the same
  // way. The deployment's rates are dp x stages times the first one's.
  const int shares = std::max(c.dp, 1) * std::max(cfg.pipeline.stages, 1);
  if (shares <= 1) return serve_requests(c, hw, p, m, cfg, reqs);
  // Every request checked (order, fit) before they are dealt, not only the first share's.
  check_inputs(c, cfg, reqs, policy_traits(m.method.policy).prunes && !m.steps.empty());
  std::vector<ServingRequest> first;
  for (size_t i = 0; i < reqs.size(); i += size_t(shares)) first.push_back(reqs[i]);
  // Closed loop: the first share's clients, dealt round robin as its requests are.
  ServingConfig one = cfg;
  if (cfg.clients > 0) one.clients = (cfg.clients + shares - 1) / shares;
  ServingRun run = serve_requests(c, hw, p, m, one, first);
  run.replicas = shares;
  return run;
}

}  // namespace lp::sim
