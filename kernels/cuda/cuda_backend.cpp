#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "kernels/cpu/moe.h"  // group_by_key
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/memory.h"
#include "model/error.h"

namespace lp::cuda {
namespace {

// Every call by which a backend makes the host wait for the device: host_waits() counts them (a copy
// back, a synchronisation; device memory is stream-ordered and its frees do not wait). All
// work is queued on one stream (the legacy default stream), so after any of them returns, every
// operation queued before it has run. `waited` counts the returns on this thread: work this thread
// queued while it read w has run once it reads more than w. (Per thread: another thread's wait may
// have begun before the work was queued; `serve` drives a batch from one thread.)
std::atomic<int64_t> waits{0};
std::atomic<int64_t> uploads{0};  // of a model's weights (weight_uploads())
thread_local int64_t waited = 0;
void fetch(void* dst, const void* src, size_t bytes) {  // a copy to pageable host memory
  ++waits;
  copy_to_host(dst, src, bytes);
  ++waited;
}
void drain(const char* what) {
  ++waits;
  lp::cuda::synchronize(what);
  ++waited;
}

// Pinned host memory, freed at scope exit (only once no queued copy uses it).
struct PinnedBuf {
  void* p = nullptr;
  size_t bytes = 0;
  PinnedBuf() = default;
  PinnedBuf(size_t n, const char* what) : p(host_alloc_pinned(n, what)), bytes(n) {}
  ~PinnedBuf() { host_free_pinned(p); }
  PinnedBuf(PinnedBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr, o.bytes = 0; }
  PinnedBuf& operator=(PinnedBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
};

// Uploads that do not make the host wait: the bytes are copied into pinned memory and a copy from
// there queued behind the work on the stream (a cudaMemcpy from pageable memory waits for that work
// first). A region is written once between two waits of this thread (any backend's: a batch's
// members after the first seldom wait themselves), after which the stream has run every copy
// queued before, and the ring starts again from the beginning. Past the current chunk a larger one
// is taken without waiting (the old ones stay until the next wait); past kMaxBytes in all, it waits
// once and starts again.
class Staging {
 public:
  static constexpr size_t kMaxBytes = size_t(64) << 20;
  Staging() = default;
  void init(size_t bytes) {
    chunks_.clear();
    chunks_.emplace_back(bytes, "staged uploads");
    used_ = 0;
  }
  ~Staging() {
    // The stream must have run the queued copies before their memory goes; a device already in an
    // error state has nothing left to run (a destructor must not throw).
    if (used_ > 0 || chunks_.size() > 1) try {
        drain("staging memory freed");
      } catch (const Error&) {
      }
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  void put(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    if (used_ > 0 && thread_ != std::this_thread::get_id()) {  // `waited` is per thread
      drain("staging memory used from another thread");
      drained();
    }
    if (waited != round_) drained();  // a wait since this round's first upload
    if (used_ == 0) round_ = waited, thread_ = std::this_thread::get_id();
    const size_t need = (bytes + 63) & ~size_t(63);
    if (used_ + need > chunks_.back().bytes) {
      size_t total = 0;
      for (const PinnedBuf& c : chunks_) total += c.bytes;
      const size_t grown = std::max(2 * chunks_.back().bytes, need);
      if (total + grown > kMaxBytes) {
        drain("staging memory full");
        drained();
        round_ = waited, thread_ = std::this_thread::get_id();
        if (need > chunks_.back().bytes) chunks_.back() = PinnedBuf(grown, "staged uploads");
      } else {
        chunks_.emplace_back(grown, "staged uploads");
      }
      used_ = 0;
    }
    std::byte* at = static_cast<std::byte*>(chunks_.back().p) + used_;
    std::memcpy(at, src, bytes);
    copy_to_device_async(dst, at, bytes);
    used_ += need;
  }
  // The stream has run every queued copy: the largest chunk is kept, from its beginning.
  void drained() {
    if (chunks_.size() > 1) chunks_.erase(chunks_.begin(), chunks_.end() - 1);
    used_ = 0;
  }

 private:
  std::vector<PinnedBuf> chunks_;  // the last is being filled
  size_t used_ = 0;
  int64_t round_ = 0;       // `waited` when the first region since the ring started was written
  std::thread::id thread_;  // by this thread
};

// Device memory freed at scope exit; regrown (contents dropped) by reserve(). Stream-ordered
// (cudaMallocAsync / cudaFreeAsync from the device's pool, which keeps what is given back): neither
// waits for the device, so a LazyLLM step that revives more rows than a request held grows its
// buffers, and the scheduler gives them back after it, without a wait (cudaFree waited for every
// launch queued before it), and the work queued before a free still sees the memory.
class DBuf {
 public:
  DBuf() = default;
  DBuf(size_t bytes, const char* what) { reserve(bytes, what); }
  ~DBuf() { device_free_async(p_); }
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
    device_free_async(p_);
    p_ = nullptr, bytes_ = 0;  // empty, should the allocation fail
    p_ = device_alloc_async(bytes, what);
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

// A weight matrix [N][K] on the device in the model's dtype: f32, bf16, or (--dtype int8) its
// GGUF blocks as stored (qtype: a cuda_math::QType; 0 otherwise), row_bytes bytes a row.
struct DMatrix {
  int64_t rows = 0, cols = 0;
  bool bf16 = false;
  int qtype = 0;
  int64_t row_bytes = 0;
  DBuf data;
};

DMatrix upload(const Matrix& m, const char* what) {
  DMatrix d;
  d.rows = m.rows;
  d.cols = m.cols;
  d.bf16 = m.dtype == DType::BF16;
  d.row_bytes = m.row_bytes();
  if (m.dtype == DType::Int8) {
    // One type per device matrix: a matrix of one part goes up as the file holds it, parts of one
    // type side by side, mixed parts (Q4_K_M's attn_q|k|v) requantized to Q8_0.
    GgmlType t = m.qtype();
    std::vector<uint8_t> joined;
    if (m.parts.size() > 1) joined = m.contiguous_blocks(&t);
    d.qtype = int(t);
    d.row_bytes = *type_bytes(t, m.cols);
    if (!cuda_math::readable(d.qtype))
      fail(
          "the CUDA backend cannot read {} blocks of type {} (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and "
          "Q6_K only)",
          what, d.qtype);
    d.data = m.parts.size() > 1 ? upload(joined.data(), joined.size(), what)
                                : upload(m.parts.front().data, size_t(m.bytes()), what);
  } else {
    d.data = d.bf16 ? upload(m.bf16.data(), size_t(m.rows * m.cols), what)
                    : upload(m.f32.data(), size_t(m.rows * m.cols), what);
  }
  return d;
}

// Rows a matrix of blocks multiplies by reading its blocks directly (gemv_q); above, the prefill
// dequantizes it to bf16 once and runs the tensor-core GEMM.
constexpr int64_t kGemvMaxRows = 4;

// The model's weights on the device, uploaded once and shared by every backend made from the same
// Weights (each request of `serve` has its own backend: its own K/V, Aux Cache and activations).
struct DLayerWeights {
  DBuf attn_norm, ffn_norm;
  DBuf qkv_bias, q_norm, k_norm;        // where the model has them (Qwen2's biases, Qwen3's norms)
  DBuf post_attn_norm, post_ffn_norm;   // Gemma 3's
  DMatrix wqkv, wo, w_gate_up, w_down;  // w_gate_up, w_down: dense models only
  // A mixture-of-experts layer's router (f32) and each expert's gate|up and down (LayerWeights).
  DMatrix router;
  std::vector<DMatrix> expert_gate_up, expert_down;
  // Device tables of the experts' matrices (E addresses each), for a decoding step's experts in one
  // launch (gemv_routed_*); empty where the experts' matrices differ in format.
  DBuf gate_up_table, down_table;
};

// The device addresses of matrices of one format (the same shape, dtype and block type), as a device
// table; an empty DBuf where they differ.
DBuf matrix_table(const std::vector<DMatrix>& ms, const char* what) {
  std::vector<uint64_t> at;
  for (const DMatrix& m : ms) {
    const DMatrix& f = ms.front();
    if (m.rows != f.rows || m.cols != f.cols || m.bf16 != f.bf16 || m.qtype != f.qtype ||
        m.row_bytes != f.row_bytes)
      return {};
    at.push_back(reinterpret_cast<uint64_t>(m.data.as<void>()));
  }
  return at.empty() ? DBuf{} : upload(at.data(), at.size(), what);
}
struct DeviceWeights {
  DMatrix tok_embd, own_lm_head;
  const DMatrix* lm_head_w = nullptr;  // &tok_embd when the embeddings are tied (uploaded once)
  DBuf output_norm, rope_freqs;
  bool has_freqs = false;
  std::vector<DLayerWeights> layers;
};

// The device copy of each Weights while any backend holds it: the first backend finds none, counts
// the weights in its memory check and uploads them (put); the others find it.
class WeightCache {
 public:
  std::shared_ptr<DeviceWeights> find(const Weights& w) {
    std::lock_guard lock(mu_);
    return cache_[&w].lock();
  }
  void put(const Weights& w, const std::shared_ptr<DeviceWeights>& d) {
    std::lock_guard lock(mu_);
    cache_[&w] = d;
  }

 private:
  std::mutex mu_;
  std::map<const Weights*, std::weak_ptr<DeviceWeights>> cache_;
};
WeightCache& weight_cache() {
  static WeightCache c;
  return c;
}

std::shared_ptr<DeviceWeights> upload_weights(const ModelConfig& c, const Weights& w) {
  auto d = std::make_shared<DeviceWeights>();
  d->tok_embd = upload(w.tok_embd, "token embeddings");
  if (c.tied_embeddings) {
    d->lm_head_w = &d->tok_embd;
  } else {
    d->own_lm_head = upload(w.lm_head(), "LM head");
    d->lm_head_w = &d->own_lm_head;
  }
  d->output_norm = upload(w.output_norm.data(), w.output_norm.size(), "output norm");
  d->has_freqs = !w.rope_freqs.empty();
  if (d->has_freqs) d->rope_freqs = upload(w.rope_freqs.data(), w.rope_freqs.size(), "RoPE factors");
  d->layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    DLayerWeights& L = d->layers[size_t(l)];
    L.attn_norm = upload(lw.attn_norm.data(), lw.attn_norm.size(), "attention norm");
    if (!lw.qkv_bias.empty()) L.qkv_bias = upload(lw.qkv_bias.data(), lw.qkv_bias.size(), "q/k/v biases");
    if (!lw.q_norm.empty()) L.q_norm = upload(lw.q_norm.data(), lw.q_norm.size(), "q norm");
    if (!lw.k_norm.empty()) L.k_norm = upload(lw.k_norm.data(), lw.k_norm.size(), "k norm");
    if (!lw.post_attn_norm.empty())
      L.post_attn_norm = upload(lw.post_attn_norm.data(), lw.post_attn_norm.size(), "post-attention norm");
    if (!lw.post_ffn_norm.empty())
      L.post_ffn_norm = upload(lw.post_ffn_norm.data(), lw.post_ffn_norm.size(), "post-FFN norm");
    L.ffn_norm = upload(lw.ffn_norm.data(), lw.ffn_norm.size(), "FFN norm");
    L.wqkv = upload(lw.wqkv, "qkv weights");
    L.wo = upload(lw.wo, "o weights");
    if (c.moe()) {
      L.router = upload(lw.router, "router weights");
      for (int e = 0; e < c.n_expert; ++e) {
        L.expert_gate_up.push_back(upload(lw.expert_gate_up[size_t(e)], "expert gate/up weights"));
        L.expert_down.push_back(upload(lw.expert_down[size_t(e)], "expert down weights"));
      }
      L.gate_up_table = matrix_table(L.expert_gate_up, "expert gate/up table");
      L.down_table = matrix_table(L.expert_down, "expert down table");
    } else {
      L.w_gate_up = upload(lw.w_gate_up, "gate/up weights");
      L.w_down = upload(lw.w_down, "down weights");
    }
  }
  return d;
}

struct DLayer {
  DBuf k, v, pos;                 // K/V [n_ctx][Hkv Dh] (the backend's KvType), each slot's position [n_ctx]
  DBuf slot_of;                   // [positions] each position's slot, -1: no K/V here (KvIndex::slot_of)
  std::vector<int32_t> pos_host;  // [n] position of each slot (uploaded for a gathered key set)
  int64_t n = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelConfig& cfg, const Weights& wts, int64_t ctx, const BackendOptions& o);

