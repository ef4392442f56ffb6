// The serving simulation's machinery (sim/serving.h), shared by one engine's simulation
// (sim/serving.cpp) and deployments of several (sim/deployment.cpp): iterations costed over their
// members' layer work (IterationCost), and one engine's scheduler on costed time (EventLoop), which
// a driver feeds requests as they are sent and steps one iteration at a time. Internal: nothing
// outside sim/ includes it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <vector>

#include "admission/prefix_cache.h"
#include "model/error.h"
#include "pruning/policy.h"
#include "sim/layer_cost.h"
#include "sim/replay.h"
#include "sim/serving.h"

namespace lp::sim::detail {

// The GEMMs of one layer of an iteration that some members run on their own (Engine::own_gemm_rows):
// their rows, and the row-priced ops of those rows, seconds.
struct OwnGemms {
  int64_t rows = 0;
  double s = 0;
};

// Consecutive layers where every request's step does the same work (a uniform model's layers
// between pruning layers: the pruning layer, and the layers after it to the next one, where
// revivals enter at the first; a model whose layers differ, one layer each), and an iteration's
// work in them, summed over its members and costed once per run.
struct LayerRun {
  int start = 0, len = 0;
  LayerWork work;     // of each of its layers (work.moved stays 0: see moved)
  OwnGemms own;       // the part of work.rows in GEMMs of their own
  int64_t moved = 0;  // rows moved to and from the Aux Cache, at its first layer alone
};

// `kind[l]`: layers of one kind have the same shape and the same window or chunk (layer_kinds).
inline std::vector<LayerRun> layer_runs(std::span<const char> prune_at, std::span<const int> kind) {
  const int L = int(prune_at.size());
  std::vector<int> cut{0};
  for (int l = 0; l < L; ++l) {
    if (prune_at[size_t(l)])
      for (int b : {l, l + 1}) cut.push_back(b);
    if (l > 0 && kind[size_t(l)] != kind[size_t(l - 1)]) cut.push_back(l);
  }
  std::sort(cut.begin(), cut.end());
  cut.erase(std::unique(cut.begin(), cut.end()), cut.end());
  while (!cut.empty() && cut.back() >= L) cut.pop_back();
  std::vector<LayerRun> runs(cut.size());
  for (size_t k = 0; k < cut.size(); ++k)
    runs[k].start = cut[k], runs[k].len = (k + 1 < cut.size() ? cut[k + 1] : L) - cut[k];
  return runs;
}

// Each layer's kind: layers of a kind have the same shape (ModelConfig::layer: widths, a dense
// leading layer of a MoE model) and the same window or chunk, so one costs for all of them. Kinds
// are numbered from 0 in order of first appearance; `shape[l]` numbers the shapes alone.
struct LayerKinds {
  std::vector<int> kind, shape;
  int shapes = 0;
};
inline LayerKinds layer_kinds(const ModelConfig& c) {
  LayerKinds k;
  std::vector<std::array<int64_t, 6>> kinds, shapes;
  const auto index = [](std::vector<std::array<int64_t, 6>>& seen, const std::array<int64_t, 6>& key) {
    const auto it = std::find(seen.begin(), seen.end(), key);
    if (it != seen.end()) return int(it - seen.begin());
    seen.push_back(key);
    return int(seen.size()) - 1;
  };
  for (int l = 0; l < c.n_layer; ++l) {
    const ModelConfig x = c.uniform() ? c : c.layer(l);
    const std::array<int64_t, 6> shape{x.n_head, x.n_head_kv, x.n_ff, x.n_expert, 0, 0};
    k.shape.push_back(index(shapes, shape));
    k.kind.push_back(index(kinds, {x.n_head, x.n_head_kv, x.n_ff, x.n_expert, c.window(l), c.chunk(l)}));
  }
  k.shapes = int(shapes.size());
  return k;
}

// Costs iterations: the summed layer work of their members, consecutive layers with the same
// work and shape costed once. The row-priced ops (norms, GEMMs, RoPE, SwiGLU) run once over the
// rows of the members that share them and once per member that runs its own (OwnGemms).
class IterationCost {
 public:
  IterationCost(const ModelConfig& c, const hw::Profile& hw, const Precision& p, int tp, const Pipeline& pipe)
      : c_(c), hw_(hw), tp_(tp), cc_(hw, p), pipe_(pipe), starts_(pipeline_starts(c.n_layer, pipe.stages)) {
    check_tp(c, hw, tp);
    g_ = tp_shard(c, tp);
    for (int l = 0; l < c.n_layer; ++l) lc_.push_back(g_.uniform() ? g_ : g_.layer(l));
    kinds_ = layer_kinds(g_);
    rows_only_.resize(size_t(kinds_.shapes));
  }
  const std::vector<int>& kinds() const { return kinds_.kind; }
  const ModelConfig& layer(int l) const { return lc_[size_t(l)]; }
  // The row-priced ops of `rows` rows at layer l (a table per layer shape).
  double rows_time(int l, int64_t rows) const { return rows_only(kinds_.shape[size_t(l)], l, rows); }
  // An iteration over the runs' work: new_rows embedded, logit_rows through the head.
  double operator()(std::span<const LayerRun> runs, int64_t new_rows, int64_t logit_rows) const {
    double t = 0;
    const auto sink = [&t](const OpCost& oc) { t += oc.time_s; };
    const auto op = [&t](Op, const OpCost& oc) { t += oc.time_s; };
    const double D = c_.n_embd;
    cost_embed(cc_, hw_, tp_, g_, new_rows, D, op, sink);
    if (starts_.size() > 1) return staged(runs, t, logit_rows);
    for (const LayerRun& r : runs) {
      if (r.work.rows <= 0) continue;
      const double before = t;
      t += rows_time(r.start, r.work.rows - r.own.rows) + r.own.s;
      const ModelConfig& g = lc_[size_t(r.start)];
      cost_layer(cc_, hw_, tp_, g, D, r.work, op, sink, LayerPart::Rest);
      t += (t - before) * double(r.len - 1);
      if (r.moved > 0) t += op_cost(cc_, g, Op::Gather, {r.moved, 0, 0}).time_s;
    }
    cost_head(cc_, hw_, tp_, g_, logit_rows, double(c_.n_vocab), op, sink);
    return t;
  }

 private:
  const ModelConfig& c_;
  const hw::Profile& hw_;
  int tp_;
  CostContext cc_;
  Pipeline pipe_;
  std::vector<int> starts_;  // each stage's first layer
  ModelConfig g_;

