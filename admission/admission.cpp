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
  const double aux = pruning ? double(prompt_tokens) * double(c.n_embd) * 4 : 0;
  return k_and_v + aux;
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
