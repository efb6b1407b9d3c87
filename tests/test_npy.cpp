// .npy reader/writer: round trip, and every kind of malformed file rejected with a reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "ulysses/error.hpp"
#include "ulysses/npy.hpp"

using namespace ulysses;

namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/ulysses_test_" + std::to_string(getpid()) + "_" + name;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string header(const std::string& dict) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out += char(h.size() & 0xff);
  out += char(h.size() >> 8);
  return out + h;
}

void expect_rejected(const std::string& bytes, const std::string& reason) {
  const std::string path = temp_path("bad.npy");
  write_raw(path, bytes);
  try {
    read_npy(path);
    ADD_FAILURE() << "accepted a file that should fail with: " << reason;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(Npy, RoundTrip) {
  const std::string path = temp_path("rt.npy");
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

}  // namespace
