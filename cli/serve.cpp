// `lazyprefill serve`: the OpenAI-compatible HTTP server (server/http_server.h) over the engine's
// continuous-batching scheduler, LazyLLM chosen per server and per request. docs/serving.md.
#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "engine/gpu_memory.h"
#include "engine/model.h"
#include "kernels/cpu/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/error.h"
#include "model/io.h"
#include "model/paths.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "server/http_server.h"
#include "server/loading.h"

namespace lp::cli {

int cmd_serve(const ServeArgs& a) {
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  if (!a.log_requests.empty()) refuse_output_over_input(a.log_requests, "--log-requests", {path, a.schedule});
  server::ServerOptions so;
  so.host = a.host;
  so.port = uint16_t(a.port);
  so.max_connections = a.max_connections;
  so.max_body_bytes = a.max_body_kib << 10;
  so.log_requests = a.log_requests;
  const auto ms = [](double s) { return std::chrono::milliseconds(int64_t(s * 1e3)); };
  so.header_timeout = ms(a.header_timeout_s);
  so.body_timeout = ms(a.body_timeout_s);
  so.shutdown_grace = ms(a.shutdown_grace_s);
  so.health_stall = ms(a.health_stall_s);
  so.health_generate_timeout = ms(a.health_generate_timeout_s);
  so.api.model_name = a.served_name.empty()
                          ? std::filesystem::path(path).filename().replace_extension().string()
                          : a.served_name;
  so.api.policy = parse_policy(a.prune);
  so.api.schedule = a.schedule.empty() ? default_schedule(so.api.policy) : schedule_from_arg(a.schedule);
  check_method(so.api.policy, so.api.schedule);
  so.api.chat_max_tokens = a.chat_max_tokens;
  so.api.max_n = a.max_n;
  so.access.api_keys = a.api_keys;
  if (!a.api_key_file.empty())
    for (std::string& k : server::read_api_key_file(a.api_key_file))
      so.access.api_keys.push_back(std::move(k));
  so.access.metrics_need_key = a.metrics_need_key;
  so.lazyprefill_metric_names = a.metric_names != "vllm";
  so.vllm_metric_names = a.metric_names != "lazyprefill";
  so.access.allowed_hosts = a.allowed_hosts;
  so.access.allowed_origins = a.allowed_origins;
  server::check_access_options(so.access);
  if (a.cuda_graphs && a.backend != "cuda") usage_fail("--cuda-graphs is for --backend cuda");

  // One line saying why not, before the load; its free memory, before the weights go up.
  const std::optional<cuda::Device> gpu =
      a.backend == "cuda" ? std::optional<cuda::Device>(cuda::open_device()) : std::nullopt;
  // The port answers 503 "loading" while the model loads (server/loading.h), then is handed over.
  std::optional<server::LoadingResponder> loading(std::in_place, so.host, so.port);
  so.port = loading->port();
  fmt::print(stderr, "lazyprefill serve: loading {} (http://{}:{} answers 503 until it is ready)\n", path,
             so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, so.port);
  std::fflush(stderr);
  CpuContext ctx(a.threads);
  const bool cpu = a.backend == "cpu";
  const auto model = Model::load_as(path, dtype_option(a.dtype), ctx, cpu);
  if (so.api.policy != PolicyKind::None)
    (void)resolve_method(so.api.policy, so.api.schedule, model->config().n_layer,
                         model->config().global_layers());
  if (model->config().n_ctx_train < 2) fail("'{}' gives no context length (llama.context_length)", path);

  if (a.max_model_len > model->config().n_ctx_train)
    fail("--max-model-len {} is beyond the model's context of {} tokens", a.max_model_len,
         model->config().n_ctx_train);
  SchedulerOptions sched;
  sched.max_batch_tokens = a.max_batch_tokens;
  sched.kv_budget_bytes = (a.kv_budget_mib > 0 ? a.kv_budget_mib : 1024) << 20;
  sched.max_request_tokens = a.max_model_len;
  std::string memory_note;
  if (gpu) {
    const DeviceMemoryPlan plan = gpu_memory_plan(*model, *gpu, a.gpu_memory_utilization, a.max_model_len);
    if (a.kv_budget_mib > 0 && double(a.kv_budget_mib << 20) > plan.kv_budget_bytes)
      fail(
          "--kv-budget-mib {} does not fit: {:.0f}% of {}'s memory holds {} MiB of reservations beside the "
          "weights ({:.2f} GiB) and a {}-token prefill ({:.2f} GiB)",
          a.kv_budget_mib, a.gpu_memory_utilization * 100, gpu->name, int64_t(plan.kv_budget_bytes) >> 20,
          plan.weights / 1073741824.0, plan.max_request_tokens, plan.prefill / 1073741824.0);
    if (a.kv_budget_mib == 0) sched.kv_budget_bytes = int64_t(plan.kv_budget_bytes);
    sched.max_request_tokens = plan.max_request_tokens;
    memory_note =
        fmt::format(" (of {:.0f}% of {}'s {:.1f} GiB: weights {:.2f} GiB, a {}-token prefill {:.2f} GiB)",
                    a.gpu_memory_utilization * 100, gpu->name, double(gpu->total_bytes) / 1073741824.0,
                    plan.weights / 1073741824.0, plan.max_request_tokens, plan.prefill / 1073741824.0);
  }
  so.api.max_model_len = sched.max_request_tokens;
  sched.prefix_cache = !a.no_prefix_cache;
  sched.prefix_block_tokens = a.prefix_block_tokens;
  sched.prefix_cache_max_bytes = (a.prefix_cache_mib > 0 ? a.prefix_cache_mib : gpu ? 4096 : 0) << 20;
  const Model& m = *model;
  if (a.backend == "cuda")
    sched.make_backend = [&m, graphs = a.cuda_graphs](int64_t n_ctx) {
      return cuda::make_backend(m.config(), m.weights(), n_ctx, {.cuda_graphs = graphs});
    };
  else
    sched.make_backend = [&m, &ctx](int64_t n_ctx) -> std::unique_ptr<Backend> {
      return std::make_unique<CpuBackend>(ctx, m.config(), m.weights(), n_ctx);
    };

  so.listening_socket = loading->release();
  loading.reset();
  server::Server srv(m, std::move(sched), so);
  const char* kv_dtype = srv.scheduler().kv_layout().element_bytes == 2 ? "f16" : "f32";
  const bool loopback = so.host == "127.0.0.1" || so.host == "::1";
  fmt::print(stderr,
             "lazyprefill serve: {} ({}, {}) on http://{}:{} ({}); prune {} by default; K/V budget {} MiB "
             "({} K/V){}; requests up to {} tokens; {} threads\n",
             so.api.model_name, dtype_name(m.weights().dtype), a.backend,
             so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, srv.port(),
             loopback ? "this machine only" : "reachable from the network", a.prune,
             srv.scheduler().budget_bytes() >> 20, kv_dtype, memory_note,
             server::max_model_len(so.api, m.config()), a.threads);
  if (!a.no_prefix_cache && !srv.scheduler().prefix_cache())
    fmt::print(stderr,
               "lazyprefill serve: no prefix cache: the {} backend cannot copy its K/V between sessions\n",
               a.backend);
  if (!loopback && so.access.api_keys.empty())
    fmt::print(stderr,
               "lazyprefill serve: warning: listening beyond this machine without an API key: anyone who can "
               "reach the port can use it (--api-key-file FILE)\n");
  else if (!so.access.api_keys.empty())
    fmt::print(stderr, "lazyprefill serve: {} API key(s) required on /v1/*{}\n", so.access.api_keys.size(),
               so.access.metrics_need_key ? " and /metrics" : "");
  std::fflush(stderr);
  srv.run(true);
  if (!srv.failure().empty()) fail("{}", srv.failure());
  fmt::print(stderr, "lazyprefill serve: stopped\n");
  return 0;
}

}  // namespace lp::cli
