// The torch.distributed backend: Communicator's hooks as calls of the Python transport.
#include "torch_communicator.hpp"

#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "ulysses/core/error.hpp"

namespace py = pybind11;

namespace ulysses {
namespace {

// The transport and the names the watchdog prints; shared with requests, which may outlive the
// communicator. The Python object is released with the GIL held.
struct Transport {
  py::object obj;
  int rank = 0, size = 1;
  std::string me, group;
  ~Transport() {
    py::gil_scoped_acquire gil;
    obj = py::object();
  }
};

// A numpy array over `bytes` bytes at `data` as `dtype`, without a copy: the base object keeps
// numpy from owning (or copying) the memory, which the caller keeps alive until the work ends.
py::array array_over(const void* data, std::size_t bytes, const char* dtype = "uint8") {
  static int anchor = 0;
  const py::dtype dt(dtype);
  const py::ssize_t n = py::ssize_t(bytes / std::size_t(dt.itemsize()));
  return py::array(dt, {n}, {py::ssize_t(dt.itemsize())}, const_cast<void*>(data), py::capsule(&anchor, [](void*) {}));
}

std::vector<std::size_t> prefix_offsets(std::span<const std::size_t> bytes) {
  std::vector<std::size_t> offsets(bytes.size(), 0);
  for (std::size_t j = 1; j < bytes.size(); ++j) offsets[j] = offsets[j - 1] + bytes[j - 1];
  return offsets;
}

// Whether blocks at these offsets lie back to back from offset 0 in rank order (empty ones may
// lie anywhere): then the buffer goes to torch as it is, else through a staging copy.
bool back_to_back(std::span<const std::size_t> bytes, std::span<const std::size_t> offsets) {
  const std::vector<std::size_t> packed = prefix_offsets(bytes);
  for (std::size_t j = 0; j < bytes.size(); ++j)
    if (bytes[j] != 0 && offsets[j] != packed[j]) return false;
  return true;
}

// Reads the transport's attributes (with the GIL held).
std::shared_ptr<Transport> transport_of(py::object transport) {
  auto t = std::make_shared<Transport>();
  t->rank = transport.attr("rank").cast<int>();
  t->size = transport.attr("size").cast<int>();
  t->me = transport.attr("me").cast<std::string>();
  t->group = transport.attr("name").cast<std::string>();
  t->obj = std::move(transport);
  return t;
}

std::size_t total(std::span<const std::size_t> bytes) {
  return std::accumulate(bytes.begin(), bytes.end(), std::size_t(0));
}

// One posted torch Work. wait() polls it under the watchdog; completion runs `finish` (unstaging).
class WorkRequest final : public Request::Impl {
 public:
  WorkRequest(py::object work, std::shared_ptr<const Watchdog> dog, std::shared_ptr<Transport> t, std::string what,
              std::function<void()> finish)
      : work_(std::move(work)), dog_(std::move(dog)), t_(std::move(t)), what_(std::move(what)),
        finish_(std::move(finish)) {}
  ~WorkRequest() override {
    try {
      wait();
    } catch (const Error&) {  // a transport error while unwinding: the error in flight says more
    }
    py::gil_scoped_acquire gil;
    work_ = py::object();
  }
  void wait() override {
    if (done_) return;
    if (!dog_->wait([this] { return waited(); })) {
      std::fprintf(stderr, "%s\n", dog_->message(t_->me, fmt::format("{} on {}", what_, t_->group)).c_str());
      std::fflush(stderr);
      std::_Exit(Watchdog::kExitCode);  // torchrun's agent ends the other ranks
    }
    complete();
  }
  bool test() override {
    if (!done_ && completed()) complete();
    return done_;
  }

 private:
  bool completed() {
    py::gil_scoped_acquire gil;
    return work_.attr("is_completed")().cast<bool>();
  }
  // Whether the work completed within a slice of blocking wait (the transport's `done`, GIL
  // released): the thread sleeps until gloo signals, where polling is_completed took turns with
  // gloo's own threads for the core (1-2 ms a small collective on a loaded host). The slice
  // bounds how late the watchdog fires.
  bool waited() {
    constexpr double kSliceS = 0.05;
    py::gil_scoped_acquire gil;
    return t_->obj.attr("done")(work_, kSliceS).cast<bool>();
  }
  void complete() {
    done_ = true;
    {
      py::gil_scoped_acquire gil;
      try {
        work_.attr("wait")();  // raises what the transport met (a peer gone, gloo's own timeout)
      } catch (py::error_already_set& e) {
        throw Error(fmt::format("torch.distributed failed in {} on {}: {}", what_, t_->group, e.what()));
      }
    }
    if (finish_) finish_();
  }
  py::object work_;
  std::shared_ptr<const Watchdog> dog_;
  std::shared_ptr<Transport> t_;
  std::string what_;
  std::function<void()> finish_;
  bool done_ = false;
};

class TorchCommunicator final : public Communicator {
 public:
  explicit TorchCommunicator(std::shared_ptr<Transport> t) : Communicator(t->rank, t->size), t_(std::move(t)) {}

