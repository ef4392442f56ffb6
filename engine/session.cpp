#include "engine/session.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "engine/batch.h"
#include "kernels/cpu/backend.h"
#include "kernels/cpu/qgemm.h"
#include "model/error.h"

namespace lp {

void OpStat::add(const OpStat& o) {
  seconds += o.seconds;
  flops += o.flops;
  bytes += o.bytes;
  rows += o.rows;
  calls += o.calls;
}

void OpTimers::init(int layers, const OpDtypes& d) {
  n_layer = layers;
  dtypes = d;
  stat.assign(size_t(layers + 1) * kNumOps, OpStat{});
}

void OpTimers::add(int layer, Op op, double seconds, double fl, double by, double rows) {
  OpStat& st = stat[size_t(layer) * kNumOps + size_t(op)];
  st.seconds += seconds;
  st.flops += fl;
  st.bytes += by;
  st.rows += rows;
  ++st.calls;
}

void OpTimers::add(const OpTimers& o) {
  if (o.empty()) return;
  if (empty()) init(o.n_layer, o.dtypes);
  if (o.stat.size() != stat.size()) internal_fail("adding op timers of {} layers to {}", o.n_layer, n_layer);
  for (size_t i = 0; i < stat.size(); ++i) stat[i].add(o.stat[i]);
}

OpStat OpTimers::total(Op op) const {
  OpStat t;
  if (!empty())
    for (int l = 0; l <= n_layer; ++l) t.add(at(l, op));
  return t;
}

double OpTimers::total_seconds() const {
  double s = 0;
  for (const OpStat& st : stat) s += st.seconds;
  return s;
}
double OpTimers::total_flops() const {
  double s = 0;
  for (const OpStat& st : stat) s += st.flops;
  return s;
}

void KvIndex::append(std::span<const int32_t> rows, int layer) {
  for (const int32_t p : rows) {
    if (p < 0) fail("negative position {}", p);
    if (find(p) >= 0) internal_fail("token at position {} computed twice at layer {}", p, layer);
    if (!pos.empty() && p < pos.back()) sorted = false;
    if (size_t(p) >= slot_of.size()) slot_of.resize(size_t(p) + 1, -1);
    slot_of[size_t(p)] = int32_t(pos.size());
    pos.push_back(p);
  }
}

std::vector<int32_t> KvIndex::slots_in_order() const {
  std::vector<int32_t> out;
  out.reserve(pos.size());
  if (sorted) {
    for (int64_t s = 0; s < n(); ++s) out.push_back(int32_t(s));
  } else {
    for (int32_t s : slot_of)
      if (s >= 0) out.push_back(s);
  }
  return out;
}

int64_t AuxCache::put(int32_t p, int32_t l) {
  if (const int64_t e = find(p); e >= 0) {
    layer[size_t(e)] = l;
    return e;
  }
  index[p] = size();
  pos.push_back(p);
  layer.push_back(l);
  return size() - 1;
}

RowMerge AuxCache::plan_revival(int l, std::vector<int32_t>& rows, const std::vector<int32_t>& revive) const {
  RowMerge plan;
  std::vector<int32_t> merged;
  merged.reserve(rows.size() + revive.size());
  size_t r = 0, v = 0;
  while (r < rows.size() || v < revive.size()) {
    const int64_t at = int64_t(merged.size());
    if (v < revive.size() && (r == rows.size() || revive[v] < rows[r])) {
      const int64_t e = find(revive[v]);
      if (e < 0 || layer[size_t(e)] != l)
        internal_fail("token at position {} has no K/V at layer {} and no Aux Cache state for it", revive[v],
                      l);
      plan.aux_src.push_back(e);
      plan.aux_dst.push_back(at);
      merged.push_back(revive[v++]);
    } else {
      plan.x_src.push_back(int64_t(r));
      plan.x_dst.push_back(at);
      merged.push_back(rows[r++]);
    }
  }
  rows.swap(merged);
  return plan;
}

Session::Session(const Model& m, std::unique_ptr<Backend> backend) : m_(m), be_(std::move(backend)) {
  kv_.resize(size_t(m.config().n_layer));
  aux_.width = m.config().n_embd;
}

Session::Session(CpuContext& ctx, const Model& m, int64_t n_ctx)
    : Session(m, std::make_unique<CpuBackend>(ctx, m.config(), m.weights(), n_ctx)) {}

void Session::reset() {
  clean_steps_ = 0;
  defer_after_ = 1;
  for (auto& kv : kv_) kv = KvIndex{};
  aux_ = AuxCache{};
  aux_.width = m_.config().n_embd;
  be_->reset();
}

int64_t Session::kv_bytes_used() const {
  const ModelConfig& c = m_.config();
  int64_t b = 0;
  const int64_t e = be_->kv_element_bytes();
  for (const auto& kv : kv_) b += kv.n() * c.n_head_kv * c.head_dim * 2 * e;  // K and V
  return b;
}

std::vector<float> Session::aux_state(int32_t p) {
  const int64_t e = aux_.find(p);
  if (e < 0) fail("token at position {} has no Aux Cache state", p);
  return be_->aux_state(e);
}

namespace {

OpDtypes dtypes_of(const Weights& w, int kv_element_bytes) {
  // GEMM inputs are rounded to the weights' dtype (8-bit blocks in int8 mode, whose weights count
  // their blocks' bytes); the KV cache holds the backend's elements (the CPU's: f16 unless the
  // compute dtype is f32).
  const double kv = kv_element_bytes;
  if (w.dtype == DType::Int8) {
    OpDtypes d{w.gemm_bytes_per_weight(), double(sizeof(QActBlock)) / double(kQBlock), kv};
    const Matrix& head = w.lm_head();
    if (head.rows > 0) d.head_weight_bytes = double(head.bytes()) / double(head.rows * head.cols);
    return d;
  }
  const double b = w.dtype == DType::BF16 ? 2 : 4;
  return {b, b, kv};
}

// A trace step with every per-layer count zero and an empty detail (revived positions only for a
// decoding step).
void reset_stats(trace::Step* stats, int L, const char* kind, int64_t new_tokens, bool moe) {
  if (!stats) return;
  *stats = trace::Step{};
  stats->kind = kind;
  stats->new_tokens = new_tokens;
  stats->queries = stats->keys = stats->pairs = stats->attended = stats->revived = stats->aux_reads =
      stats->aux_writes = std::vector<int64_t>(size_t(L), 0);
  stats->pruning.emplace();
  if (stats->kind == "decode") stats->revived_positions.emplace(size_t(L));
  if (moe) stats->routes.emplace(size_t(L));
}

}  // namespace

template <class F>
void Session::timed(OpTimers* t, int layer, Op op, const OpShape& shape, F&& f) {
  if (!t) {
    f();
    return;
  }
  using Clock = std::chrono::steady_clock;
  if (be_->asynchronous()) be_->synchronize();
  const auto t0 = Clock::now();
  f();
  if (be_->asynchronous()) be_->synchronize();
  const ModelConfig& c = m_.config();
  t->add(layer, op, std::chrono::duration<double>(Clock::now() - t0).count(), op_flops(c, op, shape),
         op_bytes(c, op, shape, t->dtypes), double(shape.tokens));
}

void Session::revive(Pass& ps, int l) {
  if (!ps.decode || ps.deferred) return;  // deferred: settle() checks that there was nothing to revive
  // Active tokens without K/V here that are not rows yet come back from the Aux Cache, whose entry
  // is exactly this layer's input (a token leaves the rows only when it is pruned, and its state
  // is saved then).
  const KvIndex& kv = kv_[size_t(l)];
  std::vector<int32_t> revive;
  for (int32_t ap : ps.active)
    if (kv.find(ap) < 0 && ap != ps.new_pos && !std::binary_search(ps.rows.begin(), ps.rows.end(), ap))
      revive.push_back(ap);
  if (revive.empty()) return;
  ps.revived += int64_t(revive.size());
  timed(ps.timers, l, Op::Gather, OpShape{int64_t(revive.size()), 0, 0}, [&] {
    const RowMerge plan = aux_.plan_revival(l, ps.rows, revive);
    be_->merge_rows(plan, int64_t(ps.rows.size()));
  });
  if (ps.stats) {
    ps.stats->revived[size_t(l)] = ps.stats->aux_reads[size_t(l)] = int64_t(revive.size());  // one read each
    (*ps.stats->revived_positions)[size_t(l)] = std::move(revive);
  }
  ps.rows_changed = true;
}

void Session::rows_in(Pass& ps) {
  if (ps.rows_changed) be_->set_rows(ps.rows);
  ps.rows_changed = false;
}

void Session::row_op(Pass& ps, RowOp op, int l) {
  static constexpr Op kOp[] = {Op::AttnNorm, Op::FfnNorm, Op::PostNorm, Op::PostNorm,
                               Op::QKNorm,   Op::Rope,    Op::Residual, Op::SwiGLU};  // RowOp's order
  timed(ps.timers, l, kOp[int(op)], OpShape{int64_t(ps.rows.size()), 0, 0}, [&] { be_->row_op(op, l); });
}

// Layer l is the pass's next pruning step (prune() and reselect() select there).
bool Session::prunes_at(const Pass& ps, int l) const {
  return ps.prune && ps.prune->policy && ps.next_step < ps.prune->steps.size() &&
         ps.prune->steps[ps.next_step].layer == l;
}
// A decoding step's selection at pruning layer l deferred: one new row, nothing revived so far (so that
// undoing the step is undoing its row's K/V), a policy that keeps the top scores.
bool Session::defers_at(const Pass& ps, int l) const {
  return ps.may_defer && ps.revived == 0 && prunes_at(ps, l) && ps.prune->policy->keeps_top_scores() &&
         ps.prune->policy->needs_scores() && ps.rows.size() == 1 && ps.rows[0] == ps.new_pos;
}
// A forward pass's layer before its first pruning step whose scores the policy takes in
// (static-paper's observe(), in prune()).
bool Session::observes_at(const Pass& ps, int l) const {
  return ps.pruning && ps.next_step == 0 && !prunes_at(ps, l) && ps.prune->policy->observes(l);
}
// Whether the pass scores layer l after its attention: where it prunes with a policy that needs
// scores, or where the policy observes.
bool Session::scored(const Pass& ps, int l) const {
  return (prunes_at(ps, l) && ps.prune->policy->needs_scores()) || observes_at(ps, l);
}

void Session::index_kv(Pass& ps, int l) {
  kv_[size_t(l)].append(ps.rows, l);  // the (token, layer) pairs computed: at most once
}

// The rows' K/V are in the layer's cache (index_kv, then the backend's append); they attend to the keys at
// positions `active` (decode: ascending, all holding K/V once the rows are appended) or (forward) to every
// key the layer holds. Leaves the key slots in slots_ (for scoring).
void Session::attend(Pass& ps, int l) {
  attention_keys(ps, l);
  timed(ps.timers, l, Op::Attention, OpShape{int64_t(ps.rows.size()), ps.attn_pairs, ps.attn_keys},
        [&] { be_->attention(l, slots_, scored(ps, l)); });
}

void Session::attention_keys(Pass& ps, int l) {
  KvIndex& kv = kv_[size_t(l)];
  const std::span<const int32_t> rows = ps.rows;
  if (ps.deferred) {  // the keys are the backend's active set; settle() counts a window's pairs
    slots_.clear();
    be_->device_keys(l, ps.n_active);
    ps.attn_keys = ps.attn_pairs = ps.n_active;
    if (ps.stats) {
      ps.stats->queries[size_t(l)] = int64_t(rows.size());
      ps.stats->keys[size_t(l)] = kv.n();
      ps.stats->pairs[size_t(l)] = ps.stats->attended[size_t(l)] = ps.n_active;
    }
    return;
  }
  if (!ps.decode && ps.keyed_prefix) {  // an imported prefix, then the pass's rows
    keys_.assign(ps.prefix.begin(), ps.prefix.end());
    keys_.insert(keys_.end(), rows.begin(), rows.end());
  }
  const std::span<const int32_t> keys = ps.decode         ? std::span<const int32_t>(ps.active)
                                        : ps.keyed_prefix ? std::span<const int32_t>(keys_)
                                                          : std::span<const int32_t>{};
  const int64_t T = int64_t(rows.size());

  // The key set: every held key in order (the common case), or the listed positions' slots.
  slots_.clear();
  std::span<const int32_t> key_pos;
  if (!keys.empty()) {
    key_pos = keys;
    const bool all_held =
        kv.sorted && int64_t(keys.size()) == kv.n() && std::equal(keys.begin(), keys.end(), kv.pos.begin());
    if (!all_held) {
      slots_.resize(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        const int64_t sl = kv.find(keys[i]);
        if (sl < 0) internal_fail("token at position {} has no K/V at layer {}", keys[i], l);
        slots_[i] = int32_t(sl);
      }
    }
  } else {
    if (!kv.sorted) slots_ = kv.slots_in_order();
    key_pos_.resize(size_t(kv.n()));
    for (int64_t i = 0; i < kv.n(); ++i)
      key_pos_[size_t(i)] = kv.pos[size_t(slots_.empty() ? i : slots_[size_t(i)])];
    key_pos = key_pos_;
  }
  const int64_t n_keys = int64_t(key_pos.size());
  int64_t pairs = 0;  // each query sees the keys at or before its position (inside its window, if any)
  const int window = m_.config().window(l);
  for (int32_t p : rows) {
    pairs += std::upper_bound(key_pos.begin(), key_pos.end(), p) - key_pos.begin();
    if (window > 0)
      pairs -= std::upper_bound(key_pos.begin(), key_pos.end(), int64_t(p) - window,
                                [](int64_t a, int32_t b) { return a < b; }) -
               key_pos.begin();
  }
  ps.attn_pairs = pairs;
  ps.attn_keys = n_keys;
  if (ps.stats) {
    ps.stats->queries[size_t(l)] = T;
    ps.stats->keys[size_t(l)] = kv.n();
    ps.stats->pairs[size_t(l)] = pairs;
    ps.stats->attended[size_t(l)] = n_keys;
  }
}

void Session::route(Pass& ps, int l) {
  const int64_t T = int64_t(ps.rows.size());
  timed(ps.timers, l, Op::Router, OpShape{T, 0, 0}, [&] { be_->route(l); });
  routed(ps, l);
}

void Session::routed(Pass& ps, int l) {
  if (ps.stats && ps.stats->routes) {
    trace::Routes& r = (*ps.stats->routes)[size_t(l)];
    r.positions = ps.rows;
    if (be_->routes_deferred())
      ps.routes_pending.push_back(l);  // read after the pass's wait (settle), not in the middle of it
    else
      r.experts = be_->routes();
  }
}

void Session::experts(Pass& ps, int l) {
  const int64_t T = int64_t(ps.rows.size());
  OpShape shape{T, 0, 0};
  if (ps.timers) {  // the distinct experts the rows reach: the weights the op reads
    std::vector<int32_t> ids = be_->routes();
    std::sort(ids.begin(), ids.end());
    shape.experts = std::unique(ids.begin(), ids.end()) - ids.begin();
  }
  timed(ps.timers, l, Op::Experts, shape, [&] { be_->experts(l); });
}

void Session::matmul(Pass& ps, Proj p, int l) {
  static constexpr Op kOp[] = {Op::QKV, Op::OProj, Op::GateUp, Op::Down};  // Proj's order
  timed(ps.timers, l, kOp[int(p)], OpShape{int64_t(ps.rows.size()), 0, 0}, [&] { be_->matmul(p, l); });
}

std::span<const int32_t> Session::selection_keys(const Pass& ps) const {
  return ps.decode         ? std::span<const int32_t>(ps.active)
         : ps.keyed_prefix ? std::span<const int32_t>(keys_)
                           : std::span<const int32_t>(ps.rows);
}

void Session::queue_selection(Pass& ps, int l) {
  ps.selection_queued = false;
  if (defers_at(ps, l)) return;  // end_layer queues it, and nothing waits
  if (!prunes_at(ps, l) || (!ps.decode && !ps.pruning) || ps.timers) return;
  PruningPolicy& policy = *ps.prune->policy;
  if (!policy.keeps_top_scores() || !policy.needs_scores()) return;
  const std::span<const int32_t> keys = selection_keys(ps);
  const int64_t n_keep = tokens_kept(int64_t(keys.size()), ps.prune->steps[ps.next_step].share);
  be_->last_row_scores(l, slots_);
  be_->select_queue(keys, n_keep);
  ps.selection_queued = true;
}

std::vector<int64_t> Session::select(int l, std::span<const int32_t> keys, double share,
                                     PruningPolicy& policy, OpTimers* t, trace::Step* stats, bool queued) {
  Backend& b = *be_;
  const int64_t n = int64_t(keys.size()), n_keep = tokens_kept(n, share);
  // A policy that keeps the top scores selects where the scores are; the others read them back.
  const bool on_backend = policy.keeps_top_scores();
  std::vector<float> scores;
  if (policy.needs_scores() && !queued) {
    // The scoring row is the last row: the newest token, which sees every key.
    timed(t, l, Op::Score, OpShape{1, 0, n}, [&] { b.last_row_scores(l, slots_); });
    if (!on_backend) scores = b.scores(n);
  }
  std::vector<int64_t> keep;
  timed(t, l, Op::Select, OpShape{0, 0, n},
        [&] { keep = on_backend ? b.select_top(keys, n_keep) : policy.select(l, keys, scores, n_keep); });
  // A trace's scores read after the selection: a GPU copies them back behind it, in its one wait.
  if (stats && on_backend && policy.needs_scores()) scores = b.scores(n);
  if (keep.empty() || keep.back() != n - 1) fail("pruning policy dropped the last token");
  if (stats) stats->pruning->push_back({l, {}, std::move(scores)});  // kept: once the caller knows it
  return keep;
}

Session::Pass Session::begin_forward(std::span<const int32_t> ids, std::span<const int32_t> pos,
                                     std::span<const int64_t> logit_rows, const PruneRequest* prune,
                                     trace::Step* stats, OpTimers* timers) {
  const ModelConfig& c = m_.config();
  Backend& b = *be_;
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("forward: no tokens");
  if (pos.size() != ids.size()) fail("forward: {} ids but {} positions", ids.size(), pos.size());
  if (n_cached() + T > n_ctx())
    fail("context full: {} cached + {} new tokens exceed the context size {}", n_cached(), T, n_ctx());
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= c.n_vocab)
      fail("token id {} is outside the vocabulary [0, {})", ids[t], c.n_vocab);
    if (pos[t] < 0) fail("forward: negative position {}", pos[t]);
    if (t > 0 && pos[t] <= pos[t - 1]) fail("forward: positions must be strictly increasing");
  }
  for (int64_t r : logit_rows)
    if (r < 0 || r >= T) fail("forward: logit row {} out of range", r);
  Pass ps;
  ps.pruning = prune && prune->policy && !prune->steps.empty();
  if (ps.pruning) {
    if (n_cached() != 0) fail("forward: pruning needs an empty cache (a prefill)");
    if (logit_rows.size() != 1 || logit_rows[0] != T - 1)
      fail("forward: with pruning only the last row can have logits");
    for (size_t i = 0; i < prune->steps.size(); ++i)
      if (prune->steps[i].layer < 0 || prune->steps[i].layer >= c.n_layer ||
          (i > 0 && prune->steps[i].layer <= prune->steps[i - 1].layer))
        fail("forward: pruning layers must be increasing and inside the model");
    ps.prune = prune;
  }
  if (timers && timers->empty())
    timers->init(c.n_layer, dtypes_of(m_.weights(), int(be_->kv_element_bytes())));
  reset_stats(stats, c.n_layer, n_cached() == 0 ? "prefill" : "decode", T, c.moe());
  ps.stats = stats;
  ps.timers = timers;
  ps.logit_rows.assign(logit_rows.begin(), logit_rows.end());

  // The active rows: backend row i holds the token at rows[i]. Pruning only removes rows, so
  // positions stay ascending; with pruning the last row is the last token throughout.
  ps.rows.assign(pos.begin(), pos.end());
  b.set_rows(ps.rows);
  ps.rows_changed = false;
  timed(timers, c.n_layer, Op::Embed, OpShape{T, 0, 0}, [&] { b.embed(ids); });
  return ps;
}

