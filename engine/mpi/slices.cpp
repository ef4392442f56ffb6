#include "engine/mpi/slices.h"

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "engine/mpi/wait.h"
#include "model/error.h"

namespace lp::mpi {

std::vector<std::string> gather_to_first(const World& w, const std::string& mine, double timeout_s) {
  const int P = w.size();
  uint64_t size = mine.size();
  std::vector<uint64_t> sizes(w.rank() == 0 ? size_t(P) : 0);
  MPI_Request req;
  MPI_Igather(&size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req);
  wait_bounded(req, timeout_s, "waiting for every rank's share of the grid");
  // Every rank learns whether the bytes fit one gather, so that all of them stop alike.
  uint64_t total = 0;
  for (const uint64_t s : sizes) total += s;
  MPI_Ibcast(&total, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req);
  wait_bounded(req, timeout_s, "waiting for rank 0");
  if (total > uint64_t(INT_MAX))
    fail("the ranks' results hold {} bytes, over MPI's limit of {} for one gather: split the grid", total,
         INT_MAX);
  std::vector<int> counts, displs;
  std::string all;
  if (w.rank() == 0) {
    all.resize(total);
    int at = 0;
    for (const uint64_t s : sizes) counts.push_back(int(s)), displs.push_back(at), at += int(s);
  }
  MPI_Igatherv(mine.data(), int(mine.size()), MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, 0,
               MPI_COMM_WORLD, &req);
  wait_bounded(req, timeout_s, "waiting for every rank's results");
  std::vector<std::string> out;
  if (w.rank() == 0)
    for (int r = 0; r < P; ++r)
      out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(counts[size_t(r)])));
  return out;
}

void check_same(const World& w, const std::string& mine, const std::string& what, double timeout_s) {
  constexpr size_t kWidth = 512;
  std::string padded = mine.substr(0, kWidth);
  padded.resize(kWidth, '\0');
  std::string all(kWidth * size_t(w.size()), '\0');
  MPI_Request req;
  MPI_Iallgather(padded.data(), int(kWidth), MPI_CHAR, all.data(), int(kWidth), MPI_CHAR, MPI_COMM_WORLD,
                 &req);
  wait_bounded(req, timeout_s, "waiting for every rank's inputs");
  const auto text = [&](int r) {
    const std::string s = all.substr(kWidth * size_t(r), kWidth);
    return s.substr(0, s.find('\0'));
  };
  for (int r = 1; r < w.size(); ++r)
    if (all.compare(kWidth * size_t(r), kWidth, all, 0, kWidth) != 0)
      fail("rank {} {}, rank 0 {}: {}", r, text(r), text(0), what);
}

void print_rank_error(const World& w, const char* what) {
  std::fprintf(stderr, "lazyprefill: error: rank %d: %s\n", w.rank(), what);
  std::fflush(stderr);
}

void broadcast_from_first(const World& w, std::string& bytes, double timeout_s) {
  uint64_t size = bytes.size();
  MPI_Request req;
  MPI_Ibcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req);
  wait_bounded(req, timeout_s, "waiting for rank 0");
  if (size > uint64_t(INT_MAX))
    fail("rank 0's {} bytes are over MPI's limit of {} for one broadcast", size, INT_MAX);
  bytes.resize(size);
  MPI_Ibcast(bytes.data(), int(size), MPI_BYTE, 0, MPI_COMM_WORLD, &req);
  wait_bounded(req, timeout_s, "waiting for rank 0's data");
}

std::string pack_strings(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) {
    const uint64_t n = s.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += s;
  }
  return out;
}

std::vector<std::string> unpack_strings(const std::string& bytes) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < bytes.size()) {
    uint64_t n = 0;
    if (bytes.size() - at < sizeof n) fail("a rank's results end inside a length");
    std::memcpy(&n, bytes.data() + at, sizeof n);
    at += sizeof n;
    if (n > bytes.size() - at) fail("a rank's results end inside an item of {} bytes", n);
    out.push_back(bytes.substr(at, size_t(n)));
    at += size_t(n);
  }
  return out;
}

}  // namespace lp::mpi
