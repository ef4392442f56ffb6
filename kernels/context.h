// CpuContext: the parallelism every CPU op is given (never a global).
//
// It owns a oneTBB arena of `threads` threads. oneDNN (built on OpenMP in Debian) is used as a
// single-threaded GEMM kernel inside TBB tasks: the context pins OpenMP to one thread on every
// thread that enters the arena, so the two runtimes never oversubscribe the cores.
#pragma once

#include <tbb/task_arena.h>

#include <memory>

namespace lp {

class CpuContext {
 public:
  explicit CpuContext(int threads);
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  int threads() const { return threads_; }
  tbb::task_arena& arena() { return arena_; }

  // Runs f inside the arena (f may use tbb::parallel_for).
  template <class F>
  void run(F&& f) {
    arena_.execute(std::forward<F>(f));
  }

 private:
  int threads_;
  tbb::task_arena arena_;
  struct Observer;
  std::unique_ptr<Observer> observer_;
};

// Number of hardware threads available to this process.
int default_thread_count();

}  // namespace lp
