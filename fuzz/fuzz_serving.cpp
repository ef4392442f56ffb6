// Serving request files: `simulate-serving --arrival-file` (a `serve --log-requests` log or a CSV,
// told apart by content), `--prompt-tokens file:` / `--output-tokens file:` (one length a line,
// or a column of either request file) and the logs `validate --serving` reads. What was read is
// then served: a short LazyLLM simulation of the first 16 requests (SmolLM2-135M on cpu-local,
// its 8,192-token context bounding each request's decoding), so arrival times and lengths that
// parse must also simulate, or be refused with one line, under this engine's scheduler and under a
// production engine's (K/V on demand with preemption, unmixed iterations, closed-loop clients).
#include <algorithm>

#include "fuzz/fuzz_util.h"
#include "hwmodels/profile.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/deployment.h"
#include "sim/revival.h"
#include "sim/serving_metrics.h"

namespace {

struct Setup {
  lp::ModelConfig c = lp::preset_config("smollm2-135m");
  lp::hw::Profile hw = lp::hw::load_profile("cpu-local");
  lp::sim::ServingMethod m;
  lp::sim::ServingConfig cfg;
  // A production engine's scheduler over the same requests: K/V on demand in 16-token blocks with
  // preemption (a budget of about 11,000 tokens, so long requests preempt), chunked, unmixed
  // iterations, three closed-loop clients.
  lp::sim::ServingConfig engine;
  Setup() {
    const lp::Method lazyllm{lp::PolicyKind::LazyLLM, lp::default_schedule()};
    m = lp::sim::serving_method(
        lazyllm, c,
        lp::sim::revival_shares(lp::sim::load_revival_model(""), c.n_layer,
                                lp::resolve_schedule(lazyllm.schedule, c.n_layer, c.global_layers()), true));
    cfg.kv_budget_bytes = 2048.0 * (1 << 20);
    cfg.max_batch_tokens = 2048;
    engine = cfg;
    engine.kv_budget_bytes = 256.0 * (1 << 20);
    engine.kv_mode = lp::hw::Scheduling::Kv::OnDemand;
    engine.kv_block = 16;
    engine.chunk_tokens = 512;
    engine.mixed = false;
    engine.clients = 3;
    engine.request_overhead_s = 1e-4;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Setup s;
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] {
    std::vector<lp::sim::ServingRequest> reqs = lp::sim::read_requests(path);
    reqs.resize(std::min<size_t>(reqs.size(), 16));
    const lp::sim::ServingRun run = lp::sim::simulate_serving(s.c, s.hw, {}, s.m, s.cfg, reqs);
    (void)lp::sim::serving_metrics(run, {});
    const lp::sim::ServingRun other = lp::sim::simulate_serving(s.c, s.hw, {}, s.m, s.engine, reqs);
    if (other.kv_reserved_peak > s.engine.kv_budget_bytes) __builtin_trap();  // K/V held past the budget
    (void)lp::sim::serving_metrics(other, {});
    // Two replicas behind the least-outstanding router, and one prefill and one decode instance.
    lp::sim::Deployment d;
    d.serve = {s.hw, s.cfg, 2};
    d.router = lp::sim::Router::LeastOutstanding;
    (void)lp::sim::simulate_deployment(s.c, {}, s.m, d, reqs);
    d.serve.replicas = 1;
    d.decode = lp::sim::Pool{s.hw, s.engine, 1};
    d.decode->cfg.clients = 0;
    (void)lp::sim::simulate_deployment(s.c, {}, s.m, d, reqs);
  });
  lp::fuzz::refuses_cleanly([&] { (void)lp::sim::read_request_log(path); });
  for (const char* column : {"prompt_tokens", "output_tokens"})
    lp::fuzz::refuses_cleanly([&] {
      const auto d = lp::sim::LengthDist::parse("file:" + path, "--prompt-tokens", column);
      (void)lp::sim::make_workload(8, {1.0, 1.0}, d, d, 1);
    });
  return 0;
}
