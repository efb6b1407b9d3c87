// libFuzzer target: the checkpoint reader (Trainer::checkpoint_config) on arbitrary files must
// return or throw ulysses::Error. Inputs whose first byte is even are written as they are; odd
// ones are the header text of a file this harness completes and signs (magic, lengths, zeroed
// parameters, FNV-1a), so the fuzzer reaches the header's fields past the checksum.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "train/trainer.hpp"
#include "ulysses/core/error.hpp"

namespace {

std::string signed_file(const std::string& header, std::uint64_t n) {
  auto put = [](std::string& s, std::uint64_t x) { s.append(reinterpret_cast<const char*>(&x), 8); };
  std::string s("ULYCKPT1", 8);
  put(s, header.size());
  s += header;
  put(s, n);
  s.append(12 * n, '\0');
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ std::uint8_t(c)) * 0x100000001b3ull;
  put(s, h);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string dir = "/tmp/ulysses_fuzz_ckpt_" + std::to_string(getpid());
  static const bool made = std::filesystem::create_directories(dir) || true;
  (void)made;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (size >= 3 && (data[0] & 1)) {  // [odd byte][u16 parameter count][header text]
    const std::uint64_t n = std::uint64_t(data[1]) | (std::uint64_t(data[2]) << 8);
    bytes = signed_file(bytes.substr(3), n);
  }
  std::ofstream(dir + "/checkpoint.bin", std::ios::binary | std::ios::trunc) << bytes;
  try {
    ulysses::train::Trainer::checkpoint_config(dir);
  } catch (const ulysses::Error&) {
  }
  return 0;
}
