#include "kernels/cpu/backend.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "model/error.h"
#include "model/quant.h"
#include "pruning/select.h"

namespace lp {

CpuBackend::CpuBackend(CpuContext& ctx, const ModelConfig& c, const Weights& w, int64_t n_ctx)
    : ctx_(ctx), c_(c), w_(w), n_ctx_(n_ctx) {
  if (n_ctx < 1) fail("context size must be positive, got {}", n_ctx);
  D_ = c.n_embd, H_ = c.n_head, Hkv_ = c.n_head_kv, Dh_ = c.head_dim, F_ = tensor_width(c, Tensor::Act);
  Q_ = H_ * Dh_, QKV_ = (H_ + 2 * Hkv_) * Dh_;
  kv_.resize(size_t(c.n_layer));
  for (auto& kv : kv_) kv.init(n_ctx, Hkv_, Dh_, kv_type_for(w.dtype));
}

void CpuBackend::grow(int64_t T) {
  if (T > rows_cap_) allocate_rows(T);
}

void CpuBackend::release_activations(int64_t rows) {
  if (rows_cap_ <= rows) return;
  allocate_rows(rows);
  if (T() > rows) pos_.clear();  // no rows until the next pass sets them (T() <= the buffers' rows)
}

void CpuBackend::allocate_rows(int64_t T) {
  Buffer<float> x(T * D_, false);
  if (rows_cap_ > 0) std::memcpy(x.data(), x_.data(), size_t(std::min(rows_cap_, T) * D_) * 4);
  x_ = std::move(x);
  xn_.resize(T * D_, false);
  qkv_.resize(T * QKV_, false);
  attn_.resize(T * Q_, false);
  ff_.resize(T * 2 * F_, false);
  act_.resize(T * F_, false);
  branch_.resize(T * D_, false);
  tmp_.resize(T * D_, false);
  rows_cap_ = T;
}

void CpuBackend::set_rows(std::span<const int32_t> pos) {
  logits_.forget();
  grow(int64_t(pos.size()));
  pos_.assign(pos.begin(), pos.end());
  const float* ff = w_.rope_freqs.empty() ? nullptr : w_.rope_freqs.data();
  rope_ = rope_table(pos_.data(), T(), c_.rope_dim, c_.rope_theta, ff, c_.rope_freq_scale);
  if (!c_.layer_window.empty())
    rope_local_ = rope_table(pos_.data(), T(), c_.rope_dim, c_.rope_theta_local, ff);
}

void CpuBackend::embed(std::span<const int32_t> ids) {
  const Matrix& E = w_.tok_embd;
  const int64_t D = D_;
  ctx_.run([&] {
    tbb::parallel_for(int64_t(0), int64_t(ids.size()), [&](int64_t t) {
      float* row = x_.data() + t * D;
      E.row_f32(int64_t(ids[t]), row);
      if (c_.embed_scale != 1.0f)
        for (int64_t i = 0; i < D; ++i) row[i] *= c_.embed_scale;
    });
  });
}

void CpuBackend::rmsnorm(Norm n, int l) {
  const std::vector<float>& w = n == Norm::Output ? w_.output_norm
                                : n == Norm::Attn ? w_.layers[size_t(l)].attn_norm
                                                  : w_.layers[size_t(l)].ffn_norm;
  lp::rmsnorm(ctx_, x_.data(), w.data(), xn_.data(), T(), D_, c_.rms_eps);
}

void CpuBackend::post_norm(Norm n, int l) {
  const LayerWeights& L = w_.layers[size_t(l)];
  const std::vector<float>& w = n == Norm::PostAttn ? L.post_attn_norm : L.post_ffn_norm;
  if ((n != Norm::PostAttn && n != Norm::PostFfn) || w.empty())
    internal_fail("post_norm on layer {}, which has no such norm", l);
  lp::rmsnorm(ctx_, branch_.data(), w.data(), branch_.data(), T(), D_,
              c_.rms_eps);  // a row read, then written
}

void CpuBackend::matmul(Proj p, int l) {
  const LayerWeights& L = w_.layers[size_t(l)];
  switch (p) {
    case Proj::QKV:
      gemm_.run(ctx_, xn_.data(), T(), D_, L.wqkv, qkv_.data(), QKV_);
      return add_qkv_bias(l);
    case Proj::O:
      return gemm_.run(ctx_, attn_.data(), T(), Q_, L.wo, branch_.data(), D_);
    case Proj::GateUp:
      return gemm_.run(ctx_, xn_.data(), T(), D_, L.w_gate_up, ff_.data(), 2 * F_);
    case Proj::Down:
      return gemm_.run(ctx_, act_.data(), T(), F_, L.w_down, branch_.data(), D_);
  }
}

void CpuBackend::add_qkv_bias(int l) {
  const std::vector<float>& b = w_.layers[size_t(l)].qkv_bias;
  if (!b.empty()) add_bias(ctx_, qkv_.data(), T(), QKV_, b.data(), QKV_);
}

void CpuBackend::qk_norm(int l) {
  const LayerWeights& L = w_.layers[size_t(l)];
  if (L.q_norm.empty() || L.k_norm.empty()) internal_fail("qk_norm on layer {}, which has no q/k norms", l);
  head_rmsnorm(ctx_, qkv_.data(), T(), QKV_, H_, Dh_, L.q_norm.data(), c_.rms_eps);
  head_rmsnorm(ctx_, qkv_.data() + Q_, T(), QKV_, Hkv_, Dh_, L.k_norm.data(), c_.rms_eps);
}

void CpuBackend::rope(int l) {
  lp::rope(ctx_, qkv_.data(), T(), QKV_, H_ + Hkv_, Dh_,
           c_.window(l) > 0 ? rope_local_ : rope_);  // q, k adjacent
}

void CpuBackend::kv_append(int l) {
  logits_.forget();
  kv_[size_t(l)].append(qkv_.data() + Q_, QKV_, qkv_.data() + Q_ + Hkv_ * Dh_, QKV_, pos_.data(), T());
}

void CpuBackend::attention(int l, std::span<const int32_t> slots, bool scored) {
  const KeySet ks{kv_[size_t(l)], slots};
  logits_.forget();
  lp::attention(ctx_, qkv_.data(), QKV_, pos_.data(), T(), ks, H_, attn_.data(), Q_, c_.attention_scale(),
                c_.window(l), scored ? logits_.keep(l, slots, H_ * ks.kv.n) : nullptr);
}

void CpuBackend::swiglu() {
  (c_.gelu ? lp::geglu : lp::swiglu)(ctx_, ff_.data(), 2 * F_, ff_.data() + F_, 2 * F_, act_.data(), F_, T(),
                                     F_);
}

void CpuBackend::route(int l) {
  moe_route(ctx_, gemm_, w_.layers[size_t(l)].router, c_.n_expert_used, xn_.data(), T(), D_, routes_,
            router_logits_);
}

void CpuBackend::experts(int l) {
  moe_experts(ctx_, gemm_, w_.layers[size_t(l)], routes_, c_.n_ff_exp, c_.gelu, xn_.data(), T(), D_,
              branch_.data(), moe_);
}

void CpuBackend::residual() {
  add_inplace(ctx_, x_.data(), branch_.data(), T() * D_);
}

void CpuBackend::last_row_scores(int l, std::span<const int32_t> slots) {
  const KeySet ks{kv_[size_t(l)], slots};
  scores_.resize(size_t(ks.size()));
  // Right after the layer's scored attention over the same keys: its logits, no second pass over K.
  if (logits_.for_keys(l, slots)) {
    logits_.forget();
    lp::last_row_scores_from_logits(logits_.values.data(), ks, H_, scores_.data());
    return;
  }
  lp::last_row_scores(qkv_.data() + (T() - 1) * QKV_, ks, H_, scores_.data(), c_.attention_scale(),
                      pos_.back(), c_.window(l));
}

std::vector<float> CpuBackend::scores(int64_t n) {
  if (n > int64_t(scores_.size())) internal_fail("{} scores asked, {} computed", n, scores_.size());
  return {scores_.begin(), scores_.begin() + n};
}

std::vector<int64_t> CpuBackend::select_top(std::span<const int32_t> pos, int64_t n_keep) {
  return lp::select_top(pos, {scores_.data(), pos.size()}, n_keep);
}

void CpuBackend::gather_rows(std::span<const int64_t> rows) {
  const int64_t R = int64_t(rows.size()), D = D_;
  grow(R);
  // Increasing rows (compaction after pruning) move down in place: row rows[i] >= i is read
  // before anything is written over it. Any other order goes through tmp.
  bool in_place = true;
  for (int64_t i = 0; i < R && in_place; ++i)
    in_place = rows[size_t(i)] >= i && (i == 0 || rows[i] > rows[i - 1]);
  float* dst = in_place ? x_.data() : tmp_.data();
  for (int64_t i = 0; i < R; ++i)
    if (!in_place || rows[size_t(i)] != i)
      std::memcpy(dst + i * D, x_.data() + rows[size_t(i)] * D, size_t(D) * 4);
  if (!in_place) std::memcpy(x_.data(), tmp_.data(), size_t(R * D) * 4);
}

void CpuBackend::aux_store(std::span<const int64_t> rows, std::span<const int64_t> entries) {
  const int64_t D = D_;
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t end = size_t(entries[i] + 1) * size_t(D);
    if (aux_.size() < end) aux_.resize(end);
    std::memcpy(aux_.data() + entries[i] * D, x_.data() + rows[i] * D, size_t(D) * 4);
  }
}

