// The host executor of CUDA thread blocks (tests/cuda_emu/host_threads.h) that runs the backend's
// kernels in the normal suite: barriers open only when every live thread has reached them, a
// missing barrier changes the result under some thread order, threads stuck at different
// barriers are reported, and launches CUDA would refuse are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cuda/kernels.cuh"
#include "model/error.h"

namespace lp {
namespace {

namespace ht = lp::host_threads;

constexpr ht::Order kOrders[] = {ht::Order::Forward, ht::Order::Reverse, ht::Order::Shuffled,
                                 ht::Order::WarpByWarp};

struct OrderGuard {
  ht::Order saved = ht::order();
  ~OrderGuard() { ht::set_order(saved); }
};

// Each thread publishes its index in shared memory and reads its right neighbour's, with or
// without a barrier in between.
__global__ void neighbour_kernel(int* out, bool barrier) {
  __shared__ int slot[64];
  const int t = threadIdx.x;
  slot[t] = 100 * int(blockIdx.x) + t;
  if (barrier) __syncthreads();
  out[blockIdx.x * blockDim.x + t] = slot[(t + 1) % blockDim.x];
}

std::vector<int> run_neighbours(bool barrier, ht::Order order) {
  ht::set_order(order);
  std::vector<int> out(3 * 64, -1);
  ht::launch(3, 64, 0, &neighbour_kernel, out.data(), barrier);
  return out;
}

TEST(HostThreads, ABarrierOrdersSharedMemoryUnderEveryThreadOrder) {
  OrderGuard guard;
  for (ht::Order o : kOrders) {
    const auto out = run_neighbours(true, o);
    for (int b = 0; b < 3; ++b)
      for (int t = 0; t < 64; ++t) ASSERT_EQ(out[size_t(b * 64 + t)], 100 * b + (t + 1) % 64) << int(o);
  }
}

TEST(HostThreads, AMissingBarrierShowsUnderSomeOrder) {
  OrderGuard guard;
  int wrong = 0;
  for (ht::Order o : kOrders) {
    const auto out = run_neighbours(false, o);
    for (int b = 0; b < 3; ++b)
      for (int t = 0; t < 64; ++t) wrong += out[size_t(b * 64 + t)] != 100 * b + (t + 1) % 64;
  }
  EXPECT_GT(wrong, 0);
}

// Each thread reads another warp's slot, then overwrites its own after only a warp barrier: a
// warp may then overwrite what another warp has not read yet.
__global__ void overwrite_kernel(int* out, bool barrier) {
  __shared__ int slot[64];
  const int t = threadIdx.x;
  slot[t] = t;
  __syncthreads();
  const int other = slot[63 - t];
  __syncwarp();
  if (barrier) __syncthreads();
  slot[t] = -1;
  out[t] = other;
}

TEST(HostThreads, WarpByWarpCatchesAWarpOverwritingWhatAnotherStillReads) {
  OrderGuard guard;
  for (bool barrier : {true, false})
    for (ht::Order o : kOrders) {
      ht::set_order(o);
      std::vector<int> out(64, 0);
      ht::launch(1, 64, 0, &overwrite_kernel, out.data(), barrier);
      int wrong = 0;
      for (int t = 0; t < 64; ++t) wrong += out[size_t(t)] != 63 - t;
      // Thread by thread every read happens before the first warp barrier; warp by warp it does not.
      EXPECT_EQ(wrong > 0, !barrier && o == ht::Order::WarpByWarp) << int(o) << " " << barrier;
    }
}

// A butterfly sum over segments of 16 lanes.
__global__ void shuffle_kernel(float* out) {
  float v = float(threadIdx.x);
  for (int off = 8; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off, 16);
  out[threadIdx.x] = v;
}

TEST(HostThreads, XorShufflesWithinSegments) {
  OrderGuard guard;
  for (ht::Order o : kOrders) {
    ht::set_order(o);
    std::vector<float> out(64, 0.0f);
    ht::launch(1, 64, 0, &shuffle_kernel, out.data());
    for (int t = 0; t < 64; ++t) {
      const int first = t / 16 * 16;
      EXPECT_EQ(out[size_t(t)], float(16 * first + 120)) << t;  // first + (first + 1) + ... + (first + 15)
    }
  }
}

// Indexed shuffles: each lane reads lane (3 l + 1) mod width of its segment, over two warps.
__global__ void indexed_shuffle_kernel(int* out, int width) {
  const int l = int(threadIdx.x);
  out[l] = __shfl_sync(0xffffffffu, 100 * l, 3 * (l % width) + 1, width);
}

TEST(HostThreads, IndexedShufflesWithinSegments) {
  OrderGuard guard;
  for (ht::Order o : kOrders)
    for (int width : {32, 8}) {
      ht::set_order(o);
      std::vector<int> out(64, -1);
      ht::launch(1, 64, 0, &indexed_shuffle_kernel, out.data(), width);
      for (int l = 0; l < 64; ++l) {
        const int segment = l / width * width, src = segment + (3 * (l % width) + 1) % width;
        EXPECT_EQ(out[size_t(l)], 100 * src) << "lane " << l << " width " << width;
      }
    }
}

// Three-dimensional indices, dynamic shared memory, and a warp barrier that opens per warp.
__global__ void index_kernel(int* out) {
  LP_DYNAMIC_SHARED(int, lane_sum);
  const int linear = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int warp = linear / 32;
  if (linear % 32 == 0) lane_sum[warp] = 0;
  __syncwarp();
  lane_sum[warp] += linear % 32;  // threads run one at a time between barriers on the host
  __syncwarp();
  const int block = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int threads = int(blockDim.x * blockDim.y * blockDim.z);
  out[block * threads + linear] = lane_sum[warp];
}

TEST(HostThreads, IndicesDynamicSharedMemoryAndWarpBarriers) {
  const dim3 grid(2, 3, 2), block(16, 2, 3);  // 96 threads: three warps
  std::vector<int> out(12 * 96, -1);
  ht::launch(grid, block, 3 * sizeof(int), &index_kernel, out.data());
  for (int i = 0; i < int(out.size()); ++i) ASSERT_EQ(out[size_t(i)], 31 * 32 / 2) << i;
}

__global__ void mismatched_barriers_kernel() {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncwarp();
    __syncthreads();
  }
}

__global__ void block_reduce_kernel(float* out) {
  using Reduce = lp::cuda::kernels::BlockReduce<float, 64>;
  __shared__ typename Reduce::TempStorage tmp;
  out[threadIdx.x] = Reduce(tmp).Sum(float(threadIdx.x));
}

TEST(HostThreads, BlockReduceIsDefinedInThreadZeroOnly) {
  std::vector<float> out(64, 0.0f);
  ht::launch(1, 64, 0, &block_reduce_kernel, out.data());
  EXPECT_EQ(out[0], 63.0f * 64.0f / 2.0f);
  for (int t = 1; t < 64; ++t) EXPECT_TRUE(std::isnan(out[size_t(t)])) << t;
}

TEST(HostThreads, RefusesDeadlocksAndLaunchesCudaRefuses) {
  EXPECT_THROW(ht::launch(1, 64, 0, &mismatched_barriers_kernel), Error);
  EXPECT_THROW(ht::launch(1, 1025, 0, &mismatched_barriers_kernel), Error);
  EXPECT_THROW(ht::launch(0, 32, 0, &mismatched_barriers_kernel), Error);
  EXPECT_THROW(ht::launch(dim3(1, 70000), 32, 0, &mismatched_barriers_kernel), Error);
  EXPECT_THROW(ht::thread_idx(), Error);  // outside a launch
}

}  // namespace
}  // namespace lp
