// `lazyprefill simulate --runahead P`: KV-Runahead's prefill over P ranks (sim/runahead.h), per
// hardware profile, against the same prefill on one device and, where the profile hosts P GPUs
// and the model splits over them, tensor parallelism on the same P devices.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/runahead.h"
#include "sim/simulate.h"

namespace lp::cli {

using json = nlohmann::ordered_json;

namespace {

json runahead_result_json(const SimulateArgs& a, const hw::Profile& hw, const std::vector<int64_t>& chunks,
                          const std::vector<int64_t>& plain_chunks, const sim::RunaheadLink& link,
                          const sim::RunaheadComparison& cmp, bool pruned) {
  const sim::RunaheadPrediction& r = cmp.runahead;
  json ranks = json::array();
  for (const sim::RunaheadRank& k : r.ranks)
    ranks.push_back({{"start", k.start},
                     {"tokens", k.tokens},
                     {"done_ms", k.done_s * 1e3},
                     {"compute_ms", k.compute_s * 1e3},
                     {"wait_ms", k.wait_s * 1e3},
                     {"sent_mib", k.sent_bytes / (1 << 20)},
                     {"memory_gib", k.memory_bytes / (1 << 30)},
                     {"fits_in_memory", k.memory_bytes <= hw.memory_capacity}});
  json j = {{"hw", hw.name},
            {"partition", chunks},
            {"partition_rule", a.partition},
            {"link",
             {{"gbs", link.bandwidth / 1e9}, {"latency_us", link.latency_s * 1e6}, {"source", link.source}}},
            {"rank_share", a.rank_share},
            {"ttft_ms", r.ttft_s * 1e3},
            {"single_device_ttft_ms", cmp.single_s * 1e3},
            {"speedup_vs_single_device", cmp.single_s / r.ttft_s},
            {"ranks_detail", ranks}};
  if (pruned) {  // the same pruning on one device, and KV-Runahead without it
    j["single_device_lazyllm_ttft_ms"] = cmp.lazy_single_s * 1e3;
    j["unpruned_runahead_ttft_ms"] = cmp.plain_s * 1e3;
    j["unpruned_partition"] = plain_chunks;
  }
  if (a.rank_share < 1) {
    j["single_rank_share_ttft_ms"] = cmp.single_share_s * 1e3;
    j["speedup_vs_one_rank_share"] = cmp.single_share_s / r.ttft_s;
  }
  j["fits_in_memory"] = cmp.most_memory_bytes <= hw.memory_capacity;
  if (cmp.tp_s) {
    j["tp_ttft_ms"] = *cmp.tp_s * 1e3;
    j["speedup_vs_tp"] = *cmp.tp_s / r.ttft_s;
  } else if (!cmp.tp_refused.empty()) {
    j["tp_ttft_ms"] = nullptr;
    j["tp_refused"] = cmp.tp_refused;
  }
  return j;
}

// `schedule`: LazyLLM's on the last rank, "" unpruned.
std::string runahead_result_text(const SimulateArgs& a, const hw::Profile& hw,
                                 const std::vector<int64_t>& chunks, const sim::RunaheadLink& link,
                                 const sim::RunaheadComparison& cmp, const std::string& schedule) {
  const sim::RunaheadPrediction& r = cmp.runahead;
  std::string text = fmt::format(
      "{}: KV-Runahead over {} ranks{}, {} tokens, partition {} ({}), link {:.1f} GB/s + {:.1f} us ({})\n",
      hw.name, chunks.size(), schedule.empty() ? "" : fmt::format(", LazyLLM {} on the last rank", schedule),
      a.prompt_tokens, fmt::join(chunks, ","), a.partition, link.bandwidth / 1e9, link.latency_s * 1e6,
      link.source);
  text += fmt::format("  {:>4} {:>9} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}\n", "rank", "start", "tokens",
                      "done ms", "compute ms", "wait ms", "sent MiB", "mem GiB");
  for (size_t p = 0; p < r.ranks.size(); ++p) {
    const sim::RunaheadRank& k = r.ranks[p];
    text += fmt::format("  {:>4} {:>9} {:>8} {:>10.1f} {:>10.1f} {:>9.1f} {:>9.1f} {:>9.2f}\n", p, k.start,
                        k.tokens, k.done_s * 1e3, k.compute_s * 1e3, k.wait_s * 1e3, k.sent_bytes / (1 << 20),
                        k.memory_bytes / (1 << 30));
  }
  if (cmp.most_memory_bytes > hw.memory_capacity)
    text += fmt::format(
        "  does not fit: a rank needs up to {:.1f} GiB, a device has {:.1f} (each rank holds every "
        "weight)\n",
        cmp.most_memory_bytes / (1 << 30), hw.memory_capacity / (1 << 30));
  text += fmt::format("  TTFT {:.1f} ms; one device {:.1f} ms ({:.2f}x)", r.ttft_s * 1e3, cmp.single_s * 1e3,
                      cmp.single_s / r.ttft_s);
  if (a.rank_share < 1)
    text += fmt::format("; one rank's share alone {:.1f} ms ({:.2f}x)", cmp.single_share_s * 1e3,
                        cmp.single_share_s / r.ttft_s);
  if (!schedule.empty())
    text += fmt::format("; unpruned KV-Runahead {:.1f} ms; LazyLLM on one device {:.1f} ms",
                        cmp.plain_s * 1e3, cmp.lazy_single_s * 1e3);
  if (cmp.tp_s) text += fmt::format("; tensor parallelism over {} {:.1f} ms", chunks.size(), *cmp.tp_s * 1e3);
  return text + "\n";
}

}  // namespace

int cmd_simulate_runahead(const SimulateArgs& a) {
  if (a.prompt_tokens <= 0) usage_fail("--runahead needs --prompt-tokens N");
  const bool pruned = !a.prune.empty() && a.prune != "none";
  if (pruned && a.prune != "lazyllm")
    usage_fail("--runahead prunes with --prune lazyllm on the last rank (docs/runahead.md), not '{}'",
               a.prune);
  if (a.tp != 1) usage_fail("--runahead runs one device per rank; drop --tp (the output compares with it)");
  std::string model_name;
  const ModelConfig c = sim::model_to_cost(a.model, a.model_config, &model_name);
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const int P = a.runahead;
  const int64_t N = a.prompt_tokens;
  if (N < P) usage_fail("--runahead {}: the prompt has {} tokens, fewer than the ranks", P, N);
  // LazyLLM on the last rank (engine/runahead.h): the partition is balanced knowing it prunes.
  const Schedule sched = a.schedule.empty() ? default_schedule() : schedule_from_arg(a.schedule);
  const std::vector<PruneStep> steps =
      pruned ? resolve_schedule(sched, c.n_layer, c.global_layers()) : std::vector<PruneStep>{};

  json out;
  out["tool"] = "lazyprefill simulate --runahead";
  out["model"] = model_name;
  out["prompt_tokens"] = N;
  out["ranks"] = P;
  out["prune"] = pruned ? "lazyllm" : "none";
  out["schedule"] = pruned ? sched.to_string() : "none";
  json results = json::array();
  std::string text;
  for (const hw::Profile& hw : load_profiles(a.hw, a.engine)) {
    sim::RunaheadLink link = sim::default_link(hw);
    if (a.link_gbs > 0) link.bandwidth = a.link_gbs * 1e9, link.source = "--link-gbs";
    if (a.link_latency_us >= 0) link.latency_s = a.link_latency_us * 1e-6;
    const auto partition = [&](std::span<const PruneStep> prune) {
      return for_option("--partition", [&] {
        return sim::parse_partition(a.partition, c, hw, prec, N, P, link, a.rank_share, prune);
      });
    };
    const std::vector<int64_t> chunks = partition(steps);
    const std::vector<int64_t> plain_chunks = pruned ? partition({}) : std::vector<int64_t>{};
    const sim::RunaheadComparison cmp =
        sim::compare_runahead(c, hw, prec, chunks, plain_chunks, link, a.rank_share, steps);
    results.push_back(runahead_result_json(a, hw, chunks, plain_chunks, link, cmp, pruned));
    text += runahead_result_text(a, hw, chunks, link, cmp, pruned ? sched.to_string() : "");
  }
  out["results"] = std::move(results);
  print_result(a.json_out, out, text);
  return 0;
}

}  // namespace lp::cli
