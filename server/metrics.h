// The server's Prometheus metrics (GET /metrics, text format 0.0.4), kept in a prometheus-cpp
// registry. Names follow Prometheus's conventions (base units: seconds, bytes; counters end in
// _total) and, where a vLLM metric means the same, its meaning: deployers' dashboards carry over.
// Every member may be called from any thread (prometheus-cpp's metrics are thread-safe).
#pragma once

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

class Metrics {
 public:
  Metrics();
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
  std::shared_ptr<prometheus::Registry> reg_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Counter *prompt_tokens_, *generated_tokens_, *revivals_, *pairs_, *pairs_computed_;
  prometheus::Gauge *queued_, *running_, *kv_in_use_, *kv_reserved_, *kv_budget_, *aux_, *iterations_, *busy_,
      *server_cpu_;
  prometheus::Histogram *ttft_, *itl_, *e2e_, *queue_, *computed_share_;
};

}  // namespace lp::server
