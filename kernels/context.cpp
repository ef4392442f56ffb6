#include "kernels/context.h"

#include <omp.h>
#include <sched.h>
#include <tbb/cache_aligned_allocator.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_scheduler_observer.h>

#include <algorithm>
#include <array>

#include "kernels/cpu/buffer.h"
#include "kernels/cpu/membw.h"
#include "model/error.h"

namespace lp {

struct CpuContext::Observer : tbb::task_scheduler_observer {
  explicit Observer(tbb::task_arena& a) : tbb::task_scheduler_observer(a) { observe(true); }
  ~Observer() override { observe(false); }
  // OpenMP's thread-count setting is per thread; one is what oneDNN must use inside a task.
  void on_scheduler_entry(bool) override { omp_set_num_threads(1); }
};

// Each thread's buffers, one per slot; found through a thread-specific key of this context's own
// (ets_key_per_instance: a pthread_getspecific, not a hash lookup, per call).
struct CpuContext::Scratchpads {
  using Slots = std::array<Buffer<std::byte>, size_t(Scratch::kCount)>;
  tbb::enumerable_thread_specific<Slots, tbb::cache_aligned_allocator<Slots>, tbb::ets_key_per_instance>
      per_thread;
};

CpuContext::CpuContext(int threads)
    : threads_(threads),
      cache_bytes_(last_level_cache_bytes()),
      arena_(threads),
      scratch_(std::make_unique<Scratchpads>()) {
  if (threads < 1 || threads > 1024) fail("a CPU context needs 1 to 1024 threads, got {}", threads);
  arena_.initialize();
  observer_ = std::make_unique<Observer>(arena_);
  omp_set_num_threads(1);
}

CpuContext::~CpuContext() = default;

namespace {
thread_local int side_by_side_depth = 0;  // side_by_side tasks this thread is inside
}

int CpuContext::split_threads() const {
  return side_by_side_depth > 0 ? 1 : threads_;
}

void CpuContext::side_by_side(int64_t n, const std::function<void(int64_t)>& f) {
  if (n <= 1 || threads_ == 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  run([&] {
    tbb::parallel_for(int64_t(0), n, [&](int64_t i) {
      tbb::this_task_arena::isolate([&] {
        ++side_by_side_depth;
        struct Leave {
          ~Leave() { --side_by_side_depth; }
        } leave;
        f(i);
      });
    });
  });
}

void* CpuContext::scratch_bytes(Scratch slot, size_t bytes) {
  Buffer<std::byte>& b = scratch_->per_thread.local()[size_t(slot)];
  if (size_t(b.size()) < bytes) b.resize(int64_t(bytes), false);
  return b.data();
}

int default_thread_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

}  // namespace lp
