#include "sim/deployment.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <queue>

#include "model/error.h"
#include "pruning/policy.h"
#include "sim/serving_loop.h"

namespace lp::sim {

Router parse_router(const std::string& name) {
  if (name == "round-robin") return Router::RoundRobin;
  if (name == "least-outstanding") return Router::LeastOutstanding;
  if (name == "prefix") return Router::Prefix;
  usage_fail("unknown router '{}' (known: round-robin, least-outstanding, prefix)", name);
}

const char* router_name(Router r) {
  switch (r) {
    case Router::RoundRobin:
      return "round-robin";
    case Router::LeastOutstanding:
      return "least-outstanding";
    case Router::Prefix:
      break;
  }
  return "prefix";
}

namespace {

using detail::EventLoop;

// A pool's engines over one request list, and the router's view of them: each engine's requests
// sent and the times its requests finished (in order: an engine's clock only moves on).
class PoolRun {
 public:
  PoolRun(const ModelConfig& c, const Precision& p, const ServingMethod& m, const Pool& pool,
          std::span<const ServingRequest> reqs, Router router)
      : router_(router),
        stages_(size_t(std::max(pool.cfg.pipeline.stages, 1))),
        sent_(size_t(pool.replicas) * stages_, 0),
        finishes_(size_t(pool.replicas) * stages_),
        route_(reqs.size(), 0) {
    // A replica of pipeline stages is that many virtual engines (as simulate_serving runs one),
    // each an engine the router sees.
    for (size_t k = 0; k < size_t(pool.replicas) * stages_; ++k) {
      loops_.push_back(std::make_unique<EventLoop>(c, pool.hw, p, m, pool.cfg, reqs));
      ptrs_.push_back(loops_.back().get());
    }
  }

  void drive(std::span<const ServingRequest> reqs, int64_t clients) {
    detail::drive(
        ptrs_, reqs, clients, [this](size_t idx, double t) { return pick(idx, t); },
        [this](size_t idx) {
          const size_t k = route_[idx];
          finishes_[k].push_back(loops_[k]->now());
        });
  }

  // Request idx sent at t to the engine the router picks.
  void send(size_t idx, double t) { loops_[pick(idx, t)]->arrive(idx, t); }
  // The busy engine furthest behind: its index and clock (none: SIZE_MAX, infinity).
  std::pair<size_t, double> furthest_behind() const {
    const EventLoop* first = detail::furthest_behind(ptrs_);
    if (!first) return {SIZE_MAX, HUGE_VAL};
    return {size_t(std::find(ptrs_.begin(), ptrs_.end(), first) - ptrs_.begin()), first->now()};
  }
  // One iteration of engine k: the requests that finished in it, and when it ended.
  std::pair<std::vector<size_t>, double> step(size_t k) {
    std::vector<size_t> done = loops_[k]->step();
    const double t = loops_[k]->now();
    for (size_t i = 0; i < done.size(); ++i) finishes_[k].push_back(t);
    return {std::move(done), t};
  }
  // Request idx as its engine has served it so far.
  const RequestOutcome& live(size_t idx) const { return loops_[route_[idx]]->outcome(idx); }

  // The outcome of request idx, from the engine that served it, with that engine's replica.
  RequestOutcome outcome(size_t idx) const {
    RequestOutcome o = runs_[route_[idx]].requests[idx];
    o.replica = int(route_[idx] / stages_);
    return o;
  }
  // Every engine's run, once driven.
  void collect() {
    for (auto& l : loops_) runs_.push_back(l->result());
  }
  // The pool's iterations and K/V over its engines (utilisation: the mean over engines).
  void add_totals(ServingRun& out) const {
    for (const ServingRun& r : runs_) {
      out.iterations += r.iterations;
      out.end_s = std::max(out.end_s, r.end_s);
      out.kv_capacity += r.kv_capacity;
      out.kv_reserved_mean += r.kv_reserved_mean;
      out.kv_reserved_peak += r.kv_reserved_peak;
      out.preemptions += r.preemptions;
    }
  }

