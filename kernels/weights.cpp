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

// Rows of one tensor stacked into a matrix: `count` rows from `first` (a whole 2-D tensor, or one
// expert of a 3-D one), in `order` (empty: as stored; else row r of the part is the file's row
// order[r mod order.size()] of the same run of rows).
struct Slice {
  std::string name;
  std::vector<int64_t> order = {};
  int64_t first = 0, count = -1;  // -1: every row
};
struct Part {
  const GgufTensor* t;
  std::vector<int64_t> order;
  int64_t first, rows;
  int64_t source_row(int64_t r) const {
    if (order.empty()) return first + r;
    const int64_t n = int64_t(order.size());
    return first + r / n * n + order[size_t(r % n)];
  }
  int64_t row_bytes() const { return *type_bytes(t->type, t->ne[0]); }
  const uint8_t* data() const { return t->data + first * row_bytes(); }
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
    if (!qgemm_supports(p.t->type) || !p.order.empty()) owned += p.rows * *type_bytes(held_type(p.t), K);
  m.q.resize(size_t(owned), false);
  m.q_owner = file;
  int64_t q_at = 0;
  for (const Part& p : ps) {
    const GgufTensor* t = p.t;
    if (qgemm_supports(t->type) && p.order.empty()) {
      m.parts.push_back({t->type, p.rows, p.data()});
      continue;
    }
    const GgmlType type = held_type(t);
    const int64_t out_bytes = *type_bytes(type, K);
    uint8_t* dst = m.q.data() + q_at;
    const size_t in_bytes = size_t(*type_bytes(t->type, K));
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), p.rows, [&](int64_t r) {
        const uint8_t* src = t->data + p.source_row(r) * in_bytes;
        if (type == t->type)
          std::memcpy(dst + r * out_bytes, src, in_bytes);
        else
          requantize_q8_0(t->type, src, K, dst + r * out_bytes);
      });
    });
    m.parts.push_back({type, p.rows, dst});
    q_at += p.rows * out_bytes;
  }
  // The panels' order, copied once (qpack: null where it does not apply); the file's pages
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

// Stacks the slices' rows, each [rows_i][K], into one matrix.
Matrix load_matrix(const std::shared_ptr<const GgufFile>& file, const std::vector<Slice>& slices, DType dtype,
                   CpuContext& ctx, bool for_cpu) {
  const GgufFile& f = *file;
  Matrix m;
  m.dtype = dtype;
  std::vector<Part> ps;
  for (const Slice& sl : slices) {
    const GgufTensor* t = &f.tensor(sl.name);
    check_dequantizable(f, *t);
    if (m.cols && t->ne[0] != m.cols) fail("{}: tensor '{}' width mismatch", f.path(), sl.name);
    const int64_t rows = sl.count < 0 ? t->rows() : sl.count;
    if (sl.first < 0 || rows < 0 || sl.first + rows > t->rows())
      internal_fail("rows [{}, {}) of tensor '{}', which has {}", sl.first, sl.first + rows, sl.name,
                    t->rows());
    m.cols = t->ne[0];
    m.rows += rows;
    ps.push_back({t, sl.order, sl.first, rows});
  }
  // The file's pages of these rows leave the resident set once copied or checked (a mapped
  // matrix's pages come back as the GEMMs read them; the embedding's only for the rows looked up).
  struct Drop {
    const GgufFile& f;
    const std::vector<Part>& ps;
    ~Drop() {
      for (const Part& p : ps) f.drop_pages(p.data(), uint64_t(p.rows * p.row_bytes()));
    }
  } drop{f, ps};
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
      tbb::parallel_for(int64_t(0), p.rows, [&](int64_t r) {
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
    row0 += p.rows;
  }
  return m;
}

}  // namespace

int64_t Weights::bytes() const {
  int64_t b = tok_embd.bytes() + output.bytes();
  for (const auto& l : layers) {
    b += l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes() + l.router.bytes();
    for (size_t e = 0; e < l.expert_gate_up.size(); ++e)
      b += l.expert_gate_up[e].bytes() + l.expert_down[e].bytes();
  }
  return b;
}

double Weights::gemm_bytes_per_weight() const {
  const LayerWeights& l = layers.at(0);
  const Matrix& m = l.expert_gate_up.empty() ? l.w_gate_up : l.expert_gate_up[0];
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
  const auto load_matrix = [&](const std::vector<Slice>& slices) {
    return lp::load_matrix(file, slices, dtype, ctx, for_cpu);
  };
  // NEOX RoPE: q and k rows in adjacent-pair order (weights.h).
  const std::vector<int64_t> qk_order =
      c.rope_neox ? rope_order(c.head_dim, c.rope_dim) : std::vector<int64_t>{};
  Weights w;
  w.dtype = dtype;
  // The embedding table is packed only when it is also the LM head: a lookup reads its rows as
  // stored, and a packed copy of an untied table would only take memory (Llama-3.1-8B's Q4_K: 295 MB).
  w.tok_embd = lp::load_matrix(file, {Slice{"token_embd.weight"}}, dtype, ctx, for_cpu && c.tied_embeddings);
  if (!c.tied_embeddings) w.output = load_matrix({Slice{"output.weight"}});
  w.output_norm = load_vector(f, "output_norm.weight");
  if (c.has_rope_freqs) w.rope_freqs = load_vector(f, "rope_freqs.weight");
  w.layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[size_t(l)];
    L.attn_norm = load_vector(f, p + "attn_norm.weight");
    L.ffn_norm = load_vector(f, p + "ffn_norm.weight");
    L.wqkv = load_matrix({Slice{p + "attn_q.weight", qk_order}, Slice{p + "attn_k.weight", qk_order},
                          Slice{p + "attn_v.weight"}});
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
    L.wo = load_matrix({Slice{p + "attn_output.weight"}});
    if (!c.moe()) {
      L.w_gate_up = load_matrix({Slice{p + "ffn_gate.weight"}, Slice{p + "ffn_up.weight"}});
      L.w_down = load_matrix({Slice{p + "ffn_down.weight"}});
      continue;
    }
    // Experts: row ranges of the 3-D tensors (in int8 the blocks stay where the file maps them); the
    // router in f32 whatever the file holds, as it picks the experts.
    L.router = lp::load_matrix(file, {Slice{p + "ffn_gate_inp.weight"}}, DType::F32, ctx, for_cpu);
    const int64_t Fe = c.n_ff_exp, D = c.n_embd;
    for (int64_t e = 0; e < c.n_expert; ++e) {
      L.expert_gate_up.push_back(load_matrix({Slice{p + "ffn_gate_exps.weight", {}, e * Fe, Fe},
                                              Slice{p + "ffn_up_exps.weight", {}, e * Fe, Fe}}));
      L.expert_down.push_back(load_matrix({Slice{p + "ffn_down_exps.weight", {}, e * D, D}}));
    }
  }
  return w;
}

bool int8_keeps_layers(const GgufFile& f) {
  bool any = false;
  for (const GgufTensor& t : f.tensors()) {
    const std::string& n = t.name;
    if (n.rfind("blk.", 0) != 0) continue;
    for (const char* m : {".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight",
                          ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight", ".ffn_gate_exps.weight",
                          ".ffn_up_exps.weight", ".ffn_down_exps.weight"})
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
