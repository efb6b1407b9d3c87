// The MPI backend of Communicator: one MPI call per hook. Collectives are the nonblocking
// MPI-3 ones, completed by polling under the communicator's watchdog (a blocking MPI call
// cannot be given a deadline).
#include "ulysses/comm/mpi_communicator.hpp"

#include <fmt/format.h>

#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "ulysses/core/error.hpp"

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
    if (unit_ == 0) unit_ = 1;                                                        // all empty
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
        throw Error(
            fmt::format("{}: {} bytes are more than MPI's int limit ({}) of {}-byte units", what, b, INT_MAX, unit_));
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

bool test_request(MPI_Request& r) {
  int done = 0;
  check_mpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
  return done != 0;
}

// Completes `r` under the watchdog; when it fires, prints its line (what() names the operation)
// and ends every rank: the others may be waiting for this one.
template <class What>
void wait_or_abort(MPI_Request& r, const Watchdog& dog, const MpiNames& names, const What& what) {
  if (r == MPI_REQUEST_NULL || dog.wait([&] { return test_request(r); })) return;
  std::fprintf(stderr, "%s\n", dog.message(names.me(), what()).c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, Watchdog::kExitCode);
}

// A send or receive; what the watchdog says about it is composed only when it fires.
class MpiRequest final : public Request::Impl {
 public:
  MpiRequest(MPI_Request r, std::shared_ptr<const Watchdog> dog, std::shared_ptr<const MpiNames> names, std::string op,
             int peer, int tag, std::size_t bytes)
      : req_(r), dog_(std::move(dog)), names_(std::move(names)), op_(std::move(op)), peer_(peer), tag_(tag),
        bytes_(bytes) {}
  ~MpiRequest() override {
    try {
      wait();
    } catch (const Error&) {  // an MPI error while unwinding: the error in flight says more
    }
  }
  void wait() override {
    wait_or_abort(req_, *dog_, *names_, [this] { return what(); });
  }
  bool test() override { return req_ == MPI_REQUEST_NULL || test_request(req_); }

 private:
  std::string what() const {
    if (op_.empty())
      return fmt::format("the receive from rank {} (tag {}, {} bytes)", names_->rank(peer_), tag_, bytes_);
    return fmt::format("the send '{}' to rank {} (tag {}, {} bytes)", op_, names_->rank(peer_), tag_, bytes_);
  }
  MPI_Request req_;
  std::shared_ptr<const Watchdog> dog_;
  std::shared_ptr<const MpiNames> names_;
  std::string op_;  // "" for a receive
  int peer_, tag_;
  std::size_t bytes_;
};

// A nonblocking collective; it owns the count arrays MPI reads until completion.
class MpiCollectiveRequest final : public Request::Impl {
 public:
  MpiCollectiveRequest(MPI_Request r, std::unique_ptr<std::array<std::vector<int>, 4>> counts,
                       std::shared_ptr<const Watchdog> dog, std::shared_ptr<const MpiNames> names, std::string call)
      : req_(r), counts_(std::move(counts)), dog_(std::move(dog)), names_(std::move(names)), call_(std::move(call)) {}
  ~MpiCollectiveRequest() override {
    try {
      wait();
    } catch (const Error&) {  // an MPI error while unwinding: the error in flight says more
    }
  }
  void wait() override {
    wait_or_abort(req_, *dog_, *names_, [this] { return fmt::format("{} on {}", call_, names_->group()); });
  }
  bool test() override { return req_ == MPI_REQUEST_NULL || test_request(req_); }

