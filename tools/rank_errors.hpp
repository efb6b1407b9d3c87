// Errors in the CLI's commands, the same on every rank: an exception on one rank (an input
// unreadable there only, rank 0's output) stops every rank with one message, never a hang.
#pragma once

#include <functional>
#include <string>

#include "ulysses/comm/communicator.hpp"

namespace ulysses::cli {

// Collective. Runs fn on every rank, then agrees on the exception it threw on any rank (a
// ulysses::Error, std::bad_alloc as "out of memory", any std::exception by its what()), so every
// rank stops with the same ulysses::Error (an input file may be unreadable on one rank only).
void on_every_rank(Communicator& comm, const std::function<void()>& fn);
// Collective. The same for work only rank 0 does (printing, writing files): its error stops
// every rank, with the same message and exit code. The others wait for it with no deadline
// (the watchdog is suspended: rank 0's work may be long by design).
void on_root(Communicator& comm, const std::function<void()>& fn);

// Not collective. For an exception that may have reached this rank alone: prints
// "ulysses: error on rank R: <why>" and ends every rank of the job (MPI_Abort, exit code 3),
// so that no other rank waits forever in a collective; a process alone that has not started
// MPI exits with code 3.
[[noreturn]] void abort_job(int rank, const std::string& why);

}  // namespace ulysses::cli
