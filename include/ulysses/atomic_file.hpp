// Writing a file so that readers see the old content or the new, never a partial write: the
// bytes go to "<path>.tmp.<pid>", which is renamed over <path> only once complete. On any
// failure the temp file is removed and an Error names the path and the reason.
#pragma once

#include <string_view>
#include <string>

namespace ulysses {

void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace ulysses
