#include "sim/replay.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace lp::sim {

double Prediction::prefill_flops() const {
  double f = 0;
  for (const OpCost& o : prefill_ops) f += o.flops;
  return f;
}

nlohmann::ordered_json Memory::to_json() const {
  return {
      {"weights", weights}, {"kv", kv}, {"aux_cache", aux}, {"activations", activations}, {"total", total()}};
}

double Prediction::decode_step_mean_s() const {
  return decode_steps > 0 ? decode_s / double(decode_steps) : 0;
}

Op Prediction::prefill_bound_op() const {
  int best = 0;
  for (int i = 1; i < kNumOps; ++i)
    if (prefill_ops[size_t(i)].time_s > prefill_ops[size_t(best)].time_s) best = i;
  return Op(best);
}

namespace {
// The source layer target layer l reads.
int source_layer(int l, int Ls, int n_layer) {
  return std::min(Ls - 1, int((l + 0.5) * Ls / n_layer));
}
}  // namespace

trace::Header map_header(const trace::Header& h, int n_layer, int64_t prompt_tokens) {
  const int Ls = h.n_layer;
  if (prompt_tokens <= 0) prompt_tokens = h.prompt_tokens;
  if (n_layer == Ls && prompt_tokens == h.prompt_tokens) return h;
  if (n_layer < 1) fail("cannot map a trace onto {} layers", n_layer);
  trace::Header m = h;
  m.n_layer = n_layer;
  m.prompt_tokens = prompt_tokens;
  // random-drop: the tokens dropped in the same proportion to those the model saw.
  m.prompt_tokens_dropped =
      std::llround(double(h.prompt_tokens_dropped) * double(prompt_tokens) / double(h.prompt_tokens));
  m.model["n_layer"] = n_layer;
  // Pruning layers: a source pruning layer p becomes the target layer whose mapped source is p
  // (the last such layer, so the tokens leave where they did in relative depth).
  m.schedule_layers.clear();
  for (const auto& [pl, share] : h.schedule_layers) {
    int target = -1;
    for (int l = 0; l < n_layer; ++l)
      if (source_layer(l, Ls, n_layer) == pl) target = l;
    if (target < 0) target = std::min(n_layer - 1, int((pl + 0.5) * n_layer / Ls));
    if (m.schedule_layers.empty() || target > m.schedule_layers.back().first)
      m.schedule_layers.emplace_back(target, share);
  }
  return m;
}

trace::Step map_step(const trace::Header& h, const trace::Step& s, int n_layer, int64_t prompt_tokens) {
  const int Ls = h.n_layer;
  const int64_t Ns = h.prompt_tokens;
  if (prompt_tokens <= 0) prompt_tokens = Ns;
  if (n_layer == Ls && prompt_tokens == Ns) return s;
  if (n_layer < 1) fail("cannot map a trace onto {} layers", n_layer);
  const double r = double(prompt_tokens) / double(Ns);
  const auto scale = [](int64_t v, double f) { return int64_t(std::llround(double(v) * f)); };
  trace::Step o;
  o.kind = s.kind;
  const bool prefill = s.kind == "prefill";
  o.new_tokens = prefill ? prompt_tokens : s.new_tokens;
  // Prefill counts are shares of the prompt; a decoding step's one new row stays one row and
  // its other counts (keys seen, revived rows) scale with the context.
  const auto rows = [&](int64_t v) {
    return prefill ? std::max<int64_t>(1, scale(v, r)) : std::max<int64_t>(1, 1 + scale(v - 1, r));
  };
  for (int l = 0; l < n_layer; ++l) {
    const size_t k = size_t(source_layer(l, Ls, n_layer));
    o.queries.push_back(rows(s.queries[k]));
    o.keys.push_back(scale(s.keys[k], r));
    if (!s.attended.empty()) o.attended.push_back(scale(s.attended[k], r));
    o.pairs.push_back(scale(s.pairs[k], prefill ? r * r : r));
    o.revived.push_back(scale(s.revived[k], r));
    o.aux_reads.push_back(scale(s.aux_reads[k], r));
    o.aux_writes.push_back(scale(s.aux_writes[k], r));
  }
  return o;
}

