// The options of run, inspect, eval, serve and sweep: each subcommand's add_X, registering them into its
// XArgs (cli/options.h says why they live apart from the subcommands' own units).
#include <fmt/format.h>

#include <string>

#include "cli/options.h"

namespace lp::cli {

// run (cli/run.cpp)
CLI::App* add_run(CLI::App& app, RunArgs& a) {
  auto* run = app.add_subcommand(
      "run", R"(Generate from a GGUF model on the CPU (or a GPU: --backend cuda) and report timings.
  lazyprefill run --chat --prompt-file prompts/ruth.txt --max-new-tokens 16
  lazyprefill run --prompt-file long.txt --prune lazyllm --trace run.jsonl --json)");
  add_gguf_model(*run, a.model);
  run->add_option("--prompt", a.prompt, "Prompt text");
  // --prompt "" is an empty prompt (refused by run), not a missing one.
  run->parse_complete_callback([run, &a] { a.prompt_given = run->count("--prompt") > 0; });
  run->add_option("--prompt-file", a.prompt_file, "File holding the prompt (UTF-8)");
  run->add_option("--max-new-tokens", a.max_new_tokens, "Tokens to generate")->check(CLI::Range(0, 1 << 20));
  run->add_option("--threads", a.threads, "CPU threads")->check(CLI::Range(1, 1024));
  run->add_option(
         "--dtype", a.dtype,
         "Compute dtype: f32 (exact), bf16 (bf16 GEMM inputs, f32 accumulation), int8 (CPU: weights "
         "kept in the file's Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K blocks, others requantized to "
         "Q8_0, 8-bit "
         "activations, "
         "integer dot products; with --backend cuda the blocks stay on the GPU and multiply bf16 "
         "activations), or auto: bf16 with --backend cuda; on the CPU int8 for a file whose layers are all "
         "in those types, else bf16 where the CPU has native bf16 (AVX-512 BF16/AMX), else f32")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "int8"}));
  run->add_option("--backend", a.backend, "cpu (default) or cuda (needs an NVIDIA GPU and a build with CUDA)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  run->add_flag(
      "--op-timers", a.op_timers,
      "With --backend cuda: time every op (the GPU synchronised around each) and put them in --json");
  run->add_flag(
      "--cuda-graphs", a.cuda_graphs,
      "With --backend cuda: capture each decoding step as CUDA graphs (a graph per stretch between the "
      "host's waits, updated in place step after step) instead of launching its kernels one by one");
  run->add_option("--warmup", a.warmup,
                  "Run the prefill and one decoding step once, untimed, before the timed run (the caches "
                  "emptied between): on, off, or auto (on with --backend cuda, whose first launches load "
                  "kernels and create the cuBLAS handle; off on the CPU)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  run->add_flag("--chat", a.chat, "Wrap the prompt in the model's chat template (ChatML)");
  run->add_flag("--json", a.json_out, "Print one JSON object");
  run->add_option("--temperature", a.temperature, "Sampling temperature (0 = greedy)")
      ->check(CLI::Range(0.0, 100.0))
      ->check(lp::cli::finite_number());
  run->add_option("--top-p", a.top_p, "Nucleus sampling threshold")
      ->check(CLI::Range(0.0, 1.0))
      ->check(lp::cli::finite_number());
  run->add_option("--seed", a.seed, "Random seed for sampling and for --prune random-drop and random-layers")
      ->check(lp::cli::digits_only());
  auto* trace_opt = run->add_option("--trace", a.trace,
                                    "Write the run's trace (JSON Lines, traces/README.md) to this file");
  run->add_flag("--trace-detail", a.trace_detail,
                "Also record in the trace the positions kept and the scores at each pruning layer, and the "
                "positions revived")
      ->needs(trace_opt);
  run->add_option(
         "--prune", a.prune,
         "Token pruning: none, lazyllm (LazyLLM); the paper's baselines static-paper (one step L:S, "
         "scores from layers 0..L) and random-drop (a share of the prompt dropped before the model); "
         "the ablations frozen (LazyLLM's layers, scores frozen at the first) and random-layers")
      ->check(lp::cli::policy_names());
  run->add_option("--schedule", a.schedule,
                  std::string("Pruning schedule, inline or a JSON file (default 0.3:0.3,0.6:0.3,0.9:0.3; "
                              "static-paper 0.1:0.35, random-drop 0.3). ") +
                      lp::kScheduleSyntaxHelp)
      ->check(lp::cli::non_empty_schedule());
  auto* ra =
      run->add_flag("--runahead", a.runahead,
                    "KV-Runahead: under mpirun -n P, the prompt's prefill split over the P ranks (each a "
                    "chunk, the K/V prefix handed on layer by layer); the last rank decodes and prints "
                    "(docs/runahead.md)");
  run->add_option(
         "--partition", a.partition,
         "With --runahead: auto (balanced by the cost model on --runahead-hw, default), even, or chunk "
         "sizes n1,n2,... summing to the prompt's tokens")
      ->needs(ra);
  run->add_option("--runahead-hw", a.runahead_hw,
                  "With --runahead: the hardware profile that balances the partition (default cpu-local)")
      ->needs(ra);
  run->add_option("--runahead-timeout", a.runahead_timeout_s,
                  "With --runahead: seconds a rank waits for another before giving up (default 300)")
      ->check(CLI::Range(0.001, 1e6))
      ->needs(ra);
  return run;
}

