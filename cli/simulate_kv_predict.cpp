// `lazyprefill simulate --kv-predict AUX`: KV Prediction's TTFT and memory (sim/kv_predict.h) per
// hardware profile, against the base model's own prefill.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "sim/kv_predict.h"
#include "sim/simulate.h"

namespace lp::cli {

using json = nlohmann::ordered_json;

int cmd_simulate_kv_predict(const SimulateArgs& a) {
  if (a.prompt_tokens <= 0) usage_fail("--kv-predict needs --prompt-tokens N");
  if (!a.prune.empty() && a.prune != "none")
    usage_fail(
        "--kv-predict predicts the unpruned base with a predicted cache; LazyLLM with it is not simulated");
  if (a.tp != 1) usage_fail("--kv-predict runs on one device; drop --tp");
  std::string base_name;
  const ModelConfig base = sim::model_to_cost(a.model, a.model_config, &base_name);
  const ModelConfig aux = preset_config(a.kv_predict);
  for_option("--kv-predict", [&] { sim::check_kv_predict_pair(base, base_name, aux, a.kv_predict); });
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const int64_t N = a.prompt_tokens;

  json out;
  out["tool"] = "lazyprefill simulate --kv-predict";
  out["model"] = base_name;
  out["auxiliary"] = a.kv_predict;
  out["prompt_tokens"] = N;
  out["accuracy"] = sim::kv_predict_accuracy_note();
  json results = json::array();
  std::string text;
  for (const hw::Profile& hw : load_profiles(a.hw, a.engine)) {
    const sim::KvPredictPrediction r = sim::predict_kv_prediction(base, aux, hw, prec, N);
    const double mem = r.memory.total();
    results.push_back({{"hw", hw.name},
                       {"ttft_ms", r.ttft_s * 1e3},
                       {"aux_prefill_ms", r.aux_prefill_s * 1e3},
                       {"predictor_ms", r.predictor_s * 1e3},
                       {"base_first_token_ms", r.base_token_s * 1e3},
                       {"baseline_ttft_ms", r.baseline_ttft_s * 1e3},
                       {"speedup", r.baseline_ttft_s / r.ttft_s},
                       {"predictor_gflop", r.predictor_flops / 1e9},
                       {"predictor_weights_mib", r.predictor_weight_bytes / (1 << 20)},
                       {"layer_map", r.layer_map},
                       {"memory_bytes", r.memory.to_json()},
                       {"fits_in_memory", mem <= hw.memory_capacity}});
    text += fmt::format(
        "{}: KV Prediction, base {} with auxiliary {}, {} tokens: TTFT {:.1f} ms (auxiliary prefill {:.1f}, "
        "predictor {:.1f}, base's first token {:.1f}) against {:.1f} ms for the base alone ({:.2f}x); memory "
        "{:.2f} GiB{}\n",
        hw.name, base_name, a.kv_predict, N, r.ttft_s * 1e3, r.aux_prefill_s * 1e3, r.predictor_s * 1e3,
        r.base_token_s * 1e3, r.baseline_ttft_s * 1e3, r.baseline_ttft_s / r.ttft_s, mem / (1 << 30),
        mem <= hw.memory_capacity ? "" : " (does not fit)");
  }
  out["results"] = std::move(results);
  if (a.json_out)
    fmt::print("{}\n", out.dump(2));
  else
    fmt::print("{}{}\n", text, sim::kv_predict_accuracy_note());
  return 0;
}

}  // namespace lp::cli