  const char* backend() const override { return "torch"; }
  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  std::unique_ptr<Communicator> split(int color, int key) override;
  int ranks_on_this_node() override;

 protected:
  void do_alltoall(const void* send, void* recv, std::size_t bytes_per_rank) override {
    const std::vector<std::size_t> counts(std::size_t(size()), bytes_per_rank);
    const std::vector<std::size_t> offsets = prefix_offsets(counts);
    do_ialltoallv(send, counts, offsets, recv, counts, offsets)->wait();
  }
  std::unique_ptr<Request::Impl> do_ialltoallv(const void* send, std::span<const std::size_t> send_bytes,
                                               std::span<const std::size_t> send_offsets, void* recv,
                                               std::span<const std::size_t> recv_bytes,
                                               std::span<const std::size_t> recv_offsets) override;
  void do_allgather(const void* send, void* recv, std::size_t bytes) override {
    run("allgather",
        [&] { return py::make_tuple(array_over(send, bytes), array_over(recv, bytes * std::size_t(size()))); });
  }
  void do_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes) override;
  void do_gather(const void* send, void* recv, std::size_t bytes, int root) override {
    std::vector<std::byte> all(bytes * std::size_t(size()));
    do_allgather(send, all.data(), bytes);
    if (rank() == root) std::memcpy(recv, all.data(), all.size());
  }
  void do_reduce_scatter_sum(const float* send, float* recv, std::size_t count) override {
    do_reduce_scatter_sum_v(send, recv, std::vector<std::size_t>(std::size_t(size()), count));
  }
  void do_reduce_scatter_sum_v(const float* send, float* recv, std::span<const std::size_t> counts) override;
  void do_allreduce(void* data, std::size_t n, ScalarType type, ReduceOp op) override {
    static const char* const names[] = {"float32", "float64", "int64"};
    static const std::size_t sizes[] = {4, 8, 8};
    const int t = int(type);
    const char* how = op == ReduceOp::sum ? "sum" : op == ReduceOp::min ? "min" : "max";
    run("allreduce", [&] { return py::make_tuple(array_over(data, n * sizes[t], names[t]), how); });
  }
  void do_broadcast(void* data, std::size_t bytes, int root) override {
    run("broadcast", [&] { return py::make_tuple(array_over(data, bytes), root); });
  }
  void do_barrier() override {
    run("barrier", [] { return py::tuple(); });
  }
  std::unique_ptr<Request::Impl> do_isend(const void* data, std::size_t bytes, int dest, int tag) override {
    const std::string what = fmt::format("the send '{}' to rank {} (tag {}, {} bytes)",
                                         current_op().empty() ? "isend" : current_op(), dest, tag, bytes);
    return post("isend", what, [&] { return py::make_tuple(array_over(data, bytes), dest, tag); });
  }
  std::unique_ptr<Request::Impl> do_irecv(void* data, std::size_t bytes, int src, int tag) override {
    const std::string what = fmt::format("the receive from rank {} (tag {}, {} bytes)", src, tag, bytes);
    return post("irecv", what, [&] { return py::make_tuple(array_over(data, bytes), src, tag); });
  }

 private:
  // Calls transport.<method>(*args()), which posts the operation and returns its Work; the
  // arguments are Python objects, so they are made (and dropped) with the GIL held.
  std::unique_ptr<Request::Impl> post(const char* method, std::string what, const std::function<py::tuple()>& args,
                                      std::function<void()> finish = {}) {
    py::gil_scoped_acquire gil;
    py::object work;
    try {
      work = t_->obj.attr(method)(*args());
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("torch.distributed failed to start {} on {}: {}", method, t_->group, e.what()));
    }
    return std::make_unique<WorkRequest>(std::move(work), shared_watchdog(), t_, std::move(what), std::move(finish));
  }
  void run(const char* method, const std::function<py::tuple()>& args) {
    const std::string& op = current_op();
    post(method, op.empty() ? method : fmt::format("{} ('{}')", method, op), args)->wait();
  }
  std::shared_ptr<Transport> t_;
};

