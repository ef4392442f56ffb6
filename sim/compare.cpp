#include "sim/compare.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/error.h"
#include "sim/kv_predict.h"
#include "sim/replay.h"
#include "sim/runahead.h"
#include "traces/synthetic.h"

namespace lp::sim {

Comparison compare_methods(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                           const CompareOptions& o) {
  if (o.schedules.empty()) fail("compare: no LazyLLM schedule to compare");
  const int P = o.devices;
  std::vector<std::vector<PruneStep>> steps;
  for (const Schedule& s : o.schedules) steps.push_back(resolve_schedule(s, c.n_layer, c.global_layers()));
  Comparison out;
  // Tensor parallelism over P of these devices, where the profile joins P and the model splits.
  try {
    check_tp(c, hw, P);
  } catch (const UsageError& e) {
    out.tp_refused = e.what();
  }
  const RunaheadLink link = default_link(hw);
  const auto most = [](const RunaheadPrediction& r) {
    double m = 0;
    for (const auto& k : r.ranks) m = std::max(m, k.memory_bytes);
    return m;
  };
  for (const int64_t N : o.prompt_tokens) {
    CompareTable t{N, {}};
    const auto add = [&](std::string method, std::string family, int devices, double ttft_s, double memory,
                         CompareAccuracy accuracy, size_t schedule = 0, std::string note = "") {
      t.rows.push_back({std::move(method), std::move(family), devices, ttft_s, memory, 0, true, accuracy,
                        schedule, std::move(note), false});
    };
    const Prediction plain = replay(trace::synthetic_trace(c, "none", {}, N, 0), c, hw, p);
    add("baseline: one device", "baseline", 1, plain.ttft_s, plain.memory.total(), CompareAccuracy::Exact);
    for (size_t i = 0; i < o.schedules.size(); ++i) {
      const Prediction lazy = replay(trace::synthetic_trace(c, "lazyllm", steps[i], N, 0), c, hw, p);
      add(fmt::format("LazyLLM {}", o.schedules[i].to_string()), "LazyLLM " + o.schedules[i].to_string(), 1,
          lazy.ttft_s, lazy.memory.total(), CompareAccuracy::Schedule, i);
    }
    if (out.tp_refused.empty()) {
      const Prediction tp = replay(trace::synthetic_trace(c, "none", {}, N, 0), c, hw, p, 1, P);
      add(fmt::format("tensor parallelism (TP) {}", P), "tensor parallelism", P, tp.ttft_s, tp.memory.total(),
          CompareAccuracy::Exact);
      const Prediction tpl = replay(trace::synthetic_trace(c, "lazyllm", steps[0], N, 0), c, hw, p, 1, P);
      add(fmt::format("LazyLLM + TP {}", P), "LazyLLM + tensor parallelism", P, tpl.ttft_s,
          tpl.memory.total(), CompareAccuracy::Schedule, 0);
    } else {
      add(fmt::format("tensor parallelism (TP) {}", P), "tensor parallelism", P, 0, 0, CompareAccuracy::Exact,
          0, out.tp_refused);
      t.rows.back().refused = true;
    }
    if (N >= P) {
      const std::vector<int64_t> chunks = optimise_partition(c, hw, p, N, P, link);
      const RunaheadPrediction ra = predict_runahead(c, hw, p, chunks, link);
      const std::vector<int64_t> lchunks = optimise_partition(c, hw, p, N, P, link, 1, steps[0]);
      const RunaheadPrediction rl = predict_runahead(c, hw, p, lchunks, link, 1, steps[0]);
      add(fmt::format("KV-Runahead {}", P), "KV-Runahead", P, ra.ttft_s, most(ra), CompareAccuracy::Exact, 0,
          fmt::format("chunks {} to {} tokens", chunks.front(), chunks.back()));
      add(fmt::format("LazyLLM + KV-Runahead {}", P), "LazyLLM + KV-Runahead", P, rl.ttft_s, most(rl),
          CompareAccuracy::RunaheadLastRank, 0,
          fmt::format("chunks {} to {} tokens", lchunks.front(), lchunks.back()));
    }
    if (o.kv_predict) {
      const KvPredictPrediction kp = predict_kv_prediction(c, *o.kv_predict, hw, p, N);
      add(fmt::format("KV Prediction from {}", o.kv_predict_name), "KV Prediction", 1, kp.ttft_s,
          kp.memory.total(), CompareAccuracy::KvPrediction);
    }
    for (CompareRow& r : t.rows)
      if (!r.refused) {
        r.speedup = plain.ttft_s / r.ttft_s;
        r.fits = r.memory_bytes <= hw.memory_capacity;
      }
    out.tables.push_back(std::move(t));
  }
  return out;
}

}  // namespace lp::sim
