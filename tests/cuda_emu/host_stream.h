// The emulated stream of the CUDA backend's tests (tests/cuda_emu/host_emulation.cpp): an operation
// runs when it is queued, unless a capture is open (cuda_ops.h, set_graphs), in which case it is
// recorded, with its arguments, and runs when the segment is launched, as a graph's nodes run on a
// GPU: after the host has gone on. So a host that reads a result before the wait that should have
// brought it, or writes pinned memory that a captured copy has not read yet, sees what a GPU would
// give it, not what an eager emulation would.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/cuda/cuda_ops.h"
#include "tests/cuda_emu/host_threads.h"

namespace lp::cuda::emulation {

// Operation `op` (cuda::op_id) queued: queue_on(op), then f run now, or recorded by the open capture.
void enqueue(uint64_t op, std::function<void()> f);

// kernel<<<grid, block, shared_bytes>>>(args...) on the emulated stream.
template <class... P, class... A>
void launch(uint64_t op, host_threads::Dim3 grid, host_threads::Dim3 block, size_t shared_bytes,
            void (*kernel)(P...), A... args) {
  enqueue(op, [=] { host_threads::launch(grid, block, shared_bytes, kernel, args...); });
}

}  // namespace lp::cuda::emulation