 private:
  Router router_;
  size_t stages_;  // virtual engines a replica
  std::vector<std::unique_ptr<EventLoop>> loops_;
  std::vector<EventLoop*> ptrs_;
  std::vector<int64_t> sent_;
  std::vector<std::vector<double>> finishes_;
  std::vector<size_t> route_;
  std::vector<ServingRun> runs_;
  size_t turn_ = 0;

  // Engine k's requests sent and not finished at t (its finishes after t still count: the engine
  // may have run past t).
  int64_t outstanding(size_t k, double t) const {
    const auto& f = finishes_[k];
    return sent_[k] - int64_t(std::upper_bound(f.begin(), f.end(), t) - f.begin());
  }
  size_t pick(size_t idx, double t) {
    const size_t R = loops_.size();
    size_t best = 0;
    if (router_ == Router::RoundRobin) {
      best = turn_++ % R;
    } else {
      int64_t best_prefix = -1, best_load = 0;
      for (size_t k = 0; k < R; ++k) {
        const int64_t prefix = router_ == Router::Prefix ? loops_[k]->cached_prefix(idx) : 0;
        const int64_t load = outstanding(k, t);
        if (prefix > best_prefix || (prefix == best_prefix && load < best_load))
          best = k, best_prefix = prefix, best_load = load;
      }
    }
    ++sent_[best];
    route_[idx] = best;
    return best;
  }
};

void check_pool(const ModelConfig& c, const Pool& pool, const char* what) {
  if (pool.replicas < 1) fail("the {} pool needs at least one engine, got {}", what, pool.replicas);
  if (c.dp > 1) usage_fail("replicas and disaggregation take engines without data-parallel attention");
}

// Aggregated: every request whole on the replica the router picks.
ServingRun aggregated(const ModelConfig& c, const Precision& p, const ServingMethod& m, const Deployment& d,
                      std::span<const ServingRequest> reqs) {
  PoolRun pool(c, p, m, d.serve, reqs, d.router);
  pool.drive(reqs, d.serve.cfg.clients);
  pool.collect();
  ServingRun out;
  out.requests.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) out.requests[i] = pool.outcome(i);
  pool.add_totals(out);
  return out;
}

// Disaggregated: prefilled in one pool (output 1), handed over, decoded in the other. Both pools
// step together in time order, with three kinds of event: a request sent (at its arrival or, with
// clients, as one is free), a prefill's K/V reaching the decode pool (its first token plus the
// hand-over), and an engine's iteration (the busy engine furthest behind, before the next of the
// others); a client is free again when its request's last token is out (in the decode pool, or the
// prefill's for a one-token output).
ServingRun disaggregated(const ModelConfig& c, const Precision& p, const ServingMethod& m,
                         const Deployment& d, std::span<const ServingRequest> reqs) {
  if (!(d.link_bytes_per_s > 0) || !(d.link_latency_s >= 0))
    usage_fail("the K/V hand-over link needs a positive bandwidth and a latency of at least 0");
  const int64_t clients = d.serve.cfg.clients;
  std::vector<ServingRequest> prefill(reqs.begin(), reqs.end()), decode(reqs.begin(), reqs.end());
  for (ServingRequest& r : prefill) r.output_tokens = 1;
  for (ServingRequest& r : decode) {  // sent as their hand-overs arrive, in that order
    r.arrival_s = 0, r.prefilled = true;
    r.shared_group = -1, r.cached_tokens = -1;
  }
  Pool prefill_pool = d.serve, decode_pool = *d.decode;
  prefill_pool.cfg.clients = decode_pool.cfg.clients = 0;  // the clients are the deployment's
  PoolRun pre(c, p, m, prefill_pool, prefill, d.router);
  PoolRun dec(c, p, m, decode_pool, decode, d.router == Router::Prefix ? Router::LeastOutstanding : d.router);
  std::vector<double> transfer(reqs.size(), 0.0);
  std::vector<char> handed(reqs.size(), 0);
  using Event = std::pair<double, size_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> handovers;
  detail::Clients senders(clients);
  size_t next = 0;
  for (;;) {
    const double send = next < reqs.size() ? senders.send_time(reqs[next]) : HUGE_VAL;
    const double hand = handovers.empty() ? HUGE_VAL : handovers.top().first;
    const double event = std::min(send, hand);
    const auto [kp, tp] = pre.furthest_behind();
    const auto [kd, td] = dec.furthest_behind();
    if (std::min(tp, td) < event) {
      if (tp <= td) {
        const auto [done, t] = pre.step(kp);
        for (const size_t idx : done) {
          const RequestOutcome& o = pre.live(idx);
          if (reqs[idx].output_tokens > 1) {
            transfer[idx] = (o.kv_bytes_after_prefill + o.aux_bytes) / d.link_bytes_per_s + d.link_latency_s;
            handovers.push({o.first_token_s + transfer[idx], idx});
          } else {
            senders.release(t);
          }
        }
      } else {
        const auto [done, t] = dec.step(kd);
        for (size_t i = 0; i < done.size(); ++i) senders.release(t);
      }
      continue;
    }
    if (!std::isfinite(event)) break;
    if (hand <= send) {
      const size_t idx = handovers.top().second;
      handovers.pop();
      dec.send(idx, hand);
      handed[idx] = 1;
      continue;
    }
    senders.take();
    pre.send(next, send);
    ++next;
  }
  pre.collect();
  dec.collect();
  ServingRun out;
  out.requests.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    RequestOutcome& o = out.requests[i];
    o = pre.outcome(i);
    o.output_tokens = reqs[i].output_tokens;
    o.finished_s = o.first_token_s;
    o.transfer_s = transfer[i];
    if (handed[i]) {
      const RequestOutcome od = dec.outcome(i);
      o.finished_s = od.finished_s;
      o.decode_replica = od.replica;
      o.preemptions += od.preemptions;
    }
  }
  ServingRun pool_totals;
  dec.add_totals(pool_totals);  // the decode pool's K/V: what bounds a disaggregated deployment
  out.iterations = pool_totals.iterations;
  pre.add_totals(out);
  out.kv_capacity = pool_totals.kv_capacity, out.kv_reserved_mean = pool_totals.kv_reserved_mean;
  out.kv_reserved_peak = pool_totals.kv_reserved_peak;
  out.end_s = std::max(out.end_s, pool_totals.end_s);
  out.preemptions += pool_totals.preemptions;
  return out;
}

}  // namespace

ServingRun simulate_deployment(const ModelConfig& c, const Precision& p, const ServingMethod& m,
                               const Deployment& d, std::span<const ServingRequest> reqs) {
  check_pool(c, d.serve, d.decode ? "prefill" : "serving");
  if (d.decode) check_pool(c, *d.decode, "decode");
  const bool pruning = policy_traits(m.method.policy).prunes && !m.steps.empty();
  detail::check_inputs(c, d.serve.cfg, reqs, pruning);
  if (d.decode) detail::check_inputs(c, d.decode->cfg, reqs, pruning);
  const auto run = [&](const ServingMethod& mm, std::span<const ServingRequest> rs) {
    return d.decode ? disaggregated(c, p, mm, d, rs) : aggregated(c, p, mm, d, rs);
  };
  if (!policy_traits(m.method.policy).drops_prompt) return run(m, reqs);
  const detail::DroppedPrompts dropped = detail::drop_prompts(m, reqs);
  ServingRun out = run(dropped.plain, dropped.reqs);
  detail::restore_prompts(out, reqs);
  return out;
}

}  // namespace lp::sim