void CpuBackend::merge_rows(const RowMerge& m, int64_t n_rows) {
  const int64_t D = D_;
  std::vector<float> merged(size_t(n_rows * D));
  for (size_t i = 0; i < m.x_src.size(); ++i)
    std::copy_n(x_.data() + m.x_src[i] * D, D, merged.data() + m.x_dst[i] * D);
  for (size_t i = 0; i < m.aux_src.size(); ++i)
    std::copy_n(aux_.data() + m.aux_src[i] * D, D, merged.data() + m.aux_dst[i] * D);
  grow(n_rows);
  std::copy(merged.begin(), merged.end(), x_.data());
}

void CpuBackend::lm_head(float* logits) {
  gemm_.run(ctx_, xn_.data(), T(), D_, w_.lm_head(), logits, c_.n_vocab);
}

std::vector<CpuBackend*> CpuBackend::members_of(std::span<Backend* const> members, int64_t* total) const {
  std::vector<CpuBackend*> out;
  *total = 0;
  for (Backend* b : members) {
    auto* m = dynamic_cast<CpuBackend*>(b);
    if (!m || &m->w_ != &w_) internal_fail("a batch mixes backends or weights");
    out.push_back(m);
    *total += m->T();
  }
  return out;
}

namespace {

// Rows from which a batch member's GEMM runs on its own rows in place (matmul_batched).
constexpr int64_t kRowsForOwnGemm = 64;

// The rows of `from` of each member, width w, into one buffer (and back).
template <class Get>
void concat_rows(const std::vector<CpuBackend*>& ms, Get from, int64_t w, float* dst) {
  for (CpuBackend* m : ms) {
    const int64_t T = m->rows();
    std::memcpy(dst, from(m), size_t(T * w) * 4);
    dst += T * w;
  }
}

}  // namespace

