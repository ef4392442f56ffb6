#include "model/ops.h"

namespace lp {

std::string_view op_name(Op op) {
  static constexpr std::array<std::string_view, kNumOps> names = {
      "embed",   "attn_norm", "qkv",       "qk_norm", "rope",        "attention", "score",
      "select",  "o_proj",    "ffn_norm",  "gate_up", "swiglu",      "down",      "router",
      "experts", "residual",  "post_norm", "gather",  "output_norm", "lm_head"};
  static_assert(names.back() == "lm_head" && names.size() == size_t(Op::LmHead) + 1);
  return names[static_cast<int>(op)];
}

int op_calls_per_layer(Op op) {
  return op == Op::Residual || op == Op::PostNorm ? 2 : 1;
}

bool op_is_per_layer(Op op) {
  return op != Op::Embed && op != Op::OutputNorm && op != Op::LmHead;
}

double prefill_flops(const ModelConfig& c, int64_t T, int64_t logit_rows) {
  double total = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const ModelConfig lc = c.uniform() ? c : c.layer(l);
    const OpShape s{T, c.dense_pairs(l, T), T};
    for (int i = 0; i < kNumOps; ++i) {
      const Op op = static_cast<Op>(i);
      if (op_is_per_layer(op) && op != Op::Score && op != Op::Select && op != Op::Gather)
        total += op_flops(lc, op, s) * op_calls_per_layer(op);
    }
  }
  OpShape head{logit_rows, 0, 0};
  total += op_flops(c, Op::OutputNorm, head) + op_flops(c, Op::LmHead, head);
  return total;
}

}  // namespace lp
