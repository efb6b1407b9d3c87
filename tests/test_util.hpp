// Helpers of the single-process unit tests: the message of the Error a call throws, a scratch
// directory per test process, and a file's bytes.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ulysses/core/error.hpp"

namespace test_util {

// The message of the ulysses::Error `f` throws, or "" when it returns.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ulysses::Error& e) {
    return e.what();
  }
  return "";
}

// A path `name` in this process's scratch directory (created on first use).
inline std::string scratch(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ulysses_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

// The row of a plan's `rows` whose `key` member is `name` (a planner's row by name, a decode
// row by layout); an Error naming it when there is none.
template <class Row, class Key>
const Row& row_where(const std::vector<Row>& rows, Key Row::*key, const std::string& name) {
  for (const Row& r : rows)
    if (r.*key == name) return r;
  throw ulysses::Error("no row " + name);
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace test_util
