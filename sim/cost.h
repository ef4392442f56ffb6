// The per-op cost model: FLOPs and bytes from the shared op_flops / op_bytes (model/ops.h, the
// counting the engine's timers use), time from a roofline with per-family efficiencies (the
// hardware profile, hwmodels/) plus a per-call overhead:
//
//   compute_s = F / (peak(dtype) * e.compute * R / (R + e.half_rows))
//   memory_s  = B / (bandwidth * e.memory)
//   time_s    = max(compute_s, memory_s) + calls * e.overhead_s
//
// where R is the op's row count (tokens; 1 for the score row), e the op family's efficiency and
// dtype the family's (hw::family_dtype: GEMMs at the compute dtype, attention at f16 under int8
// compute, the rest at f32); e.compute is the family's share for that dtype (compute_for).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/ops.h"

namespace lp::sim {

inline hw::Family op_family(Op op) {
  switch (op) {
    case Op::QKV:
    case Op::OProj:
    case Op::GateUp:
    case Op::Down:
    case Op::Router:
    case Op::LmHead:
      return hw::Family::Gemm;
    case Op::Experts:
      return hw::Family::Experts;
    case Op::Attention:
    case Op::Score:
      return hw::Family::Attention;
    case Op::Select:
    case Op::Gather:
    case Op::Embed:
      return hw::Family::DataMovement;
    default:
      return hw::Family::Elementwise;
  }
}

// Element types of a simulated deployment. Weights may be quantized (bytes per weight below 2);
// GEMMs then still compute in `compute` (weight-only quantization).
struct Precision {
  // {weights, compute, kv} or with the experts' type too; every field has its default.
  Precision() = default;
  Precision(std::string w, std::string c, std::string k, std::string experts = {})
      : weights(std::move(w)), compute(std::move(c)), kv(std::move(k)), expert_weights(std::move(experts)) {}
  // bf16 | f16 | f32 | int8 | fp8 | fp4 (NVFP4: 4 bits and an fp8 scale per 16, 4.5 bits) | mxfp4
  // (OCP MX: an e8m0 scale per 32, 4.25 bits) | q4 (4.5 bits per weight, as Q4_0) | "<bits>bpw"
  // (any bits per weight, e.g. "4.5625bpw" for a llama.cpp Q4_1 file: what a quantized file holds)
  std::string weights = "bf16";
  std::string compute =
      "bf16";               // the peak_tflops dtype GEMMs and attention run at (fp8, fp4 need their peak)
  std::string kv = "bf16";  // bf16 | f16 | f32 | int8 | fp8
  // The routed and shared experts' weights when they differ (gpt-oss ships its experts in MXFP4
  // and the rest in bf16); empty: `weights`.
  std::string expert_weights;
  OpDtypes op_dtypes() const;
};
// "bf16", "f16", "f32", "int8", "fp8", "fp4", "mxfp4", "q4", "<bits>bpw" (0 < bits <= 32) -> bytes per
// element; anything else throws lp::Error.
double dtype_bytes(const std::string& dtype, const char* what);
// Checks the names; throws lp::Error naming the bad one.
void validate(const Precision& p);

struct OpCost {
  double flops = 0, bytes = 0;
  double compute_s = 0, memory_s = 0, overhead_s = 0, time_s = 0;
  int64_t calls = 0;
  bool memory_bound() const { return memory_s > compute_s; }
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }  // FLOP per byte
  void add(const OpCost& o);
};
using OpCosts = std::array<OpCost, kNumOps>;

// A profile and precision resolved once for many op_cost calls (replay runs millions of them):
// peak FLOP/s, efficiency and element sizes looked up ahead.
struct CostContext {
  CostContext(const hw::Profile& hw, const Precision& p);
  std::array<double, hw::kNumFamilies> peak{};  // FLOP/s each family runs at
  std::array<hw::Efficiency, hw::kNumFamilies> eff{};
  // Attention over decoding rows, when the profile gives it a share of its own
  // (Efficiency::decode_compute): attention's efficiency with that share as `compute`.
  bool decode_attention_own = false;
  hw::Efficiency decode_attention;
  // Decoding rows over a listed key set priced apart (Efficiency::prices_listed, at the attention
  // family's listed shares in `eff`): listed_attention_cost.
  bool listed_attention_own = false;
  double bandwidth = 0;
  OpDtypes dtypes;    // elem_bytes per the profile's engine
  hw::Engine engine;  // which elementwise ops are fused
};

namespace detail {
// The roofline of sim/cost.h on r's flops and bytes: compute, memory and `launches` overheads.
inline void roofline(OpCost& r, double peak, double bandwidth, const hw::Efficiency& e, double rows,
                     double launches) {
  r.compute_s = r.flops > 0 ? r.flops / (peak * e.compute * rows / (rows + e.half_rows)) : 0;
  r.memory_s = r.bytes / (bandwidth * e.memory);
  r.overhead_s = launches * e.overhead_s;
  r.time_s = std::max(r.compute_s, r.memory_s) + r.overhead_s;
}
}  // namespace detail

