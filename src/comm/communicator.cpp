// The backend-independent half of every communicator: byte counters, error agreement.
#include "ulysses/comm/communicator.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "ulysses/core/error.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses {

namespace {

// A traced request: its first blocking wait goes on the timeline as "wait <op>".
class TracedRequest final : public Request::Impl {
 public:
  TracedRequest(std::unique_ptr<Request::Impl> inner, const Communicator& comm, std::string op, std::int64_t bytes)
      : inner_(std::move(inner)), comm_(comm), op_(std::move(op)), bytes_(bytes) {}
  void wait() override {
    if (done_) return;
    const double t0 = comm_.now();
    inner_->wait();
    done_ = true;
    comm_.trace("wait " + op_, t0, comm_.now(), "wait", bytes_);
  }
  bool test() override { return done_ = done_ || inner_->test(); }

 private:
  std::unique_ptr<Request::Impl> inner_;
  const Communicator& comm_;
  std::string op_;
  std::int64_t bytes_;
  bool done_ = false;
};

}  // namespace

Tracer* Communicator::tracer() const { return tracer_ ? tracer_ : trace_parent_ ? trace_parent_->tracer() : nullptr; }

void Communicator::trace(const std::string& name, double begin_s, double end_s, const char* category,
                         std::int64_t bytes) const {
  if (Tracer* t = tracer()) t->record(trace_prefix_ + name, category, begin_s, end_s, bytes);
}

void Communicator::trace_through(const Communicator& parent, const std::string& prefix) {
  trace_parent_ = &parent;
  trace_prefix_ = prefix + ".";
}

void Communicator::trace_op(const std::string& op, double begin_s, std::int64_t bytes, std::int64_t messages) const {
  if (Tracer* t = tracer()) t->record(trace_prefix_ + op, "comm", begin_s, now(), bytes, messages);
}

class Communicator::OpScope {
 public:
  OpScope(Communicator& c, const std::string& op) : c_(c) { c_.op_ = &op; }
  ~OpScope() { c_.op_ = nullptr; }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Communicator& c_;
};

const std::string& Communicator::current_op() const {
  static const std::string none;
  return op_ ? *op_ : none;
}

void Communicator::count_op(const std::string& op, std::int64_t bytes, std::int64_t messages, double begin_s) {
  CommCounter& c = counters_[op];
  c.calls += 1;
  c.bytes_sent += bytes;
  c.messages += messages;
  trace_op(op, begin_s, bytes, messages);
}

template <class Run>
void Communicator::counted(const std::string& op, std::int64_t bytes, std::int64_t messages, Run&& run) {
  ++collectives_;
  const OpScope scope(*this, op);
  const double t0 = now();
  run();
  count_op(op, bytes, messages, t0);
}

template <class Run>
void Communicator::uncounted(const char* name, Run&& run) {
  ++collectives_;
  const double t0 = now();
  run();
  trace_op(name, t0, -1, -1);
}

void Communicator::alltoall(const void* send, void* recv, std::size_t bytes_per_rank, const std::string& op) {
  counted(op, std::int64_t(bytes_per_rank) * (size_ - 1), size_ - 1, [&] { do_alltoall(send, recv, bytes_per_rank); });
}

void Communicator::check_per_rank(const char* what, std::initializer_list<std::size_t> sizes) const {
  for (std::size_t n : sizes)
    if (n != std::size_t(size_)) throw Error(fmt::format("{}: {} entries given for {} ranks", what, n, size_));
}

void Communicator::alltoallv(const void* send, std::span<const std::size_t> send_bytes,
                             std::span<const std::size_t> send_offsets, void* recv,
                             std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets,
                             const std::string& op) {
  check_per_rank("alltoallv", {send_bytes.size(), send_offsets.size(), recv_bytes.size(), recv_offsets.size()});
  const auto [bytes, messages] = alltoallv_sent(send_bytes);
  counted(op, bytes, messages,
          [&] { do_ialltoallv(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets)->wait(); });
}