void CpuBackend::matmul_batched(Proj p, int l, std::span<Backend* const> members) {
  if (members.size() == 1 && members[0] == this) return matmul(p, l);
  int64_t total = 0;
  const std::vector<CpuBackend*> ms = members_of(members, &total);
  const LayerWeights& L = w_.layers[size_t(l)];
  // Input, its width, the weights, output and its width, as matmul() has them.
  const auto in = [p](CpuBackend* m) -> float* {
    return p == Proj::O ? m->attn_.data() : p == Proj::Down ? m->act_.data() : m->xn_.data();
  };
  const auto out = [p](CpuBackend* m) -> float* {
    return p == Proj::QKV ? m->qkv_.data() : p == Proj::GateUp ? m->ff_.data() : m->branch_.data();
  };
  const int64_t K = p == Proj::O ? Q_ : p == Proj::Down ? F_ : D_;
  const int64_t N = p == Proj::QKV ? QKV_ : p == Proj::GateUp ? 2 * F_ : D_;
  const Matrix& W = p == Proj::QKV      ? L.wqkv
                    : p == Proj::O      ? L.wo
                    : p == Proj::GateUp ? L.w_gate_up
                                        : L.w_down;
  // A member with many rows (a prefill) runs its own GEMM in place: reading the weights once more
  // costs it little, where copying its rows into the shared buffer and back cost a 2,048-token
  // prefill 10% beside one decoding member (BM_MixedIteration). The rest share one GEMM, so
  // decoding rows read the weights once for all of them.
  std::vector<CpuBackend*> shared;
  int64_t rows = 0;
  for (CpuBackend* m : ms) {
    if (m->T() >= kRowsForOwnGemm) {
      gemm_.run(ctx_, in(m), m->T(), K, W, out(m), N);
    } else if (m->T() > 0) {
      shared.push_back(m);
      rows += m->T();
    }
  }
  if (shared.size() == 1) {
    gemm_.run(ctx_, in(shared[0]), rows, K, W, out(shared[0]), N);
  } else if (shared.size() > 1) {
    if (batch_in_.size() < rows * K) batch_in_.resize(rows * K, false);
    if (batch_out_.size() < rows * N) batch_out_.resize(rows * N, false);
    concat_rows(shared, in, K, batch_in_.data());
    gemm_.run(ctx_, batch_in_.data(), rows, K, W, batch_out_.data(), N);
    const float* src = batch_out_.data();
    for (CpuBackend* m : shared) {
      std::memcpy(out(m), src, size_t(m->T() * N) * 4);
      src += m->T() * N;
    }
  }
  if (p == Proj::QKV)
    for (CpuBackend* m : ms) m->add_qkv_bias(l);
}

