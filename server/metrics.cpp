#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <string>

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

Metrics::Metrics() : reg_(std::make_shared<prometheus::Registry>()) {
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
  computed_share_ = &histogram(r, "lazyprefill_prompt_computed_share",
                               "Per request: the share of its prompt's (token, layer) pairs computed",
                               {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1});
}

Metrics::~Metrics() = default;

void Metrics::rejected(int status) {
  requests_->Add({{"outcome", std::to_string(status)}}).Increment();
}

void Metrics::finished(const RequestRecord& r, int n_layer) {
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
}

void Metrics::engine_state(const Scheduler& s) {
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
  return prometheus::TextSerializer().Serialize(reg_->Collect());
}

}  // namespace lp::server
