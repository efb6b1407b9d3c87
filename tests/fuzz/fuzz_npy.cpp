// libFuzzer target: read_npy and read_npy_integers on arbitrary bytes must return or throw
// ulysses::Error, nothing else.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "ulysses/core/error.hpp"
#include "ulysses/io/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/ulysses_fuzz_npy_" + std::to_string(getpid()) + ".npy";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  try {
    const ulysses::NpyArray a = ulysses::read_npy(path);
    std::size_t n = 1;
    for (std::int64_t s : a.shape) n *= std::size_t(s);
    if (n != a.data.size()) __builtin_trap();  // the shape must describe the data read
  } catch (const ulysses::Error&) {
  }
  try {
    const ulysses::NpyIntArray a = ulysses::read_npy_integers(path);
    std::size_t n = 1;
    for (std::int64_t s : a.shape) n *= std::size_t(s);
    if (n != a.data.size()) __builtin_trap();
  } catch (const ulysses::Error&) {
  }
  return 0;
}
