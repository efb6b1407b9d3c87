#include "ulysses/atomic_file.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "ulysses/error.hpp"

namespace ulysses {

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error(fmt::format("{}: write failed", path));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: cannot rename {} into place: {}", path, tmp, std::strerror(e)));
  }
}

}  // namespace ulysses
