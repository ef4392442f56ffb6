// The server's Prometheus metrics (GET /metrics, text format 0.0.4), kept in a prometheus-cpp
// registry. Names follow Prometheus's conventions (base units: seconds, bytes; counters end in
// _total) and, where a vLLM metric means the same, its meaning: deployers' dashboards carry over.
// Every member may be called from any thread (prometheus-cpp's metrics are thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/scheduler.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace lp::server {

// Which names /metrics shows: this server's (lazyprefill_*), vLLM's (vllm:*, the names and
// buckets of vLLM's own exposition with its model_name and engine labels, so a Grafana board, an
// autoscaler or a router built for vLLM reads this server unchanged), or both (the default).
struct MetricsOptions {
  std::string model_name;
  int64_t max_model_len = 4096;  // the token-count histograms' last bucket (vLLM's 1-2-5 series)
  bool lazyprefill_names = true, vllm_names = true;
};

class Metrics {
 public:
  explicit Metrics(MetricsOptions o = {});
  ~Metrics();

  // A request refused before it reached the scheduler (its HTTP status: 400, 404, 413, 429, ...).
  void rejected(int status);
  // A request the scheduler finished, and its record; `n_layer` turns its computed share into
  // (token, layer) pairs.
  void finished(const RequestRecord& r, int n_layer);
  // The time between two tokens of one request (seconds).
  void inter_token(double seconds);
  // The scheduler's state after an iteration (call on its thread).
  void engine_state(const Scheduler& s);
  // CPU seconds the network thread has used (HTTP, JSON, text), for the overhead figure.
  void set_server_cpu_seconds(double s);

  std::string text() const;  // the exposition

 private:
  struct Vllm;  // the vllm:* families (metrics.cpp)
  MetricsOptions o_;
  std::unique_ptr<Vllm> vllm_;
  std::shared_ptr<prometheus::Registry> reg_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Counter *prompt_tokens_, *generated_tokens_, *revivals_, *pairs_, *pairs_computed_;
  prometheus::Gauge *queued_, *running_, *kv_in_use_, *kv_reserved_, *kv_budget_, *aux_, *iterations_, *busy_,
      *server_cpu_;
  prometheus::Histogram *ttft_, *itl_, *e2e_, *queue_, *computed_share_;
  prometheus::Gauge *cache_bytes_, *cache_blocks_;
  prometheus::Counter *cache_queries_, *cache_hits_, *cache_evictions_;
  PrefixIndex::Counters cache_seen_;  // the scheduler's counters at the last engine_state
};

}  // namespace lp::server