  // An iteration through pipeline stages (ServingConfig::pipeline): each layer's time on its
  // stage (the embedding's, `embed_s`, on the first; the head on the last), the rows entering each
  // later stage handed over its link; then max(the sum, stages x the slowest stage).
  double staged(std::span<const LayerRun> runs, double embed_s, int64_t logit_rows) const {
    const size_t S = starts_.size();
    std::vector<double> stage(S, 0.0), hand(S, 0.0);
    stage[0] = embed_s;
    const auto stage_of = [&](int l) {
      return size_t(std::upper_bound(starts_.begin(), starts_.end(), l) - starts_.begin()) - 1;
    };
    const double D = c_.n_embd, el = cc_.dtypes.elem_bytes;
    for (const LayerRun& r : runs) {
      if (r.work.rows <= 0) continue;
      double t = 0;
      const auto sink = [&t](const OpCost& oc) { t += oc.time_s; };
      t += rows_time(r.start, r.work.rows - r.own.rows) + r.own.s;
      const ModelConfig& g = lc_[size_t(r.start)];
      cost_layer(
          cc_, hw_, tp_, g, D, r.work, [&t](Op, const OpCost& oc) { t += oc.time_s; }, sink, LayerPart::Rest);
      const double moved = r.moved > 0 ? op_cost(cc_, g, Op::Gather, {r.moved, 0, 0}).time_s : 0;
      for (int l = r.start; l < r.start + r.len; ++l) {
        const size_t k = stage_of(l);
        stage[k] += t;
        if (k > 0 && l == starts_[k]) hand[k] = handoff_cost(pipe_, double(r.work.rows) * D * el).time_s;
      }
      stage[stage_of(r.start)] += moved;
    }
    double head = 0;
    cost_head(
        cc_, hw_, tp_, g_, logit_rows, double(c_.n_vocab),
        [&head](Op, const OpCost& oc) { head += oc.time_s; },
        [&head](const OpCost& oc) { head += oc.time_s; });
    stage[S - 1] += head;
    double sum = 0, slowest = 0;
    for (size_t k = 0; k < S; ++k) sum += stage[k] + hand[k], slowest = std::max(slowest, stage[k] + hand[k]);
    return std::max(sum, double(S) * slowest);
  }
  std::vector<ModelConfig> lc_;
  LayerKinds kinds_;
  // [shape][rows]: a layer's ops priced by rows alone, < 0 not yet
  mutable std::vector<std::vector<double>> rows_only_;

  double rows_only(int shape, int l, int64_t rows) const {
    const std::vector<double>& t = rows_only_[size_t(shape)];
    if (size_t(rows) < t.size() && t[size_t(rows)] >= 0) return t[size_t(rows)];
    return rows_only_priced(shape, l, rows);
  }
  [[gnu::noinline]] double rows_only_priced(int shape, int l, int64_t rows) const {
    double t = 0;
    const auto add = [&t](const OpCost& oc) { t += oc.time_s; };
    cost_layer(
        cc_, hw_, tp_, lc_[size_t(l)], double(c_.n_embd), LayerWork{rows},
        [&](Op, const OpCost& oc) { add(oc); }, add, LayerPart::RowsOnly);
    if (rows < int64_t(1) << 16) {
      std::vector<double>& table = rows_only_[size_t(shape)];
      if (size_t(rows) >= table.size()) table.resize(size_t(rows) + 1, -1.0);
      table[size_t(rows)] = t;
    }
    return t;
  }
};

// What the simulation refuses before it starts: a configuration it cannot run, and a request that
// is malformed or could never be admitted.
inline void check_inputs(const ModelConfig& c, const ServingConfig& cfg, std::span<const ServingRequest> reqs,
                         bool pruning) {
  if (!(cfg.kv_budget_bytes > 0)) fail("the K/V budget must be positive, got {} bytes", cfg.kv_budget_bytes);
  if (cfg.max_batch_tokens < 1)
    fail("the iteration's token budget must be at least 1, got {}", cfg.max_batch_tokens);
  if (cfg.chunk_tokens < 0) fail("the prefill chunk must be positive, got {}", cfg.chunk_tokens);
  if (!(cfg.iteration_overhead_s >= 0) || !std::isfinite(cfg.iteration_overhead_s))
    fail("the iteration overhead must be a non-negative time, got {}", cfg.iteration_overhead_s);
  if (!(cfg.request_overhead_s >= 0) || !std::isfinite(cfg.request_overhead_s) || !(cfg.admit_layer_s >= 0) ||
      !std::isfinite(cfg.admit_layer_s))
    fail("the per-request overheads must be non-negative times, got {} and {}", cfg.request_overhead_s,
         cfg.admit_layer_s);
  if (cfg.clients < 0) fail("the concurrency must be at least 1, got {}", cfg.clients);
  if (cfg.kv_block < 1) fail("the K/V block must be at least 1 token, got {}", cfg.kv_block);
  if (!(cfg.time_scale > 0) || !std::isfinite(cfg.time_scale))
    fail("the time scale must be a positive number, got {}", cfg.time_scale);
  if (!(cfg.pipeline.link_bytes_per_s > 0) || !(cfg.pipeline.latency_s >= 0))
    usage_fail("the pipeline link needs a positive bandwidth and a latency of at least 0");
  for (size_t i = 0; i < reqs.size(); ++i) {
    const ServingRequest& r = reqs[i];
    if (i > 0 && r.arrival_s < reqs[i - 1].arrival_s) fail("request {}: arrivals are not sorted", i);
    if (!(r.arrival_s >= 0) || !std::isfinite(r.arrival_s))
      fail("request {}: arrival {} is negative", i, r.arrival_s);
    if (r.prompt_tokens < 1 || r.output_tokens < 1) fail("request {}: empty prompt or no output", i);
    if (r.prompt_tokens + r.output_tokens > c.n_ctx_train && c.n_ctx_train > 0)
      fail("request {}: {} prompt + {} output tokens exceed the model's context of {}", i, r.prompt_tokens,
           r.output_tokens, c.n_ctx_train);
    const double res = reservation_bytes(c, kv_layout(cfg), r.prompt_tokens, r.output_tokens, pruning);
    if (res > cfg.kv_budget_bytes)
      fail(
          "request {} ({} prompt + {} output tokens) needs {:.1f} MiB of K/V, more than the budget of {:.1f} "
          "MiB: "
          "it could never run",
          i, r.prompt_tokens, r.output_tokens, res / (1 << 20), cfg.kv_budget_bytes / (1 << 20));
  }
}

// The discrete-event simulation, for every policy but random-drop's shortening: iterations of
// admit (as the engine's scheduler admits), batch (every running request's step into the layer
// runs' work, costed), and finish (tokens out, finished requests leave).
class EventLoop {
 public:
  EventLoop(const ModelConfig& c, const hw::Profile& hw, const Precision& p, const ServingMethod& m,
            const ServingConfig& cfg, std::span<const ServingRequest> reqs)
      : c_(c),
        m_(m),
        cfg_(cfg),
        reqs_(reqs),
        pruning_(policy_traits(m.method.policy).prunes && !m.steps.empty()),
        checked_((check_inputs(c, cfg, reqs, pruning_), true)),
        traits_(policy_traits(m.method.policy)),
        cost_(c, hw, p, cfg.tp, cfg.pipeline),
        kv_(kv_layout(cfg)),
        limits_{cfg.kv_budget_bytes, cfg.max_batch_tokens, cfg.chunk_tokens, cfg.max_seqs},
        kv_token_layer_(double(c.kv_token_elems()) * cfg.kv_element_bytes),
        own_from_(hw.engine.own_gemm_rows),
        listed_(hw.eff(hw::Family::Attention).prices_listed()),
        copy_bytes_per_s_(cfg.copy_bytes_per_s > 0 ? cfg.copy_bytes_per_s : hw.memory_bandwidth / 2),
        on_demand_(cfg.kv_mode == hw::Scheduling::Kv::OnDemand) {
    // The prefix cache, as the engine keeps it: unpruned requests' blocks and LazyLLM's apart, the
    // other policies bypassing it (engine/scheduler.cpp, Scheduler::submit).
    if (cfg.prefix_cache) {
      cache_.emplace(cfg.prefix_block_tokens);
      if (!pruning_)
        cache_ns_ = 1;
      else if (m.method.policy == PolicyKind::LazyLLM)
        cache_ns_ = 2;
      if (pruning_) {  // a cold prefill's share of pairs computed: what a replayed hit's blocks hold
        trace::SyntheticSteps s(c, m.method.policy_name(), m.steps, 1024, 0);
        trace::Step st;
        s.next(st);
        cold_share_ = trace::prefill_computed_fraction(st, 1024);
      }
    }
    const int L = c.n_layer;
    prune_at_.assign(size_t(L), 0);
    if (pruning_)
      for (const PruneStep& s : m.steps)
        if (s.layer >= 0 && s.layer < L) {
          prune_at_[size_t(s.layer)] = 1;
          if (first_prune_ < 0 || s.layer < first_prune_) first_prune_ = s.layer;
        }
    runs_ = layer_runs(prune_at_, cost_.kinds());
    for (const LayerRun& r : runs_)
      bounded_ = bounded_ || c.kv_kept(r.start, int64_t(1) << 40) < int64_t(1) << 40;
    for (const LayerRun& r : runs_) run_starts_.push_back(r.start);
    // The revival model's shares per (stage, step), computed once before the run (every request
    // asks the same, three times a decoding step): a table lookup, the model asked only past it.
    if (m.revivals) {
      int64_t max_steps = 0;
      for (const ServingRequest& r : reqs) max_steps = std::max(max_steps, r.output_tokens - 1);
      revivals_ = std::make_shared<const trace::RevivalTable>(m.revivals, m.steps.size(),
                                                              std::min<int64_t>(max_steps, int64_t(1) << 20));
    }
  }