trace::Trace map_trace(const trace::Trace& t, int n_layer, int64_t prompt_tokens) {
  if (prompt_tokens <= 0) prompt_tokens = t.header.prompt_tokens;
  if (n_layer == t.header.n_layer && prompt_tokens == t.header.prompt_tokens) return t;
  trace::Trace m;
  m.header = map_header(t.header, n_layer, prompt_tokens);
  m.steps.reserve(t.steps.size());
  for (const trace::Step& s : t.steps) m.steps.push_back(map_step(t.header, s, n_layer, prompt_tokens));
  return m;
}

ModelConfig expert_parallel(const ModelConfig& c, int ep, double imbalance, int dp, int tp) {
  check_range("--ep", ep, 1, 4096);
  check_range("--dp", dp, 1, 4096);
  if (!(imbalance == 0 || (std::isfinite(imbalance) && imbalance >= 1)))
    usage_fail("--moe-imbalance must be at least 1 (the busiest GPU's routed pairs over the mean), got {}",
               imbalance);
  if (ep == 1 && imbalance == 0 && dp == 1) return c;
  if (!c.moe())
    usage_fail("{}: the model has no experts (n_expert 0)",
               dp > 1 ? fmt::format("--dp {} (data-parallel attention around expert parallelism)", dp)
                      : fmt::format("--ep {}", ep));
  // Data-parallel attention spreads the experts over every GPU of the dp groups unless told.
  if (dp > 1 && ep == 1) {
    ep = dp * std::max(tp, 1);
    if (c.n_expert % ep != 0)
      usage_fail(
          "--dp {} x --tp {}: {} GPUs do not divide the model's {} experts (give --ep, a divisor of both)",
          dp, tp, ep, c.n_expert);
  }
  if (c.n_expert % ep != 0) usage_fail("--ep {} does not divide the model's {} experts", ep, c.n_expert);
  ModelConfig e = c;
  e.ep = ep;
  e.dp = dp;
  e.moe_imbalance = imbalance;
  return e;
}

ModelConfig tp_shard(const ModelConfig& c, int tp) {
  if (tp < 1) usage_fail("tensor parallelism needs at least 1 GPU, got {}", tp);
  const int gpus = tp * std::max(c.dp, 1);  // the GPUs the experts spread over
  if (c.ep > 1 && gpus % c.ep != 0) {
    if (c.dp > 1) usage_fail("--ep {} does not divide the {} GPUs of --dp x --tp", c.ep, gpus);
    usage_fail("--ep {} does not divide --tp {} (experts spread over the tensor-parallel GPUs)", c.ep, tp);
  }
  if (tp == 1 && c.dp <= 1) return c;
  const auto heads = [&](int h, const char* what) {
    if (h % tp != 0) usage_fail("{} GPUs of tensor parallelism do not divide the model's {} {}", tp, h, what);
    return h / tp;
  };
  const auto kv_heads = [&](int hkv) {
    if (hkv >= tp) return heads(hkv, "KV heads");
    if (tp % hkv != 0)
      usage_fail("{} GPUs of tensor parallelism are not a multiple of the model's {} KV heads", tp, hkv);
    return 1;
  };
  ModelConfig s = c;
  s.n_head = heads(c.n_head, "attention heads");
  s.n_head_kv = kv_heads(c.n_head_kv);
  s.n_ff = heads(c.n_ff, "FFN width");
  // Each expert's width split as a dense FFN's is (vLLM's tensor-parallel MoE), or under expert
  // parallelism the experts spread whole over ep GPUs and each split tp/ep ways; the router, and
  // latent attention's latent and its K/V cache, are whole on every GPU.
  if (c.moe()) {
    if (c.ep > 1) {  // ep divides the GPUs: checked above
      s.n_expert = c.n_expert / c.ep;
      const int split = gpus / c.ep;
      if (c.n_ff_exp % split != 0)
        usage_fail("{} GPUs an expert do not divide the expert FFN width {}", split, c.n_ff_exp);
      s.n_ff_exp = c.n_ff_exp / split;
    } else {
      s.n_ff_exp = heads(c.n_ff_exp, "expert FFN width");
    }
  }
  if (c.n_expert_shared > 0) s.n_ff_shexp = heads(c.n_ff_shexp, "shared expert FFN width");
  s.n_vocab = (c.n_vocab + tp - 1) / tp;
  for (int& h : s.layer_n_head) h = heads(h, "attention heads (a layer)");
  for (int& h : s.layer_n_head_kv) h = kv_heads(h);
  for (int& f : s.layer_n_ff) f = heads(f, "FFN width (a layer)");
  return s;
}

