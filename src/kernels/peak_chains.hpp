// The shape every vector probe loop of peak_loops.hpp shares, written once: kChains independent
// accumulators, each updated `iters` times, then added up. Included only by the ISA units, each
// instantiating it with its own vector type and intrinsics (lambdas: local types, so no
// instantiation is shared between units compiled with different ISA flags).
#pragma once

#include <cstdint>

#include "peak_loops.hpp"

namespace ulysses::kernels::peak_loops {

// init(c) is chain c's start, step(acc) one round's update of a chain, add(a, b) the sum.
template <class Vec, class Init, class Step, class Add>
Vec run_chains(std::int64_t iters, Init init, Step step, Add add) {
  Vec acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = init(c);
  for (std::int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = step(acc[c]);
  Vec s = acc[0];
  for (int c = 1; c < kChains; ++c) s = add(s, acc[c]);
  return s;
}

}  // namespace ulysses::kernels::peak_loops