  int64_t capacity() const override { return n_ctx; }
  int kv_element_bytes() const override { return kv_type_bytes(kv_type); }
  Held held_bytes() const override { return cuda::held_bytes(c, w.dtype, ffn_chunk_rows()); }
  int64_t kv_row_bytes() const { return KV * kv_element_bytes(); }  // one token's K (or V) at a layer
  // f(E*) with E the cache's element: float, or uint16_t (f16 bits).
  template <class F>
  void by_kv_type(F&& f) {
    if (kv_type == KvType::F16)
      f(static_cast<uint16_t*>(nullptr));
    else
      f(static_cast<float*>(nullptr));
  }
  // The attention kernel: the tensor cores' over an f16 cache unless told otherwise, else the f32 one.
  bool tensor_cores() const { return opt.tensor_core_attention && kv_type == KvType::F16; }
  bool asynchronous() const override { return true; }
  bool launches_batched() const override { return true; }
  int64_t rows() const override { return T(); }
  void synchronize() override { wait("op timer"); }

  void set_rows(std::span<const int32_t> p) override {
    const int64_t T = int64_t(p.size());
    reserve(T);
    pos.assign(p.begin(), p.end());
    int32_t top = -1;
    for (const int32_t q : pos) {
      if (q < 0 || int64_t(q) >= pos_limit) fail("position {} outside [0, {})", q, pos_limit);
      top = std::max(top, q);
    }
    if (top >= n_pos) grow_slot_maps(int64_t(top) + 1);
    put(pos_dev.as<void>(), pos.data(), size_t(T) * 4);
  }

  void embed(std::span<const int32_t> ids) override {
    device_keys_at = {};  // a pass's first op: no layer's keys are the device's active set yet
    const int64_t T = int64_t(ids.size());
    // A decoding step's operations captured (BackendOptions::cuda_graphs); a prefill's launched, whose
    // kernels are long enough that a launch costs nothing beside them.
    set_graphs(opt.cuda_graphs && T <= kGemvMaxRows);
    const std::vector<int64_t> id64(ids.begin(), ids.end());
    idx.reserve(size_t(T) * 8, "row indices");
    put(idx.as<void>(), id64.data(), size_t(T) * 8);
    const DMatrix& tok_embd = dw->tok_embd;
    if (tok_embd.qtype)
      gather_rows_q(tok_embd.data.as<uint8_t>(), tok_embd.qtype, tok_embd.row_bytes, idx.as<int64_t>(),
                    x.as<float>(), T, c.n_embd);
    else if (tok_embd.bf16)
      gather_rows_bf16(tok_embd.data.as<uint16_t>(), idx.as<int64_t>(), x.as<float>(), T, c.n_embd);
    else
      cuda::gather_rows(tok_embd.data.as<float>(), idx.as<int64_t>(), x.as<float>(), T, c.n_embd);
    if (c.embed_scale != 1.0f) scale_inplace(x.as<float>(), T * c.n_embd, c.embed_scale);
  }

  void post_norm(Norm n, int l) override {
    const DLayerWeights& L = dw->layers[size_t(l)];
    const DBuf& g = n == Norm::PostAttn ? L.post_attn_norm : L.post_ffn_norm;
    if ((n != Norm::PostAttn && n != Norm::PostFfn) || !g.as<float>())
      internal_fail("post_norm on layer {}, which has no such norm", l);
    cuda::rmsnorm(branch.as<float>(), g.as<float>(), branch.as<float>(), T(), c.n_embd,
                  c.rms_eps);  // in place
  }

  void rmsnorm(Norm n, int l) override {
    const DBuf& g = n == Norm::Output ? dw->output_norm
                    : n == Norm::Attn ? dw->layers[size_t(l)].attn_norm
                                      : dw->layers[size_t(l)].ffn_norm;
    cuda::rmsnorm(x.as<float>(), g.as<float>(), xn.as<float>(), T(), c.n_embd, c.rms_eps);
  }

  void matmul(Proj p, int l) override {
    if (p == Proj::GateUp) ffn_room(T());  // every row at once (reserve() may have room for a chunk)
    mm(input(p), weight(p, l), output(p), T());
    if (p == Proj::QKV) add_qkv_bias(l), split_qkv();
  }

  void qk_norm(int l) override {
    const DLayerWeights& L = dw->layers[size_t(l)];
    if (!L.q_norm.as<float>() || !L.k_norm.as<float>())
      internal_fail("qk_norm on layer {}, which has no q/k norms", l);
    // Each head a row of Dh (rmsnorm reads a value before it writes it: in place).
    cuda::rmsnorm(q.as<float>(), L.q_norm.as<float>(), q.as<float>(), T() * c.n_head, c.head_dim, c.rms_eps);
    cuda::rmsnorm(k.as<float>(), L.k_norm.as<float>(), k.as<float>(), T() * c.n_head_kv, c.head_dim,
                  c.rms_eps);
  }

  // Continuous batching: the members' input rows side by side in one buffer, one GEMM over all of
  // them, each member's output rows copied back (device to device). A member's rows get the
  // arithmetic they get alone: with weights in blocks, rows of members of at most kGemvMaxRows rows
  // (decoding steps) go through the block-reading GEMV together and the longer members' rows
  // (prefills) through the bf16 GEMM together, as each would alone. (Host emulation's GEMMs give a
  // row the same bits whatever the row count; cuBLAS may order a row's sums by the shape.)
  void matmul_batched(Proj p, int l, std::span<Backend* const> members) override {
    if (members.size() == 1 && members[0] == this) return matmul(p, l);
    const DMatrix& W = weight(p, l);
    std::vector<CudaBackend*> gemv_rows, gemm_rows;
    for (CudaBackend* m : members_of(members))
      (W.qtype && m->T() <= kGemvMaxRows ? gemv_rows : gemm_rows).push_back(m);
    batched(p, l, W, gemv_rows, true);
    batched(p, l, W, gemm_rows, false);
  }

  // The members' routed rows through the experts together, each expert's weights read once per
  // path, and each row by the arithmetic it gets alone: the decoding members whose routes stayed on
  // the device (keep_routes) through run_experts_routed over all their pairs; the others (prefills,
  // whose routes came to the host) grouped by expert, with weights in blocks the rows of members of
  // at most kGemvMaxRows rows through the block GEMV and the longer members' through the dequantized
  // bf16 GEMM, however many rows an expert gathers from the batch.
  void experts_batched(int l, std::span<Backend* const> members) override {
    if (members.size() == 1 && members[0] == this) return experts(l);
    std::vector<CudaBackend*> on_device, on_host;
    for (CudaBackend* m : members_of(members)) (m->routes_on_device ? on_device : on_host).push_back(m);
    const int64_t k = c.n_expert_used;
    // Each group's rows concatenated, through the experts, and back into each member's branch.
    const auto run_group = [&](const std::vector<CudaBackend*>& ms, auto&& experts_of) {
      if (ms.empty()) return;
      const int64_t total = concat_rows(ms, &CudaBackend::xn, c.n_embd);
      batch_out.reserve(size_t(total * c.n_embd) * 4, "batched rows");
      experts_of(total);
      int64_t at = 0;
      for (CudaBackend* m : ms) {
        copy_on_device(m->branch.as<float>(), batch_out.as<float>() + at * c.n_embd,
                       size_t(m->T() * c.n_embd) * 4);
        at += m->T();
      }
    };
    run_group(on_device, [&](int64_t total) {  // their routes gathered on the device: ids, then weights
      moe_ids.reserve(size_t(total * k) * 8, "expert ids");
      int64_t at = 0;
      for (CudaBackend* m : on_device) {
        const size_t n = size_t(m->T() * k);
        copy_on_device(moe_ids.as<int32_t>() + at, m->routes_dev.as<int32_t>(), n * 4);
        copy_on_device(moe_ids.as<int32_t>() + total * k + at, m->routes_dev.as<int32_t>() + n, n * 4);
        at += int64_t(n);
      }
      run_experts_routed(dw->layers[size_t(l)], batch_in.as<float>(), total, moe_ids.as<int32_t>(),
                         moe_ids.as<float>() + total * k, batch_out.as<float>());
    });
    run_group(on_host, [&](int64_t total) {
      std::vector<int32_t> ids;
      std::vector<float> wts;
      std::vector<char> gemv;  // per row: its member's path
      for (CudaBackend* m : on_host) {
        if (int64_t(m->ids_host.size()) != m->T() * k)
          internal_fail("experts_batched: a member's rows are not routed");
        ids.insert(ids.end(), m->ids_host.begin(), m->ids_host.end());
        wts.insert(wts.end(), m->w_host.begin(), m->w_host.end());
        gemv.insert(gemv.end(), size_t(m->T()), char(m->T() <= kGemvMaxRows));
      }
      run_experts(l, batch_in.as<float>(), total, ids, wts, gemv, batch_out.as<float>());
    });
  }

