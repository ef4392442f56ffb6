// `compare`'s rows: every way this tool knows to cut time to first token, side by side, for one
// model on one kind of device at several prompt lengths: the plain prefill on one device, LazyLLM
// (each schedule), tensor parallelism over P devices with and without LazyLLM, KV-Runahead over P
// devices with and without LazyLLM on its last rank (sim/runahead.h), and KV Prediction with an
// auxiliary model (sim/kv_predict.h). Per method: TTFT, speedup over the plain prefill, devices,
// memory per device and whether it fits, and what is known of its accuracy.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
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
  size_t schedule = 0;        // CompareAccuracy::Schedule: the option's schedule index
  std::string note;           // the partition's chunks, or why a method was refused
  bool refused = false;       // the method cannot run here (note says why); no times
  std::string accuracy_note;  // what is known of its accuracy, in words (compare() fills it)
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

// `lazyprefill compare` as one call (the CLI and the Python module's compare): the options with
// the CLI's defaults in, the comparison with each row's accuracy in words out. The ranges are
// checked here (lp::UsageError naming the CLI's flag), so both front ends refuse in the same words.
struct CompareRequest {
  std::string model, model_config;    // a GGUF file's shape, or a preset or configuration file
  std::optional<ModelConfig> config;  // or the model itself (the Python module's Model)
  std::vector<hw::Profile> hws;       // exactly one
  Precision precision;
  int devices = 8;
  std::vector<int64_t> prompt_tokens = {8192, 32768, 131072};
  std::vector<std::string> schedules;  // LazyLLM's; empty: the default one
  std::string kv_predict;              // KV Prediction's auxiliary preset; "": left out
  std::string eval;                    // an `eval --json` output giving the schedules' accuracy
};

struct CompareReport {
  std::string model;
  hw::Profile hw;
  Precision precision;
  int devices = 8;
  std::string combined_schedule;  // the first schedule, combined with the parallel methods
  bool kv_predict = false;
  Comparison comparison;
  // `compare --json`'s document; `chart` the chart's file where the CLI wrote one.
  nlohmann::ordered_json to_json(const std::string& chart = "") const;
};

CompareReport compare(const CompareRequest& r);

}  // namespace lp::sim