void check_tp(const ModelConfig& c, const hw::Profile& hw, int tp) {
  if (tp < 1) usage_fail("tensor parallelism needs at least 1 GPU, got {}", tp);
  if (tp > hw.max_tp)
    usage_fail("tensor parallelism over {} GPUs is more than '{}' can host (max_tp {}{})", tp, hw.name,
               hw.max_tp, hw.kind == "cpu" ? ": a CPU profile" : "");
  tp_shard(c, tp);
  // Data-parallel groups beyond one node's GPUs need a network between nodes (alltoall_cost).
  if (c.dp > 1 && c.dp * tp > std::max(hw.max_tp, 1) && !(hw.scale_out_bandwidth > 0))
    usage_fail(
        "--dp {} x --tp {} spans {} GPUs, more than one node of '{}' ({}), which has no network between "
        "nodes (scale_out_bandwidth_gbs)",
        c.dp, tp, c.dp * tp, hw.name, hw.max_tp);
}

namespace {
OpCost collective(const hw::Profile& hw, int tp, double bytes, double steps) {
  OpCost r;
  if (tp <= 1) return r;
  const double n = tp;
  r.calls = 1;
  r.bytes = bytes;
  r.memory_s = steps * (n - 1) / n * bytes / (hw.interconnect_bandwidth * hw.interconnect_efficiency);
  r.overhead_s = steps * (n - 1) * hw.interconnect_latency;
  r.time_s = r.memory_s + r.overhead_s;
  return r;
}
}  // namespace

OpCost alltoall_cost(const hw::Profile& hw, int gpus, double bytes) {
  OpCost r;
  if (gpus <= 1 || bytes <= 0) return r;
  const int node = std::max(1, std::min(hw.max_tp, gpus));
  const double peers = gpus - 1, off = double(gpus - node) / peers;  // the peers on other nodes
  const double eff = hw.interconnect_efficiency;
  r.calls = 1;
  r.bytes = bytes;
  const double on_s = node > 1 ? (1 - off) * bytes / (hw.interconnect_bandwidth * eff) : 0;
  if (off > 0 && !(hw.scale_out_bandwidth > 0))
    usage_fail("'{}' has no network between nodes (scale_out_bandwidth_gbs) for {} GPUs of {} a node",
               hw.name, gpus, node);
  const double off_s = off > 0 ? off * bytes / (hw.scale_out_bandwidth * eff) : 0;
  r.memory_s = std::max(on_s, off_s);
  r.overhead_s = double(node - 1) * hw.interconnect_latency + (off > 0 ? hw.scale_out_latency : 0);
  r.time_s = r.memory_s + r.overhead_s;
  return r;
}

OpCost allreduce_cost(const hw::Profile& hw, int tp, double bytes) {
  return collective(hw, tp, bytes, 2);
}
OpCost allgather_cost(const hw::Profile& hw, int tp, double bytes) {
  return collective(hw, tp, bytes, 1);
}

namespace {
// Activation bytes of one layer over T rows: x, xn, tmp [T][D], qkv, attention output, gate/up
// and the SwiGLU output, at the activation element size.
double activation_bytes(const ModelConfig& c, int64_t T, double act_bytes) {
  // A MoE layer's FFN activations: each row's k experts and the shared ones.
  const double D = c.n_embd, F = c.moe() && T > 0
                                     ? routed_pairs(c, T) / double(T) * c.n_ff_exp + shared_ffn_width(c)
                                     : double(c.n_ff);
  return double(T) * (3 * D + double(qkv_outputs(c)) + c.v_dim() + 3 * F) * act_bytes;
}
}  // namespace

