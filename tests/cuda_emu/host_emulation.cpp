// The CUDA backend on the host, for tests: "device" memory is host memory, the own kernels
// (kernels.cuh) run thread by thread through the same launchers as on the GPU (launch.cuh over
// host_threads.h), and what comes from NVIDIA libraries is replaced: cuBLAS GEMMs by the scalar
// reference, CUB's radix sorts by stable sorts of the same keys, cudaMemcpy2D by row copies. The
// stream runs each operation when it is queued, or, in a capture (set_graphs), when the captured
// segment is launched (host_stream.h). Not part of the product: the tests link it under
// cuda_backend.cpp and the GPU suite's own source, so the ops and the session's logic are checked on
// machines without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "kernels/cpu/ref.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/graph_cache.h"
#include "kernels/cuda/launch.cuh"
#include "model/error.h"
#include "tests/cuda_emu/host_memory.h"

namespace lp::cuda {
namespace cm = lp::cuda_math;

bool compiled() {
  return false;
}

namespace {

// Graphs as ops.cu keeps them (its comments say why), with the captured operations recorded here and
// run in order when the segment is launched.
void begin_capture(struct Graphs& g);
void end_capture(struct Graphs& g);
struct Graphs final : GraphState {
  GraphCache<char> kept{[](char&) {}};
  void begin_capture() override { lp::cuda::begin_capture(*this); }
  void end_capture() override { lp::cuda::end_capture(*this); }
  void* stream() override { return nullptr; }
  bool replaying = false;  // a launched segment's operations run: they queue nothing new (select_top's)
  std::vector<std::function<void()>> recorded;
};
Graphs& graphs() {
  static Graphs g;
  return g;
}

void begin_capture(Graphs& g) {
  if (!g.may_begin() || g.replaying) return;
  restart_arena(g);  // as ops.cu's, in host memory
  g.begun();
}

void end_capture(Graphs& g) {
  if (!g.capturing) return;
  g.capturing = false;
  std::vector<std::function<void()>> run;
  run.swap(g.recorded);
  if (g.ops == 0) return;
  const bool instantiated = !g.kept.find(g.key);  // the same key always updates
  if (instantiated) g.kept.put(g.key, 0);
  g.launched(instantiated);
  g.replaying = true;
  try {
    for (const auto& f : run) f();
  } catch (...) {
    g.replaying = false;
    throw;
  }
  g.replaying = false;
}

void end_segment() {
  Graphs& g = graphs();
  std::lock_guard lock(g.mu);
  end_capture(g);
}

}  // namespace

namespace emulation {
void enqueue(uint64_t op, std::function<void()> f) {
  Graphs& g = graphs();
  std::lock_guard lock(g.mu);  // the decision and the recording together: no other thread between
  queue_on(op);
  if (g.capturing)
    g.recorded.push_back(std::move(f));
  else
    f();
}
}  // namespace emulation

GraphState& graph_state() {
  return graphs();
}

void device_failed(const std::string& what) {  // nothing on the host is sticky
  {
    Graphs& g = graphs();
    std::lock_guard lock(g.mu);
    g.capturing = false;  // the capture is dropped, as ops.cu drops it
    g.recorded.clear();
  }
  throw DeviceError(what, false);
}

Device open_device() {
  Device d;
  d.count = 1;
  d.name = "host emulation";
  d.total_bytes = d.free_bytes = int64_t(1) << 40;
  return d;
}

namespace {

// The queued copies between pinned and device memory since the stream was last waited for. On a GPU
// such a copy runs at some moment before the next wait, so the pinned bytes must not change (to the
// device) or be read (to the host) until then. The emulation copies at once and checks, at every
// wait, that each queued upload's pinned bytes are still what they were: staging memory written
// again before the stream ran its copy (the hazard of reusing a ring too early) fails there.
struct Queued {
  const std::byte* src;
  size_t bytes;
  uint64_t hash;
};
std::mutex queued_mu;
std::vector<Queued> queued;
std::map<void*, size_t> pinned_bytes;  // size of each pinned allocation

uint64_t hash_of(const void* p, size_t n) {  // FNV-1a
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i)
    h = (h ^ uint64_t(static_cast<const unsigned char*>(p)[i])) * 1099511628211ull;
  return h;
}

enum : uint64_t { kToDevice = 1, kToHost, kOnDevice, kColumns, kGemmF32, kGemmBf16, kSort };

// A wait: the stream has run every queued copy.
void stream_waited() {
  std::vector<Queued> ran;
  {
    std::lock_guard lock(queued_mu);
    ran.swap(queued);  // run, whatever the check finds
  }
  for (const Queued& q : ran)
    if (hash_of(q.src, q.bytes) != q.hash)
      internal_fail(
          "host emulation: pinned memory of a queued copy to the device was written before the stream ran "
          "it");
}

}  // namespace

void* host_alloc_pinned(size_t bytes, const char* what) {
  end_segment();
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) fail("cannot allocate {} bytes of pinned host memory for {}", bytes, what);
  std::lock_guard lock(queued_mu);
  pinned_bytes[p] = bytes;
  return p;
}
void host_free_pinned(void* p) {
  if (!p) return;
  end_segment();
  {
    std::lock_guard lock(queued_mu);
    const auto* b = static_cast<const std::byte*>(p);
    for (const Queued& q : queued)
      if (q.src >= b && q.src < b + pinned_bytes[p])
        internal_fail("host emulation: pinned memory freed before the stream ran a copy from it");
    pinned_bytes.erase(p);
  }
  std::free(p);
}
void copy_to_device_async(void* dst, const void* pinned_src, size_t bytes) {
  ++queued_ops_counter();
  {
    std::lock_guard lock(queued_mu);
    queued.push_back({static_cast<const std::byte*>(pinned_src), bytes, hash_of(pinned_src, bytes)});
  }
  emulation::enqueue(kToDevice, [=] { std::memcpy(dst, pinned_src, bytes); });
}
void copy_to_host_async(void* pinned_dst, const void* src, size_t bytes) {
  ++queued_ops_counter();
  emulation::enqueue(kToHost, [=] { std::memcpy(pinned_dst, src, bytes); });
}

