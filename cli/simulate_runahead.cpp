// `lazyprefill simulate --runahead P`: KV-Runahead's prefill over P ranks (sim/runahead.h), per
// hardware profile, against the same prefill on one device and, where the profile hosts P GPUs
// and the model splits over them, tensor parallelism on the same P devices.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/replay.h"
#include "sim/runahead.h"
#include "traces/synthetic.h"

namespace lp::cli {

using json = nlohmann::ordered_json;

int cmd_simulate_runahead(const SimulateArgs& a) {
  if (a.prompt_tokens <= 0) usage_fail("--runahead needs --prompt-tokens N");
  const bool pruned = !a.prune.empty() && a.prune != "none";
  if (pruned && a.prune != "lazyllm")
    usage_fail("--runahead prunes with --prune lazyllm on the last rank (docs/runahead.md), not '{}'",
               a.prune);
  if (a.tp != 1) usage_fail("--runahead runs one device per rank; drop --tp (the output compares with it)");
  std::string model_name;
  const ModelConfig c = model_to_cost(a.model, a.model_config, &model_name);
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const int P = a.runahead;
  const int64_t N = a.prompt_tokens;
  if (N < P) usage_fail("--runahead {}: the prompt has {} tokens, fewer than the ranks", P, N);
  // LazyLLM on the last rank (engine/runahead.h): the partition is balanced knowing it prunes.
  const Schedule sched = a.schedule.empty() ? default_schedule() : schedule_from_arg(a.schedule);
  const std::vector<PruneStep> steps = pruned ? resolve_schedule(sched, c.n_layer) : std::vector<PruneStep>{};

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
    const std::vector<int64_t> chunks = for_option("--partition", [&] {
      return sim::parse_partition(a.partition, c, hw, prec, N, P, link, a.rank_share, steps);
    });
    const sim::RunaheadPrediction r = sim::predict_runahead(c, hw, prec, chunks, link, a.rank_share, steps);
    const std::vector<int64_t> one = {N};
    // One device: the whole of it (rank_share 1), and one rank's share of it, unpruned.
    const double single = sim::predict_runahead(c, hw, prec, one, link, 1).ttft_s;
    const double single_share =
        a.rank_share < 1 ? sim::predict_runahead(c, hw, prec, one, link, a.rank_share).ttft_s : single;
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
    json j = {
        {"hw", hw.name},
        {"partition", chunks},
        {"partition_rule", a.partition},
        {"link",
         {{"gbs", link.bandwidth / 1e9}, {"latency_us", link.latency_s * 1e6}, {"source", link.source}}},
        {"rank_share", a.rank_share},
        {"ttft_ms", r.ttft_s * 1e3},
        {"single_device_ttft_ms", single * 1e3},
        {"speedup_vs_single_device", single / r.ttft_s},
        {"ranks_detail", ranks}};
    if (pruned) {  // the same pruning on one device, and KV-Runahead without it
      const double lazy = sim::predict_runahead(c, hw, prec, one, link, 1, steps).ttft_s;
      const std::vector<int64_t> plain_chunks = for_option("--partition", [&] {
        return sim::parse_partition(a.partition, c, hw, prec, N, P, link, a.rank_share);
      });
      const double plain = sim::predict_runahead(c, hw, prec, plain_chunks, link, a.rank_share).ttft_s;
      j["single_device_lazyllm_ttft_ms"] = lazy * 1e3;
      j["unpruned_runahead_ttft_ms"] = plain * 1e3;
      j["unpruned_partition"] = plain_chunks;
    }
    if (a.rank_share < 1) {
      j["single_rank_share_ttft_ms"] = single_share * 1e3;
      j["speedup_vs_one_rank_share"] = single_share / r.ttft_s;
    }
    text += fmt::format(
        "{}: KV-Runahead over {} ranks{}, {} tokens, partition {} ({}), link {:.1f} GB/s + {:.1f} us ({})\n",
        hw.name, P, pruned ? fmt::format(", LazyLLM {} on the last rank", sched.to_string()) : "", N,
        fmt::join(chunks, ","), a.partition, link.bandwidth / 1e9, link.latency_s * 1e6, link.source);
    text += fmt::format("  {:>4} {:>9} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9}\n", "rank", "start", "tokens",
                        "done ms", "compute ms", "wait ms", "sent MiB", "mem GiB");
    for (size_t p = 0; p < r.ranks.size(); ++p) {
      const sim::RunaheadRank& k = r.ranks[p];
      text += fmt::format("  {:>4} {:>9} {:>8} {:>10.1f} {:>10.1f} {:>9.1f} {:>9.1f} {:>9.2f}\n", p, k.start,
                          k.tokens, k.done_s * 1e3, k.compute_s * 1e3, k.wait_s * 1e3,
                          k.sent_bytes / (1 << 20), k.memory_bytes / (1 << 30));
    }
    double most = 0;
    for (const sim::RunaheadRank& k : r.ranks) most = std::max(most, k.memory_bytes);
    j["fits_in_memory"] = most <= hw.memory_capacity;
    if (most > hw.memory_capacity)
      text += fmt::format(
          "  does not fit: a rank needs up to {:.1f} GiB, a device has {:.1f} (each rank holds every "
          "weight)\n",
          most / (1 << 30), hw.memory_capacity / (1 << 30));
    text += fmt::format("  TTFT {:.1f} ms; one device {:.1f} ms ({:.2f}x)", r.ttft_s * 1e3, single * 1e3,
                        single / r.ttft_s);
    if (a.rank_share < 1)
      text += fmt::format("; one rank's share alone {:.1f} ms ({:.2f}x)", single_share * 1e3,
                          single_share / r.ttft_s);
    if (pruned)
      text += fmt::format("; unpruned KV-Runahead {:.1f} ms; LazyLLM on one device {:.1f} ms",
                          j["unpruned_runahead_ttft_ms"].get<double>(),
                          j["single_device_lazyllm_ttft_ms"].get<double>());
    // Tensor parallelism over the same P devices, where the profile and the model allow it.
    if (P > 1 && a.rank_share == 1) {
      try {
        sim::check_tp(c, hw, P);
        const sim::Prediction tp =
            sim::replay(trace::synthetic_trace(c, "none", {}, N, 0), c, hw, prec, 1, P);
        j["tp_ttft_ms"] = tp.ttft_s * 1e3;
        j["speedup_vs_tp"] = tp.ttft_s / r.ttft_s;
        text += fmt::format("; tensor parallelism over {} {:.1f} ms", P, tp.ttft_s * 1e3);
      } catch (const UsageError& e) {
        j["tp_ttft_ms"] = nullptr;
        j["tp_refused"] = e.what();
      }
    }
    text += "\n";
    results.push_back(std::move(j));
  }
  out["results"] = std::move(results);
  print_result(a.json_out, out, text);
  return 0;
}

}  // namespace lp::cli