// inspect (cli/inspect.cpp)
CLI::App* add_inspect(CLI::App& app, InspectArgs& a) {
  auto* inspect = app.add_subcommand(
      "inspect", R"(Show a GGUF model's architecture, tensors and tokenizer, or summarise a trace.
  lazyprefill inspect --model model.gguf --json
  lazyprefill inspect --trace run.jsonl)");
  add_gguf_model(*inspect, a.model);
  inspect->add_option("--trace", a.trace, "Summarise a trace written by run --trace instead");
  inspect
      ->add_option("--kv-growth", a.kv_growth,
                   "With --trace: also draw, as SVG, the share of the prompt's tokens with K/V per group of "
                   "layers at each decoding step (the LazyLLM paper's Figure 7)")
      ->needs("--trace")
      ->check(non_empty_path());
  inspect->add_flag("--json", a.json_out, "Print JSON");
  return inspect;
}

// eval (cli/eval.cpp)
CLI::App* add_eval(CLI::App& app, EvalArgs& a) {
  auto* e = app.add_subcommand(
      "eval",
      R"(Measure accuracy under pruning on long-context tasks from public-domain text (and the TTFT speedup).
  lazyprefill eval --task passkey,kv --lengths 2048 --samples 20 --prune lazyllm,static-paper,random-drop
  lazyprefill eval --task nll --lengths 4096 --samples 10 --prune lazyllm --schedule 0.3:0.3,0.6:0.3,0.9:0.3 --json)");
  add_gguf_model(*e, a.model);
  e->parse_complete_callback([e, &a] {
    a.prune_given = e->count("--prune") > 0;
    a.task_given = e->count("--task") > 0;
  });
  e->add_option("--task", a.tasks, "Comma-separated tasks: passkey, kv, mdqa, nll (default passkey)");
  e->add_option("--lengths", a.lengths, "Comma-separated prompt lengths in tokens")->required();
  e->add_option("--samples", a.samples, "Samples per task and length (default 20)")
      ->check(CLI::Range(1, 1000000));
  e->add_option(
       "--prune", a.prune,
       "Policies compared with the unpruned run: lazyllm, the paper's baselines static-paper and "
       "random-drop, the ablations frozen and random-layers (default lazyllm,static-paper,random-drop)")
      ->check(policy_names(true));
  e->add_option(
       "--schedule", a.schedules,
       std::string("A schedule (repeat for a curve; each policy runs those that fit it, else its own "
                   "four from mild to aggressive: ") +
           kDefaultLadder[0] + " ... " + kDefaultLadder[3] + "; static-paper " + kStaticPaperLadder[0] +
           " ... " + kStaticPaperLadder[3] + "; random-drop " + kRandomDropLadder[0] + " ... " +
           kRandomDropLadder[3] + ")")
      ->check(non_empty_schedule());
  e->add_option("--drop-seeds", a.drop_seeds,
                "random-drop: seeds per sample, averaged as the paper does (default 5)")
      ->check(CLI::Range(1, 1000));
  e->add_option(
       "--grid", a.grid,
       "single-layer: instead of --schedule, the LazyLLM paper's Figure 6 grid: one pruning layer after "
       "10, 30, 50, 70 or 90% of the depth, keeping 10, 30, 50, 70 or 90% of the tokens there (25 "
       "schedules; --prune defaults to lazyllm; with --out, one grid chart per task and length)")
      ->check(CLI::IsMember({"single-layer"}))
      ->excludes("--schedule");
  e->add_option("--seed", a.seed, "Seed of the samples and of the random policies (default 1)")
      ->check(digits_only());
  e->add_option("--threads", a.threads, "CPU threads (default: all)")->check(CLI::Range(1, 1024));
  e->add_option(
       "--agreement-tokens", a.agreement_tokens,
       "k: greedy tokens compared with the unpruned run, at most the 8 a QA task generates (default 8)")
      ->check(CLI::Range(1, 8));
  e->add_option("--corpus", a.corpus, "The text (default: the KJV extract scripts/setup installs)");
  e->add_option("--out", a.out, "Folder for eval.json and one speed-accuracy SVG per task and length");
  e->add_flag("--json", a.json_out, "Print the JSON instead of the table");
  e->add_flag("--prefix-cache", a.prefix_cache,
              "Instead: every question of each kv or mdqa text in turn, cold and with the prefix cache (the "
              "first question leaves the text's blocks), per method, none included; accuracy and TTFT of "
              "the second and later questions (docs/eval.md)");
  e->add_flag("--with-prompts", a.with_prompts,
              "Keep every sample's prompt text in the JSON (to rerun one with `run --prompt-file`)");
  return e;
}

