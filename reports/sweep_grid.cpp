#include "reports/sweep_grid.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "pruning/method.h"
#include "pruning/schedule.h"

namespace lp::report {

std::string SweepLayout::name() const {
  std::string s = fmt::format("tp{}", tp);
  if (dp > 1) s += fmt::format(" dp{}", dp);
  if (ep > 1) s += fmt::format(" ep{}", ep);
  if (pp > 1) s += fmt::format(" pp{}", pp);
  if (moe_imbalance > 0) s += fmt::format(" imbalance{}", moe_imbalance);
  return s;
}

namespace {
using json = nlohmann::json;

// Keys a grid (and a method, and a precision) may have: anything else is a typo that would
// otherwise be ignored silently ("shedule" gave unpruned rows labelled lazyllm).
void only_known_keys(const json& obj, std::initializer_list<const char*> known, const std::string& path,
                     const std::string& where) {
  for (const auto& item : obj.items()) {
    const std::string& k = item.key();
    if (std::none_of(known.begin(), known.end(), [&](const char* n) { return k == n; })) {
      std::string names;
      for (const char* n : known) names += (names.empty() ? "" : ", ") + std::string(n);
      fail("{}: {}unknown key '{}' (known: {})", path, where, k, names);
    }
  }
}

// An integer field in [lo, hi]; a fraction (1.5), a string or a value out of range is refused.
int64_t integer(const json& v, int64_t lo, int64_t hi, const std::string& path, const std::string& what) {
  if (!v.is_number_integer()) fail("{}: {} must be a whole number, got {}", path, what, v.dump());
  const std::optional<int64_t> x = json_integer(v, lo, hi);
  if (!x) fail("{}: {} must be in [{}, {}], got {}", path, what, lo, hi, v.dump());
  return *x;
}

template <class T>
std::vector<T> list(const json& g, const char* key, const std::string& path) {
  if (!g.contains(key) || !g[key].is_array() || g[key].empty())
    fail("{}: '{}' must be a non-empty array", path, key);
  try {
    return g[key].get<std::vector<T>>();
  } catch (const json::exception& e) {
    fail("{}: '{}': {}", path, key, e.what());
  }
}
}  // namespace

SweepGrid read_sweep_grid(const std::string& path) {
  SweepGrid grid;
  const std::string grid_text = read_input_file(path, "sweep grid", input_cap::kSmallJson);
  json g;
  try {
    g = json_parse(grid_text, path);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  if (!g.is_object() || !g.contains("lazyprefill_sweep"))
    fail("{}: not a sweep grid (\"lazyprefill_sweep\": 1)", path);
  if (integer(g["lazyprefill_sweep"], 0, 1 << 30, path, "lazyprefill_sweep") != 1)
    fail("{}: sweep grid version {} is not supported (1 is)", path, g["lazyprefill_sweep"].dump());
  only_known_keys(g,
                  {"lazyprefill_sweep", "hardware", "models", "methods", "prompt_lengths", "new_tokens",
                   "batch", "precision", "engine", "revival_model", "revival_share", "map", "layouts"},
                  path, "");
  for (const std::string& h : list<std::string>(g, "hardware", path)) {
    grid.hws.push_back(hw::load_profile(h));
    if (g.contains("engine")) {
      if (!g["engine"].is_string()) fail("{}: 'engine' must be a preset name", path);
      grid.hws.back().engine = hw::engine_preset(g["engine"].get<std::string>());
    }
  }
  grid.model_names = list<std::string>(g, "models", path);
  for (const std::string& m : grid.model_names) grid.models.push_back(preset_config(m));
  for (const json& m : list<json>(g, "methods", path)) {
    if (!m.is_object())
      fail("{}: methods: each method is an object such as {{\"policy\": \"lazyllm\"}}", path);
    only_known_keys(m, {"policy", "schedule"}, path, "methods: ");
    for (const char* k : {"policy", "schedule"})
      if (m.contains(k) && !m[k].is_string()) fail("{}: methods: '{}' must be a string", path, k);
    if (m.contains("schedule") && m["schedule"].get<std::string>().empty())
      fail("{}: methods: an empty schedule; give one, or none for no pruning", path);
    const std::string policy = m.value("policy", std::string());
    // Grids written before the paper's baselines existed say "static" and "random": read as today's.
    const std::optional<PolicyKind> kind = policy_in_file(policy);
    if (!kind) fail("{}: methods: {}", path, check_policy_arg(policy));
    Method x{*kind, {}};
    if (x.policy != PolicyKind::None) x.schedule = parse_schedule(m.value("schedule", std::string("none")));
    if (const std::string why = method_problem(x.policy, x.schedule); !why.empty())
      fail("{}: methods: {}", path, why);
    for (const ModelConfig& c : grid.models)
      resolve_method(x.policy, x.schedule, c.n_layer, c.global_layers());  // validate early
    grid.methods.push_back(x);
  }
  for (const json& n : list<json>(g, "prompt_lengths", path))
    grid.lengths.push_back(integer(n, 1, int64_t(1) << 24, path, "prompt_lengths: a length"));
  grid.new_tokens =
      g.contains("new_tokens") ? integer(g["new_tokens"], 0, int64_t(1) << 20, path, "new_tokens") : 0;
  grid.batch = g.contains("batch") ? integer(g["batch"], 1, 1 << 16, path, "batch") : 1;
  if (g.contains("precision")) {
    const json& p = g["precision"];
    if (!p.is_object()) fail("{}: 'precision' must be an object with weights, compute and kv", path);
    only_known_keys(p, {"weights", "compute", "kv"}, path, "precision: ");
    for (const char* k : {"weights", "compute", "kv"})
      if (p.contains(k) && !p[k].is_string()) fail("{}: precision: '{}' must be a dtype name", path, k);
    grid.precision = {p.value("weights", grid.precision.weights), p.value("compute", grid.precision.compute),
                      p.value("kv", grid.precision.kv)};
  }
  sim::validate(grid.precision);
  // Decoding revivals: the built-in revival model unless the grid names a file or a constant share.
  if (g.contains("revival_model") && !g["revival_model"].is_string())
    fail("{}: 'revival_model' must be a file name (or \"builtin\")", path);
  if (g.contains("revival_share") && !g["revival_share"].is_number())
    fail("{}: 'revival_share' must be a number in [0, 1]", path);
  if (g.contains("map") && !g["map"].is_boolean()) fail("{}: 'map' must be true or false", path);
  grid.revival_model = g.value("revival_model", std::string());
  grid.revival_share = g.value("revival_share", -1.0);
  if (g.contains("revival_share") && !(grid.revival_share >= 0 && grid.revival_share <= 1))
    fail("{}: revival_share must be in [0, 1]", path);
  if (g.contains("revival_share") && g.contains("revival_model"))
    fail("{}: give revival_model or revival_share, not both", path);
  grid.map = g.value("map", false);
  if (g.contains("layouts")) {
    grid.layouts.clear();
    for (const json& l : list<json>(g, "layouts", path)) {
      if (!l.is_object())
        fail("{}: layouts: each layout is an object such as {{\"tp\": 8, \"pp\": 2}}", path);
      only_known_keys(l, {"tp", "dp", "ep", "pp", "moe_imbalance"}, path, "layouts: ");
      SweepLayout x;
      const auto degree = [&](const char* k) {
        return l.contains(k) ? int(integer(l[k], 1, 4096, path, std::string("layouts: ") + k)) : 1;
      };
      x.tp = degree("tp"), x.dp = degree("dp"), x.ep = degree("ep"), x.pp = degree("pp");
      if (l.contains("moe_imbalance")) {
        if (!l["moe_imbalance"].is_number() || !(l["moe_imbalance"].get<double>() >= 1))
          fail("{}: layouts: moe_imbalance must be a number of at least 1", path);
        x.moe_imbalance = l["moe_imbalance"].get<double>();
      }
      grid.layouts.push_back(x);
    }
  }
  return grid;
}

}  // namespace lp::report
