#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <iterator>
#include <string>
#include <vector>

namespace lp::server {

namespace {

double seconds(RequestRecord::Time a, RequestRecord::Time b) {
  return std::chrono::duration<double>(b - a).count();
}

prometheus::Gauge& gauge(prometheus::Registry& reg, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(reg).Add({});
}

prometheus::Counter& counter(prometheus::Registry& reg, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(reg).Add({});
}

prometheus::Histogram& histogram(prometheus::Registry& reg, const char* name, const char* help,
                                 prometheus::Histogram::BucketBoundaries b) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(reg).Add({}, std::move(b));
}

}  // namespace

// vLLM's names (vllm/v1/metrics/loggers.py: PrometheusStatLogger), with its buckets and its labels
// model_name and engine ("0": one engine), for what this server measures alike. Not here: what it
// has no counterpart of yet (speculative decoding, LoRA); preemptions are exposed at 0 (the
// scheduler reserves instead of preempting).
struct Metrics::Vllm {
  std::shared_ptr<prometheus::Registry> reg = std::make_shared<prometheus::Registry>();
  prometheus::Labels labels;
  prometheus::Gauge *running, *waiting, *kv_usage;
  prometheus::Counter *prompt, *generation, *preemptions, *cache_queries, *cache_hits;
  prometheus::Family<prometheus::Counter>* success;
  prometheus::Histogram *ttft, *itl, *tpot, *e2e, *queue, *prompt_tokens, *generation_tokens;

  static prometheus::Histogram::BucketBoundaries one_two_five(double max) {
    prometheus::Histogram::BucketBoundaries b;  // vLLM's build_1_2_5_buckets(max_model_len)
    for (double e = 1; e <= max; e *= 10)
      for (double m : {1.0, 2.0, 5.0})
        if (m * e <= max) b.push_back(m * e);
    return b;
  }

  Vllm(const std::string& model_name, double max_model_len)
      : labels{{"engine", "0"}, {"model_name", model_name}} {
    auto& r = *reg;
    const auto g = [&](const char* n, const char* h) -> prometheus::Gauge& {
      return prometheus::BuildGauge().Name(n).Help(h).Register(r).Add(labels);
    };
    const auto c = [&](const char* n, const char* h) -> prometheus::Counter& {
      return prometheus::BuildCounter().Name(n).Help(h).Register(r).Add(labels);
    };
    const auto hist = [&](const char* n, const char* h,
                          prometheus::Histogram::BucketBoundaries b) -> prometheus::Histogram& {
      return prometheus::BuildHistogram().Name(n).Help(h).Register(r).Add(labels, b);
    };
    running = &g("vllm:num_requests_running", "Number of requests in model execution batches.");
    waiting = &g("vllm:num_requests_waiting", "Number of requests waiting to be processed.");
    kv_usage = &g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
    prompt = &c("vllm:prompt_tokens_total", "Number of prefill tokens processed.");
    generation = &c("vllm:generation_tokens_total", "Number of generation tokens processed.");
    preemptions = &c("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.");
    cache_queries =
        &c("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.");
    cache_hits =
        &c("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.");
    success = &prometheus::BuildCounter()
                   .Name("vllm:request_success_total")
                   .Help("Count of successfully processed requests.")
                   .Register(r);
    const prometheus::Histogram::BucketBoundaries tpot_b{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                         0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                         7.5,  10.0,  20.0, 40.0,  80.0};
    const prometheus::Histogram::BucketBoundaries request_b{0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                                            5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                                            60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
    ttft = &hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                 {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                  1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0});
    itl = &hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tpot_b);
    tpot = &hist(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds. DEPRECATED: Use vllm:inter_token_latency_seconds "
        "instead.",
        tpot_b);
    e2e =
        &hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", request_b);
    queue = &hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                  request_b);
    prompt_tokens = &hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                          one_two_five(max_model_len));
    generation_tokens = &hist("vllm:request_generation_tokens", "Number of generation tokens processed.",
                              one_two_five(max_model_len));
  }
};

