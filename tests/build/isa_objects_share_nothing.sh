#!/bin/sh
# The integer GEMM's instruction-set files (kernels/cpu/qgemm_avx2.cpp, qgemm_avx512.cpp) are
# compiled for targets wider than the build's. A weak (inline or template) symbol defined in one of
# them could be chosen by the linker for every caller, and run AVX-512 code on a CPU without it.
# Their shared code is in anonymous namespaces and their includes outside the target regions, so
# they must define no weak symbol at all; this fails, naming the symbols, if one appears.
# Usage: isa_objects_share_nothing.sh <liblp_kernels.a>
set -eu
lib="$1"
bad=$(nm -C -A --defined-only "$lib" | grep -E ':qgemm_avx(2|512)\.cpp\.o:' | awk '$2 == "W" || $2 == "V" || $2 == "u"') || true
if [ -n "$bad" ]; then
  echo "weak symbols in the instruction-set objects of $lib (see kernels/cpu/qgemm_ymm.h):" >&2
  echo "$bad" >&2
  exit 1
fi
count=$(nm -A --defined-only "$lib" | grep -cE ':qgemm_avx(2|512)\.cpp\.o:.* T ') || true
if [ "$count" -lt 8 ]; then
  echo "expected the instruction-set objects' entry points in $lib, found $count" >&2
  exit 1
fi
echo "instruction-set objects: $count entry points, no weak symbols"
