// The CUDA backend's device side (cuda_ops.h): memory, the device, cuBLAS GEMMs, the CUB sorts of
// the selection, and, through launch.cuh, the launchers of the own kernels (kernels.cuh). The
// arithmetic per element and per row is device_math.h (tested on the CPU); the kernels also run on
// the host, thread by thread, in the tests (tests/cuda_emu/).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <mutex>
#include <thread>

#include "kernels/cuda/capability.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/graph_cache.h"
#include "kernels/cuda/launch.cuh"
#include "model/error.h"

namespace lp::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    device_failed(fmt::format("CUDA error in {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}
void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    device_failed(fmt::format("cuBLAS error in {}: {}", what, cublasGetStatusString(s)));
}

// The one stream every operation is queued on. A blocking stream: the legacy default stream's
// calls (a cudaMemcpy from pageable memory, a library's) wait for its work and it for theirs, as
// when everything ran on the legacy stream; unlike that one, it can be captured into a graph.
cudaStream_t the_stream() {
  static const cudaStream_t s = [] {
    cudaStream_t r = nullptr;
    check(cudaStreamCreate(&r), "cudaStreamCreate");
    return r;
  }();
  return s;
}

std::unique_lock<std::recursive_mutex> end_segment();

// cuBLAS on the stream, with a workspace of its own (a capture must not see cuBLAS allocate one;
// 32 MiB is what cuBLAS asks for on Hopper, inside the 256 MiB the memory check keeps for it).
cublasHandle_t blas() {
  static std::once_flag once;
  static cublasHandle_t h = nullptr;
  static cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  static void* workspace = nullptr;
  std::call_once(once, [] {
    const auto lock = end_segment();  // the handle and its workspace are made outside a capture
    status = cublasCreate(&h);
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasSetStream(h, the_stream());
    constexpr size_t kWorkspace = size_t(32) << 20;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cudaMalloc(&workspace, kWorkspace) == cudaSuccess
                   ? cublasSetWorkspace(h, workspace, kWorkspace)
                   : CUBLAS_STATUS_ALLOC_FAILED;
  });
  check_blas(status, "cublasCreate");
  return h;
}

// CUDA graphs (cuda_ops.h, set_graphs; graph_cache.h's state), and the scratch arena of captures.
void begin_capture(struct Graphs& g);
void end_capture(struct Graphs& g);
struct Graphs final : GraphState {
  GraphCache<cudaGraphExec_t> kept{[](cudaGraphExec_t& e) { cudaGraphExecDestroy(e); }};
  void begin_capture() override { lp::cuda::begin_capture(*this); }
  void end_capture() override { lp::cuda::end_capture(*this); }
  void* stream() override { return the_stream(); }
};
Graphs& graphs() {
  static Graphs* g = new Graphs;  // never destroyed: its executables may outlive static destruction's order
  return *g;
}

// Begins a capture where graphs are on for this thread and none is open (g.mu held).
void begin_capture(Graphs& g) {
  if (!g.may_begin()) return;
  restart_arena(g);
  // Relaxed: the calls that a capture cannot hold end it first (end_capture), and the others (a
  // device attribute, a pool's statistics) need not be refused.
  check(cudaStreamBeginCapture(the_stream(), cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  g.begun();
}

// Ends the open capture and launches its graph: the executable kept for its sequence, updated with
// this segment's parameters, or a new one where there is none or the update is refused (g.mu held).
void end_capture(Graphs& g) {
  if (!g.capturing) return;
  g.capturing = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(the_stream(), &graph), "cudaStreamEndCapture");
  if (g.ops == 0) {
    cudaGraphDestroy(graph);
    return;
  }
  cudaGraphExec_t* exec = g.kept.find(g.key);
  if (exec) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(*exec, graph, &info) != cudaSuccess) {
      cudaGetLastError();  // not sticky: a new executable replaces it
      exec = nullptr;
    }
  }
  const bool instantiated = !exec;
  if (!exec) {
    cudaGraphExec_t e = nullptr;
    const cudaError_t r = cudaGraphInstantiate(&e, graph, 0);
    if (r != cudaSuccess) cudaGraphDestroy(graph);
    check(r, "cudaGraphInstantiate");
    exec = &g.kept.put(g.key, e);
  }
  cudaGraphDestroy(graph);
  g.launched(instantiated);
  check(cudaGraphLaunch(*exec, the_stream()), "cudaGraphLaunch");
}