Metrics::Metrics(MetricsOptions o) : o_(std::move(o)), reg_(std::make_shared<prometheus::Registry>()) {
  if (o_.vllm_names) vllm_ = std::make_unique<Vllm>(o_.model_name, double(o_.max_model_len));
  auto& r = *reg_;
  requests_ = &prometheus::BuildCounter()
                   .Name("lazyprefill_requests_total")
                   .Help(
                       "Requests by outcome: length, stop, cancelled, error (the scheduler's), or the HTTP "
                       "status of a request refused before it was queued")
                   .Register(r);
  prompt_tokens_ = &counter(r, "lazyprefill_prompt_tokens_total", "Prompt tokens of finished requests");
  generated_tokens_ = &counter(r, "lazyprefill_generation_tokens_total", "Tokens generated");
  revivals_ = &counter(r, "lazyprefill_revivals_total",
                       "Pruned (token, layer) states revived from the Aux Cache during decoding");
  pairs_ = &counter(r, "lazyprefill_prompt_token_layers_total",
                    "Prompt (token, layer) pairs of finished requests' prefills");
  pairs_computed_ =
      &counter(r, "lazyprefill_prompt_token_layers_computed_total",
               "Of those, the pairs computed (the rest pruned); the ratio is the share computed");
  queued_ = &gauge(r, "lazyprefill_requests_waiting", "Requests queued for admission");
  running_ = &gauge(r, "lazyprefill_requests_running", "Requests admitted (prefilling or decoding)");
  kv_in_use_ = &gauge(r, "lazyprefill_kv_cache_bytes_in_use", "K/V bytes holding tokens now");
  kv_reserved_ = &gauge(r, "lazyprefill_kv_cache_bytes_reserved",
                        "K/V bytes reserved by running requests (prompt + max_tokens, and the Aux Cache)");
  kv_budget_ = &gauge(r, "lazyprefill_kv_cache_budget_bytes", "The K/V budget (--kv-budget-mib)");
  aux_ = &gauge(r, "lazyprefill_aux_cache_bytes", "Aux Cache bytes held by running requests");
  iterations_ = &gauge(r, "lazyprefill_iterations", "Scheduler iterations run");
  busy_ = &gauge(r, "lazyprefill_engine_busy_seconds", "Seconds the engine spent in iterations");
  server_cpu_ = &gauge(r, "lazyprefill_server_cpu_seconds",
                       "CPU seconds of the network thread (HTTP, JSON, text): the server's own overhead");
  const prometheus::Histogram::BucketBoundaries latency{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                                        0.08,  0.1,    0.25,  0.5,  0.75, 1,    2.5,
                                                        5,     7.5,    10,    20,   40,   80};
  ttft_ = &histogram(r, "lazyprefill_time_to_first_token_seconds",
                     "Arrival to first token (queue wait included)", latency);
  itl_ = &histogram(r, "lazyprefill_inter_token_latency_seconds", "Time between two tokens of a request",
                    latency);
  e2e_ = &histogram(r, "lazyprefill_e2e_request_latency_seconds", "Arrival to finish", latency);
  queue_ = &histogram(r, "lazyprefill_request_queue_seconds", "Arrival to admission", latency);
  cache_bytes_ =
      &gauge(r, "lazyprefill_prefix_cache_bytes",
             "Bytes the prefix cache holds (inside the K/V budget, evicted when requests need them)");
  cache_blocks_ = &gauge(r, "lazyprefill_prefix_cache_blocks", "Blocks the prefix cache holds");
  cache_queries_ = &counter(r, "lazyprefill_prefix_cache_queried_tokens_total",
                            "Prompt tokens looked up in the prefix cache");
  cache_hits_ = &counter(r, "lazyprefill_prefix_cache_hit_tokens_total",
                         "Of those, the tokens found (copied, not computed)");
  cache_evictions_ = &counter(r, "lazyprefill_prefix_cache_evicted_blocks_total",
                              "Blocks evicted from the prefix cache to make room");
  computed_share_ = &histogram(r, "lazyprefill_prompt_computed_share",
                               "Per request: the share of its prompt's (token, layer) pairs computed",
                               {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1});
}

Metrics::~Metrics() = default;

void Metrics::rejected(int status) {
  requests_->Add({{"outcome", std::to_string(status)}}).Increment();
}

