#include "hwmodels/profile.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <string_view>
#include <utility>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"

namespace lp::hw {

// Generated from hwmodels/*.json by cmake/embed.cmake.
std::vector<std::pair<std::string_view, std::string_view>> builtin_profile_files();

namespace {
using json = nlohmann::ordered_json;

constexpr std::array<const char*, kNumFamilies> kFamilyKeys = {"gemm", "attention", "elementwise",
                                                               "data_movement", "experts"};

double positive(const json& j, const char* key, const std::string& origin, bool allow_zero = false) {
  const double x = json_field<double>(j, key, origin);
  if (x < 0 || (!allow_zero && x == 0))
    fail("{}: field '{}' must be {} than 0, got {}", origin, key, allow_zero ? "no less" : "greater", x);
  return x;
}

std::string text(const json& j, const char* key, const std::string& origin) {
  std::string s = json_field<std::string>(j, key, origin);
  if (s.empty()) fail("{}: field '{}' must be a non-empty string", origin, key);
  return s;
}
bool is_compute_dtype(const std::string& d) {
  return d == "f32" || d == "tf32" || d == "bf16" || d == "f16" || d == "int8" || d == "fp8" || d == "fp4";
}
}  // namespace

const char* family_name(Family f) {
  return kFamilyKeys[size_t(f)];
}

std::string family_dtype(Family f, const std::string& compute, const std::string& kv) {
  if (f == Family::Gemm || f == Family::Experts) return compute;
  if (f == Family::Attention) {
    if (compute == "int8") return "f16";
    if (compute == "fp8" || compute == "fp4") return kv.empty() || kv == "fp8" ? "fp8" : "bf16";
    return compute;
  }
  return "f32";
}

double Profile::peak(const std::string& dtype) const {
  if (auto it = peak_flops.find(dtype); it != peak_flops.end()) return it->second;
  if (dtype == "fp8")
    usage_fail(
        "hardware '{}' has no FP8 peak ({} does not run FP8 natively; FP8 needs Hopper or Ada tensor "
        "cores): use --compute bf16 or int8",
        name, description);
  if (dtype == "fp4")
    usage_fail(
        "hardware '{}' has no FP4 peak ({} does not run FP4 natively; FP4 needs Blackwell tensor cores): "
        "use --compute fp8 or bf16 (4-bit weights with --weights mxfp4 still halve the bytes)",
        name, description);
  if (auto it = peak_flops.find("f32"); it != peak_flops.end()) return it->second;
  fail("hardware profile '{}' has no peak for {} or f32", name, dtype);
}

namespace {

// The serving engines' scheduler defaults (engine_preset; sources in docs/simulator.md,
// "Engines' schedulers").
// vLLM 0.11's OpenAI server on a GPU of 70 GiB or more (A100s aside; scheduling_for gives the
// others'), chunked prefill always on.
constexpr int64_t kVllmMaxSeqs = 1024, kVllmBatchTokens = 8192;
constexpr int64_t kVllmSmallMaxSeqs = 256, kVllmSmallBatchTokens = 2048;
constexpr double kVllmAdmitLayerS = 0.8e-3;  // aiconfigurator's vLLM prefill dispatch a layer
// SGLang 0.5: max_running_requests min(K/V tokens / 2, request pool clamped to [2048, 4096]),
// max_prefill_tokens 16384 and chunked_prefill_size by memory (8192 on H100/H200), unmixed.
constexpr int64_t kSglangMaxSeqs = 2048, kSglangChunkTokens = 8192;
// TensorRT-LLM 1.x: max_batch_size 2048, max_num_tokens 8192, chunked prefill off,
// GUARANTEED_NO_EVICT, tokens_per_block 32.
constexpr int64_t kTrtllmMaxSeqs = 2048, kTrtllmBatchTokens = 8192;

bool is_scheduling_key(const std::string& k) {
  for (const char* n : {"max_seqs", "max_batch_tokens", "chunk_tokens", "kv_block_tokens", "iteration_us",
                        "request_us", "admit_layer_us", "kernel_scale", "mixed", "kv"})
    if (k == n) return true;
  return false;
}

// One scheduling key of a profile's 'engine' object into `s`; false for a key that is not one.
bool parse_scheduling_key(Scheduling& s, const std::string& k, const json& v, const std::string& origin) {
  const auto count = [&](int64_t lo) {
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > (int64_t(1) << 24))
      fail("{}: 'engine.{}' must be a whole number from {} to 16777216", origin, k, lo);
    return v.get<int64_t>();
  };
  const auto micros = [&] {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 || v.get<double>() > 1e7)
      fail("{}: 'engine.{}' must be a time in microseconds from 0 to 1e7", origin, k);
    return v.get<double>() * 1e-6;
  };
  if (k == "max_seqs")
    s.max_seqs = count(0);
  else if (k == "max_batch_tokens")
    s.max_batch_tokens = count(1);
  else if (k == "chunk_tokens")
    s.chunk_tokens = count(0);
  else if (k == "kv_block_tokens")
    s.kv_block_tokens = count(1);
  else if (k == "iteration_us")
    s.iteration_s = micros();
  else if (k == "request_us")
    s.request_s = micros();
  else if (k == "admit_layer_us")
    s.admit_layer_s = micros();
  else if (k == "kernel_scale") {
    if (!v.is_number() || !(v.get<double>() >= 0.01) || !(v.get<double>() <= 100))
      fail("{}: 'engine.kernel_scale' must be a number from 0.01 to 100", origin);
    s.kernel_scale = v.get<double>();
  } else if (k == "mixed") {
    if (!v.is_boolean()) fail("{}: 'engine.mixed' must be true or false", origin);
    s.mixed = v.get<bool>();
  } else if (k == "kv") {
    if (!v.is_string() || (v != "reserve" && v != "on_demand"))
      fail("{}: 'engine.kv' must be \"reserve\" or \"on_demand\"", origin);
    s.kv = v == "reserve" ? Scheduling::Kv::Reserve : Scheduling::Kv::OnDemand;
  } else {
    return false;
  }
  return true;
}

}  // namespace

