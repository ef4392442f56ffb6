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
#include "model/json_checks.h"
#include "model/presets.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "reports/sweep_grid.h"
#include "sim/replay.h"
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

std::string key_of(const std::string& hw, const std::string& model, const std::string& policy,
                   const std::string& schedule, int64_t tokens) {
  return fmt::format("{}|{}|{}|{}|{}", hw, model, policy, schedule, tokens);
}

}  // namespace

CLI::App* add_sweep(CLI::App& app, SweepArgs& a) {
  auto* s = app.add_subcommand(
      "sweep",
      R"(Simulate a grid of hardware x models x schedules x prompt lengths, one JSON line per configuration.
  lazyprefill sweep --grid grid.json --out sweep.jsonl   # rerun to resume: rows already there are kept
  grid.json: {"lazyprefill_sweep": 1, "hardware": ["h100-sxm", "l4"], "models": ["llama-3.1-8b"],
              "methods": [{"policy": "none"}, {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3"}],
              "prompt_lengths": [1024, 4096, 16384]})");
  s->add_option("--grid", a.grid, "The grid (JSON, see above and docs/simulator.md)")->required();
  s->add_option("--out", a.out, "JSON Lines output; configurations already in it are skipped")->required();
  s->add_option("--threads", a.threads, "Threads (default: all this process may use)")
      ->check(CLI::Range(1, 1024));
  return s;
}

int cmd_sweep(const SweepArgs& a, const CLI::App& /*sub*/) {
  const report::SweepGrid grid = report::read_sweep_grid(a.grid);
  {
    std::error_code ec;
    if (std::filesystem::exists(a.out, ec) && std::filesystem::equivalent(a.grid, a.out, ec))
      usage_fail("--out '{}' is the grid itself; the sweep would overwrite it", a.out);
  }
  const std::vector<hw::Profile>& hws = grid.hws;
  const std::vector<std::string>& model_names = grid.model_names;
  const std::vector<ModelConfig>& models = grid.models;
  const std::vector<Method>& methods = grid.methods;
  const std::vector<int64_t>& lengths = grid.lengths;
  const int64_t new_tokens = grid.new_tokens, batch = grid.batch;
  const sim::Precision& prec = grid.precision;
  const std::string& revival_model = grid.revival_model;
  const double revival_share = grid.revival_share;
  const std::optional<sim::RevivalModel> revival_from = load_revivals(revival_model, revival_share);
  std::vector<RevivalChoice> revivals(models.size() * methods.size());  // [model][method]
  for (size_t m = 0; m < models.size(); ++m)
    for (size_t k = 0; k < methods.size(); ++k)
      revivals[m * methods.size() + k] = choose_revivals(
          revival_from, revival_share, methods[k].policy_name(), models[m].n_layer,
          resolve_method(methods[k].policy, methods[k].schedule, models[m].n_layer), grid.map);

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
        const json r = json_parse(std::string_view(old).substr(at, nl - at), a.out);
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
          if (!done.count(key_of(hws[h].name, model_names[m], methods[k].policy_name(),
                                 methods[k].schedule_text(), n)))
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
      const auto steps = resolve_method(m.policy, m.schedule, c.n_layer);
      const int64_t dec = std::max<int64_t>(0, new_tokens - 1);
      const RevivalChoice& rv = revivals[cf.model * methods.size() + cf.method];
      const sim::Prediction p =
          sim::replay_synthetic(c, m.policy_name(), steps, cf.tokens, dec, rv.share, hws[cf.hw], prec, batch,
                                1, 0, drop_share(m.schedule).value_or(0));
      const sim::Prediction b =
          sim::replay_synthetic(c, "none", {}, cf.tokens, dec, {}, hws[cf.hw], prec, batch);
      json r = {{"hw", hws[cf.hw].name},
                {"model", model_names[cf.model]},
                {"policy", m.policy_name()},
                {"schedule", m.schedule_text()},
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
