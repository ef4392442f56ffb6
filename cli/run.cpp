// `lazyprefill run`: generate from a GGUF model on the CPU or CUDA backend (one engine,
// engine/generate.h), with LazyLLM or a baseline pruning when asked, and report the timings: text,
// or one JSON object in the same shape for both backends (the measurement `calibrate` reads).
// --trace records the run's trace (traces/README.md).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/run_output.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "kernels/context.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/io.h"
#include "model/paths.h"
#include "pruning/method.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "traces/trace.h"

namespace lp::cli {
namespace {

using json = nlohmann::ordered_json;

// --backend cuda: the device, and whether the model's weights alone fit in its free memory, before
// the (long) load. The session counts the rest (K/V, Aux Cache, activations) for the prompt's
// tokens once it is tokenised, and refuses before allocating.
lp::cuda::Device check_cuda_backend(const std::string& path, lp::DType dtype) {
  const lp::cuda::Device d = lp::cuda::open_device();  // one line saying why not, else the GPU
  const lp::ModelConfig c = lp::config_from_gguf(lp::GgufFile::open(path));
  // int8: blocks as stored, or Q8_0 (34 bytes per 32 weights) for the types requantized: at most that.
  const double weight_bytes = double(c.n_params()) * (dtype == lp::DType::F32    ? 4
                                                      : dtype == lp::DType::BF16 ? 2
                                                                                 : 34.0 / 32);
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

// The prompt's text, from exactly one of --prompt and --prompt-file, valid UTF-8 and not empty.
std::string prompt_text(const RunArgs& a) {
  if (a.prompt_given == !a.prompt_file.empty())
    lp::usage_fail("give exactly one of --prompt or --prompt-file");
  std::string text = a.prompt_given ? a.prompt : read_prompt_file(a.prompt_file);
  if (const int64_t bad = lp::find_invalid_utf8(text); bad >= 0)
    lp::fail("prompt{} is not valid UTF-8 (byte offset {})",
             a.prompt_file.empty() ? "" : " file '" + a.prompt_file + "'", bad);
  if (text.empty()) lp::fail("the prompt is empty");
  return text;
}

// Fails before the (long) run when the trace could not be written afterwards.
void check_trace_writable(const std::string& trace) {
  if (trace.empty()) return;
  const std::filesystem::path dir = std::filesystem::absolute(trace).parent_path();
  if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0)
    lp::fail("cannot write trace '{}': folder '{}' does not exist or is not writable", trace, dir.string());
  if (std::filesystem::is_directory(trace)) lp::fail("cannot write trace '{}': it is a folder", trace);
}

lp::GenerateOptions generate_options(const RunArgs& a) {
  lp::GenerateOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.sampler = {a.temperature, a.top_p, a.seed};
  opt.policy = lp::parse_policy(a.prune);
  opt.schedule = a.schedule.empty() ? lp::default_schedule(opt.policy) : lp::schedule_from_arg(a.schedule);
  lp::check_method(opt.policy, opt.schedule);
  opt.prune_seed = a.seed;
  opt.record_steps = !a.trace.empty();
  if (a.backend == "cuda") opt.gpu_op_timers = a.op_timers;
  opt.warmup = a.warmup == "on" || (a.warmup == "auto" && a.backend == "cuda");
  return opt;
}

// The text, then the one-line summary on stderr.
void print_run_text(const RunArgs& a, const lp::GenerateResult& r, lp::DType dtype, const std::string& gpu) {
  std::puts(r.text.c_str());
  const double prefill_tps = r.prompt_ids.size() / r.prefill_s;
  const double decode_tps = r.decode_steps > 0 ? r.decode_steps / r.decode_s : 0.0;
  const double gflops = r.prefill_ops.total_flops() / r.prefill_s / 1e9;
  const std::string where =
      a.backend == "cuda" ? fmt::format("on {}", gpu) : fmt::format("{} threads", a.threads);
  const std::string rate = r.prefill_ops.empty() ? "" : fmt::format(" ({:.1f} GFLOP/s)", gflops);
  fmt::print(stderr,
             "\nprompt {} tokens, generated {} | TTFT {:.1f} ms | prefill {:.1f} tok/s{} | decode {:.1f} "
             "tok/s | peak RSS {:.0f} MiB | {} {} | prune {} ({:.1f}% of prompt token-layers computed)\n",
             r.prompt_ids.size(), r.generated_ids.size(), r.ttft_s * 1e3, prefill_tps, rate, decode_tps,
             lp::peak_rss_mib(), lp::dtype_name(dtype), where, a.prune,
             100.0 * r.prompt_tokens_computed_fraction);
}

}  // namespace

int cmd_run(const RunArgs& a) {
  if (a.runahead) return cmd_run_runahead(a);
  const std::string path = a.model.empty() ? lp::default_model_path() : a.model;
  lp::refuse_output_over_input(a.trace, "--trace", {path, a.prompt_file, a.schedule});
  const std::string text = prompt_text(a);
  const std::optional<lp::DType> asked = lp::cli::dtype_option(a.dtype);
  check_trace_writable(a.trace);
  lp::cuda::Device gpu;
  if (a.op_timers && a.backend != "cuda")
    lp::usage_fail("--op-timers is for --backend cuda (the CPU always times its ops)");
  if (a.cuda_graphs && a.backend != "cuda") lp::usage_fail("--cuda-graphs is for --backend cuda");
  if (a.backend == "cuda") {
    gpu = check_cuda_backend(path, asked.value_or(lp::DType::BF16));  // auto on a GPU: bf16 (Model::load_as)
  }
  lp::CpuContext ctx(a.threads);
  const auto model = lp::Model::load_as(path, asked, ctx, a.backend != "cuda");
  const lp::DType dtype = model->weights().dtype;
  const lp::Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> ids;
  if (a.chat) {
    const lp::ChatMessage msg{"user", text};
    ids = tok.encode(tok.apply_chat_template({&msg, 1}, true), false, true);
  } else {
    ids = tok.encode(text, true, false);
  }
  if (ids.empty()) lp::fail("the prompt is empty (no tokens)");
  const lp::GenerateOptions opt = generate_options(a);
  // One engine (engine/session.h) on the chosen backend.
  const lp::GenerateResult r =
      a.backend == "cuda"
          ? lp::generate(*model, ids, opt,
                         [&](int64_t n_ctx) {
                           return lp::cuda::make_backend(model->config(), model->weights(), n_ctx,
                                                         {.cuda_graphs = a.cuda_graphs});
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
  if (!a.json_out) {
    print_run_text(a, r, dtype, gpu.name);
    return 0;
  }
  json j = lp::cli::run_json(*model, opt, r, lp::dtype_name(dtype), a.threads);
  j["backend"] = a.backend;
  if (a.backend == "cuda") {
    // `calibrate --measurements` reads `hardware` (calibrate/measurements.h): the GPU.
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
  return 0;
}

}  // namespace lp::cli
