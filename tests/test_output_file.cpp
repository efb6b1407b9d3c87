// The output layer's rules (output_file.hpp): checked before any work, atomic writes (all or
// none, the old file kept on a full disk), and the bounded reader (input_file.hpp), each
// against exact bytes on disk.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_util.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/io/output_file.hpp"

using namespace ulysses;
namespace fs = std::filesystem;
using test_util::error_of;
using test_util::scratch;
using test_util::slurp;

namespace {

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ulysses_output_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static void put(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }
  static std::string get(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // The Error check_outputs throws, or "" when it accepts.
  static std::string refusal(const std::vector<OutputSpec>& outputs, const std::vector<InputSpec>& inputs = {}) {
    try {
      check_outputs(outputs, inputs);
      return "";
    } catch (const Error& e) {
      return e.what();
    }
  }
  bool only(const std::vector<std::string>& names) const {  // the directory holds exactly these
    std::vector<std::string> have;
    for (const auto& e : fs::directory_iterator(dir_)) have.push_back(e.path().filename().string());
    std::sort(have.begin(), have.end());
    std::vector<std::string> want = names;
    std::sort(want.begin(), want.end());
    return have == want;
  }

  fs::path dir_;
};

TEST_F(OutputFileTest, RefusesAFifoADirectoryAndADeviceByName) {
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0644), 0);
  EXPECT_EQ(refusal({{"--json", path("fifo")}}),
            "--json " + path("fifo") + ": is a FIFO, not a regular file: refusing to replace it (name a regular file)");
  EXPECT_EQ(refusal({{"--json", path("fifo"), true}}), "--json " + path("fifo") +
                                                           ": is a FIFO, not a regular file: refusing to replace it "
                                                           "(name a regular file, or - for standard output)");
  fs::create_directories(path("sub"));
  EXPECT_NE(refusal({{"--out", path("sub")}}).find(": is a directory, not a regular file"), std::string::npos);
  EXPECT_THROW(write_file_atomic(path("fifo"), "x"), Error);  // the writer refuses it too, not only the check
  EXPECT_TRUE(fs::is_fifo(path("fifo")));
  if (mknod(path("full").c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) GTEST_SKIP() << "mknod needs root";
  EXPECT_NE(refusal({{"--log", path("full")}}).find("--log " + path("full") + ": is a character device"),
            std::string::npos);
  EXPECT_THROW(write_file_atomic(path("full"), "x"), Error);
  struct stat st {};
  ASSERT_EQ(stat(path("full").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(1, 7));
}

TEST_F(OutputFileTest, WritesThroughASymlinkAndKeepsIt) {
  put(path("target"), "old");
  fs::create_symlink("target", path("link"));
  fs::create_symlink("link", path("link2"));  // a chain resolves to its end
  EXPECT_EQ(output_target(path("link2")), path("target"));
  EXPECT_EQ(refusal({{"--out", path("link2")}}), "");
  write_file_atomic(path("link2"), "new");
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_TRUE(fs::is_symlink(path("link2")));
  EXPECT_EQ(get(path("target")), "new");
  fs::create_symlink("missing", path("dangling"));  // written through: the target is created
  write_file_atomic(path("dangling"), "made");
  EXPECT_TRUE(fs::is_symlink(path("dangling")));
  EXPECT_EQ(get(path("missing")), "made");
  fs::create_symlink("loop", path("loop"));
  EXPECT_THROW(output_target(path("loop")), Error);
  EXPECT_TRUE(only({"target", "link", "link2", "dangling", "missing", "loop"}));
}

TEST_F(OutputFileTest, KeepsTheTargetsPermissions) {
  put(path("script"), "old");
  fs::permissions(path("script"), fs::perms::owner_all | fs::perms::group_read);
  write_file_atomic(path("script"), "new");
  EXPECT_EQ(fs::status(path("script")).permissions(), fs::perms::owner_all | fs::perms::group_read);
}

TEST_F(OutputFileTest, RefusesOneFileNamedTwiceByAnySpelling) {
  EXPECT_EQ(refusal({{"--out", path("x")}, {"--trace", path("x")}}),
            "--trace " + path("x") + ": the same file as --out " + path("x") + " (named for two outputs)");
  EXPECT_NE(refusal({{"--out", path("x")}, {"--trace", (dir_ / "." / "x").string()}}), "");  // not yet existing
  put(path("a"), "a");
  fs::create_hard_link(path("a"), path("b"));
  EXPECT_NE(refusal({{"--log", path("a")}, {"--svg", path("b")}}).find("named for two outputs"), std::string::npos);
  fs::create_symlink("a", path("c"));
  EXPECT_NE(refusal({{"--log", path("a")}, {"--svg", path("c")}}).find("named for two outputs"), std::string::npos);
  EXPECT_EQ(refusal({{"--log", path("a")}, {"--svg", path("d")}, {"--trace", ""}}), "");
}

TEST_F(OutputFileTest, RefusesAnInputAsAnOutputUnlessItMayReplaceIt) {
  put(path("corpus.txt"), "text");
  EXPECT_EQ(refusal({{"--log", path("corpus.txt")}}, {{"--data", path("corpus.txt")}}),
            "--log " + path("corpus.txt") + ": the same file as the input --data " + path("corpus.txt") +
                ": refusing to overwrite an input");
  EXPECT_NE(refusal({{"--out", (dir_ / "sub" / ".." / "corpus.txt").string()}}, {{"--q", path("corpus.txt")}}), "");
  EXPECT_EQ(refusal({{"--save", path("corpus.txt"), false, true, "--resume"}}, {{"--resume", path("corpus.txt")}}), "");
  EXPECT_EQ(get(path("corpus.txt")), "text");
  EXPECT_EQ(refusal({{"--out", path("other")}}, {{"--data", path("corpus.txt")}, {"--cu-seqlens", ""}}), "");
}

TEST_F(OutputFileTest, StandardOutputOnlyWhereAccepted) {
  EXPECT_EQ(refusal({{"--json", "-", true}}), "");
  EXPECT_EQ(refusal({{"--svg", "-"}}),
            "--svg -: --svg cannot go to standard output; name a file (./- for a file named '-')");
  EXPECT_NE(refusal({{"--json", "-", true}, {"--trace", "-", true}}).find("named for two outputs"), std::string::npos);
}

TEST_F(OutputFileTest, ChecksTheDirectoryBeforeAnyWork) {
  EXPECT_EQ(refusal({{"--trace", path("missing/t.json")}}),
            "--trace " + path("missing/t.json") + ": cannot write here: No such file or directory");
  EXPECT_EQ(refusal({{"--save", path("new/deeper/checkpoint.bin"), false, true}}), "");  // its writer makes the folders
  put(path("file"), "x");
  EXPECT_NE(refusal({{"--save", path("file/checkpoint.bin"), false, true}}).find("is not a directory"),
            std::string::npos);
  EXPECT_TRUE(only({"file"}));  // the checks leave nothing behind
}

TEST_F(OutputFileTest, AllOrNone) {
  put(path("a"), "old a");
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0644), 0);
  EXPECT_THROW(write_files_atomic({{path("a"), "new a"}, {path("fifo"), "x"}}), Error);
  EXPECT_EQ(get(path("a")), "old a");
  EXPECT_THROW(write_files_atomic({{path("a"), "new a"}, {path("missing/b"), "b"}}), Error);
  EXPECT_EQ(get(path("a")), "old a");
  EXPECT_TRUE(only({"a", "fifo"}));
  write_files_atomic({{path("a"), "new a"}, {path("b"), "b"}});
  EXPECT_EQ(get(path("a")), "new a");
  EXPECT_EQ(get(path("b")), "b");
}