Session::Pass Session::begin_decode(int32_t id, int32_t p, const PruneRequest* prune_or_null,
                                    trace::Step* stats, OpTimers* timers) {
  if (!prune_or_null) {  // unpruned: the new row, with logits, over every cached token
    const int64_t row = 0;
    return begin_forward({&id, 1}, {&p, 1}, {&row, 1}, nullptr, stats, timers);
  }
  return begin_extend({&id, 1}, {&p, 1}, *prune_or_null, stats, timers);
}

Session::Pass Session::begin_extend(std::span<const int32_t> ids, std::span<const int32_t> pos,
                                    const PruneRequest& prune, trace::Step* stats, OpTimers* timers) {
  const ModelConfig& c = m_.config();
  Backend& b = *be_;
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("decoding: no tokens");
  if (pos.size() != ids.size()) fail("decoding: {} ids but {} positions", ids.size(), pos.size());
  for (const int32_t id : ids)
    if (id < 0 || id >= c.n_vocab) fail("token id {} is outside the vocabulary [0, {})", id, c.n_vocab);
  if (!prune.policy) fail("decode_step: no pruning policy");
  if (n_cached() + T > n_ctx())
    fail("context full: {} cached + {} new tokens exceed {}", n_cached(), T, n_ctx());
  // Layer 0 holds every token in position order (nothing is pruned before it).
  const KvIndex& kv0 = kv_[0];
  for (int64_t t = 0; t < T; ++t)
    if (pos[t] < 0 || (t == 0 && kv0.n() > 0 && pos[t] <= kv0.pos.back()) || (t > 0 && pos[t] <= pos[t - 1]))
      fail("decode_step: position must be new");
  if (timers && timers->empty())
    timers->init(c.n_layer, dtypes_of(m_.weights(), int(be_->kv_element_bytes())));
  reset_stats(stats, c.n_layer, "decode", T, c.moe());

  Pass ps;
  ps.decode = true;
  ps.new_pos = pos.back();
  ps.prune = &prune;
  ps.stats = stats;
  ps.timers = timers;
  // The step's active set (positions, ascending): every token, the new ones last.
  ps.active.assign(kv0.pos.begin(), kv0.pos.end());
  ps.active.insert(ps.active.end(), pos.begin(), pos.end());
  // Rows computed in this step (ascending positions, the last new token last); backend row i
  // holds rows[i].
  ps.rows.assign(pos.begin(), pos.end());
  ps.ids.assign(ids.begin(), ids.end());
  ps.may_defer = clean_steps_ >= defer_after_ && T == 1 && !timers && b.defers_selection();
  b.set_rows(ps.rows);
  ps.rows_changed = false;
  timed(timers, c.n_layer, Op::Embed, OpShape{T, 0, 0}, [&] { b.embed(ids); });
  return ps;
}

