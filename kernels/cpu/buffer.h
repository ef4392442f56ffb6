// Buffer<T>: a 64-byte aligned, uninitialised-on-request array (weights, activations, caches).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace lp {

template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t n, bool zero = true) { resize(n, zero); }

  void resize(int64_t n, bool zero = true) {
    if (n == n_) return;
    data_.reset();
    n_ = 0;
    if (n <= 0) return;
    const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
    T* p = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!p) throw std::bad_alloc();
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
