// The CUDA backend's device memory as arithmetic: what a backend of n_ctx tokens allocates (the
// check it makes as it opens, cuda_backend.cpp) and what it keeps per token and per request once a
// prefill's activations are released (Backend::held_bytes, which `serve`'s reservations count on a
// GPU). Plain C++ in lp_kernels, so that the CPU-only build and its tests have it too.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/weights.h"
#include "model/config.h"

namespace lp::cuda {

// Bytes, each term as the memory check names it (the weights are the caller's: shared by backends).
struct BackendMemory {
  double kv = 0;           // K and V at every layer, each slot's position and each position's slot
  double aux = 0;          // the Aux Cache's states, n_ctx x n_embd f32
  double activations = 0;  // the largest step's: a prefill of all n_ctx tokens
  double dequantized = 0;  // --dtype int8: the largest layer matrix in bf16, for a prefill's GEMMs
  double library = 0;      // cuBLAS's workspace and the kernels' modules: a margin, not a count
  double total() const { return kv + aux + activations + dequantized + library; }
};

// What a batch's leader (its first member's backend) keeps between steps of the batch's gathered
// rows and logits (release_activations gives back the rest).
constexpr int64_t kBatchRoomBytes = int64_t(64) << 20;

// ffn_chunk_rows: the backend's (Backend::ffn_chunk_rows: 0 where the FFN runs whole).
BackendMemory backend_memory(const ModelConfig& c, DType dtype, int64_t n_ctx, int64_t ffn_chunk_rows);

// What a backend keeps beside K and V: per token of capacity (positions and slot maps, the Aux
// Cache, a decoding step's key-sized buffers), and per request (the activations and logits of
// kHeldRows rows).
Backend::Held held_bytes(const ModelConfig& c, DType dtype, int64_t ffn_chunk_rows);

// What a batch's leader allocates beside its own rows while the batch holds an n-token prefill: its
// copies of the prefill's rows for the batched projections (inputs, outputs and their bf16 copy),
// its tables of the rows' addresses, with --dtype int8 its own dequantized matrix, and what it keeps
// between steps (kBatchRoomBytes).
double batch_leader_bytes(const ModelConfig& c, DType dtype, int64_t n);

}  // namespace lp::cuda