  // One launch per row op over every member's rows, through tables of their row addresses
  // (kernels/cuda/rows.h): a batch's row ops cost what one member's do, on the host.
  void rows_batched(RowOp op, int l, std::span<Backend* const> members) override {
    if (members.size() == 1 && members[0] == this) return row_op(op, l);
    const std::vector<CudaBackend*> ms = members_of(members);
    int64_t R = 0;
    for (const CudaBackend* m : ms) R += m->T();
    if (R == 0) return;
    const int64_t D = c.n_embd, F = c.n_ff, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim;
    const DLayerWeights* L = &dw->layers[size_t(l)];
    switch (op) {
      case RowOp::AttnNorm:
      case RowOp::FfnNorm: {
        tables_begin(2 * R);
        const auto in = table<const float>(ms, &CudaBackend::x, D);
        const auto out = table<float>(ms, &CudaBackend::xn, D);
        tables_done();
        rmsnorm_rows(in, (op == RowOp::AttnNorm ? L->attn_norm : L->ffn_norm).as<float>(), out, R, D,
                     c.rms_eps);
        return;
      }
      case RowOp::PostAttnNorm:
      case RowOp::PostFfnNorm: {
        const DBuf& g = op == RowOp::PostAttnNorm ? L->post_attn_norm : L->post_ffn_norm;
        if (!g.as<float>()) internal_fail("post_norm on layer {}, which has no such norm", l);
        tables_begin(R);
        const auto rows = table<float>(ms, &CudaBackend::branch, D);
        tables_done();
        rmsnorm_rows(read_only(rows), g.as<float>(), rows, R, D, c.rms_eps);  // in place
        return;
      }
      case RowOp::QkNorm: {  // each head a row of Dh
        if (!L->q_norm.as<float>() || !L->k_norm.as<float>())
          internal_fail("qk_norm on layer {}, which has no q/k norms", l);
        tables_begin(R * (H + Hkv));
        const auto qt = table<float>(ms, &CudaBackend::q, Q, H, Dh);
        const auto kt = table<float>(ms, &CudaBackend::k, KV, Hkv, Dh);
        tables_done();
        rmsnorm_rows(read_only(qt), L->q_norm.as<float>(), qt, R * H, Dh, c.rms_eps);  // in place
        rmsnorm_rows(read_only(kt), L->k_norm.as<float>(), kt, R * Hkv, Dh, c.rms_eps);
        return;
      }
      case RowOp::Rope: {
        tables_begin(3 * R);
        const auto qt = table<float>(ms, &CudaBackend::q, Q), kt = table<float>(ms, &CudaBackend::k, KV);
        const auto pt = table<const int32_t>(ms, &CudaBackend::pos_dev, 1, 1, 0, 4);
        tables_done();
        const float* freqs = dw->has_freqs ? dw->rope_freqs.as<float>() : nullptr;
        rope_rows(qt, pt, R, H, Dh, c.rope_dim, c.rope_base(l), freqs, c.rope_scale(l));
        rope_rows(kt, pt, R, Hkv, Dh, c.rope_dim, c.rope_base(l), freqs, c.rope_scale(l));
        return;
      }
      case RowOp::Residual: {
        tables_begin(2 * R);
        const auto xt = table<float>(ms, &CudaBackend::x, D);
        const auto bt = table<const float>(ms, &CudaBackend::branch, D);
        tables_done();
        add_rows(xt, bt, R, D);
        return;
      }
      case RowOp::Act: {
        tables_begin(2 * R);
        const auto ft = table<const float>(ms, &CudaBackend::ff, 2 * F);
        const auto at = table<float>(ms, &CudaBackend::act, F);
        tables_done();
        swiglu_rows(ft, at, R, F, c.gelu);
        return;
      }
    }
  }

  // The members' attentions in one launch, each over its own cache and key set, with the key splits
  // it has alone (cuda::attention_batched); the launch's table of jobs is queued from pinned memory.
  void attention_batched(int l, std::span<Backend* const> members,
                         std::span<const std::span<const int32_t>> slots,
                         std::span<const char> scored) override {
    if (members.size() == 1 && members[0] == this) return attention(l, slots[0], scored[0] != 0);
    const std::vector<CudaBackend*> ms = members_of(members);
    std::vector<AttentionInput> in;
    for (size_t i = 0; i < ms.size(); ++i) in.push_back(ms[i]->attention_input(l, slots[i]));
    cuda::attention_batched(in.data(), in.size(), c.n_head, c.n_head_kv, c.head_dim, c.attention_scale(),
                            c.window(l), tensor_cores(), [this](const void* host, size_t bytes) {
                              attn_jobs.reserve(bytes, "attention jobs");
                              put(attn_jobs.as<void>(), host, bytes);
                              return static_cast<const void*>(attn_jobs.as<void>());
                            });
  }

  // The members' rows' K/V into their own caches in one launch.
  void kv_append_batched(int l, std::span<Backend* const> members) override {
    if (members.size() == 1 && members[0] == this) return kv_append(l);
    const std::vector<CudaBackend*> ms = members_of(members);
    int64_t R = 0;
    for (CudaBackend* m : ms) m->kv_room(l), R += m->T();
    if (R == 0) return;
    tables_begin(8 * R);
    const auto kn = table<const float>(ms, &CudaBackend::k, KV),
               vn = table<const float>(ms, &CudaBackend::v, KV);
    const auto pn = table<const int32_t>(ms, &CudaBackend::pos_dev, 1, 1, 0, 4);
    // Row r of member m goes to slot n + r of its layer's cache (new every launch); its slot's number
    // is read from that member's own numbers (a member holds as many as its slots).
    const auto slots = [&](auto at) {
      std::byte** dev = table_room(R);
      for (CudaBackend* m : ms) {
        DLayer& L = m->layers[size_t(l)];
        for (int64_t r = 0; r < m->T(); ++r) row_tables_host.push_back(at(*m, L, L.n + r));
      }
      return dev;
    };
    const int64_t row_bytes = kv_row_bytes();
    const auto kd =
        slots([&](CudaBackend&, DLayer& L, int64_t s) { return L.k.as<std::byte>() + s * row_bytes; });
    const auto vd =
        slots([&](CudaBackend&, DLayer& L, int64_t s) { return L.v.as<std::byte>() + s * row_bytes; });
    const auto pd = slots([&](CudaBackend&, DLayer& L, int64_t s) { return L.pos.as<std::byte>() + s * 4; });
    const auto nd =
        slots([&](CudaBackend& m, DLayer&, int64_t s) { return m.slot_numbers.as<std::byte>() + s * 4; });
    const auto md = slots([&](CudaBackend&, DLayer& L, int64_t) { return L.slot_of.as<std::byte>(); });
    tables_done();
    by_kv_type([&]<class E>(E*) {
      kv_append_rows(kn, vn, pn, R, KV, {nullptr, 0, reinterpret_cast<E* const*>(kd)},
                     {nullptr, 0, reinterpret_cast<E* const*>(vd)},
                     {nullptr, 0, reinterpret_cast<int32_t* const*>(pd)},
                     {nullptr, 0, reinterpret_cast<const int32_t* const*>(nd)},
                     {nullptr, 0, reinterpret_cast<int32_t* const*>(md)});
    });
    for (CudaBackend* m : ms) m->appended(l);
  }

  // The LM head over every member's rows on the device, their greedy tokens picked there, and only
  // the wanted logits brought back: one wait (the tokens come back behind the kernel into pinned
  // memory).
  void lm_head_greedy(std::span<Backend* const> members, std::span<float* const> logits_out, int32_t* ids,
                      int64_t n_vocab) override {
    const std::vector<CudaBackend*> ms = members_of(members);
    int64_t total = T();
    if (ms.size() == 1 && ms[0] == this)
      head(xn.as<float>(), T());
    else
      head(batch_in.as<float>(), total = concat_rows(ms, &CudaBackend::xn, c.n_embd));
    greedy_dev.reserve(size_t(total) * 4, "greedy tokens");
    if (greedy_host.bytes < size_t(total) * 4) greedy_host = PinnedBuf(size_t(total) * 8, "greedy tokens");
    argmax_rows(logits.as<float>(), total, n_vocab, greedy_dev.as<int32_t>());
    copy_to_host_async(greedy_host.p, greedy_dev.as<void>(), size_t(total) * 4);
    // The wanted members' logits: one member's straight into its buffer; several gathered on the device
    // and brought back in one copy (one wait either way).
    std::vector<size_t> wanted;
    std::vector<int64_t> first_row;  // each member's first row among all of them
    int64_t rows = 0, at = 0;
    for (size_t i = 0; i < ms.size(); ++i) {
      first_row.push_back(at);
      at += ms[i]->T();
      if (logits_out[i]) wanted.push_back(i), rows += ms[i]->T();
    }
    if (wanted.empty()) {
      wait("greedy tokens");
    } else if (wanted.size() == 1) {
      const size_t i = wanted[0];
      get(logits_out[i], logits.as<float>() + first_row[i] * n_vocab, size_t(ms[i]->T() * n_vocab) * 4);
    } else {
      batch_out.reserve(size_t(rows * n_vocab) * 4, "wanted logits");
      int64_t w = 0;
      for (const size_t i : wanted) {
        copy_on_device(batch_out.as<float>() + w * n_vocab, logits.as<float>() + first_row[i] * n_vocab,
                       size_t(ms[i]->T() * n_vocab) * 4);
        w += ms[i]->T();
      }
      std::vector<float> host(static_cast<size_t>(rows * n_vocab));
      get(host.data(), batch_out.as<void>(), host.size() * 4);
      w = 0;
      for (const size_t i : wanted) {
        std::copy_n(host.data() + w * n_vocab, ms[i]->T() * n_vocab, logits_out[i]);
        w += ms[i]->T();
      }
    }
    std::memcpy(ids, greedy_host.p, size_t(total) * 4);
    step_done();
  }

  void lm_head_batched(std::span<Backend* const> members, float* logits_out, int64_t n_vocab) override {
    if (members.size() == 1 && members[0] == this) return lm_head(logits_out);
    const int64_t total = concat_rows(members_of(members), &CudaBackend::xn, c.n_embd);
    head(batch_in.as<float>(), total);
    get(logits_out, logits.as<void>(), size_t(total * n_vocab) * 4);
    step_done();
  }

  void rope(int l) override {
    const float* freqs = dw->has_freqs ? dw->rope_freqs.as<float>() : nullptr;
    cuda::rope(q.as<float>(), pos_dev.as<int32_t>(), T(), c.n_head, c.head_dim, c.rope_dim, c.rope_base(l),
               freqs, c.rope_scale(l));
    cuda::rope(k.as<float>(), pos_dev.as<int32_t>(), T(), c.n_head_kv, c.head_dim, c.rope_dim, c.rope_base(l),
               freqs, c.rope_scale(l));
  }

  // Slots n .. n + T - 1, positions recorded on both sides (the kernel writes the device's). Nothing
  // here waits for the device: the positions come from pos_dev.
  void kv_append(int l) override {
    DLayer& L = kv_room(l);
    by_kv_type([&]<class E>(E*) {
      cuda::kv_append(k.as<float>(), v.as<float>(), pos_dev.as<int32_t>(), T(), KV, L.n, L.k.as<E>(),
                      L.v.as<E>(), L.pos.as<int32_t>(), slot_numbers.as<int32_t>() + L.n,
                      L.slot_of.as<int32_t>());
    });
    appended(l);
  }
  DLayer& layer_of(int l, const char* what) {
    if (l < 0 || l >= int(layers.size())) fail("{}: layer {} outside [0, {})", what, l, layers.size());
    return layers[size_t(l)];
  }
  // Layer l's cache, which must have room for the rows; and the host's record of their append.
  DLayer& kv_room(int l) {
    DLayer& L = layers[size_t(l)];
    if (L.n + T() > n_ctx) fail("KV cache full: {} + {} tokens exceed its capacity {}", L.n, T(), n_ctx);
    return L;
  }
  void appended(int l) {
    DLayer& L = layers[size_t(l)];
    L.pos_host.insert(L.pos_host.end(), pos.begin(), pos.end());
    L.n += T();
  }

  void attention(int l, std::span<const int32_t> slots,
                 bool /*scored: scores read the keys again*/) override {
    const AttentionInput in = attention_input(l, slots);
    cuda::attention_batched(&in, 1, c.n_head, c.n_head_kv, c.head_dim, c.attention_scale(), c.window(l),
                            tensor_cores(), {});
  }
  // This backend's rows over layer l's keys: every held slot in order, or a listed key set, read
  // where it is in the cache (the kernels follow the slot list).
  // Or, after device_keys(l, n), the device's active set's slots.
  AttentionInput attention_input(int l, std::span<const int32_t> slots) {
    const DLayer& L = layers[size_t(l)];
    const bool on_device = on_device_keys(l, slots), listed = on_device || !slots.empty();
    return {q.as<float>(),
            pos_dev.as<int32_t>(),
            T(),
            L.k.as<void>(),
            L.v.as<void>(),
            L.pos.as<int32_t>(),
            on_device ? slot_list.as<int32_t>()
            : listed  ? key_slots(l, slots)
                      : nullptr,
            on_device ? device_keys_at.n
            : listed  ? int64_t(slots.size())
                      : L.n,
            attn.as<float>(),
            kv_type};
  }
  // Layer l's keys are the device's active set (device_keys): only where no slots are given.
  bool on_device_keys(int l, std::span<const int32_t> slots) const {
    if (device_keys_at.layer != l) return false;
    if (!slots.empty()) internal_fail("layer {}: listed keys where the keys are the device's active set", l);
    return true;
  }