  // Request idx, sent at `sent`: this engine's clock is at or past it, or, idle, moves to it.
  void arrive(size_t idx, double sent) {
    if (out_.requests.empty()) out_.requests.resize(reqs_.size());
    out_.requests[idx].arrival_s = sent;
    if (!busy()) t_ = std::max(t_, sent);
    first_sent_ = std::min(first_sent_, sent);
    queue_.push_back(idx);
  }
  bool busy() const { return !queue_.empty() || !running_.empty() || !preempted_.empty(); }
  // Request idx as this engine has served it so far (its first token once its prefill ended).
  const RequestOutcome& outcome(size_t idx) const { return out_.requests[idx]; }
  double now() const { return t_; }
  // One iteration (busy() holds): admit, batch, cost, finish. The requests that finished in it, at now().
  const std::vector<size_t>& step() {
    finished_now_.clear();
    if (on_demand_) grow();
    admit();
    const double dt = batch();
    sample_kv(dt);
    t_ += dt;
    ++out_.iterations;
    finish();
    return finished_now_;
  }
  // Tokens of request idx's prompt this engine's prefix cache holds (0 without one).
  int64_t cached_prefix(size_t idx) const {
    if (!cache_ || cache_ns_ == 0) return 0;
    const int64_t B = cfg_.prefix_block_tokens, T = reqs_[idx].prompt_tokens;
    const std::vector<int32_t> t = tokens_of(idx, (T - 1) / B * B);
    const std::vector<uint64_t> keys = cache_->keys(t, cache_ns_);
    PrefixIndex::BlockId parent = -1;
    int64_t n = 0;
    for (size_t i = 0; i < keys.size(); ++i, ++n)  // a look, not a use: nothing refreshed
      if ((parent = cache_->find(parent, keys[i], std::span(t).subspan(i * size_t(B), size_t(B)))) < 0) break;
    return n * B;
  }
  // The run so far: every request this engine was sent, its utilisation over first send to now.
  ServingRun result() {
    out_.kv_capacity = cfg_.kv_budget_bytes;
    if (out_.requests.empty()) out_.requests.resize(reqs_.size());
    out_.end_s = t_;
    const double span = std::isfinite(first_sent_) ? t_ - first_sent_ : 0;
    if (span > 0) out_.kv_reserved_mean /= span;
    return std::move(out_);
  }
  // All of `reqs_`, each sent at its arrival or, with clients, as one is free (drive()).
  ServingRun run();