void CpuBackend::experts_batched(int l, std::span<Backend* const> members) {
  if (members.size() == 1 && members[0] == this) return experts(l);
  int64_t total = 0;
  const std::vector<CpuBackend*> ms = members_of(members, &total);
  if (batch_in_.size() < total * D_) batch_in_.resize(total * D_, false);
  if (batch_out_.size() < total * D_) batch_out_.resize(total * D_, false);
  concat_rows(
      ms, [](CpuBackend* m) { return m->xn_.data(); }, D_, batch_in_.data());
  batch_routes_.k = c_.n_expert_used;
  batch_routes_.ids.clear();
  batch_routes_.w.clear();
  for (CpuBackend* m : ms) {
    if (m->routes_.rows() != m->T()) internal_fail("experts_batched: a member's rows are not routed");
    batch_routes_.ids.insert(batch_routes_.ids.end(), m->routes_.ids.begin(), m->routes_.ids.end());
    batch_routes_.w.insert(batch_routes_.w.end(), m->routes_.w.begin(), m->routes_.w.end());
  }
  moe_experts(ctx_, gemm_, w_.layers[size_t(l)], batch_routes_, c_.n_ff_exp, c_.gelu, batch_in_.data(), total,
              D_, batch_out_.data(), moe_);
  const float* src = batch_out_.data();
  for (CpuBackend* m : ms) {
    std::memcpy(m->branch_.data(), src, size_t(m->T() * D_) * 4);
    src += m->T() * D_;
  }
}