std::pair<std::int64_t, std::int64_t> Communicator::alltoallv_sent(std::span<const std::size_t> send_bytes) const {
  std::int64_t bytes = 0, messages = 0;
  for (int j = 0; j < size_; ++j)
    if (j != rank_ && send_bytes[std::size_t(j)] > 0) {
      bytes += std::int64_t(send_bytes[std::size_t(j)]);
      ++messages;
    }
  return {bytes, messages};
}

Request Communicator::host_ialltoallv(const void* send, std::span<const std::size_t> send_bytes,
                                      std::span<const std::size_t> send_offsets, void* recv,
                                      std::span<const std::size_t> recv_bytes,
                                      std::span<const std::size_t> recv_offsets, const std::string& op) {
  ++collectives_;
  const OpScope scope(*this, op);
  const double t0 = now();
  std::unique_ptr<Request::Impl> impl = do_ialltoallv(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets);
  const auto [sent, messages] = alltoallv_sent(send_bytes);
  count_op(op, sent, messages, t0);
  if (!tracer()) return Request(std::move(impl));
  std::int64_t bytes = 0;
  for (std::size_t b : send_bytes) bytes += std::int64_t(b);
  return Request(std::make_unique<TracedRequest>(std::move(impl), *this, op, bytes));
}

void Communicator::allgather(const void* send, void* recv, std::size_t bytes, const std::string& op) {
  counted(op, std::int64_t(bytes) * (size_ - 1), size_ - 1, [&] { do_allgather(send, recv, bytes); });
}

void Communicator::host_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes,
                                   const std::string& op) {
  counted(op, std::int64_t(bytes[std::size_t(rank_)]) * (size_ - 1), size_ - 1,
          [&] { do_allgatherv(send, recv, bytes); });
}

std::vector<std::int64_t> Communicator::allgather_value(std::int64_t value, const std::string& op) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(size_));
  allgather(&value, all.data(), sizeof(value), op);
  return all;
}

void Communicator::gather(const void* send, void* recv, std::size_t bytes, int root, const std::string& op) {
  counted(op, rank_ == root ? 0 : std::int64_t(bytes), rank_ == root ? 0 : 1,
          [&] { do_gather(send, recv, bytes, root); });
}

void Communicator::reduce_scatter_sum(const float* send, float* recv, std::size_t count, const std::string& op) {
  counted(op, std::int64_t(count * sizeof(float)) * (size_ - 1), size_ - 1,
          [&] { do_reduce_scatter_sum(send, recv, count); });
}

void Communicator::host_reduce_scatter_sum(const float* send, float* recv, std::span<const std::size_t> counts,
                                           const std::string& op) {
  std::size_t others = 0;
  for (int j = 0; j < size_; ++j)
    if (j != rank_) others += counts[std::size_t(j)];
  counted(op, std::int64_t(others * sizeof(float)), size_ - 1, [&] { do_reduce_scatter_sum_v(send, recv, counts); });
}

void Communicator::allreduce_sum(double* data, std::size_t n, const std::string& op) {
  counted(op, std::int64_t(n * sizeof(double)), 0, [&] { do_allreduce(data, n, ScalarType::f64, ReduceOp::sum); });
}

void Communicator::allreduce_sum(float* data, std::size_t n, const std::string& op) {
  counted(op, std::int64_t(n * sizeof(float)), 0, [&] { do_allreduce(data, n, ScalarType::f32, ReduceOp::sum); });
}

Request Communicator::host_isend(const void* data, std::size_t bytes, int dest, int tag, const std::string& op) {
  const OpScope scope(*this, op);
  const double t0 = now();
  std::unique_ptr<Request::Impl> impl = do_isend(data, bytes, dest, tag);
  if (dest != rank_) count_op(op, std::int64_t(bytes), 1, t0);
  if (!tracer()) return Request(std::move(impl));
  return Request(std::make_unique<TracedRequest>(std::move(impl), *this, op, std::int64_t(bytes)));
}

Request Communicator::host_irecv(void* data, std::size_t bytes, int src, int tag, const std::string& op) {
  std::unique_ptr<Request::Impl> impl = do_irecv(data, bytes, src, tag);
  if (!tracer()) return Request(std::move(impl));
  return Request(std::make_unique<TracedRequest>(std::move(impl), *this, op, std::int64_t(bytes)));
}

