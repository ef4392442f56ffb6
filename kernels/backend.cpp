#include "kernels/backend.h"

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

}  // namespace lp
