// CpuContext: the parallelism every CPU op is given (never a global).
//
// It owns a oneTBB arena of `threads` threads. oneDNN (built on OpenMP in Debian) is used as a
// single-threaded GEMM kernel inside TBB tasks: the context pins OpenMP to one thread on every
// thread that enters the arena, so the two runtimes never oversubscribe the cores.
#pragma once

#include <tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace lp {

// The working buffers an op takes from its context (CpuContext::scratch), one per buffer it keeps
// alive at once; ops that never run inside one another may share a slot.
enum class Scratch : int {
  QActivations,    // the integer GEMM's quantized rows (kernels/cpu/qgemm.cpp)
  QActivationsK,   // the same rows a scale per super-block, for its K-quant parts
  QBias,           // its activation blocks' offset terms
  QTileRows,       // the quantized rows laid out for its AMX tiles
  QTileRowsK,      // and the K-quant parts' rows
  QWeights,        // one task's panel of weights, packed or widened
  QScales,         // that panel's (or decoding tile's) f32 scales
  QMins,           // and minima
  GemmWidened,     // oneDNN's GEMM: a task's bf16 weights widened to f32 (kernels/cpu/gemm.cpp)
  GemmScratchpad,  // and its scratchpad (oneDNN's user-managed scratchpad mode)
  kCount
};

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

  // n elements of this thread's buffer in `slot`: 64-byte aligned, contents unspecified, valid
  // until the same thread asks for that slot again. Grown as needed and kept, so an op allocates
  // once per thread, not once per call; freed with the context. A buffer held across a parallel
  // op (the integer GEMM's quantized rows, while its tasks run) is safe because nothing a waiting
  // thread may take meanwhile asks for that slot: the op's own tasks use other slots, and
  // side_by_side isolates its members.
  template <class T>
  T* scratch(Scratch slot, int64_t n) {
    return static_cast<T*>(scratch_bytes(slot, size_t(n) * sizeof(T)));
  }
  void* scratch_bytes(Scratch slot, size_t bytes);

  // The last-level cache the ops size their passes for (the integer GEMM's rows: qgemm_pass_rows):
  // last_level_cache_bytes() unless set (tests set a small one to make a small GEMM take passes).
  int64_t cache_bytes() const { return cache_bytes_; }
  void set_cache_bytes(int64_t bytes) { cache_bytes_ = bytes; }

 private:
  int threads_;
  int64_t cache_bytes_;
  tbb::task_arena arena_;
  struct Observer;
  std::unique_ptr<Observer> observer_;
  struct Scratchpads;
  std::unique_ptr<Scratchpads> scratch_;
};

// Number of hardware threads available to this process.
int default_thread_count();

}  // namespace lp
