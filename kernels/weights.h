// Weights of a model (model/config.h's architectures), dequantized from the GGUF once at load into
// the compute dtype (f32 or bf16), or kept in their blocks (int8). Matrices are [out][in] row-major,
// as GGUF stores them; Q/K/V and gate/up are concatenated so each is one GEMM.
//
// A NEOX-RoPE model's (ModelConfig::rope_neox: Qwen) Q and K rows are permuted at load so that the
// engine's one rotation, of the adjacent pairs (2i, 2i+1) as Llama's GGUF rows expect, does what
// NEOX's rotation of the pairs (i, i + rope_dim/2) does to the file's rows: within each head, row 2i
// takes row i and row 2i+1 row i + rope_dim/2 (rope_order). q and k are permuted alike, so every
// q.k product, the attention and the LazyLLM scores are the model's; the per-head norm is
// order-free, so its weights are permuted alongside; v and the output projection are untouched.
// This is llama.cpp's converter's permutation of Llama's rows, run at load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/gemm.h"
#include "kernels/kv_type.h"
#include "model/config.h"

namespace lp {

class GgufFile;

struct LayerWeights {
  std::vector<float> attn_norm;                      // [D]
  Matrix wqkv;                                       // [(H + 2 Hkv) Dh][D]  rows: q, then k, then v
  std::vector<float> qkv_bias;                       // [(H + 2 Hkv) Dh] (attention_bias), else empty
  std::vector<float> q_norm, k_norm;                 // [Dh] each (qk_norm), else empty
  std::vector<float> post_attn_norm, post_ffn_norm;  // [D] each (post_norms), else empty
  Matrix wo;                                         // [D][H Dh]
  std::vector<float> ffn_norm;                       // [D]
  Matrix w_gate_up;                                  // [2F][D]  rows: gate, then up (dense)
  Matrix w_down;                                     // [D][F]
  // Mixture of experts (ModelConfig::moe) in place of w_gate_up and w_down: the router, always f32,
  // and each expert's gate|up and down, row ranges of the file's 3-D ffn_{gate,up,down}_exps
  // tensors (Fe = n_ff_exp).
  Matrix router;                       // [E][D]
  std::vector<Matrix> expert_gate_up;  // [E] of [2 Fe][D]
  std::vector<Matrix> expert_down;     // [E] of [D][Fe]
};

struct Weights {
  DType dtype = DType::F32;
  Matrix tok_embd;                   // [V][D]; also the LM head when embeddings are tied
  Matrix output;                     // [V][D]; empty when tied
  std::vector<float> output_norm;    // [D]
  std::vector<float> rope_freqs;     // [rope_dim/2] or empty
  std::vector<LayerWeights> layers;  // [L]

  const Matrix& lm_head() const { return output.rows ? output : tok_embd; }
  int64_t bytes() const;
  // Bytes a layer GEMM's weight takes as held (gate|up's, the widest): 4 in f32, 2 in bf16, the
  // blocks' share in int8 (Q4_1: 0.625). What model/ops and the simulator count the weights at.
  double gemm_bytes_per_weight() const;
};

// Row order within a head of width Dh for NEOX RoPE over its first rope_dim values: entry i is the
// file's row that row i of the loaded matrix holds (identity from rope_dim on).
std::vector<int64_t> rope_order(int64_t Dh, int64_t rope_dim);

// The K/V cache every backend keeps for a compute dtype (kernels/kv_type.h): f32 when the compute
// dtype is f32 (the reference arithmetic), else f16.
inline KvType kv_type_for(DType compute) {
  return compute == DType::F32 ? KvType::F32 : KvType::F16;
}

// Dequantizes every tensor the config names into `dtype` (Int8: keeps or requantizes the blocks;
// a matrix kept as stored reads the file's mapping, which it keeps alive). Throws lp::Error for a
// tensor type that cannot be dequantized.
// for_cpu: int8 matrices are also packed for the CPU's 512-bit kernel where it runs (qpack: as many
// bytes again); a GPU backend, which uploads the blocks as stored, passes false.
Weights load_weights(const std::shared_ptr<const GgufFile>& f, const ModelConfig& c, DType dtype,
                     CpuContext& ctx, bool for_cpu = true);

// A quantized file: every layer's matrix (attn_q/k/v/output, ffn_gate/up/down) is in a type the
// integer GEMM multiplies as stored, so --dtype int8 keeps all of them.
bool int8_keeps_layers(const GgufFile& f);
// --dtype auto on the CPU: int8 for a quantized file (its weights multiplied as stored, in about
// the file's memory), else the fastest float mode this CPU has (fastest_dtype).
DType auto_cpu_dtype(const GgufFile& f);

}  // namespace lp