// What a capture cannot hold (a wait, an allocation, a free, a copy from pageable memory) ends it
// first: the work captured so far goes to the device ahead of it. The caller holds the returned lock
// through its call, so that no capture begins meanwhile (a legacy-stream call would break it).
std::unique_lock<std::recursive_mutex> end_segment() {
  Graphs& g = graphs();
  std::unique_lock lock(g.mu);
  end_capture(g);
  return lock;
}

}  // namespace

GraphState& graph_state() {
  return graphs();
}

bool compiled() {
  return true;
}

void device_failed(const std::string& what) {
  {  // a capture open when a call failed is dropped (its graph would not be complete)
    Graphs& g = graphs();
    std::lock_guard lock(g.mu);
    if (g.capturing) {
      cudaGraph_t graph = nullptr;
      if (cudaStreamEndCapture(the_stream(), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
      g.capturing = false;
    }
  }
  // A non-sticky error is cleared by reading it; a sticky one fails every later call on the context.
  cudaGetLastError();
  const bool lost = cudaDeviceSynchronize() != cudaSuccess;
  cudaGetLastError();
  throw DeviceError(lost ? what + "; the GPU cannot be used again by this process" : what, lost);
}

namespace {
// What open_device reads once a process: the device count, the first device's properties (checked
// against the kernels' architectures), its pool's release threshold. cudaGetDeviceProperties fills
// hundreds of fields, and every request's backend opens the device. A failure throws and is
// tried again by the next call.
struct Opened {
  int count = 0;
  std::string name;
  int major = 0, minor = 0;
  cudaMemPool_t pool = nullptr;
};
const Opened& opened() {
  static const Opened o = [] {
    Opened r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess)
      fail("no usable CUDA device: {} ({}); is an NVIDIA driver installed and a GPU visible?",
           cudaGetErrorString(e), cudaGetErrorName(e));
    if (r.count == 0) fail("no CUDA device found (cudaGetDeviceCount returned 0)");
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    if (const std::string why = unsupported_capability(prop.name, prop.major, prop.minor, LP_CUDA_ARCHS);
        !why.empty())
      fail("{}", why);
    r.name = prop.name, r.major = prop.major, r.minor = prop.minor;
    // The backends' device memory comes from cudaMallocAsync (DBuf, Scratch), and stays in the pool
    // when given back, across synchronisations (the default threshold, 0, hands it back to the
    // driver at every one).
    check(cudaDeviceGetDefaultMemPool(&r.pool, 0), "cudaDeviceGetDefaultMemPool");
    uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(r.pool, cudaMemPoolAttrReleaseThreshold, &keep), "memory pool threshold");
    return r;
  }();
  return o;
}
}  // namespace

Device open_device() {
  const Opened& o = opened();
  check(cudaSetDevice(0), "cudaSetDevice");  // per host thread
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  // What the pool keeps idle is free to the backends beside what the driver has.
  uint64_t reserved = 0, used = 0;
  check(cudaMemPoolGetAttribute(o.pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
        "memory pool reserved");
  check(cudaMemPoolGetAttribute(o.pool, cudaMemPoolAttrUsedMemCurrent, &used), "memory pool used");
  free_b += size_t(reserved > used ? reserved - used : 0);
  Device d;
  d.index = 0;
  d.count = o.count;
  d.name = o.name;
  d.cc_major = o.major;
  d.cc_minor = o.minor;
  d.total_bytes = int64_t(total_b);
  d.free_bytes = int64_t(free_b);
  return d;
}

void* device_alloc(size_t bytes, const char* what) {
  const auto lock = end_segment();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    device_failed(fmt::format("cannot allocate {:.2f} GiB on the GPU for {} ({:.2f} GiB free of {:.2f}): {}",
                              double(bytes) / 1073741824.0, what, double(free_b) / 1073741824.0,
                              double(total_b) / 1073741824.0, cudaGetErrorString(e)));
  }
  return p;
}

