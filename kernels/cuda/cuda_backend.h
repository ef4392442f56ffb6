// The CUDA backend: the layer ops of kernels/backend.h over the launchers of cuda_ops.h. The
// model's weights are uploaded once in its dtype (f32 GEMMs exact, bf16 GEMMs with f32
// accumulation; a tied LM head is the embedding table, not a second copy); K/V per layer lives on
// the device with each slot's position and each position's slot, and so do the Aux Cache's states,
// so no hidden state crosses PCIe. LazyLLM's selection runs on the device (select_top, CUB); only
// the kept indices come back, or, in a deferred decoding step, the kept positions stay on the device
// as the step's active set and come back behind it (Backend::select_deferred). Plain C++ over the launchers,
// so it builds without CUDA headers; in a build without CUDA, make_backend fails with the reason.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/backend.h"
#include "kernels/weights.h"
#include "model/config.h"

namespace lp::cuda {

struct BackendOptions {
  // Attention on the tensor cores in f16 (cuda::attention_tc) instead of the f32 kernel, in sessions
  // whose K/V cache is f16 (bf16 and int8 models: kv_type_for); an f32 model's session, the exact
  // path, keeps the f32 kernel. On by default since the f16 cache and f16 operands keep a session
  // within the CPU comparisons' bounds (docs/cuda.md, "Tensor-core attention"); lp_gpu_bench times both.
  bool tensor_core_attention = true;
  // A LazyLLM decoding step that does not wait for its pruning layers' selections (Backend::
  // select_deferred; engine/session.h), undone and computed again where it should have revived a
  // token. Off by default: on a real model's traces revivals recur every few steps for hundreds of
  // steps, so deferring recomputes about as many steps as its saved waits are worth (docs/cuda.md,
  // "Deferred selections"); lp_gpu_bench times both on a GPU.
  bool deferred_selection = false;
  // A prefill of more rows runs its dense FFN in chunks of this many (Backend::ffn_chunked), so that
  // the gate|up and activation buffers hold 3 F floats for a chunk's rows, not the prompt's: at the
  // Llama-3.1-8B shape 168 KiB a token, 21 GiB of a 131,072-token prefill's 40 GiB of activations.
  // 8,192 rows keep the tensor cores' GEMMs at their full rate. 0: the whole prompt at once.
  int64_t ffn_chunk_rows = 8192;
  // A decoding step's operations captured as CUDA graphs (cuda::set_graphs): the whole step, one
  // graph launch, where it does not wait in the middle (an unpruned step, a deferred LazyLLM one), a
  // graph per stretch between its waits otherwise (a LazyLLM step's selections, a MoE layer's routes).
  // Each sequence's executable is updated in place step after step. Off by default until a GPU
  // has timed it (lp_gpu_bench's graph rows; docs/cuda.md, "CUDA graphs").
  bool cuda_graphs = false;
};

// Opens the first GPU, checks that the weights, K/V and Aux Cache for n_ctx tokens and the
// activations of an n_ctx-token prefill fit in its free memory (lp::Error naming what it needs
// and has, otherwise), and uploads the weights. Borrows c and w.
// How many times this process's CUDA backends have made the host wait for the device: a copy to
// the host, a synchronisation. Uploads are queued from pinned memory and device memory is
// stream-ordered, so neither waits.
// A decoding step's count is the figure issue 58 budgets (docs/cuda.md, "Where a decoding step waits
// on the host"); a test checks it.
int64_t host_waits();
// How many times this process's CUDA backends have uploaded a model's weights: once while any
// backend holds them (the backends of one Weights share the device copy).
int64_t weight_uploads();
// For checks: the bytes a CUDA backend holds in row-sized activation buffers (Backend::
// release_activations gives a prefill's back).
int64_t activation_bytes(Backend& b);

std::unique_ptr<Backend> make_backend(const ModelConfig& c, const Weights& w, int64_t n_ctx,
                                      const BackendOptions& o = {});

}  // namespace lp::cuda
