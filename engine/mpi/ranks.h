// KV-Runahead over processes (engine/runahead.h): Open MPI's point-to-point messages as the
// KvLink between neighbouring ranks, one per layer; the ranks' agreement before any work (the
// same model file and prompt tokens, by SHA-256); one rank's part of the prefill, the last
// rank's greedy decoding after it, and every rank's times gathered there. Every wait for another
// rank is bounded: a rank that died or hangs makes the others stop with one line, not wait
// forever. Built into lp_engine_mpi (CMakeLists), linked by the command (`mpirun -n P lazyprefill
// run --runahead`, cli/run_runahead.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/runahead.h"
#include "engine/session.h"
#include "model/error.h"

namespace lp::mpi {

// Whether a launcher started this process as one of several MPI ranks: Open MPI's mpirun sets
// OMPI_COMM_WORLD_SIZE, PMIx launchers (srun --mpi=pmix) PMIX_RANK. Without one, MPI_Init would
// start a singleton of 1 rank, which can only be refused.
bool launched_as_rank();

// MPI for the life of the object: initialised once (threads funnelled), finalised at the end.
class World {
 public:
  World();
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool last() const { return rank_ + 1 == size_; }
  // Stops every rank (MPI_Abort) with exit code 1; for a failure past the point where the ranks
  // can still agree on how to stop.
  [[noreturn]] void abort() const;

 private:
  int rank_ = 0, size_ = 1;
};

// Runs `body` on every rank for a check every rank makes alike, so that only rank 0 speaks: a
// failure on rank 0 is rethrown, on the others it becomes the exit code (2 for a UsageError, 1 for
// another lp::Error) the command returns quietly. 0 when `body` returned.
template <class Body>
int agreed(const World& w, Body&& body) {
  try {
    body();
  } catch (const UsageError&) {
    if (w.rank() == 0) throw;
    return 2;
  } catch (const Error&) {
    if (w.rank() == 0) throw;
    return 1;
  }
  return 0;
}

// Every rank's SHA-256 of `model_path` and of `ids`, gathered and compared with rank 0's. Throws
// lp::Error on every rank alike naming the first rank that differs and in what, or when the
// gather does not finish within `timeout_s`.
void check_same_inputs(const World& w, const std::string& model_path, std::span<const int32_t> ids,
                       double timeout_s);

struct RankTimes {
  double prefill_s = 0, wait_s = 0, export_s = 0, sent_bytes = 0;  // RunaheadTimes
};
struct RanksResult {
  // On the last rank: from every rank being ready to the prompt's logits; the greedy decode after
  // it; every rank's times, in rank order. Elsewhere empty.
  double ttft_s = 0;
  Decoded decoded;
  std::vector<RankTimes> ranks;
};

// This rank's part of the prompt `ids` split as `chunks` (one per rank) on a session of its own:
// waits for every rank to be ready, runs runahead_prefill over MPI links to the neighbours, and on
// the last rank decodes `max_new_tokens` greedily (with `prune`: re-selection at every step,
// reviving its own dropped rows). Throws lp::Error for a link that fails or times out.
RanksResult run_ranks(const World& w, CpuContext& ctx, const Model& m, std::span<const int32_t> ids,
                      const std::vector<int64_t>& chunks, const PruneRequest* prune, int64_t max_new_tokens,
                      double timeout_s);

}  // namespace lp::mpi
