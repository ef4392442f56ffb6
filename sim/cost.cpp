#include "sim/cost.h"

#include <algorithm>
#include <cstdlib>

#include "model/error.h"

namespace lp::sim {

double dtype_bytes(const std::string& dtype, const char* what) {
  if (dtype == "f32") return 4;
  if (dtype == "bf16" || dtype == "f16") return 2;
  if (dtype == "int8" || dtype == "fp8") return 1;
  if (dtype == "q4" || dtype == "fp4") return 4.5 / 8;  // Q4_0; NVFP4's fp8 scale per 16
  if (dtype == "mxfp4") return 4.25 / 8;                // an e8m0 scale per 32
  if (dtype.size() > 3 && dtype.ends_with("bpw")) {
    const std::string num = dtype.substr(0, dtype.size() - 3);
    char* end = nullptr;
    const double bits = std::strtod(num.c_str(), &end);
    if (end == num.c_str() + num.size() && bits > 0 && bits <= 32) return bits / 8;
  }
  fail("{} dtype must be one of f32, bf16, f16, int8, fp8, fp4, mxfp4, q4 or <bits>bpw; got '{}'", what,
       dtype);
}

void validate(const Precision& p) {
  dtype_bytes(p.weights, "weight");
  if (!p.expert_weights.empty()) dtype_bytes(p.expert_weights, "expert weight");
  if (p.kv != "f32" && p.kv != "bf16" && p.kv != "f16" && p.kv != "int8" && p.kv != "fp8")
    fail("KV dtype must be one of f32, bf16, f16, int8, fp8; got '{}'", p.kv);
  if (p.compute != "f32" && p.compute != "tf32" && p.compute != "bf16" && p.compute != "f16" &&
      p.compute != "int8" && p.compute != "fp8" && p.compute != "fp4")
    fail("compute dtype must be one of f32, tf32, bf16, f16, int8, fp8, fp4; got '{}'", p.compute);
}

OpDtypes Precision::op_dtypes() const {
  OpDtypes d;
  d.weight_bytes = dtype_bytes(weights, "weight");
  d.expert_weight_bytes =
      expert_weights.empty() ? d.weight_bytes : dtype_bytes(expert_weights, "expert weight");
  // GEMM inputs: f32/tf32 4 bytes; 8-bit GEMMs (int8 W8A8, fp8) read 8-bit activations; else 16-bit.
  d.act_bytes = compute == "f32" || compute == "tf32"   ? 4
                : compute == "fp8" || compute == "int8" ? 1
                : compute == "fp4"                      ? 4.5 / 8
                                                        : 2;
  // Between ops: the compute dtype's 16-bit (or f32) activations; see CostContext for engines.
  d.elem_bytes = 4;
  d.kv_bytes = dtype_bytes(kv, "KV");
  return d;
}

void OpCost::add(const OpCost& o) {
  flops += o.flops;
  bytes += o.bytes;
  compute_s += o.compute_s;
  memory_s += o.memory_s;
  overhead_s += o.overhead_s;
  time_s += o.time_s;
  calls += o.calls;
}

namespace {
// The peak an op runs at: its family's dtype (hw::family_dtype) for the compute dtype.
double op_peak(const hw::Profile& hw, Op op, const Precision& p) {
  return hw.peak(hw::family_dtype(op_family(op), p.compute, p.kv));
}
}  // namespace

CostContext::CostContext(const hw::Profile& hw, const Precision& p)
    : bandwidth(hw.memory_bandwidth), dtypes(p.op_dtypes()), engine(hw.engine) {
  // An engine that keeps activations at the compute dtype keeps them 16-bit for 8-bit compute.
  if (engine.elementwise_at_compute) dtypes.elem_bytes = p.compute == "f32" || p.compute == "tf32" ? 4 : 2;
  for (int f = 0; f < hw::kNumFamilies; ++f) {
    const hw::Family fam = hw::Family(f);
    const std::string dtype = hw::family_dtype(fam, p.compute, p.kv);
    peak[size_t(f)] = hw.peak(dtype);
    eff[size_t(f)] = hw.eff(fam);
    eff[size_t(f)].compute = hw.eff(fam).compute_for(dtype);
  }
  const hw::Efficiency& attn = hw.eff(hw::Family::Attention);
  decode_attention_own = attn.decode_compute > 0;
  decode_attention = eff[size_t(hw::Family::Attention)];
  if (decode_attention_own) {
    decode_attention.compute = attn.decode_compute;
    decode_attention.half_rows = 0;
  }
  listed_attention_own = attn.prices_listed();
}

OpCost listed_attention_cost(const CostContext& cc, const ModelConfig& c, int64_t rows, int64_t row_keys,
                             int64_t held, int64_t calls) {
  OpCost r;
  if (!cc.listed_attention_own || rows <= 0 || calls <= 0) return r;
  const OpShape s{rows, row_keys, held};
  const size_t f = size_t(hw::Family::Attention);
  const hw::Efficiency& e = cc.eff[f];
  r.calls = calls;
  r.flops = op_flops(c, Op::Attention, s);
  r.bytes = op_bytes(c, Op::Attention, s, cc.dtypes);
  r.compute_s = r.flops / (cc.peak[f] * e.listed_compute);
  r.memory_s = r.bytes / (cc.bandwidth * e.listed_memory);
  r.overhead_s = double(calls) * e.overhead_s;
  r.time_s = r.compute_s + r.memory_s + r.overhead_s;
  return r;
}

OpCost op_cost(const hw::Profile& hw, const ModelConfig& c, Op op, const OpShape& s, const Precision& p,
               int64_t calls) {
  return op_cost(CostContext(hw, p), c, op, s, calls);
}

OpCost gemm_cost(const CostContext& cc, int64_t rows, int64_t k, int64_t n) {
  OpCost r;
  if (rows <= 0 || k <= 0 || n <= 0) return r;
  const size_t f = size_t(hw::Family::Gemm);
  const double R = double(rows), K = double(k), N = double(n);
  r.calls = 1;
  r.flops = 2 * R * K * N;
  r.bytes = K * N * cc.dtypes.weight_bytes + R * (K + N) * cc.dtypes.kv_bytes;
  detail::roofline(r, cc.peak[f], cc.bandwidth, cc.eff[f], R, 1);
  return r;
}

double utilisation(const hw::Profile& hw, Op op, const OpCost& cost, const Precision& p) {
  return cost.time_s > 0 ? cost.flops / cost.time_s / op_peak(hw, op, p) : 0;
}

}  // namespace lp::sim
