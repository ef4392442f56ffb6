#include "kernels/cpu/amx.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace lp {

namespace {
constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl code (asm/prctl.h)
constexpr long kXfeatureXtiledata = 18;     // the tile data state component

bool detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  // cpuid leaf 7, subleaf 0: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 25))) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
}  // namespace

bool amx_int8_usable() {
  static const bool usable = detect();
  return usable;
}

}  // namespace lp