std::unique_ptr<Request::Impl> TorchCommunicator::do_ialltoallv(const void* send,
                                                                std::span<const std::size_t> send_bytes,
                                                                std::span<const std::size_t> send_offsets, void* recv,
                                                                std::span<const std::size_t> recv_bytes,
                                                                std::span<const std::size_t> recv_offsets) {
  // all_to_all_single takes blocks back to back in rank order: stage the sides that are not.
  auto staged_send = std::make_shared<std::vector<std::byte>>();
  const void* s = send;
  if (!back_to_back(send_bytes, send_offsets)) {
    staged_send->resize(total(send_bytes));
    const std::vector<std::size_t> packed = prefix_offsets(send_bytes);
    for (std::size_t j = 0; j < send_bytes.size(); ++j)
      if (send_bytes[j] != 0)
        std::memcpy(staged_send->data() + packed[j], static_cast<const std::byte*>(send) + send_offsets[j],
                    send_bytes[j]);
    s = staged_send->data();
  }
  std::function<void()> finish = [staged_send] {};
  void* r = recv;
  if (!back_to_back(recv_bytes, recv_offsets)) {
    auto staged = std::make_shared<std::vector<std::byte>>(total(recv_bytes));
    r = staged->data();
    finish = [staged, staged_send, recv, bytes = std::vector<std::size_t>(recv_bytes.begin(), recv_bytes.end()),
              offsets = std::vector<std::size_t>(recv_offsets.begin(), recv_offsets.end())] {
      const std::vector<std::size_t> packed = prefix_offsets(bytes);
      for (std::size_t j = 0; j < bytes.size(); ++j)
        if (bytes[j] != 0)
          std::memcpy(static_cast<std::byte*>(recv) + offsets[j], staged->data() + packed[j], bytes[j]);
    };
  }
  const std::vector<std::size_t> sb(send_bytes.begin(), send_bytes.end()), rb(recv_bytes.begin(), recv_bytes.end());
  const std::string& op = current_op();
  return post(
      "alltoallv", op.empty() ? "alltoallv" : fmt::format("alltoallv ('{}')", op),
      [&] { return py::make_tuple(array_over(s, total(sb)), sb, array_over(r, total(rb)), rb); }, std::move(finish));
}

void TorchCommunicator::do_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes) {
  const std::size_t most = *std::max_element(bytes.begin(), bytes.end());
  if (std::all_of(bytes.begin(), bytes.end(), [&](std::size_t b) { return b == most; }))
    return do_allgather(send, recv, most);
  std::vector<std::byte> mine(most), all(most * bytes.size());  // gloo's all-gather takes equal blocks
  std::memcpy(mine.data(), send, bytes[std::size_t(rank())]);
  do_allgather(mine.data(), all.data(), most);
  const std::vector<std::size_t> offsets = prefix_offsets(bytes);
  for (std::size_t j = 0; j < bytes.size(); ++j)
    std::memcpy(static_cast<std::byte*>(recv) + offsets[j], all.data() + j * most, bytes[j]);
}

void TorchCommunicator::do_reduce_scatter_sum_v(const float* send, float* recv, std::span<const std::size_t> counts) {
  const std::size_t p = counts.size(), mine = counts[std::size_t(rank())];
  std::vector<std::size_t> send_bytes(p), recv_bytes(p, mine * sizeof(float));
  for (std::size_t j = 0; j < p; ++j) send_bytes[j] = counts[j] * sizeof(float);
  std::vector<float> parts(mine * p);  // every rank's block j for this rank, in rank order
  do_ialltoallv(send, send_bytes, prefix_offsets(send_bytes), parts.data(), recv_bytes, prefix_offsets(recv_bytes))
      ->wait();
  for (std::size_t i = 0; i < mine; ++i) {
    float sum = 0;
    for (std::size_t j = 0; j < p; ++j) sum += parts[j * mine + i];  // rank order: the same on every run
    recv[i] = sum;
  }
}

std::unique_ptr<Communicator> TorchCommunicator::split(int color, int key) {
  const std::vector<std::int64_t> mine{color, key};
  std::vector<std::int64_t> all(2 * std::size_t(size()));
  allgather(mine.data(), all.data(), sizeof(std::int64_t) * 2, "split");
  std::vector<int> members;  // this group's ranks of the same color, ordered by (key, rank)
  for (int r = 0; r < size(); ++r)
    if (all[2 * std::size_t(r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * std::size_t(a) + 1] < all[2 * std::size_t(b) + 1]; });
  py::gil_scoped_acquire gil;
  py::object sub;
  try {
    sub = t_->obj.attr("subgroup")(members);
  } catch (py::error_already_set& e) {
    throw Error(fmt::format("torch.distributed failed to split {}: {}", t_->group, e.what()));
  }
  auto child = std::make_unique<TorchCommunicator>(transport_of(std::move(sub)));
  share_watchdog(*child);
  return child;
}

int TorchCommunicator::ranks_on_this_node() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const auto mine = std::int64_t(std::hash<std::string>{}(host));
  const std::vector<std::int64_t> all = allgather_value(mine, "ranks_on_this_node");
  return int(std::count(all.begin(), all.end(), mine));
}

}  // namespace

std::shared_ptr<Communicator> make_torch_communicator(py::object transport) {
  return std::make_shared<TorchCommunicator>(transport_of(std::move(transport)));
}

}  // namespace ulysses
