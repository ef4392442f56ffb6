// The CUDA backend's functions in a build without CUDA (configure found no nvcc, or -DLP_CUDA=OFF):
// open_device() says so; nothing else can be reached without a device.
#include "kernels/cuda/cuda_ops.h"
#include "model/error.h"

namespace lp::cuda {

namespace {
[[noreturn]] void unavailable() {
  fail("this build of lazyprefill has no CUDA backend (configure found no nvcc; see scripts/setup)");
}
}  // namespace

bool compiled() {
  return false;
}
void device_failed(const std::string& what) {
  throw DeviceError(what, false);
}
Device open_device() {
  unavailable();
}
void* device_alloc(size_t, const char*) {
  unavailable();
}
void device_free(void*) {}
void copy_to_device(void*, const void*, size_t) {
  unavailable();
}
void copy_to_host(void*, const void*, size_t) {
  unavailable();
}
void copy_on_device(void*, const void*, size_t) {
  unavailable();
}
void* host_alloc_pinned(size_t, const char*) {
  unavailable();
}
void host_free_pinned(void*) {}
void copy_to_device_async(void*, const void*, size_t) {
  unavailable();
}
void copy_to_host_async(void*, const void*, size_t) {
  unavailable();
}
void synchronize(const char*) {
  unavailable();
}
void* device_alloc_async(size_t, const char*) {
  unavailable();
}
void device_free_async(void*) {}
void set_graphs(bool) {}
GraphCounts graph_counts() {
  return {};
}
void* queue_on(uint64_t) {
  unavailable();
}
void* scratch_alloc(size_t, const char*) {
  unavailable();
}
void scratch_free(void*) {}
int multiprocessors() {
  unavailable();
}
void rmsnorm(const float*, const float*, float*, int64_t, int64_t, float) {
  unavailable();
}
void rope(float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, float, const float*, float) {
  unavailable();
}
void route_top_k(const float*, int64_t, int64_t, int64_t, int32_t*, float*) {
  unavailable();
}
void moe_combine(const float*, const int64_t*, const float*, int64_t, int64_t, int64_t, float*) {
  unavailable();
}
void add_bias(float*, const float*, int64_t, int64_t) {
  unavailable();
}
void add_inplace(float*, const float*, int64_t) {
  unavailable();
}
void rmsnorm_rows(Rows<const float>, const float*, Rows<float>, int64_t, int64_t, float) {
  unavailable();
}
void rope_rows(Rows<float>, Rows<const int32_t>, int64_t, int64_t, int64_t, int64_t, float, const float*,
               float) {
  unavailable();
}
void swiglu_rows(Rows<const float>, Rows<float>, int64_t, int64_t, bool) {
  unavailable();
}
void add_rows(Rows<float>, Rows<const float>, int64_t, int64_t) {
  unavailable();
}
void copy_rows_at(Rows<const float>, Rows<float>, int64_t, int64_t) {
  unavailable();
}
void gather_rows(const float*, const int64_t*, float*, int64_t, int64_t) {
  unavailable();
}
void attention(const float*, const int32_t*, int64_t, const void*, const void*, const int32_t*, int64_t,
               int64_t, int64_t, int64_t, float, int32_t, float*, const int32_t*, KvType) {
  unavailable();
}
void last_row_scores(const float*, const void*, int64_t, int64_t, int64_t, int64_t, float, const int32_t*,
                     int32_t, int32_t, float*, const int32_t*, KvType) {
  unavailable();
}
void select_top(const float*, const int32_t*, int64_t, int64_t, int64_t*) {
  unavailable();
}
void kv_append(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t, float*, float*,
               int32_t*, const int32_t*, int32_t*) {
  unavailable();
}
void kv_append(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t, uint16_t*, uint16_t*,
               int32_t*, const int32_t*, int32_t*) {
  unavailable();
}
void kv_append_rows(Rows<const float>, Rows<const float>, Rows<const int32_t>, int64_t, int64_t, Rows<float>,
                    Rows<float>, Rows<int32_t>, Rows<const int32_t>, Rows<int32_t>) {
  unavailable();
}
void kv_append_rows(Rows<const float>, Rows<const float>, Rows<const int32_t>, int64_t, int64_t,
                    Rows<uint16_t>, Rows<uint16_t>, Rows<int32_t>, Rows<const int32_t>, Rows<int32_t>) {
  unavailable();
}
void gemv_routed_q(const uint16_t*, int64_t, const uint8_t* const*, const int32_t*, int64_t, int, int64_t,
                   float*, int64_t, int64_t, int64_t) {
  unavailable();
}
void gemv_routed_bf16(const uint16_t*, int64_t, const uint16_t* const*, const int32_t*, int64_t, float*,
                      int64_t, int64_t, int64_t) {
  unavailable();
}
void gemv_routed_f32(const float*, int64_t, const float* const*, const int32_t*, int64_t, float*, int64_t,
                     int64_t, int64_t) {
  unavailable();
}
void argmax_rows(const float*, int64_t, int64_t, int32_t*) {
  unavailable();
}
void fill_i32(int32_t*, int64_t, int32_t) {
  unavailable();
}
void gather_positions(const int32_t*, const int64_t*, int64_t, int32_t*) {
  unavailable();
}
void slots_of(const int32_t*, int64_t, const int32_t*, int32_t*) {
  unavailable();
}
void copy_columns(const float*, int64_t, float*, int64_t, int64_t, int64_t) {
  unavailable();
}
void swiglu_fused(const float*, float*, int64_t, int64_t, bool) {
  unavailable();
}
void scale_inplace(float*, int64_t, float) {
  unavailable();
}
void mma_f16_tile(const float*, const float*, float*, int64_t) {
  unavailable();
}
void attention_batched(const AttentionInput*, size_t, int64_t, int64_t, int64_t, float, int32_t, bool,
                       const UploadTable&) {
  unavailable();
}
void attention_tc(const float*, const int32_t*, int64_t, const void*, const void*, const int32_t*, int64_t,
                  int64_t, int64_t, int64_t, float, int32_t, float*, const int32_t*, KvType) {
  unavailable();
}
void copy_rows(const float*, const int64_t*, float*, const int64_t*, int64_t, int64_t) {
  unavailable();
}
void gather_rows_bf16(const uint16_t*, const int64_t*, float*, int64_t, int64_t) {
  unavailable();
}
void to_bf16(const float*, uint16_t*, int64_t) {
  unavailable();
}
void dequant_bf16(const uint8_t*, int, int64_t, int64_t, int64_t, uint16_t*) {
  unavailable();
}
void gather_rows_q(const uint8_t*, int, int64_t, const int64_t*, float*, int64_t, int64_t) {
  unavailable();
}
void gemv_q(const uint16_t*, const uint8_t*, int, int64_t, float*, int64_t, int64_t, int64_t) {
  unavailable();
}
void gemm_f32(const float*, const float*, float*, int64_t, int64_t, int64_t) {
  unavailable();
}
void gemm_bf16(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t) {
  unavailable();
}

}  // namespace lp::cuda
