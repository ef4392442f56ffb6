// The serving policy, written once: what a request reserves, and which queued requests an
// iteration admits. `serve`'s scheduler (engine/scheduler.h) runs it on real passes and the serving
// simulation (sim/serving.h) on costed time; tests/admission holds both to it on the same arrivals.
//
// A request reserves its worst case: K/V for prompt + max_tokens tokens at every layer, in its
// backend's layout (element size, capacity rounded up to the backend's block), plus, with
// pruning, the Aux Cache's worst case (every prompt token's state once, f32). A pruned prefill
// holds less, but a decoding step may revive any pruned token at any layer (docs/serving.md).
//
// Admission is first come first served: the queue's head while its reservation fits the budget
// and its prompt the iteration's token budget, nothing overtaking a head that waits. Whole
// prefills: the iteration's first admitted prefill always fits (a prompt longer than the token
// budget runs alone with the decoding rows: LazyLLM scores with the last token's attention over
// the whole prompt), later ones only within the budget. Chunked prefills (chunk_tokens > 0):
// admitted while the iteration has rows left, each taking its first chunk of them.
#pragma once

#include <cstdint>
#include <functional>

#include "model/config.h"

namespace lp {

// How a backend stores K/V, as reservations count it: bytes of one K or V element (2 for the CPU
// backend's f16 cache, 4 for f32, 1 for fp8 in the simulator) and the block its capacity rounds
// up to (the CPU backend's 64 key slots; 1 where the capacity is exact).
struct KvLayout {
  double element_bytes = 2;
  int64_t block = 64;
  // A sliding-window or chunked layer keeps only its window's or chunk's keys
  // (ModelConfig::kv_kept), as vLLM's hybrid K/V allocator does; this engine keeps them all.
  bool windows_bounded = false;
  // What a request's backend holds beside K and V, where the budget is a device's memory (the CUDA
  // backend's Backend::held_bytes; 0 on the CPU, whose budget counts K/V and the Aux Cache alone):
  // bytes per token of capacity and per request. With aux_in_token_bytes the backend holds an Aux
  // Cache state for every token of capacity, pruned or not, counted in token_bytes and not again
  // for pruning.
  double token_bytes = 0, request_bytes = 0;
  bool aux_in_token_bytes = false;
};

// A request's reservation, bytes: K/V for prompt_tokens + max_tokens tokens at every layer in
// `kv`'s layout (ModelConfig::kv_token_elems a token and layer), and with pruning the Aux Cache's
// worst case; plus the layout's token_bytes for each token of capacity and its request_bytes.
double reservation_bytes(const ModelConfig& c, const KvLayout& kv, int64_t prompt_tokens, int64_t max_tokens,
                         bool pruning);

// How `serve --backend cuda` divides a GPU (docs/serving.md, "Memory on a GPU"). As vLLM's
// --gpu-memory-utilization, the server may use `utilization` of the device's total memory, which
// must be free when it starts. Of that, the weights, and room for the largest request's prefill
// (`transient_bytes(n)`: what a backend allocates beyond its reservation while it computes an
// n-token prompt, released after it), come first; the rest is the budget reservations count in.
// `max_request_tokens` (vLLM's --max-model-len): the most prompt + max_tokens a request may hold,
// whose prefill the room is kept for; 0 takes the most that fits, up to the model's context.
// Throws lp::Error naming the sizes when the weights and one such request do not fit.
struct DeviceMemoryPlan {
  double limit = 0;    // utilization x total
  double weights = 0;  // on the device, once for every request
  double prefill = 0;  // transient_bytes(max_request_tokens)
  int64_t max_request_tokens = 0;
  double kv_budget_bytes = 0;  // limit - weights - prefill
};
struct DeviceMemory {
  double total_bytes = 0, free_bytes = 0;
};
DeviceMemoryPlan plan_device_memory(const ModelConfig& c, const KvLayout& kv, const DeviceMemory& device,
                                    double utilization, double weight_bytes, int64_t max_request_tokens,
                                    const std::function<double(int64_t)>& transient_bytes);

struct AdmissionLimits {
  double kv_budget_bytes = 0;
  int64_t max_batch_tokens = 2048;  // rows per iteration: decoding rows + prefill tokens
  int64_t chunk_tokens = 0;         // > 0: chunked prefill, chunks of at most this many tokens
  // > 0: at most this many requests running at once (vLLM's max_num_seqs, TensorRT-LLM's
  // max_batch_size); 0: as many as the K/V budget holds (this engine's scheduler).
  int64_t max_seqs = 0;
};

// One iteration's admission. Construct it with what the running requests reserve and the rows the
// iteration already holds (a decoding row per decoding request, the next chunk of each chunked
// prefill under way) and, where max_seqs bounds them, how many run; then, for the queue's head in
// turn, fits() says whether it is admitted now and take() counts it. After a head that does not
// fit, nothing more is admitted this iteration.
class Admission {
 public:
  Admission(const AdmissionLimits& limits, double reserved_bytes, int64_t rows, int64_t running = 0);
  bool fits(double reservation, int64_t prompt_tokens) const;
  // Counts an admitted request: its reservation and the rows its prefill (or first chunk) takes.
  void take(double reservation, int64_t prompt_tokens);
  // Bytes given back to the budget this iteration (the prefix cache's blocks evicted for a head
  // that did not fit).
  void release(double bytes) { reserved_ -= bytes; }
  // This iteration's first rows of a prefill admitted with take(): the whole prompt, or its first chunk.
  int64_t first_rows(int64_t prompt_tokens) const;
  double reserved_bytes() const { return reserved_; }
  int64_t rows() const { return rows_; }
  int64_t admitted() const { return admitted_; }

 private:
  AdmissionLimits limits_;
  double reserved_;
  int64_t rows_;
  int64_t running_;
  int64_t admitted_ = 0;
};

}  // namespace lp
