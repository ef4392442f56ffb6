// CpuContext: the parallelism every CPU op is given (never a global).
//
// It owns a oneTBB arena of `threads` threads. oneDNN (built on OpenMP in Debian) is used as a
// single-threaded GEMM kernel inside TBB tasks: the context pins OpenMP to one thread on every
// thread that enters the arena, so the two runtimes never oversubscribe the cores.
#pragma once

#include <tbb/task_arena.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace lp {

class CpuContext {
 public:
  explicit CpuContext(int threads);
  ~CpuContext();
  CpuContext(const CpuContext&) = delete;
  CpuContext& operator=(const CpuContext&) = delete;

  int threads() const { return threads_; }
  // How many threads an op called from this thread should split its work for: threads(), or 1
  // inside side_by_side, where the caller already keeps every thread busy with other tasks.
  int split_threads() const;
  tbb::task_arena& arena() { return arena_; }

  // Runs f inside the arena (f may use tbb::parallel_for).
  template <class F>
  void run(F&& f) {
    arena_.execute(std::forward<F>(f));
  }

  // Runs f(0), ..., f(n - 1) across the threads, each task isolated (a thread waiting inside one
  // task's parallel op takes no other task, so no thread-local scratch is entered twice) and with
  // split_threads() = 1 inside it. For work that is many small independent parts (the members of a
  // batch), where splitting each part would only add overhead.
  void side_by_side(int64_t n, const std::function<void(int64_t)>& f);

 private:
  int threads_;
  tbb::task_arena arena_;
  struct Observer;
  std::unique_ptr<Observer> observer_;
};

// Number of hardware threads available to this process.
int default_thread_count();

}  // namespace lp