 private:
  // A request between its admission and its last token.
  struct Active {
    size_t idx = 0;
    double reservation = 0, kv_used = 0, kv_next = 0;  // K/V held, and after this iteration
    int64_t prefilled = 0;  // prompt tokens computed (chunked prefill: those of earlier chunks)
    int64_t generated = 0;  // tokens out
    // Tokens its prefill computes: the prompt; after a preemption, the prompt and the tokens out
    // so far (computed again, the last of them giving the next token).
    int64_t prefill_tokens = 0;
    bool stepped = false;     // it ran in this iteration (not waiting out a prefill-only iteration)
    int64_t held_tokens = 0;  // tokens whose K/V it holds (OnDemand's blocks)
    std::optional<trace::SyntheticSteps> steps;
    trace::Step step;  // its step in this iteration
    bool prefill_done = false;
    bool prefilled_now = false;  // its prefill (or last chunk) ran in this iteration
    // OnDemand with a prefix cache: the cache's blocks it reads in place (its hit, then its
    // prompt's full blocks once computed), pinned until it leaves; its reservation is the rest.
    std::vector<PrefixIndex::BlockId> pinned;
    int64_t pinned_tokens = 0;
  };

  const ModelConfig& c_;
  const ServingMethod& m_;
  const ServingConfig& cfg_;
  std::span<const ServingRequest> reqs_;
  const bool pruning_;
  const bool checked_;  // check_inputs ran, before anything else is built
  const PolicyTraits traits_;
  const IterationCost cost_;
  const KvLayout kv_;
  const AdmissionLimits limits_;
  const double kv_token_layer_;
  const int64_t own_from_;  // rows from which a member runs its own GEMMs
  const bool listed_;       // listed key sets priced apart
  std::vector<char> prune_at_;
  int first_prune_ = -1;
  std::vector<LayerRun> runs_;
  bool bounded_ = false;  // some layer keeps only a window's or chunk's K/V (ModelConfig::kv_kept)
  std::vector<int> run_starts_;
  std::shared_ptr<const trace::RevivalTable> revivals_;
  const double copy_bytes_per_s_;
  const bool on_demand_;  // K/V held as blocks of computed tokens (ServingConfig::kv_mode)
  std::optional<PrefixIndex> cache_;
  uint64_t cache_ns_ = 0;  // the kind of state this method's requests read and write; 0: none
  double copy_bytes_ = 0;  // copied into and out of the cache since the last iteration was costed
  double cold_share_ = 1;  // a cold prefill's share of its (token, layer) pairs computed

  // A request's tokens as the cache sees them: its group's shared ones, then its own (synthetic
  // ids, the same for every request of a group; the prompt's, then its output's).
  std::vector<int32_t> tokens_of(size_t idx, int64_t n) const {
    const ServingRequest& r = reqs_[idx];
    const auto mix = [](uint64_t a, uint64_t b) {
      uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return int32_t(uint32_t(z ^ (z >> 31)) >> 1);
    };
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      t[size_t(i)] = r.shared_group >= 0 && i < r.shared_tokens
                         ? mix(uint64_t(r.shared_group) + 1, uint64_t(i))
                         : mix(~uint64_t(idx), uint64_t(i));
    return t;
  }
  // Bytes of a cached block: every (token, layer) pair's K/V unpruned; with LazyLLM the share
  // a cold prefill computes, and a state for each token pruned somewhere (engine/session.h,
  // TokenStates). Exact for the first (the engine's bytes), an estimate for the second.
  double block_bytes(double computed) const {
    const double B = double(cfg_.prefix_block_tokens), L = double(c_.n_layer);
    return B * (L * kv_token_layer_ * computed + 4.0 * double(c_.n_embd) * (1 - computed) + 2.0);
  }
  // The full blocks of request idx's first n tokens into the cache, after its prefill and as it
  // leaves, within the budget's room beside the reservations (what the engine's save does).
  // OnDemand: the blocks are the request's own, handed to the cache rather than copied; with
  // `pin`, the chain (every block of it found or inserted) stays pinned and is returned.
  std::vector<PrefixIndex::BlockId> save_blocks(size_t idx, int64_t n, bool pin = false) {
    if (!cache_ || cache_ns_ == 0) return {};
    const int64_t B = cfg_.prefix_block_tokens;
    const ServingRequest& r = reqs_[idx];
    if (r.cached_tokens >= 0) {   // a replayed hit: the copies of the blocks it did not have, priced
      if (on_demand_) return {};  // (on demand, blocks are handed over, not copied)
      const int64_t T = r.prompt_tokens, have = std::min(r.cached_tokens, T - 1) / B;
      const int64_t prompt_blocks = T / B, blocks = n / B;
      const double share = cache_ns_ == 2 ? cold_share_ : 1.0;
      if (n <= T)
        copy_bytes_ += double(std::max<int64_t>(prompt_blocks - have, 0)) * block_bytes(share);
      else
        copy_bytes_ += double(std::max<int64_t>(blocks - prompt_blocks, 0)) * block_bytes(1.0);
      return {};
    }
    const std::vector<int32_t> t = tokens_of(idx, n / B * B);
    const std::vector<uint64_t> keys = cache_->keys(t, cache_ns_);
    const double room = cfg_.kv_budget_bytes - reserved_;
    std::vector<PrefixIndex::BlockId> chain;
    PrefixIndex::BlockId parent = -1;
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::span<const int32_t> part = std::span(t).subspan(i * size_t(B), size_t(B));
      PrefixIndex::BlockId id = cache_->find(parent, keys[i], part);
      if (id < 0) {
        const bool prompt = int64_t(i + 1) * B <= reqs_[idx].prompt_tokens;
        const int64_t bytes = int64_t(block_bytes(prompt && cache_ns_ == 2 ? cold_share_ : 1.0));
        if (!cache_->make_room(int64_t(room) - bytes)) break;
        id = cache_->insert(parent, keys[i], part, bytes);
        if (id < 0) break;
        if (!on_demand_) copy_bytes_ += double(bytes);
      }
      cache_->pin(std::span(&id, 1));
      chain.push_back(parent = id);
    }
    if (!pin) {
      cache_->unpin(chain);
      chain.clear();
    }
    return chain;
  }

  // OnDemand: K/V bytes of `tokens` tokens (no Aux Cache), what a request's pinned blocks stand for.
  double kv_bytes(int64_t tokens) const {
    return tokens > 0 ? reservation_bytes(c_, kv_, tokens, 0, false) : 0;
  }
  // OnDemand: what request `a` holds of its own to hold `tokens` tokens beside its pinned blocks.
  double own_bytes(const Active& a, int64_t tokens) const {
    return std::max(held_bytes(a.idx, tokens) - kv_bytes(a.pinned_tokens), 0.0);
  }
  void unpin(Active& a) {
    if (cache_ && !a.pinned.empty()) cache_->unpin(a.pinned);
    a.pinned.clear();
    a.pinned_tokens = 0;
  }

