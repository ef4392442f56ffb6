// `compare`'s rows: every way this tool knows to cut time to first token, side by side, for one
// model on one kind of device at several prompt lengths: the plain prefill on one device, LazyLLM
// (each schedule), tensor parallelism over P devices with and without LazyLLM, KV-Runahead over P
// devices with and without LazyLLM on its last rank (sim/runahead.h), and KV Prediction with an
// auxiliary model (sim/kv_predict.h). Per method: TTFT, speedup over the plain prefill, devices,
// memory per device and whether it fits, and what is known of its accuracy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/schedule.h"
#include "sim/cost.h"

namespace lp::sim {

struct CompareOptions {
  int devices = 8;  // for tensor parallelism and KV-Runahead
  std::vector<int64_t> prompt_tokens;
  std::vector<Schedule> schedules;        // at least one; the first is combined with TP and KV-Runahead
  std::optional<ModelConfig> kv_predict;  // the auxiliary model, paired already (check_kv_predict_pair)
  std::string kv_predict_name;
};

// What a method's accuracy is known to be.
enum class CompareAccuracy {
  Exact,             // the same computation
  Schedule,          // LazyLLM's: that schedule's, as an evaluation measured it (or not)
  RunaheadLastRank,  // LazyLLM on KV-Runahead's last rank: not measured
  KvPrediction,      // the trained predictor's: not modelled
};

struct CompareRow {
  std::string method;  // "LazyLLM + TP 8"
  std::string family;  // the chart's series: "LazyLLM + tensor parallelism"
  int devices = 1;
  double ttft_s = 0, memory_bytes = 0;  // memory: per device, the fullest one
  double speedup = 0;                   // the plain prefill's TTFT over this one's
  bool fits = true;                     // memory_bytes within a device's capacity
  CompareAccuracy accuracy = CompareAccuracy::Exact;
  size_t schedule = 0;   // CompareAccuracy::Schedule: the option's schedule index
  std::string note;      // the partition's chunks, or why a method was refused
  bool refused = false;  // the method cannot run here (note says why); no times
};
struct CompareTable {
  int64_t prompt_tokens = 0;
  std::vector<CompareRow> rows;  // the plain prefill first
};
struct Comparison {
  std::string tp_refused;            // why tensor parallelism over the devices cannot run, or ""
  std::vector<CompareTable> tables;  // one per prompt length, in the options' order
};

Comparison compare_methods(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                           const CompareOptions& o);

}  // namespace lp::sim
