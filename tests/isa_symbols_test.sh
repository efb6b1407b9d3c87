#!/usr/bin/env bash
# Objects compiled with -mavx512f / -mamx-* must not define weak (COMDAT) symbols: an inline
# function or template instantiated there (say std::fill_n) could be the copy the linker keeps
# for the whole library, and baseline code would then run AVX-512 instructions on a CPU
# without them. Everything in those files stays in an anonymous namespace or is inlined.
set -euo pipefail
status=0
for obj in "$@"; do
  weak=$(nm -C "$obj" | grep -E ' [WVu] ' || true)
  if [ -n "$weak" ]; then
    echo "FAIL: $obj defines weak symbols:"
    echo "$weak"
    status=1
  fi
done
[ $status -eq 0 ] && echo "OK: $# ISA-specific objects, no weak symbols"
exit $status