void Session::end_layer(Pass& ps, int l) {
  if (ps.decode)
    reselect(ps, l);
  else
    prune(ps, l);
  ps.selection_queued = false;
}

void Session::compact_rows(Pass& ps, int l, std::span<const RowFate> fate) {
  std::vector<int64_t> stay, leave, entries;
  std::vector<int32_t> next;
  for (size_t r = 0; r < fate.size(); ++r) {
    const int32_t p = ps.rows[r];
    if (fate[r] == RowFate::Stay) {
      stay.push_back(int64_t(r));
      next.push_back(p);
    } else if (fate[r] == RowFate::Save) {
      leave.push_back(int64_t(r));
      entries.push_back(aux_.put(p, l + 1));
    }
  }
  be_->aux_store(leave, entries);
  if (stay.size() < fate.size()) {
    be_->gather_rows(stay);
    ps.rows_changed = true;
  }
  if (ps.stats) ps.stats->aux_writes[size_t(l)] += int64_t(leave.size());
  ps.rows.swap(next);
}

void Session::prune(Pass& ps, int l) {
  Backend& b = *be_;
  const std::vector<int32_t>& rows = ps.rows;
  const int64_t Tl = int64_t(rows.size());
  trace::Step* stats = ps.stats;
  OpTimers* timers = ps.timers;
  if (observes_at(ps, l)) {
    // A layer before the first pruning layer whose scores the policy takes in (static-paper).
    const std::span<const int32_t> keys =
        ps.keyed_prefix ? std::span<const int32_t>(keys_) : std::span<const int32_t>(rows);
    const int64_t n = int64_t(keys.size());
    timed(timers, l, Op::Score, OpShape{1, 0, n}, [&] { b.last_row_scores(l, slots_); });
    const std::vector<float> scores = b.scores(n);
    ps.prune->policy->observe(l, keys, scores);
  }
  if (!ps.pruning || !prunes_at(ps, l)) return;
  // A pruning layer: the keys here are exactly the active rows (the cache started empty), after
  // the active imported prefix if there is one (attend's key set), and the last row's attention
  // over them scores them. Kept prefix positions stay keys; dropped ones are not attended again.
  const int64_t np = int64_t(ps.prefix.size());
  std::vector<int64_t> keep = select(l, selection_keys(ps), ps.prune->steps[ps.next_step++].share,
                                     *ps.prune->policy, timers, stats, ps.selection_queued);
  if (np > 0) {
    std::vector<int32_t> prefix;
    size_t own = 0;
    for (; own < keep.size() && keep[own] < np; ++own) prefix.push_back(ps.prefix[size_t(keep[own])]);
    ps.prefix.swap(prefix);
    keep.erase(keep.begin(), keep.begin() + std::ptrdiff_t(own));
    for (int64_t& k : keep) k -= np;
  }
  if (stats && ps.keyed_prefix) {  // the trace's kept positions: the prefix's and the rows'
    std::vector<int32_t> kept = ps.prefix;
    for (int64_t k : keep) kept.push_back(rows[size_t(k)]);
    stats->pruning->back().kept = std::move(kept);
  }
  if (int64_t(keep.size()) < Tl) {
    // Pruned rows: their hidden state (the input of layer l + 1, where they have no K/V) goes to
    // the Aux Cache; the kept rows stay, in order.
    std::vector<RowFate> fate(size_t(Tl), RowFate::Save);
    for (int64_t k : keep) fate[size_t(k)] = RowFate::Stay;
    timed(timers, l, Op::Gather, OpShape{Tl, 0, 0}, [&] { compact_rows(ps, l, fate); });
  }
  if (stats && !ps.keyed_prefix) stats->pruning->back().kept = ps.rows;
}

