#include "kernels/runner.h"

#include <sys/resource.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "model/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "model/vocab.h"

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

std::unique_ptr<Model> Model::load(const std::string& path, DType dtype, CpuContext& ctx) {
  GgufFile f = GgufFile::open(path);
  ModelConfig c = config_from_gguf(f);
  auto tok = std::make_unique<Tokenizer>(vocab_from_gguf(f));
  if (tok->n_vocab() != c.n_vocab)
    fail("{}: tokenizer has {} tokens but the embedding has {} rows", path, tok->n_vocab(), c.n_vocab);
  Weights w = load_weights(f, c, dtype, ctx);
  return std::make_unique<Model>(std::move(c), std::move(w), std::move(tok), path);
}

Session::Session(const Model& m, int64_t n_ctx) : m_(m), n_ctx_(n_ctx) {
  const ModelConfig& c = m.config();
  if (n_ctx < 1) fail("context size must be positive, got {}", n_ctx);
  kv_.resize(size_t(c.n_layer));
  for (auto& kv : kv_) kv.init(n_ctx, c.n_head_kv, c.head_dim);
  done_.assign(size_t(c.n_layer), std::vector<uint8_t>(size_t(n_ctx) + 1, 0));
}

void Session::reset() {
  for (auto& kv : kv_) kv.clear();
  aux_ = AuxCache{};
  for (auto& d : done_) std::fill(d.begin(), d.end(), 0);
}

void AuxCache::put(int32_t p, int32_t l, const float* x, int64_t D) {
  if (const int64_t e = find(p); e >= 0) {
    layer[size_t(e)] = l;
    std::copy_n(x, D, h.begin() + e * D);
    return;
  }
  index[p] = size();
  pos.push_back(p);
  layer.push_back(l);
  h.insert(h.end(), x, x + D);
}

