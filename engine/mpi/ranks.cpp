#include "engine/mpi/ranks.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <memory>
#include <thread>

#include "engine/mpi/wait.h"
#include "engine/sampler.h"
#include "model/digest.h"

namespace lp::mpi {

void wait_bounded(MPI_Request& req, double timeout_s, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  int done = 0;
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (Clock::now() > end) fail("{}: nothing within {} s (did that rank stop?)", what, timeout_s);
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(500));
  }
}

namespace {

// One direction between neighbouring ranks: MPI_Isend / MPI_Irecv of raw bytes, tag = layer.
class MpiLink : public KvLink {
 public:
  MpiLink(int peer, double timeout_s) : peer_(peer), timeout_s_(timeout_s) {}
  void send(int layer, std::span<const std::byte> bytes) override {
    finish();
    if (bytes.size() > size_t(INT_MAX))
      fail("KV-Runahead: a layer's K/V of {} bytes is over MPI's limit", bytes.size());
    MPI_Isend(bytes.data(), int(bytes.size()), MPI_BYTE, peer_, layer, MPI_COMM_WORLD, &pending_);
    sending_ = true;
    layer_ = layer;
  }
  void finish() override {
    if (!sending_) return;
    wait_bounded(pending_, timeout_s_, fmt::format("sending layer {}'s K/V to rank {}", layer_, peer_));
    sending_ = false;
  }
  void recv(int layer, std::span<std::byte> out) override {
    if (out.size() > size_t(INT_MAX))
      fail("KV-Runahead: a layer's K/V of {} bytes is over MPI's limit", out.size());
    MPI_Request r;
    MPI_Irecv(out.data(), int(out.size()), MPI_BYTE, peer_, layer, MPI_COMM_WORLD, &r);
    wait_bounded(r, timeout_s_, fmt::format("waiting for layer {}'s K/V from rank {}", layer, peer_));
  }

 private:
  int peer_;
  double timeout_s_;
  MPI_Request pending_ = MPI_REQUEST_NULL;
  bool sending_ = false;
  int layer_ = 0;
};

}  // namespace

bool launched_as_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (const char* e = std::getenv(v); e && *e) return true;
  return false;
}

World::World() {
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    fail("MPI could not start");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

World::~World() {
  MPI_Finalize();
}

void World::abort() const {
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return
}

void check_same_inputs(const World& w, const std::string& model_path, std::span<const int32_t> ids,
                       double timeout_s) {
  const std::string mine =
      sha256_file_hex(model_path) +
      sha256_hex(std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t)),
                 "the prompt's tokens");
  std::string all(mine.size() * size_t(w.size()), '\0');
  MPI_Request req;
  MPI_Iallgather(mine.data(), int(mine.size()), MPI_CHAR, all.data(), int(mine.size()), MPI_CHAR,
                 MPI_COMM_WORLD, &req);
  wait_bounded(req, timeout_s, "waiting for every rank's model and prompt checksums");
  // Every rank compares every other rank with rank 0, so all of them stop alike.
  const std::string first = all.substr(0, mine.size());
  for (int r = 1; r < w.size(); ++r) {
    const std::string theirs = all.substr(mine.size() * size_t(r), mine.size());
    if (theirs.compare(0, 64, first, 0, 64) != 0)
      fail(
          "KV-Runahead: rank {}'s model file differs from rank 0's (sha256 {} against {}): every rank must "
          "load "
          "the same file",
          r, theirs.substr(0, 64), first.substr(0, 64));
    if (theirs.compare(64, 64, first, 64, 64) != 0)
      fail(
          "KV-Runahead: rank {}'s prompt tokens differ from rank 0's: every rank must be given the same "
          "prompt",
          r);
  }
}

RanksResult run_ranks(const World& w, CpuContext& ctx, const Model& m, std::span<const int32_t> ids,
                      const std::vector<int64_t>& chunks, const PruneRequest* prune, int64_t max_new_tokens,
                      double timeout_s) {
  const int P = w.size(), me = w.rank();
  if (int64_t(chunks.size()) != P) fail("KV-Runahead: {} chunks for {} ranks", chunks.size(), P);
  int64_t start = 0;
  for (int r = 0; r < me; ++r) start += chunks[size_t(r)];
  const RunaheadPart part{me, P, start, chunks[size_t(me)]};
  const int64_t N = int64_t(ids.size());
  Session s(ctx, m, w.last() ? N + max_new_tokens + 1 : start + part.tokens);
  std::unique_ptr<MpiLink> prev, next;
  if (me > 0) prev = std::make_unique<MpiLink>(me - 1, timeout_s);
  if (!w.last()) next = std::make_unique<MpiLink>(me + 1, timeout_s);
  std::vector<float> logits(size_t(m.config().n_vocab));
  MPI_Request ready;
  MPI_Ibarrier(MPI_COMM_WORLD, &ready);
  wait_bounded(ready, timeout_s, "waiting for every rank to be ready");
  const double t0 = MPI_Wtime();
  const RunaheadTimes t = runahead_prefill(s, ids, part, prev.get(), next.get(), logits.data(), prune);
  RanksResult out;
  if (w.last()) {
    out.ttft_s = MPI_Wtime() - t0;
    DecodeLoop loop;
    loop.n_new = max_new_tokens;
    loop.prune = prune;
    out.decoded = decode_tokens(s, m, N, argmax(logits), logits, loop,
                                [](size_t, std::span<const float> lg) { return argmax(lg); });
  }
  const std::array<double, 4> mine{t.total_s, t.wait_s, t.export_s, t.sent_bytes};
  std::vector<double> times(size_t(4) * size_t(P));
  MPI_Request req;
  MPI_Igather(mine.data(), 4, MPI_DOUBLE, times.data(), 4, MPI_DOUBLE, P - 1, MPI_COMM_WORLD, &req);
  wait_bounded(req, timeout_s, "gathering every rank's times");
  if (w.last())
    for (int r = 0; r < P; ++r)
      out.ranks.push_back({times[size_t(4 * r)], times[size_t(4 * r + 1)], times[size_t(4 * r + 2)],
                           times[size_t(4 * r + 3)]});
  return out;
}

}  // namespace lp::mpi