void Session::defer_selection(Pass& ps, int l) {
  const std::span<const PruneStep> steps = ps.prune->steps;
  const int64_t n = ps.deferred ? ps.n_active : int64_t(ps.active.size());
  if (!ps.deferred) {  // the log's room: every selection left in the step
    int64_t kept = 0, scores = 0, m = n;
    for (size_t j = ps.next_step; j < steps.size(); ++j) {
      scores += m;
      m = tokens_kept(m, steps[j].share);
      kept += m;
    }
    be_->deferred_log(kept, ps.stats ? scores : 0);
  }
  Pass::Deferral d;
  d.layer = l;
  d.n = n;
  d.n_keep = tokens_kept(n, steps[ps.next_step++].share);
  d.kept_at = ps.log_kept;
  d.scores_at = ps.stats ? ps.log_scores : -1;
  be_->last_row_scores(l, slots_);  // the keys attention_keys chose (the backend's, once deferred)
  be_->select_deferred(ps.deferred ? std::span<const int32_t>{} : std::span<const int32_t>(ps.active), n,
                       d.n_keep, d.kept_at, d.scores_at);
  ps.log_kept += d.n_keep;
  if (ps.stats) {
    ps.log_scores += n;
    d.trace_entry = ps.stats->pruning->size();
    ps.stats->pruning->push_back({l, {}, {}});  // kept and scores: settle()
  }
  ps.deferrals.push_back(d);
  ps.deferred = true;
  ps.n_active = d.n_keep;
  // The one row, the new token, is always kept and has no K/V at the next layer: it stays.
}

