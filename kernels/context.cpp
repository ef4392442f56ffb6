#include "kernels/context.h"

#include <omp.h>
#include <sched.h>
#include <tbb/task_scheduler_observer.h>

#include <algorithm>

#include "model/error.h"

namespace lp {

struct CpuContext::Observer : tbb::task_scheduler_observer {
  explicit Observer(tbb::task_arena& a) : tbb::task_scheduler_observer(a) { observe(true); }
  ~Observer() override { observe(false); }
  // OpenMP's thread-count setting is per thread; one is what oneDNN must use inside a task.
  void on_scheduler_entry(bool) override { omp_set_num_threads(1); }
};

CpuContext::CpuContext(int threads) : threads_(threads), arena_(threads) {
  if (threads < 1 || threads > 1024) fail("--threads must be between 1 and 1024, got {}", threads);
  arena_.initialize();
  observer_ = std::make_unique<Observer>(arena_);
  omp_set_num_threads(1);
}

CpuContext::~CpuContext() = default;

int default_thread_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

}  // namespace lp
