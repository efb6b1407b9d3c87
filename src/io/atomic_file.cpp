#include "ulysses/atomic_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ulysses/error.hpp"

namespace ulysses {

namespace {

std::string temp_name(const std::string& path) { return fmt::format("{}.tmp.{}", path, getpid()); }

// Removes "<path>.tmp.<pid>" files whose writer is gone (kill(pid, 0) says no such process).
void remove_stale_temps(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = pid_t(std::atol(digits.c_str()));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) fs::remove(entry.path(), ec);
  }
}

// Writes `bytes` to `tmp` and flushes them to disk. Throws Error naming `path`.
void write_synced(const std::string& tmp, const std::string& path, std::string_view bytes) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  std::size_t done = 0;
  int err = 0;
  while (done < bytes.size() && !err) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) done += std::size_t(n);
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: write failed: {}", path, std::strerror(err)));
  }
}

void rename_into_place(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: cannot rename {} into place: {}", path, tmp, std::strerror(e)));
  }
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  remove_stale_temps(path);
  write_synced(temp_name(path), path, bytes);
  rename_into_place(temp_name(path), path);
}

void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::string> written;
  try {
    for (const auto& [path, bytes] : files) {
      remove_stale_temps(path);
      write_synced(temp_name(path), path, bytes);
      written.push_back(temp_name(path));
    }
  } catch (const Error&) {
    for (const std::string& tmp : written) std::remove(tmp.c_str());
    throw;
  }
  for (const auto& [path, bytes] : files) rename_into_place(temp_name(path), path);
}

void check_writable(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw Error(fmt::format("{}: is a directory, cannot write a file there", path));
  const std::string tmp = temp_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot write here: {}", path, std::strerror(errno)));
  ::close(fd);
  std::remove(tmp.c_str());
}

}  // namespace ulysses
