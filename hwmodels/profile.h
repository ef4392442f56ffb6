// Hardware profiles: JSON data in hwmodels/*.json (schema in hwmodels/README.md), compiled into
// the binary, or a user's file. The loader validates every field and converts units once
// (TFLOP/s -> FLOP/s, GB/s -> bytes/s, GiB -> bytes, us -> s); the rest of the code sees SI.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lp::hw {

// Op families that share efficiency parameters (sim/ maps each op to one). Experts: a mixture of
// experts' routed and shared expert GEMMs, grouped over the rows each expert gets (optional in a
// file: absent, the GEMMs' efficiency).
enum class Family : int { Gemm, Attention, Elementwise, DataMovement, Experts, kCount };
inline constexpr int kNumFamilies = static_cast<int>(Family::kCount);
const char* family_name(Family f);

// An op of the family with F FLOPs, B bytes and R rows takes
//   max(F / (peak * compute * R / (R + half_rows)), B / (bandwidth * memory)) + overhead_s.
struct Efficiency {
  double compute = 0.5;   // share of peak FLOP/s at large shapes, (0, 1]
  double half_rows = 1;   // rows at which compute efficiency is half of `compute`, >= 0
  double memory = 0.7;    // effective bandwidth / peak, (0, kMaxMemoryEfficiency]: above 1 only
                          // where caches serve the family's traffic (see kMaxMemoryEfficiency)
  double overhead_s = 0;  // per call, >= 0
  // `compute` for a compute dtype the family runs at a different share of its peak (llama.cpp's
  // int8 dot products over quantized weights beside its f32 GEMMs on one CPU). Optional in a file
  // (efficiency.<family>.compute_by_dtype); calibrate fits an entry as gemm.compute.<dtype>.
  std::map<std::string, double> compute_by_dtype;
  // Attention only: the share of peak on decoding rows (a step that extends a held cache: its new
  // row and the rows LazyLLM revives, each attending keys read back from memory), where a CPU
  // engine's small tiles run far below its prefill rate. Optional in a file
  // (efficiency.attention.decode_compute); 0 (absent): decoding rows run at `compute` like the rest.
  double decode_compute = 0;
  // Attention only: decoding rows over a *listed* key set (LazyLLM's active set once it is not
  // every held slot in position order). The CPU engine reads every held slot's key blocks through
  // a mask (docs/engine.md), so such a step computes rows x held (query, key) pairs at
  // `listed_compute` of peak and reads the held K/V at `listed_memory` of the bandwidth, the two
  // summed (the tiles' score work and their reads of the blocks do not overlap at these sizes).
  // Optional in a file (efficiency.attention.listed_compute / listed_memory, both or neither);
  // 0 (absent): listed rows are priced as other decoding rows, on their causal pairs.
  double listed_compute = 0, listed_memory = 0;
  bool prices_listed() const { return listed_compute > 0 && listed_memory > 0; }

  double compute_for(const std::string& dtype) const {
    const auto it = compute_by_dtype.find(dtype);
    return it != compute_by_dtype.end() ? it->second : compute;
  }
};

// Upper bound of Efficiency::memory. The model has no cache term: an op whose working set was
// just written by the op before it (a CPU's elementwise ops over one layer's activations) reads
// it from the last-level cache, at several times the DRAM bandwidth. Calibrating per-op timings
// of this machine's engine fitted 1.6-2.3x for the elementwise family (hwmodels/README.md).
inline constexpr double kMaxMemoryEfficiency = 8;

