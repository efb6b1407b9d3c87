// The library's version: one source, CMake's project(VERSION), compiled into version.cpp; the
// CLI's --version, the Python package's __version__ and its wheel metadata all read it.
#pragma once

namespace ulysses {

// "MAJOR.MINOR.PATCH" of the library this program is linked against (not of the headers it
// was compiled with, which matters for a shared library upgraded underneath).
const char* version();

}  // namespace ulysses
