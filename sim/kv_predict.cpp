#include "sim/kv_predict.h"

#include <algorithm>

#include "model/error.h"
#include "sim/layer_cost.h"

namespace lp::sim {

std::vector<int> kv_predict_layer_map(int base_layers, int aux_layers) {
  if (aux_layers < 1 || aux_layers > base_layers)
    fail("an auxiliary model of {} layers cannot feed a base of {}: it needs 1 to {} layers", aux_layers,
         base_layers, base_layers);
  std::vector<int> map(static_cast<size_t>(base_layers));
  for (int l = 0; l < base_layers; ++l) map[size_t(l)] = int(int64_t(l) * aux_layers / base_layers);
  return map;
}

void check_kv_predict_pair(const ModelConfig& base, const std::string& base_name, const ModelConfig& aux,
                           const std::string& aux_name) {
  if (aux.n_vocab != base.n_vocab)
    usage_fail(
        "auxiliary model {}: its vocabulary ({} tokens) is not the base {}'s ({}): the two models must share "
        "a tokenizer",
        aux_name, aux.n_vocab, base_name, base.n_vocab);
  if (aux.n_layer > base.n_layer)
    usage_fail(
        "auxiliary model {}: it has {} layers, more than the base {}'s {} (each base layer is predicted from "
        "one auxiliary layer)",
        aux_name, aux.n_layer, base_name, base.n_layer);
  if (aux.n_params() >= base.n_params())
    usage_fail("auxiliary model {}: {} parameters, not fewer than the base {}'s {}: not an auxiliary model",
               aux_name, aux.n_params(), base_name, base.n_params());
}

KvPredictPrediction predict_kv_prediction(const ModelConfig& base, const ModelConfig& aux,
                                          const hw::Profile& hw, const Precision& p, int64_t n) {
  if (n < 1) fail("KV Prediction needs a prompt of at least 1 token");
  KvPredictPrediction r;
  r.layer_map = kv_predict_layer_map(base.n_layer, aux.n_layer);
  const CostContext cc(hw, p);
  const auto layer = [](const ModelConfig& c, int l) { return c.uniform() ? c : c.layer(l); };

  // The auxiliary prefill, its LM head left out.
  const Prediction a = replay_synthetic(aux, "none", {}, n, 0, {}, hw, p);
  r.aux_prefill_s =
      a.ttft_s - a.prefill_ops[size_t(Op::OutputNorm)].time_s - a.prefill_ops[size_t(Op::LmHead)].time_s;

  // The predictor: K and V of each base layer from its auxiliary layer's.
  for (int l = 0; l < base.n_layer; ++l) {
    const int64_t kv_a = layer(aux, r.layer_map[size_t(l)]).kv_dim(), kv_b = layer(base, l).kv_dim();
    for (int kv = 0; kv < 2; ++kv) {
      const OpCost g = gemm_cost(cc, n, kv_a, kv_b);
      r.predictor_s += g.time_s;
      r.predictor_flops += g.flops;
    }
    r.predictor_weight_bytes += 2.0 * double(kv_a) * double(kv_b) * cc.dtypes.weight_bytes;
  }

  // The base model's last prompt token over the predicted cache: one decoding row at every layer.
  const auto add = [&](Op, const OpCost& oc) { r.base_token_s += oc.time_s; };
  const auto comm = [&](const OpCost& oc) { r.base_token_s += oc.time_s; };
  cost_embed(cc, hw, 1, base, 1, double(base.n_embd), add, comm);
  for (int l = 0; l < base.n_layer; ++l) {
    LayerWork w{1, n, n};
    w.decode_rows = 1, w.decode_pairs = n, w.decode_keys = n;
    cost_layer(cc, hw, 1, layer(base, l), double(base.n_embd), w, add, comm);
  }
  cost_head(cc, hw, 1, base, 1, double(base.n_vocab), add, comm);
  r.ttft_s = r.aux_prefill_s + r.predictor_s + r.base_token_s;
  r.baseline_ttft_s = replay_synthetic(base, "none", {}, n, 0, {}, hw, p).ttft_s;

  // Memory at the peak: the predictor reads the auxiliary K/V and writes the base's.
  double kv_tok = 0;
  for (const ModelConfig* m : {&base, &aux})
    for (int l = 0; l < m->n_layer; ++l) kv_tok += 2.0 * double(layer(*m, l).kv_dim()) * cc.dtypes.kv_bytes;
  r.memory.weights =
      weight_memory_bytes(base, cc.dtypes) + weight_memory_bytes(aux, cc.dtypes) + r.predictor_weight_bytes;
  r.memory.kv = double(n) * kv_tok;
  r.memory.activations = a.memory.activations;
  return r;
}

const char* kv_predict_accuracy_note() {
  return "accuracy not modelled: it depends on the trained predictor. The paper (arXiv 2410.08391) reports, "
         "for "
         "OpenELM-1.1B and OpenELM-3B bases with smaller OpenELM or layer-pruned auxiliary models, relative "
         "accuracy improvements of 15-50% on TriviaQA over baselines at equal TTFT FLOPs budgets, and up to "
         "30% on "
         "HumanEval; the predicted cache is approximate, so the base model's accuracy is below its own";
}

}  // namespace lp::sim
