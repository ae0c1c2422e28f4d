#!/usr/bin/env bash
# The AVX2 kernels (engine/simd/avx2.cpp) are compiled with -mavx2 -mfma, and the
# rest of the library without. A function that both define under the same name
# (an inline function or a template instantiated in both) is kept once by the
# linker, which may keep the AVX2 build of it for every caller: a portable
# program would then stop with an illegal instruction on a CPU without AVX2.
# This checks that every function the AVX2 archive defines for others to use
# has the AVX2 instruction set in its name (a Kernels<fma3<avx2>> member, an
# xsimd kernel for that arch, or the avx2<T>() tables), or is data.
#   check_simd_objects.sh ARCHIVE_OR_OBJECT...
set -u
[ $# -ge 1 ] || { echo "usage: $0 ARCHIVE_OR_OBJECT..." >&2; exit 2; }
command -v nm >/dev/null || { echo "nm not found (binutils)"; exit 1; }
bad=0 seen=0
while read -r type name; do
  seen=$((seen + 1))
  case $name in
    *avx2*) ;;
    DW.ref.__gxx_personality_v0) ;;  # a data word: the address of the C++ exception personality, the same everywhere
    *) echo "shared with the baseline build: [$type] $name"; bad=$((bad + 1)) ;;
  esac
done < <(nm --defined-only -C "$@" | sed -n 's/^[0-9a-f]* \([TWVuDBRi]\) \(.*\)$/\1 \2/p')
if ((seen == 0)); then echo "no symbols read from $*"; exit 1; fi
if ((bad)); then
  echo "$bad of $seen global symbols of the AVX2 kernels could replace a baseline one at link time"
  exit 1
fi
echo "the AVX2 kernels' $seen global symbols all name the AVX2 instruction set"
