// `lazyprefill serve`: the OpenAI-compatible HTTP server (server/http_server.h) over the engine's
// continuous-batching scheduler, LazyLLM chosen per server and per request. docs/serving.md.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <optional>

#include "cli/commands.h"
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

CLI::App* add_serve(CLI::App& app, ServeArgs& a) {
  auto* s = app.add_subcommand(
      "serve", R"(Serve a GGUF model over HTTP with OpenAI's API (completions, chat completions, streaming),
continuous batching and LazyLLM per request; /metrics in the Prometheus format. Binds 127.0.0.1 unless
--host says otherwise. Stops on SIGINT/SIGTERM after the requests in flight finish.
  lazyprefill serve --port 8000 --prune lazyllm --kv-budget-mib 1024
  curl localhost:8000/v1/completions -d '{"prompt": "In the beginning", "max_tokens": 16}')");
  add_gguf_model(*s, a.model);
  s->add_option(
      "--host", a.host,
      "Address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 serves every interface)");
  s->add_option("--port", a.port, "TCP port (0: any free one, printed)")->check(CLI::Range(0, 65535));
  s->add_option("--api-key", a.api_keys,
                "A key clients must send as 'Authorization: Bearer KEY' (repeatable; also from "
                "LAZYPREFILL_API_KEY); /health stays open")
      ->envname("LAZYPREFILL_API_KEY");
  s->add_option("--api-key-file", a.api_key_file,
                "Keys one per line ('#' comments); refused when every user can read the file");
  s->add_flag("--metrics-need-key", a.metrics_need_key, "GET /metrics needs a key too");
  s->add_option("--health-stall-s", a.health_stall_s,
                "GET /health answers 503 once the engine has made no progress for this long with requests "
                "waiting or running (default 120; 0: never)")
      ->check(CLI::Range(0.0, 86400.0));
  s->add_option("--health-generate-timeout-s", a.health_generate_timeout_s,
                "GET /health_generate (one token through the scheduler) answers 503 past this (default 30)")
      ->check(CLI::Range(0.001, 3600.0));
  s->add_option("--metric-names", a.metric_names,
                "Names in /metrics: lazyprefill (lazyprefill_*), vllm (vLLM's vllm:* with its labels and "
                "buckets, for dashboards and autoscalers built for vLLM), or both (default)")
      ->check(CLI::IsMember({"lazyprefill", "vllm", "both"}));
  s->add_option("--allowed-host", a.allowed_hosts,
                "A Host name to answer to beyond the bound address (and localhost when on loopback; "
                "repeatable): others get 403, against DNS rebinding");
  s->add_option("--allowed-origin", a.allowed_origins,
                "A web page origin (scheme://host[:port], or *) allowed to call the API from a browser, "
                "with CORS headers (repeatable); other origins get 403");
  s->add_option("--served-model-name", a.served_name,
                "The model's name in the API (default: the GGUF file's name without .gguf)");
  s->add_option(
       "--prune", a.prune,
       "Pruning for requests that do not choose (their \"lazyprefill\" field): none, lazyllm, static-paper, "
       "random-drop, frozen, random-layers (run --help says what each does)")
      ->check(policy_names());
  s->add_option(
       "--schedule", a.schedule,
       std::string("Default pruning schedule, inline or a JSON file (default 0.3:0.3,0.6:0.3,0.9:0.3). ") +
           kScheduleSyntaxHelp)
      ->check(non_empty_schedule());
  s->add_option("--max-batch-tokens", a.max_batch_tokens,
                "Rows per iteration: decoding rows + prefill tokens (a longer prompt runs alone)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  s->add_option("--kv-budget-mib", a.kv_budget_mib,
                "K/V memory requests may reserve (prompt + max_tokens each, and the Aux Cache); a request "
                "waits until its reservation fits")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  s->add_flag("--no-prefix-cache", a.no_prefix_cache,
              "Compute every prompt in full (by default a prompt reuses the K/V, and with LazyLLM the pruned "
              "state, of the longest prefix an earlier request left in the cache, inside the K/V budget)");
  s->add_option("--prefix-block-tokens", a.prefix_block_tokens,
                "Tokens per prefix cache block: a prompt reuses whole blocks (default 16, as vLLM's)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  s->add_option(
       "--max-n", a.max_n,
       "Choices a request may ask for (\"n\"), each its own generation from the shared prompt (default 8)")
      ->check(CLI::Range(1, 128));
  s->add_option("--threads", a.threads, "CPU threads")->check(CLI::Range(1, 1024));
  s->add_option("--dtype", a.dtype, "Compute dtype, as for run: auto, f32, bf16, int8")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "int8"}));
  s->add_option("--backend", a.backend, "cpu (default) or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  s->add_option("--log-requests", a.log_requests,
                "Append one JSON line per finished request to this file (times, tokens, pruning share, "
                "revivals)")
      ->check(non_empty_path());
  s->add_option("--max-connections", a.max_connections, "Open connections; one more is answered 429")
      ->check(CLI::Range(1, 100000));
  s->add_option("--max-body-kib", a.max_body_kib, "Largest request body (413 beyond)")
      ->check(CLI::Range(1, 1 << 20));
  s->add_option("--chat-max-tokens", a.chat_max_tokens,
                "max_tokens of a chat request that gives none (bounded by the context)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  s->add_option("--header-timeout-s", a.header_timeout_s, "Seconds a request's header may take to arrive")
      ->check(CLI::Range(0.01, 3600.0));
  s->add_option("--body-timeout-s", a.body_timeout_s, "Seconds a request's body may take to arrive")
      ->check(CLI::Range(0.01, 3600.0));
  s->add_option("--shutdown-grace-s", a.shutdown_grace_s,
                "On SIGINT/SIGTERM, seconds requests in flight get to finish before they are cancelled")
      ->check(CLI::Range(0.0, 3600.0));
  return s;
}

int cmd_serve(const ServeArgs& a, const CLI::App&) {
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

  if (a.backend == "cuda") (void)cuda::open_device();  // one line saying why not, before the load
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

  SchedulerOptions sched;
  sched.max_batch_tokens = a.max_batch_tokens;
  sched.kv_budget_bytes = a.kv_budget_mib << 20;
  sched.prefix_cache = !a.no_prefix_cache;
  sched.prefix_block_tokens = a.prefix_block_tokens;
  const Model& m = *model;
  if (a.backend == "cuda")
    sched.make_backend = [&m](int64_t n_ctx) { return cuda::make_backend(m.config(), m.weights(), n_ctx); };
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
             "({} K/V); {} "
             "threads\n",
             so.api.model_name, dtype_name(m.weights().dtype), a.backend,
             so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host, srv.port(),
             loopback ? "this machine only" : "reachable from the network", a.prune, a.kv_budget_mib,
             kv_dtype, a.threads);
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
  fmt::print(stderr, "lazyprefill serve: stopped\n");
  return 0;
}

}  // namespace lp::cli
