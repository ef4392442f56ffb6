#include "kernels/weights.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/qgemm.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/quant.h"

namespace lp {

namespace {

void check_dequantizable(const GgufFile& f, const GgufTensor& t) {
  const auto info = type_info(static_cast<uint32_t>(t.type));
  if (!info || !info->dequantizable)
    fail("{}: unsupported tensor type {} (tensor '{}')", f.path(), info ? info->name : "?", t.name);
}

std::vector<float> load_vector(const GgufFile& f, const std::string& name) {
  const GgufTensor& t = f.tensor(name);
  check_dequantizable(f, t);
  std::vector<float> v(size_t(t.n_elems));
  dequantize(t.type, t.data, v.data(), t.n_elems);
  return v;
}

// v[i] = v[order[i mod n]] within each run of n = order.size() values.
void permute_runs(std::vector<float>& v, const std::vector<int64_t>& order) {
  const size_t n = order.size();
  std::vector<float> run(n);
  for (size_t at = 0; at + n <= v.size(); at += n) {
    for (size_t i = 0; i < n; ++i) run[i] = v[at + size_t(order[i])];
    std::copy(run.begin(), run.end(), v.begin() + ptrdiff_t(at));
  }
}

// One tensor of a stacked matrix, and the order of its rows (empty: as stored; else row r of
// the loaded tensor is the file's row order[r mod order.size()] of the same run of rows).
struct Part {
  const GgufTensor* t;
  std::vector<int64_t> order;
  int64_t source_row(int64_t r) const {
    if (order.empty()) return r;
    const int64_t n = int64_t(order.size());
    return r / n * n + order[size_t(r % n)];
  }
};

// Int8 mode: each tensor of the matrix is one part, its own blocks where the integer GEMM multiplies
// its type (read where the file is mapped, which `file` keeps alive: never copied), else its rows
// requantized to Q8_0 (the dequantized values rounded per block of 32 to 8 bits, as llama.cpp's
// quantizer does). So Q4_K_M's attn_q|k|v, Q4_K and Q6_K, stays Q4_K and Q6_K.
// A part whose rows are reordered is copied in its order (its own blocks, or Q8_0 as above).
Matrix load_int8(const std::shared_ptr<const GgufFile>& file, const std::vector<Part>& ps, Matrix m,
                 CpuContext& ctx, bool pack) {
  const GgufFile& f = *file;
  if (m.cols % kQBlock != 0)
    fail(
        "{}: tensor '{}' has rows of {} values, not a multiple of {}: --dtype int8 cannot hold it (--dtype "
        "f32 loads it)",
        f.path(), ps.front().t->name, m.cols, kQBlock);
  const int64_t K = m.cols;
  const auto held_type = [](const GgufTensor* t) {
    return qgemm_supports(t->type) ? t->type : GgmlType::Q8_0;
  };
  int64_t owned = 0;  // bytes copied or requantized
  for (const Part& p : ps)
    if (!qgemm_supports(p.t->type) || !p.order.empty()) owned += p.t->rows() * *type_bytes(held_type(p.t), K);
  m.q.resize(size_t(owned), false);
  m.q_owner = file;
  int64_t q_at = 0;
  for (const Part& p : ps) {
    const GgufTensor* t = p.t;
    if (qgemm_supports(t->type) && p.order.empty()) {
      m.parts.push_back({t->type, t->rows(), t->data});
      continue;
    }
    const GgmlType type = held_type(t);
    const int64_t out_bytes = *type_bytes(type, K);
    uint8_t* dst = m.q.data() + q_at;
    const size_t in_bytes = size_t(*type_bytes(t->type, K));
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), t->rows(), [&](int64_t r) {
        const uint8_t* src = t->data + p.source_row(r) * in_bytes;
        if (type == t->type)
          std::memcpy(dst + r * out_bytes, src, in_bytes);
        else
          requantize_q8_0(t->type, src, K, dst + r * out_bytes);
      });
    });
    m.parts.push_back({type, t->rows(), dst});
    q_at += t->rows() * out_bytes;
  }
  // The 512-bit kernel's order, copied once (qpack: null where it does not apply); the file's pages
  // then leave the resident set for good (load_matrix's Drop), as only the embedding lookup reads
  // them.
  for (QPart& p : m.parts) {
    m.packs.push_back(pack ? qpack(ctx, p.type, p.data, p.rows, K) : nullptr);
    p.packed = m.packs.back().get();
  }
  // Scales no arithmetic survives (a file's NaN or infinite f16, or a requantized NaN): refused,
  // naming the tensor.
  for (size_t i = 0; i < m.parts.size(); ++i) {
    const QPart& p = m.parts[i];
    const TypeInfo info = *type_info(uint32_t(p.type));
    const int64_t bb = info.block_bytes, nb = K / info.block_elems, row_bytes = *type_bytes(p.type, K);
    const int d_at = block_scale_offset(p.type), scales = block_has_min(p.type) ? 2 : 1;
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = p.data + r * row_bytes + b * bb;
        for (int k = 0; k < scales; ++k) {
          const uint8_t* f16 = blk + d_at + 2 * k;
          const uint16_t h = uint16_t(f16[0] | (f16[1] << 8));
          if ((h & 0x7C00) == 0x7C00)
            fail("{}: tensor '{}' has a block scale that is {} (row {}, block {})", f.path(), ps[i].t->name,
                 (h & 0x3FF) ? "NaN" : "infinite", r, b);
        }
      }
  }
  return m;
}