AuxCache::RevivalPlan AuxCache::plan_revival(int l, std::vector<int32_t>& rows,
                                             const std::vector<int32_t>& revive) const {
  RevivalPlan plan;
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

void Session::mark_computed(int l, int32_t p) {
  auto& d = done_[size_t(l)];
  if (p < 0) fail("negative position {}", p);
  if (p >= int32_t(d.size())) d.resize(size_t(p) + 1, 0);
  if (d[size_t(p)]) fail("internal error: token at position {} computed twice at layer {}", p, l);
  d[size_t(p)] = 1;
}

int64_t Session::kv_bytes_used() const {
  int64_t b = 0;
  for (const auto& kv : kv_) b += kv.n * kv.Hkv * kv.Dh * 2 * 4;
  return b;
}

int64_t Session::kv_bytes() const {
  int64_t b = 0;
  for (const auto& kv : kv_) b += (kv.kt.size() + kv.v.size()) * 4;
  return b;
}

namespace {
using Clock = std::chrono::steady_clock;

// Times one op and records its FLOPs and bytes (op_flops / op_bytes of its shape).
struct Timed {
  OpTimers* t;
  int layer;
  Op op;
  OpShape shape;
  const ModelConfig& c;
  Clock::time_point t0 = Clock::now();
  ~Timed() {
    if (t)
      t->add(layer, op, std::chrono::duration<double>(Clock::now() - t0).count(), op_flops(c, op, shape),
             op_bytes(c, op, shape, t->dtypes), double(shape.tokens));
  }
};

OpDtypes dtypes_of(const Weights& w) {
  const double b = w.dtype == DType::BF16 ? 2 : 4;
  return {b, b, 4};  // GEMM inputs are rounded to the weights' dtype; the KV cache is f32
}

std::vector<int64_t> zeros(int n) {
  return std::vector<int64_t>(static_cast<size_t>(n), 0);
}

void reset_stats(ForwardStats* stats, int L) {
  if (!stats) return;
  *stats = ForwardStats{};
  stats->computed = stats->keys = stats->pairs = stats->attended = stats->aux_written = stats->revived =
      zeros(L);
  stats->revived_pos.assign(size_t(L), {});
}
}  // namespace

void Session::run_layer(CpuContext& ctx, int l, std::span<const int32_t> rows, const RopeTable& rope_tab,
                        std::span<const int32_t> keys, OpTimers* timers, ForwardStats* stats) {
  const ModelConfig& c = m_.config();
  const int64_t D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
  const int64_t QKV = (H + 2 * Hkv) * Dh, Q = H * Dh;
  const int64_t T = int64_t(rows.size());
  const OpShape shape{T, 0, 0};
  const LayerWeights& L = m_.weights().layers[size_t(l)];
  LayerKV& kv = kv_[size_t(l)];
  if (stats) stats->computed[size_t(l)] = T;
  {
    Timed tm{timers, l, Op::AttnNorm, shape, c};
    rmsnorm(ctx, x_.data(), L.attn_norm.data(), xn_.data(), T, D, c.rms_eps);
  }
  {
    Timed tm{timers, l, Op::QKV, shape, c};
    gemm_.run(ctx, xn_.data(), T, D, L.wqkv, qkv_.data(), QKV);
  }
  {
    Timed tm{timers, l, Op::Rope, shape, c};
    rope(ctx, qkv_.data(), T, QKV, H + Hkv, Dh, rope_tab);  // q and k heads are adjacent
  }
  kv.append(qkv_.data() + Q, QKV, qkv_.data() + Q + Hkv * Dh, QKV, rows.data(), T);
  for (int32_t p : rows) mark_computed(l, p);

  // The key set: every held key in order (the common case), or the listed positions' slots.
  slots_.clear();
  std::span<const int32_t> key_pos;
  if (!keys.empty()) {
    key_pos = keys;
    const bool all_held =
        kv.sorted && int64_t(keys.size()) == kv.n && std::equal(keys.begin(), keys.end(), kv.pos.begin());
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
    key_pos_.resize(size_t(kv.n));
    for (int64_t i = 0; i < kv.n; ++i)
      key_pos_[size_t(i)] = kv.pos[size_t(slots_.empty() ? i : slots_[size_t(i)])];
    key_pos = key_pos_;
  }
  const KeySet ks{kv, slots_};
  int64_t pairs = 0;  // each query sees the keys at or before its position
  for (int32_t p : rows) pairs += std::upper_bound(key_pos.begin(), key_pos.end(), p) - key_pos.begin();
  {
    // The rows' K/V were appended above; the Attention op's bytes count that write.
    Timed tm{timers, l, Op::Attention, OpShape{T, pairs, ks.size()}, c};
    attention(ctx, qkv_.data(), QKV, rows.data(), T, ks, H, attn_.data(), Q);
  }
  if (stats) {
    stats->keys[size_t(l)] = kv.n;
    stats->pairs[size_t(l)] = pairs;
    stats->attended[size_t(l)] = ks.size();
  }
  {
    Timed tm{timers, l, Op::OProj, shape, c};
    gemm_.run(ctx, attn_.data(), T, Q, L.wo, tmp_.data(), D);
  }
  {
    Timed tm{timers, l, Op::Residual, shape, c};
    add_inplace(ctx, x_.data(), tmp_.data(), T * D);
  }
  {
    Timed tm{timers, l, Op::FfnNorm, shape, c};
    rmsnorm(ctx, x_.data(), L.ffn_norm.data(), xn_.data(), T, D, c.rms_eps);
  }
  {
    Timed tm{timers, l, Op::GateUp, shape, c};
    gemm_.run(ctx, xn_.data(), T, D, L.w_gate_up, ff_.data(), 2 * F);
  }
  {
    Timed tm{timers, l, Op::SwiGLU, shape, c};
    swiglu(ctx, ff_.data(), 2 * F, ff_.data() + F, 2 * F, act_.data(), F, T, F);
  }
  {
    Timed tm{timers, l, Op::Down, shape, c};
    gemm_.run(ctx, act_.data(), T, F, L.w_down, tmp_.data(), D);
  }
  {
    Timed tm{timers, l, Op::Residual, shape, c};
    add_inplace(ctx, x_.data(), tmp_.data(), T * D);
  }
}

std::vector<int64_t> Session::select(int l, std::span<const int32_t> keys, double share,
                                     PruningPolicy& policy, OpTimers* timers, ForwardStats* stats) {
  const ModelConfig& c = m_.config();
  const int64_t n = int64_t(keys.size());
  const int64_t QKV = (c.n_head + 2 * c.n_head_kv) * c.head_dim;
  std::vector<float> scores;
  if (policy.needs_scores()) {
    // The scoring row is the last row run_layer computed: the newest token, which sees every key.
    Timed tm{timers, l, Op::Score, OpShape{1, 0, n}, c};
    scores.resize(static_cast<size_t>(n));
    const int64_t last_row = int64_t(last_rows_) - 1;
    last_row_scores(qkv_.data() + last_row * QKV, KeySet{kv_[size_t(l)], slots_}, c.n_head, scores.data());
  }
  std::vector<int64_t> keep;
  {
    Timed tm{timers, l, Op::Select, OpShape{0, 0, n}, c};
    keep = policy.select(l, keys, scores, tokens_kept(n, share));
  }
  if (keep.empty() || keep.back() != n - 1) fail("pruning policy dropped the last token");
  if (stats) stats->scores.push_back(std::move(scores));
  return keep;
}

void Session::forward(CpuContext& ctx, std::span<const int32_t> ids, std::span<const int32_t> pos,
                      std::span<const int64_t> logit_rows, float* logits, OpTimers* timers,
                      const PruneRequest* prune, ForwardStats* stats) {
  const ModelConfig& c = m_.config();
  const Weights& w = m_.weights();
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("forward: no tokens");
  if (pos.size() != ids.size()) fail("forward: {} ids but {} positions", ids.size(), pos.size());
  if (n_cached() + T > n_ctx_)
    fail("context full: {} cached + {} new tokens exceed the context size {}", n_cached(), T, n_ctx_);
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
  const int64_t D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
  const int64_t QKV = (H + 2 * Hkv) * Dh, Q = H * Dh;
  if (timers && timers->empty()) timers->init(c.n_layer, dtypes_of(w));
  x_.resize(T * D, false);
  xn_.resize(T * D, false);
  qkv_.resize(T * QKV, false);
  attn_.resize(T * Q, false);
  ff_.resize(T * 2 * F, false);
  act_.resize(T * F, false);
  tmp_.resize(T * D, false);
  reset_stats(stats, c.n_layer);

  // The active rows: x_ row i holds the token at act_pos[i]. Pruning only removes rows, so
  // positions stay ascending; with pruning the last row is the last token throughout.
  std::vector<int32_t> act_pos(pos.begin(), pos.end());
  {
    Timed tm{timers, c.n_layer, Op::Embed, OpShape{T, 0, 0}, c};
    const Matrix& E = w.tok_embd;
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), T, [&](int64_t t) {
        float* dst = x_.data() + t * D;
        if (E.dtype == DType::F32)
          std::memcpy(dst, E.f32.data() + int64_t(ids[t]) * D, size_t(D) * 4);
        else
          for (int64_t i = 0; i < D; ++i) dst[i] = bf16_to_f32(E.bf16[int64_t(ids[t]) * D + i]);
      });
    });
  }
  const float* rope_freqs = w.rope_freqs.empty() ? nullptr : w.rope_freqs.data();
  RopeTable rope_tab = rope_table(act_pos.data(), T, c.rope_dim, c.rope_theta, rope_freqs);
  size_t next_step = 0;

  for (int l = 0; l < c.n_layer; ++l) {
    const int64_t Tl = int64_t(act_pos.size());
    last_rows_ = size_t(Tl);
    run_layer(ctx, l, act_pos, rope_tab, {}, timers, stats);
    if (!pruning || next_step == prune->steps.size() || prune->steps[next_step].layer != l) continue;

    // A pruning layer: the keys here are exactly the active rows (the cache started empty), and
    // the last row's attention over them scores them.
    const std::vector<int64_t> keep =
        select(l, act_pos, prune->steps[next_step++].share, *prune->policy, timers, stats);
    if (int64_t(keep.size()) < Tl) {
      // Pruned rows: their hidden state (the input of layer l + 1, where they have no K/V) goes
      // to the Aux Cache; kept rows are compacted in place (keep is ascending, so row keep[i]
      // moves to row i <= keep[i] and nothing is overwritten before it is read).
      Timed tm{timers, l, Op::Gather, OpShape{Tl, 0, 0}, c};
      size_t k = 0;
      for (int64_t r = 0; r < Tl; ++r) {
        if (k < keep.size() && keep[k] == r) {
          if (int64_t(k) != r) std::memcpy(x_.data() + k * D, x_.data() + r * D, size_t(D) * 4);
          act_pos[k++] = act_pos[size_t(r)];
          continue;
        }
        aux_.put(act_pos[size_t(r)], l + 1, x_.data() + r * D, D);
        if (stats) {
          ++stats->aux_writes;
          ++stats->aux_written[size_t(l)];
        }
      }
      act_pos.resize(keep.size());
      rope_tab = rope_table(act_pos.data(), int64_t(act_pos.size()), c.rope_dim, c.rope_theta, rope_freqs);
    }
    if (stats) stats->kept.push_back(act_pos);
  }

  // Final norm and LM head only for the rows that need logits.
  const int64_t R = int64_t(logit_rows.size());
  if (R == 0) return;
  Buffer<float> rows(R * D, false);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t src = pruning ? int64_t(act_pos.size()) - 1 : logit_rows[r];
    std::memcpy(rows.data() + r * D, x_.data() + src * D, size_t(D) * 4);
  }
  const OpShape head{R, 0, 0};
  {
    Timed tm{timers, c.n_layer, Op::OutputNorm, head, c};
    rmsnorm(ctx, rows.data(), w.output_norm.data(), rows.data(), R, D, c.rms_eps);
  }
  {
    Timed tm{timers, c.n_layer, Op::LmHead, head, c};
    gemm_.run(ctx, rows.data(), R, D, w.lm_head(), logits, c.n_vocab);
  }
}

