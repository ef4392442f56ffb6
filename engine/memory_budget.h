// Whether a model's weights fit the memory this process may use, asked before any weight is copied
// (issue 56): a file too large is refused with both sizes, not killed by the kernel mid-load.
//
// The memory a process may use is the least of what the system says is available (MemAvailable:
// free memory and reclaimable caches), its cgroup's room (cgroup v2 memory.max - memory.current)
// and its own limits (RLIMIT_AS less the address space it holds, RLIMIT_DATA less its data). The
// weights' need is what load_weights will hold resident in the dtype asked: every tensor's elements
// at 4 bytes in f32 and 2 in bf16; in int8 a type the integer GEMM multiplies at its blocks' bytes
// (kept or packed, the file's pages dropped) and any other at Q8_0's 34 bytes per 32. K/V and
// activations come on top and are not counted: the check refuses what cannot load at all.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cpu/gemm.h"

namespace lp {

class GgufFile;

// What the system and the process's limits report, in bytes (nullopt: no such limit or no figure).
struct MemorySources {
  std::optional<int64_t> mem_available;               // /proc/meminfo MemAvailable
  std::optional<int64_t> cgroup_max, cgroup_current;  // the process's cgroup v2 memory.max, .current
  std::optional<int64_t> rlimit_as, address_space;    // RLIMIT_AS (soft) and VmSize
  std::optional<int64_t> rlimit_data, data;           // RLIMIT_DATA (soft) and VmData
};
MemorySources read_memory_sources();

struct MemoryBudget {
  int64_t bytes = INT64_MAX;  // INT64_MAX: nothing known
  std::string source;         // which figure bounds it, in words ("MemAvailable", "RLIMIT_AS", ...)
};
// The least of the sources' room (a limit already exceeded leaves 0).
MemoryBudget memory_budget(const MemorySources& s);

// What load_weights will hold resident for `f`'s tensors in `dtype` (in int8, an untied embedding
// table the integer GEMM could read stays mapped, its rows paged in as tokens look them up: none).
int64_t resident_weight_bytes(const GgufFile& f, DType dtype);

// Throws lp::Error naming the file, both sizes and the bound's source when the weights need more
// than the budget.
void check_weights_fit(const GgufFile& f, DType dtype, const MemoryBudget& budget);

}  // namespace lp