Profile parse_profile(const json& j, const std::string& origin) {
  if (!j.is_object()) fail("{}: a hardware profile must be a JSON object", origin);
  const json& version = json_member(j, "lazyprefill_hw", origin);
  if (!version.is_number_integer() || version.get<int64_t>() != 1)  // not get<int>: 4294967297 reads as 1
    fail("{}: 'lazyprefill_hw' must be 1 (this build reads version 1 profiles)", origin);
  Profile p;
  p.json = j;
  p.name = text(j, "name", origin);
  p.description = text(j, "description", origin);
  p.kind = text(j, "kind", origin);
  if (p.kind != "gpu" && p.kind != "cpu")
    fail("{}: 'kind' must be \"gpu\" or \"cpu\", got \"{}\"", origin, p.kind);

  if (const auto it = j.find("aliases"); it != j.end()) {
    if (!it->is_array()) fail("{}: 'aliases' must be an array of names", origin);
    for (const json& a : *it) {
      if (!a.is_string() || a.get<std::string>().empty())
        fail("{}: 'aliases' must hold non-empty strings", origin);
      p.aliases.push_back(a.get<std::string>());
    }
  }

  const json& peaks = json_member(j, "peak_tflops", origin);
  if (!peaks.is_object() || peaks.empty())
    fail("{}: 'peak_tflops' must be an object of dtype: TFLOP/s", origin);
  for (const auto& [dtype, v] : peaks.items()) {
    static const std::vector<std::string> known = {"f32", "tf32", "bf16", "f16", "int8", "fp8", "fp4"};
    if (std::find(known.begin(), known.end(), dtype) == known.end())
      fail("{}: unknown dtype '{}' in 'peak_tflops' (known: f32, tf32, bf16, f16, int8, fp8, fp4)", origin,
           dtype);
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      fail("{}: 'peak_tflops.{}' must be a number greater than 0", origin, dtype);
    p.peak_flops[dtype] = v.get<double>() * 1e12;
  }
  p.memory_bandwidth = positive(j, "memory_bandwidth_gbs", origin) * 1e9;
  p.memory_capacity = positive(j, "memory_capacity_gib", origin) * 1073741824.0;
  // Bounded so that every count derived from it (sequences that fit) stays an exact integer.
  if (p.memory_capacity > 1048576.0 * 1073741824.0)
    fail("{}: 'memory_capacity_gib' must be at most 1048576 (1 PiB)", origin);
  p.onchip_cache = positive(j, "onchip_cache_mib", origin) * 1048576.0;
  p.shared_memory_per_unit = positive(j, "shared_memory_kib_per_unit", origin) * 1024.0;
  const double units = positive(j, "compute_units", origin);
  if (units != std::floor(units) || units > 1e6) fail("{}: 'compute_units' must be a whole number", origin);
  p.compute_units = int(units);
  p.dispatch_overhead = positive(j, "dispatch_overhead_us", origin, true) * 1e-6;
  p.interconnect_bandwidth = positive(j, "interconnect_bandwidth_gbs", origin, true) * 1e9;
  p.interconnect_latency = positive(j, "interconnect_latency_us", origin, true) * 1e-6;
  const double max_tp = positive(j, "max_tp", origin);
  if (max_tp != std::floor(max_tp) || max_tp > 4096)
    fail("{}: 'max_tp' must be a whole number of GPUs", origin);
  p.max_tp = int(max_tp);
  if (p.max_tp > 1 && p.interconnect_bandwidth <= 0)
    fail("{}: 'max_tp' is {} but 'interconnect_bandwidth_gbs' is 0", origin, p.max_tp);
  // Optional: the network between nodes, per GPU (data-parallel attention's all-to-all beyond a
  // node); absent, one 400 Gb/s NIC a GPU (50 GB/s, 5 us) on a GPU, none on a CPU.
  const bool gpu = p.kind == "gpu";
  p.scale_out_bandwidth =
      (j.contains("scale_out_bandwidth_gbs") ? positive(j, "scale_out_bandwidth_gbs", origin)
       : gpu                                 ? 50.0
                                             : 0.0) *
      1e9;
  p.scale_out_latency =
      (j.contains("scale_out_latency_us") ? positive(j, "scale_out_latency_us", origin, true)
       : gpu                              ? 5.0
                                          : 0.0) *
      1e-6;

  const json& eff = json_member(j, "efficiency", origin);
  if (!eff.is_object()) fail("{}: 'efficiency' must be an object", origin);
  const json& def = json_member(eff, "default", origin);
  if (!def.is_boolean()) fail("{}: 'efficiency.default' must be true or false", origin);
  p.efficiency_default = def.get<bool>();
  for (int f = 0; f < kNumFamilies; ++f) {
    const std::string where = origin + ": efficiency." + kFamilyKeys[size_t(f)];
    if (Family(f) == Family::Experts) {  // optional: absent, the GEMMs' (Profile::eff)
      p.efficiency[size_t(f)] = p.efficiency[size_t(Family::Gemm)];
      if (!eff.contains("experts")) continue;
      p.experts_own = true;
    }
    const json& e = json_member(eff, kFamilyKeys[size_t(f)], origin + ": efficiency");
    if (!e.is_object()) fail("{} must be an object", where);
    Efficiency& x = p.efficiency[size_t(f)];
    x.compute = positive(e, "compute", where);
    x.memory = positive(e, "memory", where);
    if (x.compute > 1) fail("{}: 'compute' is a share of peak, at most 1", where);
    if (x.memory > kMaxMemoryEfficiency)
      fail("{}: 'memory' is effective over peak bandwidth, at most {} (caches)", where, kMaxMemoryEfficiency);
    x.half_rows = positive(e, "half_rows", where, true);
    x.overhead_s = positive(e, "overhead_us", where, true) * 1e-6;
    if (const auto it = e.find("compute_by_dtype"); it != e.end()) {
      if (!it->is_object()) fail("{}: 'compute_by_dtype' must be an object of dtype: share", where);
      for (const auto& [dtype, v] : it->items()) {
        if (!is_compute_dtype(dtype))
          fail(
              "{}: 'compute_by_dtype' names '{}', not a compute dtype (f32, tf32, bf16, f16, int8, fp8, fp4)",
              where, dtype);
        const double share = positive(*it, dtype.c_str(), where + ".compute_by_dtype");
        if (share > 1) fail("{}: 'compute_by_dtype.{}' is a share of peak, at most 1", where, dtype);
        x.compute_by_dtype[dtype] = share;
      }
    }
    if (e.contains("decode_compute")) {
      if (Family(f) != Family::Attention) fail("{}: 'decode_compute' is attention's alone", where);
      x.decode_compute = positive(e, "decode_compute", where);
      if (x.decode_compute > 1) fail("{}: 'decode_compute' is a share of peak, at most 1", where);
    }
    if (e.contains("listed_compute") || e.contains("listed_memory")) {
      if (Family(f) != Family::Attention)
        fail("{}: 'listed_compute' and 'listed_memory' are attention's alone", where);
      if (!e.contains("listed_compute") || !e.contains("listed_memory"))
        fail("{}: 'listed_compute' and 'listed_memory' come together", where);
      x.listed_compute = positive(e, "listed_compute", where);
      x.listed_memory = positive(e, "listed_memory", where);
      if (x.listed_compute > 1) fail("{}: 'listed_compute' is a share of peak, at most 1", where);
      if (x.listed_memory > kMaxMemoryEfficiency)
        fail("{}: 'listed_memory' is effective over peak bandwidth, at most {} (caches)", where,
             kMaxMemoryEfficiency);
    }
  }

  p.pruning_stage_s = eff.contains("pruning_stage_us")
                          ? positive(eff, "pruning_stage_us", origin + ": efficiency", true) * 1e-6
                          : default_pruning_stage_s(p.kind, p.dispatch_overhead);
  p.pruning_key_s = eff.contains("pruning_key_ns")
                        ? positive(eff, "pruning_key_ns", origin + ": efficiency", true) * 1e-9
                        : 0;
  p.engine = default_engine(p.kind);
  if (const auto it = j.find("engine"); it != j.end()) {
    if (it->is_string()) {
      try {
        p.engine = engine_preset(it->get<std::string>());
      } catch (const UsageError& e) {
        fail("{}: 'engine': {}", origin, e.what());
      }
    } else if (it->is_object()) {
      p.engine = Engine{"custom", false, false, false, false, 0, Scheduling{}};
      if (const auto pre = it->find("preset"); pre != it->end()) {
        if (!pre->is_string()) fail("{}: 'engine.preset' must be a preset name", origin);
        try {
          p.engine = engine_preset(pre->get<std::string>());
        } catch (const UsageError& e) {
          fail("{}: 'engine.preset': {}", origin, e.what());
        }
      }
      json scheduling_keys = json::object();  // applied below, over the preset's values for this part
      for (const auto& [k, v] : it->items()) {
        if (k == "preset") continue;
        if (is_scheduling_key(k)) {
          scheduling_keys[k] = v;
          continue;
        }
        if (k == "elementwise") {
          if (!v.is_string() || (v != "f32" && v != "compute"))
            fail("{}: 'engine.elementwise' must be \"f32\" or \"compute\"", origin);
          p.engine.elementwise_at_compute = v == "compute";
        } else if (k == "fuse") {
          if (!v.is_array()) fail("{}: 'engine.fuse' must be an array", origin);
          for (const json& f : v) {
            const std::string n = f.is_string() ? f.get<std::string>() : f.dump();
            if (n == "add_rmsnorm")
              p.engine.fuse_add_rmsnorm = true;
            else if (n == "rope")
              p.engine.fuse_rope = true;
            else if (n == "swiglu")
              p.engine.fuse_swiglu = true;
            else
              fail("{}: 'engine.fuse': unknown fusion '{}' (known: add_rmsnorm, rope, swiglu)", origin, n);
          }
        } else if (k == "own_gemm_rows") {
          if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t(1) << 24))
            fail("{}: 'engine.own_gemm_rows' must be a whole number from 0 to 16777216", origin);
          p.engine.own_gemm_rows = v.get<int64_t>();
        } else {
          fail(
              "{}: 'engine': unknown key '{}' (a preset name, or an object of preset, elementwise, fuse, "
              "own_gemm_rows, max_seqs, max_batch_tokens, chunk_tokens, kv, kv_block_tokens, mixed, "
              "iteration_us, request_us, admit_layer_us, kernel_scale)",
              origin, k);
        }
      }
      if (!scheduling_keys.empty()) {
        const Scheduling base = scheduling_for(p);  // memory_capacity and kind are read by now
        p.engine.scheduling = base;
        for (const auto& [k, v] : scheduling_keys.items())
          parse_scheduling_key(p.engine.scheduling, k, v, origin);
        p.engine.scheduling.by_memory = false;
      }
    } else {
      fail("{}: 'engine' must be a preset name or an object", origin);
    }
  }
  p.interconnect_efficiency = positive(eff, "interconnect", origin + ": efficiency");
  if (p.interconnect_efficiency > 1)
    fail("{}: 'efficiency.interconnect' is a share of the bandwidth, at most 1", origin);

  const json& src = json_member(j, "sources", origin);
  if (!src.is_object()) fail("{}: 'sources' must be an object of field: source", origin);
  for (const auto& [k, v] : src.items()) {
    if (!v.is_string() || v.get<std::string>().empty())
      fail("{}: 'sources.{}' must be a non-empty string", origin, k);
    p.sources[k] = v.get<std::string>();
  }
  for (const char* k : {"peak_tflops", "memory_bandwidth_gbs", "memory_capacity_gib", "onchip_cache_mib",
                        "shared_memory_kib_per_unit", "compute_units", "dispatch_overhead_us",
                        "interconnect_bandwidth_gbs", "interconnect_latency_us", "max_tp", "efficiency"})
    if (!p.sources.count(k))
      fail("{}: 'sources' has no entry for '{}' (every number needs a source)", origin, k);
  return p;
}