 private:
  MPI_Request req_;
  std::unique_ptr<std::array<std::vector<int>, 4>> counts_;
  std::shared_ptr<const Watchdog> dog_;
  std::shared_ptr<const MpiNames> names_;
  std::string call_;
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
  start_deferred_mpi();  // a communicator is what a deferred session waits for
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

MpiNames::MpiNames(MPI_Comm c) : rank_(rank_in(c)), world_(std::size_t(size_of(c))) {
  MPI_Group mine, world;
  MPI_Comm_group(c, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(world_.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = int(i);
  MPI_Group_translate_ranks(mine, int(ranks.size()), ranks.data(), world, world_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
}

std::string MpiNames::me() const {
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(host, &len);
  return fmt::format("rank {} of {} (world rank {}, host {})", rank_, world_.size(), world_[std::size_t(rank_)],
                     std::string(host, std::size_t(len)));
}

std::string MpiNames::rank(int r) const { return fmt::format("{} (world rank {})", r, world_[std::size_t(r)]); }

std::string MpiNames::group() const {
  constexpr std::size_t kListed = 16;  // a message, not a dump
  std::string list;
  for (std::size_t i = 0; i < world_.size() && i < kListed; ++i) list += fmt::format("{}{}", i ? "," : "", world_[i]);
  if (world_.size() > kListed) list += ",...";
  return fmt::format("the group of {} ranks (world ranks {})", world_.size(), list);
}

MpiCommunicator::MpiCommunicator(MPI_Comm parent) : MpiCommunicator(dup_of(parent), 0, 0) {}

MpiCommunicator::MpiCommunicator(MPI_Comm owned, int, int)
    : Communicator(rank_in(owned), size_of(owned)), comm_(owned), names_(std::make_shared<MpiNames>(owned)) {}

void MpiCommunicator::complete(MPI_Request& r, const char* call) {
  wait_or_abort(r, watchdog(), *names_, [&] {
    const std::string& op = current_op();
    if (op.empty()) return fmt::format("{} on {}", call, names_->group());
    return fmt::format("{} '{}' on {}", call, op, names_->group());
  });
}

MpiCommunicator::~MpiCommunicator() {
  // A garbage-collected owner (Python) may outlive MPI_Finalize; MPI then freed the handle.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::do_alltoall(const void* send, void* recv, std::size_t bytes_per_rank) {
  const int n = as_count(bytes_per_rank, "alltoall");
  MPI_Request r;
  check_mpi(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &r), "MPI_Ialltoall");
  complete(r, "alltoall");
}

std::unique_ptr<Request::Impl> MpiCommunicator::do_ialltoallv(const void* send, std::span<const std::size_t> send_bytes,
                                                              std::span<const std::size_t> send_offsets, void* recv,
                                                              std::span<const std::size_t> recv_bytes,
                                                              std::span<const std::size_t> recv_offsets) {
  const ByteUnit su({send_bytes, send_offsets}), ru({recv_bytes, recv_offsets});  // freed types stay valid in flight
  auto counts = std::make_unique<std::array<std::vector<int>, 4>>(
      std::array<std::vector<int>, 4>{su.count(send_bytes, "alltoallv"), su.count(send_offsets, "alltoallv"),
                                      ru.count(recv_bytes, "alltoallv"), ru.count(recv_offsets, "alltoallv")});
  auto& [sc, sd, rc, rd] = *counts;
  MPI_Request r;
  check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), su.type(), recv, rc.data(), rd.data(), ru.type(), comm_, &r),
            "MPI_Ialltoallv");
  const std::string op = current_op();
  return std::make_unique<MpiCollectiveRequest>(r, std::move(counts), shared_watchdog(), names_,
                                                op.empty() ? "alltoallv" : fmt::format("alltoallv '{}'", op));
}

void MpiCommunicator::do_allgather(const void* send, void* recv, std::size_t bytes) {
  const int n = as_count(bytes, "allgather");
  MPI_Request r;
  check_mpi(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &r), "MPI_Iallgather");
  complete(r, "allgather");
}

void MpiCommunicator::do_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes) {
  const std::vector<std::size_t> offsets = block_offsets(bytes);
  const ByteUnit u({bytes, offsets});
  const std::vector<int> counts = u.count(bytes, "allgatherv"), displs = u.count(offsets, "allgatherv");
  MPI_Request r;
  check_mpi(MPI_Iallgatherv(send, counts[std::size_t(rank())], u.type(), recv, counts.data(), displs.data(), u.type(),
                            comm_, &r),
            "MPI_Iallgatherv");
  complete(r, "allgatherv");
}

void MpiCommunicator::do_gather(const void* send, void* recv, std::size_t bytes, int root) {
  const int n = as_count(bytes, "gather");
  MPI_Request r;
  check_mpi(MPI_Igather(send, n, MPI_BYTE, recv, n, MPI_BYTE, root, comm_, &r), "MPI_Igather");
  complete(r, "gather");
}

void MpiCommunicator::do_reduce_scatter_sum(const float* send, float* recv, std::size_t count) {
  MPI_Request r;
  check_mpi(MPI_Ireduce_scatter_block(send, recv, as_count(count, "reduce_scatter"), MPI_FLOAT, MPI_SUM, comm_, &r),
            "MPI_Ireduce_scatter_block");
  complete(r, "reduce_scatter_block");
}

