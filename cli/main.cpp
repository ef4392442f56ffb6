// lazyprefill: command-line entry point. Library errors (lp::Error) become one line on stderr
// and exit code 1; usage errors get one line too, with CLI11's non-zero exit code.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "cli/commands.h"
#include "cli/run_output.h"
#include "engine/generate.h"
#include "engine/pruning.h"
#include "engine/session.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "kernels/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/io.h"
#include "model/ops.h"
#include "model/paths.h"
#include "model/vocab.h"
#include "traces/schedule.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace {

using json = nlohmann::ordered_json;

struct RunArgs {
  std::string model, prompt, prompt_file, dtype = "auto";
  int max_new_tokens = 64;
  int threads = lp::default_thread_count();
  bool chat = false, json_out = false, trace_detail = false;
  bool prompt_given = false;  // --prompt "" is an empty prompt, not a missing one
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  std::string prune = "none", schedule, trace;
  std::string backend = "cpu";
  bool op_timers = false;
};

// --backend cuda: the device, and whether the model's weights alone fit in its free memory, before
// the (long) load. The session counts the rest (K/V, Aux Cache, activations) for the prompt's
// tokens once it is tokenised, and refuses before allocating.
lp::cuda::Device check_cuda_backend(const std::string& path, lp::DType dtype) {
  const lp::cuda::Device d = lp::cuda::open_device();  // one line saying why not, else the GPU
  const lp::ModelConfig c = lp::config_from_gguf(lp::GgufFile::open(path));
  const double weight_bytes = double(c.n_params()) * (dtype == lp::DType::F32 ? 4 : 2);
  if (weight_bytes > double(d.free_bytes))
    lp::fail(
        "the model needs {:.2f} GiB on the GPU for its {} weights alone but {} has {:.2f} GiB free of {:.2f}",
        weight_bytes / 1073741824.0, lp::dtype_name(dtype), d.name, double(d.free_bytes) / 1073741824.0,
        double(d.total_bytes) / 1073741824.0);
  return d;
}

std::string read_prompt_file(const std::string& path) {
  return lp::read_input_file(path, "prompt file", lp::input_cap::kPrompt);
}

// auto: on the CPU the fastest this CPU has (bf16 where it has AVX-512 bf16); on a GPU bf16
// (tensor cores, half the weight memory).
lp::DType parse_dtype(const std::string& s, const std::string& backend) {
  if (s == "auto") return backend == "cuda" ? lp::DType::BF16 : lp::fastest_dtype();
  if (s == "f32") return lp::DType::F32;
  if (s == "bf16") return lp::DType::BF16;
  lp::usage_fail("--dtype must be auto, f32 or bf16, got '{}'", s);
}

