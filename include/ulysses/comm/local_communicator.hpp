// LocalCommunicator — ranks as threads of one process (PyTorch's threaded process group,
// LevelDB's in-memory Env): the second backend of Communicator, so the library, its tests and
// notebooks run without mpirun. Everything above the communicator behaves as over MPI: the
// byte counters, the tracer and the watchdog are the base class's.
//
// Data moves by shared memory: a collective publishes each rank's buffers, and once every rank
// has arrived each rank copies what it receives straight from the others' buffers, then waits
// until every rank has read its own. Reductions add in rank order, so results are the same run
// to run. Point-to-point messages match by (source, tag) in posting order, as MPI's do, and are
// copied when both sides are posted (a small send with no receive yet is copied at once, as
// MPI's eager protocol does). Every wait on a rank thread also reads the rank's other
// collectives in flight (MPI's progress), so waits in different orders cannot deadlock.
//
// Every blocking wait runs under the watchdog. When it fires, the waiting rank prints the
// watchdog's one line on stderr and the whole local group fails (see run_local): the process
// is the job's owner here (a notebook, a test), so it gets an exception rather than an exit.
#pragma once

#include <functional>
#include <memory>

#include "ulysses/comm/communicator.hpp"

namespace ulysses {

namespace local {
class Group;  // the ranks' shared state (src/comm/local_communicator.cpp)
struct Part;  // one rank's share of a collective
}  // namespace local

class LocalCommunicator final : public Communicator {
 public:
  // A group of one rank (what an MPI program started without mpirun has).
  LocalCommunicator();
  // Rank `rank` of `group` (run_local and split make them).
  LocalCommunicator(std::shared_ptr<local::Group> group, int rank);
  ~LocalCommunicator() override;

  const char* backend() const override { return "local"; }
  double now() const override;  // steady clock, one epoch for every rank of the process
  std::unique_ptr<Communicator> split(int color, int key) override;
  int ranks_on_this_node() override { return size(); }

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
  // Publishes this rank's part of its next collective (the same kind on every rank, else the
  // group fails naming both) and returns the request that completes it under the watchdog.
  std::unique_ptr<Request::Impl> post(local::Part part);
  void run(local::Part part);  // post, then wait
  void check_alive() const;    // Error once the group's run_local has returned
  std::shared_ptr<local::Group> group_;
  std::uint64_t next_op_ = 0;  // this rank's collectives so far: the next one's sequence number
};

// Runs fn(comm) on n threads, one per rank of a new local group of n ranks, and returns when
// every thread has. Each rank thread gets max(1, omp_get_max_threads() / n) OpenMP threads for
// the kernels (the caller's setting shared out: the ranks never oversubscribe it). If fn
// throws on a rank, the group fails: every rank waiting on it (or later reaching a collective)
// is released with an Error naming that rank, and run_local rethrows the first failing rank's
// own exception after all threads have ended. Throws Error unless n >= 1.
// A rank whose fn returns while a peer waits for it in a collective (or a message) fails the
// group at once, naming that rank. Once run_local returns, every call on a communicator of the
// group (one kept by run_local_shared's caller) throws an Error saying the group has ended.
void run_local(int n, const std::function<void(Communicator&)>& fn);
// The same, handing out each rank's communicator as shared ownership: it may outlive the run
// (Python keeps what a rank's function saved) and then answers rank and size and throws on
// every communication.
void run_local_shared(int n, const std::function<void(const std::shared_ptr<Communicator>&)>& fn);

// The world communicator of the rank thread calling it (inside run_local), or null.
Communicator* local_world();

}  // namespace ulysses
