#include "ulysses/io/input_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "ulysses/core/error.hpp"

namespace ulysses {

namespace {

std::string named(const std::string& flag, const std::string& path) { return flag.empty() ? path : flag + " " + path; }

void require_regular(const std::string& flag, const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode))
    throw Error(
        fmt::format("{}: is {}, not a regular file: refusing to read it", named(flag, path), file_kind(st.st_mode)));
}

}  // namespace

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

void check_regular_input(const std::string& flag, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(fmt::format("{}: cannot open: {}", named(flag, path), std::strerror(errno)));
  require_regular(flag, path, st);
}

std::string read_input_file(const std::string& flag, const std::string& path, std::int64_t max_bytes,
                            const std::string& limit_what) {
  check_regular_input(flag, path);  // before open: opening a FIFO would wait for a writer
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(fmt::format("{}: cannot open: {}", named(flag, path), std::strerror(errno)));
  std::string bytes;
  int err = 0;
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) err = errno;
    if (!err) require_regular(flag, path, st);  // it may have been replaced since the check
    if (!err && st.st_size > max_bytes)
      throw Error(fmt::format("{}: is {} bytes, more than {} ({} bytes)", named(flag, path), st.st_size, limit_what,
                              max_bytes));
    if (!err) bytes.resize(std::size_t(st.st_size));
    std::size_t done = 0;
    while (!err && done < bytes.size()) {  // a file that shrank meanwhile ends early
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno != EINTR) err = errno;
      if (n == 0) break;
      if (n > 0) done += std::size_t(n);
    }
    bytes.resize(done);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (err) throw Error(fmt::format("{}: read failed: {}", named(flag, path), std::strerror(err)));
  return bytes;
}

namespace {

// What this process's cgroup (v2, else v1) still allows: its limit less its usage; -1 when there
// is no limit (a container's MemAvailable is the host's, so the cgroup's limit is what binds).
std::int64_t cgroup_headroom_bytes() {
  auto read = [](const char* path) -> std::int64_t {
    std::ifstream f(path);
    std::string text;
    if (!(f >> text) || text == "max") return -1;
    try {
      return std::stoll(text);
    } catch (const std::exception&) {
      return -1;
    }
  };
  for (const auto& [limit, usage] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const std::int64_t l = read(limit), u = read(usage);
    if (l > 0 && l < (std::int64_t(1) << 60) && u >= 0) return std::max<std::int64_t>(0, l - u);
  }
  return -1;
}

}  // namespace

std::int64_t available_memory_bytes() {
  if (const char* env = std::getenv("ULYSSES_MEM_AVAILABLE")) return std::atoll(env);
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0, available = -1;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  const std::int64_t cgroup = cgroup_headroom_bytes();
  if (cgroup >= 0 && (available < 0 || cgroup < available)) return cgroup;
  return available;
}

std::string read_input_within_memory(const std::string& flag, const std::string& path) {
  const std::int64_t available = available_memory_bytes();
  return read_input_file(flag, path, available < 0 ? std::numeric_limits<std::int64_t>::max() : available,
                         "the memory available (MemAvailable)");
}

}  // namespace ulysses
