// The options of calibrate, calibrate-revivals, calibrate-serving and validate: each subcommand's add_X,
// registering them into its XArgs (cli/options.h says why they live apart from the subcommands' own units).
#include <fmt/format.h>

#include <string>

#include "cli/options.h"

namespace lp::cli {

// calibrate (cli/calibrate.cpp)
CLI::App* add_calibrate(CLI::App& app, CalibrateArgs& a) {
  auto* c = app.add_subcommand(
      "calibrate",
      R"(Fit a hardware profile's efficiencies to measurements: per-op timings of our own runs (--runs), or
end-to-end TTFT and decode figures from llama-bench, vLLM, trtllm-bench, run --json or a CSV (--measurements).
  lazyprefill calibrate --runs runs/ --base cpu-local --out cpu-local.json
  lazyprefill calibrate --measurements bench.jsonl results.csv --base h100-sxm --out h100-mine.json)");
  auto* runs = c->add_option("--runs", a.runs, "Folder of run --json outputs (*.json): fits every op family");
  auto* meas =
      c->add_option("--measurements", a.measurements,
                    "Measurement files (llama-bench -o json/jsonl, vLLM serving/latency JSON, trtllm-bench "
                    "--report_json, run --json, plain CSV): fits what end-to-end figures identify");
  runs->excludes(meas);
  c->add_option("--base", a.base, "Profile to start from (name or .json); its other fields are kept")
      ->required();
  c->add_option("--out", a.out, "Where to write the fitted profile (.json)")->required();
  c->add_option("--name", a.name, "Name of the fitted profile (default: the base's name)");
  c->add_option("--model-map", a.model_map,
                "NAME=PRESET: the preset for a model name as the files write it (repeatable)")
      ->needs(meas);
  c->add_option("--hw-map", a.hw_map,
                "NAME=PROFILE: the profile for a hardware name as the files write it (repeatable)")
      ->needs(meas);
  c->add_option("--fit", a.fit,
                "Parameters to fit, comma-separated, from gemm.compute, overhead_us, attention.compute, "
                "gemm.half_rows, "
                "gemm.memory, interconnect, pruning.stage_us (default: every one the measurements identify)")
      ->delimiter(',')
      ->needs(meas);
  c->add_option("--weights", a.weights, "Weight dtype for every measurement (default: from each one's dtype)")
      ->needs(meas);
  c->add_option("--compute", a.compute,
                "Compute dtype for every measurement (default: from each one's dtype)")
      ->needs(meas);
  c->add_option("--kv", a.kv, "KV dtype for every measurement (default: from each one's dtype)")->needs(meas);
  c->add_option("--engine", a.engine, kEngineHelp)->needs(meas);
  c->add_flag("--json", a.json_out, "Print the fit report as JSON");
  return c;
}

// calibrate-revivals (cli/calibrate_revivals.cpp)
CLI::App* add_calibrate_revivals(CLI::App& app, CalibrateRevivalsArgs& a) {
  auto* c = app.add_subcommand(
      "calibrate-revivals",
      R"(Fit the revival model (the share of each pruning stage's tokens revived per decoding step) to
recorded LazyLLM traces; with --held-out, compare synthetic decoding with it to replaying other runs.
  lazyprefill calibrate-revivals a.jsonl b.jsonl --out revivals.json
  lazyprefill calibrate-revivals a.jsonl b.jsonl --held-out c.jsonl --hw cpu-local)");
  c->add_option("traces", a.traces, "Traces of run --prune lazyllm --trace to fit, decoding steps included");
  c->add_option("--held-out", a.held_out, "Traces not fitted on: replay them and the model's prediction");
  c->add_option("--revival-model", a.model,
                "With --held-out: judge this model file (or 'builtin') instead of fitting one");
  c->add_option("--hw", a.hw, "Profile the held-out comparison is costed on (default cpu-local)");
  add_precision(*c, a.precision, " of the comparison");
  c->add_flag("--map", a.map,
              "Allow a --revival-model fitted on another layer count (stages by relative depth)");
  c->add_option("--out", a.out, "Write the fitted model here (JSON)");
  c->add_flag("--json", a.json_out, "Print one JSON object");
  return c;
}

// calibrate-serving (cli/calibrate_serving.cpp)
CLI::App* add_calibrate_serving(CLI::App& app, CalibrateServingArgs& a) {
  auto* s = app.add_subcommand(
      "calibrate-serving",
      R"(Fit an engine's scheduler to your own serving benchmarks; errors per metric before, after and held out.
  lazyprefill calibrate-serving --benchmark vllm-rate4.json --benchmark vllm-rate8.json --model-config llama-3.1-8b --hw h100-sxm --engine vllm
  lazyprefill calibrate-serving --benchmark benchmarks.json --model model.gguf --hw cpu-local --kv-budget-mib 2048 --out fitted.json)");
  s->add_option(
       "--benchmark", a.benchmarks,
       "A serving benchmark result: vllm bench serve --save-result JSON, a guidellm report, AIPerf's "
       "profile_export_aiperf.json or genai-perf's *_genai_perf.json (repeatable)")
      ->required()
      ->check(non_empty_path());
  add_model_choice(*s, a.model, a.model_config, "cost");
  s->add_option("--hw", a.hw, "Hardware profile of the server (built-in name or file)")->required();
  s->add_option("--engine", a.engine, "The server's engine (lazyprefill, llamacpp, vllm, sglang, trtllm)");
  add_precision(*s, a.precision);
  add_scheduler_options(*s, a.sched);
  // Ranges checked by calib::calibrate_serving (the Python module's words too).
  s->add_option("--tp", a.tp, "Tensor-parallel degree of the server (default 1)");
  s->add_option("--kv-budget-mib", a.kv_budget_mib,
                "The server's K/V budget (default: --kv-fraction of the memory less the weights)");
  s->add_option("--kv-fraction", a.kv_fraction,
                "Share of the memory the server may use, weights and K/V (default 0.9, vLLM's "
                "gpu_memory_utilization)");
  s->add_option("--kv-element-bytes", a.kv_element_bytes,
                "Bytes of a K/V element (default: the --kv dtype's)");
  s->add_option("--fit", a.fit,
                "What to fit, comma-separated: scale (the engine's kernel time against the profile), "
                "iteration (host time per iteration), request (host time per request an iteration schedules: "
                "sampling, detokenising, streaming) (default scale,iteration)");
  s->add_option("--seed", a.seed, "Seed of the simulated arrivals (default 0)")->check(digits_only());
  s->add_option("--out", a.out, "Write the profile with the fitted engine (atomically)")
      ->check(non_empty_path());
  s->add_flag("--json", a.json_out, "Print one JSON object");
  return s;
}

// validate (cli/validate.cpp)
CLI::App* add_validate(CLI::App& app, ValidateArgs& a) {
  auto* v = app.add_subcommand(
      "validate",
      R"(Measure the engine here over prompt lengths x schedules, calibrate on half, predict the other half.
  lazyprefill validate --quick
  lazyprefill validate --json --out-dir runs/   # also keeps every run's JSON for calibrate)");
  v->add_flag("--quick", a.quick,
              "Prompts of 256-2048 tokens instead of 256-8192 (under 5 minutes on 2 cores)");
  v->add_option("--lengths", a.lengths,
                "Prompt lengths of the grid instead of --quick's, comma-separated, at least two and "
                "within the model's context (e.g. 128,256,512,1024)")
      ->excludes("--quick");
  add_gguf_model(*v, a.model);
  v->add_option("--base", a.base, "Profile to calibrate (default cpu-local)");
  v->add_option("--threads", a.threads, "CPU threads (default: all this process may use)")
      ->check(CLI::Range(1, 1024));
  v->add_option(
       "--rounds", a.rounds,
       "Rounds over all cases, the fastest run of each case kept (default 3; more on a busy machine)")
      ->check(CLI::Range(1, 20));
  v->add_option("--dtype", a.dtype,
                "Engine dtype: f32 (default) or int8 (weights in the file's blocks, integer GEMMs; the "
                "simulator then prices GEMMs at the profile's int8 peak and the weights at the file's "
                "bits per weight)")
      ->check(CLI::IsMember({"f32", "int8"}));
  v->add_option("--out-dir", a.out_dir, "Also write each run's run --json output here");
  v->add_option("--serving", a.serving,
                "Validate the serving simulation instead, against a measured load test: a folder with "
                "bench/serve_load.py's serve_load_summary.json and the server's requests_none.jsonl and "
                "requests_lazyllm.jsonl (tests/fixtures/serving)")
      ->check(CLI::ExistingDirectory);
  v->add_option(
       "--runahead", a.runahead,
       "Validate the KV-Runahead simulation instead, against measured runs: a folder of `mpirun -n P "
       "run --runahead --json` outputs and single-process `run --json` outputs to calibrate on "
       "(tests/fixtures/runahead; bench/runahead_ttft.sh with KEEP=DIR makes one)")
      ->check(CLI::ExistingDirectory)
      ->excludes("--serving");
  v->add_option("--model-config", a.model_config,
                "With --serving: the model preset the logs ran (default smollm2-135m)");
  auto* rm = v->add_option("--revival-model", a.revival_model,
                           "With --serving: LazyLLM's revivals from this revival model (calibrate-revivals; "
                           "default DIR/revivals.json where it exists: tests/fixtures/serving/revivals.json "
                           "is fitted on traces of the load test's own prompts)")
                 ->check(CLI::ExistingFile);
  v->add_option(
       "--prefix-load", a.prefix_load,
       "With --serving: also replay a load test of the prefix cache (bench/serve_load.py --shared-prefix; "
       "tests/fixtures/serving-prefix) on the calibration of --serving's, every request with the "
       "cached tokens its log says it found")
      ->check(CLI::ExistingDirectory)
      ->needs("--serving");
  v->add_flag("--revival-share-from-log", a.revival_share_from_log,
              "With --serving: LazyLLM's revivals as one constant share per stage and step, the one that "
              "gives the revivals the log counted, instead of a revival model")
      ->excludes(rm);
  v->add_option(
      "--profile-out", a.profile_out,
      "With --serving or --runahead: also write the profile it fitted (a hardware profile .json, for "
      "simulate --hw FILE)");
  v->add_flag("--json", a.json_out, "Print one JSON object");
  return v;
}

}  // namespace lp::cli
