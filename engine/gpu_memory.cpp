#include "engine/gpu_memory.h"

#include "engine/model.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/memory.h"
#include "kernels/kv_type.h"

namespace lp {
namespace {

int64_t default_ffn_chunk_rows(const ModelConfig& c) {
  return c.moe() ? 0 : cuda::BackendOptions{}.ffn_chunk_rows;  // as CudaBackend::ffn_chunk_rows
}

}  // namespace

KvLayout gpu_kv_layout(const ModelConfig& c, DType dtype) {
  const Backend::Held held = cuda::held_bytes(c, dtype, default_ffn_chunk_rows(c));
  return KvLayout{.element_bytes = double(kv_type_bytes(kv_type_for(dtype))),
                  .block = 1,
                  .token_bytes = held.token_bytes,
                  .request_bytes = held.request_bytes,
                  .aux_in_token_bytes = held.aux_in_token_bytes};
}

DeviceMemoryPlan gpu_memory_plan(const Model& m, const cuda::Device& d, double utilization,
                                 int64_t max_model_len) {
  const ModelConfig& c = m.config();
  const DType dtype = m.weights().dtype;
  const int64_t chunk = default_ffn_chunk_rows(c);
  // While a prefill of n tokens runs, its backend holds beyond its reservation the check's
  // activations, the dequantized matrix and cuBLAS's margin, and the batch's leader its copies of
  // the prefill's rows (the scheduler's probe backend, which keeps the weights loaded, holds one
  // token's reservation: inside the margin).
  const auto prefill = [&](int64_t n) {
    const cuda::BackendMemory b = cuda::backend_memory(c, dtype, n, chunk);
    return b.activations + b.dequantized + b.library + cuda::batch_leader_bytes(c, dtype, n);
  };
  return plan_device_memory(c, gpu_kv_layout(c, dtype),
                            DeviceMemory{double(d.total_bytes), double(d.free_bytes)}, utilization,
                            double(m.weights().bytes()), max_model_len, prefill);
}

}  // namespace lp