// How a serving engine schedules (the serving simulation, docs/simulator.md "Engines'
// schedulers"): its limits per iteration, how it holds K/V, and its host time. The presets' values
// are the engines' documented defaults, each with its source there.
struct Scheduling {
  int64_t max_seqs = 0;             // requests running at once at most (0: as many as K/V holds)
  int64_t max_batch_tokens = 2048;  // rows per iteration: decoding rows + prefill tokens
  int64_t chunk_tokens = 0;         // > 0: chunked prefill, chunks of at most this many tokens
  // How K/V is held: Reserve, each request's worst case (prompt + max_tokens) at admission and
  // never more (this engine; TensorRT-LLM's GUARANTEED_NO_EVICT); OnDemand, blocks as tokens are
  // computed, the most recently admitted running request preempted (its blocks freed, computed
  // again from its prompt and output so far when it is admitted again) when a step finds none
  // free (vLLM's recompute, SGLang's retraction).
  enum class Kv { Reserve, OnDemand } kv = Kv::Reserve;
  int64_t kv_block_tokens = 64;  // tokens a K/V block holds (the capacity rounds up to it)
  // Mixed iterations: decoding rows ride with prefill chunks in one batch (vLLM, TensorRT-LLM,
  // this engine). false: an iteration with prefill work runs it alone and the decoding requests
  // wait for the next (SGLang without --enable-mixed-chunk).
  bool mixed = true;
  double iteration_s = 0;  // host time per iteration beyond the batch (scheduling, launches), s
  double request_s = 0;    // host time per request the iteration schedules (inputs, sampling, output), s
  // Host time per layer of a request whose prefill starts in the iteration (aiconfigurator's vLLM
  // prefill dispatch, 0.8 ms a layer), s.
  double admit_layer_s = 0;
  // Every iteration's modelled device time times this: the engine's kernels against the profile's
  // efficiencies, as calibrate-serving fits it to a user's serving benchmarks (1: as modelled).
  double kernel_scale = 1;
  // The preset's defaults that follow the GPU's memory apply (vLLM's and SGLang's rules:
  // scheduling_for); false once a profile file sets any scheduling key.
  bool by_memory = true;
};

// How the serving engine runs the elementwise ops (docs/simulator.md, "Engines"): activations
// between ops at f32 or at the compute dtype, and which ops it fuses into a neighbour; and how it
// schedules (Scheduling).
struct Engine {
  std::string name = "lazyprefill";     // a preset (engine_names()) or "custom"
  bool elementwise_at_compute = false;  // activations between ops at the compute dtype (else f32)
  bool fuse_add_rmsnorm = false;        // each residual add fused into the RMSNorm after it
  bool fuse_rope = false;               // RoPE applied inside the QKV / attention kernels
  bool fuse_swiglu = false;             // SwiGLU in the gate_up GEMM's epilogue
  // How a batch's GEMMs are grouped (the serving simulation's iterations): a member with at least
  // this many rows at a layer runs its own GEMMs over them, reading the weights once more, and the
  // others share one; 0: one GEMM over every member's rows (vLLM, TensorRT-LLM, llama.cpp's
  // ubatch). lazyprefill's CPU backend: 64 (kRowsForOwnGemm in kernels/cpu/backend.cpp).
  int64_t own_gemm_rows = 0;
  Scheduling scheduling;
};
// lazyprefill (this engine on a CPU) and llamacpp: f32, nothing fused; vllm and sglang: compute
// dtype, add+RMSNorm fused; trtllm: compute dtype, add+RMSNorm, RoPE and SwiGLU fused. lazyprefill
// alone gives a member of 64 rows or more its own GEMMs. Each with its scheduler's defaults
// (docs/simulator.md, "Engines' schedulers"). Throws lp::UsageError listing the known names.
Engine engine_preset(const std::string& name);
std::vector<std::string> engine_names();
struct Profile;
// The engine's scheduler on this part: its preset's values, with vLLM's and SGLang's defaults that
// follow the GPU's memory (vLLM 0.11: 1024 sequences and 8,192 tokens an iteration from 70 GiB,
// A100s aside, else 256 and 2,048; SGLang: chunks of 2,048 below 35 GB, 4,096 below 60, 8,192
// below 160, 16,384 from 160) where by_memory holds.
Scheduling scheduling_for(const Profile& p);
// The engine of a profile without an 'engine' field: vllm on a GPU, lazyprefill on a CPU.
Engine default_engine(const std::string& kind);