void device_free(void* p) {
  const auto lock = end_segment();
  if (p) cudaFree(p);
}

namespace {
// Tags of the copies and GEMMs in a segment's sequence (op_id: kernels by their function).
// A sort's key count is in its tag only by its size class: CUB launches the same kernels for a count
// that grows by one a step, and others past some sizes (one tile, then several passes).
enum : uint64_t { kToDevice = 1, kToHost, kOnDevice, kColumns, kGemmF32, kGemmBf16, kSort };
uint64_t op_with(uint64_t tag, int64_t a, int64_t b = 0, int64_t c = 0) {
  return mix_op(mix_op(mix_op(tag, uint64_t(a)), uint64_t(b)), uint64_t(c));
}
cudaStream_t stream_for(uint64_t op) {
  return static_cast<cudaStream_t>(queue_on(op));
}
}  // namespace

// Pageable memory: cudaMemcpy on the legacy stream, which waits for the stream's work.
void copy_to_device(void* dst, const void* src, size_t bytes) {
  const auto lock = end_segment();
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to device");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  const auto lock = end_segment();
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  ++queued_ops_counter();
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_for(kOnDevice)), "copy on device");
}

void* host_alloc_pinned(size_t bytes, const char* what) {
  const auto lock = end_segment();
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
  if (e != cudaSuccess)
    device_failed(fmt::format("cannot allocate {} bytes of pinned host memory for {}: {}", bytes, what,
                              cudaGetErrorString(e)));
  return p;
}

void host_free_pinned(void* p) {
  const auto lock = end_segment();
  if (p) cudaFreeHost(p);
}

void copy_to_device_async(void* dst, const void* pinned_src, size_t bytes) {
  ++queued_ops_counter();
  check(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, stream_for(kToDevice)),
        "queued copy to device");
}

void copy_to_host_async(void* pinned_dst, const void* src, size_t bytes) {
  ++queued_ops_counter();
  check(cudaMemcpyAsync(pinned_dst, src, bytes, cudaMemcpyDeviceToHost, stream_for(kToHost)),
        "queued copy to host");
}

void synchronize(const char* what) {
  const auto lock = end_segment();
  check(cudaDeviceSynchronize(), what);
}

// Stream-ordered allocations come from the device's default memory pool: memory given back is
// reused by later allocations on the stream without a device synchronisation (cudaFree would
// synchronise).
// Failing, the pool gives its idle memory back to the driver (after the stream has run the frees
// queued on it) and the allocation is tried once more; then it fails as device_alloc does, with
// the free memory. (No cudaMalloc fallback: a pointer must be freed as it was allocated.)
void* device_alloc_async(size_t bytes, const char* what) {
  const auto lock = end_segment();
  void* p = nullptr;
  const cudaStream_t s = the_stream();
  if (cudaMallocAsync(&p, bytes, s) == cudaSuccess) return p;
  cudaGetLastError();
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess &&
      cudaMemPoolTrimTo(pool, 0) == cudaSuccess && cudaMallocAsync(&p, bytes, s) == cudaSuccess)
    return p;
  const cudaError_t e = cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  device_failed(fmt::format("cannot allocate {:.2f} GiB on the GPU for {} ({:.2f} GiB free of {:.2f}): {}",
                            double(bytes) / 1073741824.0, what, double(free_b) / 1073741824.0,
                            double(total_b) / 1073741824.0, cudaGetErrorString(e)));
  return nullptr;
}

