// `lazyprefill sweep`: simulate a grid of hardware x models x schedules x prompt lengths in
// parallel (oneTBB), one JSON line per configuration, resumable.
#include "reports/sweep.h"

#include <fmt/format.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/io.h"
#include "model/presets.h"
#include "pruning/method.h"
#include "pruning/schedule.h"

namespace lp::cli {

namespace {
using json = nlohmann::json;

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
  const std::optional<sim::RevivalModel> revival_from = load_revivals(grid.revival_model, grid.revival_share);
  std::vector<report::SweepRevivals> revivals;  // [model][method]
  for (const ModelConfig& c : grid.models)
    for (const Method& m : grid.methods) {
      RevivalChoice rv =
          choose_revivals(revival_from, grid.revival_share, m.policy_name(), c.n_layer,
                          resolve_method(m.policy, m.schedule, c.n_layer, c.global_layers()), grid.map);
      revivals.push_back({std::move(rv.share), std::move(rv.description)});
    }
  // The output, locked for this run (a second sweep on it is refused). Resume: keep every complete
  // row already written and cut a torn last line off (a run killed mid-row); rows are appended.
  AppendFile out(a.out, "sweep output", input_cap::kTrace);
  const std::string old = out.read_all();
  const report::SweepProgress progress = report::sweep_progress(old, a.out);
  if (progress.whole_bytes < old.size()) out.truncate(progress.whole_bytes);
  const std::vector<report::SweepConfig> todo = report::sweep_configs(grid, progress.done, a.grid);
  const bool tty = ::isatty(2);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<tbb::global_control> limit;
  if (a.threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, size_t(a.threads));
  constexpr size_t kChunk = 512;  // rows computed in parallel, then written in grid order
  std::vector<std::string> rows(kChunk);
  for (size_t c0 = 0; c0 < todo.size(); c0 += kChunk) {
    const size_t c1 = std::min(todo.size(), c0 + kChunk);
    tbb::parallel_for(c0, c1, [&](size_t i) { rows[i - c0] = report::sweep_row(grid, todo[i], revivals); });
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
  fmt::print("{} configurations simulated, {} already in {}, {:.2f} s\n", todo.size(), progress.done.size(),
             a.out, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace lp::cli
