// make_communicator — the one place that turns a backend's name into a Communicator, so that
// tools, benchmarks and the Python binding never name a backend's class. Backends are
// registered like strategies: the built-ins below, others with register_communicator_backend.
//
//   "mpi"   every process of the MPI job (a dup of MPI_COMM_WORLD; an MpiSession initialises
//           MPI first, or when this first MPI communicator is made). Collective over
//           MPI_COMM_WORLD.
//   "local" ranks as threads (local_communicator.hpp): on a rank thread of run_local, a dup of
//           that rank's local world (collective over it); on any other thread, a world of
//           this thread alone, as an MPI program started without mpirun is a world of one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"

namespace ulysses {

// A backend: its name (what make_communicator takes and its communicators' backend() return),
// how it makes the world, and how it makes a communicator of the calling rank alone.
struct CommunicatorBackend {
  std::string name;
  std::function<std::unique_ptr<Communicator>()> world;
  std::function<std::unique_ptr<Communicator>()> self;
};

// Adds a backend; throws Error if its name is taken or a maker is missing. Call before any
// communicator of it is made.
void register_communicator_backend(CommunicatorBackend backend);

// The backends' names in registration order, the default ("mpi") first.
std::vector<std::string> communicator_backends();

// Throws Error naming the known backends for any other name.
std::unique_ptr<Communicator> make_communicator(const std::string& backend = "mpi");

// Collective over the job's processes. Their world without starting MPI for it: "mpi"'s when
// MPI runs or a launcher started this process; else this process alone is the job (as it would
// be MPI's singleton), and its world is "local"'s world of one, which starts nothing. What a
// program agrees on before it knows whether it will communicate.
std::unique_ptr<Communicator> make_job_communicator();

// Collective over the MPI communicator with this Fortran handle (mpi4py's comm.py2f()): a dup
// of it. How Python hands over any MPI communicator without <mpi.h>.
std::unique_ptr<Communicator> make_mpi_communicator(std::int64_t fortran_handle);

// Not collective. A communicator of this rank alone on `like`'s backend (MPI_COMM_SELF for
// MPI), on the same clock: what a rank uses to time or compute something by itself.
std::unique_ptr<Communicator> make_self_communicator(const Communicator& like);

}  // namespace ulysses
