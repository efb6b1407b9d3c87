// .npy reader/writer: round trip, and every kind of malformed or hostile file (a declared shape
// bigger than the file, a huge descr) rejected with a reason, before allocating.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <vector>

#include "test_util.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/npy.hpp"

using namespace ulysses;
using test_util::error_of;
using test_util::scratch;

namespace {

std::string header(const std::string& dict) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out += char(h.size() & 0xff);
  out += char(h.size() >> 8);
  return out + h;
}

// A version-2 .npy file of `total` bytes whose header declares `shape` (a tuple's text) and
// `descr`: hostile headers the writer never makes.
std::string npy_with(const std::string& descr, const std::string& shape, std::size_t total) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = std::string("\x93NUMPY\x02\x00", 8);
  for (int i = 0; i < 4; ++i) out += char((h.size() >> (8 * i)) & 0xff);
  out += h;
  out.resize(std::max(out.size(), total), '\0');
  return out;
}

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = scratch(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// `read` (read_npy or read_npy_integers) refuses a file of `bytes` with `reason`.
template <class Read>
void expect_rejected(const std::string& bytes, const std::string& reason, Read read) {
  const std::string path = write_temp("bad.npy", bytes);
  const std::string e = error_of([&] { read(path); });
  EXPECT_NE(e.find(reason), std::string::npos) << (e.empty() ? "accepted a file that should fail with: " + reason : e);
  std::remove(path.c_str());
}
void expect_rejected(const std::string& bytes, const std::string& reason) { expect_rejected(bytes, reason, read_npy); }

TEST(Npy, RoundTrip) {
  const std::string path = scratch("rt.npy");
  std::vector<float> data(2 * 3 * 4);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = float(i) * 0.5f - 3.0f;
  write_npy(path, data.data(), {2, 3, 4});
  NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_EQ(a.data, data);
  std::remove(path.c_str());
}

TEST(Npy, RejectsMalformedFiles) {
  const std::string f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string body(24, '\0');
  expect_rejected("", "shorter than");
  expect_rejected("GARBAGE!!!!!!!!!!!", "magic");
  expect_rejected(header(f4) + body.substr(0, 20), "truncated data");
  expect_rejected(header(f4) + body + "x", "trailing bytes");
  expect_rejected(header("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }") + body + body, "'<f4'");
  expect_rejected(header("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }") + body, "'<f4'");
  expect_rejected(header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }") + body, "Fortran");
  expect_rejected(header("{'descr': '<f4', 'shape': (2, 3), }") + body, "lacks");
  expect_rejected(header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }") + body, "shape entry");
  expect_rejected(std::string("\x93NUMPY\x01\x00\xff", 9), "truncated header length");
  expect_rejected(std::string("\x93NUMPY\x01\x00\x40\x00{'descr'", 17), "truncated header");
}

TEST(Npy, MissingFileNamesThePath) {
  try {
    read_npy("/nonexistent/dir/q.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/q.npy: cannot open"), std::string::npos);
  }
}

TEST(Npy, FailedWriteLeavesNoFile) {
  std::vector<float> x(4);
  EXPECT_THROW(write_npy("/nonexistent/dir/out.npy", x.data(), {4}), Error);
}

TEST(Npy, IntegerArraysAreWidenedToInt64) {
  const std::int32_t i4[] = {0, 7, -3, 2147483647};
  std::string path = write_temp("ints.npy", header("{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }") +
                                                std::string(reinterpret_cast<const char*>(i4), sizeof(i4)));
  EXPECT_EQ(read_npy_integers(path).data, (std::vector<std::int64_t>{0, 7, -3, 2147483647}));
  const std::int64_t i8[] = {0, std::int64_t(1) << 40};
  path = write_temp("ints.npy", header("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }") +
                                    std::string(reinterpret_cast<const char*>(i8), sizeof(i8)));
  const NpyIntArray a = read_npy_integers(path);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(a.data, (std::vector<std::int64_t>{0, std::int64_t(1) << 40}));
  const float f4[] = {0.0f, 16.0f};  // float32 holding exact integers, as before
  path = write_temp("ints.npy", header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }") +
                                    std::string(reinterpret_cast<const char*>(f4), sizeof(f4)));
  EXPECT_EQ(read_npy_integers(path).data, (std::vector<std::int64_t>{0, 16}));
  std::remove(path.c_str());
}

TEST(Npy, IntegerReaderRefusesOtherDtypesAndFractions) {
  auto refused = [](const std::string& bytes, const std::string& reason) {
    expect_rejected(bytes, reason, read_npy_integers);
  };
  refused(header("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }") + std::string(3, '\0'),
          "dtype '|u1' is not little-endian int32, int64 or float32");
  const float half = 0.5f;
  refused(header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }") +
              std::string(reinterpret_cast<const char*>(&half), 4),
          "holds 0.5, not an exact integer");
  refused(header("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }") + std::string(12, '\0'),
          "truncated data: expected 16 bytes");
}

TEST(NpyHostile, DeclaredShapeBiggerThanTheFileIsRefusedBeforeAllocating) {
  // Defect 2: 192 bytes declaring 2^36 x 16 floats, and 2^32 floats (16 GiB).
  const std::string a = write_temp("big1.npy", npy_with("<f4", "(1, 68719476736, 4, 4)", 192));
  EXPECT_NE(error_of([&] { read_npy(a); }).find("truncated data: expected 4398046511104 bytes"), std::string::npos);
  const std::string huge = write_temp("big3.npy", npy_with("<f4", "(1, 68719476736, 4, 8)", 192));
  EXPECT_NE(error_of([&] { read_npy(huge); }).find("shape too large"), std::string::npos);
  const std::string b = write_temp("big2.npy", npy_with("<f4", "(1, 4294967296, 1, 1)", 192));
  const std::string e = error_of([&] { read_npy(b); });
  EXPECT_NE(e.find("truncated data: expected 17179869184 bytes for shape (1, 4294967296, 1, 1), found "),
            std::string::npos)
      << e;
  const std::string c = write_temp("pad.npy", npy_with("<f4", "(1, 2)", 128 + 12));
  EXPECT_NE(error_of([&] { read_npy(c); }).find("trailing bytes"), std::string::npos);
}

TEST(NpyHostile, HugeDescrIsRefusedBrieflyWithoutRegex) {
  // Defect 3: a 60 000-character descr crashed std::regex; the error echoed all of it.
  const std::string path = write_temp("descr.npy", npy_with(std::string(60000, 'x'), "(1,)", 0));
  const std::string e = error_of([&] { read_npy(path); });
  EXPECT_NE(e.find("is not little-endian float32"), std::string::npos);
  EXPECT_LT(e.size(), 200u + path.size()) << e.size();
  const std::string shape = write_temp("shape.npy", npy_with("<f4", "'12'", 0));
  EXPECT_NE(error_of([&] { read_npy(shape); }).find("is not a tuple"), std::string::npos);
}

TEST(NpyHostile, GoodFilesStillRoundTrip) {
  const std::string path = scratch("ok.npy");
  const float data[6] = {1, 2, 3, 4, 5, 6};
  write_npy(path, data, {2, 3});
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.data, std::vector<float>(data, data + 6));
}

}  // namespace
