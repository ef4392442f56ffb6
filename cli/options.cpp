// The options several subcommands share, declared once so that they read and check the same
// everywhere (options.h).
#include "cli/options.h"

#include <fmt/format.h>

#include <string>

#include "model/error.h"
#include "model/presets.h"

namespace lp::cli {

CLI::Option* add_gguf_model(CLI::App& sub, std::string& gguf) {
  return sub.add_option("--model", gguf, "GGUF model file (default: the SmolLM2-135M-Instruct in the cache)")
      ->check(non_empty_path());
}

void add_model_choice(CLI::App& sub, std::string& gguf, std::string& preset, const char* what) {
  auto* model = sub.add_option("--model", gguf, std::string("GGUF file whose configuration to ") + what)
                    ->check(non_empty_path());
  auto* config = sub.add_option("--model-config", preset,
                                "A preset model configuration (see --help-models), or a JSON file of one "
                                "(a report's provenance.model.config)");
  model->excludes(config);
  add_help_models(sub);
}

void add_expert_parallel(CLI::App& sub, int& ep, double& imbalance, int& dp) {
  sub.add_option(
      "--ep", ep,
      "Expert parallelism: spread a MoE model's experts whole over N of the --tp GPUs (N divides "
      "--tp and the experts; default 1: each expert split --tp ways; with --dp, all dp x tp GPUs)");
  sub.add_option("--dp", dp,
                 "Data-parallel attention around a MoE model's experts: N groups of --tp GPUs, each "
                 "attending its own requests, the experts over all N x tp GPUs with all-to-all dispatch "
                 "and combine (DeepSeek's deployment; default 1)");
  sub.add_option(
      "--moe-imbalance", imbalance,
      "With --ep: the busiest GPU's routed (token, expert) pairs over the mean (at least 1; default: "
      "the expected busiest under uniform routing)");
}

void add_help_models(CLI::App& app) {
  app.add_flag_callback(
      "--help-models",
      [] {
        fmt::print("Model presets (--model-config NAME; docs/model-presets.md gives each one's sources):\n");
        fmt::print("{:<18} {:>9} {:>9} {:>6} {:>9}  {}\n", "name", "params", "active", "layers", "context",
                   "layer kinds");
        for (const PresetSummary& p : preset_summaries())
          fmt::print("{:<18} {:>8.2f}B {:>8.2f}B {:>6} {:>9}  {}\n", p.name, double(p.n_params) / 1e9,
                     double(p.n_active_params) / 1e9, p.n_layer, p.n_ctx_train, p.layers);
        throw CLI::Success();
      },
      "List the model presets with their parameters, active parameters and layer kinds, and exit");
}

void add_hardware(CLI::App& sub, std::string& hw, std::string& engine) {
  sub.add_option("--hw", hw, "Hardware profiles, comma-separated names or .json files")->required();
  sub.add_option("--engine", engine, kEngineHelp);
}

void add_precision(CLI::App& sub, sim::Precision& p, const char* of) {
  sub.add_option("--weights", p.weights,
                 "Weight dtype" + std::string(of) +
                     ": bf16, f16, f32, int8, fp8, fp4, mxfp4, q4, "
                     "<bits>bpw (default " +
                     p.weights + ")");
  sub.add_option("--compute", p.compute,
                 "GEMM/attention compute dtype" + std::string(of) +
                     ": bf16, f16, f32, tf32, int8, fp8, fp4 (default " + p.compute + ")");
  sub.add_option("--expert-weights", p.expert_weights,
                 "Weight dtype of the experts" + std::string(of) +
                     " where it differs (gpt-oss: mxfp4): the --weights types (default: --weights)");
  sub.add_option("--kv", p.kv,
                 "KV cache dtype" + std::string(of) + ": bf16, f16, f32, int8, fp8 (default " + p.kv + ")");
}

std::optional<DType> dtype_option(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s == "f32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  if (s == "int8") return DType::Int8;
  usage_fail("--dtype must be auto, f32, bf16 or int8, got '{}'", s);
}

void add_scheduler_options(CLI::App& s, SchedulerArgs& a) {
  s.add_option(
      "--max-batch-tokens", a.max_batch_tokens,
      "Rows per iteration (default: the engine's; lazyprefill's serve 2048, vLLM's 8192 from 70 GiB)");
  s.add_option("--max-seqs", a.max_seqs,
               "Requests running at once at most, as vLLM's max_num_seqs and TensorRT-LLM's max_batch_size "
               "(default: the engine's; 0 as many as the K/V budget holds, as serve's)");
  s.add_option(
       "--kv-mode", a.kv_mode,
       "How K/V is held: reserve (each request's worst case at admission: serve's, TensorRT-LLM's) or "
       "on-demand (blocks as tokens are computed, the newest running request preempted and recomputed "
       "when they run out: vLLM's) (default: the engine's)")
      ->check(CLI::IsMember({"reserve", "on-demand"}));
  s.add_option("--kv-block-tokens", a.kv_block_tokens,
               "Tokens a K/V block holds (default: the engine's; serve 64, vLLM 16, TensorRT-LLM 32)");
  s.add_option("--mixed", a.mixed,
               "Decoding rows share iterations with prefill work (true: vLLM, TensorRT-LLM, serve; false: "
               "SGLang's default) (default: the engine's)");
  s.add_option(
      "--chunk-tokens", a.chunk_tokens,
      "Chunked prefill: prompts in chunks of at most N tokens (0: whole, as serve runs them) (default: "
      "the engine's)");
  s.add_option("--iteration-overhead-ms", a.iteration_overhead_ms,
               "Host time per iteration beyond the batch (default: the engine's)");
  s.add_option("--request-overhead-ms", a.request_overhead_ms,
               "Host time per request an iteration schedules (default: the engine's)");
}

}  // namespace lp::cli