  void swiglu() override {
    ffn_room(T());  // GateUp grew them already on the engine's path
    swiglu_fused(ff.as<float>(), act.as<float>(), T(), c.n_ff, c.gelu);
  }

  // A prefill's row-sized buffers given back (a request's backend in `serve` then holds its K/V and a
  // decoding step's rows, not its prompt's activations); the next pass that needs more grows them.
  void release_activations(int64_t rows) override {
    rows = std::max<int64_t>(rows, 1);
    // No more than a `rows`-row pass's activations of its own (kernels/cuda/memory.h: what a
    // reservation counts) and a batch's decoding rows: a decoding step's usual case, which keeps its
    // buffers rather than allocating them again. A batch's leader gathers every member's rows and
    // logits (batch_in, batch_out, a16, logits) and keeps tables of their addresses (row_tables): up
    // to kBatchRoomBytes of them stay with it.
    const int64_t batch =
        int64_t(batch_in.bytes() + batch_out.bytes() + a16.bytes() + logits.bytes() + row_tables.bytes());
    if (double(activation_bytes() - batch) <=
            backend_memory(c, w.dtype, rows, ffn_chunk_rows()).activations &&
        batch <= kBatchRoomBytes)
      return;
    bool freed = false;
    for (DBuf CudaBackend::*b : row_buffers())
      if ((this->*b).bytes() > 0) freed = true, this->*b = DBuf();
    // --dtype int8: the dequantized matrix of the prefill's GEMMs (the largest layer matrix, 235 MB
    // at the 8B shape), which every running request held after its prefill.
    w16 = DBuf(), w16_holds = nullptr;
    // A batched prefill's tables of row addresses (8 a row in its K/V appends, a head's each in
    // Qwen3's q/k norms: up to 84 MB after a 131,072-row batch), which the next batched step builds
    // again.
    if (row_tables.bytes() > 0) row_tables = DBuf(), arena_cap = arena_used = 0, table_cache.clear();
    if (freed) reserve(rows);     // a decoding step's rows, as before the prefill
    if (T() > rows) pos.clear();  // no rows until the next pass sets them
  }
  // The bytes of the buffers above, of w16 and of a leader's row tables, for checks
  // (cuda::activation_bytes).
  int64_t activation_bytes() const {
    int64_t n = 0;
    for (DBuf CudaBackend::*b : row_buffers()) n += int64_t((this->*b).bytes());
    return n + int64_t(w16.bytes() + row_tables.bytes());
  }
  // The buffers sized by a pass's rows (release_activations gives them back).
  static std::span<DBuf CudaBackend::*const> row_buffers() {
    using B = CudaBackend;
    static constexpr DBuf B::*all[] = {&B::x,      &B::x2,       &B::xn,        &B::qkv,
                                       &B::q,      &B::k,        &B::v,         &B::attn,
                                       &B::branch, &B::ff,       &B::act,       &B::a16,
                                       &B::logits, &B::batch_in, &B::batch_out, &B::router_logits,
                                       &B::moe_x,  &B::moe_ff,   &B::moe_act,   &B::moe_y};
    return all;
  }

  int64_t ffn_chunk_rows() const override { return c.moe() ? 0 : std::max<int64_t>(opt.ffn_chunk_rows, 0); }
  // GateUp, the activation and Down over the rows a chunk at a time, each chunk's branch rows written
  // in place: the same GEMMs and kernels as the three calls, on fewer rows each (a short last chunk
  // too: with weights in blocks, the prompt's rows go through the dequantized GEMM, never the GEMV).
  void ffn_chunked(int l) override {
    const int64_t C = ffn_chunk_rows(), F = c.n_ff, D = c.n_embd;
    if (C <= 0) internal_fail("ffn_chunked without a chunk size");
    const DLayerWeights& L = dw->layers[size_t(l)];
    ffn_room(std::min(T(), C));
    for (int64_t r0 = 0; r0 < T(); r0 += C) {
      const int64_t n = std::min(C, T() - r0);
      mm(xn.as<float>() + r0 * D, L.w_gate_up, ff.as<float>(), n, Path::Gemm);
      swiglu_fused(ff.as<float>(), act.as<float>(), n, F, c.gelu);
      mm(act.as<float>(), L.w_down, branch.as<float>() + r0 * D, n, Path::Gemm);
    }
  }
  // The router's logits (f32 GEMM) and each row's top-k on the device. A decoding step's rows (at most
  // kGemvMaxRows, every pair through its expert in one launch: run_experts_routed) keep their routes
  // there, copied back behind them into the step's log for a trace (routes_deferred, routes_of). A
  // prefill's come to the host (T x k ids and weights: the one synchronisation of its MoE layer), which
  // groups the rows by expert and launches each active expert's GEMMs over its rows, as llama.cpp's
  // CUDA backend reads the ids of its mul_mat_id on the host.
  void route(int l) override {
    route_launch(l);
    if (keep_routes(l)) return;
    std::vector<int32_t> both(2 * size_t(T() * c.n_expert_used));
    get(both.data(), routes_dev.as<void>(), both.size() * 4);
    routes_from(both.data());
  }
  // After route_launch: the routes stay on the device (a decoding step's rows, the layer's expert
  // tables there), copied into the log behind them.
  bool keep_routes(int l) {
    const DLayerWeights& L = dw->layers[size_t(l)];
    routes_on_device = T() <= kGemvMaxRows && L.gate_up_table.bytes() && L.down_table.bytes();
    if (!routes_on_device) return false;
    const int64_t n = T() * c.n_expert_used;
    copy_to_host_async(routes_log_at(l), routes_dev.as<void>(), size_t(n) * 8);
    routes_log_rows[size_t(l)] = T();
    routes_layer = l;
    ids_host.clear();
    return true;
  }
  bool routes_deferred() const override { return routes_on_device; }
  std::vector<int32_t> routes_of(int l) override {  // after the pass's wait
    const int32_t* at = routes_log_at(l);
    return std::vector<int32_t>(at, at + routes_log_rows[size_t(l)] * c.n_expert_used);
  }
  int32_t* routes_log_at(int l) const {  // layer l's ids, then weights
    return static_cast<int32_t*>(routes_log.p) + l * kGemvMaxRows * c.n_expert_used * 2;
  }
  // A batch's routes: every member's queued, each copied back into its pinned memory behind it, and
  // one wait for all of them (each member's arithmetic its own, as alone).
  void route_batched(int l, std::span<Backend* const> members) override {
    if (members.size() == 1 && members[0] == this) return route(l);
    const std::vector<CudaBackend*> ms = members_of(members);
    bool waits = false;
    for (CudaBackend* m : ms) {
      m->route_launch(l);
      if (m->keep_routes(l)) continue;
      copy_to_host_async(m->routes_host.p, m->routes_dev.as<void>(), size_t(m->T() * c.n_expert_used) * 8);
      waits = true;
    }
    if (!waits) return;  // every member a decoding step: their routes stay on the device
    wait("routes");
    for (CudaBackend* m : ms)
      if (!m->routes_on_device) m->routes_from(static_cast<const int32_t*>(m->routes_host.p));
  }
  // The router's logits and each row's top k into routes_dev: [T][k] ids, then [T][k] weights.
  void route_launch(int l) {
    const DMatrix& R = dw->layers[size_t(l)].router;
    const int64_t E = c.n_expert, k = c.n_expert_used;
    router_logits.reserve(size_t(T() * E) * 4, "router logits");
    const size_t n = size_t(T() * k);
    routes_dev.reserve(n * 8, "routes");
    mm(xn.as<float>(), R, router_logits.as<float>(), T());
    route_top_k(router_logits.as<float>(), T(), E, k, routes_dev.as<int32_t>(), routes_dev.as<float>() + n);
  }
  void routes_from(const int32_t* both) {  // routes_dev's layout, on the host
    const size_t n = size_t(T() * c.n_expert_used);
    ids_host.assign(both, both + n);
    w_host.resize(n);
    std::memcpy(w_host.data(), both + n, n * 4);
  }
  void experts(int l) override {
    if (routes_on_device) {
      const int64_t n = T() * c.n_expert_used;
      return run_experts_routed(dw->layers[size_t(l)], xn.as<float>(), T(), routes_dev.as<int32_t>(),
                                routes_dev.as<float>() + n, branch.as<float>());
    }
    if (int64_t(ids_host.size()) != T() * c.n_expert_used) internal_fail("experts: the rows are not routed");
    // Every row by its step's path: a decoding step's through the block GEMV, a prefill's through the
    // dequantized GEMM, as matmul() takes them.
    run_experts(l, xn.as<float>(), T(), ids_host, w_host,
                std::vector<char>(size_t(T()), char(T() <= kGemvMaxRows)), branch.as<float>());
  }
  std::vector<int32_t> routes() override {
    if (routes_on_device) {  // waits: a trace reads routes_of(layer) after the pass's own wait instead
      wait("routes");
      return routes_of(routes_layer);
    }
    return ids_host;
  }
  void residual() override { add_inplace(x.as<float>(), branch.as<float>(), T() * c.n_embd); }

  void last_row_scores(int l, std::span<const int32_t> slots) override {
    const DLayer& L = layers[size_t(l)];
    const bool on_device = on_device_keys(l, slots);
    const int64_t n = on_device ? device_keys_at.n : slots.empty() ? L.n : int64_t(slots.size());
    const int32_t* listed = on_device       ? slot_list.as<int32_t>()
                            : slots.empty() ? nullptr
                                            : key_slots(l, slots);
    scores_dev.reserve(size_t(n) * 4, "scores");
    scores_host_n = -1;
    queued = {};
    cuda::last_row_scores(q.as<float>() + (T() - 1) * Q, L.k.as<void>(), n, c.n_head, c.n_head_kv, c.head_dim,
                          c.attention_scale(), L.pos.as<int32_t>(), pos.back(), c.window(l),
                          scores_dev.as<float>(), listed, kv_type);
  }

  std::vector<float> scores(int64_t n) override {
    if (n == scores_host_n) {  // copied behind the selection, which has been waited for
      const float* f = static_cast<const float*>(scores_host.p);
      return std::vector<float>(f, f + n);
    }
    std::vector<float> h(static_cast<size_t>(n));
    get(h.data(), scores_dev.as<void>(), size_t(n) * 4);
    return h;
  }

  // The selection queued, its kept indices and scores copied back into pinned memory behind it; the
  // select_top that follows waits only if no wait has come since (a batch's first member's does).
  void select_queue(std::span<const int32_t> p, int64_t n_keep) override {
    const int64_t n = int64_t(p.size());
    if (n > n_ctx || n_keep < 1 || n_keep > n)
      internal_fail("select_queue: keep {} of {} keys (room for {})", n_keep, n, n_ctx);
    put(sel_pos.as<void>(), p.data(), size_t(n) * 4);
    cuda::select_top(scores_dev.as<float>(), sel_pos.as<int32_t>(), n, n_keep, keep_dev.as<int64_t>());
    copy_to_host_async(keep_host.p, keep_dev.as<void>(), size_t(n_keep) * 8);
    copy_to_host_async(scores_host.p, scores_dev.as<void>(), size_t(n) * 4);
    queued = {n, n_keep, waited, std::this_thread::get_id()};
  }