TEST_F(OutputFileTest, AppendFileCutsToKeepAndAppends) {
  put(path("log"), "line 1\nline 2\nline 3\n");
  {
    AppendFile log("--log", path("log"), 14);
    log.append("again 3\n");
    log.close();
  }
  EXPECT_EQ(get(path("log")), "line 1\nline 2\nagain 3\n");
  {
    AppendFile log("--log", path("log"), 1000);  // more than it holds: all of it kept
    log.append("4\n");
  }
  EXPECT_EQ(get(path("log")), "line 1\nline 2\nagain 3\n4\n");
  fs::create_symlink("log", path("link"));
  {
    AppendFile log("--log", path("link"), 0);
    log.append("fresh\n");
    log.close();
  }
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_EQ(get(path("log")), "fresh\n");
  {
    AppendFile log("--log", path("log"), 0);  // a replacement: the old file stays until a line is whole
    EXPECT_EQ(get(path("log")), "fresh\n");
  }
  EXPECT_EQ(get(path("log")), "fresh\n");
  EXPECT_TRUE(only({"log", "link"}));  // no temp file left
  {
    AppendFile log("--log", path("log"), 0);
    log.append("first\n");
    EXPECT_EQ(get(path("log")), "first\n");
    log.append("second\n");
  }
  EXPECT_EQ(get(path("log")), "first\nsecond\n");
  EXPECT_THROW(AppendFile("--log", path("missing/log"), 0), Error);
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0644), 0);  // refused at once, not waiting for a reader
  EXPECT_THROW(AppendFile("--log", path("fifo"), 0), Error);
}

TEST_F(OutputFileTest, ReadsOnlyRegularFilesWithinTheirBound) {
  put(path("text"), "0123456789");
  EXPECT_EQ(read_input_file("--data", path("text"), 10, "the cap"), "0123456789");
  try {
    read_input_file("--data", path("text"), 9, "the memory available (MemAvailable)");
    ADD_FAILURE() << "read past its bound";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--data " + path("text") + ": is 10 bytes, more than the memory available (MemAvailable) (9 bytes)");
  }
  try {
    read_input_file("--data", "/dev/zero", 1 << 20, "the cap");
    ADD_FAILURE() << "read /dev/zero";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--data /dev/zero: is a character device, not a regular file: refusing to read it");
  }
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0644), 0);  // no writer: opening it would wait forever
  EXPECT_THROW(read_input_file("--cu-seqlens", path("fifo"), 100, "the cap"), Error);
  EXPECT_THROW(check_regular_input("", path("fifo")), Error);
  EXPECT_THROW(read_input_file("--data", path("missing"), 100, "the cap"), Error);
  EXPECT_THROW(read_input_file("--data", dir_.string(), 100, "the cap"), Error);
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

}  // namespace