void Metrics::finished(const RequestRecord& r, int n_layer) {
  if (vllm_) {
    Vllm& v = *vllm_;
    v.prompt->Increment(double(r.prompt_tokens));
    v.generation->Increment(double(r.output_tokens));
    // vLLM's finished_reason: stop, length, abort (a cancelled request), error.
    const char* reason = r.finish == Finish::Stop     ? "stop"
                         : r.finish == Finish::Length ? "length"
                         : r.finish == Finish::Error  ? "error"
                                                      : "abort";
    prometheus::Labels l = v.labels;
    l["finished_reason"] = reason;
    v.success->Add(l).Increment();
    v.queue->Observe(seconds(r.arrival, r.admitted));
    v.prompt_tokens->Observe(double(r.prompt_tokens));
    v.generation_tokens->Observe(double(r.output_tokens));
    if (r.finish != Finish::Error && r.output_tokens > 0) {
      v.ttft->Observe(seconds(r.arrival, r.first_token));
      v.e2e->Observe(seconds(r.arrival, r.finished));
    }
  }
  requests_->Add({{"outcome", finish_name(r.finish)}}).Increment();
  prompt_tokens_->Increment(double(r.prompt_tokens));
  generated_tokens_->Increment(double(r.output_tokens));
  revivals_->Increment(double(r.revivals));
  queue_->Observe(seconds(r.arrival, r.admitted));
  if (r.finish == Finish::Error || r.output_tokens == 0) return;  // no prefill ran to completion
  const double pairs = double(r.prompt_tokens) * n_layer;
  pairs_->Increment(pairs);
  pairs_computed_->Increment(pairs * r.prompt_tokens_computed_fraction);
  computed_share_->Observe(r.prompt_tokens_computed_fraction);
  ttft_->Observe(seconds(r.arrival, r.first_token));
  e2e_->Observe(seconds(r.arrival, r.finished));
}

void Metrics::inter_token(double s) {
  itl_->Observe(s);
  if (vllm_) vllm_->itl->Observe(s), vllm_->tpot->Observe(s);
}

void Metrics::engine_state(const Scheduler& s) {
  if (vllm_) {
    vllm_->running->Set(double(s.running()));
    vllm_->waiting->Set(double(s.queued()));
    // vLLM's: the share of the cache's blocks allocated; here the share of the budget's bytes holding
    // tokens (K/V and the Aux Cache).
    vllm_->kv_usage->Set(s.budget_bytes() > 0 ? double(s.kv_bytes_in_use()) / double(s.budget_bytes()) : 0.0);
  }
  // The scheduler's cache counters are cumulative; each is added here by what it grew since.
  const PrefixIndex::Counters c = s.prefix_cache_counters();
  const double dq = double(c.queries - cache_seen_.queries), dh = double(c.hits - cache_seen_.hits),
               de = double(c.evictions - cache_seen_.evictions);
  cache_seen_ = c;
  if (vllm_) {
    vllm_->cache_queries->Increment(dq);
    vllm_->cache_hits->Increment(dh);
  }
  cache_queries_->Increment(dq);
  cache_hits_->Increment(dh);
  cache_evictions_->Increment(de);
  cache_bytes_->Set(double(s.prefix_cache_bytes()));
  cache_blocks_->Set(double(s.prefix_cache_blocks()));
  queued_->Set(double(s.queued()));
  running_->Set(double(s.running()));
  kv_in_use_->Set(double(s.kv_bytes_in_use()));
  kv_reserved_->Set(double(s.kv_bytes_reserved()));
  kv_budget_->Set(double(s.budget_bytes()));
  aux_->Set(double(s.aux_cache_bytes()));
  iterations_->Set(double(s.iterations()));
  busy_->Set(s.busy_seconds());
}

void Metrics::set_server_cpu_seconds(double s) {
  server_cpu_->Set(s);
}

std::string Metrics::text() const {
  std::vector<prometheus::MetricFamily> families;
  if (o_.lazyprefill_names) families = reg_->Collect();
  if (vllm_) {
    std::vector<prometheus::MetricFamily> v = vllm_->reg->Collect();
    families.insert(families.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace lp::server
