// The built-in strategies, one file each in this folder; strategy.cpp lists them.
#pragma once

#include <memory>

#include "ulysses/cp/strategy.hpp"

namespace ulysses {

std::unique_ptr<Strategy> make_a2a_strategy();         // a2a.cpp
std::unique_ptr<Strategy> make_p2p_strategy();         // p2p.cpp
std::unique_ptr<Strategy> make_all_gather_strategy();  // all_gather.cpp
std::unique_ptr<Strategy> make_a2a_p2p_strategy();     // a2a_p2p.cpp

}  // namespace ulysses
