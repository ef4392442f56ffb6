// `mpirun -n P lazyprefill run --runahead ...`: KV-Runahead's prefill over P processes
// (engine/runahead.h), the K/V prefix handed from rank to rank with Open MPI's point-to-point
// messages, one per layer. Every rank loads the model and tokenizes the prompt itself; they check
// that they agree (SHA-256 of the model file and of the prompt's token ids) before any work. The
// partition is computed on every rank alike (deterministic; rank 0 prints it). The last rank
// decodes on and prints the text and the timings of every rank. Each wait for another rank is
// bounded (--runahead-timeout): a rank that died or hangs makes the others stop with one line,
// not wait forever. Docs: docs/runahead.md.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>
#include <openssl/evp.h>

#include <CLI/CLI.hpp>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <numeric>
#include <thread>

#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/runahead.h"
#include "engine/sampler.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "hwmodels/profile.h"
#include "kernels/context.h"
#include "model/error.h"
#include "model/io.h"
#include "model/paths.h"
#include "pruning/method.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "sim/runahead.h"

namespace lp::cli {
namespace {

// MPI for the life of the command: initialised once, finalised unless aborted.
struct Mpi {
  int rank = 0, size = 1;
  Mpi() {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      fail("--runahead: MPI could not start");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  ~Mpi() { MPI_Finalize(); }
};

// Waits for `req` up to `timeout_s`, sleeping between tests so a waiting rank leaves the cores to
// the ranks that compute. Throws lp::Error naming `what` on time out.
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

// SHA-256 of a file, read in 1 MiB pieces (a model can be larger than memory wants to hold
// twice); the in-memory twin is sha256_hex (cli/calibrate.cpp).
std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  bool ok = ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  std::vector<char> buf(1 << 20);
  while (ok && in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    ok = EVP_DigestUpdate(ctx.get(), buf.data(), size_t(in.gcount())) == 1;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!ok || EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) fail("SHA-256 of '{}' failed", path);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

}  // namespace

// Whether a launcher started this process as one of several MPI ranks: Open MPI's mpirun sets
// OMPI_COMM_WORLD_SIZE, PMIx launchers (srun --mpi=pmix) PMIX_RANK. Without one, MPI_Init would
// start a singleton of 1 rank, which can only be refused.
namespace {
bool launched_as_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (const char* e = std::getenv(v); e && *e) return true;
  return false;
}
}  // namespace

int cmd_run_runahead(const RunArgs& a, const CLI::App& sub) {
  if (!launched_as_rank())
    usage_fail(
        "--runahead splits the prefill over MPI ranks: start it with mpirun -n P (P >= 2); this process "
        "was not started by mpirun");
  Mpi mpi;
  const int P = mpi.size, me = mpi.rank;
  // Checks every rank makes alike: only rank 0 speaks, the others exit with the same code.
  const auto agreed = [&](auto&& body) {
    try {
      body();
    } catch (const UsageError&) {
      if (me == 0) throw;
      return 2;
    } catch (const Error&) {
      if (me == 0) throw;
      return 1;
    }
    return 0;
  };
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  std::unique_ptr<CpuContext> ctx;
  std::unique_ptr<Model> model;
  std::vector<int32_t> ids;
  std::vector<int64_t> chunks;
  PolicyKind policy_kind = PolicyKind::None;
  Schedule sched;  // with --prune: the schedule, resolved into steps
  std::vector<PruneStep> steps;
  std::unique_ptr<PruningPolicy> policy;
  if (const int rc = agreed([&] {
        if (P < 2)
          usage_fail(
              "--runahead splits the prefill over MPI ranks: start it with mpirun -n P (P >= 2); this is {} "
              "process",
              P);
        if (a.backend != "cpu") usage_fail("--runahead runs on the CPU backend");
        if (!a.trace.empty()) usage_fail("--runahead does not write traces");
        if (a.temperature != 0) usage_fail("--runahead decodes greedily (--temperature 0)");
        const bool prompt_given = sub.count("--prompt") > 0;
        if (prompt_given == !a.prompt_file.empty())
          usage_fail("give exactly one of --prompt or --prompt-file");
        const std::string text =
            prompt_given ? a.prompt : read_input_file(a.prompt_file, "prompt file", input_cap::kPrompt);
        if (text.empty()) fail("the prompt is empty");
        const std::optional<DType> dtype = cli::dtype_option(a.dtype);
        ctx = std::make_unique<CpuContext>(a.threads);
        model = Model::load_as(path, dtype, *ctx, true);
        ids = model->tokenizer().encode(text, true, false);
        if (int64_t(ids.size()) + a.max_new_tokens > model->config().n_ctx_train)
          fail("prompt of {} tokens + {} new tokens exceeds the model's context of {} tokens", ids.size(),
               a.max_new_tokens, model->config().n_ctx_train);
        if (int64_t(ids.size()) < P)
          usage_fail("--runahead: the prompt has {} tokens, fewer than the {} ranks", ids.size(), P);
        // LazyLLM on the last rank (engine/runahead.h); every rank knows the steps, for the partition.
        policy_kind = parse_policy(a.prune);
        if (policy_kind == PolicyKind::StaticPaper || policy_kind == PolicyKind::RandomDrop)
          usage_fail("--runahead prunes on the last rank with lazyllm, frozen or random-layers, not {}",
                     policy_name(policy_kind));
        if (policy_kind != PolicyKind::None) {
          sched = a.schedule.empty() ? default_schedule() : schedule_from_arg(a.schedule);
          check_method(policy_kind, sched);
          steps = resolve_schedule(sched, model->config().n_layer);
          policy = make_policy(policy_kind, a.seed);
        }
      });
      rc != 0)
    return rc;

  // The ranks must run the same model on the same tokens: each one's two SHA-256s in hex.
  const std::string model_sha = sha256_file_hex(path),
                    prompt_sha = sha256_hex(
                        std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t)),
                        "the prompt's tokens");
  const std::string mine = model_sha + prompt_sha;
  std::string all(mine.size() * size_t(P), '\0');
  {
    MPI_Request req;
    MPI_Iallgather(mine.data(), int(mine.size()), MPI_CHAR, all.data(), int(mine.size()), MPI_CHAR,
                   MPI_COMM_WORLD, &req);
    wait_bounded(req, a.runahead_timeout_s, "waiting for every rank's model and prompt checksums");
  }
  // Every rank compares every other rank with rank 0, so all of them stop alike.
  const std::string first = all.substr(0, mine.size());
  if (const int rc = agreed([&] {
        for (int r = 1; r < P; ++r) {
          const std::string theirs = all.substr(mine.size() * size_t(r), mine.size());
          if (theirs.compare(0, 64, first, 0, 64) != 0)
            fail(
                "--runahead: rank {}'s model file differs from rank 0's (sha256 {} against {}): every rank "
                "must "
                "load the same file",
                r, theirs.substr(0, 64), first.substr(0, 64));
          if (theirs.compare(64, 64, first, 64, 64) != 0)
            fail(
                "--runahead: rank {}'s prompt tokens differ from rank 0's: every rank must be given the same "
                "prompt",
                r);
        }
        const ModelConfig& c = model->config();
        const bool f32 = model->weights().dtype == DType::F32;
        const sim::Precision prec{f32 ? "f32" : "int8", f32 ? "f32" : "int8", f32 ? "f32" : "f16"};
        const hw::Profile hw = hw::load_profile(a.runahead_hw);
        const double share = hw::thread_share(hw, a.threads);
        chunks = sim::parse_partition(a.partition, c, hw, prec, int64_t(ids.size()), P, sim::default_link(hw),
                                      share, steps);
        if (me == 0) {
          const sim::RunaheadPrediction pr =
              sim::predict_runahead(c, hw, prec, chunks, sim::default_link(hw), share, steps);
          std::string line;
          for (const sim::RunaheadRank& k : pr.ranks)
            line += fmt::format(" {}:{:.0f}ms", k.tokens, k.done_s * 1e3);
          fmt::print(stderr,
                     "runahead: {} ranks, partition {} ({}); predicted on {} at {:.2f} of it per rank:{}\n",
                     P, fmt::join(chunks, ","), a.partition, hw.name, share, line);
        }
      });
      rc != 0)
    return rc;

  int64_t start = 0;
  for (int r = 0; r < me; ++r) start += chunks[size_t(r)];
  const RunaheadPart part{me, P, start, chunks[size_t(me)]};
  const bool last = me + 1 == P;
  const int64_t N = int64_t(ids.size());
  const int64_t n_ctx = last ? N + a.max_new_tokens + 1 : start + part.tokens;
  std::array<double, 4> mine_t{};  // total, wait, export, sent bytes
  std::string text;
  double ttft_s = 0, decode_s = 0;
  int64_t generated = 0;
  try {
    Session s(*ctx, *model, n_ctx);
    std::unique_ptr<MpiLink> prev, next;
    if (me > 0) prev = std::make_unique<MpiLink>(me - 1, a.runahead_timeout_s);
    if (!last) next = std::make_unique<MpiLink>(me + 1, a.runahead_timeout_s);
    std::vector<float> logits(size_t(model->config().n_vocab));
    MPI_Request ready;
    MPI_Ibarrier(MPI_COMM_WORLD, &ready);
    wait_bounded(ready, a.runahead_timeout_s, "waiting for every rank to be ready");
    const double t0 = MPI_Wtime();
    const PruneRequest req{steps, policy.get()};
    const RunaheadTimes t =
        runahead_prefill(s, ids, part, prev.get(), next.get(), logits.data(), policy ? &req : nullptr);
    mine_t = {t.total_s, t.wait_s, t.export_s, t.sent_bytes};
    if (last) {
      ttft_s = MPI_Wtime() - t0;
      // generate()'s loop, greedy: with pruning, re-selection at every step, reviving the last
      // rank's own dropped rows.
      DecodeLoop loop;
      loop.n_new = a.max_new_tokens;
      loop.prune = policy ? &req : nullptr;
      const Decoded d = decode_tokens(s, *model, N, argmax(logits), logits, loop,
                                      [](size_t, std::span<const float> lg) { return argmax(lg); });
      decode_s = d.seconds;
      generated = int64_t(d.ids.size());
      text = d.text;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "lazyprefill: error: rank {} of {}: {}\n", me, P, escape_text(e.what()));
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::vector<double> times(size_t(4) * size_t(P));
  try {
    MPI_Request req;
    MPI_Igather(mine_t.data(), 4, MPI_DOUBLE, times.data(), 4, MPI_DOUBLE, P - 1, MPI_COMM_WORLD, &req);
    wait_bounded(req, a.runahead_timeout_s, "gathering every rank's times");
  } catch (const std::exception& e) {
    fmt::print(stderr, "lazyprefill: error: rank {} of {}: {}\n", me, P, escape_text(e.what()));
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (last) {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    int64_t s0 = 0;
    for (int r = 0; r < P; ++r) {
      ranks.push_back({{"rank", r},
                       {"start", s0},
                       {"tokens", chunks[size_t(r)]},
                       {"prefill_ms", times[size_t(4 * r)] * 1e3},
                       {"wait_ms", times[size_t(4 * r + 1)] * 1e3},
                       {"export_ms", times[size_t(4 * r + 2)] * 1e3},
                       {"sent_mib", times[size_t(4 * r + 3)] / (1 << 20)}});
      s0 += chunks[size_t(r)];
    }
    if (a.json_out) {
      nlohmann::ordered_json j = {
          {"tool", "lazyprefill run --runahead"},
          {"model", path},
          {"ranks", P},
          {"threads_per_rank", a.threads},
          {"model_config", config_to_json(model->config())},
          {"dtype", dtype_name(model->weights().dtype)},
          {"kv_dtype", model->weights().dtype == DType::F32 ? "f32" : "f16"},
          {"version", LP_VERSION},
          {"git_commit", LP_GIT_COMMIT},
          {"partition", chunks},
          {"partition_rule", a.partition},
          {"prune", policy_name(policy_kind)},
          {"schedule", policy ? sched.to_string() : std::string("none")},
          {"prompt_tokens", N},
          {"generated_tokens", generated},
          {"ttft_ms", ttft_s * 1e3},
          {"decode_tokens_per_s", generated > 1 ? double(generated - 1) / decode_s : 0.0},
          {"text", text},
          {"ranks_detail", ranks}};
      std::puts(j.dump(2).c_str());
    } else {
      std::puts(text.c_str());
      std::string per;
      for (const auto& r : ranks)
        per += fmt::format(" | rank {} {} tokens {:.1f} ms (waited {:.1f})", r["rank"].get<int>(),
                           r["tokens"].get<int64_t>(), r["prefill_ms"].get<double>(),
                           r["wait_ms"].get<double>());
      fmt::print(stderr, "\nprompt {} tokens over {} ranks, generated {} | TTFT {:.1f} ms{}\n", N, P,
                 generated, ttft_s * 1e3, per);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace lp::cli