int cmd_run(const RunArgs& a) {
  const std::string path = a.model.empty() ? lp::default_model_path() : a.model;
  lp::refuse_output_over_input(a.trace, "--trace", {path, a.prompt_file, a.schedule});
  if (a.prompt_given == !a.prompt_file.empty())
    lp::usage_fail("give exactly one of --prompt or --prompt-file");
  std::string text = a.prompt_given ? a.prompt : read_prompt_file(a.prompt_file);
  if (const int64_t bad = lp::find_invalid_utf8(text); bad >= 0)
    lp::fail("prompt{} is not valid UTF-8 (byte offset {})",
             a.prompt_file.empty() ? "" : " file '" + a.prompt_file + "'", bad);
  if (text.empty()) lp::fail("the prompt is empty");
  const lp::DType dtype = parse_dtype(a.dtype, a.backend);
  if (!a.trace.empty()) {
    // Fail before the (long) run when the trace could not be written afterwards.
    const std::filesystem::path dir = std::filesystem::absolute(a.trace).parent_path();
    if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0)
      lp::fail("cannot write trace '{}': folder '{}' does not exist or is not writable", a.trace,
               dir.string());
    if (std::filesystem::is_directory(a.trace)) lp::fail("cannot write trace '{}': it is a folder", a.trace);
  }
  lp::cuda::Device gpu;
  if (a.op_timers && a.backend != "cuda")
    lp::usage_fail("--op-timers is for --backend cuda (the CPU always times its ops)");
  if (a.backend == "cuda") {
    gpu = check_cuda_backend(path, dtype);
  }
  lp::CpuContext ctx(a.threads);
  const auto model = lp::Model::load(path, dtype, ctx);
  const lp::Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> ids;
  if (a.chat) {
    const lp::ChatMessage msg{"user", text};
    ids = tok.encode(tok.apply_chat_template({&msg, 1}, true), false, true);
  } else {
    ids = tok.encode(text, true, false);
  }
  if (ids.empty()) lp::fail("the prompt is empty (no tokens)");
  lp::GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.sampler = {a.temperature, a.top_p, a.seed};
  opt.policy = lp::parse_policy(a.prune);
  opt.schedule = a.schedule.empty() ? lp::default_schedule() : lp::schedule_from_arg(a.schedule);
  opt.prune_seed = a.seed;
  opt.record_steps = !a.trace.empty();
  if (a.backend == "cuda") opt.gpu_op_timers = a.op_timers;
  // One engine (engine/session.h) on the chosen backend.
  const lp::GenerateResult r =
      a.backend == "cuda"
          ? lp::generate(*model, ids, opt,
                         [&](int64_t n_ctx) {
                           return lp::cuda::make_backend(model->config(), model->weights(), n_ctx);
                         })
          : lp::generate(ctx, *model, ids, opt);

  double trace_write_s = 0;
  if (!a.trace.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const lp::trace::Trace t =
        lp::cli::run_trace(model->config(), opt, r, lp::dtype_name(dtype), a.seed, a.trace_detail);
    lp::trace::write_trace(t, a.trace);
    trace_write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double prefill_tps = r.prompt_ids.size() / r.prefill_s;
  const double decode_tps = r.decode_steps > 0 ? r.decode_steps / r.decode_s : 0.0;
  const double gflops = r.prefill_ops.total_flops() / r.prefill_s / 1e9;
  if (a.json_out) {
    json j;
    j = lp::cli::run_json(*model, opt, r, lp::dtype_name(dtype), a.threads);
    j["backend"] = a.backend;
    if (a.backend == "cuda") {
      // `calibrate --measurements` reads `hardware` (sim/measurements.h): the GPU.
      j["gpu"] = gpu.name;
      j["hardware"] = gpu.name;
      j["op_timers"] = a.op_timers ? "device synchronised around every op: TTFT includes the lost overlap"
                                   : "off (--op-timers records them, at the cost of the overlap between ops)";
    }
    j["seed"] = a.seed;
    j["temperature"] = a.temperature;
    j["top_p"] = a.top_p;
    if (!a.trace.empty()) j["trace_write_ms"] = trace_write_s * 1e3;  // assembling and writing the trace
    std::puts(j.dump(2).c_str());
  } else {
    std::puts(r.text.c_str());
    const std::string where =
        a.backend == "cuda" ? fmt::format("on {}", gpu.name) : fmt::format("{} threads", a.threads);
    const std::string rate = r.prefill_ops.empty() ? "" : fmt::format(" ({:.1f} GFLOP/s)", gflops);
    fmt::print(stderr,
               "\nprompt {} tokens, generated {} | TTFT {:.1f} ms | prefill {:.1f} tok/s{} | decode {:.1f} "
               "tok/s | peak RSS {:.0f} MiB | {} {} | prune {} ({:.1f}% of prompt token-layers computed)\n",
               r.prompt_ids.size(), r.generated_ids.size(), r.ttft_s * 1e3, prefill_tps, rate, decode_tps,
               lp::peak_rss_mib(), lp::dtype_name(dtype), where, a.prune,
               100.0 * r.prompt_tokens_computed_fraction);
  }
  return 0;
}

