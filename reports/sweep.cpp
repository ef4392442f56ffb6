#include "reports/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "model/error.h"
#include "model/json_checks.h"
#include "pruning/method.h"
#include "sim/replay.h"

namespace lp::report {

namespace {
// Configurations one sweep may hold (about 100 MiB of work list): a grid of a few lines can name
// billions.
constexpr int64_t kMaxConfigurations = int64_t(1) << 22;
}  // namespace

std::string sweep_key(const std::string& hw, const std::string& model, const std::string& policy,
                      const std::string& schedule, int64_t tokens, const std::string& layout) {
  return fmt::format("{}|{}|{}|{}|{}|{}", hw, model, policy, schedule, tokens, layout);
}

SweepProgress sweep_progress(std::string_view text, const std::string& origin) {
  SweepProgress p;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;  // no newline: cut short
    try {
      const nlohmann::json r = json_parse(text.substr(at, nl - at), origin);
      p.done.insert(sweep_key(r.at("hw"), r.at("model"), r.at("policy"), r.at("schedule"),
                              r.at("prompt_tokens"), r.value("layout", std::string("tp1"))));
    } catch (const nlohmann::json::exception&) {
      break;  // a line cut short by an interrupted run: everything from here is redone
    }
    p.whole_bytes = at = nl + 1;
  }
  return p;
}

std::vector<SweepConfig> sweep_configs(const SweepGrid& g, const std::set<std::string>& done,
                                       const std::string& origin) {
  const double configurations = double(g.models.size()) * double(g.hws.size()) * double(g.layouts.size()) *
                                double(g.methods.size()) * double(g.lengths.size());
  if (configurations > double(kMaxConfigurations))
    fail("{}: the grid names {:.0f} configurations, over the limit of {} for one sweep; split it", origin,
         configurations, kMaxConfigurations);
  std::vector<SweepConfig> todo;
  for (size_t m = 0; m < g.models.size(); ++m)
    for (size_t h = 0; h < g.hws.size(); ++h)
      for (size_t y = 0; y < g.layouts.size(); ++y)
        for (size_t k = 0; k < g.methods.size(); ++k)
          for (int64_t n : g.lengths) {
            if (g.models[m].n_ctx_train > 0 &&
                n + std::max<int64_t>(0, g.new_tokens - 1) > g.models[m].n_ctx_train)
              continue;
            if (!done.count(sweep_key(g.hws[h].name, g.model_names[m], g.methods[k].policy_name(),
                                      g.methods[k].schedule_text(), n, g.layouts[y].name())))
              todo.push_back({h, m, k, y, n});
          }
  return todo;
}

std::string sweep_row(const SweepGrid& g, const SweepConfig& cf, const std::vector<SweepRevivals>& revivals) {
  const Method& m = g.methods[cf.method];
  const hw::Profile& hw = g.hws[cf.hw];
  const SweepLayout& y = g.layouts[cf.layout];
  nlohmann::json r = {{"hw", hw.name},
                      {"model", g.model_names[cf.model]},
                      {"policy", m.policy_name()},
                      {"schedule", m.schedule_text()},
                      {"prompt_tokens", cf.tokens},
                      {"layout", y.name()}};
  const SweepRevivals& rv = revivals[cf.model * g.methods.size() + cf.method];
  sim::Prediction p, b;
  try {  // the layout on this model and profile, refused as simulate refuses it
    const ModelConfig c = sim::expert_parallel(g.models[cf.model], y.ep, y.moe_imbalance, y.dp, y.tp);
    sim::check_tp(c, hw, y.tp);
    const sim::Pipeline pipe{y.pp};  // more stages than layers: refused where replay sets it
    const auto steps = resolve_method(m.policy, m.schedule, c.n_layer, c.global_layers());
    const int64_t dec = std::max<int64_t>(0, g.new_tokens - 1);
    p = sim::replay_synthetic(c, m.policy_name(), steps, cf.tokens, dec, rv.share, hw, g.precision, g.batch,
                              y.tp, 0, drop_share(m.schedule).value_or(0), pipe);
    b = sim::replay_synthetic(c, "none", {}, cf.tokens, dec, {}, hw, g.precision, g.batch, y.tp, 0, 0, pipe);
  } catch (const UsageError& e) {
    for (const char* k : {"ttft_ms", "baseline_ttft_ms", "speedup", "prompt_tokens_computed_fraction",
                          "total_ms", "memory_gib", "kv_gib", "fits_in_memory", "bound_op", "revivals"})
      r[k] = nullptr;
    r["error"] = e.what();
    return r.dump();
  }
  r.update({{"ttft_ms", p.ttft_s * 1e3},
            {"baseline_ttft_ms", b.ttft_s * 1e3},
            {"speedup", b.ttft_s / p.ttft_s},
            {"prompt_tokens_computed_fraction", p.prompt_tokens_computed_fraction},
            {"total_ms", p.total_s * 1e3},
            {"memory_gib", p.memory.total() / 1073741824.0},
            {"kv_gib", p.memory.kv / 1073741824.0},
            {"fits_in_memory", p.memory.total() <= hw.memory_capacity},
            {"bound_op", std::string(op_name(p.prefill_bound_op()))},
            {"revivals", rv.description}});
  return r.dump();
}

}  // namespace lp::report