  ServingRun out_;
  std::deque<size_t> queue_;
  std::vector<std::unique_ptr<Active>> running_;
  std::deque<std::unique_ptr<Active>> preempted_;  // at the queue's head, in order (OnDemand)
  std::vector<size_t> finished_now_;               // in the last step
  double first_sent_ = HUGE_VAL;
  bool preempted_now_ = false;  // this iteration preempted (nothing new is admitted in it)
  size_t done_ = 0;
  double t_ = 0, reserved_ = 0, used_ = 0;
  int64_t kv_stride_ = 1;

  // Admission, as the engine's scheduler admits (admission/admission.h), after the iteration's
  // decoding rows and, chunked, the next chunks of the prefills under way.
  // Under SGLang's unmixed iterations the decoding rows do not share an iteration with prefill
  // work, so they take none of its token budget.
  void admit() {
    int64_t rows = 0;
    if (cfg_.mixed)
      for (const auto& a : running_) rows += a->prefill_done ? 1 : 0;
    for (const auto& a : running_)
      if (!a->prefill_done)  // chunked prefills still running take their next chunk first
        rows += std::min({cfg_.chunk_tokens, a->prefill_tokens - a->prefilled,
                          std::max<int64_t>(cfg_.max_batch_tokens - rows, 0)});
    if (preempted_now_) return;  // as vLLM: a step that preempted schedules nothing waiting
    Admission admission(limits_, reserved_ + (cache_ ? double(cache_->bytes()) : 0.0), rows,
                        int64_t(running_.size()));
    // Preempted requests first (OnDemand), at the queue's head: their prompt and output so far
    // computed again as one prefill.
    while (!preempted_.empty()) {
      Active& a = *preempted_.front();
      const double res = held_bytes(a.idx, admission.first_rows(a.prefill_tokens));
      if (cache_) {  // cached blocks no request pins give way (none is read: it computes everything)
        std::vector<PrefixIndex::BlockId> none;
        if (admit_with_cache(admission, *cache_, none, 0, res, a.prefill_tokens, cfg_.kv_budget_bytes) < 0)
          return;
      } else if (!admission.fits(res, a.prefill_tokens)) {
        return;
      }
      admission.take(res, a.prefill_tokens);
      a.reservation = res;
      reserved_ += res;
      running_.push_back(std::move(preempted_.front()));
      preempted_.pop_front();
    }
    while (!queue_.empty()) {
      const ServingRequest& h = reqs_[queue_.front()];
      if (h.prefilled) {  // decoding only, its K/V handed over: no prefill rows, one decoding row
        if (!admit_prefilled(admission)) break;
        continue;
      }
      const double res = on_demand_ ? held_bytes(queue_.front(), admission.first_rows(h.prompt_tokens))
                                    : reservation_bytes(c_, kv_, h.prompt_tokens, h.output_tokens, pruning_);
      const int64_t T = h.prompt_tokens;
      int64_t hit = 0, rows_now = T;
      if (cache_ && h.cached_tokens >= 0) {  // a measured hit, replayed
        hit = std::min(h.cached_tokens, T - 1);
        rows_now = T - hit;
        if (!admission.fits(res, rows_now)) break;
      } else if (cache_ && cache_ns_ != 0 && on_demand_) {
        if (!admit_sharing(admission)) break;
        continue;
      } else if (cache_ && cache_ns_ != 0) {
        const int64_t B = cfg_.prefix_block_tokens;
        const std::vector<int32_t> t = tokens_of(queue_.front(), (T - 1) / B * B);
        std::vector<PrefixIndex::BlockId> blocks = cache_->match(t, cache_->keys(t, cache_ns_), (T - 1) / B);
        cache_->pin(blocks);
        rows_now = admit_with_cache(admission, *cache_, blocks, int64_t(blocks.size()) * B, res, T,
                                    cfg_.kv_budget_bytes);
        if (rows_now < 0) {
          cache_->unpin(blocks);
          break;
        }
        for (const PrefixIndex::BlockId b : blocks) copy_bytes_ += double(cache_->bytes_of(b));
        cache_->unpin(blocks);
        hit = T - rows_now;
      } else if (!admission.fits(res, T)) {
        break;
      }
      admission.take(res, rows_now);
      start(res, hit);
      if (cache_ && h.cached_tokens >= 0 && !on_demand_)  // a replayed hit: its blocks' bytes, as held
        copy_bytes_ += double(hit) / double(cfg_.prefix_block_tokens) * block_bytes(cold_share_);
    }
  }

  // The queue's head admitted holding `res` of its own, `hit` of its prompt cached.
  Active& start(double res, int64_t hit) {
    const ServingRequest& h = reqs_[queue_.front()];
    auto a = std::make_unique<Active>();
    a->idx = queue_.front();
    queue_.pop_front();
    a->reservation = res;
    a->prefill_tokens = h.prompt_tokens;
    reserved_ += res;
    a->steps.emplace(c_, m_.method.policy_name(), m_.steps, h.prompt_tokens, h.output_tokens - 1,
                     revivals_ ? trace::Revivals{} : m_.revivals);
    if (revivals_) a->steps->use_table(revivals_);
    a->steps->only_run_starts(run_starts_);  // add_step reads the first layer of each run
    RequestOutcome& o = out_.requests[a->idx];
    o.admitted_s = t_;  // o.arrival_s: when it was sent (run())
    o.prompt_tokens = h.prompt_tokens, o.output_tokens = h.output_tokens;
    o.cached_tokens = hit;
    a->prefilled = a->held_tokens = hit;  // the cached prefix: the prefill computes the rest
    running_.push_back(std::move(a));
    return *running_.back();
  }

