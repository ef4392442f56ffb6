// How a backend stores cached K and V, shared by the CPU's cache (kernels/cpu/kv_cache.h) and the
// GPU's (kernels/cuda/cuda_backend.cpp); kv_type_for (kernels/weights.h) picks it for a model's
// compute dtype. F16 halves the cache's bytes (so the tokens and requests a K/V budget holds) and
// what a decoding step's attention reads; the kernels convert to f32 as they load and compute in f32
// as before. llama.cpp's cache is f16 by default; vLLM's is the model's dtype. Values past f16's range
// (65,504) would become infinities; rounding is to nearest even. No includes: the CUDA launchers'
// declarations (kernels/cuda/cuda_ops.h) take it.
#pragma once

namespace lp {

enum class KvType { F32, F16 };
inline int kv_type_bytes(KvType t) {
  return t == KvType::F16 ? 2 : 4;
}
inline const char* kv_type_name(KvType t) {
  return t == KvType::F16 ? "f16" : "f32";
}

}  // namespace lp
