// Buffer<T>: a 64-byte aligned, uninitialised-on-request array (weights, activations, caches).
#pragma once

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace lp {

template <class T>
class Buffer {
 public:
  // From 4 MiB on a buffer starts on a 2 MiB boundary, spans whole 2 MiB pages and asks for
  // transparent huge pages (MADV_HUGEPAGE, where THP is "madvise", as on these VMs; ignored where it
  // is off). The packed weights stream at decoding from 4 KiB pages cost a page walk every 64
  // lines, which the L2 prefetches of the GEMV wait on: with huge pages the 8B-shaped Q4_K_M file
  // decodes 1.10x faster (4.77 -> 5.27 tokens/s after 512 tokens, 0.66 -> 0.75 of the read
  // ceiling; its Q6_K output layer 21.5 -> 16.6 ms a step, as fast as BM_QGemv's) and the Q8_0 one
  // 1.03x (0.80 -> 0.84), prefill unchanged (Xeon family 6 model 167, 2 threads, alternated,
  // medians of 3, 2026-11-29; docs/cpu-kernels.md, "Huge pages for the weights").
  static constexpr size_t kHuge = size_t(2) << 20, kHugeFrom = size_t(4) << 20;
  Buffer() = default;
  explicit Buffer(int64_t n, bool zero = true) { resize(n, zero); }

  void resize(int64_t n, bool zero = true) {
    if (n == n_) return;
    data_.reset();
    n_ = 0;
    if (n <= 0) return;
    const bool huge = static_cast<size_t>(n) * sizeof(T) >= kHugeFrom;
    const size_t align = huge ? kHuge : 64;
    const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + align - 1) / align * align;
    T* p = static_cast<T*>(std::aligned_alloc(align, bytes));
    if (!p) throw std::bad_alloc();
    if (huge) (void)::madvise(p, bytes, MADV_HUGEPAGE);  // advice: ignored where THP is off
    if (zero) std::memset(static_cast<void*>(p), 0, bytes);
    data_.reset(p);
    n_ = n;
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  int64_t size() const { return n_; }
  T& operator[](int64_t i) { return data_.get()[i]; }
  const T& operator[](int64_t i) const { return data_.get()[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t n_ = 0;
};

}  // namespace lp
