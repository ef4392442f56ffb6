// `lazyprefill sweep`: simulate a grid of hardware x models x schedules x prompt lengths in
// parallel (oneTBB), one JSON line per configuration, resumable.
#include <fmt/format.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/io.h"
#include "model/presets.h"
#include "sim/replay.h"
#include "traces/schedule.h"
#include "traces/synthetic.h"

namespace lp::cli {

namespace {
using json = nlohmann::json;

// Configurations one sweep may hold (about 100 MiB of work list): a grid of a few lines can name
// billions.
constexpr int64_t kMaxConfigurations = int64_t(1) << 22;

struct Config {
  size_t hw, model, method;
  int64_t tokens;
};

struct Method {
  std::string policy, schedule;
};

std::string key_of(const std::string& hw, const std::string& model, const std::string& policy,
                   const std::string& schedule, int64_t tokens) {
  return fmt::format("{}|{}|{}|{}|{}", hw, model, policy, schedule, tokens);
}

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
  // Non-negative JSON integers are unsigned: a huge one is out of range before the signed read.
  if ((v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) || v.get<int64_t>() < lo ||
      v.get<int64_t>() > hi)
    fail("{}: {} must be in [{}, {}], got {}", path, what, lo, hi, v.dump());
  return v.get<int64_t>();
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

CLI::App* add_sweep(CLI::App& app, SweepArgs& a) {
  auto* s = app.add_subcommand(
      "sweep",
      "Simulate a grid of hardware x models x schedules x prompt lengths, one JSON line per configuration.\n"
      "  lazyprefill sweep --grid grid.json --out sweep.jsonl   # rerun to resume: rows already there are "
      "kept\n"
      "  grid.json: {\"lazyprefill_sweep\": 1, \"hardware\": [\"h100-sxm\", \"l4\"], \"models\": "
      "[\"llama-3.1-8b\"],\n"
      "              \"methods\": [{\"policy\": \"none\"}, {\"policy\": \"lazyllm\", \"schedule\": "
      "\"0.3:0.3,0.6:0.3,0.9:0.3\"}],\n"
      "              \"prompt_lengths\": [1024, 4096, 16384]}");
  s->add_option("--grid", a.grid, "The grid (JSON, see above and docs/simulator.md)")->required();
  s->add_option("--out", a.out, "JSON Lines output; configurations already in it are skipped")->required();
  s->add_option("--threads", a.threads, "Threads (default: all this process may use)")
      ->check(CLI::Range(1, 1024));
  return s;
}

int cmd_sweep(const SweepArgs& a) {
  const std::string grid_text = read_input_file(a.grid, "sweep grid", input_cap::kSmallJson);
  json g;
  try {
    g = json::parse(grid_text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", a.grid, e.what());
  }
  if (!g.is_object() || !g.contains("lazyprefill_sweep"))
    fail("{}: not a sweep grid (\"lazyprefill_sweep\": 1)", a.grid);
  if (integer(g["lazyprefill_sweep"], 0, 1 << 30, a.grid, "lazyprefill_sweep") != 1)
    fail("{}: sweep grid version {} is not supported (1 is)", a.grid, g["lazyprefill_sweep"].dump());
  only_known_keys(g,
                  {"lazyprefill_sweep", "hardware", "models", "methods", "prompt_lengths", "new_tokens",
                   "batch", "precision", "engine", "revival_model", "revival_share", "map"},
                  a.grid, "");
  {
    std::error_code ec;
    if (std::filesystem::exists(a.out, ec) && std::filesystem::equivalent(a.grid, a.out, ec))
      usage_fail("--out '{}' is the grid itself; the sweep would overwrite it", a.out);
  }
  std::vector<hw::Profile> hws;
  for (const std::string& h : list<std::string>(g, "hardware", a.grid)) {
    hws.push_back(hw::load_profile(h));
    if (g.contains("engine")) {
      if (!g["engine"].is_string()) fail("{}: 'engine' must be a preset name", a.grid);
      hws.back().engine = hw::engine_preset(g["engine"].get<std::string>());
    }
  }
  const auto model_names = list<std::string>(g, "models", a.grid);
  std::vector<ModelConfig> models;
  for (const std::string& m : model_names) models.push_back(preset_config(m));
  std::vector<Method> methods;
  for (const json& m : list<json>(g, "methods", a.grid)) {
    if (!m.is_object())
      fail("{}: methods: each method is an object such as {{\"policy\": \"lazyllm\"}}", a.grid);
    only_known_keys(m, {"policy", "schedule"}, a.grid, "methods: ");
    for (const char* k : {"policy", "schedule"})
      if (m.contains(k) && !m[k].is_string()) fail("{}: methods: '{}' must be a string", a.grid, k);
    if (m.contains("schedule") && m["schedule"].get<std::string>().empty())
      fail("{}: methods: an empty schedule; give one, or none for no pruning", a.grid);
    Method x{m.value("policy", std::string()), m.value("schedule", std::string("none"))};
    if (x.policy != "none" && x.policy != "lazyllm" && x.policy != "static" && x.policy != "random")
      fail("{}: methods: unknown policy '{}' (expected none, lazyllm, static, random)", a.grid, x.policy);
    if (x.policy == "none") x.schedule = "none";
    for (const ModelConfig& c : models)
      resolve_schedule(parse_schedule(x.schedule), c.n_layer);  // validate early
    x.schedule = parse_schedule(x.schedule).to_string();
    methods.push_back(x);
  }
  std::vector<int64_t> lengths;
  for (const json& n : list<json>(g, "prompt_lengths", a.grid))
    lengths.push_back(integer(n, 1, int64_t(1) << 24, a.grid, "prompt_lengths: a length"));
  const int64_t new_tokens =
      g.contains("new_tokens") ? integer(g["new_tokens"], 0, int64_t(1) << 20, a.grid, "new_tokens") : 0;
  const int64_t batch = g.contains("batch") ? integer(g["batch"], 1, 1 << 16, a.grid, "batch") : 1;
  sim::Precision prec;
  if (g.contains("precision")) {
    const json& p = g["precision"];
    if (!p.is_object()) fail("{}: 'precision' must be an object with weights, compute and kv", a.grid);
    only_known_keys(p, {"weights", "compute", "kv"}, a.grid, "precision: ");
    for (const char* k : {"weights", "compute", "kv"})
      if (p.contains(k) && !p[k].is_string()) fail("{}: precision: '{}' must be a dtype name", a.grid, k);
    prec = {p.value("weights", prec.weights), p.value("compute", prec.compute), p.value("kv", prec.kv)};
  }
  sim::validate(prec);
  // Decoding revivals: the built-in revival model unless the grid names a file or a constant share.
  if (g.contains("revival_model") && !g["revival_model"].is_string())
    fail("{}: 'revival_model' must be a file name (or \"builtin\")", a.grid);
  if (g.contains("revival_share") && !g["revival_share"].is_number())
    fail("{}: 'revival_share' must be a number in [0, 1]", a.grid);
  if (g.contains("map") && !g["map"].is_boolean()) fail("{}: 'map' must be true or false", a.grid);
  const std::string revival_model = g.value("revival_model", std::string());
  const double revival_share = g.value("revival_share", -1.0);
  if (g.contains("revival_share") && !(revival_share >= 0 && revival_share <= 1))
    fail("{}: revival_share must be in [0, 1]", a.grid);
  if (g.contains("revival_share") && g.contains("revival_model"))
    fail("{}: give revival_model or revival_share, not both", a.grid);
  const std::optional<sim::RevivalModel> revival_from = load_revivals(revival_model, revival_share);
  std::vector<RevivalChoice> revivals(models.size() * methods.size());  // [model][method]
  for (size_t m = 0; m < models.size(); ++m)
    for (size_t k = 0; k < methods.size(); ++k)
      revivals[m * methods.size() + k] = choose_revivals(
          revival_from, revival_share, methods[k].policy, models[m].n_layer,
          resolve_schedule(parse_schedule(methods[k].schedule), models[m].n_layer), g.value("map", false));

  // The output, locked for this run (a second sweep on it is refused). Resume: keep every complete
  // row already written and cut a torn last line off (a run killed mid-row); rows are appended.
  AppendFile out(a.out, "sweep output", input_cap::kTrace);
  std::set<std::string> done;
  {
    const std::string old = out.read_all();
    size_t good = 0;  // bytes of complete rows
    for (size_t at = 0; at < old.size();) {
      const size_t nl = old.find('\n', at);
      if (nl == std::string::npos) break;  // no newline: cut short
      try {
        const json r = json::parse(std::string_view(old).substr(at, nl - at));
        done.insert(
            key_of(r.at("hw"), r.at("model"), r.at("policy"), r.at("schedule"), r.at("prompt_tokens")));
      } catch (const json::exception&) {
        break;  // a line cut short by an interrupted run: everything from here is redone
      }
      good = at = nl + 1;
    }
    if (good < old.size()) out.truncate(good);
  }
  // Every configuration the grid names, checked before it is listed (a grid of a few lines can
  // name billions).
  const double configurations =
      double(models.size()) * double(hws.size()) * double(methods.size()) * double(lengths.size());
  if (configurations > double(kMaxConfigurations))
    fail("{}: the grid names {:.0f} configurations, over the limit of {} for one sweep; split it", a.grid,
         configurations, kMaxConfigurations);
  std::vector<Config> todo;
  for (size_t m = 0; m < models.size(); ++m)
    for (size_t h = 0; h < hws.size(); ++h)
      for (size_t k = 0; k < methods.size(); ++k)
        for (int64_t n : lengths) {
          if (models[m].n_ctx_train > 0 && n + std::max<int64_t>(0, new_tokens - 1) > models[m].n_ctx_train)
            continue;
          if (!done.count(key_of(hws[h].name, model_names[m], methods[k].policy, methods[k].schedule, n)))
            todo.push_back({h, m, k, n});
        }
  const bool tty = ::isatty(2);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<tbb::global_control> limit;
  if (a.threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, size_t(a.threads));
  constexpr size_t kChunk = 512;  // rows computed in parallel, then written in grid order
  std::vector<std::string> rows(kChunk);
  for (size_t c0 = 0; c0 < todo.size(); c0 += kChunk) {
    const size_t c1 = std::min(todo.size(), c0 + kChunk);
    tbb::parallel_for(c0, c1, [&](size_t i) {
      const Config& cf = todo[i];
      const ModelConfig& c = models[cf.model];
      const Method& m = methods[cf.method];
      const auto steps = resolve_schedule(parse_schedule(m.schedule), c.n_layer);
      const int64_t dec = std::max<int64_t>(0, new_tokens - 1);
      const RevivalChoice& rv = revivals[cf.model * methods.size() + cf.method];
      const sim::Prediction p =
          sim::replay_synthetic(c, m.policy, steps, cf.tokens, dec, rv.share, hws[cf.hw], prec, batch);
      const sim::Prediction b =
          sim::replay_synthetic(c, "none", {}, cf.tokens, dec, {}, hws[cf.hw], prec, batch);
      json r = {{"hw", hws[cf.hw].name},
                {"model", model_names[cf.model]},
                {"policy", m.policy},
                {"schedule", m.schedule},
                {"prompt_tokens", cf.tokens},
                {"ttft_ms", p.ttft_s * 1e3},
                {"baseline_ttft_ms", b.ttft_s * 1e3},
                {"speedup", b.ttft_s / p.ttft_s},
                {"prompt_tokens_computed_fraction", p.prompt_share},
                {"total_ms", p.total_s * 1e3},
                {"memory_gib", p.memory.total() / 1073741824.0},
                {"kv_gib", p.memory.kv / 1073741824.0},
                {"fits_in_memory", p.memory.total() <= hws[cf.hw].memory_capacity},
                {"bound_op", std::string(op_name(p.prefill_bound_op()))},
                {"revivals", rv.description}};
      rows[i - c0] = r.dump();
    });
    std::string chunk;
    for (size_t i = c0; i < c1; ++i) chunk += rows[i - c0] + '\n';
    out.append(chunk);
    if (tty) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double frac = double(c1) / double(todo.size());
      const int bar = int(frac * 30);
      fmt::print(stderr, "\r[{}{}] {:3.0f}% {}/{} ETA {:.0f} s ", std::string(size_t(bar), '#'),
                 std::string(size_t(30 - bar), '.'), 100 * frac, c1, todo.size(), el / frac - el);
    }
  }
  if (tty) fmt::print(stderr, "\n");
  fmt::print("{} configurations simulated, {} already in {}, {:.2f} s\n", todo.size(), done.size(), a.out,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace lp::cli