bool Session::settle(Pass& ps, float* logits) {
  for (const int l : ps.routes_pending) (*ps.stats->routes)[size_t(l)].experts = be_->routes_of(l);
  ps.routes_pending.clear();
  if (!ps.decode) return false;
  if (!ps.deferred) {
    clean_steps_ = ps.revived == 0 && ps.ids.size() == 1 ? clean_steps_ + 1 : 0;
    return false;
  }
  const ModelConfig& c = m_.config();
  const int L = c.n_layer;
  // Each kept set against the layers that attended it, up to the next selection: every token but the
  // new one must have had K/V there (else the step should have revived it).
  std::vector<int32_t> active;
  bool missed = false;
  for (size_t k = 0; k < ps.deferrals.size() && !missed; ++k) {
    const Pass::Deferral& d = ps.deferrals[k];
    const std::span<const int32_t> kept = be_->deferred_kept(d.kept_at, d.n_keep);
    if (kept.empty() || kept.back() != ps.new_pos) fail("pruning policy dropped the last token");
    active.assign(kept.begin(), kept.end());
    const int last = k + 1 < ps.deferrals.size() ? ps.deferrals[k + 1].layer : L - 1;
    for (int l = d.layer + 1; l <= last && !missed; ++l) {
      const KvIndex& kv = kv_[size_t(l)];
      for (const int32_t p : active)
        if (p != ps.new_pos && kv.find(p) < 0) {
          missed = true;
          break;
        }
      const int window = c.window(l);
      if (ps.stats && window > 0)  // the new row sees the keys after new_pos - window
        ps.stats->pairs[size_t(l)] =
            active.end() - std::upper_bound(active.begin(), active.end(), int64_t(ps.new_pos) - window,
                                            [](int64_t a, int32_t b) { return a < b; });
    }
    if (ps.stats) {
      trace::Pruning& e = (*ps.stats->pruning)[d.trace_entry];
      e.kept = active;
      const std::span<const float> sc = be_->deferred_scores(d.scores_at, d.n);
      e.scores.assign(sc.begin(), sc.end());
    }
  }
  if (!missed) {
    ps.active = std::move(active);
    ++clean_steps_;
    ++deferred_;
    return false;
  }
  // A revival missed: the step undone (its one row's K/V at every layer: nothing else was written)
  // and computed again, waiting at its selections.
  ++redone_;
  defer_after_ = std::min(2 * defer_after_, kMaxDeferAfter);
  for (int l = 0; l < L; ++l) {
    KvIndex& kv = kv_[size_t(l)];
    if (kv.n() == 0 || kv.pos.back() != ps.new_pos) continue;
    kv.slot_of[size_t(ps.new_pos)] = -1;
    kv.pos.pop_back();
    be_->kv_truncate(l, kv.n());
  }
  const std::vector<int32_t> ids = ps.ids;
  ps = begin_extend(ids, {&ps.new_pos, 1}, *ps.prune, ps.stats, ps.timers);
  run_layers(BatchMember{this, &ps, logits});
  head(ps);
  lm_head(ps, logits);
  settle(ps, logits);
  return true;
}

