// Hostile sizes and files: overflow-checked shapes, the .npy reader's
// bounds, atomic files (errno, stale temp files, all-or-none), the planner's bounds, sharding
// at cp near 2^31, and the search for non-finite values.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>

#include "ulysses/output_file.hpp"
#include "ulysses/checked.hpp"
#include "ulysses/error.hpp"
#include "ulysses/npy.hpp"
#include "ulysses/planner.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses/tensor.hpp"

using namespace ulysses;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("ulysses_hardening_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A .npy file of `total` bytes whose header declares `shape` (a tuple's text) and `descr`.
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

TEST(Checked, ProductsThatOverflowAreErrors) {
  EXPECT_EQ(checked_product({4, 1 << 20, 2, 4}, "x"), std::int64_t(32) << 20);
  EXPECT_NE(error_of([] { checked_product({4, 1152921504606846978, 2, 4}, "q"); }).find("q: "), std::string::npos);
  EXPECT_NE(error_of([] { checked_mul(-1, 2, "q"); }).find("negative"), std::string::npos);
  // Both overflow reproducers' shapes are refused, not wrapped.
  EXPECT_EQ(error_of([] {
              (void)Shape{4, 1152921504606846978, 2, 4}.numel();
            }),
            "tensor shape [4, 1152921504606846978, 2, 4] is too large: more than 2^56 elements");
  EXPECT_NE(error_of([] { (void)Shape{1, 4611686018427387904, 8, 64}.numel(); }).find("too large"), std::string::npos);
  EXPECT_NE(error_of([] { Tensor t(Shape{1, 1ll << 50, 64, 64}); }).find("too large"), std::string::npos);
  EXPECT_NE(error_of([] { Tensor t(Shape{1, -3, 2, 2}); }).find("negative"), std::string::npos);
  EXPECT_EQ((Shape{2, 3, 4, 5}.numel()), 120);
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

TEST(AtomicFile, ErrorsNameTheReason) {
  const std::string e = error_of([] { write_file_atomic("/nonexistent_dir_ulysses/x", "abc"); });
  EXPECT_NE(e.find("No such file or directory"), std::string::npos) << e;
  const auto check = [](const std::string& p) { check_outputs({{"--out", p}}); };
  EXPECT_NE(error_of([&] { check("/nonexistent_dir_ulysses/x"); }).find("cannot write here"), std::string::npos);
  EXPECT_NE(error_of([&] { check("/tmp"); }).find("is a directory"), std::string::npos);
  const std::string ok = scratch("writable");
  EXPECT_EQ(error_of([&] { check(ok); }), "");
  EXPECT_FALSE(fs::exists(ok));
}

TEST(AtomicFile, TempFilesOfDeadWritersAreRemoved) {
  std::int64_t pid_max = 0;  // pid_max + 1 is never a live process
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  ASSERT_GT(pid_max, 0);
  const std::string path = scratch("stale.txt");
  const std::string dead = path + ".tmp." + std::to_string(pid_max + 1), alive = path + ".tmp.1";
  std::ofstream(dead) << "half";
  std::ofstream(alive) << "someone else";
  write_file_atomic(path, "whole");
  EXPECT_EQ(slurp(path), "whole");
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));  // pid 1 is alive: its writer may still be at work
  fs::remove(alive);
}

TEST(AtomicFile, SeveralFilesAreWrittenAllOrNone) {
  const std::string a = scratch("a.txt"), b = scratch("b.txt");
  EXPECT_NE(error_of([&] { write_files_atomic({{a, "A"}, {"/nonexistent_dir_ulysses/b", "B"}}); }), "");
  EXPECT_FALSE(fs::exists(a));
  EXPECT_FALSE(fs::exists(a + ".tmp." + std::to_string(getpid())));
  write_files_atomic({{a, "A"}, {b, "B"}});
  EXPECT_EQ(slurp(a) + slurp(b), "AB");
}

TEST(AtomicFile, FullDiskKeepsTheOldFileAndNamesErrno) {
  const std::string dir = scratch("tmpfs");
  fs::create_directories(dir);
  if (getuid() != 0 || mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0)
    GTEST_SKIP() << "cannot mount a 64 KiB tmpfs here (needs root): the full-disk case is not tested";
  const std::string path = dir + "/out.bin";
  write_file_atomic(path, "old");
  const std::string e = error_of([&] { write_file_atomic(path, std::string(1 << 20, 'x')); });
  EXPECT_NE(e.find(path + ": write failed: No space left on device"), std::string::npos) << e;
  EXPECT_EQ(slurp(path), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);  // no temp file left
  umount(dir.c_str());
}

TEST(NonFinite, TheFirstBadElementIsNamed) {
  Tensor t(Shape{1, 3, 2, 4});
  EXPECT_EQ(nonfinite_error("q", t.view()), "");
  t.f32()[1 * 8 + 1 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();
  t.f32()[2 * 8] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(nonfinite_error("q", t.view()), "q has a non-finite value (nan) at [0, 1, 1, 2]");
}

TEST(PlannerBounds, HugeSizesAndRankCountsAreRefused) {
  PlanInput in;
  in.seq = 288230376151711744;  // 2^58: s *= 2 used to overflow in the SVG's loop
  in.heads = in.kv_heads = 8;
  EXPECT_NE(plan_input_error(in).find("too large to plan"), std::string::npos);
  EXPECT_THROW(make_plan(in), Error);
  in.seq = 1024;
  in.cp = 2000000000;
  EXPECT_EQ(plan_input_error(in), "cp must be at most 65536, got 2000000000");
  in.cp = 8;
  in.heads = in.kv_heads = 2147483647;  // near 2^31: the byte counts fit int64
  in.head_dim = 128;
  EXPECT_EQ(plan_input_error(in), "");
  const Plan p = make_plan(in);
  for (const PlanRow& r : p.rows)
    if (r.valid) EXPECT_GT(r.forward_bytes_per_rank, 0) << r.name;
}

TEST(PlannerBounds, UnitsThatOverflowOrUnderflowAreRefused) {
  EXPECT_EQ(parse_bandwidth("450GB/s"), 450e9);
  EXPECT_NE(error_of([] { parse_bandwidth("1e308TB/s"); }).find("must be positive and finite"), std::string::npos);
  EXPECT_THROW(parse_latency("1e-320ns"), Error);  // underflows
  const std::string e = error_of([] { parse_latency(std::string(5000, '9') + "parsecs"); });
  EXPECT_LT(e.size(), 300u) << e;  // the text is clipped, not echoed whole
}

TEST(ShardingBounds, ZigzagAtTwoBillionRanksDoesNotWrap) {
  const CpConfig ring{"p2p", {}, true, std::nullopt};
  const int cp = 1500000000;  // 2 * cp overflows int
  const std::int64_t seq = 6000000000;
  const auto c = rank_chunks(ring, cp, cp - 1, seq);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].begin, 2 * std::int64_t(cp - 1));
  EXPECT_EQ(c[1].begin, 2 * std::int64_t(cp));
  EXPECT_EQ(c[0].length + c[1].length, 4);
  EXPECT_EQ(tokens_held(ring, cp, 0, cp, seq), seq);
  EXPECT_NE(error_of([&] { rank_chunks(ring, cp, 0, 5); }).find("must be at least 2*cp (3000000000)"),
            std::string::npos);
}

}  // namespace
