// Calibration from end-to-end measurements (docs/measurements.md, "Calibrating"):
// measured TTFTs and decode latencies, from any importer (calibrate/measurements.h), fit the few
// efficiency parameters of one hardware profile that such figures can identify.
//
// Each measurement becomes a Point: the model preset it names, the precision its dtype implies,
// and a synthetic trace of its work (the prompt, or one decoding step at the middle of the
// measured output), predicted by replay() with the measurement's batch and tensor-parallel
// degree. The fit minimises the sum of squared log errors log(predicted / measured) over the
// chosen parameters with NLopt's BOBYQA (bounded, derivative-free, deterministic), from the
// base profile's values.
//
// Which parameters: forward stepwise selection over the candidates gemm.compute, gemm.compute.<dtype>
// (one per further compute dtype among the points, dtype_candidates), overhead_us,
// attention.compute, gemm.half_rows, attention.half_rows, gemm.memory, interconnect and pruning.stage_us,
// tried one at a time and, while neither is in and the TTFTs span at least three prompt lengths, gemm.compute
// and attention.compute together (attention's quadratic growth with the prompt shows only when both move: at
// the base profile attention may look negligible). Each round fits every block with those accepted and
// accepts the most significant one (smallest p-value) that (a) is identifiable: each parameter's
// elasticities (d log(predicted) per relative change) over the points, less the part the other
// parameters' elasticities reproduce (least squares), have an RMS of at least 0.05 (a 10% change
// moves the predictions by 0.5% in its own way), judged at the fit before the block (the parameter
// at its base value) or where the block's fit ends up; (b) improves the fit significantly: F =
// (drop in squared log error per parameter) / (remaining squared error per degree of freedom) at
// least the 5% point of F(k, dof) (Boost.Math; F >= 2 for parameters asked for with --fit); (c)
// keeps at most n - 2 parameters for n points. After the selection every accepted parameter is
// judged again at the final fit; one whose effect the others now explain is dropped and the
// selection runs again. gemm.half_rows, attention.half_rows and gemm.memory are candidates only with decode
// points (a TTFT-only fit would use them to absorb short prompts' fixed costs), pruning.stage_us only with
// pruned points. A parameter the user asks for (--fit) that is not accepted is refused with the
// reason.
//
// The optimiser always returns its best point (calibrate/bobyqa.h); a stop short of convergence is
// reported in `stop`, never thrown.
//
// Held-out error: leave-one-out cross-validation up to 30 points, else 10 folds (point i in fold
// i mod 10); every fold refits the same parameters from the base values without its points.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "calibrate/measurements.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"
#include "traces/trace.h"

