// Communicator — a process group behind one interface (c10d's ProcessGroup, NCCL's ncclComm):
// an object that owns its group, no globals. Everything above the communication layer talks
// to this interface only; MpiCommunicator (mpi_communicator.hpp) is today's backend, and a
// NCCL or in-process backend is one more subclass.
//
// The public methods are not virtual: they check sizes, count the bytes this rank sends
// under an operation name (so tests and reports can check volumes against their formulas
// exactly, whatever the backend) and call the backend's protected do_* hooks.
//
// All methods marked "collective" must be called by every rank of the communicator in the
// same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ulysses/core/tensor.hpp"
#include "ulysses/comm/watchdog.hpp"

namespace ulysses {

class Tracer;

struct CommCounter {
  std::int64_t calls = 0;
  std::int64_t bytes_sent = 0;  // payload bytes this rank sent to other ranks (not to itself)
  std::int64_t messages = 0;    // point-to-point messages to other ranks
};

// Memory a collective or message reads or writes: where it starts, its size, what it holds and
// on which device. A backend moves the memory of the devices it reaches() in place; for any
// other, the collectives stage the bytes through host buffers with the device's table
// (to_host / from_host, device_ops.hpp), so every backend takes every device's tensors and a
// device-aware one (NCCL for CUDA memory) moves them directly. Host memory converts as it is
// (`{pointer, bytes}`, a vector), so host callers read as before; only memory a collective
// receives into is written, whatever the constness it came with.
struct Buffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  Buffer() = default;
  Buffer(void* data, std::size_t bytes, DType dtype, Device device)
      : data(data), bytes(bytes), dtype(dtype), device(device) {}
  // Host memory: `bytes` bytes at `data`.
  Buffer(const void* data, std::size_t bytes) : data(const_cast<void*>(data)), bytes(bytes) {}
  // A host vector's elements.
  template <class T>
  Buffer(const std::vector<T>& v) : Buffer(v.data(), v.size() * sizeof(T)) {}  // NOLINT: implicit on purpose
};
// The memory of a view that is one dense block (Error otherwise), or of a tensor.
Buffer buffer_of(const TensorView& view);
Buffer buffer_of(const Tensor& tensor);

enum class ReduceOp { sum, min, max };
enum class ScalarType { f32, f64, i64 };  // what an all-reduce adds up