std::vector<std::string> engine_names() {
  return {"lazyprefill", "llamacpp", "vllm", "sglang", "trtllm"};
}

// The schedulers' defaults: docs/simulator.md, "Engines' schedulers", gives each value's source.
Engine engine_preset(const std::string& name) {
  using Kv = Scheduling::Kv;
  // This engine's server (serve's defaults: --max-batch-tokens 2048, whole prefills, reservations
  // of the CPU backend's 64-slot blocks).
  if (name == "lazyprefill") return Engine{name, false, false, false, false, 64, Scheduling{}};
  if (name == "llamacpp") return Engine{name, false, false, false, false, 0, Scheduling{}};
  if (name == "vllm") {
    Engine e{name, true, true, false, false, 0, Scheduling{}};
    e.scheduling = {kVllmMaxSeqs,    kVllmBatchTokens, kVllmBatchTokens, Kv::OnDemand, 16, true, 0, 0,
                    kVllmAdmitLayerS};
    return e;
  }
  if (name == "sglang") {
    Engine e{name, true, true, false, false, 0, Scheduling{}};
    e.scheduling = {kSglangMaxSeqs, kSglangChunkTokens, kSglangChunkTokens, Kv::OnDemand, 1, false};
    return e;
  }
  if (name == "trtllm") {
    Engine e{name, true, true, true, true, 0, Scheduling{}};
    e.scheduling = {kTrtllmMaxSeqs, kTrtllmBatchTokens, 0, Kv::Reserve, 32, true};
    return e;
  }
  usage_fail("unknown engine '{}' (known: lazyprefill, llamacpp, vllm, sglang, trtllm)", name);
}

