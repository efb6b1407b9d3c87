#include "ulysses/io/output_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"

namespace ulysses {

namespace fs = std::filesystem;

namespace {

std::string temp_name(const std::string& target) { return fmt::format("{}.tmp.{}", target, getpid()); }

fs::path parent_of(const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); }

// Removes "<target>.tmp.<pid>" files whose writer is gone (kill(pid, 0) says no such process).
void remove_stale_temps(const std::string& target) {
  const fs::path p(target);
  const std::string prefix = p.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent_of(p), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = pid_t(std::atol(digits.c_str()));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) fs::remove(entry.path(), ec);
  }
}

// Throws unless `target` is missing or a regular file: a device, FIFO, socket or directory is
// never replaced by a file. Returns its permissions (0644 when missing).
mode_t replaceable_mode(const std::string& target, const std::string& name) {
  struct stat st {};
  if (::stat(target.c_str(), &st) != 0) return 0644;
  if (!S_ISREG(st.st_mode))
    throw Error(fmt::format("{}: is {}, not a regular file: refusing to replace it", name, file_kind(st.st_mode)));
  return st.st_mode & 07777;
}

// Writes `bytes` to the new file `tmp` and flushes them to disk. Throws Error naming `name`.
void write_synced(const std::string& tmp, const std::string& name, std::string_view bytes, mode_t mode) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(fmt::format("{}: cannot create {}: {}", name, tmp, std::strerror(errno)));
  std::size_t done = 0;
  int err = ::fchmod(fd, mode) != 0 ? errno : 0;
  while (done < bytes.size() && !err) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno != EINTR) err = errno;
    if (n == 0) err = EIO;  // a regular file that accepts nothing would loop forever
    if (n > 0) done += std::size_t(n);
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (err) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: write failed: {}", name, std::strerror(err)));
  }
}

// The rename is durable once the directory is flushed too. Filesystems that cannot fsync a
// directory (EINVAL) have nothing more to flush.
void sync_directory(const std::string& target, const std::string& name) {
  const int fd = ::open(parent_of(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  const int err = ::fsync(fd) != 0 && errno != EINVAL ? errno : 0;
  ::close(fd);
  if (err) throw Error(fmt::format("{}: flushing its directory failed: {}", name, std::strerror(err)));
}

void rename_into_place(const std::string& tmp, const std::string& target, const std::string& name) {
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: cannot rename {} into place: {}", name, tmp, std::strerror(e)));
  }
}

void write_stdout(std::string_view bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
    throw Error(fmt::format("-: writing to standard output failed: {}", std::strerror(errno)));
}

// One output, ready to rename: where it goes and its complete temp file.
struct Staged {
  std::string name, target, tmp;
};

Staged stage(const std::string& path, std::string_view bytes) {
  const std::string target = output_target(path);
  const mode_t mode = replaceable_mode(target, path);
  remove_stale_temps(target);
  write_synced(temp_name(target), path, bytes, mode);
  return {path, target, temp_name(target)};
}

void commit(const Staged& s) {
  rename_into_place(s.tmp, s.target, s.name);
  sync_directory(s.target, s.name);
}

// ---- the checks before any work --------------------------------------------------------------

// What a path names, to tell whether two paths are one file.
struct Identity {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string path;  // normalised, symlinks resolved as far as they exist
};

Identity identify(const std::string& p) {
  Identity id;
  if (p == "-") return {false, 0, 0, "-"};
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) id.exists = true, id.dev = st.st_dev, id.ino = st.st_ino;
  std::error_code ec;
  const fs::path target = fs::absolute(output_target(p), ec);
  const fs::path canonical = fs::weakly_canonical(target, ec);
  id.path = (ec ? target.lexically_normal() : canonical).string();
  return id;
}

bool same_file(const Identity& a, const Identity& b) {
  return a.exists && b.exists ? a.dev == b.dev && a.ino == b.ino : a.path == b.path;
}

// The directory a missing file would be created in must exist (or, with make_dirs, its nearest
// existing ancestor must be a directory) and take a new file.
void check_creatable(const OutputSpec& o, const std::string& target) {
  const std::string name = fmt::format("{} {}", o.flag, o.path);
  fs::path dir = parent_of(target);
  std::error_code ec;
  if (o.make_dirs)
    while (!fs::exists(dir, ec) && dir.has_relative_path() && dir != parent_of(dir)) dir = parent_of(dir);
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw Error(fmt::format("{}: cannot write here: {} is not a directory", name, dir.string()));
  const std::string probe =
      o.make_dirs && dir != parent_of(target) ? temp_name((dir / "probe").string()) : temp_name(target);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(fmt::format("{}: cannot write here: {}", name, std::strerror(errno)));
  ::close(fd);
  std::remove(probe.c_str());
}