  std::vector<int64_t> select_top(std::span<const int32_t> p, int64_t n_keep) override {
    const int64_t n = int64_t(p.size());
    if (queued.n == n && queued.n_keep == n_keep) {
      if (waited == queued.waited || queued.thread != std::this_thread::get_id()) wait("selection");
      queued = {};
      scores_host_n = n;
      const int64_t* k = static_cast<const int64_t*>(keep_host.p);
      return std::vector<int64_t>(k, k + n_keep);
    }
    queued = {};
    if (n > n_ctx) internal_fail("select_top: {} keys in a backend of {}", n, n_ctx);
    sel_pos.reserve(size_t(n) * 4, "selection positions");
    keep_dev.reserve(size_t(n_keep) * 8, "kept indices");
    put(sel_pos.as<void>(), p.data(), size_t(n) * 4);
    cuda::select_top(scores_dev.as<float>(), sel_pos.as<int32_t>(), n, n_keep, keep_dev.as<int64_t>());
    // The scores behind it, for a trace: the one wait below covers both.
    copy_to_host_async(scores_host.p, scores_dev.as<void>(), size_t(n) * 4);
    scores_host_n = n;
    std::vector<int64_t> keep(static_cast<size_t>(n_keep));
    get(keep.data(), keep_dev.as<void>(), keep.size() * 8);
    return keep;
  }

  // Deferred selection (kernels/backend.h): the active set in active_dev, the kept positions and
  // scores copied behind each selection into the pinned log, read after the step's one wait.
  bool defers_selection() const override { return opt.deferred_selection; }
  void deferred_log(int64_t kept, int64_t scores) override {
    // Nothing of the log is queued here (the step's first deferred selection, after the last step's
    // wait for its logits), so it may be replaced.
    if (size_t(kept) * 4 > log_kept.bytes) log_kept = PinnedBuf(size_t(kept) * 8, "deferred selections");
    if (size_t(scores) * 4 > log_scores.bytes)
      log_scores = PinnedBuf(size_t(scores) * 8, "deferred selections' scores");
    log_kept_n = kept;
    log_scores_n = scores;
  }
  void select_deferred(std::span<const int32_t> p, int64_t n, int64_t n_keep, int64_t kept_at,
                       int64_t scores_at) override {
    if (n > n_ctx || n_keep < 1 || n_keep > n || (!p.empty() && int64_t(p.size()) != n))
      internal_fail("select_deferred: keep {} of {} keys (room for {})", n_keep, n, n_ctx);
    if (kept_at < 0 || kept_at + n_keep > log_kept_n || (scores_at >= 0 && scores_at + n > log_scores_n))
      internal_fail("select_deferred: the log has room for {} kept and {} scores", log_kept_n, log_scores_n);
    if (!p.empty()) put(active_dev.as<void>(), p.data(), size_t(n) * 4);
    cuda::select_top(scores_dev.as<float>(), active_dev.as<int32_t>(), n, n_keep, keep_dev.as<int64_t>());
    gather_positions(active_dev.as<int32_t>(), keep_dev.as<int64_t>(), n_keep, active_next.as<int32_t>());
    std::swap(active_dev, active_next);
    copy_to_host_async(static_cast<int32_t*>(log_kept.p) + kept_at, active_dev.as<void>(),
                       size_t(n_keep) * 4);
    if (scores_at >= 0)
      copy_to_host_async(static_cast<float*>(log_scores.p) + scores_at, scores_dev.as<void>(), size_t(n) * 4);
    queued = {};
    scores_host_n = -1;
  }
  void device_keys(int l, int64_t n) override {
    if (n < 1 || n > n_ctx) internal_fail("device_keys: {} keys at layer {} (room for {})", n, l, n_ctx);
    slots_of(active_dev.as<int32_t>(), n, layers[size_t(l)].slot_of.as<int32_t>(), slot_list.as<int32_t>());
    listed_layer = -1;  // slot_list no longer holds a host list
    device_keys_at = {l, n};
  }
  std::span<const int32_t> deferred_kept(int64_t at, int64_t n) override {
    if (at < 0 || at + n > log_kept_n) internal_fail("deferred_kept: [{}, {}) of {}", at, at + n, log_kept_n);
    return {static_cast<const int32_t*>(log_kept.p) + at, size_t(n)};
  }
  std::span<const float> deferred_scores(int64_t at, int64_t n) override {
    if (at < 0 || at + n > log_scores_n)
      internal_fail("deferred_scores: [{}, {}) of {}", at, at + n, log_scores_n);
    return {static_cast<const float*>(log_scores.p) + at, size_t(n)};
  }
  void kv_truncate(int l, int64_t n) override {
    DLayer& L = layers[size_t(l)];
    if (n < 0 || n > L.n) internal_fail("kv_truncate: {} of {} slots at layer {}", n, L.n, l);
    const int32_t none = -1;
    for (int64_t s = n; s < L.n; ++s) put(L.slot_of.as<int32_t>() + L.pos_host[size_t(s)], &none, 4);
    L.n = n;
    L.pos_host.resize(size_t(n));
    if (listed_layer == l) listed_layer = -1;
  }

  // The prefix cache's and KV-Runahead's copies (kernels/backend.h): K/V rows in the cache's element
  // type, all of K then all of V, and Aux Cache states by entry. The copies cross PCIe once each way
  // (a block of the prefix cache lives in host memory), one wait for what comes back.
  bool copies_state() const override { return true; }

  void kv_read(int l, std::span<const int32_t> slots, std::span<std::byte> out) override {
    const DLayer& L = layer_of(l, "KV read");
    const int64_t n = int64_t(slots.size()), row = kv_row_bytes();
    if (int64_t(out.size()) != 2 * n * row)
      fail("KV read: {} bytes for {} tokens of {} bytes (K and V)", out.size(), n, 2 * row);
    if (n == 0) return;
    std::vector<int64_t> from(slots.begin(), slots.end());
    for (const int64_t sl : from)
      if (sl < 0 || sl >= L.n) fail("KV read: slot {} of layer {}, which holds {}", sl, l, L.n);
    idx.reserve(size_t(n) * 8, "row indices");
    put(idx.as<void>(), from.data(), size_t(n) * 8);
    // The rows as floats (an f16 row's Hkv Dh halves are an even count: Dh is even), K's then V's.
    if (row % 4 != 0) internal_fail("KV read: rows of {} bytes are not whole floats", row);
    const int64_t w = row / 4;
    batch_out.reserve(size_t(2 * n * row), "K/V rows");
    cuda::gather_rows(L.k.as<float>(), idx.as<int64_t>(), batch_out.as<float>(), n, w);
    cuda::gather_rows(L.v.as<float>(), idx.as<int64_t>(), batch_out.as<float>() + n * w, n, w);
    get(out.data(), batch_out.as<void>(), out.size());
    shrink_copy_room();
  }

  void kv_export(int l, int64_t n, std::span<std::byte> out) override {
    const DLayer& L = layer_of(l, "KV export");
    const int64_t row = kv_row_bytes();
    if (n < 0 || n > L.n) fail("KV export: {} tokens of layer {}, which holds {}", n, l, L.n);
    if (int64_t(out.size()) != 2 * n * row)
      fail("KV export: {} bytes for {} tokens of {} bytes (K and V)", out.size(), n, 2 * row);
    if (n == 0) return;
    batch_out.reserve(size_t(2 * n * row), "K/V rows");
    copy_on_device(batch_out.as<void>(), L.k.as<void>(), size_t(n * row));
    copy_on_device(batch_out.as<std::byte>() + n * row, L.v.as<void>(), size_t(n * row));
    get(out.data(), batch_out.as<void>(), out.size());
    shrink_copy_room();
  }

  // Rows into the next slots, as kv_append would put them there: the positions on both sides and the
  // position-to-slot map. Positions increase within a call (the CPU cache's rule) but may fall before
  // held ones (a pruned prefix's K/V taken in late); that none is held already is the session's rule.
  void kv_import(int l, std::span<const int32_t> at, std::span<const std::byte> rows) override {
    DLayer& L = layer_of(l, "KV import");
    const int64_t n = int64_t(at.size()), row = kv_row_bytes();
    if (int64_t(rows.size()) != 2 * n * row)
      fail("KV import: {} bytes for {} tokens of {} bytes (K and V)", rows.size(), n, 2 * row);
    if (L.n + n > n_ctx) fail("KV cache full: {} + {} tokens exceed its capacity {}", L.n, n, n_ctx);
    if (n == 0) return;
    int32_t top = -1;
    for (const int32_t q : at) {
      if (q < 0 || int64_t(q) >= pos_limit) fail("KV import: position {} outside [0, {})", q, pos_limit);
      if (q <= top) fail("KV import: positions must increase within a call");
      top = q;
    }
    if (top >= n_pos) grow_slot_maps(int64_t(top) + 1);
    put(L.k.as<std::byte>() + L.n * row, rows.data(), size_t(n * row));
    put(L.v.as<std::byte>() + L.n * row, rows.data() + n * row, size_t(n * row));
    sel_pos.reserve(size_t(n) * 4, "selection positions");
    put(sel_pos.as<void>(), at.data(), size_t(n) * 4);
    // kv_append's kernel with no K/V columns (the rows went up above): each slot's position and the map.
    cuda::kv_append(L.k.as<float>(), L.v.as<float>(), sel_pos.as<int32_t>(), n, 0, L.n, L.k.as<float>(),
                    L.v.as<float>(), L.pos.as<int32_t>(), slot_numbers.as<int32_t>() + L.n,
                    L.slot_of.as<int32_t>());
    L.pos_host.insert(L.pos_host.end(), at.begin(), at.end());
    L.n += n;
  }

  void aux_read(std::span<const int64_t> entries, std::span<float> out) override {
    const int64_t D = c.n_embd, n = int64_t(entries.size());
    if (int64_t(out.size()) != n * D) fail("Aux Cache read: {} floats for {} states of {}", out.size(), n, D);
    for (const int64_t e : entries)
      if (e < 0 || e >= n_ctx) fail("Aux Cache read: entry {} outside [0, {})", e, n_ctx);
    if (n == 0) return;
    idx.reserve(size_t(n) * 8, "row indices");
    put(idx.as<void>(), entries.data(), size_t(n) * 8);
    batch_out.reserve(out.size() * 4, "Aux Cache states");
    cuda::gather_rows(aux_states.as<float>(), idx.as<int64_t>(), batch_out.as<float>(), n, D);
    get(out.data(), batch_out.as<void>(), out.size() * 4);
    shrink_copy_room();
  }
  // A copy's room given back when it is larger than a batch leader keeps (a long prompt's blocks, read
  // after the prefill gave its activations back: it would stay for the whole decoding).
  void shrink_copy_room() {
    if (batch_out.bytes() > size_t(kBatchRoomBytes)) batch_out = DBuf();
  }