Scheduling scheduling_for(const Profile& p) {
  Scheduling s = p.engine.scheduling;
  if (!s.by_memory || p.kind != "gpu") return s;
  const double gib = p.memory_capacity / double(int64_t(1) << 30), gb = p.memory_capacity / 1e9;
  if (p.engine.name == "vllm") {
    std::string name = p.name + " " + p.description;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char ch) { return char(std::tolower(ch)); });
    if (gib < 70 || name.find("a100") != std::string::npos)
      s.max_seqs = kVllmSmallMaxSeqs, s.max_batch_tokens = s.chunk_tokens = kVllmSmallBatchTokens;
  } else if (p.engine.name == "sglang") {
    s.chunk_tokens = gb < 35 ? 2048 : gb < 60 ? 4096 : gb < 160 ? 8192 : 16384;
    s.max_batch_tokens =
        s.chunk_tokens;  // a prefill batch: at most one chunk's tokens (of max_prefill_tokens' 16384)
  }
  return s;
}

Engine default_engine(const std::string& kind) {
  return engine_preset(kind == "gpu" ? "vllm" : "lazyprefill");
}

double default_pruning_stage_s(const std::string& kind, double dispatch_overhead_s) {
  return kind == "gpu" ? 40e-6 : 2 * dispatch_overhead_s;
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : builtin_profile_files()) names.emplace_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

