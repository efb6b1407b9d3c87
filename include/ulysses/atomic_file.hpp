// Writing a file so that readers see the old content or the new, never a partial write: the
// bytes go to "<path>.tmp.<pid>", are flushed to disk (fsync), and only then renamed over
// <path>. On any failure the temp file is removed and an Error names the path and the reason
// (strerror). A temp file left by a writer that was killed (its pid no longer alive) is removed
// by the next write of the same path. None of these is collective.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ulysses {

void write_file_atomic(const std::string& path, std::string_view bytes);

// All or none: every file goes to its temp file first; only when all are complete are they
// renamed into place. If any write fails, every temp file is removed and nothing is replaced.
void write_files_atomic(const std::vector<std::pair<std::string, std::string>>& files);

// Throws Error unless a file can be created at `path` (its directory exists and is writable,
// and `path` is not a directory): what a command checks before it computes for an output.
// Leaves nothing behind.
void check_writable(const std::string& path);

}  // namespace ulysses