  void aux_load(std::span<const int64_t> entries, std::span<const float> states) override {
    const int64_t D = c.n_embd, n = int64_t(entries.size());
    if (int64_t(states.size()) != n * D)
      fail("Aux Cache load: {} floats for {} states of {}", states.size(), n, D);
    for (const int64_t e : entries)
      if (e < 0 || e >= n_ctx) fail("Aux Cache load: entry {} outside [0, {})", e, n_ctx);
    if (n == 0) return;
    batch_in.reserve(states.size() * 4, "Aux Cache states");
    put(batch_in.as<void>(), states.data(), states.size() * 4);
    std::vector<int64_t> from(static_cast<size_t>(n));
    std::iota(from.begin(), from.end(), 0);
    copy_indexed(batch_in, from, aux_states, entries);
  }

  void gather_rows(std::span<const int64_t> rows) override {
    const int64_t R = int64_t(rows.size());
    idx.reserve(size_t(R) * 8, "row indices");
    put(idx.as<void>(), rows.data(), size_t(R) * 8);
    x2.reserve(std::max(x.bytes(), size_t(R * c.n_embd) * 4), "hidden states");
    cuda::gather_rows(x.as<float>(), idx.as<int64_t>(), x2.as<float>(), R, c.n_embd);
    std::swap(x, x2);
  }

  void aux_store(std::span<const int64_t> rows, std::span<const int64_t> entries) override {
    for (const int64_t e : entries)
      if (e >= n_ctx) internal_fail("Aux Cache entry {} beyond its {} rows", e, n_ctx);
    copy_indexed(x, rows, aux_states, entries);
  }

  void merge_rows(const RowMerge& m, int64_t n_rows) override {
    x2.reserve(std::max(x.bytes(), size_t(n_rows * c.n_embd) * 4), "hidden states");
    copy_indexed(x, m.x_src, x2, m.x_dst);
    copy_indexed(aux_states, m.aux_src, x2, m.aux_dst);
    std::swap(x, x2);
  }

  void lm_head(float* out) override {
    head(xn.as<float>(), T());
    get(out, logits.as<void>(), size_t(T() * c.n_vocab) * 4);
    step_done();
  }
  // A pass's logits are in: its capture (BackendOptions::cuda_graphs) ends with it, so that what is
  // queued between passes (the next pass's positions, before its embedding) is not captured.
  static void step_done() { set_graphs(false); }

  void write(Tensor t, std::span<const float> data) override {
    const int64_t width = tensor_width(c, t);
    if (int64_t(data.size()) != T() * width)
      fail("write: {} floats for {} rows of {}", data.size(), T(), width);
    if (t == Tensor::FF || t == Tensor::Act) ffn_room(T());  // (sized for a chunk of a long prefill)
    put(tensor(t).as<void>(), data.data(), data.size() * 4);
    if (t == Tensor::QKV) split_qkv();
  }

  std::vector<float> read(Tensor t) override {
    if (tensor(t).bytes() < size_t(T() * tensor_width(c, t)) * 4)
      fail("read: the {} rows of this activation are not held (a long prefill's FFN ran in chunks)", T());
    if (t == Tensor::QKV) {  // RoPE rotated q and k in their own buffers
      copy_columns(q.as<float>(), Q, qkv.as<float>(), QKV, Q, T());
      copy_columns(k.as<float>(), KV, qkv.as<float>() + Q, QKV, KV, T());
      copy_columns(v.as<float>(), KV, qkv.as<float>() + Q + KV, QKV, KV, T());
    }
    std::vector<float> h(static_cast<size_t>(T() * tensor_width(c, t)));
    get(h.data(), tensor(t).as<void>(), h.size() * 4);
    return h;
  }

  void reset() override {
    for (DLayer& L : layers) {
      L.n = 0;
      L.pos_host.clear();
      fill_i32(L.slot_of.as<int32_t>(), n_pos, -1);
    }
    listed_layer = -1;
    device_keys_at = {};
    routes_on_device = false;
    routes_layer = -1;
  }

  std::vector<int32_t> kv_positions(int l) override {
    if (l < 0 || l >= int(layers.size())) fail("kv_positions: layer {} outside [0, {})", l, layers.size());
    std::vector<int32_t> slot_of(static_cast<size_t>(n_pos));
    get(slot_of.data(), layers[size_t(l)].slot_of.as<void>(), slot_of.size() * 4);
    std::vector<int32_t> out;
    for (int64_t p = 0; p < n_pos; ++p)
      if (slot_of[size_t(p)] >= 0) out.push_back(int32_t(p));
    return out;
  }

  std::vector<float> aux_state(int64_t e) override {
    if (e < 0 || e >= n_ctx) fail("aux_state: no Aux Cache entry {}", e);
    std::vector<float> h(static_cast<size_t>(c.n_embd));
    get(h.data(), aux_states.as<float>() + e * c.n_embd, h.size() * 4);
    return h;
  }

 private:
  const ModelConfig& c;
  const Weights& w;
  int64_t n_ctx;
  BackendOptions opt;
  KvType kv_type;   // the K/V cache's elements: f32 for an f32 model, else f16 (kv_type_for), as the CPU's
  Staging staging;  // uploads, queued without waiting
  // The last selection's scores, copied to the host behind it (valid for scores_host_n keys, -1:
  // none), so that a trace's scores() after select_top costs no second wait.
  PinnedBuf scores_host;
  int64_t scores_host_n = -1;
  // A selection select_queue started: its sizes and the waits done when it was queued (n -1: none),
  // its kept indices copied back into keep_host.
  struct Queued {
    int64_t n = -1, n_keep = -1, waited = 0;
    std::thread::id thread;
  } queued;
  PinnedBuf keep_host;
  PinnedBuf routes_host;  // a mixture-of-experts model's routes, copied back in a batch [n_ctx][k] x 2
  const int64_t Q = int64_t(c.n_head) * c.head_dim, KV = int64_t(c.n_head_kv) * c.head_dim, QKV = Q + 2 * KV;
  std::shared_ptr<const DeviceWeights> dw;  // shared with the other backends of these weights
  std::vector<DLayer> layers;
  // Positions a session may use (the model's context, or n_ctx), and those the position-to-slot maps
  // cover now: n_ctx at first, grown (by half at least) for a position past them (a prompt with gaps:
  // random-drop's), so that a short request's maps are as short as its cache.
  int64_t pos_limit = 0, n_pos = 0;
  void grow_slot_maps(int64_t need) {
    const int64_t grown = std::min(pos_limit, std::max(need, n_pos + n_pos / 2));
    for (DLayer& L : layers) {
      DBuf map(size_t(grown) * 4, "K/V slots of positions");
      copy_on_device(map.as<void>(), L.slot_of.as<void>(), size_t(n_pos) * 4);
      fill_i32(map.as<int32_t>() + n_pos, grown - n_pos, -1);
      L.slot_of = std::move(map);
    }
    n_pos = grown;
  }
  std::vector<int32_t> pos;  // the rows' positions (host copy of pos_dev)
  // Activations and scratch, grown on demand (kernels/backend.h names them; q, k, v split qkv).
  DBuf x, x2, xn, qkv, q, k, v, attn, branch, ff, act, a16, pos_dev, idx, idx2, scores_dev, logits;
  DBuf w16;  // --dtype int8: the bf16 copy of the matrix a prefill GEMM is multiplying (one at a time)
  const DMatrix* w16_holds = nullptr;  // the matrix w16 holds (the weights never change)
  DBuf slot_list;                      // a listed key set's cache slots [n_ctx]
  int listed_layer = -1;               // the layer and slots slot_list holds (-1: none)
  std::vector<int32_t> listed_slots;
  DBuf keep_dev, sel_pos;  // a device selection's kept indices and the positions it ranks by
  DBuf greedy_dev;         // lm_head_greedy's tokens, and their pinned copy
  PinnedBuf greedy_host;
  // Deferred selection: the step's active set (positions) and the next one; the slots of positions
  // 0 .. n_ctx - 1 (what kv_append writes into slot_of); the layer whose keys are the active set
  // (device_keys; -1: none) and their count; the pinned log of kept positions and scores.
  DBuf active_dev, active_next, slot_numbers;
  struct DeviceKeys {
    int layer = -1;
    int64_t n = 0;
  } device_keys_at;
  PinnedBuf log_kept, log_scores;
  int64_t log_kept_n = 0, log_scores_n = 0;
  DBuf aux_states;           // the Aux Cache's states [n_ctx][D]: entry e is row e
  DBuf batch_in, batch_out;  // matmul_batched, lm_head_batched: the members' rows, concatenated
  DBuf row_tables;           // rows_batched and the batched copies: tables of the members' row addresses
  DBuf attn_jobs;            // attention_batched: the launch's table of jobs
  std::vector<const std::byte*> row_tables_host;  // a launch's new entries, from arena entry op_start
  int64_t row_tables_cap = 0, arena_used = 0, arena_cap = 0, op_start = 0;
  // A table in the arena: the activation, its row layout and, per member, its buffer and rows.
  struct CachedTable {
    DBuf CudaBackend::*buf;
    int64_t width, per_row, sub_width, element_bytes;
    std::vector<std::pair<const void*, int64_t>> members;
    int64_t at;
    bool same(const CachedTable& o) const {
      return buf == o.buf && width == o.width && per_row == o.per_row && sub_width == o.sub_width &&
             element_bytes == o.element_bytes && members == o.members;
    }
  };
  std::vector<CachedTable> table_cache;
  static constexpr size_t kMaxTables = 64;
  // Mixture of experts: the router's logits and routes on the device and their host copies; the
  // (row, expert) pairs' grouped inputs, gate|up, activations and outputs, and their indices.
  DBuf router_logits, routes_dev, moe_x, moe_ff, moe_act, moe_y, moe_idx, moe_w, moe_ids;
  std::vector<int32_t> ids_host;
  std::vector<float> w_host;
  // A decoding step's routes kept on the device (keep_routes): the layer last routed, and each layer's
  // routes copied back into the log [n_layer][kGemvMaxRows][k] x 2 with their row counts.
  bool routes_on_device = false;
  int routes_layer = -1;
  PinnedBuf routes_log;
  std::vector<int64_t> routes_log_rows;

  int64_t T() const { return int64_t(pos.size()); }

  // Host-to-device without waiting; device-to-host, and a plain wait, after which every upload
  // queued before has run.
  void put(void* dst, const void* src, size_t bytes) { staging.put(dst, src, bytes); }
  void get(void* dst, const void* src, size_t bytes) {
    fetch(dst, src, bytes);
    staging.drained();
  }
  void wait(const char* what) {
    drain(what);
    staging.drained();
  }

