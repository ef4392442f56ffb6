// Bounded waits on MPI requests, for the ranks' transports (engine/mpi/ranks.cpp, slices.cpp).
#pragma once

#include <mpi.h>

#include <string>

namespace lp::mpi {

// Waits for `req` up to `timeout_s`, sleeping between tests so a waiting rank leaves the cores to
// the ranks that compute. Throws lp::Error naming `what` on time out.
void wait_bounded(MPI_Request& req, double timeout_s, const std::string& what);

}  // namespace lp::mpi