  // OnDemand K/V with a prefix cache, as vLLM's automatic prefix caching keeps it: the head's
  // cached prefix is read in place (its blocks pinned, no copy), and it holds of its own the K/V
  // of its first rows beyond it; blocks no request pins are evicted, least recently used first,
  // while bytes are short. False when it does not fit.
  bool admit_sharing(Admission& admission) {
    const size_t idx = queue_.front();
    const int64_t T = reqs_[idx].prompt_tokens, B = cfg_.prefix_block_tokens;
    const std::vector<int32_t> t = tokens_of(idx, (T - 1) / B * B);
    std::vector<PrefixIndex::BlockId> blocks = cache_->match(t, cache_->keys(t, cache_ns_), (T - 1) / B);
    cache_->pin(blocks);
    int64_t hit = int64_t(blocks.size()) * B;
    const auto own = [&](int64_t h) {
      return std::max(held_bytes(idx, h + admission.first_rows(T - h)) - kv_bytes(h), 0.0);
    };
    const int64_t rows = admit_with_cache(admission, *cache_, blocks, hit, own(hit), T, cfg_.kv_budget_bytes);
    if (rows < 0) {
      cache_->unpin(blocks);
      return false;
    }
    hit = T - rows;  // 0 when its own hit stood in the way and was dropped
    const double res = own(hit);
    admission.take(res, rows);
    Active& a = start(res, hit);
    a.pinned = std::move(blocks);
    a.pinned_tokens = hit;
    return true;
  }

  // The queue's head, prefilled elsewhere (ServingRequest::prefilled), admitted when its K/V fits:
  // it holds its prompt's K/V (its synthetic prefill's, not costed here) and its first token is out.
  bool admit_prefilled(Admission& admission) {
    const size_t idx = queue_.front();
    const ServingRequest& h = reqs_[idx];
    const int64_t T = h.prompt_tokens;
    const double res =
        on_demand_ ? held_bytes(idx, T + 1) : reservation_bytes(c_, kv_, T, h.output_tokens, pruning_);
    if (!admission.fits(res, 1)) return false;
    admission.take(res, 1);
    queue_.pop_front();
    auto a = std::make_unique<Active>();
    a->idx = idx;
    a->reservation = res;
    reserved_ += res;
    a->prefill_tokens = a->prefilled = a->held_tokens = T;
    a->prefill_done = true;
    a->generated = 1;
    a->steps.emplace(c_, m_.method.policy_name(), m_.steps, T, h.output_tokens - 1,
                     revivals_ ? trace::Revivals{} : m_.revivals);
    if (revivals_) a->steps->use_table(revivals_);
    a->steps->only_run_starts(run_starts_);
    a->steps->next(a->step);  // the prefill, done elsewhere
    a->kv_used = a->kv_next = held_kv(a->step);
    used_ += a->kv_used;
    RequestOutcome& o = out_.requests[idx];
    o.admitted_s = t_;
    o.prompt_tokens = T, o.output_tokens = h.output_tokens;
    running_.push_back(std::move(a));
    return true;
  }

  // K/V held after step s, bytes (as add_step counts it).
  double held_kv(const trace::Step& s) const {
    int64_t held = 0;
    for (const LayerRun& r : runs_)
      held += (bounded_ ? c_.kv_kept(r.start, s.keys[size_t(r.start)]) : s.keys[size_t(r.start)]) * r.len;
    return double(held) * kv_token_layer_;
  }

  // OnDemand K/V: bytes of the blocks holding request idx's first `tokens` tokens' K/V, and with
  // pruning its prompt's Aux Cache (reservation_bytes' worst case for it).
  double held_bytes(size_t idx, int64_t tokens) const {
    const double aux = pruning_ ? double(reqs_[idx].prompt_tokens) * double(c_.n_embd) * 4 : 0;
    return reservation_bytes(c_, kv_, tokens, 0, false) + aux;
  }

  // OnDemand K/V, before admission (vLLM's schedule() over its running requests first): each
  // running request, the oldest first, takes the blocks this iteration's tokens need (a decoding
  // row, or its prefill's next chunk); where too few are free, the most recently admitted running
  // request is preempted until they are, which may be the request itself.
  void grow() {
    preempted_now_ = false;
    for (size_t i = 0; i < running_.size(); ++i) {
      Active& a = *running_[i];
      const int64_t want = a.prefill_done ? a.held_tokens + 1
                                          : a.prefilled + std::min(cfg_.chunk_tokens > 0 ? cfg_.chunk_tokens
                                                                                         : a.prefill_tokens,
                                                                   a.prefill_tokens - a.prefilled);
      const double need = own_bytes(a, want) - a.reservation;
      if (need <= 0) continue;
      // Blocks of the prefix cache no request pins go first (vLLM's free block queue holds them),
      // then the most recently admitted running requests.
      const auto short_of = [&] {
        return reserved_ + need + (cache_ ? double(cache_->bytes()) : 0.0) > cfg_.kv_budget_bytes;
      };
      while (short_of() && i < running_.size()) {
        if (cache_ && cache_->make_room(int64_t(std::floor(cfg_.kv_budget_bytes - reserved_ - need)))) break;
        preempt(running_.size() - 1);
      }
      if (i >= running_.size()) return;  // it was preempted itself, and every later one before it
      a.reservation += need;
      reserved_ += need;
    }
  }

  // Running request j back to the queue's head with nothing held; admitted again, it computes its
  // prompt and its output so far as one prefill, which gives its next token.
  void preempt(size_t j) {
    std::unique_ptr<Active> a = std::move(running_[j]);
    running_.erase(running_.begin() + std::ptrdiff_t(j));
    const ServingRequest& r = reqs_[a->idx];
    reserved_ -= a->reservation;
    used_ -= a->kv_used;
    unpin(*a);
    a->reservation = a->kv_used = a->kv_next = 0;
    a->prefill_tokens = r.prompt_tokens + a->generated;
    a->prefilled = a->held_tokens = 0;
    a->prefill_done = a->prefilled_now = false;
    a->steps.emplace(c_, m_.method.policy_name(), m_.steps, a->prefill_tokens,
                     r.output_tokens - a->generated - 1, revivals_ ? trace::Revivals{} : m_.revivals);
    if (revivals_) a->steps->use_table(revivals_);
    a->steps->only_run_starts(run_starts_);
    ++out_.requests[a->idx].preemptions;
    ++out_.preemptions;
    preempted_.push_front(std::move(a));  // vLLM prepends: the oldest preempted ends up first
    preempted_now_ = true;
  }

  void gemm_rows(LayerRun& r, int64_t q) {
    if (own_from_ > 0 && q >= own_from_) r.own.rows += q, r.own.s += cost_.rows_time(r.start, q);
  }

