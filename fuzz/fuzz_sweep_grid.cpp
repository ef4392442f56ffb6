// Sweep grids (`sweep --grid`): the reader resolves every name it holds (profiles, presets,
// schedules) and checks every number before a sweep does any work.
#include "fuzz/fuzz_util.h"
#include "reports/sweep_grid.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] { (void)lp::report::read_sweep_grid(path); });
  return 0;
}
