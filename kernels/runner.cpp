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

double OpTimers::total_seconds() const {
  double s = 0;
  for (double v : seconds) s += v;
  return s;
}
double OpTimers::total_flops() const {
  double s = 0;
  for (double v : flops) s += v;
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
  for (auto& kv : kv_) kv.n = 0;
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

// Times one op and records its counted FLOPs.
struct Timed {
  OpTimers* t;
  Op op;
  double flops;
  Clock::time_point t0 = Clock::now();
  ~Timed() {
    if (t) t->add(op, std::chrono::duration<double>(Clock::now() - t0).count(), flops);
  }
};
}  // namespace

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
    if (t > 0 && pos[t] <= pos[t - 1]) fail("forward: positions must be strictly increasing");
  }
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
  x_.resize(T * D, false);
  xn_.resize(T * D, false);
  qkv_.resize(T * QKV, false);
  attn_.resize(T * Q, false);
  ff_.resize(T * 2 * F, false);
  act_.resize(T * F, false);
  tmp_.resize(T * D, false);
  if (stats) {
    const std::vector<int64_t> zeros(size_t(c.n_layer), 0);
    *stats = ForwardStats{zeros, zeros, zeros, zeros, zeros, {}, {}, 0};
  }

  // The active rows: act[i] indexes ids/pos; x_ row i holds token act[i]. Pruning only ever
  // removes rows, so act stays ascending and positions stay in order.
  std::vector<int64_t> act(static_cast<size_t>(T));
  std::iota(act.begin(), act.end(), 0);
  std::vector<int32_t> act_pos(pos.begin(), pos.end());
  int64_t out_row = -1;  // which active row the (single) logit row ends up in, when pruning

  {
    Timed tm{timers, Op::Embed, op_flops(c, Op::Embed, {T, 0, 0})};
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
    const int64_t Tl = int64_t(act.size());
    const OpShape shape{Tl, 0, 0};
    const LayerWeights& L = w.layers[size_t(l)];
    LayerKV& kv = kv_[size_t(l)];
    if (stats) stats->computed[size_t(l)] = Tl;
    {
      Timed tm{timers, Op::AttnNorm, op_flops(c, Op::AttnNorm, shape)};
      rmsnorm(ctx, x_.data(), L.attn_norm.data(), xn_.data(), Tl, D, c.rms_eps);
    }
    {
      // Fused QKV: the q_proj entry carries the k and v projections' FLOPs too.
      Timed tm{timers, Op::QProj, op_flops(c, Op::QProj, shape) + 2 * op_flops(c, Op::KProj, shape)};
      gemm_.run(ctx, xn_.data(), Tl, D, L.wqkv, qkv_.data(), QKV);
    }
    {
      Timed tm{timers, Op::Rope, op_flops(c, Op::Rope, shape)};
      rope(ctx, qkv_.data(), Tl, QKV, H + Hkv, Dh, rope_tab);  // q and k heads are adjacent
    }
    const int64_t n_keys = kv.n + Tl;
    {
      // Pairs attended: each query sees the cached keys at or before its position.
      int64_t pairs = 0;
      for (int64_t t = 0; t < Tl; ++t) {
        pairs += std::upper_bound(kv.pos.begin(), kv.pos.begin() + kv.n, act_pos[t]) - kv.pos.begin();
        pairs += t + 1;
      }
      Timed tm{timers, Op::Attention, op_flops(c, Op::Attention, OpShape{Tl, pairs, n_keys})};
      kv.append(qkv_.data() + Q, QKV, qkv_.data() + Q + Hkv * Dh, QKV, act_pos.data(), Tl);
      attention(ctx, qkv_.data(), QKV, act_pos.data(), Tl, kv, H, attn_.data(), Q);
      if (stats) {
        stats->keys[size_t(l)] = kv.n;
        stats->pairs[size_t(l)] = pairs;
      }
      for (int64_t t = 0; t < Tl; ++t) mark_computed(l, act_pos[size_t(t)]);
    }
    // A pruning layer: score the active tokens by the last token's attention (the keys at this
    // layer are exactly the active tokens, since the cache started empty).
    std::vector<int64_t> keep;
    const bool prune_here = pruning && next_step < prune->steps.size() && prune->steps[next_step].layer == l;
    if (prune_here) {
      std::vector<float> scores;
      if (prune->policy->needs_scores()) {
        Timed tm{timers, Op::Score, op_flops(c, Op::Score, OpShape{1, 0, kv.n})};
        scores.resize(static_cast<size_t>(kv.n));
        last_row_scores(qkv_.data() + (Tl - 1) * QKV, kv, H, kv.n, scores.data());
      }
      keep = prune->policy->select(l, act_pos, scores, tokens_kept(Tl, prune->steps[next_step].share));
      if (keep.empty() || keep.back() != Tl - 1) fail("pruning policy dropped the last token");
      if (stats) stats->scores.push_back(std::move(scores));
      ++next_step;
    }
    {
      Timed tm{timers, Op::OProj, op_flops(c, Op::OProj, shape)};
      gemm_.run(ctx, attn_.data(), Tl, Q, L.wo, tmp_.data(), D);
    }
    {
      Timed tm{timers, Op::Residual, op_flops(c, Op::Residual, shape) / 2};
      add_inplace(ctx, x_.data(), tmp_.data(), Tl * D);
    }
    {
      Timed tm{timers, Op::FfnNorm, op_flops(c, Op::FfnNorm, shape)};
      rmsnorm(ctx, x_.data(), L.ffn_norm.data(), xn_.data(), Tl, D, c.rms_eps);
    }
    {
      // Fused gate/up: the gate entry carries both.
      Timed tm{timers, Op::Gate, 2 * op_flops(c, Op::Gate, shape)};
      gemm_.run(ctx, xn_.data(), Tl, D, L.w_gate_up, ff_.data(), 2 * F);
    }
    {
      Timed tm{timers, Op::SwiGLU, op_flops(c, Op::SwiGLU, shape)};
      swiglu(ctx, ff_.data(), 2 * F, ff_.data() + F, 2 * F, act_.data(), F, Tl, F);
    }
    {
      Timed tm{timers, Op::Down, op_flops(c, Op::Down, shape)};
      gemm_.run(ctx, act_.data(), Tl, F, L.w_down, tmp_.data(), D);
    }
    {
      Timed tm{timers, Op::Residual, op_flops(c, Op::Residual, shape) / 2};
      add_inplace(ctx, x_.data(), tmp_.data(), Tl * D);
    }
    if (prune_here && int64_t(keep.size()) < Tl) {
      // Pruned rows: their hidden state (the input of layer l + 1, where they have no K/V) goes
      // to the Aux Cache; kept rows are compacted in place (keep is ascending, so row keep[i]
      // moves to row i <= keep[i] and nothing is overwritten before it is read).
      Timed tm{timers, Op::Gather, op_flops(c, Op::Gather, {Tl, 0, 0})};
      size_t k = 0;
      for (int64_t r = 0; r < Tl; ++r) {
        if (k < keep.size() && keep[k] == r) {
          if (int64_t(k) != r) std::memcpy(x_.data() + k * D, x_.data() + r * D, size_t(D) * 4);
          act[k] = act[size_t(r)];
          act_pos[k] = act_pos[size_t(r)];
          ++k;
          continue;
        }
        aux_.put(act_pos[size_t(r)], l + 1, x_.data() + r * D, D);
        if (stats) {
          ++stats->aux_writes;
          ++stats->aux_written[size_t(l)];
        }
      }
      act.resize(keep.size());
      act_pos.resize(keep.size());
      rope_tab = rope_table(act_pos.data(), int64_t(act.size()), c.rope_dim, c.rope_theta, rope_freqs);
    }
    if (prune_here && stats) stats->kept.push_back(act_pos);
  }
  out_row = int64_t(act.size()) - 1;

  // Final norm and LM head only for the rows that need logits.
  const int64_t R = int64_t(logit_rows.size());
  if (R == 0) return;
  Buffer<float> rows(R * D, false);
  for (int64_t r = 0; r < R; ++r) {
    if (logit_rows[r] < 0 || logit_rows[r] >= T) fail("forward: logit row {} out of range", logit_rows[r]);
    const int64_t src = pruning ? out_row : logit_rows[r];
    std::memcpy(rows.data() + r * D, x_.data() + src * D, size_t(D) * 4);
  }
  const OpShape head{R, 0, 0};
  {
    Timed tm{timers, Op::OutputNorm, op_flops(c, Op::OutputNorm, head)};
    rmsnorm(ctx, rows.data(), w.output_norm.data(), rows.data(), R, D, c.rms_eps);
  }
  {
    Timed tm{timers, Op::LmHead, op_flops(c, Op::LmHead, head)};
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
  if (n_cached() > 0 && p <= kv_[0].pos[size_t(kv_[0].n - 1)]) fail("decode_step: position must be new");
  const int64_t D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
  const int64_t QKV = (H + 2 * Hkv) * Dh, Q = H * Dh;
  if (stats) {
    const std::vector<int64_t> zeros(size_t(c.n_layer), 0);
    *stats = ForwardStats{zeros, zeros, zeros, zeros, zeros, {}, {}, 0};
  }

  // The step's active set (positions, ascending): every token, the new one last. Layer 0 holds
  // every earlier token (nothing is pruned before the first pruning layer).
  std::vector<int32_t> active(kv_[0].pos.begin(), kv_[0].pos.begin() + kv_[0].n);
  active.push_back(p);
  // Rows computed in this step (ascending positions, the new token last) and their states.
  std::vector<int32_t> rows = {p};
  const auto resize = [&](int64_t T) {
    x_.resize(std::max(x_.size(), T * D));
    xn_.resize(std::max(xn_.size(), T * D));
    qkv_.resize(std::max(qkv_.size(), T * QKV));
    attn_.resize(std::max(attn_.size(), T * Q));
    ff_.resize(std::max(ff_.size(), T * 2 * F));
    act_.resize(std::max(act_.size(), T * F));
    tmp_.resize(std::max(tmp_.size(), T * D));
  };
  resize(1);
  {
    Timed tm{timers, Op::Embed, op_flops(c, Op::Embed, {1, 0, 0})};
    const Matrix& E = w.tok_embd;
    for (int64_t i = 0; i < D; ++i)
      x_[i] = E.dtype == DType::F32 ? E.f32[int64_t(id) * D + i] : bf16_to_f32(E.bf16[int64_t(id) * D + i]);
  }
  const float* rope_freqs = w.rope_freqs.empty() ? nullptr : w.rope_freqs.data();
  size_t next_step = 0;

  for (int l = 0; l < c.n_layer; ++l) {
    LayerKV& kv = kv_[size_t(l)];
    // Revival: active tokens without K/V here that are not rows yet come back from the Aux Cache,
    // whose entry is exactly this layer's input (a token leaves the rows only when it is pruned,
    // and its state is saved then).
    std::vector<int32_t> revive;
    for (int32_t ap : active)
      if (kv.find(ap) < 0 && !std::binary_search(rows.begin(), rows.end(), ap)) revive.push_back(ap);
    if (!revive.empty()) {
      std::vector<int32_t> merged;
      std::vector<float> xm;
      size_t r = 0, v = 0;
      const std::vector<float> xr(x_.data(), x_.data() + rows.size() * D);
      while (r < rows.size() || v < revive.size()) {
        if (v < revive.size() && (r == rows.size() || revive[v] < rows[r])) {
          const int64_t e = aux_.find(revive[v]);
          if (e < 0 || aux_.layer[size_t(e)] != l)
            fail("internal error: token at position {} has no K/V at layer {} and no Aux Cache state for it",
                 revive[v], l);
          xm.insert(xm.end(), aux_.h.begin() + e * D, aux_.h.begin() + (e + 1) * D);
          merged.push_back(revive[v++]);
        } else {
          xm.insert(xm.end(), xr.begin() + int64_t(r) * D, xr.begin() + int64_t(r + 1) * D);
          merged.push_back(rows[r++]);
        }
      }
      rows = std::move(merged);
      resize(int64_t(rows.size()));
      std::copy(xm.begin(), xm.end(), x_.data());
      if (stats) stats->revived[size_t(l)] = int64_t(revive.size());
    }
    const int64_t Tl = int64_t(rows.size());
    const OpShape shape{Tl, 0, 0};
    const LayerWeights& L = w.layers[size_t(l)];
    if (stats) stats->computed[size_t(l)] = Tl;
    {
      Timed tm{timers, Op::AttnNorm, op_flops(c, Op::AttnNorm, shape)};
      rmsnorm(ctx, x_.data(), L.attn_norm.data(), xn_.data(), Tl, D, c.rms_eps);
    }
    {
      Timed tm{timers, Op::QProj, op_flops(c, Op::QProj, shape) + 2 * op_flops(c, Op::KProj, shape)};
      gemm_.run(ctx, xn_.data(), Tl, D, L.wqkv, qkv_.data(), QKV);
    }
    {
      Timed tm{timers, Op::Rope, op_flops(c, Op::Rope, shape)};
      const RopeTable tab = rope_table(rows.data(), Tl, c.rope_dim, c.rope_theta, rope_freqs);
      rope(ctx, qkv_.data(), Tl, QKV, H + Hkv, Dh, tab);
    }
    // K/V of the rows into the layer's cache (revived ones at their old positions), then
    // attention over exactly the active set.
    kv.insert(qkv_.data() + Q, QKV, qkv_.data() + Q + Hkv * Dh, QKV, rows.data(), Tl);
    for (int32_t rp : rows) mark_computed(l, rp);
    const LayerKV* keys = &kv;
    if (int64_t(active.size()) != kv.n) {
      std::vector<int64_t> slots;
      slots.reserve(active.size());
      for (int32_t ap : active) slots.push_back(kv.find(ap));
      scratch_kv_.gather_from(kv, slots);
      keys = &scratch_kv_;
    }
    {
      int64_t pairs = 0;
      for (int32_t rp : rows) pairs += std::upper_bound(active.begin(), active.end(), rp) - active.begin();
      Timed tm{timers, Op::Attention, op_flops(c, Op::Attention, OpShape{Tl, pairs, keys->n})};
      attention(ctx, qkv_.data(), QKV, rows.data(), Tl, *keys, H, attn_.data(), Q);
      if (stats) {
        stats->keys[size_t(l)] = kv.n;
        stats->pairs[size_t(l)] = pairs;
      }
    }
    std::vector<char> keep_row(size_t(Tl), 1);
    const bool prune_here = next_step < prune.steps.size() && prune.steps[next_step].layer == l;
    if (prune_here) {
      std::vector<float> scores;
      if (prune.policy->needs_scores()) {
        Timed tm{timers, Op::Score, op_flops(c, Op::Score, OpShape{1, 0, keys->n})};
        scores.resize(static_cast<size_t>(keys->n));
        last_row_scores(qkv_.data() + (Tl - 1) * QKV, *keys, H, keys->n, scores.data());
      }
      const std::vector<int64_t> keep = prune.policy->select(
          l, active, scores, tokens_kept(int64_t(active.size()), prune.steps[next_step].share));
      if (keep.empty() || keep.back() != int64_t(active.size()) - 1)
        fail("pruning policy dropped the last token");
      std::vector<int32_t> kept;
      for (int64_t i : keep) kept.push_back(active[size_t(i)]);
      active = std::move(kept);
      for (int64_t r = 0; r < Tl; ++r)
        keep_row[size_t(r)] = std::binary_search(active.begin(), active.end(), rows[size_t(r)]);
      if (stats) {
        stats->kept.push_back(active);
        stats->scores.push_back(std::move(scores));
      }
      ++next_step;
    }
    {
      Timed tm{timers, Op::OProj, op_flops(c, Op::OProj, shape)};
      gemm_.run(ctx, attn_.data(), Tl, Q, L.wo, tmp_.data(), D);
    }
    {
      Timed tm{timers, Op::Residual, op_flops(c, Op::Residual, shape) / 2};
      add_inplace(ctx, x_.data(), tmp_.data(), Tl * D);
    }
    {
      Timed tm{timers, Op::FfnNorm, op_flops(c, Op::FfnNorm, shape)};
      rmsnorm(ctx, x_.data(), L.ffn_norm.data(), xn_.data(), Tl, D, c.rms_eps);
    }
    {
      Timed tm{timers, Op::Gate, 2 * op_flops(c, Op::Gate, shape)};
      gemm_.run(ctx, xn_.data(), Tl, D, L.w_gate_up, ff_.data(), 2 * F);
    }
    {
      Timed tm{timers, Op::SwiGLU, op_flops(c, Op::SwiGLU, shape)};
      swiglu(ctx, ff_.data(), 2 * F, ff_.data() + F, 2 * F, act_.data(), F, Tl, F);
    }
    {
      Timed tm{timers, Op::Down, op_flops(c, Op::Down, shape)};
      gemm_.run(ctx, act_.data(), Tl, F, L.w_down, tmp_.data(), D);
    }
    {
      Timed tm{timers, Op::Residual, op_flops(c, Op::Residual, shape) / 2};
      add_inplace(ctx, x_.data(), tmp_.data(), Tl * D);
    }
    // Rows not selected stop here; their state (the next layer's input) goes to the Aux Cache.
    // Rows that already have K/V at the next layer also stop: they are not recomputed there.
    size_t k = 0;
    for (int64_t r = 0; r < Tl; ++r) {
      const int32_t rp = rows[size_t(r)];
      const bool next_has_kv = l + 1 < c.n_layer && kv_[size_t(l + 1)].find(rp) >= 0;
      if (keep_row[size_t(r)] && !next_has_kv) {
        if (int64_t(k) != r) std::memcpy(x_.data() + k * D, x_.data() + r * D, size_t(D) * 4);
        rows[k++] = rp;
        continue;
      }
      if (!keep_row[size_t(r)] && l + 1 < c.n_layer) {
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
    Timed tm{timers, Op::OutputNorm, op_flops(c, Op::OutputNorm, {1, 0, 0})};
    rmsnorm(ctx, row.data(), w.output_norm.data(), row.data(), 1, D, c.rms_eps);
  }
  {
    Timed tm{timers, Op::LmHead, op_flops(c, Op::LmHead, {1, 0, 0})};
    gemm_.run(ctx, row.data(), 1, D, w.lm_head(), logits, c.n_vocab);
  }
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace lp