Replayer::Replayer(const trace::Header& h, const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                   int64_t batch, int tp, size_t keep_steps)
    : hw_(hw), c_(c), B_(batch), tp_(tp), keep_steps_(keep_steps), cc_(hw, p) {
  const std::optional<PolicyKind> kind = policy_in_file(h.policy);
  if (!kind) fail("the trace's policy '{}' is not one of {}", h.policy, kPolicyNames);
  traits_ = policy_traits(*kind);
  const int L = c.n_layer;
  if (batch < 1) fail("batch must be at least 1, got {}", batch);
  if (h.n_layer != L)
    fail("the trace has {} layers but the model has {} (map it onto the model first)", h.n_layer, L);
  check_tp(c, hw, tp);
  // One GPU's shape (the whole model for tp 1); the collectives use the full width D.
  g_ = tp_shard(c, tp);
  lc_.reserve(size_t(L));
  for (int l = 0; l < L; ++l) lc_.push_back(g_.uniform() ? g_ : g_.layer(l));
  prune_at_.assign(size_t(L), 0);
  for (const auto& [l, share] : h.schedule_layers)
    if (l >= 0 && l < L) {
      prune_at_[size_t(l)] = 1;
      if (first_prune_ < 0) first_prune_ = l;
    }
  prompt_tokens_ = h.prompt_tokens;
  dropped_ = h.prompt_tokens_dropped;
  // Recorded routing prices the experts when it is this model's (same experts, k a row) and no
  // imbalance was given (--moe-imbalance overrides what the run measured).
  const auto count = [&](const char* k) {
    return h.model.is_object() && h.model.contains(k) && h.model[k].is_number_integer()
               ? h.model[k].get<int64_t>()
               : int64_t(-1);
  };
  routes_ = c.moe() && c.moe_imbalance == 0 && count("n_expert") == c.n_expert &&
            count("n_expert_used") == c.n_expert_used;
  r_.hw = hw.name;
  r_.tp = tp;
  r_.prefill_layers.assign(size_t(L), OpCosts{});
}

std::vector<int> pipeline_starts(int n_layer, int stages) {
  if (stages < 1) usage_fail("--pp must be at least 1, got {}", stages);
  if (stages > n_layer) usage_fail("--pp {} is more stages than the model's {} layers", stages, n_layer);
  std::vector<int> starts;
  for (int k = 0, l = 0; k < stages; ++k) {
    starts.push_back(l);
    l += n_layer / stages + (k < n_layer % stages ? 1 : 0);
  }
  return starts;
}

void Replayer::set_pipeline(const Pipeline& p) {
  if (steps_ > 0) internal_fail("Replayer::set_pipeline after the first step");
  if (!(p.link_bytes_per_s > 0) || !(p.latency_s >= 0))
    usage_fail("the pipeline link needs a positive bandwidth and a latency of at least 0");
  stage_starts_ = pipeline_starts(c_.n_layer, p.stages);
  if (p.microbatches < 1) usage_fail("--pp-microbatches must be at least 1, got {}", p.microbatches);
  pipe_ = p;
  r_.pp = p.stages;
  r_.pp_microbatches = p.microbatches;
}

