#include "kernels/cuda/cuda_session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.h"
#include "kernels/sampler.h"
#include "model/error.h"
#include "model/ops.h"
#include "traces/schedule.h"

namespace lp::cuda {
namespace {

// Device memory freed at scope exit; regrown (contents dropped) by reserve().
class DBuf {
 public:
  DBuf() = default;
  DBuf(size_t bytes, const char* what) { reserve(bytes, what); }
  ~DBuf() { device_free(p_); }
  DBuf(const DBuf&) = delete;
  DBuf& operator=(const DBuf&) = delete;
  DBuf(DBuf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  DBuf& operator=(DBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void reserve(size_t bytes, const char* what) {
    if (bytes <= bytes_) return;
    device_free(p_);
    p_ = nullptr;
    p_ = device_alloc(bytes, what);
    bytes_ = bytes;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
DBuf upload(const T* data, size_t count, const char* what) {
  DBuf b(std::max<size_t>(1, count) * sizeof(T), what);
  if (count) copy_to_device(b.as<void>(), data, count * sizeof(T));
  return b;
}

// A weight matrix [N][K] on the device in the model's dtype.
struct DMatrix {
  int64_t rows = 0, cols = 0;
  bool bf16 = false;
  DBuf data;
};

DMatrix upload(const Matrix& m, const char* what) {
  DMatrix d;
  d.rows = m.rows;
  d.cols = m.cols;
  d.bf16 = m.dtype == DType::BF16;
  d.data = d.bf16 ? upload(m.bf16.data(), size_t(m.rows * m.cols), what)
                  : upload(m.f32.data(), size_t(m.rows * m.cols), what);
  return d;
}

struct DLayer {
  DBuf attn_norm, ffn_norm;
  DMatrix wqkv, wo, w_gate_up, w_down;
  DBuf k, v, pos, bits;           // K/V [n_ctx][kv], positions [n_ctx], has-KV bits
  std::vector<int32_t> pos_host;  // position of each slot
  std::vector<int64_t> slot_of;   // position -> slot, -1 when the layer has no K/V for it
  int64_t n = 0;
};

// Per-op timing on the GPU: the device is synchronised before and after the op, so each op's
// wall time is its own (launch overhead included; no overlap between ops while timing).
template <class F>
void time_op(OpTimers* t, int layer, Op op, const OpShape& shape, const ModelConfig& c, F&& f) {
  if (!t) {
    f();
    return;
  }
  synchronize("op timer");
  const auto t0 = std::chrono::steady_clock::now();
  f();
  synchronize("op timer");
  t->add(layer, op, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
         op_flops(c, op, shape), op_bytes(c, op, shape, t->dtypes), double(shape.tokens));
}

}  // namespace

struct CudaSession::Impl {
  const Model& m;
  const ModelConfig& c;
  int64_t n_ctx;
  std::vector<DLayer> layers;
  DMatrix tok_embd, own_lm_head;
  const DMatrix* lm_head = nullptr;  // &tok_embd when the embeddings are tied (uploaded once)
  DBuf output_norm, rope_freqs;
  DBuf slot_ids;  // 0 .. n_ctx - 1: a layer's K/V append writes slots n .. n + T - 1 = slot_ids + n
  DBuf keep_dev;  // the kept indices of a selection made on the device
  bool has_freqs = false;
  // Scratch, grown on demand.
  DBuf x, x2, xn, qkv, q, k, v, attn, tmp, ff, act, a16, pos_dev, idx, scores, logits;
  DBuf kbuf, vbuf, kpos;  // the K/V rows of a key subset (decoding steps), gathered
  DBuf idx2;              // a second row index (copies between buffers)
  DBuf aux_states;        // the Aux Cache's hidden states [n_ctx][D]: entry e of the host index is row e
  int64_t weight_bytes = 0;
  int64_t bit_words = 0;

  Impl(const Model& model, int64_t ctx) : m(model), c(model.config()), n_ctx(ctx) {}

  // Element sizes for the op counts, as the CPU backend's (GEMM inputs in the weights' dtype, f32 K/V).
  OpDtypes dtypes() const {
    const double b = m.weights().dtype == DType::BF16 ? 2 : 4;
    return {b, b, 4};
  }

  // out[T][N] = a[T][K] . w^T, through bf16 inputs when the weights are bf16.
  void mm(const float* a, int64_t T, const DMatrix& w, float* out) {
    if (w.bf16) {
      a16.reserve(size_t(T * w.cols) * 2, "bf16 activations");
      to_bf16(a, a16.as<uint16_t>(), T * w.cols);
      gemm_bf16(a16.as<uint16_t>(), w.data.as<uint16_t>(), out, T, w.cols, w.rows);
    } else {
      gemm_f32(a, w.data.as<float>(), out, T, w.cols, w.rows);
    }
  }

  // dst[to[i]] = src[from[i]], rows of D floats.
  void copy_indexed(const DBuf& src, const std::vector<int64_t>& from, DBuf& dst,
                    const std::vector<int64_t>& to) {
    if (from.empty()) return;
    idx.reserve(from.size() * 8, "row indices");
    idx2.reserve(to.size() * 8, "row indices");
    copy_to_device(idx.as<void>(), from.data(), from.size() * 8);
    copy_to_device(idx2.as<void>(), to.data(), to.size() * 8);
    copy_rows(src.as<float>(), idx.as<int64_t>(), dst.as<float>(), idx2.as<int64_t>(), int64_t(from.size()),
              c.n_embd);
  }

  // Rows `rows` of x (tokens at positions pos[i]) into the Aux Cache as the input of layer
  // `layer`: the host index records the entry, the device holds the state.
  void store_aux(AuxCache& aux, const std::vector<int64_t>& rows, const std::vector<int32_t>& pos,
                 int layer) {
    std::vector<int64_t> entries(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      aux.put(pos[i], layer, nullptr, 0);  // the index only: D = 0 on the host
      entries[i] = aux.find(pos[i]);
      if (entries[i] >= n_ctx)
        fail("internal error: Aux Cache entry {} beyond its {} rows", entries[i], n_ctx);
    }
    copy_indexed(x, rows, aux_states, entries);
  }

  // A pruning step's selection over the n tokens at positions pos (pos_on_device holds them on the
  // device, in the same order): LazyLLM's top-k by score runs on the device (CUB radix sorts,
  // cuda::select_top) from the scores the last_row_scores launch left in `scores`, and only the
  // kept indices come back; the other policies (static keeps its first scores, random draws on
  // the host) select on the host. Scores come to the host when a policy or the stats need them.
  // With keep_on_device the kept indices are left in keep_dev as well (uploaded if chosen on the host).
  std::vector<int64_t> select(PruningPolicy& policy, int l, const std::vector<int32_t>& pos,
                              const int32_t* pos_on_device, int64_t n_keep, std::vector<float>* host_scores,
                              bool keep_on_device, OpTimers* tm) {
    const int64_t n = int64_t(pos.size());
    const bool on_device = policy.kind() == PolicyKind::LazyLLM;
    std::vector<float> h;
    if (policy.needs_scores() && (host_scores || !on_device)) {
      h.resize(size_t(n));
      copy_to_host(h.data(), scores.as<void>(), size_t(n) * 4);
      if (host_scores) *host_scores = h;
    }
    std::vector<int64_t> keep;
    if (on_device) {
      keep.resize(size_t(n_keep));
      keep_dev.reserve(keep.size() * 8, "kept indices");
      time_op(tm, l, Op::Select, OpShape{0, 0, n}, c, [&] {
        cuda::select_top(scores.as<float>(), pos_on_device, n, n_keep, keep_dev.as<int64_t>());
        copy_to_host(keep.data(), keep_dev.as<void>(), keep.size() * 8);
      });
    } else {
      time_op(tm, l, Op::Select, OpShape{0, 0, n}, c, [&] { keep = policy.select(l, pos, h, n_keep); });
      if (keep_on_device) {
        keep_dev.reserve(keep.size() * 8, "kept indices");
        copy_to_device(keep_dev.as<void>(), keep.data(), keep.size() * 8);
      }
    }
    return keep;
  }

  void reserve(int64_t T) {
    const int64_t D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
    const size_t f = 4;
    x.reserve(size_t(T * D) * f, "hidden states");
    x2.reserve(size_t(T * D) * f, "hidden states");
    xn.reserve(size_t(T * D) * f, "normed states");
    qkv.reserve(size_t(T * (H + 2 * Hkv) * Dh) * f, "qkv");
    q.reserve(size_t(T * H * Dh) * f, "q");
    k.reserve(size_t(T * Hkv * Dh) * f, "k");
    v.reserve(size_t(T * Hkv * Dh) * f, "v");
    attn.reserve(size_t(T * H * Dh) * f, "attention output");
    tmp.reserve(size_t(T * D) * f, "residual branch");
    ff.reserve(size_t(T * 2 * F) * f, "gate/up");
    act.reserve(size_t(T * F) * f, "SwiGLU");
    pos_dev.reserve(size_t(T) * 4, "positions");
    idx.reserve(size_t(T) * 8, "row indices");
    scores.reserve(size_t(T) * 4, "scores");
  }

  // One layer over the T active rows of x at positions act_pos (uploaded in pos_dev). The rows'
  // K/V are appended first; the rows attend to the keys at positions `keys` (all held once the
  // rows are appended) or, when `keys` is null, to every key the layer holds. Leaves the keys
  // attended in kbuf/kpos when `keys` is given (for scoring).
  void run_layer(int l, const std::vector<int32_t>& act_pos, ForwardStats* stats, OpTimers* tm,
                 const std::vector<int32_t>* keys = nullptr) {
    const int64_t T = int64_t(act_pos.size());
    const int64_t D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
    const int64_t Q = H * Dh, KV = Hkv * Dh, QKV = Q + 2 * KV;
    DLayer& L = layers[size_t(l)];
    const OpShape rows{T, 0, 0};
    time_op(tm, l, Op::AttnNorm, rows, c,
            [&] { rmsnorm(x.as<float>(), L.attn_norm.as<float>(), xn.as<float>(), T, D, c.rms_eps); });
    time_op(tm, l, Op::QKV, rows, c, [&] {
      mm(xn.as<float>(), T, L.wqkv, qkv.as<float>());
      copy_columns(qkv.as<float>(), QKV, q.as<float>(), Q, Q, T);
      copy_columns(qkv.as<float>() + Q, QKV, k.as<float>(), KV, KV, T);
      copy_columns(qkv.as<float>() + Q + KV, QKV, v.as<float>(), KV, KV, T);
    });
    const float* freqs = has_freqs ? rope_freqs.as<float>() : nullptr;
    time_op(tm, l, Op::Rope, rows, c, [&] {
      rope(q.as<float>(), pos_dev.as<int32_t>(), T, H, Dh, c.rope_dim, c.rope_theta, freqs);
      rope(k.as<float>(), pos_dev.as<int32_t>(), T, Hkv, Dh, c.rope_dim, c.rope_theta, freqs);
    });
    // K/V append: slots n .. n + T - 1; positions recorded on both sides. Nothing here waits for
    // the device: the slots are a slice of slot_ids and the positions come from pos_dev.
    kv_append(k.as<float>(), v.as<float>(), slot_ids.as<int64_t>() + L.n, pos_dev.as<int32_t>(), T, KV,
              L.k.as<float>(), L.v.as<float>(), L.bits.as<uint32_t>());
    copy_on_device(L.pos.as<int32_t>() + L.n, pos_dev.as<void>(), size_t(T) * 4);
    for (int64_t t = 0; t < T; ++t) {
      const int32_t p = act_pos[size_t(t)];
      if (L.slot_of[size_t(p)] >= 0) fail("internal error: position {} computed twice at layer {}", p, l);
      L.slot_of[size_t(p)] = L.n + t;
    }
    L.pos_host.insert(L.pos_host.end(), act_pos.begin(), act_pos.end());
    L.n += T;
    // Causal pairs: for each row, the keys attended at or before it.
    std::vector<int32_t> kp = keys ? *keys : L.pos_host;
    std::sort(kp.begin(), kp.end());
    int64_t pairs = 0;
    for (int32_t p : act_pos) pairs += int64_t(std::upper_bound(kp.begin(), kp.end(), p) - kp.begin());
    const int64_t n_keys = keys ? int64_t(keys->size()) : L.n;
    time_op(tm, l, Op::Attention, OpShape{T, pairs, n_keys}, c, [&] {
      if (!keys) {
        attention(q.as<float>(), pos_dev.as<int32_t>(), T, L.k.as<float>(), L.v.as<float>(),
                  L.pos.as<int32_t>(), L.n, H, Hkv, Dh, attn.as<float>());
        return;
      }
      // A subset: its K/V rows gathered by slot, in the order of `keys`.
      std::vector<int64_t> ks(keys->size());
      for (size_t i = 0; i < keys->size(); ++i) {
        ks[i] = L.slot_of[size_t((*keys)[i])];
        if (ks[i] < 0) fail("internal error: key at position {} has no K/V at layer {}", (*keys)[i], l);
      }
      kbuf.reserve(size_t(n_keys * KV) * 4, "gathered K");
      vbuf.reserve(size_t(n_keys * KV) * 4, "gathered V");
      kpos.reserve(size_t(n_keys) * 4, "gathered positions");
      idx.reserve(size_t(n_keys) * 8, "row indices");
      copy_to_device(idx.as<void>(), ks.data(), ks.size() * 8);
      gather_rows(L.k.as<float>(), idx.as<int64_t>(), kbuf.as<float>(), n_keys, KV);
      gather_rows(L.v.as<float>(), idx.as<int64_t>(), vbuf.as<float>(), n_keys, KV);
      copy_to_device(kpos.as<void>(), keys->data(), keys->size() * 4);
      attention(q.as<float>(), pos_dev.as<int32_t>(), T, kbuf.as<float>(), vbuf.as<float>(),
                kpos.as<int32_t>(), n_keys, H, Hkv, Dh, attn.as<float>());
    });
    time_op(tm, l, Op::OProj, rows, c, [&] { mm(attn.as<float>(), T, L.wo, tmp.as<float>()); });
    time_op(tm, l, Op::Residual, rows, c, [&] { add_inplace(x.as<float>(), tmp.as<float>(), T * D); });
    time_op(tm, l, Op::FfnNorm, rows, c,
            [&] { rmsnorm(x.as<float>(), L.ffn_norm.as<float>(), xn.as<float>(), T, D, c.rms_eps); });
    time_op(tm, l, Op::GateUp, rows, c, [&] { mm(xn.as<float>(), T, L.w_gate_up, ff.as<float>()); });
    time_op(tm, l, Op::SwiGLU, rows, c, [&] { swiglu_fused(ff.as<float>(), act.as<float>(), T, F); });
    time_op(tm, l, Op::Down, rows, c, [&] { mm(act.as<float>(), T, L.w_down, tmp.as<float>()); });
    time_op(tm, l, Op::Residual, rows, c, [&] { add_inplace(x.as<float>(), tmp.as<float>(), T * D); });
    if (stats) {
      stats->computed[size_t(l)] = T;
      stats->keys[size_t(l)] = L.n;
      stats->pairs[size_t(l)] = pairs;
      stats->attended[size_t(l)] = n_keys;
    }
  }
};

CudaSession::CudaSession(const Model& m, int64_t n_ctx) {
  const Device dev = open_device();
  const ModelConfig& c = m.config();
  const Weights& w = m.weights();
  const int64_t KV = int64_t(c.n_head_kv) * c.head_dim;
  // Everything the session allocates, counted before anything is: K/V with positions and has-KV
  // bits, the Aux Cache's states, and the activations of the largest step, a prefill of all n_ctx
  // tokens at once (Impl::reserve and mm's bf16 copy: x, x2, xn and the residual branch, qkv and
  // its q, k, v, the attention output, gate|up, SwiGLU, positions, indices, scores), with what a
  // decoding step adds over n_ctx keys (the gathered K, V and positions, a second row index) and
  // the selection's sort buffers (CUB: keys, order, their sorted copies and its scratch).
  const int64_t bit_words = (std::max<int64_t>(c.n_ctx_train, n_ctx) + 31) / 32;
  const double kv_bytes = double(c.n_layer) * (double(n_ctx) * (2.0 * KV * 4 + 4) + double(bit_words) * 4);
  const double aux_bytes = double(n_ctx) * double(c.n_embd) * 4;
  const double Q = double(c.n_head) * c.head_dim, F = double(c.n_ff), D = double(c.n_embd);
  const double bf16_copy = w.dtype == DType::BF16 ? 2 * std::max({D, Q, F}) : 0;
  const double prefill = 4 * (4 * D + 3 * Q + 4 * double(KV) + 3 * F) + bf16_copy + 24;
  const double decode = 2.0 * KV * 4 + 4 + 8, selection = 6 * 8, slot_ids = 8;
  const double act_bytes =
      double(n_ctx) * (prefill + decode + selection + slot_ids) + double(c.n_vocab) * 4 /* logits */;
  // cuBLAS's workspace and the kernels' modules: a margin, not a count.
  const double library_bytes = 256.0 * 1048576;
  const double need = double(w.bytes()) + kv_bytes + aux_bytes + act_bytes + library_bytes;
  if (need > double(dev.free_bytes))
    fail(
        "the model needs {:.2f} GiB on the GPU (weights {:.2f} + K/V {:.2f} + Aux Cache {:.2f} + activations "
        "{:.2f} "
        "for {} tokens + 0.25 for cuBLAS) but {} has {:.2f} GiB free",
        need / 1073741824.0, double(w.bytes()) / 1073741824.0, kv_bytes / 1073741824.0,
        aux_bytes / 1073741824.0, act_bytes / 1073741824.0, n_ctx, dev.name,
        double(dev.free_bytes) / 1073741824.0);
  if (!c.uniform()) fail("the CUDA backend runs uniform models (every layer the same widths)");
  impl_ = std::make_unique<Impl>(m, n_ctx);
  Impl& s = *impl_;
  s.tok_embd = upload(w.tok_embd, "token embeddings");
  if (c.tied_embeddings) {
    s.lm_head = &s.tok_embd;
  } else {
    s.own_lm_head = upload(w.lm_head(), "LM head");
    s.lm_head = &s.own_lm_head;
  }
  s.output_norm = upload(w.output_norm.data(), w.output_norm.size(), "output norm");
  s.has_freqs = !w.rope_freqs.empty();
  if (s.has_freqs) s.rope_freqs = upload(w.rope_freqs.data(), w.rope_freqs.size(), "RoPE factors");
  // One has-KV bit per position a session may use: up to the model's context (or n_ctx).
  s.bit_words = bit_words;
  std::vector<int64_t> ids(static_cast<size_t>(n_ctx));
  std::iota(ids.begin(), ids.end(), int64_t(0));
  s.slot_ids = upload(ids.data(), ids.size(), "K/V slots");
  s.layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    DLayer& L = s.layers[size_t(l)];
    L.attn_norm = upload(lw.attn_norm.data(), lw.attn_norm.size(), "attention norm");
    L.ffn_norm = upload(lw.ffn_norm.data(), lw.ffn_norm.size(), "FFN norm");
    L.wqkv = upload(lw.wqkv, "qkv weights");
    L.wo = upload(lw.wo, "o weights");
    L.w_gate_up = upload(lw.w_gate_up, "gate/up weights");
    L.w_down = upload(lw.w_down, "down weights");
    L.k.reserve(size_t(n_ctx * KV) * 4, "K cache");
    L.v.reserve(size_t(n_ctx * KV) * 4, "V cache");
    L.pos.reserve(size_t(n_ctx) * 4, "K/V positions");
    const std::vector<uint32_t> zero(size_t(s.bit_words), 0u);
    L.bits = upload(zero.data(), zero.size(), "has-KV bits");
    L.slot_of.assign(size_t(s.bit_words * 32), -1);
  }
  s.aux_states.reserve(size_t(n_ctx * c.n_embd) * 4, "Aux Cache");
  s.weight_bytes = w.bytes();
  synchronize("weight upload");
}

CudaSession::~CudaSession() = default;

void CudaSession::reset() {
  const std::vector<uint32_t> zero(size_t(impl_->bit_words), 0u);
  for (DLayer& L : impl_->layers) {
    L.n = 0;
    L.pos_host.clear();
    std::fill(L.slot_of.begin(), L.slot_of.end(), -1);
    copy_to_device(L.bits.as<void>(), zero.data(), zero.size() * 4);
  }
  aux_ = AuxCache{};
}

int64_t CudaSession::n_cached() const {
  return impl_->layers.empty() ? 0 : impl_->layers[0].n;
}

int64_t CudaSession::aux_bytes() const {
  return aux_.size() * (int64_t(impl_->c.n_embd) * 4 + 8);
}

int64_t CudaSession::device_bytes() const {
  const Impl& s = *impl_;
  int64_t b = s.weight_bytes;
  for (const DLayer& L : s.layers) b += int64_t(L.k.bytes() + L.v.bytes() + L.pos.bytes() + L.bits.bytes());
  for (const DBuf* d :
       {&s.x,      &s.x2,   &s.xn,   &s.qkv,  &s.q,        &s.k,        &s.v,         &s.attn,
        &s.tmp,    &s.ff,   &s.act,  &s.a16,  &s.pos_dev,  &s.idx,      &s.idx2,      &s.scores,
        &s.logits, &s.kbuf, &s.vbuf, &s.kpos, &s.slot_ids, &s.keep_dev, &s.aux_states})
    b += int64_t(d->bytes());
  return b;
}

std::vector<int32_t> CudaSession::kv_positions(int l) const {
  const Impl& s = *impl_;
  if (l < 0 || l >= int(s.layers.size())) fail("kv_positions: layer {} outside [0, {})", l, s.layers.size());
  std::vector<uint32_t> bits(static_cast<size_t>(s.bit_words));
  synchronize("has-KV bits");
  copy_to_host(bits.data(), s.layers[size_t(l)].bits.as<void>(), bits.size() * 4);
  std::vector<int32_t> out;
  for (int64_t p = 0; p < s.bit_words * 32; ++p)
    if (cuda_math::has_kv(bits.data(), int32_t(p))) out.push_back(int32_t(p));
  return out;
}

void CudaSession::forward(std::span<const int32_t> ids, std::span<const int32_t> pos,
                          std::span<const int64_t> logit_rows, float* logits, const PruneRequest* prune,
                          ForwardStats* stats, OpTimers* timers) {
  Impl& s = *impl_;
  const ModelConfig& c = s.c;
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("forward: no tokens");
  if (pos.size() != ids.size()) fail("forward: {} ids but {} positions", ids.size(), pos.size());
  if (n_cached() + T > s.n_ctx)
    fail("context full: {} cached + {} new tokens exceed the context size {}", n_cached(), T, s.n_ctx);
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= c.n_vocab)
      fail("token id {} is outside the vocabulary [0, {})", ids[t], c.n_vocab);
    if (pos[t] < 0 || int64_t(pos[t]) >= s.bit_words * 32)
      fail("forward: position {} outside [0, {})", pos[t], s.bit_words * 32);
    if (t > 0 && pos[t] <= pos[t - 1]) fail("forward: positions must be strictly increasing");
  }
  for (int64_t r : logit_rows)
    if (r < 0 || r >= T) fail("forward: logit row {} out of range", r);
  const bool pruning = prune && prune->policy && !prune->steps.empty();
  if (pruning) {
    if (n_cached() != 0) fail("forward: pruning needs an empty cache (a prefill)");
    if (logit_rows.size() != 1 || logit_rows[0] != T - 1)
      fail("forward: with pruning only the last row can have logits");
  }
  const int64_t D = c.n_embd, Q = int64_t(c.n_head) * c.head_dim;
  if (stats) {
    *stats = ForwardStats{};
    stats->computed = stats->keys = stats->pairs = stats->attended = stats->aux_written = stats->revived =
        std::vector<int64_t>(size_t(c.n_layer), 0);
    stats->revived_pos.assign(size_t(c.n_layer), {});
  }
  s.reserve(T);
  if (timers && timers->empty()) timers->init(c.n_layer, s.dtypes());