void Session::reselect(Pass& ps, int l) {
  if (defers_at(ps, l)) return defer_selection(ps, l);
  const int L = m_.config().n_layer;
  const int64_t Tl = int64_t(ps.rows.size());
  const PruneRequest& prune = *ps.prune;
  const bool prune_here = prunes_at(ps, l);
  if (prune_here) {
    const std::vector<int64_t> keep = select(l, ps.active, prune.steps[ps.next_step++].share, *prune.policy,
                                             ps.timers, ps.stats, ps.selection_queued);
    std::vector<int32_t> kept;
    kept.reserve(keep.size());
    for (int64_t i : keep) kept.push_back(ps.active[size_t(i)]);
    ps.active.swap(kept);
    if (ps.stats) ps.stats->pruning->back().kept = ps.active;
  }
  // Rows not selected stop here; their state (the next layer's input) goes to the Aux Cache.
  // Rows that already have K/V at the next layer also stop: they are not recomputed there.
  timed(ps.timers, l, Op::Gather, OpShape{Tl, 0, 0}, [&] {
    std::vector<RowFate> fate(static_cast<size_t>(Tl));
    for (int64_t r = 0; r < Tl; ++r) {
      const int32_t rp = ps.rows[size_t(r)];
      const bool kept = !prune_here || std::binary_search(ps.active.begin(), ps.active.end(), rp);
      const bool next_has_kv = l + 1 < L && kv_[size_t(l + 1)].find(rp) >= 0;
      fate[size_t(r)] = kept && !next_has_kv ? RowFate::Stay
                        : !kept && l + 1 < L ? RowFate::Save
                                             : RowFate::Drop;
    }
    compact_rows(ps, l, fate);
  });
  if (ps.rows.empty() || ps.rows.back() != ps.new_pos) internal_fail("the new token left the step");
}