void CpuBackend::lm_head_batched(std::span<Backend* const> members, float* logits, int64_t n_vocab) {
  if (members.size() == 1 && members[0] == this) return lm_head(logits);
  int64_t total = 0;
  const std::vector<CpuBackend*> ms = members_of(members, &total);
  if (batch_in_.size() < total * D_) batch_in_.resize(total * D_, false);
  concat_rows(
      ms, [](CpuBackend* m) { return m->xn_.data(); }, D_, batch_in_.data());
  gemm_.run(ctx_, batch_in_.data(), total, D_, w_.lm_head(), logits, c_.n_vocab);
}

void CpuBackend::for_each_member(int64_t n, const std::function<void(int64_t)>& f) {
  ctx_.side_by_side(n, f);
}

Buffer<float>& CpuBackend::tensor(Tensor t) {
  Buffer<float>* const by_tensor[] = {&x_, &xn_, &qkv_, &attn_, &ff_, &act_, &branch_};  // Tensor's order
  return *by_tensor[int(t)];
}

void CpuBackend::write(Tensor t, std::span<const float> data) {
  logits_.forget();
  const int64_t n = T() * tensor_width(c_, t);
  if (int64_t(data.size()) != n)
    fail("write: {} floats for {} rows of {}", data.size(), T(), tensor_width(c_, t));
  std::copy(data.begin(), data.end(), tensor(t).data());
}

std::vector<float> CpuBackend::read(Tensor t) {
  const float* p = tensor(t).data();
  return {p, p + T() * tensor_width(c_, t)};
}

void CpuBackend::reset() {
  logits_.forget();
  for (auto& kv : kv_) kv.clear();
  aux_.clear();
}

void CpuBackend::kv_export(int l, int64_t n, std::span<std::byte> out) {
  const LayerKV& kv = kv_[size_t(l)];
  if (int64_t(out.size()) != 2 * n * kv.row_bytes())
    fail("KV export: {} bytes for {} tokens of {} bytes (K and V)", out.size(), n, 2 * kv.row_bytes());
  kv.export_rows(n, out.data());
}

void CpuBackend::kv_import(int l, std::span<const int32_t> pos, std::span<const std::byte> rows) {
  logits_.forget();
  LayerKV& kv = kv_[size_t(l)];
  const int64_t n = int64_t(pos.size());
  if (int64_t(rows.size()) != 2 * n * kv.row_bytes())
    fail("KV import: {} bytes for {} tokens of {} bytes (K and V)", rows.size(), n, 2 * kv.row_bytes());
  kv.import_rows(rows.data(), pos.data(), n);
}

void CpuBackend::kv_read(int l, std::span<const int32_t> slots, std::span<std::byte> out) {
  const LayerKV& kv = kv_[size_t(l)];
  if (int64_t(out.size()) != 2 * int64_t(slots.size()) * kv.row_bytes())
    fail("KV read: {} bytes for {} tokens of {} bytes (K and V)", out.size(), slots.size(),
         2 * kv.row_bytes());
  kv.export_slots(slots, out.data());
}

void CpuBackend::aux_load(std::span<const int64_t> entries, std::span<const float> states) {
  const int64_t D = D_;
  if (int64_t(states.size()) != int64_t(entries.size()) * D)
    fail("Aux Cache load: {} floats for {} states of {}", states.size(), entries.size(), D);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i] < 0) fail("Aux Cache load: entry {}", entries[i]);
    const size_t end = size_t(entries[i] + 1) * size_t(D);
    if (aux_.size() < end) aux_.resize(end);
    std::copy_n(states.data() + int64_t(i) * D, D, aux_.data() + entries[i] * D);
  }
}

std::vector<int32_t> CpuBackend::kv_positions(int l) {
  const LayerKV& kv = kv_[size_t(l)];
  std::vector<int32_t> out(kv.pos.begin(), kv.pos.begin() + kv.n);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<float> CpuBackend::aux_state(int64_t e) {
  if (e < 0 || size_t(e + 1) * size_t(D_) > aux_.size()) fail("aux_state: no Aux Cache entry {}", e);
  return {aux_.begin() + e * D_, aux_.begin() + (e + 1) * D_};
}

}  // namespace lp
