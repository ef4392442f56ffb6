// CUDA thread blocks executed on the host, for tests: the kernels of kernels/cuda/kernels.cuh,
// compiled by the host compiler, run thread by thread with their own indexing, shared memory and
// barriers, so a machine without a GPU checks what a launch computes, not a rewrite of it.
//
// Each CUDA thread of a block is a fiber (Boost.Context) on the calling thread; blocks run one after
// the other. `__syncthreads()` and `__syncwarp()` switch fibers: a barrier opens when every thread
// of the block (or of the warp) that has not returned waits at it; threads waiting at different
// barriers that can never open is reported as a deadlock. Between barriers the threads run in the
// order set by set_order (forward, reverse, a fixed shuffle, or warp by warp), so a missing
// barrier, a read of shared memory before another thread's write, shows up as a difference
// between orders.
// `__shared__` variables are function-local statics (one block at a time), and BlockReduce stands
// in for cub::BlockReduce with its contract: the result is defined in thread 0 only (others get
// NaN), and its storage may not be reused before a barrier.
//
// `__shfl_xor_sync` and `__shfl_sync` exchange through per-thread slots between two warp barriers
// (all 32 lanes of the warp must take part, as the full mask says); `warp_all` gives every lane all
// 32 lanes' values, for the emulation of warp-wide instructions (kernels/cuda/mma.cuh). Not emulated: other
// shuffles and votes, atomics across blocks running at once (blocks are sequential), memory fences, and
// timing. Plain C++; only this header's macros make kernel code compile on the host.
#pragma once

#if defined(__CUDACC__)
#error "host_threads.h is for host compilers; nvcc compiles the kernels for the device"
#endif

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

namespace lp::host_threads {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3() = default;
  Dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}  // NOLINT: as CUDA's dim3
};

// Forward, Reverse, Shuffled: every thread runs until it waits (thread by thread in that order),
// then the barriers that all live threads reached open. WarpByWarp: one warp at a time, the last
// first, runs through its warp barriers up to the block barrier, as if the other warps had not
// started: a warp that overwrites shared memory other warps still read is caught.
enum class Order { Forward, Reverse, Shuffled, WarpByWarp };
// The order threads run in between barriers (all launches until changed; Forward by default).
void set_order(Order order);
Order order();

// The running thread's coordinates (valid inside a launch).
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
int linear_thread();  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)

void sync_block();  // __syncthreads()
void sync_warp();   // __syncwarp(): the 32 consecutive linear threads of the caller's warp

[[noreturn]] void fail_shuffle(unsigned mask, int lane_mask, int width);
// The exchange slot (16 bytes) of the block's thread `linear`, for shuffles.
void* shuffle_slot(int linear);

// The block's dynamic shared memory (the launch's shared-memory bytes), 16-byte aligned.
void* dynamic_shared();

// Runs body once per thread of every block. Throws lp::Error on a bad configuration (a dimension
// of 0, more than 1024 threads per block) or a deadlock.
void run_grid(Dim3 grid, Dim3 block, size_t shared_bytes, const std::function<void()>& body);

// kernel<<<grid, block, shared_bytes>>>(args...) on the host.
template <class... P, class... A>
void launch(Dim3 grid, Dim3 block, size_t shared_bytes, void (*kernel)(P...), A... args) {
  run_grid(grid, block, shared_bytes, [&] { kernel(args...); });
}

// cub::BlockReduce<T, N> for a block of N threads.
template <class T, int N>
class BlockReduce {
 public:
  struct TempStorage {
    T v[N];
  };
  explicit BlockReduce(TempStorage& s) : s_(s) {}
  template <class Op>
  T Reduce(T x, Op op) {
    const int t = linear_thread();
    s_.v[t] = x;
    sync_block();
    if (t != 0) return std::numeric_limits<T>::quiet_NaN();
    T r = s_.v[0];
    for (int i = 1; i < N; ++i) r = op(r, s_.v[i]);
    return r;
  }
  T Sum(T x) {
    return Reduce(x, [](T a, T b) { return a + b; });
  }

 private:
  TempStorage& s_;
};

}  // namespace lp::host_threads

// The CUDA built-ins the kernels use, on the host.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define threadIdx (::lp::host_threads::thread_idx())
#define blockIdx (::lp::host_threads::block_idx())
#define blockDim (::lp::host_threads::block_dim())
#define gridDim (::lp::host_threads::grid_dim())
#define __syncthreads() ::lp::host_threads::sync_block()
#define __syncwarp(...) ::lp::host_threads::sync_warp()
using dim3 = ::lp::host_threads::Dim3;

// __shfl_xor_sync(mask, v, lane_mask, width): lane l receives v of lane l ^ lane_mask (within
// segments of `width` lanes; lane_mask < width).
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= 16, "a shuffle slot holds 16 bytes");
  namespace ht = ::lp::host_threads;
  if (mask != 0xffffffffu || lane_mask <= 0 || lane_mask >= width || width > 32 || (width & (width - 1)))
    ht::fail_shuffle(mask, lane_mask, width);
  const int me = ht::linear_thread();
  std::memcpy(ht::shuffle_slot(me), &v, sizeof(T));
  ht::sync_warp();
  T r;
  std::memcpy(&r, ht::shuffle_slot(me ^ lane_mask), sizeof(T));
  ht::sync_warp();
  return r;
}

// __shfl_sync(mask, v, src_lane, width): lane l receives v of lane src_lane % width of l's segment of
// `width` lanes.
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  static_assert(sizeof(T) <= 16, "a shuffle slot holds 16 bytes");
  namespace ht = ::lp::host_threads;
  if (mask != 0xffffffffu || width <= 0 || width > 32 || (width & (width - 1)))
    ht::fail_shuffle(mask, src_lane, width);
  const int me = ht::linear_thread();
  std::memcpy(ht::shuffle_slot(me), &v, sizeof(T));
  ht::sync_warp();
  const int lane = me % 32, segment = lane / width * width;
  T r;
  std::memcpy(&r, ht::shuffle_slot(me - lane + segment + (src_lane & (width - 1))), sizeof(T));
  ht::sync_warp();
  return r;
}

namespace lp::host_threads {
// A warp-collective exchange for the emulation of warp-wide instructions (mma): every lane of the
// caller's warp puts `bytes` (up to 16) of its own and receives all 32 lanes', in lane order, into
// `all` (32 x bytes). All 32 lanes must call it, as the instruction's .sync.aligned demands.
inline void warp_all(const void* mine, size_t bytes, void* all) {
  if (bytes > 16) fail_shuffle(0xffffffffu, int(bytes), 32);
  const int me = linear_thread(), first = me - me % 32;
  std::memcpy(shuffle_slot(me), mine, bytes);
  sync_warp();
  for (int l = 0; l < 32; ++l)
    std::memcpy(static_cast<char*>(all) + size_t(l) * bytes, shuffle_slot(first + l), bytes);
  sync_warp();
}
}  // namespace lp::host_threads

inline unsigned atomicOr(unsigned* a, unsigned v) {
  const unsigned old = *a;
  *a = old | v;
  return old;
}