int64_t Session::head(Pass& ps) {
  const ModelConfig& c = m_.config();
  Backend& b = *be_;
  std::vector<int64_t> head;
  if (ps.decode) {
    head = {int64_t(ps.rows.size()) - 1};
  } else {
    head = ps.logit_rows;
    if (ps.pruning) head.assign(head.size(), int64_t(ps.rows.size()) - 1);
  }
  const int64_t R = int64_t(head.size());
  if (R == 0) {
    b.synchronize();
    return 0;
  }
  // Final norm and LM head only for the rows that need logits.
  // Every row in order (a decoding step's one row): the backend holds them already. On the GPU the
  // gather and the positions are two uploads, each of which waits for the step's layers.
  bool all_rows = R == b.rows();
  for (int64_t r = 0; all_rows && r < R; ++r) all_rows = head[size_t(r)] == r;
  if (!all_rows) {
    std::vector<int32_t> head_pos(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) head_pos[size_t(r)] = ps.rows[size_t(head[size_t(r)])];
    b.gather_rows(head);
    b.set_rows(head_pos);
  }
  timed(ps.timers, c.n_layer, Op::OutputNorm, OpShape{R, 0, 0}, [&] { b.rmsnorm(Norm::Output, c.n_layer); });
  return R;
}

void Session::lm_head(Pass& ps, float* logits) {
  // head() left the backend with exactly the rows that get logits.
  timed(ps.timers, m_.config().n_layer, Op::LmHead, OpShape{be_->rows(), 0, 0},
        [&] { be_->lm_head(logits); });
}

void Session::import_kv(int l, std::span<const int32_t> pos, std::span<const std::byte> rows, bool anywhere) {
  KvIndex& kv = kv_[size_t(l)];
  if (!anywhere && !pos.empty() && kv.n() > 0 && pos.front() <= kv.pos.back())
    fail("KV import at layer {}: position {} is not after the {} held", l, pos.front(), kv.n());
  be_->kv_import(l, pos, rows);
  kv.append(pos, l);
}

void Session::export_kv(int l, int64_t n, std::span<std::byte> out) {
  if (n > kv_[size_t(l)].n())
    fail("KV export at layer {}: {} tokens asked, {} held", l, n, kv_[size_t(l)].n());
  be_->kv_export(l, n, out);
}

int64_t Session::kv_token_bytes(int l) const {
  const ModelConfig& c = m_.config();
  const int64_t hkv = c.uniform() ? c.n_head_kv : c.layer(l).n_head_kv;
  return 2 * hkv * c.head_dim * be_->kv_element_bytes();
}

int64_t TokenStates::bytes() const {
  int64_t b = int64_t(depth.size() * sizeof(uint16_t) + aux.size() * sizeof(float));
  for (const auto& k : kv) b += int64_t(k.size());
  return b;
}

bool TokenStates::full(int n_layer) const {
  return std::all_of(depth.begin(), depth.end(), [n_layer](uint16_t d) { return d == n_layer; });
}

