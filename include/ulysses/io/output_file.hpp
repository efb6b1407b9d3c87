// Every file the project writes goes through here, under one set of rules:
//
//  - Checked before any work (check_outputs, for all outputs of a command together): an output
//    may not be the same file as an input or as another output (by device and inode when it
//    exists, by its normalised real path otherwise); a target that exists must be a regular
//    file (a device, FIFO, socket or directory is refused, never replaced); its directory must
//    let a file be created.
//  - "-" names standard output, for the outputs that accept it (OutputSpec::stdout_ok); a file
//    literally named "-" is written as "./-".
//  - A symlink is written through: the new file is renamed onto the link's final target, in the
//    target's directory; the link itself stays.
//  - Atomic: readers see the old content or the new, never a partial write. The bytes go to
//    "<target>.tmp.<pid>" (the target's permissions kept), are flushed to disk (fsync), and
//    only then renamed over the target. Every call is checked (write, fsync, close, rename);
//    any failure removes the temp file, leaves the old file intact and throws an Error naming
//    the path and the reason (strerror). A temp file left by a writer that was killed (its pid
//    no longer alive) is removed by the next write of the same path.
//
// None of these is collective: the rank that writes checks, and the command agrees the result.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ulysses {

// An output named by a flag ("--json", "out.json"). Empty paths are skipped.
struct OutputSpec {
  OutputSpec(std::string flag_, std::string path_, bool stdout_ok_ = false, bool make_dirs_ = false,
             std::string replaces_ = {})
      : flag(std::move(flag_)), path(std::move(path_)), stdout_ok(stdout_ok_), make_dirs(make_dirs_),
        replaces(std::move(replaces_)) {}

  std::string flag, path;
  bool stdout_ok;        // "-" writes to standard output
  bool make_dirs;        // its writer creates the missing directories of `path` (train --save)
  std::string replaces;  // the flag of an input this output may be the same file as (a checkpoint
                         // saved over the one it resumed from: read before it is written)
};

// An input named by a flag ("--data", "corpus.txt"). Empty paths are skipped.
struct InputSpec {
  std::string flag, path;
};

// Throws Error "<flag> <path>: <why>" for the first output that breaks a rule above (named
// twice, the same file as an input, not a regular file, not creatable). Leaves nothing behind.
void check_outputs(const std::vector<OutputSpec>& outputs, const std::vector<InputSpec>& inputs = {});

// The file a write of `path` replaces: `path` with every symlink followed (the last target may
// not exist yet). Throws Error on a symlink loop.
std::string output_target(const std::string& path);

// Writes `bytes` to `path` under the rules above ("-": standard output, flushed and checked).
void write_file_atomic(const std::string& path, std::string_view bytes);

// All or none: every file goes to its temp file first; only when all are complete are they
// renamed into place. If any write fails, every temp file is removed and nothing is replaced.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);

// A file written line by line as a run goes (train --log), with every write checked. A line
// that cannot be written whole is cut off again (the file always ends with a complete line) and
// throws Error "<flag> <path>: write failed: <strerror>". Symlinks are written through; a
// device, FIFO or directory is refused.
class AppendFile {
 public:
  // Opens `path` (created if missing) after cutting it to its first `keep` bytes. With keep 0
  // the file is replaced, but only once the first line is written whole (or at close): a run that
  // fails before leaves the old file.
  AppendFile(std::string flag, const std::string& path, std::uint64_t keep);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  void append(std::string_view bytes);
  // Flushes to disk and closes; throws Error when either fails. The destructor closes unchecked.
  void close();

 private:
  [[noreturn]] void fail(const char* what, int err);
  void publish();

  std::string flag_, path_;
  std::string target_, tmp_;  // a replacement not yet renamed over its target
  int fd_ = -1;
  std::uint64_t size_ = 0;  // bytes of complete lines
};

}  // namespace ulysses