Profile load_profile(const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.ends_with(".json"));
  if (is_path) {
    const std::string text = read_input_file(name_or_path, "hardware profile", input_cap::kSmallJson);
    json j;
    try {
      j = json_parse<json>(text, "hardware profile '" + name_or_path + "'");
    } catch (const json::exception& e) {
      fail("hardware profile '{}' is not valid JSON: {}", name_or_path, e.what());
    }
    return parse_profile(j, name_or_path);
  }
  for (const auto& [name, text] : builtin_profile_files())
    if (name == name_or_path) {
      const std::string origin = "built-in profile '" + name_or_path + "'";
      Profile p = parse_profile(json::parse(text), origin);
      if (p.name != name_or_path) fail("{}: its 'name' is '{}'", origin, p.name);
      return p;
    }
  std::string known;
  for (const std::string& n : builtin_profile_names()) {
    if (!known.empty()) known += ", ";
    known += n;
  }
  usage_fail("unknown hardware '{}' (known: {}; or a path to a profile .json)", name_or_path, known);
}

json efficiency_json(const Profile& p) {
  json e = {{"default", p.efficiency_default}};
  for (int f = 0; f < kNumFamilies; ++f) {
    if (Family(f) == Family::Experts && !p.experts_own) continue;
    const Efficiency& x = p.efficiency[size_t(f)];
    json& fam = e[kFamilyKeys[size_t(f)]] = {{"compute", x.compute},
                                             {"half_rows", x.half_rows},
                                             {"memory", x.memory},
                                             {"overhead_us", x.overhead_s * 1e6}};
    if (!x.compute_by_dtype.empty()) fam["compute_by_dtype"] = x.compute_by_dtype;
    if (x.decode_compute > 0) fam["decode_compute"] = x.decode_compute;
    if (x.listed_compute > 0)
      fam["listed_compute"] = x.listed_compute, fam["listed_memory"] = x.listed_memory;
  }
  e["pruning_stage_us"] = p.pruning_stage_s * 1e6;
  if (p.pruning_key_s > 0) e["pruning_key_ns"] = p.pruning_key_s * 1e9;
  e["interconnect"] = p.interconnect_efficiency;
  return e;
}

Profile share_of(const Profile& p, double share) {
  if (!(share > 0 && share <= 1)) fail("a share of the device must be in (0, 1], got {}", share);
  Profile s = p;
  for (auto& [dtype, flops] : s.peak_flops) flops *= share;
  s.memory_bandwidth *= share;
  return s;
}

double thread_share(const Profile& p, int threads) {
  if (p.kind != "cpu" || threads <= 0 || p.compute_units <= 0) return 1;
  return std::min(1.0, double(threads) / double(p.compute_units));
}

}  // namespace lp::hw
