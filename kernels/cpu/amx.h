// Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later): whether this process may run
// its int8 tile instructions. Linux hands the tile state out per process on request
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); a CPU that has AMX under a kernel or
// hypervisor that withholds it says no here. QKernel::Amx (qgemm.h) runs on it, but
// best_qkernel does not pick it; `lp_bench --benchmark_filter=Peak` measures its int8 peak beside
// VNNI's (docs/cpu-kernels.md, "AMX for prefill").
#pragma once

namespace lp {

// AMX-TILE and AMX-INT8 in cpuid and the tile data granted to this process (asked once).
bool amx_int8_usable();

}  // namespace lp
