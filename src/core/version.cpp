#include "ulysses/core/version.hpp"

namespace ulysses {

const char* version() { return ULYSSES_VERSION_STRING; }

}  // namespace ulysses