namespace {
// Device allocations and their sizes, for emulation::device_bytes.
std::mutex device_mu;
std::map<void*, size_t> device_sizes;
int64_t device_live = 0, device_peak = 0, device_count = 0;
void device_release(void* p) {
  if (!p) return;
  {
    std::lock_guard lock(device_mu);
    const auto it = device_sizes.find(p);
    if (it == device_sizes.end()) internal_fail("host emulation: freeing device memory it did not allocate");
    device_live -= int64_t(it->second);
    device_sizes.erase(it);
  }
  std::free(p);
}
}  // namespace

namespace emulation {
int64_t device_bytes() {
  std::lock_guard lock(device_mu);
  return device_live;
}
int64_t device_allocations() {
  std::lock_guard lock(device_mu);
  return device_count;
}
int64_t device_peak_bytes() {
  std::lock_guard lock(device_mu);
  return device_peak;
}
void reset_device_peak() {
  std::lock_guard lock(device_mu);
  device_peak = device_live;
}
}  // namespace emulation

namespace {
void* device_take(size_t bytes, const char* what) {
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) fail("cannot allocate {} bytes for {}", bytes, what);
  std::lock_guard lock(device_mu);
  device_sizes[p] = bytes;
  ++device_count;
  device_live += int64_t(bytes);
  device_peak = std::max(device_peak, device_live);
  return p;
}
}  // namespace

void* device_alloc(size_t bytes, const char* what) {
  end_segment();
  return device_take(bytes, what);
}
void device_free(void* p) {
  end_segment();
  if (p) stream_waited();  // cudaFree waits for the device
  device_release(p);
}
void* device_alloc_async(size_t bytes, const char* what) {
  return device_alloc(bytes, what);
}
void device_free_async(void* p) {
  if (p) end_segment();
  device_release(p);  // stream-ordered: no wait
}
void copy_to_device(void* dst, const void* src, size_t bytes) {
  end_segment();
  std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  end_segment();
  stream_waited();
  std::memcpy(dst, src, bytes);
}
void copy_on_device(void* dst, const void* src, size_t bytes) {
  ++queued_ops_counter();
  emulation::enqueue(kOnDevice, [=] { std::memcpy(dst, src, bytes); });
}
void synchronize(const char*) {
  end_segment();
  stream_waited();
}
// A small GPU, so that the attention launcher takes both paths (key splits and one pass) on the
// tests' shapes.
int multiprocessors() {
  return 4;
}

void copy_columns(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t width, int64_t rows) {
  ++queued_ops_counter();
  if (rows <= 0 || width <= 0) return;  // as ops.cu: nothing queued
  emulation::enqueue(kColumns, [=] {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, size_t(width) * 4);
  });
}

// ops.cu's select_top with CUB's radix sorts (stable) as stable sorts; on the stream as one operation
// (its own launches run with it).
void select_top(const float* scores, const int32_t* pos, int64_t n, int64_t n_keep, int64_t* keep) {
  if (n < 1 || n_keep < 1 || n_keep > n) fail("select_top: keep {} of {} tokens", n_keep, n);
  emulation::enqueue(mix_op(kSort, size_class(n)), [=] {  // the keys' count by its size class, as ops.cu
    const int64_t m = n - 1;
    std::vector<uint64_t> keys(static_cast<size_t>(std::max<int64_t>(m, 1)));
    std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(m, 1))), sorted(static_cast<size_t>(n));
    if (m > 0) {
      LP_LAUNCH(kernels::selection_keys_kernel, blocks_for(m, kThreads), kThreads, 0, scores, pos, m,
                keys.data(), idx.data());
      std::stable_sort(idx.begin(), idx.begin() + m,
                       [&](int64_t a, int64_t b) { return keys[size_t(a)] > keys[size_t(b)]; });
      std::copy(idx.begin(), idx.begin() + m, sorted.begin());
    }
    LP_LAUNCH(kernels::put_last_kernel, 1, 1, 0, sorted.data(), n_keep - 1, n - 1);
    std::copy(sorted.begin(), sorted.begin() + n_keep, keep);
    std::sort(keep, keep + n_keep);
  });
}

void gemm_f32(const float* a, const float* w, float* out, int64_t T, int64_t K, int64_t N) {
  ++queued_ops_counter();
  if (T <= 0 || N <= 0) return;
  emulation::enqueue(mix_op(mix_op(mix_op(kGemmF32, uint64_t(T)), uint64_t(K)), uint64_t(N)),
                     [=] { ref::matmul(a, w, out, T, K, N); });
}

void gemm_bf16(const uint16_t* a, const uint16_t* w, float* out, int64_t T, int64_t K, int64_t N) {
  ++queued_ops_counter();
  if (T <= 0 || N <= 0) return;
  emulation::enqueue(mix_op(mix_op(mix_op(kGemmBf16, uint64_t(T)), uint64_t(K)), uint64_t(N)), [=] {
    std::vector<float> af(size_t(T * K)), wf(size_t(N * K));
    for (size_t i = 0; i < af.size(); ++i) af[i] = cm::bf16_to_f32(a[i]);
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = cm::bf16_to_f32(w[i]);
    ref::matmul(af.data(), wf.data(), out, T, K, N);
  });
}

}  // namespace lp::cuda
