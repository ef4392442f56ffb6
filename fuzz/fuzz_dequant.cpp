// The dequantizers on arbitrary blocks: the first byte picks the type, the rest is its data (as
// many whole blocks as fit). Every output must be a float the bytes encode: no reads past the
// input (ASan), no UB on any bit pattern (UBSan).
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/quant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto info = lp::type_info(data[0] % 64);
  if (!info || !info->dequantizable) return 0;
  const lp::GgmlType type = lp::GgmlType(data[0] % 64);
  // Whole blocks only.
  const int64_t blocks = int64_t(size - 1) / info->block_bytes;
  const int64_t n = blocks * info->block_elems;
  if (n == 0) return 0;
  std::vector<uint8_t> src(data + 1,
                           data + 1 + blocks * info->block_bytes);  // exactly the blocks: ASan sees overreads
  std::vector<float> out(static_cast<size_t>(n));
  lp::fuzz::refuses_cleanly([&] { lp::dequantize(type, src.data(), out.data(), n); });
  return 0;
}