int cmd_inspect_trace(const std::string& path, bool json_out) {
  // Streamed: memory is one step, whatever the trace's length.
  lp::trace::TraceReader reader(path);
  const auto& h = reader.header();
  lp::trace::Summarizer sum(h);
  for (lp::trace::Step st; reader.next(st);) sum.add(st);
  const lp::trace::Summary s = sum.finish();
  const int64_t steps = sum.steps();
  const int64_t kv_per_token_layer = 2LL * h.model.value("n_head_kv", 0) * h.model.value("head_dim", 0) * 4;
  const int64_t D = h.model.value("n_embd", 0);
  if (json_out) {
    json j = {{"trace", path},
              {"version", h.version},
              {"policy", h.policy},
              {"schedule", h.schedule},
              {"prompt_tokens", h.prompt_tokens},
              {"steps", steps},
              {"detail", s.detail},
              {"prompt_share_per_layer", s.prompt_share_per_layer},
              {"prompt_tokens_computed_fraction", s.prompt_share},
              {"generation_tokens_computed_fraction", s.generation_share},
              {"at_most_once", s.at_most_once},
              {"kv_bytes_final_f32", s.kv_tokens_final * kv_per_token_layer},
              {"aux_cache_bytes_f32", s.aux_writes * D * 4},
              {"aux_writes", s.aux_writes},
              {"revivals", s.revivals}};
    std::puts(j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  fmt::print("{}: lazyprefill trace v{}, policy {}, schedule {}, {} prompt tokens, {} steps, {}\n",
             lp::escape_text(path), h.version, h.policy, lp::escape_text(h.schedule), h.prompt_tokens, steps,
             s.detail ? "with detail (kept positions, scores, revived positions)" : "counts only");
  fmt::print("prompt (token, layer) pairs computed: {:.1f}%   whole generation: {:.1f}%   at most once: {}\n",
             100 * s.prompt_share, 100 * s.generation_share, s.at_most_once ? "yes" : "NO");
  fmt::print("KV at the end: {:.2f} MiB (f32)   Aux Cache: {} states, {:.2f} MiB   revivals: {}\n",
             double(s.kv_tokens_final * kv_per_token_layer) / 1048576.0, s.aux_writes,
             double(s.aux_writes * D * 4) / 1048576.0, s.revivals);
  fmt::print("share of prompt tokens computed per layer:\n");
  for (size_t l = 0; l < s.prompt_share_per_layer.size(); ++l)
    fmt::print("  layer {:>3}: {:>6.1f}%\n", l, 100 * s.prompt_share_per_layer[l]);
  return 0;
}

int cmd_inspect(const std::string& path_arg, bool json_out) {
  const std::string path = path_arg.empty() ? lp::default_model_path() : path_arg;
  const lp::GgufFile f = lp::GgufFile::open(path);
  const lp::ModelConfig c = lp::config_from_gguf(f);
  const lp::VocabData v = lp::vocab_from_gguf(f);
  std::map<std::string, std::pair<int, int64_t>> by_type;
  int64_t total_bytes = 0;
  for (const auto& t : f.tensors()) {
    auto& e = by_type[std::string(lp::type_info(uint32_t(t.type))->name)];
    e.first += 1;
    e.second += t.n_bytes;
    total_bytes += t.n_bytes;
  }
  json j;
  j["file"] = path;
  j["gguf_version"] = f.version();
  j["architecture"] = c.arch;
  j["name"] = c.name;
  j["config"] = {
      {"n_layer", c.n_layer},     {"n_embd", c.n_embd},           {"n_head", c.n_head},
      {"n_head_kv", c.n_head_kv}, {"head_dim", c.head_dim},       {"n_ff", c.n_ff},
      {"n_vocab", c.n_vocab},     {"n_ctx_train", c.n_ctx_train}, {"rope_theta", c.rope_theta},
      {"rope_dim", c.rope_dim},   {"rms_eps", c.rms_eps},         {"tied_embeddings", c.tied_embeddings},
      {"n_params", c.n_params()}};
  j["tokenizer"] = {{"model", v.model},
                    {"pre", v.pre},
                    {"n_tokens", v.tokens.size()},
                    {"n_merges", v.merges.size()},
                    {"bos_id", v.bos_id},
                    {"eos_id", v.eos_id},
                    {"add_bos", v.add_bos},
                    {"has_chat_template", !v.chat_template.empty()}};
  json types = json::object();
  for (const auto& [k, e] : by_type) types[k] = {{"tensors", e.first}, {"bytes", e.second}};
  j["tensor_types"] = types;
  j["tensor_bytes"] = total_bytes;
  json tensors = json::array();
  for (const auto& t : f.tensors())
    tensors.push_back({{"name", t.name},
                       {"type", lp::type_info(uint32_t(t.type))->name},
                       {"shape", t.ne},
                       {"bytes", t.n_bytes}});
  j["tensors"] = tensors;
  if (json_out) {  // JSON escapes control characters; bytes that are not UTF-8 become U+FFFD
    std::puts(j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  // Text from the file is escaped: a name cannot forge lines or send terminal escapes.
  const auto esc = [](const std::string& x) { return lp::escape_text(x); };
  fmt::print("{}  (GGUF v{}, {:.1f} MiB of tensors)\n", esc(path), f.version(), total_bytes / 1048576.0);
  fmt::print("architecture {}  \"{}\"\n", esc(c.arch), esc(c.name));
  fmt::print("  layers {}  width {}  heads {} (kv {})  head dim {}  ffn {}  vocab {}  context {}\n",
             c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab, c.n_ctx_train);
  fmt::print("  rope theta {}  rope dims {}  rms eps {}  tied embeddings {}  params {:.1f} M\n", c.rope_theta,
             c.rope_dim, c.rms_eps, c.tied_embeddings ? "yes" : "no", c.n_params() / 1e6);
  fmt::print("tokenizer {} (pre '{}')  {} tokens  {} merges  bos {}  eos {}  add_bos {}  chat template {}\n",
             esc(v.model), esc(v.pre), v.tokens.size(), v.merges.size(), v.bos_id, v.eos_id, v.add_bos,
             v.chat_template.empty() ? "no" : "yes");
  fmt::print("tensor types:\n");
  for (const auto& [k, e] : by_type)
    fmt::print("  {:<6} {:>4} tensors {:>10.2f} MiB\n", k, e.first, e.second / 1048576.0);
  fmt::print("tensors:\n");
  for (const auto& t : f.tensors())
    fmt::print("  {:<28} {:<5} [{}] {} bytes\n", esc(t.name), lp::type_info(uint32_t(t.type))->name,
               fmt::join(t.ne, ", "), t.n_bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  lp::remove_temp_files_on_signal();  // an interrupted command leaves no half-written temporary file
  CLI::App app{"lazyprefill: LazyLLM dynamic token pruning, run for real and simulated"};
  app.set_version_flag("--version", std::string(LP_VERSION) + " (" + LP_GIT_COMMIT + ")");
  app.require_subcommand(1);
  // One line, like every other error (CLI11's default adds "Run with --help ..." on a second).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("lazyprefill: error: {} (see --help)\n", lp::escape_text(e.what()));
  });

  RunArgs ra;
  auto* run =
      app.add_subcommand("run",
                         "Generate from a GGUF model on the CPU and report timings.\n"
                         "  lazyprefill run --chat --prompt-file prompts/ruth.txt --max-new-tokens 16\n"
                         "  lazyprefill run --prompt-file long.txt --prune lazyllm --trace run.jsonl --json");
  run->add_option("--model", ra.model, "GGUF model file (default: the SmolLM2-135M-Instruct in the cache)")
      ->check(lp::cli::non_empty_path());
  run->add_option("--prompt", ra.prompt, "Prompt text");
  run->add_option("--prompt-file", ra.prompt_file, "File holding the prompt (UTF-8)");
  run->add_option("--max-new-tokens", ra.max_new_tokens, "Tokens to generate")->check(CLI::Range(0, 1 << 20));
  run->add_option("--threads", ra.threads, "CPU threads")->check(CLI::Range(1, 1024));
  run->add_option("--dtype", ra.dtype,
                  "Compute dtype: f32 (exact), bf16 (bf16 GEMM inputs, f32 accumulation), or auto: bf16 with "
                  "--backend cuda; on the CPU bf16 where it has native bf16 (AVX-512 BF16/AMX), else f32")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  run->add_option("--backend", ra.backend,
                  "cpu (default) or cuda (needs an NVIDIA GPU and a build with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  run->add_flag(
      "--op-timers", ra.op_timers,
      "With --backend cuda: time every op (the GPU synchronised around each) and put them in --json");
  run->add_flag("--chat", ra.chat, "Wrap the prompt in the model's chat template (ChatML)");
  run->add_flag("--json", ra.json_out, "Print one JSON object");
  run->add_option("--temperature", ra.temperature, "Sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0))
      ->check(lp::cli::finite_number());
  run->add_option("--top-p", ra.top_p, "Nucleus sampling threshold")
      ->check(CLI::Range(0.0, 1.0))
      ->check(lp::cli::finite_number());
  run->add_option("--seed", ra.seed, "Random seed for sampling and for --prune random")
      ->check(lp::cli::digits_only());
  auto* trace_opt = run->add_option("--trace", ra.trace,
                                    "Write the run's trace (JSON Lines, traces/README.md) to this file");
  run->add_flag("--trace-detail", ra.trace_detail,
                "Also record in the trace the positions kept and the scores at each pruning layer, and the "
                "positions revived")
      ->needs(trace_opt);
  run->add_option("--prune", ra.prune,
                  "Prefill token pruning: none, lazyllm (LazyLLM), static (select once) or random")
      ->check(CLI::IsMember({"none", "lazyllm", "static", "random"}));
  run->add_option("--schedule", ra.schedule,
                  std::string("Pruning schedule, inline or a JSON file (default 0.3:0.3,0.6:0.3,0.9:0.3). ") +
                      lp::kScheduleSyntaxHelp)
      ->check(lp::cli::non_empty_schedule());

  std::string inspect_model, inspect_trace;
  bool inspect_json = false;
  auto* inspect =
      app.add_subcommand("inspect",
                         "Show a GGUF model's architecture, tensors and tokenizer, or summarise a trace.\n"
                         "  lazyprefill inspect --model model.gguf --json\n"
                         "  lazyprefill inspect --trace run.jsonl");
  inspect->add_option("--model", inspect_model, "GGUF model file (default: the cached SmolLM2)")
      ->check(lp::cli::non_empty_path());
  inspect->add_option("--trace", inspect_trace, "Summarise a trace written by run --trace instead");
  inspect->add_flag("--json", inspect_json, "Print JSON");

  lp::cli::SimulateArgs sa;
  auto* simulate = lp::cli::add_simulate(app, sa);
  lp::cli::CalibrateArgs ca;
  auto* calibrate = lp::cli::add_calibrate(app, ca);
  lp::cli::CalibrateRevivalsArgs cra;
  auto* calibrate_revivals = lp::cli::add_calibrate_revivals(app, cra);
  lp::cli::ValidateArgs va;
  auto* validate = lp::cli::add_validate(app, va);
  lp::cli::ReportArgs rpa;
  auto* report = lp::cli::add_report(app, rpa);
  lp::cli::SweepArgs swa;
  auto* sweep = lp::cli::add_sweep(app, swa);
  lp::cli::EvalArgs eva;
  auto* evalc = lp::cli::add_eval(app, eva);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other command-line problem is a usage error (2).
    return app.exit(e) == 0 ? 0 : 2;
  }
  ra.prompt_given = run->count("--prompt") > 0;
  const auto dispatch = [&]() -> int {
    try {
      if (*run) return cmd_run(ra);
      if (*simulate) return lp::cli::cmd_simulate(sa, *simulate);
      if (*calibrate) return lp::cli::cmd_calibrate(ca);
      if (*calibrate_revivals) return lp::cli::cmd_calibrate_revivals(cra);
      if (*validate) return lp::cli::cmd_validate(va);
      if (*report) return lp::cli::cmd_report(rpa);
      if (*sweep) return lp::cli::cmd_sweep(swa);
      if (*evalc) return lp::cli::cmd_eval(eva);
      if (*inspect && !inspect_trace.empty()) return cmd_inspect_trace(inspect_trace, inspect_json);
      if (*inspect) return cmd_inspect(inspect_model, inspect_json);
    } catch (const lp::UsageError& e) {
      fmt::print(stderr, "lazyprefill: error: {} (see --help)\n", lp::escape_text(e.what()));
      return 2;
    } catch (const lp::Error& e) {
      fmt::print(stderr, "lazyprefill: error: {}\n", lp::escape_text(e.what()));
      return 1;
    } catch (const std::bad_alloc&) {
      fmt::print(stderr, "lazyprefill: error: out of memory\n");
      return 1;
    } catch (const std::exception& e) {
      fmt::print(stderr, "lazyprefill: error: {}\n", lp::escape_text(e.what()));
      return 1;
    }
    return 0;
  };
  int rc = dispatch();
  // Standard output is an output like any other: a full disk or a closed pipe must not end in
  // exit 0 with nothing written (simulate --json > /dev/full did).
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "lazyprefill: error: cannot write standard output: {}\n",
               errno != 0 ? std::strerror(errno) : "a write failed");
    rc = rc == 0 ? 1 : rc;
  }
  return rc;
}
