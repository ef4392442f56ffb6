#include "calibrate/measurement_points.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/digest.h"
#include "model/error.h"
#include "model/presets.h"
#include "sim/replay.h"

namespace lp::calib {

MeasurementSet read_measurement_set(const std::vector<std::string>& paths) {
  MeasurementSet set;
  std::vector<Measurement> records;
  for (const std::string& f : paths) {
    std::vector<MeasurementSource> read;
    std::vector<Measurement> ms = import_measurements(f, &read);
    MeasurementFile file{f, sha256_hex(read.at(0).bytes, f), ms.size(), {}};
    for (size_t i = 1; i < read.size(); ++i)
      file.side_files.emplace_back(read[i].path, sha256_hex(read[i].bytes, read[i].path));
    // The same file twice would count its figures as repetitions of themselves.
    for (const MeasurementFile& earlier : set.files)
      if (earlier.sha256 == file.sha256)
        usage_fail("{} and {} hold the same bytes: give each measurement file once", earlier.path, f);
    set.files.push_back(std::move(file));
    for (Measurement& m : ms) records.push_back(std::move(m));
  }
  // Records of one point (a benchmark run again) are repetitions: averaged, not refused.
  set.records = merge_repetitions(std::move(records), &set.repeated);
  return set;
}

std::string PointSelection::skipped(const std::string& base) const {
  std::string s;
  const auto add = [&](const std::string& what) { s += (s.empty() ? "" : "; ") + what; };
  if (under_load) add(fmt::format("{} measured under load (TTFT includes queueing)", under_load));
  if (pruned_decode)
    add(fmt::format("{} decode latencies of pruned runs (revivals not modelled)", pruned_decode));
  if (cached_context) add(fmt::format("{} prompts after a cached context (not modelled)", cached_context));
  for (const auto& [p, k] : other_hw) add(fmt::format("{} on {} (--base is {})", k, p, base));
  return s;
}

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string known_hardware() {
  std::string s;
  for (const std::string& n : hw::builtin_profile_names()) {
    const hw::Profile p = hw::load_profile(n);
    s += (s.empty() ? "" : ", ") + n;
    if (!p.aliases.empty()) s += " (" + join(p.aliases) + ")";
  }
  return s;
}

bool same_name(const std::string& a, const std::string& b) {
  return name_key(a) == name_key(b);
}

// The profile a record's hardware names: mapped, the base's (its name or an alias), or a
// built-in one's; "" for a record without a hardware name.
std::string profile_of(const Measurement& m, const hw::Profile& base, const PointMapping& map) {
  if (m.hardware.empty()) return "";
  if (const auto it = map.hardware.find(m.hardware); it != map.hardware.end()) return it->second;
  if (same_name(m.hardware, base.name) ||
      std::any_of(base.aliases.begin(), base.aliases.end(),
                  [&](const std::string& al) { return same_name(al, m.hardware); }))
    return base.name;
  if (const auto p = match_profile(m.hardware, {})) return *p;
  usage_fail("{}: record {}: unknown hardware '{}' (known: {}); map it with --hw-map '{}=PROFILE'", m.file,
             m.record, m.hardware, known_hardware(), m.hardware);
}

}  // namespace

PointSelection select_points(const MeasurementSet& set, const hw::Profile& base, const PointMapping& map) {
  const bool force_all = !map.weights.empty() && !map.compute.empty() && !map.kv.empty();
  PointSelection sel;
  for (const Measurement& m : set.records) {
    if (!m.note.empty()) ++sel.notes[m.note];
    if (!m.isolated) {
      ++sel.under_load;
      continue;
    }
    // A prompt processed after a cached context (llama-bench -d) is a prefill over more keys than
    // its rows, which the synthetic traces do not model.
    if (m.ttft_ms && m.context_tokens > 0) {
      ++sel.cached_context;
      continue;
    }
    // A pruned run's first decoding steps revive tokens, which a synthetic trace (steady state)
    // does not model: its decode latency would mislead the fit.
    if (!m.ttft_ms && m.method != "none") {
      ++sel.pruned_decode;
      continue;
    }
    std::string profile = profile_of(m, base, map);
    if (profile.empty()) {
      ++sel.unnamed_hw;
      profile = base.name;
    }
    if (profile != base.name) {
      ++sel.other_hw[profile];
      continue;
    }
    const auto preset = match_preset(m.model, map.models);
    if (!preset)
      usage_fail("{}: record {}: unknown model '{}' (known presets: {}); map it with --model-map '{}=PRESET'",
                 m.file, m.record, m.model, join(preset_names()), m.model);
    const ModelConfig cfg = preset_config(*preset);
    sim::Precision prec;
    if (!force_all) {
      try {
        prec = precision_for_dtype(m.dtype);
      } catch (const Error& e) {
        usage_fail("{}: record {}: {}", m.file, m.record, e.what());
      }
    }
    // A quantized file's real mean bits per weight (llama-bench records them) over its type's nominal.
    if (m.weight_bits > 0 && prec.weights.ends_with("bpw")) prec.weights = bpw_dtype(m.weight_bits);
    if (!map.weights.empty()) prec.weights = map.weights;
    if (!map.compute.empty()) prec.compute = map.compute;
    if (!map.kv.empty()) prec.kv = map.kv;
    try {
      sim::check_tp(cfg, base, m.tp);
    } catch (const Error& e) {
      usage_fail("{}: record {}: {}", m.file, m.record, e.what());
    }
    sel.points.push_back(make_point(m, *preset, cfg, prec));
  }
  if (sel.points.empty()) {
    const std::string skipped = sel.skipped(base.name);
    fail("no measurement to fit {} to: {} record(s) read{}", base.name, set.records.size(),
         skipped.empty() ? "" : ", skipped: " + skipped);
  }
  return sel;
}

}  // namespace lp::calib
