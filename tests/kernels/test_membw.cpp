// The bandwidth probe decoding is measured against (kernels/cpu/membw.h): what it counts, on a
// buffer small enough for a unit test (64 MiB: most of it fits this machine's L3, so the figure is
// not the DRAM ceiling; lp_bench's BM_MemBandwidth measures that).
#include <gtest/gtest.h>

#include "kernels/context.h"
#include "kernels/cpu/buffer.h"
#include "kernels/cpu/membw.h"

namespace lp {
namespace {

TEST(MemBandwidth, CountsWhatEachPatternMoves) {
  CpuContext ctx(2);
  const int64_t want = int64_t(64) << 20;
  const Bandwidth r = measure_bandwidth(ctx, MemPattern::Read, {.bytes = want, .passes = 2});
  const Bandwidth t =
      measure_bandwidth(ctx, MemPattern::Triad, {.bytes = want, .huge_pages = true, .passes = 2});
  // Whole pages a thread: the read's one array, the triad's three, within a page a thread of asked.
  EXPECT_LE(r.bytes, want);
  EXPECT_GT(r.bytes, want - 2 * 4096);
  EXPECT_EQ(t.bytes % (3 * 2 * 4096), 0);
  EXPECT_GT(t.bytes, want - 3 * 2 * 4096);
  for (const Bandwidth& b : {r, t}) {
    EXPECT_EQ(b.threads, 2);
    EXPECT_TRUE(b.isa == "avx512" || b.isa == "avx2" || b.isa == "scalar") << b.isa;
    // Any machine this runs on moves more than 0.5 GB/s and less than 10 TB/s from 64 MiB.
    EXPECT_GT(b.median_gbs, 0.5);
    EXPECT_LT(b.gbs, 1e4);
    EXPECT_GE(b.gbs, b.median_gbs);
  }
}

TEST(MemBandwidth, DefaultBufferIsFarBeyondTheLastLevelCache) {
  EXPECT_GE(default_bandwidth_bytes(), int64_t(1) << 30);
  EXPECT_GE(default_bandwidth_bytes(), 4 * last_level_cache_bytes());
}

// Buffers of 4 MiB or more (packed weights, K/V, activations of long prompts) start on a 2 MiB
// boundary and span whole 2 MiB pages, so transparent huge pages (asked for with madvise) can back
// them; smaller ones keep 64-byte alignment. Both zeroed on request, every byte.
TEST(Buffer, LargeBuffersStartOnHugePageBoundaries) {
  const auto at = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  Buffer<uint8_t> big((int64_t(5) << 20) + 3);
  ASSERT_NE(big.data(), nullptr);
  EXPECT_EQ(at(big.data()) % Buffer<uint8_t>::kHuge, 0u);
  for (int64_t i = 0; i < big.size(); i += 4093) ASSERT_EQ(big[i], 0) << i;
  EXPECT_EQ(big[big.size() - 1], 0);
  Buffer<float> small(1000);
  EXPECT_EQ(at(small.data()) % 64, 0u);
  for (int64_t i = 0; i < small.size(); ++i) ASSERT_EQ(small[i], 0.f);
  big.resize(10);  // back to a small one
  EXPECT_EQ(big.size(), 10);
  EXPECT_EQ(at(big.data()) % 64, 0u);
}

}  // namespace
}  // namespace lp
