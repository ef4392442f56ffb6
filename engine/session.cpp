#include "engine/session.h"

#include <algorithm>
#include <chrono>
#include <numeric>

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
    if (find(p) >= 0) fail("internal error: token at position {} computed twice at layer {}", p, layer);
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
        fail("internal error: token at position {} has no K/V at layer {} and no Aux Cache state for it",
             revive[v], l);
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
  for (auto& kv : kv_) kv = KvIndex{};
  aux_ = AuxCache{};
  aux_.width = m_.config().n_embd;
  be_->reset();
}

int64_t Session::kv_bytes_used() const {
  const ModelConfig& c = m_.config();
  int64_t b = 0;
  for (const auto& kv : kv_) b += kv.n() * c.n_head_kv * c.head_dim * 2 * 4;  // f32 K and V
  return b;
}

std::vector<float> Session::aux_state(int32_t p) {
  const int64_t e = aux_.find(p);
  if (e < 0) fail("token at position {} has no Aux Cache state", p);
  return be_->aux_state(e);
}

namespace {

OpDtypes dtypes_of(const Weights& w) {
  // GEMM inputs are rounded to the weights' dtype (8-bit blocks in int8 mode, whose weights count
  // their blocks' bytes); the KV cache is f32.
  if (w.dtype == DType::Int8)
    return {w.gemm_bytes_per_weight(), double(sizeof(QActBlock)) / double(kQBlock), 4};
  const double b = w.dtype == DType::BF16 ? 2 : 4;
  return {b, b, 4};
}

// A trace step with every per-layer count zero and an empty detail (revived positions only for a
// decoding step).
void reset_stats(trace::Step* stats, int L, const char* kind, int64_t new_tokens) {
  if (!stats) return;
  *stats = trace::Step{};
  stats->kind = kind;
  stats->new_tokens = new_tokens;
  stats->queries = stats->keys = stats->pairs = stats->attended = stats->revived = stats->aux_reads =
      stats->aux_writes = std::vector<int64_t>(size_t(L), 0);
  stats->pruning.emplace();
  if (stats->kind == "decode") stats->revived_positions.emplace(size_t(L));
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

void Session::layer(int l, std::span<const int32_t> rows, std::span<const int32_t> keys, OpTimers* t,
                    trace::Step* stats) {
  Backend& b = *be_;
  KvIndex& kv = kv_[size_t(l)];
  const int64_t T = int64_t(rows.size());
  const OpShape shape{T, 0, 0};
  timed(t, l, Op::AttnNorm, shape, [&] { b.rmsnorm(Norm::Attn, l); });
  timed(t, l, Op::QKV, shape, [&] { b.matmul(Proj::QKV, l); });
  timed(t, l, Op::Rope, shape, [&] { b.rope(); });
  kv.append(rows, l);  // the (token, layer) pairs computed: at most once
  b.kv_append(l);      // untimed: the Attention op's bytes count this write

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
        if (sl < 0) fail("internal error: token at position {} has no K/V at layer {}", keys[i], l);
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
  int64_t pairs = 0;  // each query sees the keys at or before its position
  for (int32_t p : rows) pairs += std::upper_bound(key_pos.begin(), key_pos.end(), p) - key_pos.begin();
  timed(t, l, Op::Attention, OpShape{T, pairs, n_keys}, [&] { b.attention(l, slots_); });
  if (stats) {
    stats->queries[size_t(l)] = T;
    stats->keys[size_t(l)] = kv.n();
    stats->pairs[size_t(l)] = pairs;
    stats->attended[size_t(l)] = n_keys;
  }
  timed(t, l, Op::OProj, shape, [&] { b.matmul(Proj::O, l); });
  timed(t, l, Op::Residual, shape, [&] { b.residual(); });
  timed(t, l, Op::FfnNorm, shape, [&] { b.rmsnorm(Norm::Ffn, l); });
  timed(t, l, Op::GateUp, shape, [&] { b.matmul(Proj::GateUp, l); });
  timed(t, l, Op::SwiGLU, shape, [&] { b.swiglu(); });
  timed(t, l, Op::Down, shape, [&] { b.matmul(Proj::Down, l); });
  timed(t, l, Op::Residual, shape, [&] { b.residual(); });
}

std::vector<int64_t> Session::select(int l, std::span<const int32_t> keys, double share,
                                     PruningPolicy& policy, OpTimers* t, trace::Step* stats) {
  Backend& b = *be_;
  const int64_t n = int64_t(keys.size()), n_keep = tokens_kept(n, share);
  // A policy that keeps the top scores selects where the scores are; the others read them back.
  const bool on_backend = policy.keeps_top_scores();
  std::vector<float> scores;
  if (policy.needs_scores()) {
    // The scoring row is the last row: the newest token, which sees every key.
    timed(t, l, Op::Score, OpShape{1, 0, n}, [&] { b.last_row_scores(l, slots_); });
    if (stats || !on_backend) scores = b.scores(n);
  }
  std::vector<int64_t> keep;
  timed(t, l, Op::Select, OpShape{0, 0, n},
        [&] { keep = on_backend ? b.select_top(keys, n_keep) : policy.select(l, keys, scores, n_keep); });
  if (keep.empty() || keep.back() != n - 1) fail("pruning policy dropped the last token");
  if (stats) stats->pruning->push_back({l, {}, std::move(scores)});  // kept: once the caller knows it
  return keep;
}

void Session::forward(std::span<const int32_t> ids, std::span<const int32_t> pos,
                      std::span<const int64_t> logit_rows, float* logits, const PruneRequest* prune,
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
  const bool pruning = prune && prune->policy && !prune->steps.empty();
  if (pruning) {
    if (n_cached() != 0) fail("forward: pruning needs an empty cache (a prefill)");
    if (logit_rows.size() != 1 || logit_rows[0] != T - 1)
      fail("forward: with pruning only the last row can have logits");
    for (size_t i = 0; i < prune->steps.size(); ++i)
      if (prune->steps[i].layer < 0 || prune->steps[i].layer >= c.n_layer ||
          (i > 0 && prune->steps[i].layer <= prune->steps[i - 1].layer))
        fail("forward: pruning layers must be increasing and inside the model");
  }
  if (timers && timers->empty()) timers->init(c.n_layer, dtypes_of(m_.weights()));
  reset_stats(stats, c.n_layer, n_cached() == 0 ? "prefill" : "decode", T);

  // The active rows: backend row i holds the token at rows[i]. Pruning only removes rows, so
  // positions stay ascending; with pruning the last row is the last token throughout.
  std::vector<int32_t> rows(pos.begin(), pos.end());
  b.set_rows(rows);
  timed(timers, c.n_layer, Op::Embed, OpShape{T, 0, 0}, [&] { b.embed(ids); });
  size_t next_step = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const int64_t Tl = int64_t(rows.size());
    layer(l, rows, {}, timers, stats);
    if (!pruning || next_step == prune->steps.size() || prune->steps[next_step].layer != l) continue;

    // A pruning layer: the keys here are exactly the active rows (the cache started empty), and
    // the last row's attention over them scores them.
    const std::vector<int64_t> keep =
        select(l, rows, prune->steps[next_step++].share, *prune->policy, timers, stats);
    if (int64_t(keep.size()) < Tl) {
      // Pruned rows: their hidden state (the input of layer l + 1, where they have no K/V) goes
      // to the Aux Cache; the kept rows stay, in order.
      std::vector<int32_t> kept;
      timed(timers, l, Op::Gather, OpShape{Tl, 0, 0}, [&] {
        std::vector<int64_t> pruned, entries;
        kept.reserve(keep.size());
        for (int64_t r = 0, k = 0; r < Tl; ++r) {
          if (k < int64_t(keep.size()) && keep[size_t(k)] == r) {
            kept.push_back(rows[size_t(r)]);
            ++k;
            continue;
          }
          pruned.push_back(r);
          entries.push_back(aux_.put(rows[size_t(r)], l + 1));
        }
        b.aux_store(pruned, entries);
        b.gather_rows(keep);
        if (stats) stats->aux_writes[size_t(l)] += int64_t(pruned.size());
      });
      rows.swap(kept);
      b.set_rows(rows);
    }
    if (stats) stats->pruning->back().kept = rows;
  }

  // Final norm and LM head only for the rows that need logits.
  const int64_t R = int64_t(logit_rows.size());
  if (R == 0) {
    b.synchronize();
    return;
  }
  std::vector<int64_t> head(logit_rows.begin(), logit_rows.end());
  std::vector<int32_t> head_pos(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    if (pruning) head[size_t(r)] = int64_t(rows.size()) - 1;
    head_pos[size_t(r)] = rows[size_t(head[size_t(r)])];
  }
  b.gather_rows(head);
  b.set_rows(head_pos);
  timed(timers, c.n_layer, Op::OutputNorm, OpShape{R, 0, 0}, [&] { b.rmsnorm(Norm::Output, c.n_layer); });
  timed(timers, c.n_layer, Op::LmHead, OpShape{R, 0, 0}, [&] { b.lm_head(logits); });
}

void Session::decode_step(int32_t id, int32_t p, float* logits, const PruneRequest& prune, trace::Step* stats,
                          OpTimers* timers) {
  const ModelConfig& c = m_.config();
  Backend& b = *be_;
  if (id < 0 || id >= c.n_vocab) fail("token id {} is outside the vocabulary [0, {})", id, c.n_vocab);
  if (!prune.policy) fail("decode_step: no pruning policy");
  if (n_cached() + 1 > n_ctx()) fail("context full: {} cached + 1 new token exceed {}", n_cached(), n_ctx());
  // Layer 0 holds every token in position order (nothing is pruned before it).
  const KvIndex& kv0 = kv_[0];
  if (p < 0 || (kv0.n() > 0 && p <= kv0.pos.back())) fail("decode_step: position must be new");
  if (timers && timers->empty()) timers->init(c.n_layer, dtypes_of(m_.weights()));
  reset_stats(stats, c.n_layer, "decode", 1);

  // The step's active set (positions, ascending): every token, the new one last.
  std::vector<int32_t> active(kv0.pos.begin(), kv0.pos.end());
  active.push_back(p);
  // Rows computed in this step (ascending positions, the new token last); backend row i holds rows[i].
  std::vector<int32_t> rows = {p};
  b.set_rows(rows);
  timed(timers, c.n_layer, Op::Embed, OpShape{1, 0, 0}, [&] { b.embed({&id, 1}); });
  size_t next_step = 0;
  std::vector<int32_t> revive;

  for (int l = 0; l < c.n_layer; ++l) {
    const KvIndex& kv = kv_[size_t(l)];
    // Revival: active tokens without K/V here that are not rows yet come back from the Aux Cache,
    // whose entry is exactly this layer's input (a token leaves the rows only when it is pruned,
    // and its state is saved then).
    revive.clear();
    for (int32_t ap : active)
      if (kv.find(ap) < 0 && ap != p && !std::binary_search(rows.begin(), rows.end(), ap))
        revive.push_back(ap);
    if (!revive.empty()) {
      timed(timers, l, Op::Gather, OpShape{int64_t(revive.size()), 0, 0}, [&] {
        const RowMerge plan = aux_.plan_revival(l, rows, revive);
        b.merge_rows(plan, int64_t(rows.size()));
      });
      if (stats) {
        stats->revived[size_t(l)] = stats->aux_reads[size_t(l)] = int64_t(revive.size());  // one read each
        (*stats->revived_positions)[size_t(l)] = revive;
      }
    }
    const int64_t Tl = int64_t(rows.size());
    b.set_rows(rows);
    layer(l, rows, active, timers, stats);

    const bool prune_here = next_step < prune.steps.size() && prune.steps[next_step].layer == l;
    if (prune_here) {
      const std::vector<int64_t> keep =
          select(l, active, prune.steps[next_step++].share, *prune.policy, timers, stats);
      std::vector<int32_t> kept;
      kept.reserve(keep.size());
      for (int64_t i : keep) kept.push_back(active[size_t(i)]);
      active.swap(kept);
      if (stats) stats->pruning->back().kept = active;
    }
    // Rows not selected stop here; their state (the next layer's input) goes to the Aux Cache.
    // Rows that already have K/V at the next layer also stop: they are not recomputed there.
    timed(timers, l, Op::Gather, OpShape{Tl, 0, 0}, [&] {
      std::vector<int64_t> stay, leave, entries;
      std::vector<int32_t> next;
      for (int64_t r = 0; r < Tl; ++r) {
        const int32_t rp = rows[size_t(r)];
        const bool kept = !prune_here || std::binary_search(active.begin(), active.end(), rp);
        const bool next_has_kv = l + 1 < c.n_layer && kv_[size_t(l + 1)].find(rp) >= 0;
        if (kept && !next_has_kv) {
          stay.push_back(r);
          next.push_back(rp);
        } else if (!kept && l + 1 < c.n_layer) {
          leave.push_back(r);
          entries.push_back(aux_.put(rp, l + 1));
        }
      }
      b.aux_store(leave, entries);
      if (int64_t(stay.size()) < Tl) b.gather_rows(stay);
      if (stats) stats->aux_writes[size_t(l)] += int64_t(leave.size());
      rows.swap(next);
    });
    if (rows.empty() || rows.back() != p) fail("internal error: the new token left the step");
  }

  const int64_t last = int64_t(rows.size()) - 1;
  b.gather_rows({&last, 1});
  b.set_rows({&p, 1});
  timed(timers, c.n_layer, Op::OutputNorm, OpShape{1, 0, 0}, [&] { b.rmsnorm(Norm::Output, c.n_layer); });
  timed(timers, c.n_layer, Op::LmHead, OpShape{1, 0, 0}, [&] { b.lm_head(logits); });
}

}  // namespace lp