// Stacks the named [rows_i][K] tensors into one matrix; orders[i] (if given and not empty) reorders
// tensor i's rows (Part::order).
Matrix load_matrix(const std::shared_ptr<const GgufFile>& file, const std::vector<std::string>& names,
                   DType dtype, CpuContext& ctx, bool for_cpu,
                   const std::vector<std::vector<int64_t>>& orders = {}) {
  const GgufFile& f = *file;
  Matrix m;
  m.dtype = dtype;
  std::vector<const GgufTensor*> ts;
  std::vector<Part> ps;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    ts.push_back(&f.tensor(n));
    check_dequantizable(f, *ts.back());
    if (m.cols && ts.back()->ne[0] != m.cols) fail("{}: tensor '{}' width mismatch", f.path(), n);
    m.cols = ts.back()->ne[0];
    m.rows += ts.back()->rows();
    ps.push_back({ts.back(), i < orders.size() ? orders[i] : std::vector<int64_t>{}});
  }
  // The file's pages of these tensors leave the resident set once copied or checked (a mapped
  // matrix's pages come back as the GEMMs read them; the embedding's only for the rows looked up).
  struct Drop {
    const GgufFile& f;
    const std::vector<const GgufTensor*>& ts;
    ~Drop() {
      for (const GgufTensor* t : ts) f.drop_pages(t->data, uint64_t(t->n_bytes));
    }
  } drop{f, ts};
  if (dtype == DType::Int8) return load_int8(file, ps, std::move(m), ctx, for_cpu);
  if (dtype == DType::F32)
    m.f32.resize(m.rows * m.cols, false);
  else
    m.bf16.resize(m.rows * m.cols, false);
  int64_t row0 = 0;
  for (const Part& p : ps) {
    const GgufTensor* t = p.t;
    const int64_t K = m.cols;
    const size_t row_bytes = size_t(*type_bytes(t->type, K));
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), t->rows(), [&](int64_t r) {
        const uint8_t* src = t->data + p.source_row(r) * row_bytes;
        if (dtype == DType::F32) {
          dequantize(t->type, src, m.f32.data() + (row0 + r) * K, K);
        } else {
          thread_local std::vector<float> tmp;
          tmp.resize(size_t(K));
          dequantize(t->type, src, tmp.data(), K);
          uint16_t* dst = m.bf16.data() + (row0 + r) * K;
          for (int64_t k = 0; k < K; ++k) dst[k] = f32_to_bf16(tmp[k]);
        }
      });
    });
    row0 += t->rows();
  }
  return m;
}

}  // namespace

int64_t Weights::bytes() const {
  int64_t b = tok_embd.bytes() + output.bytes();
  for (const auto& l : layers) b += l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes();
  return b;
}