// Cost of `calls` invocations of `op` with shape `s` on a layer shaped `c` (ModelConfig::layer).
// `decoding`: the rows are decoding rows, which attention prices at cc.decode_attention when the
// profile has one. Inline, as op_flops and op_bytes are: the serving simulation prices millions
// of iterations, and with the op known at the call site its branches fold away.
[[gnu::always_inline]] inline OpCost op_cost(const CostContext& cc, const ModelConfig& c, Op op,
                                             const OpShape& s, int64_t calls = 1, bool decoding = false) {
  OpCost r;
  if (calls <= 0) return r;
  const size_t f = size_t(op_family(op));
  const hw::Efficiency& e = decoding && op == Op::Attention ? cc.decode_attention : cc.eff[f];
  r.calls = calls;
  r.flops = op_flops(c, op, s) * double(calls);
  // Ops the engine fuses into a neighbour cost no time of their own (their FLOPs still count).
  if ((op == Op::Rope && cc.engine.fuse_rope) || (op == Op::SwiGLU && cc.engine.fuse_swiglu)) return r;
  r.bytes = op_bytes(c, op, s, cc.dtypes) * double(calls);
  const double T = double(s.tokens), el = cc.dtypes.elem_bytes;
  bool launched = true;
  if (op == Op::Residual && cc.engine.fuse_add_rmsnorm) {
    // Fused into the RMSNorm after it: the sum is written but never read back (2 passes of 3),
    // in the norm's kernel.
    r.bytes -= T * double(c.n_embd) * el * double(calls);
    launched = false;
  }
  if (op == Op::GateUp && cc.engine.fuse_swiglu)  // the epilogue writes F columns, not 2F
    r.bytes -= T * double(c.n_ff) * el * double(calls);
  // The rows a GEMM's tiles fill: an expert GEMM runs over the pairs routed to that expert, the
  // mean of which is the routed pairs over the experts they reach (what a grouped GEMM fills).
  const double rows = op == Op::Score ? 1.0
                      : op == Op::Experts
                          ? std::max(1.0, (s.routed > 0 ? s.routed : routed_pairs(c, s.tokens)) /
                                              std::max(1.0, s.experts > 0 ? double(s.experts)
                                                                          : expected_experts(c, s.tokens)))
                          : double(std::max<int64_t>(s.tokens, 1));
  detail::roofline(r, cc.peak[f], cc.bandwidth, e, rows, launched ? double(calls) : 0.0);
  return r;
}
OpCost op_cost(const hw::Profile& hw, const ModelConfig& c, Op op, const OpShape& s, const Precision& p,
               int64_t calls = 1);

// Attention of `rows` decoding rows over a listed key set of `held` keys, summed over the
// sequences of a layer (`row_keys`: the sum of each sequence's rows x its held keys; `calls`: the
// sequences), as the CPU engine computes it (hwmodels/profile.h, Efficiency::listed_compute):
// F = row_keys pairs' attention FLOPs at listed_compute of the attention peak, B = Q and O of the
// rows and the held K/V read once, at listed_memory of the bandwidth; time = compute_s +
// memory_s + calls x the attention overhead. Zero cost when the profile has no listed shares.
OpCost listed_attention_cost(const CostContext& cc, const ModelConfig& c, int64_t rows, int64_t row_keys,
                             int64_t held, int64_t calls = 1);

// A GEMM outside the model's op list (KV Prediction's per-layer linear maps, sim/kv_predict.h):
// `rows` x `k` by `k` x `n` weights, reading its input from and writing its output to K/V caches
// (kv_bytes each), at the GEMM family's efficiency: F = 2 rows k n, B = k n weight_bytes +
// rows (k + n) kv_bytes, one call.
OpCost gemm_cost(const CostContext& cc, int64_t rows, int64_t k, int64_t n);

// The weights' memory: n_params at the weight dtype, the experts' at theirs (Precision::expert_weights);
// and layer l's share of it.
inline double layer_weight_bytes(const ModelConfig& c, int l, const OpDtypes& d) {
  const double experts = double(c.layer_expert_params(l));
  return (double(c.layer_params(l)) - experts) * d.weight_bytes + experts * d.experts_bytes();
}
inline double weight_memory_bytes(const ModelConfig& c, const OpDtypes& d) {
  const double experts = double(c.n_expert_params());
  return (double(c.n_params()) - experts) * d.weight_bytes + experts * d.experts_bytes();
}

// FLOP/s the op achieved against the peak it runs at: flops / time / peak.
double utilisation(const hw::Profile& hw, Op op, const OpCost& cost, const Precision& p);

}  // namespace lp::sim