void device_free_async(void* p) {
  if (!p) return;
  const auto lock = end_segment();
  cudaFreeAsync(p, the_stream());
}

int multiprocessors() {
  static const int n = [] {
    int device = 0, count = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
    return count;
  }();
  return n;
}

void select_top(const float* scores, const int32_t* pos, int64_t n, int64_t n_keep, int64_t* keep) {
  if (n < 1 || n_keep < 1 || n_keep > n) fail("select_top: keep {} of {} tokens", n_keep, n);
  const int64_t m = n - 1;  // candidates: every token but the last, which is always kept
  Scratch keys(size_t(m) * 8, "selection keys"), keys_sorted(size_t(m) * 8, "selection keys"),
      idx(size_t(m) * 8, "selection order"), idx_sorted(size_t(n) * 8, "selection order");
  if (m > 0) {
    LP_LAUNCH(kernels::selection_keys_kernel, blocks_for(m, kThreads), kThreads, 0, scores, pos, m,
              keys.as<uint64_t>(), idx.as<int64_t>());
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, keys.as<uint64_t>(),
                                                    keys_sorted.as<uint64_t>(), idx.as<int64_t>(),
                                                    idx_sorted.as<int64_t>(), int(m)),
          "selection sort (size)");
    Scratch tmp(bytes, "selection sort");
    check(cub::DeviceRadixSort::SortPairsDescending(
              tmp.p, bytes, keys.as<uint64_t>(), keys_sorted.as<uint64_t>(), idx.as<int64_t>(),
              idx_sorted.as<int64_t>(), int(m), 0, 64, stream_for(op_with(kSort, int64_t(size_class(m))))),
          "selection sort");
  }
  // The best n_keep - 1 candidates and the last token, in increasing order.
  LP_LAUNCH(kernels::put_last_kernel, 1, 1, 0, idx_sorted.as<int64_t>(), n_keep - 1, n - 1);
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortKeys(nullptr, bytes, idx_sorted.as<int64_t>(), keep, int(n_keep)),
        "selection order (size)");
  Scratch tmp(bytes, "selection order");
  check(cub::DeviceRadixSort::SortKeys(tmp.p, bytes, idx_sorted.as<int64_t>(), keep, int(n_keep), 0, 64,
                                       stream_for(op_with(kSort, int64_t(size_class(n_keep)), 1))),
        "selection order");
}

void copy_columns(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t width, int64_t rows) {
  ++queued_ops_counter();
  if (rows <= 0 || width <= 0) return;
  check(cudaMemcpy2DAsync(dst, size_t(ld_dst) * 4, src, size_t(ld_src) * 4, size_t(width) * 4, size_t(rows),
                          cudaMemcpyDeviceToDevice, stream_for(kColumns)),
        "copy_columns");
}

// Row-major out[T][N] = a[T][K] . w[N][K]^T is, column-major, out^T[N][T] = w[N][K]-as-[K][N]^T . a^T:
// cuBLAS with op(A) = T on w (lda K), op(B) = N on a (ldb K), C ldc N.
void gemm_f32(const float* a, const float* w, float* out, int64_t T, int64_t K, int64_t N) {
  ++queued_ops_counter();
  if (T <= 0 || N <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  const cublasHandle_t h = blas();         // created outside a capture
  stream_for(op_with(kGemmF32, T, K, N));  // cuBLAS queues on the stream (its handle's)
  check_blas(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, w, int(K), a, int(K),
                         &zero, out, int(N)),
             "gemm_f32");
}

void gemm_bf16(const uint16_t* a, const uint16_t* w, float* out, int64_t T, int64_t K, int64_t N) {
  ++queued_ops_counter();
  if (T <= 0 || N <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  const cublasHandle_t h = blas();
  stream_for(op_with(kGemmBf16, T, K, N));
  check_blas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, w, CUDA_R_16BF, int(K),
                          a, CUDA_R_16BF, int(K), &zero, out, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT),
             "gemm_bf16");
}

}  // namespace lp::cuda