// serve (cli/serve.cpp)
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
                "waits until its reservation fits (default: 1024 on the CPU; with --backend cuda what "
                "--gpu-memory-utilization leaves beside the weights and a prefill)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  s->add_option("--gpu-memory-utilization", a.gpu_memory_utilization,
                "With --backend cuda: the share of the GPU's memory the server may use, as vLLM's (default "
                "0.9, below 1); it must be free at start")
      ->check(CLI::Range(1e-3, 0.999));
  s->add_option("--max-model-len", a.max_model_len,
                "The most prompt + max_tokens a request may ask (default: the model's context; with "
                "--backend cuda at most what the GPU holds beside the weights for one request's prefill)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  s->add_flag(
      "--cuda-graphs", a.cuda_graphs,
      "With --backend cuda: capture each decoding step as CUDA graphs (a graph per stretch between the "
      "host's waits, updated in place step after step) instead of launching its kernels one by one");
  s->add_flag("--no-prefix-cache", a.no_prefix_cache,
              "Compute every prompt in full (by default a prompt reuses the K/V, and with LazyLLM the pruned "
              "state, of the longest prefix an earlier request left in the cache, inside the K/V budget)");
  s->add_option("--prefix-cache-mib", a.prefix_cache_mib,
                "Host memory the prefix cache may hold (default: on the CPU the K/V budget's room beside the "
                "reservations; with --backend cuda 4096, its budget being the GPU's)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
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

// sweep (cli/sweep.cpp)
CLI::App* add_sweep(CLI::App& app, SweepArgs& a) {
  auto* s = app.add_subcommand(
      "sweep",
      R"(Simulate a grid of hardware x models x schedules x prompt lengths, one JSON line per configuration.
  lazyprefill sweep --grid grid.json --out sweep.jsonl   # rerun to resume: rows already there are kept
  grid.json: {"lazyprefill_sweep": 1, "hardware": ["h100-sxm", "l4"], "models": ["llama-3.1-8b"],
              "methods": [{"policy": "none"}, {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3"}],
              "prompt_lengths": [1024, 4096, 16384]})");
  s->add_option("--grid", a.grid, "The grid (JSON, see above and docs/simulator.md)")->required();
  s->add_option("--out", a.out, "JSON Lines output; configurations already in it are skipped")->required();
  s->add_option("--threads", a.threads, "Threads (default: all this process may use)")
      ->check(CLI::Range(1, 1024));
  return s;
}

}  // namespace lp::cli
