#include "ulysses/comm.hpp"

#include <fmt/format.h>

#include <climits>
#include <utility>
#include <vector>

#include "ulysses/error.hpp"

namespace ulysses {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("MPI error in {}: {}", what, std::string(text, std::size_t(len))));
}

namespace {
int as_count(std::size_t bytes, const char* what) {
  if (bytes > std::size_t(INT_MAX))
    throw Error(fmt::format("{}: a message of {} bytes exceeds MPI's int count limit ({})", what,
                            bytes, INT_MAX));
  return int(bytes);
}
}  // namespace

// ---- Request -------------------------------------------------------------------------------

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
    req_ = std::exchange(o.req_, MPI_REQUEST_NULL);
  }
  return *this;
}

Request::~Request() {
  if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
}

void Request::wait() {
  if (req_ != MPI_REQUEST_NULL) check_mpi(MPI_Wait(&req_, MPI_STATUS_IGNORE), "MPI_Wait");
}

bool Request::test() {
  if (req_ == MPI_REQUEST_NULL) return true;
  int done = 0;
  check_mpi(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test");
  return done != 0;
}

// ---- Comm ----------------------------------------------------------------------------------

Comm::Comm(MPI_Comm parent) {
  check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

Comm::~Comm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Comm::Comm(Comm&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_),
      counters_(std::move(o.counters_)) {}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    rank_ = o.rank_;
    size_ = o.size_;
    counters_ = std::move(o.counters_);
  }
  return *this;
}

void Comm::count_op(const std::string& op, std::int64_t bytes, std::int64_t messages) {
  CommCounter& c = counters_[op];
  c.calls += 1;
  c.bytes_sent += bytes;
  c.messages += messages;
}

void Comm::alltoall(const void* send, void* recv, std::size_t bytes_per_rank,
                    const std::string& op) {
  int n = as_count(bytes_per_rank, "alltoall");
  check_mpi(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "MPI_Alltoall");
  count_op(op, std::int64_t(bytes_per_rank) * (size_ - 1), size_ - 1);
}

void Comm::alltoall_others(const void* send, bool send_own_slot, void* recv, bool recv_own_slot,
                           std::size_t bytes_per_rank, const std::string& op) {
  // One block is one element of a contiguous datatype, so displacements count blocks and
  // buffers may exceed 2 GiB.
  MPI_Datatype block;
  check_mpi(MPI_Type_contiguous(as_count(bytes_per_rank, "alltoall"), MPI_BYTE, &block), "MPI_Type_contiguous");
  MPI_Type_commit(&block);
  const std::size_t n = static_cast<std::size_t>(size_);
  std::vector<int> counts(n, 1), sdispl(n, 0), rdispl(n, 0);
  counts[std::size_t(rank_)] = 0;
  for (int j = 0; j < size_; ++j) {
    const int compact = j < rank_ ? j : (j > rank_ ? j - 1 : 0);
    sdispl[std::size_t(j)] = send_own_slot ? j : compact;
    rdispl[std::size_t(j)] = recv_own_slot ? j : compact;
  }
  const int rc = MPI_Alltoallv(send, counts.data(), sdispl.data(), block, recv, counts.data(), rdispl.data(), block,
                               comm_);
  MPI_Type_free(&block);
  check_mpi(rc, "MPI_Alltoallv");
  count_op(op, std::int64_t(bytes_per_rank) * (size_ - 1), size_ - 1);
}

void Comm::allgather(const void* send, void* recv, std::size_t bytes, const std::string& op) {
  int n = as_count(bytes, "allgather");
  check_mpi(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "MPI_Allgather");
  count_op(op, std::int64_t(bytes) * (size_ - 1), size_ - 1);
}

void Comm::gather(const void* send, void* recv, std::size_t bytes, int root,
                  const std::string& op) {
  int n = as_count(bytes, "gather");
  check_mpi(MPI_Gather(send, n, MPI_BYTE, recv, n, MPI_BYTE, root, comm_), "MPI_Gather");
  count_op(op, rank_ == root ? 0 : std::int64_t(bytes), rank_ == root ? 0 : 1);
}

void Comm::reduce_scatter_sum(const float* send, float* recv, std::size_t count, const std::string& op) {
  check_mpi(MPI_Reduce_scatter_block(send, recv, as_count(count, "reduce_scatter"), MPI_FLOAT, MPI_SUM, comm_),
            "MPI_Reduce_scatter_block");
  count_op(op, std::int64_t(count * sizeof(float)) * (size_ - 1), size_ - 1);
}

void Comm::allreduce_sum(double* data, std::size_t n, const std::string& op) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "allreduce"), MPI_DOUBLE, MPI_SUM, comm_),
            "MPI_Allreduce");
  count_op(op, std::int64_t(n * sizeof(double)), 0);
}

void Comm::allreduce_sum(float* data, std::size_t n, const std::string& op) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "allreduce"), MPI_FLOAT, MPI_SUM, comm_),
            "MPI_Allreduce");
  count_op(op, std::int64_t(n * sizeof(float)), 0);
}

void Comm::allreduce_min(std::int64_t* data, std::size_t n) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "allreduce"), MPI_INT64_T, MPI_MIN, comm_),
            "MPI_Allreduce");
}

void Comm::allreduce_max(std::int64_t* data, std::size_t n) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "allreduce"), MPI_INT64_T, MPI_MAX, comm_),
            "MPI_Allreduce");
}

void Comm::allreduce_max(double* data, std::size_t n) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "allreduce"), MPI_DOUBLE, MPI_MAX, comm_),
            "MPI_Allreduce");
}

void Comm::broadcast(void* data, std::size_t bytes, int root) {
  check_mpi(MPI_Bcast(data, as_count(bytes, "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast");
}

void Comm::barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

Request Comm::isend(const void* data, std::size_t bytes, int dest, int tag, const std::string& op) {
  MPI_Request r;
  check_mpi(MPI_Isend(data, as_count(bytes, "isend"), MPI_BYTE, dest, tag, comm_, &r), "MPI_Isend");
  if (dest != rank_) count_op(op, std::int64_t(bytes), 1);
  return Request(r);
}

Request Comm::irecv(void* data, std::size_t bytes, int src, int tag) {
  MPI_Request r;
  check_mpi(MPI_Irecv(data, as_count(bytes, "irecv"), MPI_BYTE, src, tag, comm_, &r), "MPI_Irecv");
  return Request(r);
}

Comm Comm::split(int color, int key) const {
  MPI_Comm sub;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  Comm result(sub);  // dup: the new Comm owns its own handle
  MPI_Comm_free(&sub);
  return result;
}

void Comm::absorb_counters(Comm& sub, const std::string& prefix) {
  for (const auto& [op, c] : sub.counters_) {
    CommCounter& mine = counters_[prefix + "." + op];
    mine.calls += c.calls;
    mine.bytes_sent += c.bytes_sent;
    mine.messages += c.messages;
  }
  sub.reset_counters();
}

void Comm::agree(const std::string& local_error) {
  // Lowest failing rank, or size_ when every rank is fine.
  std::int64_t first = local_error.empty() ? size_ : rank_;
  allreduce_min(&first, 1);
  if (first == size_) return;
  std::int64_t len = std::int64_t(local_error.size());
  broadcast(&len, sizeof(len), int(first));
  std::string msg(std::size_t(len), '\0');
  if (rank_ == first) msg = local_error;
  broadcast(msg.data(), msg.size(), int(first));
  throw Error(size_ > 1 ? fmt::format("rank {}: {}", first, msg) : msg);
}

}  // namespace ulysses