void MpiCommunicator::do_reduce_scatter_sum_v(const float* send, float* recv, std::span<const std::size_t> counts) {
  std::vector<int> n;
  for (std::size_t c : counts) n.push_back(as_count(c, "reduce_scatter"));
  MPI_Request r;
  check_mpi(MPI_Ireduce_scatter(send, recv, n.data(), MPI_FLOAT, MPI_SUM, comm_, &r), "MPI_Ireduce_scatter");
  complete(r, "reduce_scatter");
}

void MpiCommunicator::do_allreduce(void* data, std::size_t n, ScalarType type, ReduceOp op) {
  MPI_Request r;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, as_count(n, "allreduce"), mpi_type(type), mpi_op(op), comm_, &r),
            "MPI_Iallreduce");
  complete(r, "allreduce");
}

void MpiCommunicator::do_broadcast(void* data, std::size_t bytes, int root) {
  MPI_Request r;
  check_mpi(MPI_Ibcast(data, as_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
  complete(r, "bcast");
}

void MpiCommunicator::do_barrier() {
  MPI_Request r;
  check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  complete(r, "barrier");
}

std::unique_ptr<Request::Impl> MpiCommunicator::do_isend(const void* data, std::size_t bytes, int dest, int tag) {
  MPI_Request r;
  check_mpi(MPI_Isend(data, as_count(bytes, "isend"), MPI_BYTE, dest, tag, comm_, &r), "MPI_Isend");
  return std::make_unique<MpiRequest>(r, shared_watchdog(), names_, current_op().empty() ? "isend" : current_op(), dest,
                                      tag, bytes);
}

std::unique_ptr<Request::Impl> MpiCommunicator::do_irecv(void* data, std::size_t bytes, int src, int tag) {
  MPI_Request r;
  check_mpi(MPI_Irecv(data, as_count(bytes, "irecv"), MPI_BYTE, src, tag, comm_, &r), "MPI_Irecv");
  return std::make_unique<MpiRequest>(r, shared_watchdog(), names_, "", src, tag, bytes);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MPI_Comm sub;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  std::unique_ptr<Communicator> child(new MpiCommunicator(sub, 0, 0));
  share_watchdog(*child);
  return child;
}

int MpiCommunicator::ranks_on_this_node() {
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  const int n = size_of(node);
  MPI_Comm_free(&node);
  return n;
}

namespace {

// The session waiting to start MPI (at most one: a program has one MpiSession), under its mutex.
std::mutex deferred_mutex;
MpiSession* deferred = nullptr;

}  // namespace

bool started_by_mpi_launcher() {
  // Open MPI's mpirun (v1-v4) and prterun (v5); any PMIx server (Open MPI >= 4, srun
  // --mpi=pmix, Hydra with PMIx); Hydra's and srun --mpi=pmi2's PMI-1/2 wire-up; MVAPICH's
  // mpirun_rsh; every Slurm task (srun's, and a batch script's: MPI starts then, as always);
  // Flux; HPE PALS and Cray ALPS (aprun). A false positive costs only the eager start every
  // process paid before; a launcher missing here would leave each of its ranks a world of one.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT",
                           "MV2_COMM_WORLD_RANK", "SLURM_PROCID", "FLUX_TASK_RANK", "PALS_RANKID", "ALPS_APP_PE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

MpiSession::MpiSession(int& argc, char**& argv, Start start) : argc_(&argc), argv_(&argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    return;
  }
  if (start == Start::now || started_by_mpi_launcher()) {
    init();
    return;
  }
  const std::lock_guard<std::mutex> lock(deferred_mutex);
  deferred = this;
}

void MpiSession::init() {
  MPI_Init(argc_, argv_);
  owns_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
}

MpiSession::~MpiSession() {
  {
    const std::lock_guard<std::mutex> lock(deferred_mutex);
    if (deferred == this) deferred = nullptr;
  }
  if (owns_) MPI_Finalize();
}

void start_deferred_mpi() {
  const std::lock_guard<std::mutex> lock(deferred_mutex);
  if (deferred == nullptr) return;
  int initialized = 0;
  MPI_Initialized(&initialized);  // by someone else meanwhile (mpi4py, a test's main): theirs
  if (!initialized) deferred->init();
  deferred = nullptr;
}

}  // namespace ulysses