  // One request's step into the iteration's work; returns the K/V it holds after it, bytes.
  // Scoring and selection as the policy's traits say, as the batch-1 replay costs them.
  double add_step(const trace::Step& s, bool prefill) {
    // Raw pointers, as in SyntheticSteps::next: the stores into the runs' work are int64_t too,
    // and through the vectors the compiler reloaded every array at every layer.
    const int64_t *keys_at = s.keys.data(), *queries = s.queries.data(), *pairs = s.pairs.data(),
                  *attended = s.attended.empty() ? nullptr : s.attended.data(),
                  *aux_writes = s.aux_writes.data(), *aux_reads = s.aux_reads.data();
    int64_t held = 0;
    for (LayerRun& r : runs_) {
      const int l = r.start;
      held += (bounded_ ? c_.kv_kept(l, keys_at[l]) : keys_at[l]) * r.len;
      const int64_t q = queries[l];
      if (q <= 0) continue;
      LayerWork& w = r.work;
      gemm_rows(r, q);
      const int64_t keys = prefill ? keys_at[l] : attended ? attended[l] : std::min(keys_at[l], pairs[l]);
      if (prefill)
        w.rows += q, w.pairs += pairs[l], w.keys += keys;
      else
        add_decoding(w, q, attended ? keys_at[l] : keys, keys, pairs[l], listed_);
      const bool prunes_here = prune_at_[size_t(l)] && traits_.prunes;
      if (scores_at(traits_, prefill, l, prunes_here, first_prune_)) ++w.scorers, w.score_keys += keys;
      if (prunes_here) ++w.selects, w.select_keys += keys;
      r.moved += prefill ? (aux_writes[l] > 0 ? q : 0) : aux_writes[l] + aux_reads[l];
    }
    return double(held) * kv_token_layer_;
  }

  // A chunk of a prefill before its last: every layer, attending the prefix and itself.
  void add_chunk(int64_t pre, int64_t chunk) {
    for (LayerRun& r : runs_) {
      gemm_rows(r, chunk);
      r.work.rows += chunk;
      r.work.pairs += c_.dense_pairs(r.start, pre + chunk) - c_.dense_pairs(r.start, pre);
      r.work.keys += c_.visible_keys(r.start, pre + chunk);
    }
  }

  // The last chunk of `chunk` rows after `pre` computed ones of a T-token prompt: the synthetic
  // prefill of the whole prompt keeping the same share of its rows at each layer, attending every
  // earlier token (their K/V exist at every layer) and its own kept rows.
  void last_chunk(trace::Step& s, int64_t pre, int64_t chunk, int64_t T) const {
    for (size_t l = 0; l < size_t(c_.n_layer); ++l) {
      const int64_t q = (s.queries[l] * chunk + T - 1) / T;
      s.queries[l] = q;
      s.pairs[l] = q * pre + q * (q + 1) / 2;
      if (c_.visible_keys(int(l), pre + chunk) < pre + chunk) {  // a window's or chunk's share of them
        const double all = double(chunk) * double(pre) + double(chunk) * double(chunk + 1) / 2;
        const double seen = double(c_.dense_pairs(int(l), pre + chunk) - c_.dense_pairs(int(l), pre));
        s.pairs[l] = std::max<int64_t>(q, std::llround(double(s.pairs[l]) * seen / all));
      }
      s.keys[l] = pre + q;
      if (s.aux_writes[l] > 0) s.aux_writes[l] = std::max<int64_t>(s.aux_writes[l] * chunk / T, 1);
    }
  }

  // The batch: every running request's step (a chunk for a chunked prefill before its last),
  // costed; returns the iteration's time.
  double batch() {
    static_assert(std::is_trivially_copyable_v<LayerWork> && std::is_trivially_copyable_v<OwnGemms>);
    for (LayerRun& r : runs_) r.work = LayerWork{}, r.own = OwnGemms{}, r.moved = 0;
    int64_t new_rows = 0, logit_rows = 0, budget = cfg_.max_batch_tokens, scheduled = 0, starting = 0;
    // Unmixed iterations (SGLang's): prefill work, where there is any, runs alone.
    bool decode = true;
    if (!cfg_.mixed)
      for (const auto& a : running_) decode = decode && a->prefill_done;
    for (const auto& a : running_) budget -= a->prefill_done && decode ? 1 : 0;
    for (auto& a : running_) {
      a->stepped = false;
      if (a->prefill_done) {
        if (!decode) continue;
        a->steps->next(a->step);
        a->kv_next = add_step(a->step, false);
        new_rows += 1, logit_rows += 1;
        a->stepped = true, ++scheduled;
        continue;
      }
      const int64_t left = a->prefill_tokens - a->prefilled;
      const int64_t chunk =
          cfg_.chunk_tokens > 0 ? std::min({cfg_.chunk_tokens, left, std::max<int64_t>(budget, 0)}) : left;
      if (chunk <= 0) continue;  // no budget left this iteration
      budget -= chunk;
      new_rows += chunk;
      ++scheduled;
      starting += a->prefilled == 0 ? 1 : 0;
      if (chunk < left) {
        add_chunk(a->prefilled, chunk);
        a->prefilled += chunk;
        a->held_tokens = a->prefilled;
        continue;
      }
      a->steps->next(a->step);
      if (a->prefilled > 0) last_chunk(a->step, a->prefilled, chunk, a->prefill_tokens);
      a->kv_next = add_step(a->step, true);
      a->prefilled = a->held_tokens = a->prefill_tokens;
      a->prefilled_now = a->stepped = true;
      logit_rows += 1;
    }
    const double copies = copy_bytes_ * 2 / copy_bytes_per_s_;  // read and written
    copy_bytes_ = 0;
    const double host = cfg_.iteration_overhead_s + cfg_.request_overhead_s * double(scheduled) +
                        cfg_.admit_layer_s * double(c_.n_layer) * double(starting);
    return (cost_(runs_, new_rows, logit_rows) + host + copies) * cfg_.time_scale;
  }

  // K/V utilisation over the iteration (what it held at its start), time-weighted, and the
  // series, halved in resolution each time it reaches twice the samples asked for.
  void sample_kv(double dt) {
    out_.kv_reserved_mean += reserved_ * dt;
    out_.kv_reserved_peak = std::max(out_.kv_reserved_peak, reserved_);
    if (out_.iterations % kv_stride_ != 0) return;
    out_.kv.push_back({t_, reserved_, used_});
    if (int64_t(out_.kv.size()) >= 2 * std::max<int64_t>(cfg_.kv_samples, 1)) {
      for (size_t i = 0; 2 * i < out_.kv.size(); ++i) out_.kv[i] = out_.kv[2 * i];
      out_.kv.resize((out_.kv.size() + 1) / 2);
      kv_stride_ *= 2;
    }
  }

