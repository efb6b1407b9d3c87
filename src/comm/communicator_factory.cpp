// The backends by name: the only file above the backends that knows their classes.
#include "ulysses/communicator_factory.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "ulysses/error.hpp"
#include "ulysses/local_communicator.hpp"
#include "ulysses/mpi_communicator.hpp"

namespace ulysses {

std::vector<std::string> communicator_backends() { return {"mpi", "local"}; }

std::unique_ptr<Communicator> make_communicator(const std::string& backend) {
  if (backend == "mpi") return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  if (backend == "local") {
    if (Communicator* world = local_world()) return world->split(0, world->rank());
    return std::make_unique<LocalCommunicator>();
  }
  throw Error(
      fmt::format("unknown communicator backend '{}' (known: {})", backend, fmt::join(communicator_backends(), ", ")));
}

std::unique_ptr<Communicator> make_mpi_communicator(std::int64_t fortran_handle) {
  return std::make_unique<MpiCommunicator>(MPI_Comm_f2c(MPI_Fint(fortran_handle)));
}

std::unique_ptr<Communicator> make_self_communicator(const Communicator& like) {
  if (std::strcmp(like.backend(), "mpi") == 0) return std::make_unique<MpiCommunicator>(MPI_COMM_SELF);
  if (std::strcmp(like.backend(), "local") == 0) return std::make_unique<LocalCommunicator>();
  throw Error(fmt::format("make_self_communicator: unknown backend '{}'", like.backend()));
}

}  // namespace ulysses