struct Profile {
  std::string name, description, kind;  // kind: "gpu" or "cpu"
  std::vector<std::string> aliases;     // names tools print for the part ("NVIDIA H100 80GB HBM3")
  std::map<std::string, double>
      peak_flops;                     // dtype ("f32", "tf32", "bf16", "f16", "int8", "fp8", "fp4") -> FLOP/s
  double memory_bandwidth = 0;        // bytes/s
  double memory_capacity = 0;         // bytes
  double onchip_cache = 0;            // bytes
  double shared_memory_per_unit = 0;  // bytes
  int compute_units = 0;
  double dispatch_overhead = 0;        // s
  double interconnect_bandwidth = 0;   // bytes/s (0: none)
  double interconnect_latency = 0;     // s
  int max_tp = 1;                      // GPUs the interconnect joins (largest tensor-parallel degree)
  double interconnect_efficiency = 1;  // share of interconnect_bandwidth a ring collective reaches
  // The network between nodes of max_tp GPUs, per GPU (optional in a file: scale_out_bandwidth_gbs,
  // scale_out_latency_us; absent, one 400 Gb/s NIC a GPU: 50 GB/s and 5 us; 0 on a CPU).
  double scale_out_bandwidth = 0;  // bytes/s
  double scale_out_latency = 0;    // s
  // Fixed cost of one pruning stage (a pruning layer in one step) beyond its score, select and
  // gather ops: synchronisation and the small kernels of the selection. s. Optional in a file
  // (efficiency.pruning_stage_us); absent, it is default_pruning_stage_s(kind, dispatch_overhead).
  double pruning_stage_s = 0;
  // Cost of one pruning stage per key it scores and selects from, beyond the score and select
  // ops' roofline (this CPU engine's one-row scores and top-k take about 80 ns a key each), s per key.
  // Optional in a file (efficiency.pruning_key_ns); absent, 0.
  double pruning_key_s = 0;
  Engine engine;  // optional 'engine' in a file (a preset name or {elementwise, fuse}); default_engine(kind)
  std::array<Efficiency, kNumFamilies> efficiency{};
  bool efficiency_default = true;  // false once calibrated
  std::map<std::string, std::string> sources;
  nlohmann::ordered_json json;  // the document as read (calibration writes a modified copy)

  // The experts family has its own efficiency where a file gives one or calibration fitted one;
  // else it follows the GEMMs' (whatever calibration makes of them).
  bool experts_own = false;
  const Efficiency& eff(Family f) const {
    return f == Family::Experts && !experts_own ? efficiency[size_t(Family::Gemm)] : efficiency[size_t(f)];
  }
  // Gives the experts an efficiency of their own, starting from the GEMMs' (before fitting it):
  // one compute share for every dtype (the GEMMs' per-dtype shares would shadow it).
  void own_experts() {
    if (!experts_own) {
      efficiency[size_t(Family::Experts)] = efficiency[size_t(Family::Gemm)];
      efficiency[size_t(Family::Experts)].compute_by_dtype.clear();
    }
    experts_own = true;
  }
  // Peak FLOP/s for a compute dtype, falling back to f32 when the part has no native support
  // for it (as a CPU without AVX512_BF16 runs bf16 through f32 units). Throws if neither exists,
  // and for fp8 or fp4 without such a peak (no part emulates them at its f32 rate).
  double peak(const std::string& dtype) const;
};

// A part of the device: its peaks and memory bandwidth times `share` (one process on some of a
// CPU's cores, a rank of KV-Runahead on one core of two). Throws lp::Error for a share outside
// (0, 1].
Profile share_of(const Profile& p, double share);
// The share of a CPU profile that `threads` threads get: threads / compute_units, at most 1 (1 for
// a GPU, and for threads <= 0: unknown, the whole part).
double thread_share(const Profile& p, int threads);

// The dtype an op family computes in for a compute dtype and K/V dtype: GEMMs (and experts) in
// it; attention in it, except that int8 engines (llama.cpp's quantized types, SmoothQuant) keep
// activations and the KV cache 16-bit and run attention in f16, and that no serving engine runs
// attention in FP4: under fp8 or fp4 compute the attention kernels (TensorRT-LLM's FP8 FMHA,
// FlashAttention-3's FP8 path, FlashInfer) run FP8 over an fp8 K/V cache and bf16 over any other
// (`kv` "": taken as fp8); norms, RoPE and the other elementwise ops in f32.
std::string family_dtype(Family f, const std::string& compute, const std::string& kv = "");

// The documented default of efficiency.pruning_stage_us for a profile that has none (files
// written before it existed): GPUs 40 us (about 7 extra launches and a host synchronisation),
// CPUs two fork-joins (2 x dispatch_overhead).
double default_pruning_stage_s(const std::string& kind, double dispatch_overhead_s);

// Validates a profile document; `origin` names it in errors. Throws lp::Error with one line
// naming the origin and field: missing or mistyped fields, zero or negative values, an
// efficiency outside (0, 1], a number without a source.
Profile parse_profile(const nlohmann::ordered_json& j, const std::string& origin);

// A built-in profile by name, or a JSON file when `name_or_path` ends in ".json" or contains a
// '/'. An unknown name is an error that lists the known ones.
Profile load_profile(const std::string& name_or_path);

std::vector<std::string> builtin_profile_names();

// The efficiency block as JSON (what calibration writes back into a profile).
nlohmann::ordered_json efficiency_json(const Profile& p);

}  // namespace lp::hw
