// The CUDA backend's session (issue 8): the model's weights uploaded to the GPU once, a device
// K/V cache per layer, and forward passes with the same contract as lp::Session::forward
// (kernels/runner.h): explicit ids and original positions, LazyLLM-style pruning in the prefill
// (the CPU's PruningPolicy chooses from the scores the GPU computes; pruned rows' hidden states go
// to the Aux Cache on the device, whose index the host keeps), logits for the requested rows. Plain C++ over the launchers of
// cuda_ops.h, so it builds without CUDA headers; in a build without CUDA its constructor fails
// with the reason.
//
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/generate.h"
#include "kernels/runner.h"

namespace lp::cuda {

class CudaSession {
 public:
  // Uploads the model's weights (in its dtype: f32 GEMMs exact, bf16 GEMMs with f32 accumulation)
  // and allocates K/V for n_ctx tokens. Throws lp::Error when there is no GPU or not enough memory
  // (naming what it needs and has).
  CudaSession(const Model& m, int64_t n_ctx);
  ~CudaSession();
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  // As lp::Session::forward.
  // With `timers`, the device is synchronised around every op and its wall time recorded with the
  // op's FLOPs and bytes (model/ops.h), as the CPU backend records them; without, ops overlap.
  void forward(std::span<const int32_t> ids, std::span<const int32_t> pos, std::span<const int64_t> logit_rows,
               float* logits, const PruneRequest* prune = nullptr, ForwardStats* stats = nullptr,
               OpTimers* timers = nullptr);

  // As lp::Session::decode_step: every step starts from all tokens; at each pruning layer the new
  // token's attention (GPU) scores the step's active set and the policy (CPU) selects; a selected
  // token without K/V at a layer is revived from the Aux Cache and computed from there on.
  void decode_step(int32_t id, int32_t pos, float* logits, const PruneRequest& prune, ForwardStats* stats = nullptr,
                   OpTimers* timers = nullptr);

  // Empties the K/V cache and the Aux Cache (the weights stay).
  void reset();
  int64_t n_cached() const;
  int64_t device_bytes() const;  // weights + K/V + scratch allocated on the GPU
  // The positions whose has-KV bit layer l's device record has set, ascending (read back from the
  // GPU: the record the K/V append kernel writes, for checks against the CPU backend).
  std::vector<int32_t> kv_positions(int l) const;
  // The Aux Cache's index (positions and layers; the states are on the device, so D = 0 here).
  const AuxCache& aux() const { return aux_; }
  int64_t aux_bytes() const;  // states on the device + positions

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  AuxCache aux_;
};

// Prompt -> pruned prefill -> sampled continuation on the GPU, with the timings `run` reports
// (TTFT: the prefill and the first token sampled, measured on the host after the device finished).
// With a pruning policy every decoding step re-selects and revives (decode_step), as on the CPU;
// without one, decoding steps are plain forward passes. Teacher forcing (forced_ids) and recorded
// steps are not supported here and are refused.
GenerateResult generate(const Model& m, std::span<const int32_t> prompt_ids, const GenerateOptions& opt);

}  // namespace lp::cuda