namespace lp::calib {

// A model preset for a model name as a file writes it ("meta-llama/Llama-3.1-8B-Instruct",
// "Qwen2.5-7B-Instruct-Q4_K_M.gguf"): the explicit map first, then a preset whose name the
// normalised file name (lower case, folder and ".gguf" dropped, '_' and ' ' as '-', a leading
// "meta-" dropped) equals or starts with followed by '-' or '.'. nullopt when none matches.
std::optional<std::string> match_preset(const std::string& file_name,
                                        const std::map<std::string, std::string>& map);

// A hardware profile name for a hardware name as a file writes it: the explicit map first, then a
// built-in profile whose name or one of its `aliases` equals it (case, spaces and '_' ignored).
std::optional<std::string> match_profile(const std::string& file_name,
                                         const std::map<std::string, std::string>& map);

// The simulator's precision for a weight type as files write it: bf16/bfloat16, f16/fp16/
// float16/half, f32/fp32/float32, fp8/fp8-e4m3 (FP8 weights, compute and KV; the profile needs an
// fp8 peak), int8/w8a8, llama.cpp's Q8_0 (int8 weights) and Q2..Q6 K-quants and Q4_0/Q4_1/
// IQ4 (4-bit weights), which compute in int8 as llama.cpp runs them (8-bit activations, integer
// dot products), and awq/gptq (4-bit weights, f16 compute as weight-only kernels run). An empty or
// "auto" dtype is bf16. Throws lp::Error naming the dtype otherwise.
// llama.cpp's file types (llama-bench's model_type, "<arch> <size> <type>") map exactly, each to its
// bits per weight ("<bits>bpw", see kLlamaFtypes); a "(guessed) " prefix is ignored.
sim::Precision precision_for_dtype(const std::string& dtype);
// Every llama.cpp file-type name precision_for_dtype knows, as llama-bench prints it.
std::vector<std::string> llama_ftype_names();
// "4.5bpw": the weight dtype of `bits` bits per weight.
std::string bpw_dtype(double bits);

struct Point {
  const Measurement* m = nullptr;
  std::string preset;
  ModelConfig model;
  sim::Precision precision;
  bool ttft = true;       // else a decode latency
  double measured_s = 0;  // TTFT, or seconds per generated token
  trace::Trace work;      // the prompt, or the prompt so far plus one decoding step
  bool pruned() const { return !work.header.schedule_layers.empty(); }  // run with a pruning schedule
};

// A Point for `m` on `model` (its decode step at context + decode_tokens / 2). Throws lp::Error
// naming the record when the method or schedule cannot be read or the work exceeds the context.
Point make_point(const Measurement& m, const std::string& preset, const ModelConfig& model,
                 const sim::Precision& p);

// The profile's prediction for a point, seconds.
double predict_point(const hw::Profile& hw, const Point& pt);

// The parameters end-to-end figures may identify, in the order they are tried.
const std::vector<std::string>& fit_candidates();
// With points in several compute dtypes (llama-bench's F32 and Q8_0 files: f32 and int8), the
// GEMM share of peak of each dtype but one as its own parameter, gemm.compute.<dtype> (stored in
// efficiency.gemm.compute_by_dtype); gemm.compute stays the share of the most frequent dtype that
// has no share of its own in `base`. Tried right after gemm.compute.
std::vector<std::string> dtype_candidates(const hw::Profile& base, const std::vector<Point>& points);
double get_param(const hw::Profile& p, const std::string& name);
void set_param(hw::Profile& p, const std::string& name, double v);

struct ParamCheck {
  std::string name;
  double sensitivity = 0;  // RMS elasticity over the points
  double independent = 0;  // RMS of the part no earlier accepted parameter reproduces
  double f_stat = 0;       // F-to-enter: drop in squared log error / (remaining error per dof)
  bool fitted = false;
  bool at_bound = false;  // fitted to a bound ([0.01, 1] for shares, [0.01, 5000] us): poorly determined
  bool dropped = false;   // accepted, then dropped when judged again at the final fit
  // Fitted: its relative standard error (Gauss-Newton at the final fit; NaN with no degree of
  // freedom left): 0.1 is +-10% at one sigma.
  double relative_error = 0;
  std::string reason;  // why it was not fitted
};

// The `level` quantile of Fisher's F(df1, df2) (Boost.Math): the F-to-enter a block of df1
// parameters must reach with df2 degrees of freedom left. Infinity when df1 or df2 < 1.
double f_to_enter(double df1, double df2, double level = 0.95);

struct MeasurementFit {
  std::vector<std::string> params;  // fitted, in candidate order
  std::vector<ParamCheck> checks;
  std::vector<double> base_s, fit_s, heldout_s;  // per point
  std::string cv;                                // "leave-one-out" or "10-fold"
  std::string stop;             // how the final fit's optimiser stopped, "" when it converged
  int heldout_unconverged = 0;  // cross-validation fits that stopped short of convergence
  // Mean |predicted / measured - 1| over TTFT and decode points: base profile, fitted (in-sample),
  // held out. NaN when there are no such points.
  double ttft_mape_base = 0, ttft_mape_fit = 0, ttft_mape_heldout = 0;
  double decode_mape_base = 0, decode_mape_fit = 0, decode_mape_heldout = 0;
  int ttft_points = 0, decode_points = 0;
};

// Fits `base` to `points` (all on base's hardware). `requested` empty: every identifiable
// candidate; otherwise exactly those, or lp::UsageError saying which one the data cannot
// identify and why. Throws lp::Error with fewer than 3 points or when nothing is identifiable.
hw::Profile fit_measurements(const hw::Profile& base, const std::vector<Point>& points,
                             const std::vector<std::string>& requested, MeasurementFit* out);

}  // namespace lp::calib
