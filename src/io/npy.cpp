// .npy: magic "\x93NUMPY", version (1.0: u16 header length; 2.0/3.0: u32), a Python-dict
// header {'descr': '<f4', 'fortran_order': False, 'shape': (...), }, padding, raw data.
#include "ulysses/io/npy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/io/output_file.hpp"

namespace ulysses {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw Error(fmt::format("{}: not a usable .npy file: {}", path, why));
}

// At most 40 characters of `text`, for error messages about hostile headers.
std::string clipped(const std::string& text) { return text.size() <= 40 ? text : text.substr(0, 37) + "..."; }

// The value of 'key' in the header dict: a (tuple), a 'string', a "string", True or False;
// "" when absent. One linear scan (no regex: a 60 000-character value overflowed its stack).
std::string dict_value(const std::string& header, const std::string& key) {
  for (const char q : {'\'', '"'}) {
    const std::size_t at = header.find(q + key + q);
    if (at == std::string::npos) continue;
    std::size_t i = header.find_first_not_of(" \t", at + key.size() + 2);
    if (i == std::string::npos || header[i] != ':') return "";
    i = header.find_first_not_of(" \t", i + 1);
    if (i == std::string::npos) return "";
    const char open = header[i];
    if (open == '(' || open == '\'' || open == '"') {
      const std::size_t end = header.find(open == '(' ? ')' : open, i + 1);
      return end == std::string::npos ? "" : header.substr(i, end + 1 - i);
    }
    for (const char* word : {"True", "False"})
      if (header.compare(i, std::strlen(word), word) == 0) return word;
    return "";
  }
  return "";
}

std::vector<std::int64_t> parse_shape(const std::string& path, const std::string& tuple) {
  std::vector<std::int64_t> shape;
  const std::string inner = tuple.substr(1, tuple.size() - 2);
  std::size_t pos = 0;
  while (pos < inner.size()) {
    std::size_t comma = inner.find(',', pos);
    std::string item = inner.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) {
      if (item.find_first_not_of("0123456789") != std::string::npos || item.size() > 15)
        bad(path, fmt::format("shape entry '{}' is not a non-negative integer", clipped(item)));
      shape.push_back(std::stoll(item));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return shape;
}

}  // namespace

namespace {

// What the header says: the shape, its element count and the dtype; `in` stands at the data.
struct NpyHeader {
  std::vector<std::int64_t> shape;
  std::int64_t count = 1;
  std::string dtype;  // the descr without its quotes, e.g. "<f4"
};

NpyHeader read_header(std::ifstream& in, const std::string& path) {
  if (!in) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  char magic[8];
  if (!in.read(magic, 8)) bad(path, "shorter than the 10-byte preamble");
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) bad(path, "missing the \\x93NUMPY magic");
  const int major = static_cast<unsigned char>(magic[6]);
  std::uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) bad(path, "truncated header length");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) bad(path, "truncated header length");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (std::uint32_t(b[3]) << 24);
  } else {
    bad(path, fmt::format("unsupported format version {}", major));
  }
  if (header_len > (1u << 20)) bad(path, fmt::format("header length {} is implausible", header_len));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) bad(path, "truncated header");
  const std::string descr = dict_value(header, "descr");
  const std::string fortran = dict_value(header, "fortran_order");
  const std::string shape_str = dict_value(header, "shape");
  if (descr.empty() || fortran.empty() || shape_str.empty()) bad(path, "header lacks descr, fortran_order or shape");
  NpyHeader h;
  h.dtype = descr.substr(1, descr.size() - 2);
  if (fortran != "False") bad(path, "Fortran order is not supported (save C-ordered arrays)");
  if (shape_str.front() != '(') bad(path, fmt::format("shape {} is not a tuple", clipped(shape_str)));
  h.shape = parse_shape(path, shape_str);
  for (std::int64_t s : h.shape)
    if (__builtin_mul_overflow(h.count, s, &h.count) || h.count > (std::int64_t(1) << 40)) bad(path, "shape too large");
  return h;
}

// Reads the header's `count` elements of `size` bytes into `data`, checking the file holds
// exactly them before allocating: a header may declare any shape.
template <typename T>
void read_data(std::ifstream& in, const std::string& path, const NpyHeader& h, std::vector<T>& data) {
  const std::int64_t bytes = h.count * std::int64_t(sizeof(T));
  const std::streamoff data_at = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff data_bytes = in.tellg() - data_at;
  in.seekg(data_at);
  if (data_bytes < bytes)
    bad(path, fmt::format("truncated data: expected {} bytes for shape ({}), found {}", bytes, fmt::join(h.shape, ", "),
                          data_bytes));
  if (data_bytes > bytes) bad(path, "trailing bytes after the data");
  data.resize(std::size_t(h.count));
  if (!in.read(reinterpret_cast<char*>(data.data()), std::streamsize(bytes))) bad(path, "read failed");
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  check_regular_input("", path);  // a device or FIFO is never read: its size bounds nothing
  std::ifstream in(path, std::ios::binary);
  const NpyHeader h = read_header(in, path);
  if (h.dtype != "<f4") bad(path, fmt::format("dtype '{}' is not little-endian float32 ('<f4')", clipped(h.dtype)));
  NpyArray a;
  a.shape = h.shape;
  read_data(in, path, h, a.data);
  return a;
}

NpyIntArray read_npy_integers(const std::string& path) {
  check_regular_input("", path);
  std::ifstream in(path, std::ios::binary);
  const NpyHeader h = read_header(in, path);
  NpyIntArray a;
  a.shape = h.shape;
  if (h.dtype == "<i8") {
    read_data(in, path, h, a.data);
  } else if (h.dtype == "<i4") {
    std::vector<std::int32_t> narrow;
    read_data(in, path, h, narrow);
    a.data.assign(narrow.begin(), narrow.end());
  } else if (h.dtype == "<f4") {
    std::vector<float> real;
    read_data(in, path, h, real);
    for (float x : real) {
      // float32 holds every integer up to 2^24 exactly; larger ones may have been rounded.
      if (x != std::floor(x) || std::abs(x) > 16777216.0f)
        bad(path, fmt::format("holds {}, not an exact integer (save it as int64)", x));
      a.data.push_back(std::int64_t(x));
    }
  } else {
    bad(path, fmt::format("dtype '{}' is not little-endian int32, int64 or float32", clipped(h.dtype)));
  }
  return a;
}

void write_npy(const std::string& path, const float* data, const std::vector<std::int64_t>& shape) {
  write_file_atomic(path, npy_bytes(data, shape));
}

std::string npy_bytes(const float* data, const std::vector<std::int64_t>& shape) {
  std::string dims;
  std::int64_t n = 1;
  for (std::int64_t s : shape) {
    dims += fmt::format("{}, ", s);
    n *= s;
  }
  if (shape.size() > 1)
    dims.resize(dims.size() - 2);
  else if (shape.size() == 1)
    dims.resize(dims.size() - 1);
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const std::uint16_t len = std::uint16_t(header.size());
  std::string bytes("\x93NUMPY\x01\x00", 8);
  bytes += char(len & 0xff);
  bytes += char(len >> 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data), std::size_t(n) * 4);
  return bytes;
}

}  // namespace ulysses
