// A grid's work dealt over MPI ranks (`mpirun -n P lazyprefill sweep|plan`): item i to rank
// i mod P, each rank's results as bytes gathered on rank 0, which merges them in item order and
// alone writes the output; what rank 0 alone knows (a resumed sweep's finished rows) broadcast to
// the others. Every wait is bounded: a rank that died or hangs makes the others stop with one
// line. Built into lp_engine_mpi with the KV-Runahead transport (engine/mpi/ranks.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/mpi/ranks.h"
#include "model/error.h"

namespace lp::mpi {

// A command that runs alone or as one of `mpirun`'s ranks: `body(nullptr)` outside mpirun, else
// `body(&world)` on every rank, its failures agreed as `agreed` does; the command's exit code.
template <class Body>
int alone_or_ranks(Body&& body) {
  if (!launched_as_rank()) return body(static_cast<const World*>(nullptr));
  World world;
  int rc = 0;
  if (const int failed = agreed(world, [&] { rc = body(&world); }); failed != 0) return failed;
  return rc;
}

// Every rank's `mine`, in rank order, on rank 0 (elsewhere empty). Throws lp::Error when the
// ranks' bytes together pass MPI's 2 GiB count or the gather does not finish within `timeout_s`.
std::vector<std::string> gather_to_first(const World& w, const std::string& mine, double timeout_s);

// Every rank's `mine` (its first 512 bytes) compared with rank 0's, on every rank alike: throws
// lp::Error "rank K <theirs>, rank 0 <its own>: <what>" for the first rank that differs, or when
// the exchange does not finish within `timeout_s`.
void check_same(const World& w, const std::string& mine, const std::string& what, double timeout_s);

// "lazyprefill: error: rank K: what" on stderr.
void print_rank_error(const World& w, const char* what);

// Runs `body`, a rank's share of the work after the ranks began to exchange it: a failure there
// cannot be agreed on, so it is printed (one line) and every rank stopped (World::abort).
template <class Body>
void or_abort(const World& w, Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    print_rank_error(w, e.what());
    w.abort();
  }
}

// Rank 0's `bytes` into `bytes` on every rank. Throws as gather_to_first.
void broadcast_from_first(const World& w, std::string& bytes, double timeout_s);

// Strings packed as one byte string (each length-prefixed) and back; unpack throws lp::Error for
// bytes that are not such a packing.
std::string pack_strings(const std::vector<std::string>& items);
std::vector<std::string> unpack_strings(const std::string& bytes);

}  // namespace lp::mpi