// The uncounted operations, traced all the same: they synchronise the ranks.
void Communicator::allreduce_min(std::int64_t* data, std::size_t n) {
  uncounted("allreduce_min", [&] { do_allreduce(data, n, ScalarType::i64, ReduceOp::min); });
}

void Communicator::allreduce_max(std::int64_t* data, std::size_t n) {
  uncounted("allreduce_max", [&] { do_allreduce(data, n, ScalarType::i64, ReduceOp::max); });
}

void Communicator::allreduce_max(double* data, std::size_t n) {
  uncounted("allreduce_max", [&] { do_allreduce(data, n, ScalarType::f64, ReduceOp::max); });
}

void Communicator::broadcast(void* data, std::size_t bytes, int root) {
  uncounted("broadcast", [&] { do_broadcast(data, bytes, root); });
}

void Communicator::barrier() {
  uncounted("barrier", [&] { do_barrier(); });
}

void Communicator::absorb_counters(Communicator& sub, const std::string& prefix) {
  for (const auto& [op, c] : sub.counters_) {
    CommCounter& mine = counters_[prefix + "." + op];
    mine.calls += c.calls;
    mine.bytes_sent += c.bytes_sent;
    mine.messages += c.messages;
  }
  sub.reset_counters();
}

void Communicator::agree(const std::string& local_error) {
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

namespace {
// FNV-1a: the same 64 bits for the same text on every host and build.
std::int64_t text_hash(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return std::int64_t(h);
}
}  // namespace

void Communicator::agree_identical(const std::string& what, const std::string& description) {
  // The common case costs one small all-gather (a hash per rank); only when the hashes differ
  // do the texts travel, to name what differs.
  const std::vector<std::int64_t> hashes = allgather_value(text_hash(description), "validate");
  if (std::any_of(hashes.begin(), hashes.end(), [&](std::int64_t h) { return h != hashes[0]; }))
    throw_differing(what, description);
}

std::vector<std::int64_t> Communicator::agree_all(const std::string& local_error, const std::string& what,
                                                  const std::string& description,
                                                  std::span<const std::int64_t> values) {
  // One record per rank: [failed, hash of the description, values...]. Every rank sees every
  // record, so every rank takes the same branch below: the rare ones then pay for the texts.
  const std::size_t n = values.size() + 2;
  std::vector<std::int64_t> mine{local_error.empty() ? 0 : 1, text_hash(description)};
  mine.insert(mine.end(), values.begin(), values.end());
  std::vector<std::int64_t> all(n * std::size_t(size_));
  allgather(mine.data(), all.data(), n * sizeof(std::int64_t), "validate");
  bool failed = false, differ = false;
  for (std::size_t r = 0; r < std::size_t(size_); ++r) {
    failed = failed || all[r * n] != 0;
    differ = differ || all[r * n + 1] != all[1];
  }
  if (failed) agree(local_error);
  if (differ) throw_differing(what, description);
  std::vector<std::int64_t> out;
  for (std::size_t r = 0; r < std::size_t(size_); ++r) out.insert(out.end(), &all[r * n + 2], &all[r * n + n]);
  return out;
}

void Communicator::throw_differing(const std::string& what, const std::string& description) {
  // The texts travel padded to the longest.
  std::int64_t longest = std::int64_t(description.size());
  allreduce_max(&longest, 1);
  std::string mine = description;
  mine.resize(std::size_t(longest), '\0');
  std::string all(mine.size() * std::size_t(size_), '\0');
  allgather(mine.data(), all.data(), mine.size(), "validate");
  auto text = [&](int r) {
    std::string s = all.substr(std::size_t(r) * mine.size(), mine.size());
    return s.substr(0, s.find('\0'));
  };
  for (int r = 1; r < size_; ++r)
    if (text(r) != text(0))
      throw Error(fmt::format("{} differ between ranks: rank 0 has {}, rank {} has {}", what, text(0), r, text(r)));
  throw Error(fmt::format("{} differ between ranks (texts of one hash)", what));
}

int default_threads(Communicator& comm) {
  const int ranks_on_node = comm.ranks_on_this_node();
  int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  int allowed = cores;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = CPU_COUNT(&set);
  return std::max(1, std::min(cores / std::max(1, ranks_on_node), allowed));
}

}  // namespace ulysses
