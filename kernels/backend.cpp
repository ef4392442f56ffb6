#include "kernels/backend.h"

#include <algorithm>
#include <cmath>

#include "kernels/argmax.h"
#include "model/error.h"

namespace lp {

void Backend::row_op(RowOp op, int layer) {
  switch (op) {
    case RowOp::AttnNorm:
      return rmsnorm(Norm::Attn, layer);
    case RowOp::FfnNorm:
      return rmsnorm(Norm::Ffn, layer);
    case RowOp::PostAttnNorm:
      return post_norm(Norm::PostAttn, layer);
    case RowOp::PostFfnNorm:
      return post_norm(Norm::PostFfn, layer);
    case RowOp::QkNorm:
      return qk_norm(layer);
    case RowOp::Rope:
      return rope(layer);
    case RowOp::Residual:
      return residual();
    case RowOp::Act:
      return swiglu();
  }
}

void Backend::kv_export(int, int64_t, std::span<std::byte>) {
  fail("this backend cannot hand its K/V to another process (KV-Runahead runs on the CPU backend)");
}
void Backend::kv_import(int, std::span<const int32_t>, std::span<const std::byte>) {
  fail("this backend cannot take K/V from another process (KV-Runahead runs on the CPU backend)");
}
void Backend::kv_read(int, std::span<const int32_t>, std::span<std::byte>) {
  fail("this backend cannot copy its K/V out (the prefix cache runs on the CPU backend)");
}

// kernels/argmax.h. Two passes that vectorise (the maximum, then its first index) where the one-pass
// scan does not: 10 us rather than 27 over SmolLM2's 49,152 logits.
int32_t argmax(std::span<const float> x) {
  const size_t n = x.size();
  if (n == 0 || std::isnan(x[0])) return 0;
  float mx = x[0];
#pragma omp simd reduction(max : mx)
  for (size_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  for (size_t i = 0; i < n; ++i)
    if (x[i] == mx) return int32_t(i);
  return 0;
}

void Backend::lm_head_greedy(std::span<Backend* const> members, std::span<float* const> logits, int32_t* ids,
                             int64_t n_vocab) {
  int64_t rows = 0;
  for (Backend* m : members) rows += m->rows();
  std::vector<float> all(static_cast<size_t>(rows * n_vocab));
  if (members.size() == 1)
    members[0]->lm_head(all.data());
  else
    lm_head_batched(members, all.data(), n_vocab);
  const float* row = all.data();
  for (size_t i = 0; i < members.size(); ++i) {
    const int64_t n = members[i]->rows() * n_vocab;
    if (logits[i]) std::copy_n(row, n, logits[i]);
    for (int64_t r = 0; r < members[i]->rows(); ++r, row += n_vocab) *ids++ = argmax({row, size_t(n_vocab)});
  }
}

namespace {
[[noreturn]] void no_deferral(const char* what) {
  internal_fail("{}: this backend does not defer selections", what);
}
}  // namespace
void Backend::deferred_log(int64_t, int64_t) {
  no_deferral("deferred_log");
}
void Backend::select_deferred(std::span<const int32_t>, int64_t, int64_t, int64_t, int64_t) {
  no_deferral("select_deferred");
}
void Backend::device_keys(int, int64_t) {
  no_deferral("device_keys");
}
std::span<const int32_t> Backend::deferred_kept(int64_t, int64_t) {
  no_deferral("deferred_kept");
}
std::span<const float> Backend::deferred_scores(int64_t, int64_t) {
  no_deferral("deferred_scores");
}
void Backend::kv_truncate(int, int64_t) {
  no_deferral("kv_truncate");
}
void Backend::aux_load(std::span<const int64_t>, std::span<const float>) {
  fail("this backend cannot load Aux Cache states (the prefix cache runs on the CPU backend)");
}

void Backend::ffn_chunked(int) {
  internal_fail("this backend does not chunk its FFN (ffn_chunk_rows() is 0)");
}

void Backend::aux_read(std::span<const int64_t> entries, std::span<float> out) {
  size_t at = 0;
  for (const int64_t e : entries) {
    const std::vector<float> x = aux_state(e);
    if (at + x.size() > out.size())
      fail("Aux Cache read: {} floats for {} states", out.size(), entries.size());
    std::copy(x.begin(), x.end(), out.begin() + std::ptrdiff_t(at));
    at += x.size();
  }
  if (at != out.size()) fail("Aux Cache read: {} floats for {} states", out.size(), entries.size());
}

}  // namespace lp