void check_output(const OutputSpec& o) {
  const std::string name = fmt::format("{} {}", o.flag, o.path);
  if (o.path == "-") {
    if (o.stdout_ok) return;
    throw Error(
        fmt::format("{}: {} cannot go to standard output; name a file (./- for a file named '-')", name, o.flag));
  }
  const std::string target = output_target(o.path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error(fmt::format("{}: is {}, not a regular file: refusing to replace it (name a regular file{})", name,
                            file_kind(st.st_mode), o.stdout_ok ? ", or - for standard output" : ""));
  check_creatable(o, target);
}

}  // namespace

std::string output_target(const std::string& path) {
  fs::path p(path);
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p.string();
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) throw Error(fmt::format("{}: cannot read the symlink {}: {}", path, p.string(), ec.message()));
    p = to.is_absolute() ? to : parent_of(p) / to;
  }
  throw Error(fmt::format("{}: {}", path, std::strerror(ELOOP)));
}

void check_outputs(const std::vector<OutputSpec>& outputs, const std::vector<InputSpec>& inputs) {
  std::vector<std::pair<const OutputSpec*, Identity>> seen;
  for (const OutputSpec& o : outputs) {
    if (o.path.empty()) continue;
    check_output(o);
    const Identity id = identify(o.path);
    for (const auto& [other, other_id] : seen)
      if (same_file(id, other_id))
        throw Error(fmt::format("{} {}: the same file as {} {} (named for two outputs)", o.flag, o.path, other->flag,
                                other->path));
    for (const InputSpec& in : inputs)
      if (!in.path.empty() && in.flag != o.replaces && same_file(id, identify(in.path)))
        throw Error(fmt::format("{} {}: the same file as the input {} {}: refusing to overwrite an input", o.flag,
                                o.path, in.flag, in.path));
    seen.emplace_back(&o, id);
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  if (path == "-") return write_stdout(bytes);
  commit(stage(path, bytes));
}

void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<Staged> staged;
  try {
    for (const auto& [path, bytes] : files)
      if (path != "-") staged.push_back(stage(path, bytes));
  } catch (...) {
    for (const Staged& s : staged) std::remove(s.tmp.c_str());
    throw;
  }
  for (const Staged& s : staged) commit(s);
  for (const auto& [path, bytes] : files)
    if (path == "-") write_stdout(bytes);
}

// ---- AppendFile ------------------------------------------------------------------------------

// keep == 0: a new file, written as "<target>.tmp.<pid>" and renamed over the target once it
// holds a line (or at close): until then the old file stays, as every writer's does.
AppendFile::AppendFile(std::string flag, const std::string& path, std::uint64_t keep)
    : flag_(std::move(flag)), path_(path) {
  const std::string target = output_target(path);
  const std::string name = flag_ + " " + path_;
  if (keep == 0) {
    const mode_t mode = replaceable_mode(target, name);
    remove_stale_temps(target);
    target_ = target, tmp_ = temp_name(target);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ < 0) fail("cannot create a file here", errno);
    if (::fchmod(fd_, mode) != 0) fail("cannot set its permissions", errno);
    return;
  }
  // O_NONBLOCK: a FIFO without a reader fails, not waits (and is refused below).
  fd_ = ::open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd_ < 0) fail("cannot open for writing", errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("cannot stat", errno);
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(fmt::format("{}: is {}, not a regular file", name, file_kind(st.st_mode)));
  }
  size_ = std::min<std::uint64_t>(keep, std::uint64_t(st.st_size));
  if (::ftruncate(fd_, off_t(size_)) != 0) fail("cannot truncate", errno);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) std::remove(tmp_.c_str());  // never completed a line: the old file stays
}

void AppendFile::fail(const char* what, int err) {
  // Cut a partly written line off again (a new file that never held a line is removed, the old
  // one kept); the error to report is the one that brought us here.
  if (fd_ >= 0 && tmp_.empty()) (void)!::ftruncate(fd_, off_t(size_));
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) std::remove(tmp_.c_str());
  tmp_.clear();
  throw Error(fmt::format("{} {}: {}: {}", flag_, path_, what, std::strerror(err)));
}

// The new file replaces the old one.
void AppendFile::publish() {
  if (tmp_.empty()) return;
  if (std::rename(tmp_.c_str(), target_.c_str()) != 0) fail("cannot rename into place", errno);
  tmp_.clear();
}

void AppendFile::append(std::string_view bytes) {
  if (fd_ < 0) throw Error(fmt::format("{} {}: written after it failed or closed", flag_, path_));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, off_t(size_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed", n < 0 ? errno : EIO);
    done += std::size_t(n);
  }
  size_ += done;
  publish();
}

void AppendFile::close() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) fail("write failed", errno);
  publish();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw Error(fmt::format("{} {}: write failed: {}", flag_, path_, std::strerror(errno)));
}

}  // namespace ulysses
