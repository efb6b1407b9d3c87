// NumPy .npy files: float32 (and, for integer lists, int32 / int64), little-endian, C order
// (format versions 1.0 - 3.0).
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

struct NpyIntArray {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> data;
};

NpyArray read_npy(const std::string& path);
// An integer array: '<i4' or '<i8' widened to int64, or '<f4' holding exact integers (at most
// 2^24); e.g. cu_seqlens saved by NumPy or torch.
NpyIntArray read_npy_integers(const std::string& path);
void write_npy(const std::string& path, const float* data, const std::vector<std::int64_t>& shape);
// The bytes write_npy writes (for writing several files all-or-none: write_files_atomic).
std::string npy_bytes(const float* data, const std::vector<std::int64_t>& shape);

}  // namespace ulysses
