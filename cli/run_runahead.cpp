// `mpirun -n P lazyprefill run --runahead ...`: KV-Runahead's prefill over P processes
// (engine/mpi/ranks.h: the transport, the ranks' agreement, one rank's part). Every rank loads the
// model and tokenizes the prompt itself; the last rank prints the text and every rank's timings.
// Docs: docs/runahead.md.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "engine/generate.h"
#include "engine/mpi/ranks.h"
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

// The run's result on the last rank: the text, then every rank's times (stderr), or --json.
void print_ranks(const RunArgs& a, const Model& model, const std::string& path,
                 const std::vector<int64_t>& chunks, PolicyKind policy_kind, const std::string& schedule,
                 int64_t prompt_tokens, const mpi::RanksResult& r) {
  const int P = int(chunks.size());
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  int64_t s0 = 0;
  for (int k = 0; k < P; ++k) {
    const mpi::RankTimes& t = r.ranks[size_t(k)];
    ranks.push_back({{"rank", k},
                     {"start", s0},
                     {"tokens", chunks[size_t(k)]},
                     {"prefill_ms", t.prefill_s * 1e3},
                     {"wait_ms", t.wait_s * 1e3},
                     {"export_ms", t.export_s * 1e3},
                     {"sent_mib", t.sent_bytes / (1 << 20)}});
    s0 += chunks[size_t(k)];
  }
  const int64_t generated = int64_t(r.decoded.ids.size());
  if (a.json_out) {
    nlohmann::ordered_json j = {
        {"tool", "lazyprefill run --runahead"},
        {"model", path},
        {"ranks", P},
        {"threads_per_rank", a.threads},
        {"model_config", config_to_json(model.config())},
        {"dtype", dtype_name(model.weights().dtype)},
        {"kv_dtype", model.weights().dtype == DType::F32 ? "f32" : "f16"},
        {"version", LP_VERSION},
        {"git_commit", LP_GIT_COMMIT},
        {"partition", chunks},
        {"partition_rule", a.partition},
        {"prune", policy_name(policy_kind)},
        {"schedule", schedule},
        {"prompt_tokens", prompt_tokens},
        {"generated_tokens", generated},
        {"ttft_ms", r.ttft_s * 1e3},
        {"decode_tokens_per_s", generated > 1 ? double(generated - 1) / r.decoded.seconds : 0.0},
        {"text", r.decoded.text},
        {"ranks_detail", ranks}};
    std::puts(j.dump(2).c_str());
  } else {
    std::puts(r.decoded.text.c_str());
    std::string per;
    for (int k = 0; k < P; ++k)
      per += fmt::format(" | rank {} {} tokens {:.1f} ms (waited {:.1f})", k, chunks[size_t(k)],
                         r.ranks[size_t(k)].prefill_s * 1e3, r.ranks[size_t(k)].wait_s * 1e3);
    fmt::print(stderr, "\nprompt {} tokens over {} ranks, generated {} | TTFT {:.1f} ms{}\n", prompt_tokens,
               P, generated, r.ttft_s * 1e3, per);
  }
  std::fflush(stdout);
}

// What each rank loads and resolves before the prefill: the model, the prompt's tokens and, with
// --prune, LazyLLM's steps and policy for the last rank.
struct RankInputs {
  std::unique_ptr<CpuContext> ctx;
  std::unique_ptr<Model> model;
  std::vector<int32_t> ids;
  PolicyKind policy_kind = PolicyKind::None;
  Schedule sched;  // with --prune: the schedule, resolved into steps
  std::vector<PruneStep> steps;
  std::unique_ptr<PruningPolicy> policy;
};