  // The tables of row addresses of the batched launches (Rows::table) live in one device arena:
  // tables_begin with room for a launch's entries, table() for each (its device address), then
  // tables_done() queues the launch's new entries in one upload. A table whose members' buffers and
  // rows are what they were (a decoding step's, layer after layer and step after step, until a
  // member's rows change) is the same addresses, and is reused from the arena instead of built
  // again. When the arena is full it starts again from the beginning, its tables forgotten: the
  // stream runs each upload after the launches queued before it, which read the old ones.
  void tables_begin(int64_t entries) {
    // Past kMaxTables the cache's scan would cost more than rebuilding (revivals change rows often).
    if (arena_used + entries > arena_cap || table_cache.size() > kMaxTables) {
      table_cache.clear();
      arena_used = 0;
      if (entries > arena_cap) {
        arena_cap = std::max<int64_t>({entries, 2 * arena_cap, 4096});
        row_tables.reserve(size_t(arena_cap) * 8, "row tables");
      }
    }
    op_start = arena_used;
    row_tables_host.clear();
    row_tables_cap = arena_used + entries;
  }
  // The members' rows of activation `buf` (`width` elements a row), in member order; per_row > 1:
  // each row's per_row sub-rows `sub_width` apart (the heads of q and k).
  template <class T>
  Rows<T> table(const std::vector<CudaBackend*>& ms, DBuf CudaBackend::*buf, int64_t width,
                int64_t per_row = 1, int64_t sub_width = 0, int64_t element_bytes = 4) {
    CachedTable key{buf, width, per_row, sub_width, element_bytes, {}, 0};
    for (const CudaBackend* m : ms) key.members.emplace_back((m->*buf).as<void>(), m->T());
    for (const CachedTable& t : table_cache)
      if (t.same(key)) return Rows<T>{nullptr, 0, row_tables.as<T*>() + t.at};
    key.at = arena_used;
    for (const CudaBackend* m : ms)
      for (int64_t r = 0; r < m->T(); ++r)
        for (int64_t h = 0; h < per_row; ++h)
          row_tables_host.push_back((m->*buf).as<std::byte>() + (r * width + h * sub_width) * element_bytes);
    arena_used = op_start + int64_t(row_tables_host.size());
    if (arena_used > row_tables_cap) internal_fail("row tables past their room");
    table_cache.push_back(std::move(key));
    return Rows<T>{nullptr, 0, row_tables.as<T*>() + table_cache.back().at};
  }
  // Room in the arena for n entries the caller pushes to row_tables_host itself (not kept).
  std::byte** table_room(int64_t n) {
    std::byte** at = row_tables.as<std::byte*>() + arena_used;
    arena_used += n;
    if (arena_used > row_tables_cap) internal_fail("row tables past their room");
    return at;
  }
  void tables_done() {
    if (!row_tables_host.empty())
      put(row_tables.as<std::byte*>() + op_start, row_tables_host.data(),
          row_tables_host.size() * sizeof(void*));
  }

  DBuf& tensor(Tensor t) {
    DBuf* const by_tensor[] = {&x, &xn, &qkv, &attn, &ff, &act, &branch};  // Tensor's order
    return *by_tensor[int(t)];
  }

  // Room for T rows in every activation; x keeps its rows when it grows.
  void reserve(int64_t T) {
    const int64_t D = c.n_embd;
    const size_t f = 4;
    if (x.bytes() < size_t(T * D) * f) {
      DBuf grown(size_t(T * D) * f, "hidden states");
      if (x.bytes()) copy_on_device(grown.as<void>(), x.as<void>(), x.bytes());
      x = std::move(grown);
    }
    x2.reserve(size_t(T * D) * f, "hidden states");
    xn.reserve(size_t(T * D) * f, "normed states");
    qkv.reserve(size_t(T * QKV) * f, "qkv");
    q.reserve(size_t(T * Q) * f, "q");
    k.reserve(size_t(T * KV) * f, "k");
    v.reserve(size_t(T * KV) * f, "v");
    attn.reserve(size_t(T * Q) * f, "attention output");
    branch.reserve(size_t(T * D) * f, "residual branch");
    ffn_room(ffn_chunk_rows() > 0 ? std::min(T, ffn_chunk_rows()) : T);
    pos_dev.reserve(size_t(T) * 4, "positions");
  }
  // Room in gate|up and the activation for `rows` rows (a chunk's, or every row's where the FFN runs
  // whole: a batch, op timers); none in a MoE model, whose experts keep their own.
  void ffn_room(int64_t rows) {
    const int64_t F = c.moe() ? 0 : c.n_ff;
    ff.reserve(size_t(rows * 2 * F) * 4, "gate/up");
    act.reserve(size_t(rows * F) * 4, "SwiGLU");
  }

  const DMatrix& weight(Proj p, int l) const {
    const DLayerWeights& L = dw->layers[size_t(l)];
    return p == Proj::QKV ? L.wqkv : p == Proj::O ? L.wo : p == Proj::GateUp ? L.w_gate_up : L.w_down;
  }
  static DBuf CudaBackend::*input_buf(Proj p) {
    return p == Proj::O ? &CudaBackend::attn : p == Proj::Down ? &CudaBackend::act : &CudaBackend::xn;
  }
  static DBuf CudaBackend::*output_buf(Proj p) {
    return p == Proj::QKV ? &CudaBackend::qkv : p == Proj::GateUp ? &CudaBackend::ff : &CudaBackend::branch;
  }
  float* input(Proj p) const { return (this->*input_buf(p)).as<float>(); }
  float* output(Proj p) const { return (this->*output_buf(p)).as<float>(); }
  void add_qkv_bias(int l) {
    const DBuf& b = dw->layers[size_t(l)].qkv_bias;
    if (b.as<float>()) add_bias(qkv.as<float>(), b.as<float>(), T(), QKV);
  }
  void split_qkv() {  // the ops read q, k and v from their own buffers
    copy_columns(qkv.as<float>(), QKV, q.as<float>(), Q, Q, T());
    copy_columns(qkv.as<float>() + Q, QKV, k.as<float>(), KV, KV, T());
    copy_columns(qkv.as<float>() + Q + KV, QKV, v.as<float>(), KV, KV, T());
  }

  std::vector<CudaBackend*> members_of(std::span<Backend* const> members) const {
    std::vector<CudaBackend*> out;
    for (Backend* b : members) {
      auto* m = dynamic_cast<CudaBackend*>(b);
      if (!m || m->dw != dw) internal_fail("a batch mixes backends or weights");
      out.push_back(m);
    }
    return out;
  }
  // The members' rows of activation `from` (width floats each) one after another in batch_in, in
  // one launch; returns how many.
  int64_t concat_rows(const std::vector<CudaBackend*>& ms, DBuf CudaBackend::*from, int64_t width) {
    int64_t total = 0;
    for (CudaBackend* m : ms) total += m->T();
    batch_in.reserve(size_t(total * width) * 4, "batched rows");
    tables_begin(total);
    const auto in = table<const float>(ms, from, width);
    tables_done();
    copy_rows_at(in, {batch_in.as<float>(), width}, total, width);
    return total;
  }
  // The members' rows of p's input multiplied together by mm (through the GEMV where `gemv`), each
  // member's output rows copied back into its own activation (q, k and v for Proj::QKV, after the
  // layer's biases), each copy one launch over every member.
  void batched(Proj p, int l, const DMatrix& W, const std::vector<CudaBackend*>& ms, bool gemv) {
    if (ms.empty()) return;
    const int64_t total = concat_rows(ms, input_buf(p), W.cols);
    if (p == Proj::GateUp)
      for (CudaBackend* m : ms) m->ffn_room(m->T());
    batch_out.reserve(size_t(total * W.rows) * 4, "batched rows");
    float* out = batch_out.as<float>();
    mm(batch_in.as<float>(), W, out, total, gemv ? Path::Gemv : Path::Gemm);
    if (p != Proj::QKV) {
      tables_begin(total);
      const auto dst = table<float>(ms, output_buf(p), W.rows);
      tables_done();
      copy_rows_at({out, W.rows}, dst, total, W.rows);
      return;
    }
    if (const DBuf& b = dw->layers[size_t(l)].qkv_bias; b.as<float>())
      add_bias(out, b.as<float>(), total, QKV);
    tables_begin(3 * total);
    const auto qt = table<float>(ms, &CudaBackend::q, Q), kt = table<float>(ms, &CudaBackend::k, KV),
               vt = table<float>(ms, &CudaBackend::v, KV);
    tables_done();
    copy_rows_at({out, QKV}, qt, total, Q);
    copy_rows_at({out + Q, QKV}, kt, total, KV);
    copy_rows_at({out + Q + KV, QKV}, vt, total, KV);
  }

  // logits[R][V] = a[R][D] . lm_head^T.
  void head(const float* a, int64_t R) {
    const DMatrix& m = *dw->lm_head_w;
    logits.reserve(size_t(R * c.n_vocab) * 4, "logits");
    if (m.qtype) {  // any number of rows: never a bf16 copy of the vocabulary's matrix
      a16.reserve(size_t(R * m.cols) * 2, "bf16 activations");
      to_bf16(a, a16.as<uint16_t>(), R * m.cols);
      gemv_q(a16.as<uint16_t>(), m.data.as<uint8_t>(), m.qtype, m.row_bytes, logits.as<float>(), R, m.cols,
             m.rows);
    } else {
      mm(a, m, logits.as<float>(), R);
    }
  }

  // How a matrix of blocks multiplies its rows: by row count (the block GEMV for at most
  // kGemvMaxRows rows, else dequantized to bf16 for the tensor-core GEMM), or as told.
  enum class Path { ByRows, Gemv, Gemm };

  // out[T][N] = a[T][K] . w^T, through bf16 inputs when the weights are bf16; weights in blocks by
  // `path`.
  void mm(const float* a, const DMatrix& m, float* out, int64_t T, Path path = Path::ByRows) {
    if (m.qtype) {
      a16.reserve(size_t(T * m.cols) * 2, "bf16 activations");
      to_bf16(a, a16.as<uint16_t>(), T * m.cols);
      if (path == Path::Gemv || (path == Path::ByRows && T <= kGemvMaxRows)) {
        gemv_q(a16.as<uint16_t>(), m.data.as<uint8_t>(), m.qtype, m.row_bytes, out, T, m.cols, m.rows);
        return;
      }
      if (w16_holds != &m) {  // a chunked FFN's chunks multiply the same matrix: dequantized once
        w16.reserve(size_t(m.rows * m.cols) * 2, "dequantized weights");
        dequant_bf16(m.data.as<uint8_t>(), m.qtype, m.row_bytes, m.rows, m.cols, w16.as<uint16_t>());
        w16_holds = &m;
      }
      gemm_bf16(a16.as<uint16_t>(), w16.as<uint16_t>(), out, T, m.cols, m.rows);
    } else if (m.bf16) {
      a16.reserve(size_t(T * m.cols) * 2, "bf16 activations");
      to_bf16(a, a16.as<uint16_t>(), T * m.cols);
      gemm_bf16(a16.as<uint16_t>(), m.data.as<uint16_t>(), out, T, m.cols, m.rows);
    } else {
      gemm_f32(a, m.data.as<float>(), out, T, m.cols, m.rows);
    }
  }

  // Layer l's listed keys (cache slots, in the order given) on the device, for the attention and the
  // scores to read the keys where they are. A second call with the same list (the scores after the
  // attention) reuses the upload.
  const int32_t* key_slots(int l, std::span<const int32_t> slots) {
    for (const int32_t sl : slots)
      if (sl < 0 || sl >= layers[size_t(l)].n) internal_fail("key slot {} of layer {} holds no key", sl, l);
    const bool have =
        listed_layer == l && std::equal(slots.begin(), slots.end(), listed_slots.begin(), listed_slots.end());
    if (!have) {
      put(slot_list.as<void>(), slots.data(), slots.size() * 4);
      listed_layer = l;
      listed_slots.assign(slots.begin(), slots.end());
    }
    return slot_list.as<int32_t>();
  }