double Weights::gemm_bytes_per_weight() const {
  const Matrix& m = layers.at(0).w_gate_up;
  return double(m.bytes()) / double(m.rows * m.cols);
}

std::vector<int64_t> rope_order(int64_t Dh, int64_t rope_dim) {
  std::vector<int64_t> order(static_cast<size_t>(Dh));
  for (int64_t i = 0; i < Dh; ++i) order[size_t(i)] = i;
  for (int64_t j = 0; j < rope_dim / 2; ++j) {
    order[size_t(2 * j)] = j;
    order[size_t(2 * j + 1)] = j + rope_dim / 2;
  }
  return order;
}

Weights load_weights(const std::shared_ptr<const GgufFile>& file, const ModelConfig& c, DType dtype,
                     CpuContext& ctx, bool for_cpu) {
  const GgufFile& f = *file;
  const auto load_matrix = [&](const std::vector<std::string>& names,
                               const std::vector<std::vector<int64_t>>& orders = {}) {
    return lp::load_matrix(file, names, dtype, ctx, for_cpu, orders);
  };
  // NEOX RoPE: q and k rows in adjacent-pair order (weights.h).
  const std::vector<int64_t> qk_order =
      c.rope_neox ? rope_order(c.head_dim, c.rope_dim) : std::vector<int64_t>{};
  Weights w;
  w.dtype = dtype;
  w.tok_embd = load_matrix({"token_embd.weight"});
  if (!c.tied_embeddings) w.output = load_matrix({"output.weight"});
  w.output_norm = load_vector(f, "output_norm.weight");
  if (c.has_rope_freqs) w.rope_freqs = load_vector(f, "rope_freqs.weight");
  w.layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[size_t(l)];
    L.attn_norm = load_vector(f, p + "attn_norm.weight");
    L.ffn_norm = load_vector(f, p + "ffn_norm.weight");
    L.wqkv = load_matrix({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"},
                         {qk_order, qk_order, {}});
    if (c.attention_bias) {
      std::vector<float> q = load_vector(f, p + "attn_q.bias"), k = load_vector(f, p + "attn_k.bias");
      if (!qk_order.empty()) permute_runs(q, qk_order), permute_runs(k, qk_order);
      L.qkv_bias = std::move(q);
      L.qkv_bias.insert(L.qkv_bias.end(), k.begin(), k.end());
      const std::vector<float> v = load_vector(f, p + "attn_v.bias");
      L.qkv_bias.insert(L.qkv_bias.end(), v.begin(), v.end());
    }
    if (c.post_norms) {
      L.post_attn_norm = load_vector(f, p + "post_attention_norm.weight");
      L.post_ffn_norm = load_vector(f, p + "post_ffw_norm.weight");
    }
    if (c.qk_norm) {
      L.q_norm = load_vector(f, p + "attn_q_norm.weight");
      L.k_norm = load_vector(f, p + "attn_k_norm.weight");
      if (!qk_order.empty()) permute_runs(L.q_norm, qk_order), permute_runs(L.k_norm, qk_order);
    }
    L.wo = load_matrix({p + "attn_output.weight"});
    L.w_gate_up = load_matrix({p + "ffn_gate.weight", p + "ffn_up.weight"});
    L.w_down = load_matrix({p + "ffn_down.weight"});
  }
  return w;
}

bool int8_keeps_layers(const GgufFile& f) {
  bool any = false;
  for (const GgufTensor& t : f.tensors()) {
    const std::string& n = t.name;
    if (n.rfind("blk.", 0) != 0) continue;
    for (const char* m : {".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight",
                          ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight"})
      if (n.size() > std::strlen(m) && n.compare(n.size() - std::strlen(m), std::string::npos, m) == 0) {
        if (!qgemm_supports(t.type)) return false;
        any = true;
      }
  }
  return any;
}

DType auto_cpu_dtype(const GgufFile& f) {
  return int8_keeps_layers(f) ? DType::Int8 : fastest_dtype();
}

}  // namespace lp
