// KV Prediction (arXiv 2410.08391; code in apple/corenet, projects/kv-prediction) in the
// simulator: a small auxiliary model runs the prompt's prefill, per-layer learned linear maps
// predict the base model's K/V from the auxiliary model's, and the base model computes only the
// prompt's last token over the predicted cache, which gives the first token. Priced here:
//
//   TTFT = aux prefill (without its LM head: the auxiliary model's logits are not used)
//        + for each base layer l, the linear maps of aux layer a(l)'s K and V to base layer l's,
//          over the prompt's rows (two GEMMs: N x kv_aux by kv_aux x kv_base)
//        + the base model's one row at position N - 1 over N keys at every layer, and its LM head
//
// with a(l) = floor(l * L_aux / L_base) (corenet's published configurations map the base's layers
// onto the auxiliary's in order, some auxiliary layers feeding two base layers). Accuracy is not
// modelled: it depends on the trained predictor, which is not available.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"
#include "sim/replay.h"

namespace lp::sim {

struct KvPredictPrediction {
  double aux_prefill_s = 0, predictor_s = 0, base_token_s = 0;
  double ttft_s = 0;           // their sum
  double baseline_ttft_s = 0;  // the base model's own prefill
  double predictor_flops = 0, predictor_weight_bytes = 0;
  std::vector<int> layer_map;  // [base layer] = the auxiliary layer it is predicted from
  // Peak: both models' weights and the predictor's, both K/V caches (the auxiliary's is read by
  // the predictor while the base's is written), the auxiliary prefill's activations.
  Memory memory;
};

// a(l) for each of `base_layers` layers; throws lp::Error when aux_layers is not in
// [1, base_layers].
std::vector<int> kv_predict_layer_map(int base_layers, int aux_layers);

// Refuses, with lp::UsageError naming both, an auxiliary model that cannot pair with the base:
// another vocabulary size (the two must share a tokenizer), more layers than the base (each base
// layer is predicted from one auxiliary layer), or no fewer parameters.
void check_kv_predict_pair(const ModelConfig& base, const std::string& base_name, const ModelConfig& aux,
                           const std::string& aux_name);

KvPredictPrediction predict_kv_prediction(const ModelConfig& base, const ModelConfig& aux,
                                          const hw::Profile& hw, const Precision& p, int64_t prompt_tokens);

// What the paper reports on accuracy, for outputs that must say accuracy is not modelled.
const char* kv_predict_accuracy_note();

}  // namespace lp::sim
