// `lazyprefill sweep`: simulate a grid of hardware x models x schedules x prompt lengths in
// parallel (oneTBB; under `mpirun -n P`, over P processes too), one JSON line per configuration,
// resumable.
#include "reports/sweep.h"

#include <fmt/format.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "engine/mpi/slices.h"
#include "hwmodels/profile.h"
#include "model/digest.h"
#include "model/error.h"
#include "model/io.h"
#include "model/presets.h"
#include "pruning/method.h"
#include "pruning/schedule.h"

namespace lp::cli {

namespace {
using json = nlohmann::json;

// A rank waits this long for the others' rows (as plan's: mpirun stops the job when a rank exits).
constexpr double kRankTimeoutS = 24 * 3600;

// The sweep here, or (world given: `mpirun -n P lazyprefill sweep`) this rank's share of each
// chunk of rows, gathered on rank 0, which alone reads and appends the output.
int sweep_here(const SweepArgs& a, const mpi::World* world) {
  const bool first = !world || world->rank() == 0;
  const report::SweepGrid grid = report::read_sweep_grid(a.grid);
  {
    std::error_code ec;
    if (std::filesystem::exists(a.out, ec) && std::filesystem::equivalent(a.grid, a.out, ec))
      usage_fail("--out '{}' is the grid itself; the sweep would overwrite it", a.out);
  }
  const std::optional<sim::RevivalModel> revival_from =
      sim::load_revivals(grid.revival_model, grid.revival_share);
  std::vector<report::SweepRevivals> revivals;  // [model][method]
  for (const ModelConfig& c : grid.models)
    for (const Method& m : grid.methods) {
      sim::RevivalChoice rv =
          sim::choose_revivals(revival_from, grid.revival_share, m.policy_name(), c.n_layer,
                               resolve_method(m.policy, m.schedule, c.n_layer, c.global_layers()), grid.map);
      revivals.push_back({std::move(rv.share), std::move(rv.description)});
    }
  // The output, locked for this run (a second sweep on it is refused). Resume: keep every complete
  // row already written and cut a torn last line off (a run killed mid-row); rows are appended.
  // Under mpirun only rank 0 opens it; it tells the others the rows done, or that it failed (so
  // that every rank stops alike).
  std::optional<AppendFile> out;
  report::SweepProgress progress;
  std::exception_ptr failed;
  std::string told;
  if (first) try {
      out.emplace(a.out, "sweep output", input_cap::kTrace);
      const std::string old = out->read_all();
      progress = report::sweep_progress(old, a.out);
      if (progress.whole_bytes < old.size()) out->truncate(progress.whole_bytes);
      told = mpi::pack_strings({"done"}) +
             mpi::pack_strings(std::vector<std::string>(progress.done.begin(), progress.done.end()));
    } catch (const Error& e) {
      if (!world) throw;
      failed = std::current_exception();
      told = mpi::pack_strings({"failed", e.what()});
    }
  if (world) {
    mpi::broadcast_from_first(*world, told, kRankTimeoutS);
    if (failed) std::rethrow_exception(failed);
    const std::vector<std::string> said = mpi::unpack_strings(told);
    if (said.at(0) != "done") fail("rank 0: {}", said.at(1));
    progress.done = std::set<std::string>(said.begin() + 1, said.end());
  }
  const std::vector<report::SweepConfig> todo = report::sweep_configs(grid, progress.done, a.grid);
  if (world)
    mpi::check_same(
        *world,
        fmt::format("sweeps {} configurations of a grid of sha256 {}", todo.size(), sha256_file_hex(a.grid)),
        "every rank must be given the same grid", kRankTimeoutS);
  const bool tty = first && ::isatty(2);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<tbb::global_control> limit;
  if (a.threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, size_t(a.threads));
  // Rows computed in parallel (over the ranks, each rank's over its threads), then written in grid order.
  const int ranks = world ? world->size() : 1, rank = world ? world->rank() : 0;
  const size_t chunk_rows = 512 * size_t(ranks);
  std::vector<std::string> rows(chunk_rows);
  const auto each_chunk = [&](size_t c0) {
    const size_t c1 = std::min(todo.size(), c0 + chunk_rows);
    std::vector<size_t> mine;
    for (size_t i = c0 + size_t(rank); i < c1; i += size_t(ranks)) mine.push_back(i);
    tbb::parallel_for(size_t(0), mine.size(), [&](size_t k) {
      rows[mine[k] - c0] = report::sweep_row(grid, todo[mine[k]], revivals);
    });
    if (world) {
      std::vector<std::string> own;
      for (const size_t i : mine) own.push_back(std::move(rows[i - c0]));
      const std::vector<std::string> each =
          mpi::gather_to_first(*world, mpi::pack_strings(own), kRankTimeoutS);
      if (!first) return;
      for (int r = 0; r < ranks; ++r) {
        std::vector<std::string> theirs = mpi::unpack_strings(each[size_t(r)]);
        size_t k = 0;
        for (size_t i = c0 + size_t(r); i < c1; i += size_t(ranks), ++k) {
          if (k >= theirs.size())
            fail("rank {} sent {} rows of a chunk, fewer than its share", r, theirs.size());
          rows[i - c0] = std::move(theirs[k]);
        }
      }
    }
    std::string chunk;
    for (size_t i = c0; i < c1; ++i) chunk += rows[i - c0] + '\n';
    out->append(chunk);
    if (tty) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double frac = double(c1) / double(todo.size());
      const int bar = int(frac * 30);
      fmt::print(stderr, "\r[{}{}] {:3.0f}% {}/{} ETA {:.0f} s ", std::string(size_t(bar), '#'),
                 std::string(size_t(30 - bar), '.'), 100 * frac, c1, todo.size(), el / frac - el);
    }
  };
  for (size_t c0 = 0; c0 < todo.size(); c0 += chunk_rows) {
    if (world)
      mpi::or_abort(*world, [&] { each_chunk(c0); });
    else
      each_chunk(c0);
  }
  if (!first) return 0;
  if (tty) fmt::print(stderr, "\n");
  fmt::print("{} configurations simulated{}, {} already in {}, {:.2f} s\n", todo.size(),
             ranks > 1 ? fmt::format(" by {} ranks", ranks) : "", progress.done.size(), a.out,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

int cmd_sweep(const SweepArgs& a) {
  return mpi::alone_or_ranks([&](const mpi::World* world) { return sweep_here(a, world); });
}

}  // namespace lp::cli