void Replayer::add(const trace::Step& s) {
  const int L = c_.n_layer;
  const int64_t B = B_;
  const OpDtypes& dt = cc_.dtypes;  // activations, the Aux Cache and collectives at elem_bytes (the engine's)
  const double D = c_.n_embd;
  for (const auto* v : {&s.queries, &s.keys, &s.pairs, &s.revived, &s.aux_reads, &s.aux_writes})
    if (int(v->size()) != L) fail("a trace step has {} layers, the model {}", v->size(), L);
  if (!s.attended.empty() && int(s.attended.size()) != L)
    fail("a trace step has {} layers of attended keys, the model {}", s.attended.size(), L);
  const bool prefill = s.kind == "prefill";
  Prediction& r = r_;
  OpCosts& sum = prefill ? r.prefill_ops : r.decode_ops;
  OpCost& comm = prefill ? r.prefill_comm : r.decode_comm;
  double step_s = 0;
  const auto reduce = [&](const OpCost& oc) {
    step_s += oc.time_s;
    comm.add(oc);
  };
  const auto op = [&](OpCosts* layer) {
    return [&sum, &step_s, layer](Op o, const OpCost& oc) {
      step_s += oc.time_s;
      sum[size_t(o)].add(oc);
      if (layer) (*layer)[size_t(o)].add(oc);
    };
  };
  if (prefill && pipe_.microbatches > 1 && stage_starts_.size() > 1) {
    step_s = chunked_prefill(s);
  } else {
    cost_embed(cc_, hw_, tp_, g_, B * s.new_tokens, D, op(nullptr), reduce);
    for (int l = 0; l < L; ++l) {
      const LayerWork w = layer_work(s, l, prefill);
      if (w.rows <= 0) continue;
      const ModelConfig& cfg = lc_[size_t(l)];
      cost_layer(cc_, hw_, tp_, cfg, D, w, op(prefill ? &r.prefill_layers[size_t(l)] : nullptr), reduce);
      peak_act_ = std::max(peak_act_, activation_bytes(cfg, w.rows, dt.elem_bytes));
    }
    cost_head(cc_, hw_, tp_, g_, B, double(c_.n_vocab), op(nullptr), reduce);
    // Pipeline stages: the rows entering each later stage handed over its link.
    for (size_t k = 1; k < stage_starts_.size(); ++k) {
      const OpCost hand = handoff_cost(
          pipe_, double(B * std::max<int64_t>(s.queries[size_t(stage_starts_[k])], 1)) * D * dt.elem_bytes);
      step_s += hand.time_s;
      (prefill ? r.prefill_pp : r.decode_pp).add(hand);
    }
    if (prefill) r.prefill_busy_s = step_s;
  }
  if (prefill) {
    r.ttft_s = step_s;
    // One Aux Cache entry per token (a token pruned again overwrites its entry, engine/session.h):
    // the prefill's writes are distinct tokens, and a decoding step writes only rows it revived,
    // which already hold an entry (its new token is never pruned in its own step, and computes
    // every layer). So the entries are the prefill's writes.
    for (int64_t w : s.aux_writes) aux_entries_ += double(w);
    r.prompt_tokens_computed_fraction = trace::prefill_computed_fraction(s, prompt_tokens_, dropped_);
  } else {
    ++r.decode_steps;
    r.decode_s += step_s;
    if (r.decode_step_s.size() < keep_steps_) r.decode_step_s.push_back(step_s);
  }
  r.total_s += step_s;
  last_keys_ = s.keys;
  ++steps_;
}

LayerWork Replayer::layer_work(const trace::Step& s, int l, bool prefill) const {
  const int64_t B = B_;
  LayerWork w;
  const int64_t T = B * s.queries[size_t(l)];
  if (T <= 0) return w;
  // Keys attended: a prefill layer's cache is exactly its computed tokens; a decoding step
  // sees its active set, as the trace records it (a trace without `attended`: at most the
  // keys held and at most its pairs, an over-count once revived rows add their pairs).
  const int64_t seq_keys = prefill ? s.keys[size_t(l)]
                                   : (s.attended.empty() ? std::min(s.keys[size_t(l)], s.pairs[size_t(l)])
                                                         : s.attended[size_t(l)]);
  const int64_t keys = B * seq_keys;
  if (prefill)
    w = {T, B * s.pairs[size_t(l)], keys};
  else  // a listed set where the trace says the step attended fewer keys than the layer held
    add_decoding(w, s.queries[size_t(l)], s.attended.empty() ? seq_keys : s.keys[size_t(l)], seq_keys,
                 s.pairs[size_t(l)], cc_.listed_attention_own, B);
  // Scoring and selection as the policy's traits say (pruning/policy.h: the serving simulation
  // reads the same).
  const bool prunes_here = prune_at_[size_t(l)] && traits_.prunes;
  if (scores_at(traits_, prefill, l, prunes_here, first_prune_)) w.scorers = 1, w.score_keys = keys;
  if (prunes_here) w.selects = 1, w.select_keys = keys;
  // Rows moved: in prefill the active rows of a pruning layer that pruned (kept ones compacted,
  // pruned ones saved), in decoding the Aux Cache writes and reads.
  w.moved = prefill ? (s.aux_writes[size_t(l)] > 0 ? T : 0)
                    : B * (s.aux_writes[size_t(l)] + s.aux_reads[size_t(l)]);
  if (routes_ && s.routes && size_t(l) < s.routes->size() && lc_[size_t(l)].moe())
    routed_work((*s.routes)[size_t(l)], s.queries[size_t(l)], w);
  return w;
}

