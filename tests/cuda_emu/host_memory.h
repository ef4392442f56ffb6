// The host emulation's "device" memory, counted (tests/cuda_emu/host_emulation.cpp): the bytes its
// device allocations hold now, and the most they have held since the last reset_device_peak(). So
// a test checks what a backend really allocates against what reservations count
// (kernels/cuda/memory.h, Backend::held_bytes).
#pragma once

#include <cstdint>

namespace lp::cuda::emulation {

int64_t device_bytes();
int64_t device_allocations();  // how many allocations so far
int64_t device_peak_bytes();
void reset_device_peak();

}  // namespace lp::cuda::emulation