  // Embedding rows.
  std::vector<int64_t> id64(ids.begin(), ids.end());
  copy_to_device(s.idx.as<void>(), id64.data(), size_t(T) * 8);
  time_op(timers, c.n_layer, Op::Embed, OpShape{T, 0, 0}, c, [&] {
    if (s.tok_embd.bf16)
      gather_rows_bf16(s.tok_embd.data.as<uint16_t>(), s.idx.as<int64_t>(), s.x.as<float>(), T, D);
    else
      gather_rows(s.tok_embd.data.as<float>(), s.idx.as<int64_t>(), s.x.as<float>(), T, D);
  });
  std::vector<int32_t> act_pos(pos.begin(), pos.end());
  copy_to_device(s.pos_dev.as<void>(), act_pos.data(), size_t(T) * 4);

  size_t next_step = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const int64_t Tl = int64_t(act_pos.size());
    s.run_layer(l, act_pos, stats, timers);
    if (!pruning || next_step == prune->steps.size() || prune->steps[next_step].layer != l) continue;
    // The keys here are exactly the active rows (the cache started empty); the last row scores them.
    const double share = prune->steps[next_step++].share;
    std::vector<float> scores;
    if (prune->policy->needs_scores()) {
      time_op(timers, l, Op::Score, OpShape{1, 0, Tl}, c, [&] {
        last_row_scores(s.q.as<float>() + (Tl - 1) * Q, s.layers[size_t(l)].k.as<float>(), Tl, c.n_head,
                        c.n_head_kv, c.head_dim, s.scores.as<float>());
      });
    }
    const std::vector<int64_t> keep =
        s.select(*prune->policy, l, act_pos, s.pos_dev.as<int32_t>(), tokens_kept(Tl, share),
                 stats ? &scores : nullptr, true, timers);
    if (keep.empty() || keep.back() != Tl - 1) fail("pruning policy dropped the last token");
    if (stats) stats->scores.push_back(scores);
    if (int64_t(keep.size()) < Tl)
      time_op(timers, l, Op::Gather, OpShape{Tl, 0, 0}, c, [&] {
        // Pruned rows' hidden states (the input of layer l + 1) to the Aux Cache.
        size_t k = 0;
        std::vector<int32_t> kept_pos, pruned_pos;
        std::vector<int64_t> pruned;
        for (int64_t r = 0; r < Tl; ++r) {
          if (k < keep.size() && keep[k] == r) {
            kept_pos.push_back(act_pos[size_t(r)]);
            ++k;
            continue;
          }
          pruned.push_back(r);
          pruned_pos.push_back(act_pos[size_t(r)]);
          if (stats) {
            ++stats->aux_writes;
            ++stats->aux_written[size_t(l)];
          }
        }
        s.store_aux(aux_, pruned, pruned_pos, l + 1);
        gather_rows(s.x.as<float>(), s.keep_dev.as<int64_t>(), s.x2.as<float>(), int64_t(keep.size()), D);
        std::swap(s.x, s.x2);
        act_pos = std::move(kept_pos);
        copy_to_device(s.pos_dev.as<void>(), act_pos.data(), act_pos.size() * 4);
      });
    if (stats) stats->kept.push_back(act_pos);
  }