double Replayer::chunked_prefill(const trace::Step& s) {
  // The prompt's rows at every layer split into M chunks of consecutive tokens (chunk c: rows
  // [q c / M, q (c + 1) / M) of the layer's q), chunk c's queries attending the keys up to its last
  // row: its share of the layer's pairs is the causal (or windowed) pairs of those rows over the
  // whole's, its keys the cache up to its end. The layers are cut into parts, each within one stage
  // and between two barriers; a stage runs its chunks in order, a chunk enters the next stage when
  // the previous stage is done with it and the hand-off has arrived. A layer that selects (prunes)
  // is a barrier: the selection reads the last token's scores, so every chunk waits there for the
  // last, and the kept rows go on as M new chunks. The embedding runs per chunk on the first stage,
  // the LM head (the last row) after the last chunk on the last stage; recorded expert routes are
  // not split (a chunk's routing is the expected one).
  const int L = c_.n_layer, M = pipe_.microbatches;
  const int64_t B = B_;
  const OpDtypes& dt = cc_.dtypes;
  const double D = c_.n_embd;
  Prediction& r = r_;
  const auto stage_of = [&](int l) {
    return size_t(std::upper_bound(stage_starts_.begin(), stage_starts_.end(), l) - stage_starts_.begin() -
                  1);
  };
  std::vector<double> done(size_t(M), 0.0), part(size_t(M), 0.0);
  std::vector<double> stage_free(stage_starts_.size(), 0.0);
  double busy = 0;
  const auto add_op = [&](double* t, OpCosts* layer) {
    return [this, t, layer, &busy](Op o, const OpCost& oc) {
      *t += oc.time_s, busy += oc.time_s;
      r_.prefill_ops[size_t(o)].add(oc);
      if (layer) (*layer)[size_t(o)].add(oc);
    };
  };
  const auto add_comm = [&](double* t) {
    return
        [this, t, &busy](const OpCost& oc) { *t += oc.time_s, busy += oc.time_s, r_.prefill_comm.add(oc); };
  };
  // Chunk c's share of a layer's rows (q of them per sequence).
  const auto bounds = [&](int64_t q, int c) { return std::pair{q * c / M, q * (c + 1) / M}; };
  // Runs the part [from, to) of the layers (one stage, no barrier inside) for every chunk.
  const auto run_part = [&](int from, int to, bool first, bool last) {
    const size_t k = stage_of(from);
    std::fill(part.begin(), part.end(), 0.0);
    if (first)
      for (int c = 0; c < M; ++c) {
        const auto [a, b] = bounds(s.new_tokens, c);
        double* t = &part[size_t(c)];
        cost_embed(cc_, hw_, tp_, g_, B * (b - a), D, add_op(t, nullptr), add_comm(t));
      }
    for (int l = from; l < to; ++l) {
      const LayerWork whole = layer_work(s, l, true);
      const int64_t q = s.queries[size_t(l)];
      if (whole.rows <= 0) continue;
      const ModelConfig& cfg = lc_[size_t(l)];
      const double all = double(c_.dense_pairs(l, q));
      for (int c = 0; c < M; ++c) {
        const auto [a, b] = bounds(q, c);
        if (b <= a) continue;
        const double share = all > 0 ? double(c_.dense_pairs(l, b) - c_.dense_pairs(l, a)) / all : 0.0;
        LayerWork w;
        w.rows = B * (b - a);
        w.pairs = int64_t(std::llround(double(whole.pairs) * share));
        w.keys = int64_t(std::llround(double(whole.keys) * double(b) / double(q)));
        if (c == M - 1)  // the last token's row scores and selects
          w.scorers = whole.scorers, w.score_keys = whole.score_keys, w.selects = whole.selects,
          w.select_keys = whole.select_keys;
        w.moved = whole.moved > 0 ? w.rows : 0;
        double* t = &part[size_t(c)];
        cost_layer(cc_, hw_, tp_, cfg, D, w, add_op(t, &r.prefill_layers[size_t(l)]), add_comm(t));
        peak_act_ = std::max(peak_act_, activation_bytes(cfg, w.rows, dt.elem_bytes));
      }
    }
    if (last) {
      double* t = &part[size_t(M - 1)];
      cost_head(cc_, hw_, tp_, g_, B, double(c_.n_vocab), add_op(t, nullptr), add_comm(t));
    }
    // Into stage k: the hand-off where the part opens a later stage, then in chunk order.
    const bool enters = k > 0 && from == stage_starts_[k];
    double free = stage_free[k];
    for (int c = 0; c < M; ++c) {
      double arrive = done[size_t(c)];
      if (enters) {
        const auto [a, b] = bounds(std::max<int64_t>(s.queries[size_t(from)], 1), c);
        const OpCost hand = handoff_cost(pipe_, double(B * std::max<int64_t>(b - a, 1)) * D * dt.elem_bytes);
        arrive += hand.time_s, busy += hand.time_s;
        r.prefill_pp.add(hand);
      }
      free = std::max(free, arrive) + part[size_t(c)];
      done[size_t(c)] = free;
    }
    stage_free[k] = free;
  };
  int from = 0;
  for (int l = 0; l < L; ++l) {
    const bool barrier = prune_at_[size_t(l)] && traits_.prunes;
    const bool stage_ends = l + 1 == L || stage_of(l + 1) != stage_of(l);
    if (!barrier && !stage_ends) continue;
    run_part(from, l + 1, from == 0, l + 1 == L);
    if (barrier) std::fill(done.begin(), done.end(), *std::max_element(done.begin(), done.end()));
    from = l + 1;
  }
  r.prefill_busy_s = busy;
  return *std::max_element(done.begin(), done.end());
}

