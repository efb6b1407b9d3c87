// The backends by name: the only file above the backends that knows their classes.
#include "ulysses/comm/communicator_factory.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string_view>
#include <utility>

#include "ulysses/core/error.hpp"
#include "ulysses/comm/local_communicator.hpp"
#include "ulysses/comm/mpi_communicator.hpp"

namespace ulysses {

namespace {

std::vector<CommunicatorBackend>& backends() {
  static std::vector<CommunicatorBackend> all{
      {"mpi", [] { return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD); },
       [] { return std::make_unique<MpiCommunicator>(MPI_COMM_SELF); }},
      {"local",
       []() -> std::unique_ptr<Communicator> {
         if (Communicator* world = local_world()) return world->split(0, world->rank());
         return std::make_unique<LocalCommunicator>();
       },
       [] { return std::make_unique<LocalCommunicator>(); }},
  };
  return all;
}

const CommunicatorBackend* find_backend(std::string_view name) {
  for (const CommunicatorBackend& b : backends())
    if (b.name == name) return &b;
  return nullptr;
}

}  // namespace

void register_communicator_backend(CommunicatorBackend backend) {
  if (!backend.world || !backend.self)
    throw Error(fmt::format("register_communicator_backend: '{}' needs both its makers", backend.name));
  if (find_backend(backend.name))
    throw Error(fmt::format("register_communicator_backend: '{}' is already registered", backend.name));
  backends().push_back(std::move(backend));
}

std::vector<std::string> communicator_backends() {
  std::vector<std::string> names;
  for (const CommunicatorBackend& b : backends()) names.push_back(b.name);
  return names;
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend) {
  if (const CommunicatorBackend* b = find_backend(backend)) return b->world();
  throw Error(
      fmt::format("unknown communicator backend '{}' (known: {})", backend, fmt::join(communicator_backends(), ", ")));
}

std::unique_ptr<Communicator> make_job_communicator() {
  if (mpi_running() || started_by_mpi_launcher()) return make_communicator("mpi");
  return std::make_unique<LocalCommunicator>();
}

std::unique_ptr<Communicator> make_mpi_communicator(std::int64_t fortran_handle) {
  return std::make_unique<MpiCommunicator>(MPI_Comm_f2c(MPI_Fint(fortran_handle)));
}

std::unique_ptr<Communicator> make_self_communicator(const Communicator& like) {
  if (const CommunicatorBackend* b = find_backend(like.backend())) return b->self();
  throw Error(fmt::format("make_self_communicator: unknown backend '{}'", like.backend()));
}

}  // namespace ulysses