  // Tokens out; finished requests leave.
  void finish() {
    for (auto& a : running_) {
      const ServingRequest& r = reqs_[a->idx];
      RequestOutcome& o = out_.requests[a->idx];
      if (!a->stepped) continue;  // a chunk before the last, or waiting out a prefill-only iteration
      if (!a->prefill_done) {
        a->prefilled_now = false;
        a->prefill_done = true;
        if (a->generated == 0) {  // not a preempted request's prefill computed again
          o.first_token_s = t_;
          o.prompt_tokens_computed_fraction = trace::prefill_computed_fraction(a->step, r.prompt_tokens);
          o.kv_bytes_after_prefill = a->kv_next;
          // Every token pruned somewhere left its state once: those not computed at the last layer.
          const int64_t last = a->step.queries[size_t(runs_.back().start)];
          o.aux_bytes =
              pruning_ ? double(std::max<int64_t>(r.prompt_tokens - last, 0)) * double(c_.n_embd) * 4 : 0;
          if (on_demand_ && cache_ && cache_ns_ != 0) {
            // Its prompt's full blocks become the cache's (read in place by later requests), pinned
            // while it runs; it holds the rest of its own.
            reserved_ -= a->reservation;
            std::vector<PrefixIndex::BlockId> chain = save_blocks(a->idx, r.prompt_tokens, true);
            unpin(*a);
            a->pinned_tokens = int64_t(chain.size()) * cfg_.prefix_block_tokens;
            a->pinned = std::move(chain);
            a->reservation = own_bytes(*a, a->held_tokens);
            reserved_ += a->reservation;
          } else {
            save_blocks(a->idx, r.prompt_tokens);
          }
        }
      } else {
        ++a->held_tokens;
      }
      ++a->generated;
      used_ += a->kv_next - a->kv_used;
      a->kv_used = a->kv_next;
      if (a->generated >= r.output_tokens) o.finished_s = t_;
    }
    // The finished leave in order, the others keeping theirs (the engine's order: the prefix
    // cache's saves, and so its least recently used blocks, follow it).
    size_t kept = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      Active& a = *running_[i];
      if (a.prefill_done && a.generated >= reqs_[a.idx].output_tokens) {
        reserved_ -= a.reservation;
        unpin(a);
        // The prompt and the output, the last token aside (it has no K/V yet).
        save_blocks(a.idx, reqs_[a.idx].prompt_tokens + reqs_[a.idx].output_tokens - 1);
        used_ -= a.kv_used;
        ++done_;
        finished_now_.push_back(a.idx);
      } else {
        running_[kept++] = std::move(running_[i]);
      }
    }
    running_.resize(kept);
  }
};

// The clients of a run (ServingConfig::clients): open loop (0), each request sent at its arrival;
// closed loop (n > 0), at its arrival or, when all n are busy, as the first of them is free again.
class Clients {
 public:
  explicit Clients(int64_t n) : n_(n) {
    for (int64_t i = 0; i < n; ++i) free_.push(0.0);
  }
  // When `r`, the next request, is sent (HUGE_VAL: every client busy, with no time to tell yet).
  double send_time(const ServingRequest& r) const {
    if (n_ == 0) return r.arrival_s;
    return free_.empty() ? HUGE_VAL : std::max(r.arrival_s, free_.top());
  }
  void take() {
    if (n_ > 0) free_.pop();
  }
  void release(double t) {
    if (n_ > 0) free_.push(t);
  }

 private:
  int64_t n_;
  std::priority_queue<double, std::vector<double>, std::greater<>> free_;
};

// The busy engine among `loops` whose clock is furthest behind (nullptr: none is busy).
inline EventLoop* furthest_behind(std::span<EventLoop* const> loops) {
  EventLoop* first = nullptr;
  for (EventLoop* l : loops)
    if (l->busy() && (!first || l->now() < first->now())) first = l;
  return first;
}

// Sends requests to engines as their clients send them, each at its arrival or, with `clients`
// > 0, when one of the clients is free (its last request finished), and steps the engines in time
// order: before a request is sent at t, every engine has run the iterations that start before t
// (an engine sees a request sent during an iteration at that iteration's end, as the server's
// scheduler does). `route(idx, t)` picks the engine of request idx sent at t. `on_finish(idx)`,
// when given, hears of each request as it finishes.
template <class Route>
void drive(std::span<EventLoop* const> loops, std::span<const ServingRequest> reqs, int64_t clients,
           Route route, const std::function<void(size_t)>& on_finish = {}) {
  Clients senders(clients);
  size_t next = 0;
  for (;;) {
    const double send = next < reqs.size() ? senders.send_time(reqs[next]) : HUGE_VAL;
    EventLoop* first = furthest_behind(loops);
    if (first && first->now() < send) {
      for (const size_t idx : first->step()) {
        senders.release(first->now());
        if (on_finish) on_finish(idx);
      }
      continue;
    }
    if (next >= reqs.size()) break;
    senders.take();
    loops[route(next, send)]->arrive(next, send);
    ++next;
  }
}

inline ServingRun EventLoop::run() {
  EventLoop* self = this;
  drive(std::span<EventLoop* const>(&self, 1), reqs_, cfg_.clients, [](size_t, double) { return size_t(0); });
  return result();
}

// random-drop: every request's prompt shorter before the model, then served unpruned (`plain`);
// restore_prompts gives the outcomes back the prompts as sent, the share of their pairs computed
// saying what was dropped.
struct DroppedPrompts {
  std::vector<ServingRequest> reqs;
  ServingMethod plain;
};
inline DroppedPrompts drop_prompts(const ServingMethod& m, std::span<const ServingRequest> reqs) {
  DroppedPrompts d{{reqs.begin(), reqs.end()}, m};
  for (ServingRequest& r : d.reqs)
    if (r.prompt_tokens >= 1) r.prompt_tokens = random_drop_kept(r.prompt_tokens, m.drop_share);
  d.plain.steps.clear();
  d.plain.revivals = {};
  return d;
}
inline void restore_prompts(ServingRun& run, std::span<const ServingRequest> reqs) {
  for (size_t i = 0; i < run.requests.size() && i < reqs.size(); ++i) {
    RequestOutcome& o = run.requests[i];
    o.prompt_tokens_computed_fraction *= double(o.prompt_tokens) / double(reqs[i].prompt_tokens);
    o.prompt_tokens = reqs[i].prompt_tokens;
  }
}

}  // namespace lp::sim::detail
