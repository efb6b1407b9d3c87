// libFuzzer target: the CLI's value parsers (bandwidths like 450GB/s, latencies like 2us,
// --strategy with --cp-sizes INNER,OUTER, dtypes and layouts) on arbitrary text must return a
// value or throw ulysses::Error. The first byte picks the parser.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "options.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/core/tensor.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    switch (data[0] % 5) {
      case 0:
        if (!(ulysses::parse_bandwidth(text) > 0)) __builtin_trap();  // accepted means positive
        break;
      case 1:
        if (!(ulysses::parse_latency(text) >= 0)) __builtin_trap();
        break;
      case 2: {
        const std::size_t comma = text.find('\n');
        const ulysses::CpConfig c =
            ulysses::cli::parse_strategy(text.substr(0, comma),
                                         {{"cp-sizes", comma == std::string::npos ? "" : text.substr(comma + 1)}}, 4);
        for (int s : c.hierarchical_context_parallel_sizes)
          if (s < 1) __builtin_trap();
        break;
      }
      case 3: ulysses::parse_dtype(text); break;
      default: ulysses::parse_layout(text);
    }
  } catch (const ulysses::Error&) {
  }
  return 0;
}
