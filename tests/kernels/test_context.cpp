// CpuContext's per-thread scratch (kernels/context.h): what the integer GEMM's tasks take their
// working memory from.
#include <gtest/gtest.h>
#include <tbb/parallel_for.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "kernels/context.h"

namespace lp {
namespace {

bool aligned64(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 64 == 0;
}

TEST(CpuContextScratch, IsAlignedKeptAndGrownPerSlot) {
  CpuContext ctx(1);
  float* a = ctx.scratch<float>(Scratch::QScales, 100);
  EXPECT_TRUE(aligned64(a));
  for (int i = 0; i < 100; ++i) a[i] = float(i);
  // The same slot, no larger: the same memory, nothing reallocated.
  EXPECT_EQ(ctx.scratch<float>(Scratch::QScales, 50), a);
  // Another slot is other memory, alive at once.
  auto* b = ctx.scratch<uint8_t>(Scratch::QWeights, 4000);
  EXPECT_TRUE(aligned64(b));
  EXPECT_TRUE(reinterpret_cast<uint8_t*>(a + 100) <= b || b + 4000 <= reinterpret_cast<uint8_t*>(a));
  EXPECT_EQ(a[99], 99.f);
  // Larger: grown (all of it writable under ASan), still aligned.
  float* c = ctx.scratch<float>(Scratch::QScales, 1 << 20);
  EXPECT_TRUE(aligned64(c));
  c[(1 << 20) - 1] = 1.f;
  EXPECT_EQ(ctx.scratch<float>(Scratch::QScales, 0), c);
}

TEST(CpuContextScratch, EachThreadHasItsOwn) {
  CpuContext ctx(2);
  std::mutex m;
  std::map<std::thread::id, std::set<const void*>> seen;
  std::atomic<int> clashes{0};
  ctx.run([&] {
    tbb::parallel_for(0, 2000, [&](int i) {
      auto* p = ctx.scratch<int>(Scratch::QBias, 256);
      for (int j = 0; j < 256; ++j) p[j] = i;
      for (int spin = 0; spin < 200; ++spin) asm volatile("" ::: "memory");  // a busy wait the compiler keeps
      for (int j = 0; j < 256; ++j)
        if (p[j] != i) ++clashes;  // another task wrote this thread's buffer meanwhile
      std::lock_guard lock(m);
      seen[std::this_thread::get_id()].insert(p);
    });
  });
  EXPECT_EQ(clashes.load(), 0);
  std::set<const void*> all;
  for (const auto& [id, ptrs] : seen) {
    EXPECT_EQ(ptrs.size(), 1u);  // one buffer per thread, kept across its tasks
    all.insert(ptrs.begin(), ptrs.end());
  }
  EXPECT_EQ(all.size(), seen.size());  // no two threads share one
}

}  // namespace
}  // namespace lp
