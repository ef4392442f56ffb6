#!/bin/sh
# The integer GEMM's instruction-set files (kernels/cpu/qgemm_avx2.cpp, qgemm_avx512.cpp) compile
# their kernels for targets wider than the build's. A weak (inline or template) function compiled
# there with those instructions could be chosen by the linker for every caller and run AVX2 or
# AVX-512 code on a CPU without it. Their shared code is in anonymous namespaces and their includes
# come before the target regions, so every weak function they define (an inline function of a
# header the optimiser left out of line, as at the sanitizers' -O1) must use no ymm, zmm, mask or
# EVEX-only xmm register; this fails, naming the function, if one does. (Every CPU this project
# meets has AVX2, so the case that matters is AVX-512 code reaching an AVX2-only EPYC.)
# Usage: isa_objects_share_nothing.sh <liblp_kernels.a>
set -eu
lib="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
ar x "$lib" qgemm_avx2.cpp.o qgemm_avx512.cpp.o
entry_points=0
bad=""
for obj in qgemm_avx2.cpp.o qgemm_avx512.cpp.o; do
  entry_points=$((entry_points + $(nm --defined-only "$obj" | awk '$2 == "T"' | wc -l)))
  for sym in $(nm --defined-only "$obj" | awk '$2 == "W" { print $3 }'); do
    if objdump -d --no-show-raw-insn --disassemble="$sym" "$obj" | grep -qE '%[yz]mm|%k[1-7]|%xmm(1[6-9]|2[0-9]|3[01])'; then
      bad="$bad $obj:$(echo "$sym" | c++filt)"
    fi
  done
done
if [ -n "$bad" ]; then
  echo "weak functions with vector instructions in the instruction-set objects of $lib (see kernels/cpu/qgemm_ymm.h):$bad" >&2
  exit 1
fi
if [ "$entry_points" -lt 8 ]; then
  echo "expected the instruction-set objects' entry points in $lib, found $entry_points" >&2
  exit 1
fi
echo "instruction-set objects: $entry_points entry points, no weak function with vector instructions"
