#!/bin/sh
# The integer GEMM's instruction-set files (kernels/cpu/qgemm_avx2.cpp, qgemm_avx512.cpp) compile
# their kernels for targets wider than the build's. A weak (inline or template) function compiled
# there with those instructions could be chosen by the linker over the copies other files made for
# the build's own target, and run AVX-512 code on an AVX2-only CPU. Their shared code is in
# anonymous namespaces and their includes come before the target regions, so a weak function they
# define (an inline function of a header the optimiser left out of line, as at the sanitizers'
# -O1) is compiled for the build's target like every other copy. This fails, naming it, when such
# a function uses a ymm, zmm, mask or EVEX-only xmm register and its instructions differ from
# another object's copy of it (on a -march=native AVX-512 build every copy may use zmm alike).
# Usage: isa_objects_share_nothing.sh <liblp_kernels.a>
set -eu
lib="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
ar x "$lib"
# The instructions of function $2 in object $1, without addresses, bytes or relocation offsets.
code() {
  objdump -d --no-show-raw-insn --disassemble="$2" "$1" | awk -F'\t' '/^ *[0-9a-f]+:\t/ { print $2 }' |
    sed -E 's/[0-9a-f]+ <[^>]*>/<target>/g'
}
entry_points=0
bad=""
for obj in qgemm_avx2.cpp.o qgemm_avx512.cpp.o; do
  entry_points=$((entry_points + $(nm --defined-only "$obj" | awk '$2 == "T"' | wc -l)))
  for sym in $(nm --defined-only "$obj" | awk '$2 == "W" { print $3 }'); do
    code "$obj" "$sym" > mine.s
    grep -qE '%[yz]mm|%k[1-7]|%xmm(1[6-9]|2[0-9]|3[01])' mine.s || continue
    for other in *.o; do
      [ "$other" = "$obj" ] && continue
      nm --defined-only "$other" 2>/dev/null | awk '$2 == "W" { print $3 }' | grep -qxF "$sym" || continue
      code "$other" "$sym" > theirs.s
      cmp -s mine.s theirs.s || bad="$bad $obj:$(echo "$sym" | c++filt) (differs from $other's)"
    done
  done
done
if [ -n "$bad" ]; then
  echo "weak functions with wide registers in the instruction-set objects of $lib, unlike other copies (see kernels/cpu/qgemm_ymm.h):$bad" >&2
  exit 1
fi
if [ "$entry_points" -lt 8 ]; then
  echo "expected the instruction-set objects' entry points in $lib, found $entry_points" >&2
  exit 1
fi
echo "instruction-set objects: $entry_points entry points, no weak function wider than its other copies"