// The checks every rank makes alike (mpi::agreed: only rank 0 speaks) and its inputs.
void load_rank_inputs(const RunArgs& a, int P, const std::string& path, RankInputs& in) {
  if (P < 2)
    usage_fail(
        "--runahead splits the prefill over MPI ranks: start it with mpirun -n P (P >= 2); this is "
        "{} "
        "process",
        P);
  if (a.backend != "cpu") usage_fail("--runahead runs on the CPU backend");
  if (!a.trace.empty()) usage_fail("--runahead does not write traces");
  if (a.temperature != 0) usage_fail("--runahead decodes greedily (--temperature 0)");
  if (a.prompt_given == !a.prompt_file.empty()) usage_fail("give exactly one of --prompt or --prompt-file");
  const std::string text =
      a.prompt_given ? a.prompt : read_input_file(a.prompt_file, "prompt file", input_cap::kPrompt);
  if (text.empty()) fail("the prompt is empty");
  const std::optional<DType> dtype = cli::dtype_option(a.dtype);
  in.ctx = std::make_unique<CpuContext>(a.threads);
  in.model = Model::load_as(path, dtype, *in.ctx, true);
  in.ids = in.model->tokenizer().encode(text, true, false);
  if (int64_t(in.ids.size()) + a.max_new_tokens > in.model->config().n_ctx_train)
    fail("prompt of {} tokens + {} new tokens exceeds the model's context of {} tokens", in.ids.size(),
         a.max_new_tokens, in.model->config().n_ctx_train);
  if (int64_t(in.ids.size()) < P)
    usage_fail("--runahead: the prompt has {} tokens, fewer than the {} ranks", in.ids.size(), P);
  // LazyLLM on the last rank (engine/runahead.h); every rank knows the steps, for the partition.
  in.policy_kind = parse_policy(a.prune);
  if (in.policy_kind == PolicyKind::StaticPaper || in.policy_kind == PolicyKind::RandomDrop)
    usage_fail("--runahead prunes on the last rank with lazyllm, frozen or random-layers, not {}",
               policy_name(in.policy_kind));
  if (in.policy_kind != PolicyKind::None) {
    in.sched = a.schedule.empty() ? default_schedule() : schedule_from_arg(a.schedule);
    check_method(in.policy_kind, in.sched);
    in.steps = resolve_schedule(in.sched, in.model->config().n_layer, in.model->config().global_layers());
    in.policy = make_policy(in.policy_kind, a.seed);
  }
}

// The ranks' chunks of the prompt, computed on every rank alike (deterministic) after checking that
// they run the same model on the same tokens; rank 0 prints it with its predicted times.
std::vector<int64_t> rank_partition(const RunArgs& a, mpi::World& world, const std::string& path,
                                    const RankInputs& in) {
  mpi::check_same_inputs(world, path, in.ids, a.runahead_timeout_s);
  const ModelConfig& c = in.model->config();
  const bool f32 = in.model->weights().dtype == DType::F32;
  const sim::Precision prec{f32 ? "f32" : "int8", f32 ? "f32" : "int8", f32 ? "f32" : "f16"};
  const hw::Profile hw = hw::load_profile(a.runahead_hw);
  const double share = hw::thread_share(hw, a.threads);
  const int P = world.size();
  std::vector<int64_t> chunks = for_option("--partition", [&] {
    return sim::parse_partition(a.partition, c, hw, prec, int64_t(in.ids.size()), P, sim::default_link(hw),
                                share, in.steps);
  });
  if (world.rank() == 0) {
    const sim::RunaheadPrediction pr =
        sim::predict_runahead(c, hw, prec, chunks, sim::default_link(hw), share, in.steps);
    std::string line;
    for (const sim::RunaheadRank& k : pr.ranks) line += fmt::format(" {}:{:.0f}ms", k.tokens, k.done_s * 1e3);
    fmt::print(stderr, "runahead: {} ranks, partition {} ({}); predicted on {} at {:.2f} of it per rank:{}\n",
               P, fmt::join(chunks, ","), a.partition, hw.name, share, line);
  }
  return chunks;
}

}  // namespace

int cmd_run_runahead(const RunArgs& a) {
  if (!mpi::launched_as_rank())
    usage_fail(
        "--runahead splits the prefill over MPI ranks: start it with mpirun -n P (P >= 2); this process "
        "was not started by mpirun");
  mpi::World world;
  const int P = world.size(), me = world.rank();
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  RankInputs in;
  std::vector<int64_t> chunks;
  if (const int rc = mpi::agreed(world, [&] { load_rank_inputs(a, P, path, in); }); rc != 0) return rc;
  if (const int rc = mpi::agreed(world, [&] { chunks = rank_partition(a, world, path, in); }); rc != 0)
    return rc;

  const PruneRequest req{in.steps, in.policy.get()};
  mpi::RanksResult r;
  try {
    r = mpi::run_ranks(world, *in.ctx, *in.model, in.ids, chunks, in.policy ? &req : nullptr,
                       a.max_new_tokens, a.runahead_timeout_s);
  } catch (const std::exception& e) {
    fmt::print(stderr, "lazyprefill: error: rank {} of {}: {}\n", me, P, escape_text(e.what()));
    std::fflush(stderr);
    world.abort();
  }
  if (world.last())
    print_ranks(a, *in.model, path, chunks, in.policy_kind,
                in.policy ? in.sched.to_string() : std::string("none"), int64_t(in.ids.size()), r);
  return 0;
}

}  // namespace lp::cli
