#include "kernels/weights.h"

#include <tbb/parallel_for.h>

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

// Stacks the named [rows_i][K] tensors into one matrix.
Matrix load_matrix(const GgufFile& f, const std::vector<std::string>& names, DType dtype, CpuContext& ctx) {
  Matrix m;
  m.dtype = dtype;
  std::vector<const GgufTensor*> ts;
  for (const auto& n : names) {
    ts.push_back(&f.tensor(n));
    check_dequantizable(f, *ts.back());
    if (m.cols && ts.back()->ne[0] != m.cols) fail("{}: tensor '{}' width mismatch", f.path(), n);
    m.cols = ts.back()->ne[0];
    m.rows += ts.back()->rows();
  }
  if (dtype == DType::F32)
    m.f32.resize(m.rows * m.cols, false);
  else
    m.bf16.resize(m.rows * m.cols, false);
  int64_t row0 = 0;
  for (const GgufTensor* t : ts) {
    const int64_t K = m.cols;
    const size_t row_bytes = size_t(*type_bytes(t->type, K));
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), t->rows(), [&](int64_t r) {
        const uint8_t* src = t->data + r * row_bytes;
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

Weights load_weights(const GgufFile& f, const ModelConfig& c, DType dtype, CpuContext& ctx) {
  Weights w;
  w.dtype = dtype;
  w.tok_embd = load_matrix(f, {"token_embd.weight"}, dtype, ctx);
  if (!c.tied_embeddings) w.output = load_matrix(f, {"output.weight"}, dtype, ctx);
  w.output_norm = load_vector(f, "output_norm.weight");
  if (c.has_rope_freqs) w.rope_freqs = load_vector(f, "rope_freqs.weight");
  w.layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[size_t(l)];
    L.attn_norm = load_vector(f, p + "attn_norm.weight");
    L.ffn_norm = load_vector(f, p + "ffn_norm.weight");
    L.wqkv = load_matrix(f, {p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}, dtype, ctx);
    L.wo = load_matrix(f, {p + "attn_output.weight"}, dtype, ctx);
    L.w_gate_up = load_matrix(f, {p + "ffn_gate.weight", p + "ffn_up.weight"}, dtype, ctx);
    L.w_down = load_matrix(f, {p + "ffn_down.weight"}, dtype, ctx);
  }
  return w;
}

}  // namespace lp
