// Comm — an MPI communicator that owns its group (c10d/NCCL style, no globals).
//
// Construction duplicates the parent MPI_Comm (collective over the parent); destruction frees
// it. MPI errors become ulysses::Error carrying MPI's error string. Every data-moving call
// counts the bytes this rank sent under an operation name, so tests and reports can check
// communication volumes against their formulas exactly.
//
// All methods marked "collective" must be called by every rank of the communicator in the
// same order.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace ulysses {

struct CommCounter {
  std::int64_t calls = 0;
  std::int64_t bytes_sent = 0;  // payload bytes this rank sent to other ranks (not to itself)
  std::int64_t messages = 0;    // point-to-point messages to other ranks
};

// A pending nonblocking send or receive. wait() is idempotent; the destructor waits, so a
// request can never be forgotten while MPI still owns its buffer.
class Request {
 public:
  Request() = default;
  explicit Request(MPI_Request r) : req_(r) {}
  Request(Request&& o) noexcept : req_(o.req_) { o.req_ = MPI_REQUEST_NULL; }
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();
  void wait();
  bool test();  // true when complete; also drives MPI progress

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
};

class Comm {
 public:
  // Collective over `parent`.
  explicit Comm(MPI_Comm parent = MPI_COMM_WORLD);
  ~Comm();
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm native() const { return comm_; }

  // Collective. Sends `bytes_per_rank` bytes from send + j*bytes_per_rank to rank j and
  // receives rank j's block into recv + j*bytes_per_rank. Counted under `op`.
  void alltoall(const void* send, void* recv, std::size_t bytes_per_rank,
                const std::string& op = "alltoall");
  // Collective. The same exchange without this rank's own block, which the caller moves
  // itself (straight into place, saving a copy). A buffer with `own_slot` holds size()
  // blocks and its own block is neither read nor written; without, it holds the size()−1
  // other ranks' blocks back to back, in rank order.
  void alltoall_others(const void* send, bool send_own_slot, void* recv, bool recv_own_slot,
                       std::size_t bytes_per_rank, const std::string& op = "alltoall");
  // Collective. Every rank contributes `bytes`; recv holds size() blocks in rank order.
  void allgather(const void* send, void* recv, std::size_t bytes,
                 const std::string& op = "allgather");
  // Collective. root receives size() blocks of `bytes` in rank order into recv.
  void gather(const void* send, void* recv, std::size_t bytes, int root,
              const std::string& op = "gather");
  // Collective. send holds size() blocks of `count` floats in rank order; block j is summed
  // over ranks and lands in rank j's recv. Counts the (size()−1) blocks each rank sends.
  void reduce_scatter_sum(const float* send, float* recv, std::size_t count,
                          const std::string& op = "reduce_scatter");
  // Collective. In-place sum / min / max over ranks.
  void allreduce_sum(double* data, std::size_t n, const std::string& op = "allreduce");
  void allreduce_sum(float* data, std::size_t n, const std::string& op = "allreduce");
  void allreduce_min(std::int64_t* data, std::size_t n);
  void allreduce_max(std::int64_t* data, std::size_t n);
  void allreduce_max(double* data, std::size_t n);
  void broadcast(void* data, std::size_t bytes, int root);
  void barrier();

  // Not collective. Nonblocking point-to-point, counted under `op`.
  Request isend(const void* data, std::size_t bytes, int dest, int tag,
                const std::string& op = "p2p");
  Request irecv(void* data, std::size_t bytes, int src, int tag);

  // Collective over this communicator: a new Comm of the ranks with the same color,
  // ordered by key (MPI_Comm_split).
  Comm split(int color, int key) const;

  // Collective error agreement. Pass "" when this rank is fine, else its error message.
  // If any rank reports an error, every rank throws the same ulysses::Error: the message of
  // the lowest failing rank, prefixed with that rank. Costs one small allreduce.
  void agree(const std::string& local_error);

  const std::map<std::string, CommCounter>& counters() const { return counters_; }
  // Not collective. Adds `sub`'s counters to this one's as "<prefix>.<op>" and clears them:
  // a strategy working on sub-communicators reports all its traffic on the user's Comm.
  void absorb_counters(Comm& sub, const std::string& prefix);
  void reset_counters() { counters_.clear(); }

 private:
  void count_op(const std::string& op, std::int64_t bytes, std::int64_t messages);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::map<std::string, CommCounter> counters_;
};

// Throws ulysses::Error with MPI's text when rc != MPI_SUCCESS.
void check_mpi(int rc, const char* what);

}  // namespace ulysses
