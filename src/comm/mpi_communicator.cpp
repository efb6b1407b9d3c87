// The MPI backend of Communicator: one MPI call per hook.
#include "ulysses/mpi_communicator.hpp"

#include <fmt/format.h>

#include <climits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "ulysses/error.hpp"

namespace ulysses {

namespace {

// Throws ulysses::Error with MPI's text when rc != MPI_SUCCESS.
void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("MPI error in {}: {}", what, std::string(text, std::size_t(len))));
}

int as_count(std::size_t bytes, const char* what) {
  if (bytes > std::size_t(INT_MAX))
    throw Error(fmt::format("{}: a message of {} bytes exceeds MPI's int count limit ({})", what, bytes, INT_MAX));
  return int(bytes);
}

// MPI's counts and displacements are ints. They count units of a contiguous datatype of the
// largest size that divides every count and offset of a call, so buffers and displacements may
// exceed 2 GiB; a value that still does not fit is refused with an Error, never truncated.
class ByteUnit {
 public:
  explicit ByteUnit(std::initializer_list<std::span<const std::size_t>> lists) {
    for (std::span<const std::size_t> l : lists)
      for (std::size_t x : l) unit_ = std::gcd(unit_, x);
    if (unit_ == 0) unit_ = 1;                                                           // all empty
    if (unit_ > std::size_t(INT_MAX)) unit_ = std::gcd(unit_, std::size_t(1) << 30);  // one huge block
    check_mpi(MPI_Type_contiguous(int(unit_), MPI_BYTE, &type_), "MPI_Type_contiguous");
    MPI_Type_commit(&type_);
  }
  ~ByteUnit() { MPI_Type_free(&type_); }
  ByteUnit(const ByteUnit&) = delete;
  ByteUnit& operator=(const ByteUnit&) = delete;
  MPI_Datatype type() const { return type_; }
  std::vector<int> count(std::span<const std::size_t> bytes, const char* what) const {
    std::vector<int> n;
    for (std::size_t b : bytes) {
      if (b / unit_ > std::size_t(INT_MAX))
        throw Error(fmt::format("{}: {} bytes are more than MPI's int limit ({}) of {}-byte units", what, b, INT_MAX,
                                unit_));
      n.push_back(int(b / unit_));
    }
    return n;
  }