void Replayer::routed_work(const trace::Routes& r, int64_t rows, LayerWork& w) const {
  const int64_t k = c_.n_expert_used, E = c_.n_expert, ep = std::max(c_.ep, 1);
  if (int64_t(r.positions.size()) != rows || int64_t(r.experts.size()) != rows * k) return;  // mapped
  std::vector<int64_t> pairs(size_t(ep), 0), distinct(size_t(ep), 0);
  std::vector<char> seen(size_t(E), 0);
  for (const int32_t e : r.experts) {
    if (e < 0 || e >= E) return;
    const size_t g = size_t(e / (E / ep));  // expert parallelism: E / ep consecutive experts a GPU
    ++pairs[g];
    if (!seen[size_t(e)]) seen[size_t(e)] = 1, ++distinct[g];
  }
  const size_t busiest = size_t(std::max_element(pairs.begin(), pairs.end()) - pairs.begin());
  // Every sequence of the batch, and every data-parallel group, routed alike.
  w.routed = double(pairs[busiest]) * double(B_) * std::max(c_.dp, 1);
  w.experts = distinct[busiest];
  if (w.routed <= 0) w.routed = 0, w.experts = 0;
}

Prediction Replayer::finish() && {
  // Memory at the end: weights, the K/V each layer holds, the Aux Cache, the largest layer's
  // activations plus one row of logits.
  const OpDtypes& dt = cc_.dtypes;
  Prediction r = std::move(r_);
  r.memory.weights = weight_memory_bytes(g_, dt);
  const auto kv_of = [&](size_t l) {
    return double(B_ * c_.kv_kept(int(l), last_keys_[l])) * double(lc_[l].kv_token_elems()) * dt.kv_bytes;
  };
  for (size_t l = 0; l < last_keys_.size(); ++l) r.memory.kv += kv_of(l);
  if (stage_starts_.size() > 1 && !last_keys_.empty()) {
    // The fullest stage: its layers' weights and K/V, the embedding on the first, the final norm
    // and the LM head (a tied one a copy of the embedding) on the last.
    const double table = double(g_.n_vocab) * double(g_.n_embd) * dt.weight_bytes;
    double most = -1;
    for (size_t k = 0; k < stage_starts_.size(); ++k) {
      const int from = stage_starts_[k],
                to = k + 1 < stage_starts_.size() ? stage_starts_[k + 1] : c_.n_layer;
      double w = k == 0 ? table : 0, kv = 0;
      if (k + 1 == stage_starts_.size()) w += table + double(g_.n_embd) * dt.weight_bytes;
      for (int l = from; l < to; ++l) w += layer_weight_bytes(g_, l, dt), kv += kv_of(size_t(l));
      if (w + kv > most) most = w + kv, r.memory.weights = w, r.memory.kv = kv;
    }
  }
  const double aux_entries = steps_ > 0 ? std::min(aux_entries_, double(prompt_tokens_)) : 0;
  r.memory.aux = double(B_) * aux_entries * c_.n_embd * dt.elem_bytes;
  r.memory.activations = peak_act_ + double(B_) * c_.n_vocab * 4;
  return r;
}

