// Reading input files with a known bound: only regular files are read (a device such as
// /dev/zero, a FIFO, a socket or a directory is refused by name before anything is read), and a
// file larger than its reader's maximum is refused with both numbers. None of these is
// collective.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace ulysses {

// "a directory", "a character device", "a block device", "a FIFO", "a socket" or "a regular
// file", for messages.
const char* file_kind(mode_t mode);

// Throws Error "<flag> <path>: is a FIFO, not a regular file" unless `path` (symlinks followed)
// is a regular file, or "<flag> <path>: cannot open: <strerror>" when it cannot be stat'ed.
// `flag` may be empty (the path alone is named).
void check_regular_input(const std::string& flag, const std::string& path);

// The whole of the regular file `path`. Throws Error naming flag and path when it is not a
// regular file, cannot be read, or holds more than `max_bytes` ("... is N bytes, more than
// <limit_what> (M bytes)").
std::string read_input_file(const std::string& flag, const std::string& path, std::int64_t max_bytes,
                            const std::string& limit_what);

// MemAvailable from /proc/meminfo in bytes (or what the cgroup's memory limit still allows, when
// that is less), or -1 when it cannot be read. ULYSSES_MEM_AVAILABLE
// (bytes) overrides it, for tests.
std::int64_t available_memory_bytes();

// read_input_file bounded by the memory available (no bound when it is unknown).
std::string read_input_within_memory(const std::string& flag, const std::string& path);

}  // namespace ulysses
