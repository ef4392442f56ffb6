// Weights of a Llama-family model, dequantized from the GGUF once at load into the compute
// dtype (f32 or bf16). Matrices are [out][in] row-major, as GGUF stores them; Q/K/V and
// gate/up are concatenated so each is one GEMM.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/gemm.h"
#include "model/config.h"

namespace lp {

class GgufFile;

struct LayerWeights {
  std::vector<float> attn_norm;  // [D]
  Matrix wqkv;                   // [(H + 2 Hkv) Dh][D]  rows: q, then k, then v
  Matrix wo;                     // [D][H Dh]
  std::vector<float> ffn_norm;   // [D]
  Matrix w_gate_up;              // [2F][D]  rows: gate, then up
  Matrix w_down;                 // [D][F]
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
