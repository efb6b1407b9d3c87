// MpiCommunicator — the Communicator over an MPI communicator, and MpiSession, the RAII
// MPI_Init/MPI_Finalize of a program. The only public header that includes <mpi.h>.
//
// Construction duplicates the parent MPI_Comm (collective over the parent); destruction frees
// it. Every blocking wait runs under the communicator's watchdog (set_timeout): collectives
// are MPI-3's nonblocking ones completed by polling. Not under it: MPI_Comm_dup and
// MPI_Comm_split (construction and split(), which MPI offers only blocking), MPI_Finalize.
// MPI errors become ulysses::Error carrying MPI's error string; messages above MPI's int
// count limit are refused with an Error, never truncated.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"

namespace ulysses {

// Who is who on an MPI communicator, for the watchdog's messages: its ranks' world ranks, and
// this process's rank and host. Local (no communication).
class MpiNames {
 public:
  explicit MpiNames(MPI_Comm c);
  std::string me() const;         // "rank 1 of 4 (world rank 3, host h2)"
  std::string rank(int r) const;  // "1 (world rank 3)"
  std::string group() const;      // "the group of 4 ranks (world ranks 0,1,2,3)"

 private:
  int rank_;
  std::vector<int> world_;  // world rank of each rank
};

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `parent`.
  explicit MpiCommunicator(MPI_Comm parent = MPI_COMM_WORLD);
  ~MpiCommunicator() override;

  MPI_Comm native() const { return comm_; }
  const char* backend() const override { return "mpi"; }
  double now() const override { return MPI_Wtime(); }
  std::unique_ptr<Communicator> split(int color, int key) override;
  int ranks_on_this_node() override;

 protected:
  void do_alltoall(const void* send, void* recv, std::size_t bytes_per_rank) override;
  std::unique_ptr<Request::Impl> do_ialltoallv(const void* send, std::span<const std::size_t> send_bytes,
                                               std::span<const std::size_t> send_offsets, void* recv,
                                               std::span<const std::size_t> recv_bytes,
                                               std::span<const std::size_t> recv_offsets) override;
  void do_allgather(const void* send, void* recv, std::size_t bytes) override;
  void do_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes) override;
  void do_gather(const void* send, void* recv, std::size_t bytes, int root) override;
  void do_reduce_scatter_sum(const float* send, float* recv, std::size_t count) override;
  void do_reduce_scatter_sum_v(const float* send, float* recv, std::span<const std::size_t> counts) override;
  void do_allreduce(void* data, std::size_t n, ScalarType type, ReduceOp op) override;
  void do_broadcast(void* data, std::size_t bytes, int root) override;
  void do_barrier() override;
  std::unique_ptr<Request::Impl> do_isend(const void* data, std::size_t bytes, int dest, int tag) override;
  std::unique_ptr<Request::Impl> do_irecv(void* data, std::size_t bytes, int src, int tag) override;

 private:
  MpiCommunicator(MPI_Comm owned, int rank, int size);
  // Waits for the nonblocking collective `call` under the watchdog (which ends the job if it
  // fires).
  void complete(MPI_Request& r, const char* call);
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<const MpiNames> names_;
};

// Whether a launcher started this process as a rank of an MPI job: one of the variables that
// Open MPI's mpirun/prterun, PMIx, MPICH's Hydra, MVAPICH, Slurm's srun, Flux, HPE PALS or Cray
// ALPS set for every rank is set. Not collective; reads the environment only.
bool started_by_mpi_launcher();

// Whether MPI is initialised and not yet finalised.
bool mpi_running();

// MPI_Init (unless MPI is already initialised) and, if it initialised MPI, MPI_Finalize on
// destruction. Start::now initialises on construction. Start::when_needed does too in a process
// a launcher started; in a process started alone (a world of one) it waits for the first
// MpiCommunicator made, on the thread that makes it: Open MPI's singleton start spawns a
// daemon (0.3 s) that a program which communicates nothing never needs.
class MpiSession {
 public:
  enum class Start { now, when_needed };
  MpiSession(int& argc, char**& argv, Start start = Start::now);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  // This process's rank in MPI_COMM_WORLD (for "only rank 0 prints" before any communicator):
  // 0 while MPI waits, as a process started alone is rank 0 of its world.
  int world_rank() const { return world_rank_; }

 private:
  friend void start_deferred_mpi();
  void init();
  int* argc_;
  char*** argv_;
  bool owns_ = false;
  int world_rank_ = 0;
};

// Not collective. Initialises MPI now if an MpiSession is waiting for it (what constructing an
// MpiCommunicator does first); else nothing.
void start_deferred_mpi();

}  // namespace ulysses