void Session::decode_step(CpuContext& ctx, int32_t id, int32_t p, float* logits, OpTimers* timers,
                          const PruneRequest& prune, ForwardStats* stats) {
  const ModelConfig& c = m_.config();
  const Weights& w = m_.weights();
  if (id < 0 || id >= c.n_vocab) fail("token id {} is outside the vocabulary [0, {})", id, c.n_vocab);
  if (!prune.policy) fail("decode_step: no pruning policy");
  if (n_cached() + 1 > n_ctx_) fail("context full: {} cached + 1 new token exceed {}", n_cached(), n_ctx_);
  // Layer 0 holds every token in position order (nothing is pruned before it).
  const LayerKV& kv0 = kv_[0];
  if (kv0.n > 0 && p <= kv0.pos[size_t(kv0.n - 1)]) fail("decode_step: position must be new");
  const int64_t D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
  const int64_t QKV = (H + 2 * Hkv) * Dh, Q = H * Dh;
  if (timers && timers->empty()) timers->init(c.n_layer, dtypes_of(w));
  reset_stats(stats, c.n_layer);

  // The step's active set (positions, ascending): every token, the new one last.
  std::vector<int32_t> active(kv0.pos.begin(), kv0.pos.begin() + kv0.n);
  active.push_back(p);
  // Rows computed in this step (ascending positions, the new token last); x_ row i holds rows[i].
  std::vector<int32_t> rows = {p};
  const auto reserve = [&](int64_t T) {
    x_.resize(std::max(x_.size(), T * D));
    xn_.resize(std::max(xn_.size(), T * D));
    qkv_.resize(std::max(qkv_.size(), T * QKV));
    attn_.resize(std::max(attn_.size(), T * Q));
    ff_.resize(std::max(ff_.size(), T * 2 * F));
    act_.resize(std::max(act_.size(), T * F));
    tmp_.resize(std::max(tmp_.size(), T * D));
  };
  reserve(1);
  {
    Timed tm{timers, c.n_layer, Op::Embed, OpShape{1, 0, 0}, c};
    const Matrix& E = w.tok_embd;
    for (int64_t i = 0; i < D; ++i)
      x_[i] = E.dtype == DType::F32 ? E.f32[int64_t(id) * D + i] : bf16_to_f32(E.bf16[int64_t(id) * D + i]);
  }
  const float* rope_freqs = w.rope_freqs.empty() ? nullptr : w.rope_freqs.data();
  size_t next_step = 0;
  std::vector<int32_t> revive;

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerKV& kv = kv_[size_t(l)];
    // Revival: active tokens without K/V here that are not rows yet come back from the Aux Cache,
    // whose entry is exactly this layer's input (a token leaves the rows only when it is pruned,
    // and its state is saved then).
    revive.clear();
    for (int32_t ap : active)
      if (kv.find(ap) < 0 && ap != p && !std::binary_search(rows.begin(), rows.end(), ap))
        revive.push_back(ap);
    if (!revive.empty()) {
      Timed tm{timers, l, Op::Gather, OpShape{int64_t(revive.size()), 0, 0}, c};
      const AuxCache::RevivalPlan plan = aux_.plan_revival(l, rows, revive);
      std::vector<float> xm(rows.size() * size_t(D));
      for (size_t i = 0; i < plan.x_src.size(); ++i)
        std::copy_n(x_.data() + plan.x_src[i] * D, D, xm.data() + plan.x_dst[i] * D);
      for (size_t i = 0; i < plan.aux_src.size(); ++i)
        std::copy_n(aux_.h.data() + plan.aux_src[i] * D, D, xm.data() + plan.aux_dst[i] * D);
      reserve(int64_t(rows.size()));
      std::copy(xm.begin(), xm.end(), x_.data());
      if (stats) {
        stats->revived[size_t(l)] = int64_t(revive.size());
        stats->revived_pos[size_t(l)] = revive;
      }
    }
    const int64_t Tl = int64_t(rows.size());
    last_rows_ = size_t(Tl);
    const RopeTable tab = rope_table(rows.data(), Tl, c.rope_dim, c.rope_theta, rope_freqs);
    run_layer(ctx, l, rows, tab, active, timers, stats);

    const bool prune_here = next_step < prune.steps.size() && prune.steps[next_step].layer == l;
    if (prune_here) {
      const std::vector<int64_t> keep =
          select(l, active, prune.steps[next_step++].share, *prune.policy, timers, stats);
      std::vector<int32_t> kept;
      kept.reserve(keep.size());
      for (int64_t i : keep) kept.push_back(active[size_t(i)]);
      active.swap(kept);
      if (stats) stats->kept.push_back(active);
    }
    // Rows not selected stop here; their state (the next layer's input) goes to the Aux Cache.
    // Rows that already have K/V at the next layer also stop: they are not recomputed there.
    Timed tm{timers, l, Op::Gather, OpShape{Tl, 0, 0}, c};
    size_t k = 0;
    for (int64_t r = 0; r < Tl; ++r) {
      const int32_t rp = rows[size_t(r)];
      const bool kept = !prune_here || std::binary_search(active.begin(), active.end(), rp);
      const bool next_has_kv = l + 1 < c.n_layer && kv_[size_t(l + 1)].find(rp) >= 0;
      if (kept && !next_has_kv) {
        if (int64_t(k) != r) std::memcpy(x_.data() + k * D, x_.data() + r * D, size_t(D) * 4);
        rows[k++] = rp;
        continue;
      }
      if (!kept && l + 1 < c.n_layer) {
        aux_.put(rp, l + 1, x_.data() + r * D, D);
        if (stats) {
          ++stats->aux_writes;
          ++stats->aux_written[size_t(l)];
        }
      }
    }
    rows.resize(k);
    if (rows.empty() || rows.back() != p) fail("internal error: the new token left the step");
  }

  std::vector<float> row(x_.data() + (int64_t(rows.size()) - 1) * D, x_.data() + int64_t(rows.size()) * D);
  {
    Timed tm{timers, c.n_layer, Op::OutputNorm, OpShape{1, 0, 0}, c};
    rmsnorm(ctx, row.data(), w.output_norm.data(), row.data(), 1, D, c.rms_eps);
  }
  {
    Timed tm{timers, c.n_layer, Op::LmHead, OpShape{1, 0, 0}, c};
    gemm_.run(ctx, row.data(), 1, D, w.lm_head(), logits, c.n_vocab);
  }
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace lp
