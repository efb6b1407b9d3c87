// A scratch buffer for one thread (thread_local), for the engines' copies of their operands.
// Not a std::vector: the engines' objects are compiled with their instruction set's flags, and
// a standard template instantiated there would be a weak symbol the linker may pick for code
// that runs on any CPU (tests/isa_symbols_test.sh). Internal linkage, for the same reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace ulysses::kernels {
namespace {

// 64-byte aligned, grown on demand in steps of 64 KiB and never shrunk.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { ::operator delete(data_, kAlign); }

  template <class T>
  T* get(std::int64_t count) {
    const std::size_t bytes = std::size_t(count) * sizeof(T);
    if (bytes > size_) {
      ::operator delete(data_, kAlign);
      data_ = nullptr;
      size_ = std::size_t((std::int64_t(bytes) + kGrain - 1) / kGrain * kGrain);
      data_ = ::operator new(size_, kAlign);
    }
    return static_cast<T*>(data_);
  }

 private:
  static constexpr std::align_val_t kAlign{64};
  static constexpr std::int64_t kGrain = 64 << 10;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace
}  // namespace ulysses::kernels