  const int64_t R = int64_t(logit_rows.size());
  if (R == 0) {
    synchronize("forward");
    return;
  }
  std::vector<int64_t> rows(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r)
    rows[size_t(r)] = pruning ? int64_t(act_pos.size()) - 1 : logit_rows[size_t(r)];
  copy_to_device(s.idx.as<void>(), rows.data(), size_t(R) * 8);
  gather_rows(s.x.as<float>(), s.idx.as<int64_t>(), s.xn.as<float>(), R, D);
  time_op(timers, c.n_layer, Op::OutputNorm, OpShape{R, 0, 0}, c,
          [&] { rmsnorm(s.xn.as<float>(), s.output_norm.as<float>(), s.tmp.as<float>(), R, D, c.rms_eps); });
  s.logits.reserve(size_t(R * c.n_vocab) * 4, "logits");
  time_op(timers, c.n_layer, Op::LmHead, OpShape{R, 0, 0}, c, [&] {
    s.mm(s.tmp.as<float>(), R, *s.lm_head, s.logits.as<float>());
    copy_to_host(logits, s.logits.as<void>(), size_t(R * c.n_vocab) * 4);
  });
}

void CudaSession::decode_step(int32_t id, int32_t p, float* logits, const PruneRequest& prune,
                              ForwardStats* stats, OpTimers* timers) {
  Impl& s = *impl_;
  const ModelConfig& c = s.c;
  if (id < 0 || id >= c.n_vocab) fail("token id {} is outside the vocabulary [0, {})", id, c.n_vocab);
  if (!prune.policy) fail("decode_step: no pruning policy");
  if (n_cached() + 1 > s.n_ctx) fail("context full: {} cached + 1 new token exceed {}", n_cached(), s.n_ctx);
  if (p < 0 || int64_t(p) >= s.bit_words * 32)
    fail("decode_step: position {} outside [0, {})", p, s.bit_words * 32);
  const DLayer& L0 = s.layers[0];
  // Layer 0 holds every token in position order (nothing is pruned before it).
  if (L0.n > 0 && p <= L0.pos_host.back()) fail("decode_step: position must be new");
  const int64_t D = c.n_embd, Q = int64_t(c.n_head) * c.head_dim;
  if (stats) {
    *stats = ForwardStats{};
    stats->computed = stats->keys = stats->pairs = stats->attended = stats->aux_written = stats->revived =
        std::vector<int64_t>(size_t(c.n_layer), 0);
    stats->revived_pos.assign(size_t(c.n_layer), {});
  }
  std::vector<int32_t> active(L0.pos_host.begin(), L0.pos_host.end());
  active.push_back(p);
  std::vector<int32_t> rows = {p};
  s.reserve(int64_t(active.size()));
  if (timers && timers->empty()) timers->init(c.n_layer, s.dtypes());
  const int64_t id64 = id;
  copy_to_device(s.idx.as<void>(), &id64, 8);
  if (s.tok_embd.bf16)
    gather_rows_bf16(s.tok_embd.data.as<uint16_t>(), s.idx.as<int64_t>(), s.x.as<float>(), 1, D);
  else
    gather_rows(s.tok_embd.data.as<float>(), s.idx.as<int64_t>(), s.x.as<float>(), 1, D);
  size_t next_step = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const DLayer& L = s.layers[size_t(l)];
    // Revival: active tokens without K/V here that are not rows yet come back from the Aux Cache,
    // whose entry is exactly this layer's input.
    std::vector<int32_t> revive;
    for (int32_t ap : active)
      if (L.slot_of[size_t(ap)] < 0 && ap != p && !std::binary_search(rows.begin(), rows.end(), ap))
        revive.push_back(ap);
    if (!revive.empty()) {
      const AuxCache::RevivalPlan plan = aux_.plan_revival(l, rows, revive);
      s.x2.reserve(rows.size() * size_t(D) * 4, "hidden states");
      s.copy_indexed(s.x, plan.x_src, s.x2, plan.x_dst);
      s.copy_indexed(s.aux_states, plan.aux_src, s.x2, plan.aux_dst);
      std::swap(s.x, s.x2);
      s.reserve(int64_t(rows.size()));  // x, now the merged rows, is already large enough
      if (stats) {
        stats->revived[size_t(l)] = int64_t(revive.size());
        stats->revived_pos[size_t(l)] = revive;
      }
    }
    const int64_t Tl = int64_t(rows.size());
    copy_to_device(s.pos_dev.as<void>(), rows.data(), rows.size() * 4);
    s.run_layer(l, rows, stats, timers, &active);

    const bool prune_here = next_step < prune.steps.size() && prune.steps[next_step].layer == l;
    if (prune_here) {
      const double share = prune.steps[next_step++].share;
      const int64_t n = int64_t(active.size());
      std::vector<float> scores;
      if (prune.policy->needs_scores()) {
        // The new token (the last row) over the step's active keys, gathered in kbuf (positions
        // in kpos) by run_layer.
        s.scores.reserve(size_t(n) * 4, "scores");
        time_op(timers, l, Op::Score, OpShape{1, 0, n}, c, [&] {
          last_row_scores(s.q.as<float>() + (Tl - 1) * Q, s.kbuf.as<float>(), n, c.n_head, c.n_head_kv,
                          c.head_dim, s.scores.as<float>());
        });
      }
      const std::vector<int64_t> keep =
          s.select(*prune.policy, l, active, s.kpos.as<int32_t>(), tokens_kept(n, share),
                   stats ? &scores : nullptr, false, timers);
      if (keep.empty() || keep.back() != n - 1) fail("pruning policy dropped the last token");
      if (stats) stats->scores.push_back(scores);
      std::vector<int32_t> kept;
      for (int64_t i : keep) kept.push_back(active[size_t(i)]);
      active.swap(kept);
      if (stats) stats->kept.push_back(active);
    }
    // Rows not selected stop here (their state to the Aux Cache); rows that already have K/V at
    // the next layer stop too.
    std::vector<int64_t> stay, leave;
    std::vector<int32_t> next_rows, leave_pos;
    for (int64_t r = 0; r < Tl; ++r) {
      const int32_t rp = rows[size_t(r)];
      const bool kept = !prune_here || std::binary_search(active.begin(), active.end(), rp);
      const bool next_has_kv = l + 1 < c.n_layer && s.layers[size_t(l + 1)].slot_of[size_t(rp)] >= 0;
      if (kept && !next_has_kv) {
        stay.push_back(r);
        next_rows.push_back(rp);
        continue;
      }
      if (!kept && l + 1 < c.n_layer) {
        leave.push_back(r);
        leave_pos.push_back(rp);
        if (stats) {
          ++stats->aux_writes;
          ++stats->aux_written[size_t(l)];
        }
      }
    }
    s.store_aux(aux_, leave, leave_pos, l + 1);
    if (next_rows.empty() || next_rows.back() != p) fail("internal error: the new token left the step");
    if (int64_t(stay.size()) < Tl) {
      copy_to_device(s.idx.as<void>(), stay.data(), stay.size() * 8);
      gather_rows(s.x.as<float>(), s.idx.as<int64_t>(), s.x2.as<float>(), int64_t(stay.size()), D);
      std::swap(s.x, s.x2);
    }
    rows.swap(next_rows);
  }
  // The new token's row: the last one.
  const int64_t last = int64_t(rows.size()) - 1;
  copy_to_device(s.idx.as<void>(), &last, 8);
  gather_rows(s.x.as<float>(), s.idx.as<int64_t>(), s.xn.as<float>(), 1, D);
  time_op(timers, c.n_layer, Op::OutputNorm, OpShape{1, 0, 0}, c,
          [&] { rmsnorm(s.xn.as<float>(), s.output_norm.as<float>(), s.tmp.as<float>(), 1, D, c.rms_eps); });
  s.logits.reserve(size_t(c.n_vocab) * 4, "logits");
  time_op(timers, c.n_layer, Op::LmHead, OpShape{1, 0, 0}, c, [&] {
    s.mm(s.tmp.as<float>(), 1, *s.lm_head, s.logits.as<float>());
    copy_to_host(logits, s.logits.as<void>(), size_t(c.n_vocab) * 4);
  });
}

