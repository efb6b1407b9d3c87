// NumPy .npy files: float32, little-endian, C order (format versions 1.0 - 3.0).
//
// The reader rejects anything else with an Error naming the file and the problem (wrong
// magic, unsupported dtype, Fortran order, truncated data, trailing garbage). The writer is
// atomic: it writes "<path>.tmp.<pid>" and renames it over <path>, so a failure never leaves
// a partial file behind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ulysses {

struct NpyArray {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

NpyArray read_npy(const std::string& path);
void write_npy(const std::string& path, const float* data, const std::vector<std::int64_t>& shape);
// The bytes write_npy writes (for writing several files all-or-none: write_files_atomic).
std::string npy_bytes(const float* data, const std::vector<std::int64_t>& shape);

}  // namespace ulysses