  // out [T][D] = each row's routed experts' outputs, weighted and summed (kernels/cpu/moe.cpp
  // moe_experts, the same grouping): the (row, expert) pairs grouped on the host by expert and, within
  // an expert, by path (group_by_key); the rows copied into that order; one gate|up and one down
  // product per active (expert, path) over its rows; the activation over every pair; moe_combine back
  // into the rows. `gemv[t]` is row t's path where the weights are blocks: the block GEMV, else the
  // dequantized tensor-core GEMM (mm), so that a row's arithmetic never depends on how many rows its
  // expert gathers.
  void run_experts(int l, const float* in, int64_t T, const std::vector<int32_t>& ids,
                   const std::vector<float>& wts, const std::vector<char>& gemv, float* out) {
    const DLayerWeights& L = dw->layers[size_t(l)];
    const int64_t E = c.n_expert, k = c.n_expert_used, Fe = c.n_ff_exp, D = c.n_embd, P = T * k;
    if (T == 0) return;
    if (std::all_of(gemv.begin(), gemv.end(), [](char g) { return g != 0; }) && L.gate_up_table.bytes() &&
        L.down_table.bytes()) {
      moe_ids.reserve(size_t(P) * 8, "expert ids");
      put(moe_ids.as<void>(), ids.data(), size_t(P) * 4);
      put(moe_ids.as<int32_t>() + P, wts.data(), size_t(P) * 4);
      return run_experts_routed(L, in, T, moe_ids.as<int32_t>(), moe_ids.as<float>() + P, out);
    }
    // Key 2e: expert e's rows by the GEMV; 2e + 1: by the GEMM.
    std::vector<int32_t> keys(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) keys[size_t(i)] = 2 * ids[size_t(i)] + (gemv[size_t(i / k)] ? 0 : 1);
    std::vector<int64_t> first, idx_host;
    group_by_key(keys, 2 * E, first, idx_host);
    idx_host.resize(size_t(2 * P));  // [P] where each pair goes, then [P] its row
    for (int64_t i = 0; i < P; ++i) idx_host[size_t(P + i)] = i / k;
    moe_idx.reserve(size_t(2 * P) * 8, "expert rows");
    moe_w.reserve(size_t(P) * 4, "route weights");
    put(moe_idx.as<void>(), idx_host.data(), idx_host.size() * 8);
    put(moe_w.as<void>(), wts.data(), size_t(P) * 4);
    moe_x.reserve(size_t(P * D) * 4, "expert inputs");
    moe_ff.reserve(size_t(P * 2 * Fe) * 4, "expert gate/up");
    moe_act.reserve(size_t(P * Fe) * 4, "expert activations");
    moe_y.reserve(size_t(P * D) * 4, "expert outputs");
    const int64_t* at = moe_idx.as<int64_t>();
    copy_rows(in, at + P, moe_x.as<float>(), at, P, D);
    // Each active (expert, path)'s rows of a [P][K] input through that expert's matrix into [P][N].
    const auto per_expert = [&](const float* a, int64_t K, const std::vector<DMatrix>& W, float* y,
                                int64_t N) {
      for (int64_t key = 0; key < 2 * E; ++key) {
        const int64_t r0 = first[size_t(key)], n = first[size_t(key) + 1] - r0;
        if (n > 0) mm(a + r0 * K, W[size_t(key / 2)], y + r0 * N, n, key % 2 == 0 ? Path::Gemv : Path::Gemm);
      }
    };
    per_expert(moe_x.as<float>(), D, L.expert_gate_up, moe_ff.as<float>(), 2 * Fe);
    swiglu_fused(moe_ff.as<float>(), moe_act.as<float>(), P, Fe, c.gelu);
    per_expert(moe_act.as<float>(), Fe, L.expert_down, moe_y.as<float>(), D);
    moe_combine(moe_y.as<float>(), at, moe_w.as<float>(), T, k, D, out);
  }

  // run_experts for decoding rows: every (row, expert) pair through its expert in one launch a
  // projection (gemv_routed_*, over the layer's tables of expert matrices; with blocks, each pair's sums
  // are those gemv_q gives it grouped), the activation over the pairs, and the weighted sum back into
  // the rows: six launches a layer where each active expert took two GEMMs, their inputs' copies and a
  // conversion each (docs/cuda.md: 41% of a MoE decoding step in 48 small launches).
  // ids [T][k] and weights [T][k] in device memory.
  void run_experts_routed(const DLayerWeights& L, const float* in, int64_t T, const int32_t* ids,
                          const float* wts, float* out) {
    const int64_t k = c.n_expert_used, Fe = c.n_ff_exp, D = c.n_embd, P = T * k;
    moe_ff.reserve(size_t(P * 2 * Fe) * 4, "expert gate/up");
    moe_act.reserve(size_t(P * Fe) * 4, "expert activations");
    moe_y.reserve(size_t(P * D) * 4, "expert outputs");
    const int32_t* e = ids;
    // a [a_rows][K] through each pair's expert of `table` (matrices of f's format) into y [P][N].
    const auto project = [&](const float* a, int64_t a_rows, int64_t a_per, const DMatrix& f,
                             const DBuf& table, float* y, int64_t K, int64_t N) {
      const int64_t E = c.n_expert;
      if (!f.qtype && !f.bf16)
        return gemv_routed_f32(a, a_per, table.as<const float* const>(), e, E, y, P, K, N);
      a16.reserve(size_t(a_rows * K) * 2, "bf16 activations");
      to_bf16(a, a16.as<uint16_t>(), a_rows * K);
      if (f.qtype)
        gemv_routed_q(a16.as<uint16_t>(), a_per, table.as<const uint8_t* const>(), e, E, f.qtype, f.row_bytes,
                      y, P, K, N);
      else
        gemv_routed_bf16(a16.as<uint16_t>(), a_per, table.as<const uint16_t* const>(), e, E, y, P, K, N);
    };
    project(in, T, k, L.expert_gate_up.front(), L.gate_up_table, moe_ff.as<float>(), D, 2 * Fe);
    swiglu_fused(moe_ff.as<float>(), moe_act.as<float>(), P, Fe, c.gelu);
    project(moe_act.as<float>(), P, 1, L.expert_down.front(), L.down_table, moe_y.as<float>(), Fe, D);
    moe_combine(moe_y.as<float>(), nullptr, wts, T, k, D, out);
  }

  // dst[to[i]] = src[from[i]], rows of D floats.
  void copy_indexed(const DBuf& src, std::span<const int64_t> from, DBuf& dst, std::span<const int64_t> to) {
    if (from.empty()) return;
    idx.reserve(from.size() * 8, "row indices");
    idx2.reserve(to.size() * 8, "row indices");
    put(idx.as<void>(), from.data(), from.size() * 8);
    put(idx2.as<void>(), to.data(), to.size() * 8);
    copy_rows(src.as<float>(), idx.as<int64_t>(), dst.as<float>(), idx2.as<int64_t>(), int64_t(from.size()),
              c.n_embd);
  }
};

CudaBackend::CudaBackend(const ModelConfig& cfg, const Weights& wts, int64_t ctx, const BackendOptions& o)
    : c(cfg), w(wts), n_ctx(ctx), opt(o), kv_type(kv_type_for(wts.dtype)) {
  const Device dev = open_device();
  // Everything the backend allocates, counted before anything is (the weights only when no other
  // backend has put them on the device): kernels/cuda/memory.h.
  const BackendMemory m = backend_memory(c, w.dtype, n_ctx, ffn_chunk_rows());
  dw = weight_cache().find(w);
  const double weight_bytes = dw ? 0.0 : double(w.bytes());
  const double need = weight_bytes + m.total();
  if (need > double(dev.free_bytes))
    fail(
        "the model needs {:.2f} GiB on the GPU (weights {:.2f} + K/V {:.2f} in {} + Aux Cache {:.2f} + "
        "activations {:.2f} for {} tokens + {:.2f} of dequantized weights + {:.2f} for cuBLAS) but {} has "
        "{:.2f} GiB free",
        need / 1073741824.0, weight_bytes / 1073741824.0, m.kv / 1073741824.0, kv_type_name(kv_type),
        m.aux / 1073741824.0, m.activations / 1073741824.0, n_ctx, m.dequantized / 1073741824.0,
        m.library / 1073741824.0, dev.name, double(dev.free_bytes) / 1073741824.0);
  if (!c.uniform()) fail("the CUDA backend runs uniform models (every layer the same widths)");
  // Pinned host memory, once the device is open and the session fits: a LazyLLM decoding step
  // uploads a few bytes per key and layer between two waits; a selection's scores and kept indices.
  staging.init(std::clamp<size_t>(size_t(n_ctx) * 64, size_t(64) << 10, size_t(4) << 20));
  scores_host = PinnedBuf(size_t(std::max<int64_t>(n_ctx, 1)) * 4, "selection scores");
  keep_host = PinnedBuf(size_t(std::max<int64_t>(n_ctx, 1)) * 8, "kept indices");
  if (c.moe()) {
    routes_host = PinnedBuf(size_t(std::max<int64_t>(n_ctx, 1) * c.n_expert_used) * 8, "routes");
    routes_log = PinnedBuf(size_t(c.n_layer * kGemvMaxRows * c.n_expert_used) * 8, "a step's routes");
    routes_log_rows.assign(size_t(c.n_layer), 0);
  }
  if (!dw) {
    ++uploads;
    auto uploaded = upload_weights(c, w);
    weight_cache().put(w, uploaded);
    dw = std::move(uploaded);
  }
  // A slot per position: n_ctx positions at first, up to the model's context (or n_ctx) as they come.
  pos_limit = std::max<int64_t>(c.n_ctx_train, n_ctx);
  n_pos = std::max<int64_t>(n_ctx, 1);
  layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    DLayer& L = layers[size_t(l)];
    L.k.reserve(size_t(n_ctx * kv_row_bytes()), "K cache");
    L.v.reserve(size_t(n_ctx * kv_row_bytes()), "V cache");
    L.pos.reserve(size_t(n_ctx) * 4, "K/V positions");
    L.slot_of.reserve(size_t(n_pos) * 4, "K/V slots of positions");
    fill_i32(L.slot_of.as<int32_t>(), n_pos, -1);
  }
  aux_states.reserve(size_t(n_ctx * c.n_embd) * 4, "Aux Cache");
  // A decoding step's key-sized buffers at their largest, n_ctx keys (counted above as `decode` and
  // `selection`): grown with the keys instead, they were freed and allocated again at almost every
  // LazyLLM step (one key more each), and cudaFree waits for the device (issue 58, item 2).
  slot_list.reserve(size_t(n_ctx) * 4, "key slots");
  {
    std::vector<int32_t> numbers(static_cast<size_t>(n_ctx));
    std::iota(numbers.begin(), numbers.end(), 0);
    slot_numbers = upload(numbers.data(), numbers.size(), "slot numbers");
  }
  active_dev.reserve(size_t(n_ctx) * 4, "active positions");
  active_next.reserve(size_t(n_ctx) * 4, "active positions");
  idx2.reserve(size_t(n_ctx) * 8, "row indices");
  scores_dev.reserve(size_t(n_ctx) * 4, "scores");
  sel_pos.reserve(size_t(n_ctx) * 4, "selection positions");
  keep_dev.reserve(size_t(n_ctx) * 8, "kept indices");
  wait("weight upload");
}

}  // namespace

int64_t host_waits() {
  return waits.load();
}

int64_t weight_uploads() {
  return uploads.load();
}

int64_t activation_bytes(Backend& b) {
  auto* cb = dynamic_cast<CudaBackend*>(&b);
  if (!cb) internal_fail("activation_bytes of a backend that is not the CUDA one");
  return cb->activation_bytes();
}

std::unique_ptr<Backend> make_backend(const ModelConfig& c, const Weights& w, int64_t n_ctx,
                                      const BackendOptions& o) {
  return std::make_unique<CudaBackend>(c, w, n_ctx, o);
}

}  // namespace lp::cuda
