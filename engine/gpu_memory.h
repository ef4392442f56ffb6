// How `serve --backend cuda` divides the GPU (docs/serving.md, "Memory on a GPU"): the K/V layout
// its reservations count in (what a CUDA backend holds per token and per request,
// kernels/cuda/memory.h), and the plan (admission/admission.h) from the model, the device's memory
// when the server starts, --gpu-memory-utilization and --max-model-len.
#pragma once

#include <cstdint>

#include "admission/admission.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/weights.h"
#include "model/config.h"

namespace lp {

class Model;

// The layout a CUDA backend of these weights reports (kv_element_bytes, kv_block, held_bytes) with
// its default options.
KvLayout gpu_kv_layout(const ModelConfig& c, DType dtype);

// max_model_len 0: the most that fits, up to the model's context. Throws lp::Error with the sizes.
DeviceMemoryPlan gpu_memory_plan(const Model& m, const cuda::Device& d, double utilization,
                                 int64_t max_model_len);

}  // namespace lp