GenerateResult generate(const Model& m, std::span<const int32_t> prompt_ids, const GenerateOptions& opt) {
  const ModelConfig& c = m.config();
  if (!opt.forced_ids.empty()) fail("teacher forcing is not available on the CUDA backend");
  if (opt.record_steps)
    fail("traces are recorded by the CPU backend only (drop --trace or use --backend cpu)");
  const int64_t N = int64_t(prompt_ids.size());
  if (N == 0) fail("the prompt is empty (no tokens)");
  if (c.n_ctx_train > 0 && N + opt.max_new_tokens > c.n_ctx_train)
    fail("{} prompt tokens + {} new tokens exceed the model's context of {}", N, opt.max_new_tokens,
         c.n_ctx_train);
  GenerateResult r;
  r.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  r.prune_steps =
      opt.policy == PolicyKind::None ? std::vector<PruneStep>{} : resolve_schedule(opt.schedule, c.n_layer);
  auto policy = make_policy(opt.policy, opt.prune_seed);
  const PruneRequest req{r.prune_steps, policy.get()};
  CudaSession s(m, N + std::max(1, opt.max_new_tokens));
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  Sampler sampler(opt.sampler);
  const int64_t last = N - 1;
  const auto t0 = std::chrono::steady_clock::now();
  s.forward(prompt_ids, pos, {&last, 1}, logits.data(), r.prune_steps.empty() ? nullptr : &req,
            &r.prefill_stats, opt.gpu_op_timers ? &r.prefill_ops : nullptr);
  r.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.last_prefill_logits = logits;
  int32_t next = sampler.sample(logits);
  r.ttft_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t computed = 0;
  for (int64_t v : r.prefill_stats.computed) computed += v;
  r.prompt_tokens_computed_fraction = double(computed) / double(N * c.n_layer);
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < opt.max_new_tokens; ++i) {
    r.generated_ids.push_back(next);
    if (opt.stop_at_end_of_generation && m.tokenizer().is_end_of_generation(next)) break;
    if (i + 1 == opt.max_new_tokens) break;
    const int32_t p = int32_t(N + i);
    const int64_t row = 0;
    if (r.prune_steps.empty()) {
      s.forward({&next, 1}, {&p, 1}, {&row, 1}, logits.data(), nullptr, nullptr,
                opt.gpu_op_timers ? &r.decode_ops : nullptr);
    } else {
      ForwardStats st;
      s.decode_step(next, p, logits.data(), req, &st, opt.gpu_op_timers ? &r.decode_ops : nullptr);
      for (int64_t v : st.revived) r.revivals += v;
    }
    ++r.decode_steps;
    next = sampler.sample(logits);
  }
  r.decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  r.text = m.tokenizer().decode(r.generated_ids);
  r.aux_cache_bytes = s.aux_bytes();
  return r;
}

}  // namespace lp::cuda