// A pending nonblocking send or receive (c10d's Work). wait() is idempotent; the destructor
// waits, so a request can never be forgotten while the backend still owns its buffer. Both
// wait under the communicator's watchdog (Communicator::set_timeout).
class Request {
 public:
  // The backend's handle. Its destructor must wait for (or cancel) the transfer.
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;  // true when complete; also drives the backend's progress
  };

  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;  // the old one waits in its destructor
  void wait() {
    if (impl_) impl_->wait();
  }
  bool test() { return !impl_ || impl_->test(); }

 private:
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual const char* backend() const = 0;  // "mpi", ...
  // Seconds on the backend's clock (MPI_Wtime for MPI): what strategies time themselves with.
  virtual double now() const = 0;

  // Collective. Sends `bytes_per_rank` bytes from send + j*bytes_per_rank to rank j and
  // receives rank j's block into recv + j*bytes_per_rank. Counted under `op`.
  void alltoall(const void* send, void* recv, std::size_t bytes_per_rank, const std::string& op = "alltoall");
  // Collective. Blocks of any size: sends send_bytes[j] bytes at send + send_offsets[j] to rank j
  // and receives recv_bytes[j] bytes from rank j at recv + recv_offsets[j] (size() entries
  // each, in bytes; what j sends to i is what i expects from j). A zero count for this rank's
  // own block lets the caller move it itself (straight into place, saving a copy). Counts the
  // bytes and the non-empty blocks sent to other ranks: no padding, whatever the sizes.
  void alltoallv(const void* send, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_offsets,
                 void* recv, std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets,
                 const std::string& op = "alltoallv");
  // Collective, nonblocking: alltoallv posted now (and counted now), complete when the Request
  // is (its wait is under the watchdog like every other). The buffers must stay untouched until
  // then; several may be in flight, posted in the same order on every rank. Pipelines call the
  // Request's test() between pieces of compute so the transfer progresses. Byte counts and
  // offsets are within the buffers, which must hold them (Error otherwise); a staged request
  // writes what it received to the device when it is waited for.
  Request ialltoallv(const Buffer& send, std::span<const std::size_t> send_bytes,
                     std::span<const std::size_t> send_offsets, const Buffer& recv,
                     std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets,
                     const std::string& op = "alltoallv");
  // Collective. Every rank contributes `bytes`; recv holds size() blocks in rank order.
  void allgather(const void* send, void* recv, std::size_t bytes, const std::string& op = "allgather");
  // Collective. Every rank contributes bytes[rank()] bytes; recv holds every rank's block back
  // to back in rank order, bytes[j] from rank j.
  void allgatherv(const Buffer& send, const Buffer& recv, std::span<const std::size_t> bytes,
                  const std::string& op = "allgatherv");
  // Collective. Every rank's `value`, in rank order (an all-gather of one int64, counted under `op`).
  std::vector<std::int64_t> allgather_value(std::int64_t value, const std::string& op = "allgather");
  // Collective. root receives size() blocks of `bytes` in rank order into recv.
  void gather(const void* send, void* recv, std::size_t bytes, int root, const std::string& op = "gather");
  // Collective. send holds size() blocks of `count` floats in rank order; block j is summed
  // over ranks and lands in rank j's recv. Counts the (size()−1) blocks each rank sends.
  void reduce_scatter_sum(const float* send, float* recv, std::size_t count, const std::string& op = "reduce_scatter");
  // Collective. The same with blocks of counts[j] floats back to back in rank order (this
  // rank receives counts[rank()]), in float32 buffers. Counts the other ranks' blocks.
  void reduce_scatter_sum(const Buffer& send, const Buffer& recv, std::span<const std::size_t> counts,
                          const std::string& op = "reduce_scatter");
  // Collective. In-place reductions over ranks (sums are counted, min/max are bookkeeping).
  void allreduce_sum(double* data, std::size_t n, const std::string& op = "allreduce");
  void allreduce_sum(float* data, std::size_t n, const std::string& op = "allreduce");
  void allreduce_min(std::int64_t* data, std::size_t n);
  void allreduce_max(std::int64_t* data, std::size_t n);
  void allreduce_max(double* data, std::size_t n);
  void broadcast(void* data, std::size_t bytes, int root);
  void barrier();

  // Not collective. Nonblocking point-to-point of a whole buffer; isend is counted under `op`.
  // While a tracer is attached, a wait that blocks on either shows on the timeline as "wait <op>".
  Request isend(const Buffer& data, int dest, int tag, const std::string& op = "p2p");
  Request irecv(const Buffer& data, int src, int tag, const std::string& op = "recv");
  // Whether this backend moves memory of `device` itself (MPI and the local backend: the host's).
  virtual bool reaches(Device device) const { return device == Device::cpu; }

  // Collective over this communicator: a new communicator of the ranks with the same color,
  // ordered by key (MPI_Comm_split), on the same backend.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Collective. How many ranks of this communicator share this rank's node (memory).
  virtual int ranks_on_this_node() = 0;

  // Collective error agreement. Pass "" when this rank is fine, else its error message.
  // If any rank reports an error, every rank throws the same ulysses::Error: the message of
  // the lowest failing rank, prefixed with that rank. Costs one small allreduce.
  void agree(const std::string& local_error);
  // Collective. Every rank describes what it was given (shapes, settings) as text; if any
  // rank's text differs from rank 0's, every rank throws the same Error:
  // "<what> differ between ranks: rank 0 has <text 0>, rank k has <text k>". Costs one all-gather
  // of a 64-bit hash per rank when the texts agree.
  void agree_identical(const std::string& what, const std::string& description);
  // Collective. agree(local_error), agree_identical(what, description) and an all-gather of
  // `values` (as many on every rank) in one small all-gather when every rank is fine: returns
  // every rank's values, rank r's at [r·n, (r+1)·n). Otherwise every rank throws the Error that
  // agree (first) or agree_identical would.
  std::vector<std::int64_t> agree_all(const std::string& local_error, const std::string& what,
                                      const std::string& description, std::span<const std::int64_t> values);

  // Not collective. How many collectives this rank has entered (every method above marked
  // collective but split and ranks_on_this_node; point-to-point messages are not): what tests
  // count to keep the small synchronisations before a transfer few.
  std::int64_t collectives() const { return collectives_; }

  const std::map<std::string, CommCounter>& counters() const { return counters_; }
  // Not collective. Adds `sub`'s counters to this one's as "<prefix>.<op>" and clears them:
  // a strategy working on sub-communicators reports all its traffic on the user's communicator.
  void absorb_counters(Communicator& sub, const std::string& prefix);
  void reset_counters() { counters_.clear(); }

  // Not collective. The Tracer recording this communicator's timeline (trace.hpp), or null:
  // its own, else the one of the communicator it was split from by trace_through.
  Tracer* tracer() const;
  // Not collective. Makes `tracer` record this communicator's timeline, or with null stops
  // it: what a Tracer calls on construction and destruction (it must outlive the attachment).
  void attach_tracer(Tracer* tracer) { tracer_ = tracer; }
  // Not collective. Records [begin_s, end_s] (now()'s clock) as `name` when a tracer is
  // attached: how strategies put their compute on the timeline.
  void trace(const std::string& name, double begin_s, double end_s, const char* category = "compute",
             std::int64_t bytes = -1) const;
  // Not collective. Traces this sub-communicator into `parent`'s tracer (whenever one is
  // attached there), its operations named "<prefix>.<op>" like absorb_counters'. `parent`
  // must outlive this communicator.
  void trace_through(const Communicator& parent, const std::string& prefix);
  // Not collective. The deadline of every blocking wait on this communicator (collectives,
  // Request::wait, a Request's destructor), in seconds; 0 = wait forever; 1800 unless set
  // (Watchdog::kDefaultTimeout). Shared with the communicators split from this one. When it
  // passes, the waiting rank prints one line on stderr (the operation, this rank, the peer or
  // group, the step) and the whole job ends.
  void set_timeout(double seconds) { watchdog_->set_timeout(seconds); }
  double timeout() const { return watchdog_->timeout(); }
  Watchdog& watchdog() { return *watchdog_; }
  const Watchdog& watchdog() const { return *watchdog_; }

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}
  // The backend. Arguments are as in the public methods; sizes are already checked. alltoallv
  // waits on do_ialltoallv's request.
  virtual void do_alltoall(const void* send, void* recv, std::size_t bytes_per_rank) = 0;
  virtual std::unique_ptr<Request::Impl> do_ialltoallv(const void* send, std::span<const std::size_t> send_bytes,
                                                       std::span<const std::size_t> send_offsets, void* recv,
                                                       std::span<const std::size_t> recv_bytes,
                                                       std::span<const std::size_t> recv_offsets) = 0;
  virtual void do_allgather(const void* send, void* recv, std::size_t bytes) = 0;
  virtual void do_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes) = 0;
  virtual void do_gather(const void* send, void* recv, std::size_t bytes, int root) = 0;
  virtual void do_reduce_scatter_sum(const float* send, float* recv, std::size_t count) = 0;
  virtual void do_reduce_scatter_sum_v(const float* send, float* recv, std::span<const std::size_t> counts) = 0;
  virtual void do_allreduce(void* data, std::size_t n, ScalarType type, ReduceOp op) = 0;
  virtual void do_broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Request::Impl> do_isend(const void* data, std::size_t bytes, int dest, int tag) = 0;
  virtual std::unique_ptr<Request::Impl> do_irecv(void* data, std::size_t bytes, int src, int tag) = 0;

  // For split(): the new communicator obeys this one's watchdog.
  void share_watchdog(Communicator& child) const { child.watchdog_ = watchdog_; }
  // For requests, which may outlive their communicator.
  std::shared_ptr<const Watchdog> shared_watchdog() const { return watchdog_; }
  // The caller's name for the collective in progress ("seq_to_head"), or "" (for the watchdog).
  const std::string& current_op() const;

 private:
  // The collectives over Buffers once staged: over host memory (or memory the backend
  // reaches), where they are counted and traced.
  Request host_ialltoallv(const void* send, std::span<const std::size_t> send_bytes,
                          std::span<const std::size_t> send_offsets, void* recv,
                          std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets,
                          const std::string& op);
  void host_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes, const std::string& op);
  void host_reduce_scatter_sum(const float* send, float* recv, std::span<const std::size_t> counts,
                               const std::string& op);
  Request host_isend(const void* data, std::size_t bytes, int dest, int tag, const std::string& op);
  Request host_irecv(void* data, std::size_t bytes, int src, int tag, const std::string& op);
  // Counts `op` and traces it from `begin_s` (now()'s clock) to now.
  void count_op(const std::string& op, std::int64_t bytes, std::int64_t messages, double begin_s);
  // A counted collective: `run` (the backend's call) timed, counted under `op` as `bytes` sent
  // in `messages`, traced, and `op` named to the watchdog while it runs.
  template <class Run>
  void counted(const std::string& op, std::int64_t bytes, std::int64_t messages, Run&& run);
  // An uncounted collective (agreements, checks): timed and traced under `name` all the same.
  template <class Run>
  void uncounted(const char* name, Run&& run);
  // What an all-to-all(v) sends to other ranks: bytes and non-empty blocks.
  std::pair<std::int64_t, std::int64_t> alltoallv_sent(std::span<const std::size_t> send_bytes) const;
  void trace_op(const std::string& op, double begin_s, std::int64_t bytes, std::int64_t messages) const;
  // Records the caller's operation name for the duration of one public call.
  class OpScope;
  // agree_identical's failure: every rank's text travels, and every rank throws naming the first
  // that differs from rank 0's.
  [[noreturn]] void throw_differing(const std::string& what, const std::string& description);
  // Throws Error unless every list has size() entries.
  void check_per_rank(const char* what, std::initializer_list<std::size_t> sizes) const;
  int rank_ = 0, size_ = 1;
  std::map<std::string, CommCounter> counters_;
  Tracer* tracer_ = nullptr;
  const Communicator* trace_parent_ = nullptr;
  std::string trace_prefix_;  // "" or "<group>."
  std::shared_ptr<Watchdog> watchdog_ = std::make_shared<Watchdog>();
  const std::string* op_ = nullptr;
  std::int64_t collectives_ = 0;
};

// Collective over `comm`. The node's cores divided by the ranks of `comm` on this node
// (at least 1), and never more than the cores this process may run on (its affinity mask,
// which mpirun's binding may restrict): the default never oversubscribes. set_threads
// (threads.hpp) applies it.
int default_threads(Communicator& comm);

}  // namespace ulysses