std::vector<uint16_t> Session::depths(int32_t first, int64_t n) const {
  const int L = m_.config().n_layer;
  std::vector<uint16_t> d(size_t(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i)
    while (d[size_t(i)] < L && kv_[d[size_t(i)]].find(first + int32_t(i)) >= 0) ++d[size_t(i)];
  return d;
}

std::optional<TokenStates> Session::save_states(int32_t first, int64_t n) {
  return std::move(save_blocks(first, n, 1).front());
}

std::vector<std::optional<TokenStates>> Session::save_blocks(int32_t first, int64_t block, int64_t count) {
  const int L = m_.config().n_layer;
  const int64_t D = m_.config().n_embd;
  if (first < 0 || block < 0 || count < 1 || first + block * count > n_cached())
    fail("saving tokens [{}, {}): the session holds {}", first, first + block * std::max<int64_t>(count, 0),
         n_cached());
  // Each block's depths and Aux Cache entries, or nullopt where a token is not held as a depth.
  std::vector<std::optional<TokenStates>> out(static_cast<size_t>(count));
  std::vector<std::vector<int64_t>> entries(static_cast<size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    TokenStates st;
    st.first = first + int32_t(b * block);
    st.depth = depths(st.first, block);
    bool held = true;
    for (int64_t i = 0; i < block && held; ++i) {
      const int32_t p = st.first + int32_t(i);
      const int d = st.depth[size_t(i)];
      held = d > 0;
      for (int l = d + 1; l < L && held; ++l) held = kv_[size_t(l)].find(p) < 0;  // a gap: not a depth
      if (held && d < L) {
        const int64_t e = aux_.find(p);
        held = e >= 0 && aux_.layer[size_t(e)] == d;
        entries[size_t(b)].push_back(e);
      }
    }
    if (held) {
      st.kv.resize(size_t(L));
      out[size_t(b)] = std::move(st);
    }
  }
  // Each layer's K/V of every held block in one read (all of K, then all of V), then split by block.
  std::vector<int32_t> slots;
  std::vector<int64_t> rows(static_cast<size_t>(count));
  std::vector<std::byte> kv;
  for (int l = 0; l < L; ++l) {
    slots.clear();
    for (int64_t b = 0; b < count; ++b) {
      if (!out[size_t(b)]) continue;
      const TokenStates& st = *out[size_t(b)];
      const size_t before = slots.size();
      for (int64_t i = 0; i < block; ++i)
        if (st.depth[size_t(i)] > l) slots.push_back(int32_t(kv_[size_t(l)].find(st.first + int32_t(i))));
      rows[size_t(b)] = int64_t(slots.size() - before);
    }
    const size_t half = slots.size() * size_t(kv_token_bytes(l)) / 2;
    kv.resize(2 * half);
    be_->kv_read(l, slots, kv);
    size_t at = 0;
    for (int64_t b = 0; b < count; ++b) {
      if (!out[size_t(b)]) continue;
      const size_t h = size_t(rows[size_t(b)]) * size_t(kv_token_bytes(l)) / 2;
      std::vector<std::byte>& mine = out[size_t(b)]->kv[size_t(l)];
      mine.assign(kv.begin() + std::ptrdiff_t(at), kv.begin() + std::ptrdiff_t(at + h));
      mine.insert(mine.end(), kv.begin() + std::ptrdiff_t(half + at),
                  kv.begin() + std::ptrdiff_t(half + at + h));
      at += h;
    }
  }
  // The Aux Cache states of every held block in one read, split the same way.
  std::vector<int64_t> all;
  for (int64_t b = 0; b < count; ++b)
    if (out[size_t(b)]) all.insert(all.end(), entries[size_t(b)].begin(), entries[size_t(b)].end());
  std::vector<float> aux(all.size() * size_t(D));
  be_->aux_read(all, aux);
  size_t at = 0;
  for (int64_t b = 0; b < count; ++b) {
    if (!out[size_t(b)]) continue;
    const size_t n = entries[size_t(b)].size() * size_t(D);
    out[size_t(b)]->aux.assign(aux.begin() + std::ptrdiff_t(at), aux.begin() + std::ptrdiff_t(at + n));
    at += n;
  }
  return out;
}

void Session::load_states(std::span<const TokenStates* const> blocks) {
  const int L = m_.config().n_layer;
  if (n_cached() != 0 || aux_.size() != 0) fail("loading a prefix into a session that holds tokens");
  int32_t next = 0;
  for (const TokenStates* b : blocks) {
    if (b->first != next) fail("loading a prefix: a block starts at {}, not {}", b->first, next);
    if (int(b->kv.size()) != L) fail("loading a prefix: a block of {} layers for {}", b->kv.size(), L);
    next += int32_t(b->n());
  }
  std::vector<int32_t> pos;
  std::vector<std::byte> rows;
  for (int l = 0; l < L; ++l) {
    pos.clear();
    for (const TokenStates* b : blocks)
      for (int64_t i = 0; i < b->n(); ++i)
        if (b->depth[size_t(i)] > l) pos.push_back(b->first + int32_t(i));
    const size_t half = pos.size() * size_t(kv_token_bytes(l)) / 2;  // all of K, then all of V
    rows.resize(2 * half);
    size_t k = 0, v = half;
    for (const TokenStates* b : blocks) {
      const std::vector<std::byte>& kv = b->kv[size_t(l)];
      const size_t h = kv.size() / 2;
      if (k + h > half) fail("loading a prefix: layer {} holds more K/V than its tokens' depths say", l);
      std::copy_n(kv.begin(), h, rows.begin() + std::ptrdiff_t(k));
      std::copy_n(kv.begin() + std::ptrdiff_t(h), h, rows.begin() + std::ptrdiff_t(v));
      k += h;
      v += h;
    }
    if (k != half) fail("loading a prefix: layer {} holds less K/V than its tokens' depths say", l);
    import_kv(l, pos, rows);
  }
  std::vector<int64_t> entries;
  std::vector<float> states;
  const int64_t D = m_.config().n_embd;
  for (const TokenStates* b : blocks) {
    for (int64_t i = 0; i < b->n(); ++i)
      if (b->depth[size_t(i)] < L) entries.push_back(aux_.put(b->first + int32_t(i), b->depth[size_t(i)]));
    states.insert(states.end(), b->aux.begin(), b->aux.end());
  }
  if (int64_t(states.size()) != int64_t(entries.size()) * D)
    fail("loading a prefix: {} Aux Cache floats for {} states", states.size(), entries.size());
  be_->aux_load(entries, states);
}

void Session::forward(std::span<const int32_t> ids, std::span<const int32_t> pos,
                      std::span<const int64_t> logit_rows, float* logits, const PruneRequest* prune,
                      trace::Step* stats, OpTimers* timers) {
  Pass ps = begin_forward(ids, pos, logit_rows, prune, stats, timers);
  run_layers(BatchMember{this, &ps, logits});
  if (head(ps) > 0) lm_head(ps, logits);
  settle(ps, logits);
}

void Session::decode_step(int32_t id, int32_t p, float* logits, const PruneRequest* prune, trace::Step* stats,
                          OpTimers* timers) {
  Pass ps = begin_decode(id, p, prune, stats, timers);
  run_layers(BatchMember{this, &ps, logits});
  head(ps);
  lm_head(ps, logits);
  settle(ps, logits);
}

void Session::extend(std::span<const int32_t> ids, std::span<const int32_t> pos, float* logits,
                     const PruneRequest& prune, trace::Step* stats, OpTimers* timers) {
  Pass ps = begin_extend(ids, pos, prune, stats, timers);
  run_layers(BatchMember{this, &ps, logits});
  head(ps);
  lm_head(ps, logits);
  settle(ps, logits);
}

}  // namespace lp