 private:
  std::size_t unit_ = 0;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Where each block starts when blocks of these sizes lie back to back.
std::vector<std::size_t> block_offsets(std::span<const std::size_t> bytes) {
  std::vector<std::size_t> offsets(bytes.size(), 0);
  for (std::size_t j = 1; j < bytes.size(); ++j) offsets[j] = offsets[j - 1] + bytes[j - 1];
  return offsets;
}

class MpiRequest final : public Request::Impl {
 public:
  explicit MpiRequest(MPI_Request r) : req_(r) {}
  ~MpiRequest() override {
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (req_ != MPI_REQUEST_NULL) check_mpi(MPI_Wait(&req_, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

 private:
  MPI_Request req_;
};

MPI_Datatype mpi_type(ScalarType t) {
  switch (t) {
    case ScalarType::f32: return MPI_FLOAT;
    case ScalarType::f64: return MPI_DOUBLE;
    case ScalarType::i64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
  }
  return MPI_OP_NULL;
}

MPI_Comm dup_of(MPI_Comm parent) {
  MPI_Comm c;
  check_mpi(MPI_Comm_dup(parent, &c), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return c;
}

int rank_in(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

int size_of(MPI_Comm c) {
  int n = 1;
  MPI_Comm_size(c, &n);
  return n;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm parent) : MpiCommunicator(dup_of(parent), 0, 0) {}

MpiCommunicator::MpiCommunicator(MPI_Comm owned, int, int)
    : Communicator(rank_in(owned), size_of(owned)), comm_(owned) {}

MpiCommunicator::~MpiCommunicator() {
  // A garbage-collected owner (Python) may outlive MPI_Finalize; MPI then freed the handle.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::do_alltoall(const void* send, void* recv, std::size_t bytes_per_rank) {
  const int n = as_count(bytes_per_rank, "alltoall");
  check_mpi(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "MPI_Alltoall");
}

void MpiCommunicator::do_alltoallv(const void* send, std::span<const std::size_t> send_bytes,
                                   std::span<const std::size_t> send_offsets, void* recv,
                                   std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets) {
  const ByteUnit su({send_bytes, send_offsets}), ru({recv_bytes, recv_offsets});
  const std::vector<int> sc = su.count(send_bytes, "alltoallv"), sd = su.count(send_offsets, "alltoallv"),
                         rc = ru.count(recv_bytes, "alltoallv"), rd = ru.count(recv_offsets, "alltoallv");
  check_mpi(MPI_Alltoallv(send, sc.data(), sd.data(), su.type(), recv, rc.data(), rd.data(), ru.type(), comm_),
            "MPI_Alltoallv");
}

void MpiCommunicator::do_allgather(const void* send, void* recv, std::size_t bytes) {
  const int n = as_count(bytes, "allgather");
  check_mpi(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "MPI_Allgather");
}

void MpiCommunicator::do_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes) {
  const std::vector<std::size_t> offsets = block_offsets(bytes);
  const ByteUnit u({bytes, offsets});
  const std::vector<int> counts = u.count(bytes, "allgatherv"), displs = u.count(offsets, "allgatherv");
  check_mpi(MPI_Allgatherv(send, counts[std::size_t(rank())], u.type(), recv, counts.data(), displs.data(), u.type(),
                           comm_),
            "MPI_Allgatherv");
}

void MpiCommunicator::do_gather(const void* send, void* recv, std::size_t bytes, int root) {
  const int n = as_count(bytes, "gather");
  check_mpi(MPI_Gather(send, n, MPI_BYTE, recv, n, MPI_BYTE, root, comm_), "MPI_Gather");
}

void MpiCommunicator::do_reduce_scatter_sum(const float* send, float* recv, std::size_t count) {
  check_mpi(MPI_Reduce_scatter_block(send, recv, as_count(count, "reduce_scatter"), MPI_FLOAT, MPI_SUM, comm_),
            "MPI_Reduce_scatter_block");
}

void MpiCommunicator::do_reduce_scatter_sum_v(const float* send, float* recv, std::span<const std::size_t> counts) {
  std::vector<int> n;
  for (std::size_t c : counts) n.push_back(as_count(c, "reduce_scatter"));
  check_mpi(MPI_Reduce_scatter(send, recv, n.data(), MPI_FLOAT, MPI_SUM, comm_), "MPI_Reduce_scatter");
}

void MpiCommunicator::do_allreduce(void* data, std::size_t n, ScalarType type, ReduceOp op) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, as_count(n, "allreduce"), mpi_type(type), mpi_op(op), comm_),
            "MPI_Allreduce");
}

void MpiCommunicator::do_broadcast(void* data, std::size_t bytes, int root) {
  check_mpi(MPI_Bcast(data, as_count(bytes, "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast");
}

void MpiCommunicator::do_barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

std::unique_ptr<Request::Impl> MpiCommunicator::do_isend(const void* data, std::size_t bytes, int dest, int tag) {
  MPI_Request r;
  check_mpi(MPI_Isend(data, as_count(bytes, "isend"), MPI_BYTE, dest, tag, comm_, &r), "MPI_Isend");
  return std::make_unique<MpiRequest>(r);
}

std::unique_ptr<Request::Impl> MpiCommunicator::do_irecv(void* data, std::size_t bytes, int src, int tag) {
  MPI_Request r;
  check_mpi(MPI_Irecv(data, as_count(bytes, "irecv"), MPI_BYTE, src, tag, comm_, &r), "MPI_Irecv");
  return std::make_unique<MpiRequest>(r);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm sub;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(sub, 0, 0));
}

int MpiCommunicator::ranks_on_this_node() {
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  const int n = size_of(node);
  MPI_Comm_free(&node);
  return n;
}

MpiSession::MpiSession(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    MPI_Init(&argc, &argv);
    owns_ = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
}

MpiSession::~MpiSession() {
  if (owns_) MPI_Finalize();
}

}  // namespace ulysses
