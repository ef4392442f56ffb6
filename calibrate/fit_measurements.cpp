#include "calibrate/fit_measurements.h"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <boost/math/distributions/fisher_f.hpp>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>

#include "calibrate/bobyqa.h"
#include "model/error.h"
#include "model/presets.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "sim/replay.h"
#include "traces/synthetic.h"

namespace lp::calib {

using namespace sim;
namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Lower case, '_' and ' ' as '-', runs of '-' collapsed, no '-' at either end.
std::string dashed(const std::string& s) {
  std::string out;
  for (char ch : lower(s)) {
    if (ch == '_' || ch == ' ') ch = '-';
    if (ch == '-' && (out.empty() || out.back() == '-')) continue;
    out += ch;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

std::string model_key(std::string s) {
  if (const size_t slash = s.find_last_of('/'); slash != std::string::npos) s.erase(0, slash + 1);
  s = dashed(s);
  if (s.ends_with(".gguf")) s.resize(s.size() - 5);
  if (s.starts_with("meta-")) s.erase(0, 5);
  return s;
}

double mape(const std::vector<Point>& pts, const std::vector<double>& pred, bool ttft, int* count) {
  double sum = 0;
  int n = 0;
  for (size_t i = 0; i < pts.size(); ++i)
    if (pts[i].ttft == ttft) {
      sum += std::fabs(pred[i] / pts[i].measured_s - 1);
      ++n;
    }
  if (count) *count = n;
  return n ? sum / n : std::numeric_limits<double>::quiet_NaN();
}

// A parameter is identified when a 10% change of it moves the predictions by at least 0.5% RMS
// in a way the parameters accepted before it cannot reproduce.
constexpr double kMinElasticity = 0.05;
// F-to-enter of forward stepwise regression: the drop in the squared log error a parameter brings,
// over the remaining error per degree of freedom. A parameter asked for with --fit needs only to
// pay for itself: F >= 2, about Akaike's criterion.
constexpr double kMinRequestedF = 2;

// Any other must reach the 5% point of F(k, dof) (f_to_enter).

// Bounds of each parameter (in its own unit): shares of a peak, or microseconds.
std::pair<double, double> bounds(const std::string& name) {
  if (name == "overhead_us") return {0.01, 5000};
  if (name == "gemm.half_rows" || name == "attention.half_rows") return {0.01, 4096};
  if (name == "pruning.stage_us") return {0.01, 1e5};
  if (name == "pruning.key_ns") return {0.01, 1e6};
  return {0.01, 1};
}

// Where a parameter's fit starts and what its base-unit elasticity is measured against: its base
// value, or, for a cost the base leaves at 0 (a profile without pruning.key_ns), a typical one
// (this CPU engine's one-row score and top-k: about 80 ns a key each), so that the parameter can
// show the effect it would have.
double start_value(const hw::Profile& base, const std::string& name) {
  const double v = get_param(base, name);
  if (name == "pruning.key_ns" && v <= 0) return 100;
  return std::max(v, bounds(name).first);
}

}  // namespace

std::optional<std::string> match_preset(const std::string& file_name,
                                        const std::map<std::string, std::string>& map) {
  if (const auto it = map.find(file_name); it != map.end()) return it->second;
  const std::string key = model_key(file_name);
  std::optional<std::string> best;
  for (const std::string& p : preset_names()) {
    const bool match = key == p || (key.size() > p.size() && key.starts_with(p) &&
                                    (key[p.size()] == '-' || key[p.size()] == '.'));
    if (match && (!best || p.size() > best->size())) best = p;  // the most specific
  }
  return best;
}

std::optional<std::string> match_profile(const std::string& file_name,
                                         const std::map<std::string, std::string>& map) {
  if (const auto it = map.find(file_name); it != map.end()) return it->second;
  const std::string key = dashed(file_name);
  for (const std::string& name : hw::builtin_profile_names()) {
    if (dashed(name) == key) return name;
    for (const std::string& alias : hw::load_profile(name).aliases)
      if (dashed(alias) == key) return name;
  }
  return std::nullopt;
}

namespace {
// llama.cpp's file-type names as llama-bench prints them in model_type (llama_ftype_name in
// src/llama-model-loader.cpp, llama.cpp 0c1e57098, build b11312) and the bits per weight of the
// type: from the names where they say ("IQ2_XXS - 2.0625 bpw"), else from ggml's block layouts
// (Q4_0: 32 weights in 18 bytes = 4.5; Q4_1 20 bytes = 5.0; Q5_0 5.5; Q5_1 6.0; Q8_0 34 bytes =
// 8.5; K-quants per 256 weights: Q2_K 84 bytes = 2.625, Q3_K 110 = 3.4375, Q4_K 144 = 4.5, Q5_K
// 176 = 5.5, Q6_K 210 = 6.5625; MXFP4 17 bytes per 32 = 4.25; NVFP4 9 bytes per 16 = 4.5). The
// K-quant mixes (Small/Medium/Large) keep some tensors at a larger type, so their files average a
// little more; llama-bench's model_size / model_n_params gives the exact figure, which the
// importer records and calibrate prefers. Q1_0 and Q2_0 (new 32-weight block types) are taken by
// analogy with Q4_0 (one f16 scale per 32 weights): 1.5 and 2.5, not checked against ggml.
// Quantized weights compute in int8: llama.cpp quantizes the activations to 8 bits per block (q8_0,
// q8_1, q8_K) and multiplies with integer dot products, on CPUs (ggml's vec_dot_*_q8_* with
// AVX2/AVX-512 VNNI) and on GPUs (the MMQ kernels, its default for quantized types); attention
// stays f16 over its f16 KV cache (hw::family_dtype).
struct LlamaFtype {
  const char* name;
  double bits;  // 0: a float type, below
};
constexpr LlamaFtype kLlamaFtypes[] = {
    {"all F32", 0},
    {"F16", 0},
    {"BF16", 0},
    {"Q1_0", 1.5},
    {"Q2_0", 2.5},
    {"Q4_0", 4.5},
    {"Q4_1", 5.0},
    {"Q5_0", 5.5},
    {"Q5_1", 6.0},
    {"Q8_0", 8.5},
    {"MXFP4 MoE", 4.25},
    {"NVFP4", 4.5},
    {"Q2_K - Medium", 2.625},
    {"Q2_K - Small", 2.625},
    {"Q3_K - Small", 3.4375},
    {"Q3_K - Medium", 3.4375},
    {"Q3_K - Large", 3.4375},
    {"Q4_K - Small", 4.5},
    {"Q4_K - Medium", 4.5},
    {"Q5_K - Small", 5.5},
    {"Q5_K - Medium", 5.5},
    {"Q6_K", 6.5625},
    {"TQ1_0 - 1.69 bpw ternary", 1.69},
    {"TQ2_0 - 2.06 bpw ternary", 2.06},
    {"IQ2_XXS - 2.0625 bpw", 2.0625},
    {"IQ2_XS - 2.3125 bpw", 2.3125},
    {"IQ2_S - 2.5 bpw", 2.5},
    {"IQ2_M - 2.7 bpw", 2.7},
    {"IQ3_XS - 3.3 bpw", 3.3},
    {"IQ3_XXS - 3.0625 bpw", 3.0625},
    {"IQ1_S - 1.5625 bpw", 1.5625},
    {"IQ1_M - 1.75 bpw", 1.75},
    {"IQ4_NL - 4.5 bpw", 4.5},
    {"IQ4_XS - 4.25 bpw", 4.25},
    {"IQ3_S - 3.4375 bpw", 3.4375},
    {"IQ3_S mix - 3.66 bpw", 3.66},
};
}  // namespace

std::vector<std::string> llama_ftype_names() {
  std::vector<std::string> v;
  for (const LlamaFtype& t : kLlamaFtypes) v.emplace_back(t.name);
  return v;
}

std::string bpw_dtype(double bits) {
  return fmt::format("{:.6g}bpw", bits);
}

Precision precision_for_dtype(const std::string& dtype_in) {
  std::string dtype = dtype_in;
  // llama.cpp marks a type it guessed from the tensors (old files without general.file_type).
  if (dtype.starts_with("(guessed) ")) dtype.erase(0, 10);
  for (const LlamaFtype& t : kLlamaFtypes)
    if (dashed(dtype) == dashed(t.name)) {
      if (t.bits > 0) return {bpw_dtype(t.bits), "int8", "f16"};
      const std::string w = dashed(t.name) == "all-f32" ? "f32" : dashed(t.name) == "f16" ? "f16" : "bf16";
      return {w, w, "f16"};  // llama.cpp's KV cache is f16 by default
    }
  const std::string d = dashed(dtype);
  Precision p;  // bf16 throughout
  const auto weights = [&](const char* w, const char* compute) {
    p.weights = w;
    p.compute = compute;
    p.kv = "f16";
    return p;
  };
  if (d.empty() || d == "auto" || d == "bf16" || d == "bfloat16") return p;
  if (d == "f16" || d == "fp16" || d == "float16" || d == "half") return {"f16", "f16", "f16"};
  if (d == "f32" || d == "fp32" || d == "float32" || d == "float") return {"f32", "f32", "f32"};
  if (d == "fp8" || d == "fp8-e4m3" || d == "float8") return {"fp8", "fp8", "fp8"};
  if (d == "int8" || d == "w8a8") return {"int8", "int8", "int8"};
  if (d == "q8-0") return weights("int8", "int8");
  if (d.starts_with("q2-k") || d.starts_with("q3-k") || d.starts_with("q4") || d.starts_with("q5") ||
      d.starts_with("q6-k") || d.starts_with("iq4"))
    return weights("q4", "int8");
  if (d == "awq" || d == "gptq" || d == "int4") return weights("q4", "f16");
  fail(
      "unknown weight type '{}' (known: bf16, f16, f32, fp8, int8, awq, gptq, and llama.cpp's file types "
      "such as "
      "'all F32', 'Q8_0', 'Q4_K - Medium', 'IQ2_XXS - 2.0625 bpw'; or give --weights/--compute/--kv)",
      dtype_in);
}

Point make_point(const Measurement& m, const std::string& preset, const ModelConfig& model,
                 const Precision& p) {
  Point pt;
  pt.m = &m;
  pt.preset = preset;
  pt.model = model;
  pt.precision = p;
  pt.ttft = m.ttft_ms.has_value();
  pt.measured_s = (pt.ttft ? *m.ttft_ms : *m.decode_ms_per_token) * 1e-3;
  // "none", or "<policy> <schedule>" as run --json and the CSV write it.
  std::string policy = m.method, sched;
  if (const size_t sp = m.method.find(' '); sp != std::string::npos) {
    policy = m.method.substr(0, sp);
    sched = m.method.substr(sp + 1);
  }
  // Measurements from before the paper's baselines existed name "static" and "random".
  const std::optional<PolicyKind> in_file = policy_in_file(policy);
  if (!in_file)
    fail("{}: record {}: method '{}' is not a pruning method ({})", m.file, m.record, m.method, kPolicyNames);
  const PolicyKind kind = *in_file;
  policy = policy_name(kind);
  std::vector<PruneStep> steps;
  double dropped = 0;
  if (policy != "none") {
    // The schedule decides what a pruned run computes: guessing one would fit the profile to the
    // wrong work.
    if (sched.empty())
      fail(
          "{}: record {}: method '{}' names no schedule; write it as '{} 0.3:0.3,0.6:0.3,0.9:0.3' (the "
          "schedule the "
          "run used)",
          m.file, m.record, m.method, policy);
    try {
      const Schedule s = schedule_from_arg(sched);
      steps = resolve_method(kind, s, model.n_layer, model.global_layers());
      dropped = drop_share(s).value_or(0);
    } catch (const Error& e) {
      fail("{}: record {}: {}", m.file, m.record, e.what());
    }
  }
  // A decode latency is a mean over the output: one step at the middle of it.
  const int64_t prompt =
      pt.ttft ? m.prompt_tokens : std::max<int64_t>(1, m.context_tokens + m.decode_tokens / 2);
  if (model.n_ctx_train > 0 && prompt + (pt.ttft ? 0 : 1) > model.n_ctx_train)
    fail("{}: record {}: {} tokens exceed {}'s context of {}", m.file, m.record, prompt, preset,
         model.n_ctx_train);
  pt.work = trace::synthetic_trace(model, policy, steps, prompt, pt.ttft ? 0 : 1, {}, dropped);
  return pt;
}

double predict_point(const hw::Profile& hw, const Point& pt) {
  const double share = hw::thread_share(hw, pt.m->threads);  // its threads' share of a CPU's cores
  const Prediction r =
      share < 1 ? replay(pt.work, pt.model, hw::share_of(hw, share), pt.precision, pt.m->batch, pt.m->tp)
                : replay(pt.work, pt.model, hw, pt.precision, pt.m->batch, pt.m->tp);
  return pt.ttft ? r.ttft_s : r.decode_step_s.at(0);
}

const std::vector<std::string>& fit_candidates() {
  // The pruning stage's cost per key before its fixed cost: one pruned run fits either equally,
  // and a stage that scores and selects over every active token costs in proportion to them (on
  // lazyprefill's CUDA backend, dense runs and one pruned run priced the other prompts' pruned runs
  // 3-9% off with the fixed cost, the error growing with the prompt).
  static const std::vector<std::string> c = {
      "gemm.compute", "overhead_us",  "attention.compute", "gemm.half_rows",   "attention.half_rows",
      "gemm.memory",  "interconnect", "pruning.key_ns",    "pruning.stage_us", "experts.compute"};
  return c;
}

namespace {
constexpr std::string_view kGemmComputeOf = "gemm.compute.";  // + a compute dtype
}  // namespace

std::vector<std::string> dtype_candidates(const hw::Profile& base, const std::vector<Point>& points) {
  std::map<std::string, int> count;
  for (const Point& pt : points) ++count[pt.precision.compute];
  const hw::Efficiency& gemm = base.eff(hw::Family::Gemm);
  // The dtype gemm.compute stands for: the most frequent one without a share of its own (the
  // first in name order between equals); every other dtype gets its own.
  std::string shared;
  int most = 0;
  for (const auto& [dtype, k] : count)
    if (!gemm.compute_by_dtype.contains(dtype) && k > most) {
      shared = dtype;
      most = k;
    }
  std::vector<std::string> names;
  for (const auto& [dtype, k] : count)
    if (dtype != shared) names.push_back(std::string(kGemmComputeOf) + dtype);
  return names;
}

double get_param(const hw::Profile& p, const std::string& name) {
  if (name == "gemm.compute") return p.eff(hw::Family::Gemm).compute;
  if (name.starts_with(kGemmComputeOf))
    return p.eff(hw::Family::Gemm).compute_for(name.substr(kGemmComputeOf.size()));
  if (name == "attention.compute") return p.eff(hw::Family::Attention).compute;
  if (name == "experts.compute") return p.eff(hw::Family::Experts).compute;  // the GEMMs' until its own
  if (name == "gemm.memory") return p.eff(hw::Family::Gemm).memory;
  if (name == "gemm.half_rows") return p.eff(hw::Family::Gemm).half_rows;
  if (name == "attention.half_rows") return p.eff(hw::Family::Attention).half_rows;
  if (name == "attention.decode_compute") {
    const hw::Efficiency& a = p.eff(hw::Family::Attention);
    return a.decode_compute > 0 ? a.decode_compute : a.compute;
  }
  if (name == "attention.listed_compute") return p.eff(hw::Family::Attention).listed_compute;
  if (name == "attention.listed_memory") return p.eff(hw::Family::Attention).listed_memory;
  if (name == "interconnect") return p.interconnect_efficiency;
  if (name == "pruning.stage_us") return p.pruning_stage_s * 1e6;
  if (name == "pruning.key_ns") return p.pruning_key_s * 1e9;
  if (name == "overhead_us") {  // the mean over the families (the experts' where they have their own)
    double s = 0;
    int n = 0;
    for (int f = 0; f < hw::kNumFamilies; ++f)
      if (hw::Family(f) != hw::Family::Experts || p.experts_own) s += p.efficiency[size_t(f)].overhead_s, ++n;
    return s / n * 1e6;
  }
  usage_fail(
      "unknown parameter '{}' (known: gemm.compute, gemm.compute.<dtype>, overhead_us, attention.compute, "
      "experts.compute, "
      "gemm.half_rows, attention.half_rows, attention.decode_compute, attention.listed_compute, "
      "attention.listed_memory, gemm.memory, interconnect, pruning.stage_us, pruning.key_ns)",
      name);
}

void set_param(hw::Profile& p, const std::string& name, double v) {
  if (name == "gemm.compute")
    p.efficiency[size_t(hw::Family::Gemm)].compute = v;
  else if (name.starts_with(kGemmComputeOf))
    p.efficiency[size_t(hw::Family::Gemm)].compute_by_dtype[name.substr(kGemmComputeOf.size())] = v;
  else if (name == "attention.compute")
    p.efficiency[size_t(hw::Family::Attention)].compute = v;
  else if (name == "experts.compute")
    p.own_experts(), p.efficiency[size_t(hw::Family::Experts)].compute = v;
  else if (name == "gemm.memory")
    p.efficiency[size_t(hw::Family::Gemm)].memory = v;
  else if (name == "gemm.half_rows")
    p.efficiency[size_t(hw::Family::Gemm)].half_rows = v;
  else if (name == "attention.half_rows")
    p.efficiency[size_t(hw::Family::Attention)].half_rows = v;
  else if (name == "attention.decode_compute")
    p.efficiency[size_t(hw::Family::Attention)].decode_compute = v;
  else if (name == "attention.listed_compute")
    p.efficiency[size_t(hw::Family::Attention)].listed_compute = v;
  else if (name == "attention.listed_memory")
    p.efficiency[size_t(hw::Family::Attention)].listed_memory = v;
  else if (name == "interconnect")
    p.interconnect_efficiency = v;
  else if (name == "pruning.stage_us")
    p.pruning_stage_s = v * 1e-6;
  else if (name == "pruning.key_ns")
    p.pruning_key_s = v * 1e-9;
  else if (name == "overhead_us")
    for (hw::Efficiency& e : p.efficiency) e.overhead_s = v * 1e-6;
  else
    get_param(p, name);  // the error
}

namespace {

struct Problem {
  const hw::Profile* base;
  const std::vector<Point>* points;
  std::vector<size_t> use;  // indices of the points to fit
  std::vector<std::string> params;
};

hw::Profile with(const Problem& pr, const double* x) {
  hw::Profile p = *pr.base;
  // experts.compute last: its family starts from the GEMMs' as the others leave them.
  for (int last = 0; last < 2; ++last)
    for (size_t k = 0; k < pr.params.size(); ++k)
      if ((pr.params[k] == "experts.compute") == (last == 1)) set_param(p, pr.params[k], std::exp(x[k]));
  return p;
}

double objective(unsigned n, const double* x, double* grad, void* data) {
  (void)n;
  (void)grad;
  const Problem& pr = *static_cast<const Problem*>(data);
  const hw::Profile p = with(pr, x);
  double sum = 0;
  for (size_t i : pr.use) {
    const Point& pt = (*pr.points)[i];
    const double r = std::log(predict_point(p, pt) / pt.measured_s);
    sum += r * r;
  }
  return sum;
}

// The base with `params` fitted to the points `use`.
struct Fitted {
  hw::Profile profile;
  OptimizerStatus stop;
};

// The base with `params` fitted to the points `use`.
Fitted fit_subset(const hw::Profile& base, const std::vector<Point>& points, const std::vector<size_t>& use,
                  const std::vector<std::string>& params) {
  Problem pr{&base, &points, use, params};
  const unsigned k = unsigned(params.size());
  std::vector<double> x(k), lo(k), hi(k);
  for (unsigned j = 0; j < k; ++j) {
    const auto [a, b] = bounds(params[j]);
    lo[j] = std::log(a);
    hi[j] = std::log(b);
    x[j] = std::clamp(std::log(start_value(base, params[j])), lo[j], hi[j]);
  }
  const OptimizerStatus st =
      minimize_bobyqa(k, x.data(), lo.data(), hi.data(), objective, &pr, 2000, 1e-7, "the fit");
  return {with(pr, x.data()), st};
}

std::vector<std::string> without(std::vector<std::string> v, const std::string& name) {
  v.erase(std::remove(v.begin(), v.end(), name), v.end());
  return v;
}
bool contains(const std::vector<std::string>& v, const std::string& name) {
  return std::find(v.begin(), v.end(), name) != v.end();
}

}  // namespace

double f_to_enter(double df1, double df2, double level) {
  if (df1 < 1 || df2 < 1) return std::numeric_limits<double>::infinity();
  return boost::math::quantile(boost::math::fisher_f_distribution<double>(df1, df2), level);
}

namespace {

// Forward stepwise selection of the parameters a set of points identifies (fit_measurements): its
// state (the points, what they contain) and its steps, each a function.
class Stepwise {
 public:
  Stepwise(const hw::Profile& base, const std::vector<Point>& points,
           const std::vector<std::string>& requested)
      : base_(base), points_(points), requested_(requested), n_(points.size()), all_(points.size()) {
    for (size_t i = 0; i < n_; ++i) all_[i] = i;
    for (const Point& p : points) {
      if (!p.ttft) ++decode_points_;
      if (p.pruned()) ++pruned_points_, pruned_lengths_.insert(p.m->prompt_tokens);
      if (p.model.moe()) ++moe_points_;
      if (p.ttft) ttft_lengths_.insert(p.m->prompt_tokens);
    }
  }

  size_t max_params() const { return n_ - 2; }
  const std::vector<size_t>& all() const { return all_; }

  double sum_sq(const hw::Profile& p) const {
    double ss = 0;
    for (const Point& pt : points_) {
      const double r = std::log(predict_point(p, pt) / pt.measured_s);
      ss += r * r;
    }
    return ss;
  }

  // The fitted parameters' relative standard errors at `at` (the least-squares fit of `params`):
  // the square roots of the diagonal of s^2 (J^T J)^-1, J the points' d log(predicted) / d log
  // (parameter) and s^2 the squared log error per degree of freedom (Gauss-Newton's covariance;
  // Eigen's LDLT). NaN for all when no degree of freedom is left or J^T J is singular.
  std::vector<double> relative_errors(const hw::Profile& at, const std::vector<std::string>& params) const {
    const size_t k = params.size();
    std::vector<double> out(k, std::numeric_limits<double>::quiet_NaN());
    if (k == 0 || n_ <= k) return out;
    Eigen::MatrixXd J(n_, k);
    for (size_t j = 0; j < k; ++j) {
      const std::vector<double> col = elasticities(at, params[j], false);
      for (size_t i = 0; i < n_; ++i) J(Eigen::Index(i), Eigen::Index(j)) = col[i];
    }
    const Eigen::MatrixXd A = J.transpose() * J;
    const Eigen::LDLT<Eigen::MatrixXd> ldlt(A);
    if (ldlt.info() != Eigen::Success || !ldlt.isPositive() || ldlt.vectorD().minCoeff() <= 1e-14) return out;
    const Eigen::MatrixXd inv = ldlt.solve(Eigen::MatrixXd::Identity(Eigen::Index(k), Eigen::Index(k)));
    const double s2 = sum_sq(at) / double(n_ - k);
    for (size_t j = 0; j < k; ++j) {
      const double v = inv(Eigen::Index(j), Eigen::Index(j));
      if (v > 0) out[j] = std::sqrt(s2 * v);
    }
    return out;
  }

  // The candidates in order, each with the reason it cannot be fitted from these points, if any.
  std::vector<ParamCheck> candidates() const {
    std::vector<ParamCheck> checks;
    std::vector<std::string> names = fit_candidates();
    const std::vector<std::string> by_dtype = dtype_candidates(base_, points_);
    names.insert(names.begin() + 1, by_dtype.begin(), by_dtype.end());
    for (const std::string& name : names) {
      ParamCheck c;
      c.name = name;
      const bool wanted = requested_.empty() || contains(requested_, name);
      if (!wanted) c.reason = "not requested";
      // Prefill GEMMs of short prompts can look memory-bound or row-starved; a TTFT-only fit would
      // use these to absorb their fixed costs and then mispredict every decoding step.
      if (wanted && (name == "gemm.memory" || name == "gemm.half_rows" || name == "attention.half_rows") &&
          decode_points_ == 0)
        c.reason = "only decode latencies identify it (no decode points)";
      if (wanted && (name == "pruning.stage_us" || name == "pruning.key_ns") && pruned_points_ == 0)
        c.reason = "only pruned runs identify it (no point with a pruning schedule)";
      // A stage scores and selects over every active token: its cost per key is the form that
      // scales with the prompt. A fixed part beside it shows only in pruned runs of several lengths.
      else if (wanted && name == "pruning.stage_us" && pruned_lengths_.size() == 1 &&
               !contains(requested_, name))
        c.reason = fmt::format(
            "only pruned runs of several prompt lengths tell a fixed stage cost from one per key (every "
            "pruned "
            "point has {} tokens): pruning.key_ns takes the stage's cost",
            *pruned_lengths_.begin());
      if (wanted && name == "experts.compute" && moe_points_ == 0)
        c.reason = "only mixture-of-experts models identify it (no point has experts)";
      // Attention grows with the square of the prompt, the GEMMs linearly: only prompts of several
      // lengths tell them apart (across models at one length the split rests on the architectures
      // alone, which the cost model may not capture). Decoding's attention reads the KV cache.
      if (wanted && name == "attention.compute" && ttft_lengths_.size() <= 1)
        c.reason =
            ttft_lengths_.empty()
                ? std::string("only TTFTs identify it (no TTFT points)")
                : fmt::format(
                      "only TTFTs of several prompt lengths identify it: every TTFT point has the same "
                      "prompt length ({} tokens), so attention cannot be told from the GEMMs",
                      *ttft_lengths_.begin());
      checks.push_back(c);
    }
    return checks;
  }

  // The blocks a round tries: every open parameter alone, and attention's compute together with
  // each open term that grows more slowly with the prompt (the GEMMs' compute or memory, linear;
  // the per-op overhead, constant) while neither is in: a quadratic term in the prompt length can
  // only be told from a linear or constant one when both move at once (at the base, attention may
  // look negligible; a small model on a large GPU is all overhead at short prompts and all
  // attention at long ones).
  std::vector<std::vector<std::string>> blocks(std::vector<ParamCheck>& checks) const {
    std::vector<std::vector<std::string>> out;
    for (const ParamCheck& c : checks)
      if (open(c)) out.push_back({c.name});
    if (ttft_lengths_.size() >= 3 && open(check_of(checks, "attention.compute")))
      for (const char* slower : {"gemm.compute", "overhead_us", "gemm.memory"})
        if (open(check_of(checks, slower))) out.push_back({slower, "attention.compute"});
    return out;
  }

  // Identifiability of `name` beside `others`, judged both at `current` (the fit before it, with
  // it at its base value) and at `trial` (where the fit with it ends up); either suffices.
  bool judge(ParamCheck& c, const hw::Profile& current, const std::vector<std::string>& others_current,
             const hw::Profile& trial, const std::vector<std::string>& others_trial) const {
    const auto [s1, i1] =
        independence(current, c.name, elasticities(current, c.name, true), others_current, true);
    const auto [s2, i2] =
        independence(trial, c.name, elasticities(trial, c.name, false), others_trial, false);
    c.sensitivity = std::max(s1, s2);
    c.independent = std::max(i1, i2);
    if (c.independent >= kMinElasticity) return true;
    if (c.sensitivity < kMinElasticity)
      c.reason = fmt::format(
          "the points barely depend on it (RMS elasticity {:.3f} < {}, at the base and at the fit)",
          c.sensitivity, kMinElasticity);
    else
      c.reason = fmt::format(
          "the other parameters fitted already explain its effect (independent elasticity {:.3f} "
          "< {}, at the base and at the fit)",
          c.independent, kMinElasticity);
    return false;
  }

  // The accepted parameter least identifiable where the fit ended up (its independent elasticity,
  // the larger in either unit), if below kMinElasticity; empty otherwise.
  std::pair<std::string, double> weakest(const hw::Profile& current,
                                         const std::vector<std::string>& params) const {
    std::string name_out;
    double weakest_indep = kMinElasticity;
    for (const std::string& name : params) {
      const std::vector<std::string> others = without(params, name);
      const auto [s1, i1] = independence(current, name, elasticities(current, name, false), others, false);
      const auto [s2, i2] = independence(current, name, elasticities(current, name, true), others, true);
      if (std::max(i1, i2) < weakest_indep) {
        weakest_indep = std::max(i1, i2);
        name_out = name;
      }
    }
    return {name_out, weakest_indep};
  }

  static ParamCheck& check_of(std::vector<ParamCheck>& checks, const std::string& name) {
    return *std::find_if(checks.begin(), checks.end(), [&](const ParamCheck& c) { return c.name == name; });
  }

 private:
  const hw::Profile& base_;
  const std::vector<Point>& points_;
  const std::vector<std::string>& requested_;
  size_t n_;
  std::vector<size_t> all_;
  size_t decode_points_ = 0, pruned_points_ = 0, moe_points_ = 0;
  std::set<int64_t> pruned_lengths_;
  std::set<int64_t> ttft_lengths_;

  static bool open(const ParamCheck& c) {
    return !c.fitted && c.reason != "not requested" && !c.reason.starts_with("only ") && !c.dropped;
  }

  // d log(predicted) per relative change of the parameter around its value at `at`: in units of
  // its base value (`base_units`: a parameter fitted near zero, an overhead, keeps the elasticity
  // it had at the base), or of its value at `at` (where a fit ended up: an attention efficiency
  // fitted to a fifth of the base's makes attention five times the share of the time it was).
  // Central differences of +-5%.
  std::vector<double> elasticities(const hw::Profile& at, const std::string& name, bool base_units) const {
    const auto [lo, hi] = bounds(name);
    const double v = get_param(at, name);
    const double ref = base_units ? start_value(base_, name) : std::max(v, lo);
    const double a = std::max(lo, v - 0.05 * ref), b = std::min(hi, v + 0.05 * ref);
    hw::Profile up = at, down = at;
    set_param(up, name, b);
    set_param(down, name, a);
    std::vector<double> col(n_);
    for (size_t i = 0; i < n_; ++i)
      col[i] = (std::log(predict_point(up, points_[i])) - std::log(predict_point(down, points_[i]))) /
               ((b - a) / ref);
    return col;
  }

  // The points a parameter can move: the pruned ones for the pruning stage cost (so one pruned
  // run among many dense ones can identify it), every point otherwise.
  bool moves(const std::string& name, size_t i) const {
    return (name != "pruning.stage_us" && name != "pruning.key_ns") || points_[i].pruned();
  }

  // RMS of `col`, and of the part of it that the columns of `params` at `at` cannot reproduce,
  // over the points `name` can move.
  std::pair<double, double> independence(const hw::Profile& at, const std::string& name,
                                         const std::vector<double>& col,
                                         const std::vector<std::string>& params, bool base_units) const {
    std::vector<std::vector<double>> basis;  // orthonormal (Gram-Schmidt)
    for (const std::string& q : params) {
      std::vector<double> v = elasticities(at, q, base_units);
      for (const auto& o : basis) {
        double dot = 0;
        for (size_t i = 0; i < n_; ++i) dot += v[i] * o[i];
        for (size_t i = 0; i < n_; ++i) v[i] -= dot * o[i];
      }
      double vv = 0;
      for (double e : v) vv += e * e;
      if (vv <= 1e-30) continue;
      for (double& e : v) e /= std::sqrt(vv);
      basis.push_back(std::move(v));
    }
    std::vector<double> r = col;
    for (const auto& o : basis) {
      double dot = 0;
      for (size_t i = 0; i < n_; ++i) dot += r[i] * o[i];
      for (size_t i = 0; i < n_; ++i) r[i] -= dot * o[i];
    }
    double ss = 0, rr = 0, rows = 0;
    for (size_t i = 0; i < n_; ++i)
      if (moves(name, i)) {
        ss += col[i] * col[i];
        rr += r[i] * r[i];
        ++rows;
      }
    return std::pair{std::sqrt(ss / std::max(rows, 1.0)), std::sqrt(rr / std::max(rows, 1.0))};
  }
};

// One round of the forward selection: every block fitted with the accepted parameters `params`;
// the most significant one (smallest p-value of its F-to-enter) that is identifiable at the base
// or at its fit is accepted into `params`, `current` and `ss_current`. False when none is.
bool select_round(const Stepwise& sw, const hw::Profile& base, const std::vector<Point>& points,
                  const std::vector<std::string>& requested, std::vector<ParamCheck>& checks,
                  std::vector<std::string>& params, hw::Profile& current, double& ss_current) {
  const size_t n = points.size();
  const std::vector<std::vector<std::string>> blocks = sw.blocks(checks);
  int best = -1;
  double best_p = 2, best_ss = 0;
  Fitted best_fit{base, {}};
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const std::vector<std::string>& block = blocks[bi];
    std::vector<std::string> trial_params = params;
    trial_params.insert(trial_params.end(), block.begin(), block.end());
    if (trial_params.size() > sw.max_params()) {
      if (block.size() == 1)
        Stepwise::check_of(checks, block[0]).reason =
            fmt::format("{} points identify at most {} parameters (n - 2)", n, sw.max_params());
      continue;
    }
    const Fitted trial = fit_subset(base, points, sw.all(), trial_params);
    const double ss = sw.sum_sq(trial.profile);
    const double dof = double(n - trial_params.size());
    const double gain = std::max(0.0, ss_current - ss) / double(block.size());
    const double F =
        ss > 1e-24 ? gain / (ss / dof) : (gain > 1e-24 ? std::numeric_limits<double>::infinity() : 0);
    // A block's verdicts go to its parameters only when it is the better explanation: a single
    // parameter keeps its own reason otherwise.
    std::vector<ParamCheck> verdict;
    bool ok = true;
    for (const std::string& name : block) {
      ParamCheck c = Stepwise::check_of(checks, name);
      c.f_stat = F;
      ok =
          sw.judge(c, current, without(trial_params, name), trial.profile, without(trial_params, name)) && ok;
      verdict.push_back(c);
    }
    // A pruning parameter only pruned runs move: the user gave them to fit it, so it enters when
    // identifiable and it lowers the error at all (its uncertainty says how well it is pinned).
    const bool pruning_block =
        block.size() == 1 && (block[0] == "pruning.key_ns" || block[0] == "pruning.stage_us");
    const double need = pruning_block        ? 1e-12
                        : !requested.empty() ? kMinRequestedF
                                             : f_to_enter(double(block.size()), dof, 0.95);
    if (ok && !(F >= need)) {
      ok = false;
      for (ParamCheck& c : verdict)
        c.reason = !requested.empty()
                       ? fmt::format("it does not improve the fit (F = {:.2f} < {})", F, kMinRequestedF)
                       : fmt::format(
                             "it does not improve the fit significantly (F = {:.2f} < {:.2f}, the 5% point "
                             "of F({}, {:.0f}); --fit {} asks for it anyway)",
                             F, need, block.size(), dof, block[0]);
    }
    if (block.size() == 1 || ok)
      for (const ParamCheck& c : verdict) {
        ParamCheck& dst = Stepwise::check_of(checks, c.name);
        dst.sensitivity = c.sensitivity;
        dst.independent = c.independent;
        dst.f_stat = c.f_stat;
        dst.reason = ok ? "" : c.reason;
      }
    if (!ok) continue;
    const double p =
        std::isinf(F)
            ? 0
            : 1 - boost::math::cdf(boost::math::fisher_f_distribution<double>(double(block.size()), dof), F);
    // The most significant block; between equals (p underflows to 0 on exact data), the one that
    // leaves the least error, then the smaller one.
    if (best < 0 || p < best_p || (p == best_p && ss < best_ss * (1 - 1e-9))) {
      best = int(bi);
      best_p = p;
      best_ss = ss;
      best_fit = trial;
    }
  }
  if (best < 0) return false;
  for (const std::string& name : blocks[size_t(best)]) {
    Stepwise::check_of(checks, name).fitted = true;
    Stepwise::check_of(checks, name).reason.clear();
    params.push_back(name);
  }
  current = best_fit.profile;
  ss_current = best_ss;
  return true;
}

// Every point predicted by a fit that did not see it: leave-one-out up to 30 points, else 10 folds.
void cross_validate(const hw::Profile& base, const std::vector<Point>& points, MeasurementFit& f) {
  const size_t n = points.size();
  const size_t folds = n <= 30 ? n : 10;
  f.cv = n <= 30 ? "leave-one-out" : "10-fold";
  f.heldout_s.assign(n, 0);
  for (size_t k = 0; k < folds; ++k) {
    std::vector<size_t> train;
    bool pruned = false;
    for (size_t i = 0; i < n; ++i)
      if (i % folds != k) train.push_back(i), pruned = pruned || points[i].pruned();
    // A fold without pruned runs cannot fit a pruning cost: it keeps the base's, as a user with
    // only those runs would.
    std::vector<std::string> params;
    for (const std::string& name : f.params)
      if (pruned || name.rfind("pruning.", 0) != 0) params.push_back(name);
    const Fitted p = fit_subset(base, points, train, params);
    if (!p.stop.converged) ++f.heldout_unconverged;
    for (size_t i = k; i < n; i += folds) f.heldout_s[i] = predict_point(p.profile, points[i]);
  }
}

// What the selection left for the parameters --fit asked for, and for a fit with none: refused.
void check_selection(const hw::Profile& base, const std::vector<std::string>& requested,
                     const MeasurementFit& f, size_t n) {
  for (const std::string& name : requested) {
    const auto it =
        std::find_if(f.checks.begin(), f.checks.end(), [&](const ParamCheck& c) { return c.name == name; });
    if (it == f.checks.end()) {
      get_param(base, name);  // unknown name: the error lists the known ones
      usage_fail("cannot fit {}: no point computes in {} beside another dtype", name,
                 name.substr(kGemmComputeOf.size()));
    }
    if (!it->fitted) usage_fail("cannot fit {}: {}", name, it->reason);
  }
  if (f.params.empty()) {
    std::string why;
    for (const ParamCheck& c : f.checks)
      if (c.reason != "not requested")
        why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", c.name, c.reason);
    fail("these {} points identify no parameter of '{}' ({})", n, base.name, why);
  }
}

}  // namespace

hw::Profile fit_measurements(const hw::Profile& base, const std::vector<Point>& points,
                             const std::vector<std::string>& requested, MeasurementFit* out) {
  const size_t n = points.size();
  if (n < 3)
    fail("{} usable measurement(s): calibration needs at least 3 points (one parameter and a held-out check)",
         n);
  MeasurementFit f;
  const auto predict_all = [&](const hw::Profile& p) {
    std::vector<double> v;
    for (const Point& pt : points) v.push_back(predict_point(p, pt));
    return v;
  };
  f.base_s = predict_all(base);
  const Stepwise sw(base, points, requested);
  std::vector<ParamCheck> checks = sw.candidates();

  // Forward stepwise selection over blocks (select_round), round after round. After each pass the
  // accepted parameters are judged again where the final fit ends up; one that has lost its
  // identifiability there (its effect taken over by one accepted after it) is dropped and the
  // selection runs again.
  hw::Profile current = base;
  double ss_current = sw.sum_sq(base);
  for (int pass = 0; pass < 4; ++pass) {
    while (select_round(sw, base, points, requested, checks, f.params, current, ss_current)) {
    }
    if (f.params.size() < 2) break;
    const auto [weakest, weakest_indep] = sw.weakest(current, f.params);
    if (weakest.empty()) break;
    ParamCheck& w = Stepwise::check_of(checks, weakest);
    w.fitted = false;
    w.dropped = true;
    w.reason = fmt::format(
        "dropped after the fit: the other parameters explain its effect there (independent "
        "elasticity {:.3f} < {})",
        weakest_indep, kMinElasticity);
    f.params = without(f.params, weakest);
    const Fitted refit = fit_subset(base, points, sw.all(), f.params);
    current = refit.profile;
    ss_current = sw.sum_sq(current);
  }
  // The fitted parameters in candidate order (the rounds' order is in the report's reasons).
  std::vector<std::string> ordered;
  for (const ParamCheck& c : checks)
    if (c.fitted) ordered.push_back(c.name);
  f.params = ordered;
  f.checks = checks;
  check_selection(base, requested, f, n);

  const Fitted fitted = fit_subset(base, points, sw.all(), f.params);
  f.stop = describe_stop(fitted.stop);
  f.fit_s = predict_all(fitted.profile);
  const std::vector<double> rel = sw.relative_errors(fitted.profile, f.params);
  for (ParamCheck& c : f.checks)
    if (c.fitted) {
      const auto [lo, hi] = bounds(c.name);
      const double v = get_param(fitted.profile, c.name);
      c.at_bound = v <= lo * 1.001 || v >= hi * 0.999;
      c.relative_error = rel[size_t(std::find(f.params.begin(), f.params.end(), c.name) - f.params.begin())];
    }
  cross_validate(base, points, f);
  f.ttft_mape_base = mape(points, f.base_s, true, &f.ttft_points);
  f.ttft_mape_fit = mape(points, f.fit_s, true, nullptr);
  f.ttft_mape_heldout = mape(points, f.heldout_s, true, nullptr);
  f.decode_mape_base = mape(points, f.base_s, false, &f.decode_points);
  f.decode_mape_fit = mape(points, f.fit_s, false, nullptr);
  f.decode_mape_heldout = mape(points, f.heldout_s, false, nullptr);
  if (out) *out = std::move(f);
  hw::Profile result = fitted.profile;
  result.efficiency_default = false;
  return result;
}

}  // namespace lp::calib
