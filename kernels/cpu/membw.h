// The memory bandwidth this machine gives the engine's threads (issue 56): the ceiling a decoding
// step, which reads every weight once per token, is measured against (docs/cpu-kernels.md,
// "Decoding at the memory wall").
//
// Each of the context's threads sweeps its own slice of a buffer far beyond the last-level cache
// (by default the larger of 1 GiB and 4 times the LLC), first touched by the same thread, so the
// figure is what the same threads in the same arena reach from DRAM. Two patterns:
// - Read: every byte loaded once (the widest vector loads the CPU has, four independent sums), each
//   thread's slice as 8 interleaved sequential streams, the access a matrix-vector product makes of
//   its weights (8 rows a tile);
// - Triad: STREAM's a[i] = b[i] + s c[i] over doubles, counted as STREAM counts it (24 bytes an
//   element: the write-allocate read of a is not counted).
// A pass's time is the slowest thread's; the figure is the best of `passes`.
#pragma once

#include <cstdint>
#include <string>

namespace lp {

class CpuContext;

enum class MemPattern { Read, Triad };
const char* mem_pattern_name(MemPattern p);

struct BandwidthOptions {
  int64_t bytes = 0;        // the whole buffer (every array of a triad together); 0: the default
  bool huge_pages = false;  // ask for transparent huge pages (madvise), else 4 KiB pages
  int passes = 5;
};

struct Bandwidth {
  double gbs = 0;         // 1e9 bytes per second, the best pass
  double median_gbs = 0;  // the median pass
  int64_t bytes = 0;      // per pass
  int threads = 0;
  std::string isa;  // the loads used: "avx512", "avx2" or "scalar"
};

// The last-level cache's size as the OS reports it (sysfs's cpu0, else sysconf; 0 when neither
// does): the slice one core shares, not the package's total.
int64_t last_level_cache_bytes();
// The default buffer: max(1 GiB, 4 x the last-level cache).
int64_t default_bandwidth_bytes();

// Throws lp::Error when the buffer cannot be allocated.
Bandwidth measure_bandwidth(CpuContext& ctx, MemPattern pattern, const BandwidthOptions& opt = {});

}  // namespace lp