Prediction replay_synthetic(const ModelConfig& c, const std::string& policy,
                            const std::vector<PruneStep>& steps, int64_t prompt_tokens, int64_t decode_steps,
                            const trace::Revivals& revivals, const hw::Profile& hw, const Precision& p,
                            int64_t batch, int tp, size_t keep_steps, double drop_share,
                            const Pipeline& pipe) {
  trace::SyntheticSteps gen(c, policy, steps, prompt_tokens, decode_steps, revivals, drop_share);
  Replayer r(gen.header(), c, hw, p, batch, tp, keep_steps);
  if (pipe.stages > 1) r.set_pipeline(pipe);
  for (trace::Step s; gen.next(s);) r.add(s);
  return std::move(r).finish();
}

Prediction replay(const trace::Trace& t, const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                  int64_t batch, int tp) {
  Replayer r(t.header, c, hw, p, batch, tp);
  for (const trace::Step& s : t.steps) r.add(s);
  return std::move(r).finish();
}

PairedReplay replay_beside_unpruned(const std::function<bool(trace::Step&)>& next, const trace::Header& src,
                                    const trace::Header& costed, bool map, const ModelConfig& c,
                                    const std::vector<hw::Profile>& hws, const Precision& p, int tp,
                                    size_t keep_steps, int64_t known_steps, const Pipeline& pipe) {
  const auto check_context = [&](int64_t decode_steps) {
    if (c.n_ctx_train > 0 && costed.prompt_tokens + decode_steps > c.n_ctx_train)
      fail("{} prompt tokens + {} decoding steps exceed the model's context of {} tokens",
           costed.prompt_tokens, decode_steps, c.n_ctx_train);
  };
  if (known_steps >= 0) check_context(known_steps);
  trace::SyntheticSteps base(c, "none", {}, costed.prompt_tokens + costed.prompt_tokens_dropped,
                             int64_t(1) << 40);
  std::vector<Replayer> pruned, unpruned;
  for (const hw::Profile& hw : hws) {
    pruned.emplace_back(costed, c, hw, p, 1, tp, keep_steps);
    unpruned.emplace_back(base.header(), c, hw, p, 1, tp, keep_steps);
    if (pipe.stages > 1) pruned.back().set_pipeline(pipe), unpruned.back().set_pipeline(pipe);
  }
  PairedReplay out;
  int64_t decode_steps = -1;
  for (trace::Step st, bs; next(st);) {
    if (map) st = map_step(src, st, c.n_layer, costed.prompt_tokens);
    base.next(bs);
    if (++decode_steps > 0 && known_steps < 0) check_context(decode_steps);
    for (Replayer& r : pruned) r.add(st);
    for (Replayer& r : unpruned) r.add(bs);
  }
  out.decode_steps = decode_steps;
  for (size_t i = 0; i < hws.size(); ++i)
    out.per_hw.push_back({std::move(pruned[i]).finish(), std::move(unpruned[i]).finish()});
  return out;
}

}  // namespace lp::sim
