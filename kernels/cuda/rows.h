// Where the rows of an activation are, as a kernel reads them: contiguous rows `ld` elements apart
// from `base`, or, where `table` is set, row t at table[t]. A table lets one launch run an op over
// the rows of a batch's members, each member's rows in its own buffer (issue 58, item 3). Plain C++
// so that the launchers' declarations (cuda_ops.h) take it.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_math.h"  // LP_HD

namespace lp::cuda {

template <class T>
struct Rows {
  T* base = nullptr;
  int64_t ld = 0;
  T* const* table = nullptr;  // device memory
  LP_HD T* operator()(int64_t t) const { return table ? table[t] : base + t * ld; }
};

// The same rows, read only (an op in place reads and writes through one table).
template <class T>
Rows<const T> read_only(Rows<T> r) {
  return {r.base, r.ld, reinterpret_cast<const T* const*>(r.table)};
}

}  // namespace lp::cuda
