#include "admission/admission.h"

#include <algorithm>

#include "model/error.h"

namespace lp {

double reservation_bytes(const ModelConfig& c, const KvLayout& kv, int64_t prompt_tokens, int64_t max_tokens,
                         bool pruning) {
  const int64_t block = std::max<int64_t>(kv.block, 1);
  const double cap = double((prompt_tokens + max_tokens + block - 1) / block * block);
  double slots = double(c.n_layer) * cap;  // (token, layer) slots
  if (kv.windows_bounded && c.local_attention()) {
    slots = 0;
    for (int l = 0; l < c.n_layer; ++l)
      slots += double((c.kv_kept(l, int64_t(cap)) + block - 1) / block * block);
  }
  const double k_and_v = slots * double(c.kv_token_elems()) * kv.element_bytes;
  const double aux = pruning && !kv.aux_in_token_bytes ? double(prompt_tokens) * double(c.n_embd) * 4 : 0;
  return k_and_v + aux + cap * kv.token_bytes + kv.request_bytes;
}

DeviceMemoryPlan plan_device_memory(const ModelConfig& c, const KvLayout& kv, const DeviceMemory& device,
                                    double utilization, double weight_bytes, int64_t max_request_tokens,
                                    const std::function<double(int64_t)>& transient_bytes) {
  constexpr double GiB = 1073741824.0;
  if (!(utilization > 0 && utilization < 1))  // the CUDA context itself takes some: 1 is never free
    fail("--gpu-memory-utilization must be above 0 and below 1, got {}", utilization);
  if (!(device.total_bytes > 0) || !(device.free_bytes >= 0) || device.free_bytes > device.total_bytes)
    internal_fail("a device of {} bytes with {} free", device.total_bytes, device.free_bytes);
  if (max_request_tokens < 0 || max_request_tokens > c.n_ctx_train)
    fail("--max-model-len {} is outside the model's context of {} tokens", max_request_tokens, c.n_ctx_train);
  DeviceMemoryPlan p;
  p.limit = utilization * device.total_bytes;
  p.weights = weight_bytes;
  if (p.limit > device.free_bytes)
    fail(
        "--gpu-memory-utilization {} asks for {:.2f} GiB of the GPU's {:.2f} GiB, but {:.2f} GiB are free "
        "(other processes hold the rest): lower it or free the GPU",
        utilization, p.limit / GiB, device.total_bytes / GiB, device.free_bytes / GiB);
  // A request of n tokens, all of them prompt and pruned (its largest reservation), and its prefill.
  const auto need = [&](int64_t n) { return reservation_bytes(c, kv, n, 0, true) + transient_bytes(n); };
  const double room = p.limit - p.weights;
  if (max_request_tokens > 0) {
    if (need(max_request_tokens) > room)
      fail(
          "a request of {} tokens (--max-model-len) needs {:.2f} GiB beside the weights' {:.2f} GiB, more "
          "than the {:.2f} GiB left of {:.0f}% of the GPU's {:.2f} GiB: lower --max-model-len or raise "
          "--gpu-memory-utilization",
          max_request_tokens, need(max_request_tokens) / GiB, p.weights / GiB, std::max(room, 0.0) / GiB,
          utilization * 100, device.total_bytes / GiB);
    p.max_request_tokens = max_request_tokens;
  } else {
    if (need(1) > room)
      fail(
          "the weights' {:.2f} GiB and one token's K/V and activations ({:.2f} GiB) do not fit in {:.0f}% of "
          "the GPU's {:.2f} GiB ({:.2f} GiB): raise --gpu-memory-utilization, or use --dtype int8 or the CPU",
          p.weights / GiB, need(1) / GiB, utilization * 100, device.total_bytes / GiB, p.limit / GiB);
    int64_t lo = 1, hi = c.n_ctx_train;  // need(lo) fits; the answer is in [lo, hi]
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (need(mid) <= room)
        lo = mid;
      else
        hi = mid - 1;
    }
    p.max_request_tokens = lo;
  }
  p.prefill = transient_bytes(p.max_request_tokens);
  p.kv_budget_bytes = room - p.prefill;
  return p;
}

Admission::Admission(const AdmissionLimits& limits, double reserved_bytes, int64_t rows, int64_t running)
    : limits_(limits), reserved_(reserved_bytes), rows_(rows), running_(running) {
  if (!(limits_.kv_budget_bytes > 0))
    fail("the K/V budget must be positive, got {} bytes", limits_.kv_budget_bytes);
  if (limits_.max_batch_tokens < 1)
    fail("the iteration's token budget must be at least 1, got {}", limits_.max_batch_tokens);
}

bool Admission::fits(double reservation, int64_t prompt_tokens) const {
  if (reserved_ + reservation > limits_.kv_budget_bytes) return false;
  if (limits_.max_seqs > 0 && running_ + admitted_ >= limits_.max_seqs) return false;
  if (limits_.chunk_tokens > 0) return rows_ < limits_.max_batch_tokens;
  return admitted_ == 0 || rows_ + prompt_tokens <= limits_.max_batch_tokens;
}

int64_t Admission::first_rows(int64_t prompt_tokens) const {
  if (limits_.chunk_tokens <= 0) return prompt_tokens;
  return std::min({limits_.chunk_tokens, prompt_tokens, limits_.max_batch_tokens - rows_});
}

void Admission::take(double reservation, int64_t prompt_tokens) {
  rows_ += first_rows(prompt_tokens);
  reserved_ += reservation;
  ++admitted_;
}

}  // namespace lp
