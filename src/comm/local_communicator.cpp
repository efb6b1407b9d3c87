// The local backend of Communicator: ranks as threads sharing memory. Every collective is one
// exchange (an all-to-all of byte blocks: all-gather, gather, broadcast and barrier are
// all-to-alls with some blocks empty), a reduction or a split, posted into the group's shared
// state (local_group.hpp) and completed under the watchdog; each rank's thread copies or
// reduces what it receives itself (local_group.cpp).
#include "ulysses/comm/local_communicator.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "ulysses/core/error.hpp"
#include "local_group.hpp"
#include "ulysses/core/threads.hpp"

namespace ulysses {

namespace {

// One epoch for every local communicator of the process, so that their times compare.
const std::chrono::steady_clock::time_point g_epoch = std::chrono::steady_clock::now();

using local::Group;
using local::Kind;
using local::Op;
using local::Part;

// ---- waiting -----------------------------------------------------------------------------

// Reads every collective this rank thread has in flight whose ranks have all arrived: the
// local backend's progress engine. Without it a rank blocked in one operation would never read
// another's data, and a peer waiting for that would wait forever (MPI progresses them all).
void progress_inflight();

// Waits under the watchdog until done(), the world fails or a rank this wait needs (world
// ranks `needed`) has returned from its function. On a failure or a timeout, leave() runs (so
// nobody reads this rank's buffers any more) and an Error is thrown: the watchdog's line (also
// printed, and failing the world), or the world's failure (a rank that left fails it, named).
template <class Done, class Leave>
void wait_local(const Watchdog& dog, const Group& g, int rank, const std::vector<int>& needed, const std::string& what,
                Done&& done, Leave&& leave) {
  int gone = -1;
  const bool ok = dog.wait([&] {
    progress_inflight();
    return done() || g.world->failed() || (gone = g.world->first_left(needed)) >= 0;
  });
  if (ok && done()) return;
  std::string msg;
  if (ok && gone >= 0 && !g.world->failed()) {
    g.world->fail(gone, fmt::format("it returned from its function while {} waits for it in {} (every rank must "
                                    "make the same collective calls)",
                                    g.me(rank), what));
    msg = g.world->why();
  } else if (ok) {
    msg = g.world->ended() ? g.world->why()
                           : fmt::format("{}; {} was released from {}", g.world->why(), g.me(rank), what);
  } else {
    msg = dog.message(g.me(rank), what);
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    g.world->fail(g.world_rank[std::size_t(rank)], msg);
  }
  leave();
  throw Error(msg);
}

class CollectiveRequest final : public Request::Impl {
 public:
  CollectiveRequest(std::shared_ptr<Group> g, std::shared_ptr<Op> op, int rank, std::shared_ptr<const Watchdog> dog,
                    std::string what)
      : g_(std::move(g)), op_(std::move(op)), rank_(rank), dog_(std::move(dog)), what_(std::move(what)) {
    inflight().push_back(this);
  }
  ~CollectiveRequest() override {
    try {
      wait();
    } catch (const Error&) {  // released while unwinding: the error in flight says more
    }
    std::erase(inflight(), this);
  }
  // This thread's requests in flight (a rank's, as one thread drives a communicator).
  static std::vector<CollectiveRequest*>& inflight() {
    thread_local std::vector<CollectiveRequest*> requests;
    return requests;
  }
  static void progress_all() {
    for (CollectiveRequest* r : inflight())
      if (!r->finished_) r->progress();
  }
  bool test() override { return finished_ || (finished_ = progress()); }
  void wait() override {
    if (finished_) return;
    wait_local(
        *dog_, *g_, rank_, g_->world_rank, what_, [this] { return test(); }, [this] { leave(); });
  }

 private:
  // Reads what this rank receives once every rank has arrived; true when every rank has.
  bool progress() {
    std::unique_lock<std::mutex> lock(op_->mu);
    const int n = g_->size();
    if (!op_->pulled_by[std::size_t(rank_)] && op_->arrived == n && !op_->cancelled) {
      op_->pulled_by[std::size_t(rank_)] = 1;
      ++op_->readers;
      lock.unlock();
      const std::string error = pull(*op_, *g_, rank_);
      lock.lock();
      --op_->readers;
      ++op_->done;
      if (!error.empty()) {
        lock.unlock();
        g_->world->fail(g_->world_rank[std::size_t(rank_)], error);
        leave();
        finished_ = true;  // nothing left to wait for
        throw Error(error);
      }
    }
    return op_->done == n;
  }
  // No rank starts reading this collective's buffers any more; waits for those reading now.
  void leave() {
    for (;;) {
      {
        const std::lock_guard<std::mutex> lock(op_->mu);
        op_->cancelled = true;
        if (op_->readers == 0) return;
      }
      sched_yield();
    }
  }
  std::shared_ptr<Group> g_;
  std::shared_ptr<Op> op_;
  int rank_;
  std::shared_ptr<const Watchdog> dog_;
  std::string what_;
  bool finished_ = false;
};

void progress_inflight() { CollectiveRequest::progress_all(); }

// ---- point to point ----------------------------------------------------------------------

// Copies a matched message (the receive buffer may be larger, as with MPI, never smaller).
void deliver(const local::Pending& send, const local::Pending& recv) {
  if (send.bytes > recv.bytes) {
    const std::string e = fmt::format("a message of {} bytes (tag {}) does not fit its receive buffer of {} bytes",
                                      send.bytes, send.tag, recv.bytes);
    if (!send.copy) send.state->error = e;  // an eager send has completed: only its receive fails
    recv.state->error = e;
  } else if (send.bytes > 0) {
    std::memcpy(recv.data, send.data, send.bytes);
  }
  send.state->done.store(true, std::memory_order_release);  // an eager one already was
  recv.state->done.store(true, std::memory_order_release);
}

// Posts a send (or a receive) into `box`: delivered now if its partner is waiting there (the
// first with the same source and tag), else queued behind the earlier ones.
std::shared_ptr<local::P2pState> post_p2p(local::Mailbox& box, local::Pending mine, bool is_send) {
  mine.state = std::make_shared<local::P2pState>();
  const std::lock_guard<std::mutex> lock(box.mu);
  std::deque<local::Pending>& partners = is_send ? box.recvs : box.sends;
  auto it = std::find_if(partners.begin(), partners.end(),
                         [&](const local::Pending& p) { return p.src == mine.src && p.tag == mine.tag; });
  if (it == partners.end()) {
    if (is_send && mine.bytes <= local::kEagerBytes) {
      const auto* from = static_cast<const std::byte*>(mine.data);
      mine.copy = std::make_shared<std::vector<std::byte>>(from, from + mine.bytes);
      mine.data = mine.copy->data();
      mine.state->done.store(true, std::memory_order_release);
    }
    (is_send ? box.sends : box.recvs).push_back(mine);
  } else {
    is_send ? deliver(mine, *it) : deliver(*it, mine);
    partners.erase(it);
  }
  return mine.state;
}

class P2pRequest final : public Request::Impl {
 public:
  P2pRequest(std::shared_ptr<Group> g, int rank, int box, int peer, std::shared_ptr<local::P2pState> st,
             std::shared_ptr<const Watchdog> dog, std::string what)
      : g_(std::move(g)), rank_(rank), box_(box), peer_(peer), st_(std::move(st)), dog_(std::move(dog)),
        what_(std::move(what)) {}
  // An unmatched message is withdrawn when its rank is unwinding (MPI_Cancel): its partner
  // may never come, and nobody holds its buffer yet. Otherwise the destructor waits.
  ~P2pRequest() override {
    if (std::uncaught_exceptions() > 0) {
      withdraw();
      return;
    }
    try {
      wait();
    } catch (const Error&) {
    }
  }
  bool test() override { return st_->done.load(std::memory_order_acquire); }
  void wait() override {
    wait_local(
        *dog_, *g_, rank_, {g_->world_rank[std::size_t(peer_)]}, what_, [this] { return test(); },
        [this] { withdraw(); });
    if (!st_->error.empty()) throw Error(st_->error);
  }

 private:
  void withdraw() {
    local::Mailbox& box = g_->boxes[std::size_t(box_)];
    const std::lock_guard<std::mutex> lock(box.mu);
    for (auto* q : {&box.sends, &box.recvs})
      q->erase(std::remove_if(q->begin(), q->end(),
                              [&](const local::Pending& p) { return p.state == st_ && !p.state->done; }),
               q->end());  // an eager send, complete, stays queued: it has been sent
  }
  std::shared_ptr<Group> g_;
  int rank_, box_, peer_;  // the mailbox it sits in, the rank it waits for
  std::shared_ptr<local::P2pState> st_;
  std::shared_ptr<const Watchdog> dog_;
  std::string what_;
};

// Where blocks of these sizes start when they lie back to back.
std::vector<std::size_t> back_to_back(const std::vector<std::size_t>& bytes) {
  std::vector<std::size_t> offsets(bytes.size(), 0);
  for (std::size_t j = 1; j < bytes.size(); ++j) offsets[j] = offsets[j - 1] + bytes[j - 1];
  return offsets;
}

Part exchange(const char* call, const void* send, void* recv, std::size_t n) {
  Part p;
  p.call = call;
  p.send = send;
  p.recv = recv;
  p.send_bytes.assign(n, 0);
  p.send_offsets.assign(n, 0);
  p.recv_bytes.assign(n, 0);
  p.recv_offsets.assign(n, 0);
  return p;
}

thread_local Communicator* t_world = nullptr;

}  // namespace

// ---- the communicator ----------------------------------------------------------------------

LocalCommunicator::LocalCommunicator()
    : LocalCommunicator(std::make_shared<Group>(std::make_shared<local::World>(), std::vector<int>{0}), 0) {}

LocalCommunicator::LocalCommunicator(std::shared_ptr<Group> group, int rank)
    : Communicator(rank, group->size()), group_(std::move(group)) {}

LocalCommunicator::~LocalCommunicator() = default;

void LocalCommunicator::check_alive() const {
  if (group_->world->ended()) throw Error(group_->world->why());
}

double LocalCommunicator::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_epoch).count();
}

std::unique_ptr<Request::Impl> LocalCommunicator::post(Part part) {
  check_alive();
  const std::uint64_t seq = next_op_++;
  std::shared_ptr<Op> op = group_->op(seq);
  const std::string& name = current_op();
  std::string what =
      fmt::format("{}{} on {}", part.call, name.empty() ? "" : fmt::format(" '{}'", name), group_->name());
  std::string mismatch;
  bool last = false;
  {
    const std::lock_guard<std::mutex> lock(op->mu);
    for (int j = 0; j < size(); ++j)
      if (op->arrived_from[std::size_t(j)] && std::strcmp(op->parts[std::size_t(j)].call, part.call) != 0)
        mismatch = fmt::format("collectives out of order: rank {} called {} where rank {} called {}", rank(), part.call,
                               j, op->parts[std::size_t(j)].call);
    if (mismatch.empty()) {
      op->parts[std::size_t(rank())] = std::move(part);
      op->arrived_from[std::size_t(rank())] = 1;
      last = ++op->arrived == size();
    }
  }
  if (!mismatch.empty()) {
    group_->world->fail(group_->world_rank[std::size_t(rank())], mismatch);
    throw Error(mismatch);
  }
  if (last) group_->retire(seq);
  return std::make_unique<CollectiveRequest>(group_, std::move(op), rank(), shared_watchdog(), std::move(what));
}

void LocalCommunicator::run(Part part) { post(std::move(part))->wait(); }

void LocalCommunicator::do_alltoall(const void* send, void* recv, std::size_t bytes_per_rank) {
  Part p = exchange("alltoall", send, recv, std::size_t(size()));
  for (std::size_t j = 0; j < std::size_t(size()); ++j) {
    p.send_bytes[j] = p.recv_bytes[j] = bytes_per_rank;
    p.send_offsets[j] = p.recv_offsets[j] = j * bytes_per_rank;
  }
  run(std::move(p));
}

std::unique_ptr<Request::Impl> LocalCommunicator::do_ialltoallv(const void* send,
                                                                std::span<const std::size_t> send_bytes,
                                                                std::span<const std::size_t> send_offsets, void* recv,
                                                                std::span<const std::size_t> recv_bytes,
                                                                std::span<const std::size_t> recv_offsets) {
  Part p = exchange("alltoallv", send, recv, 0);
  p.send_bytes.assign(send_bytes.begin(), send_bytes.end());
  p.send_offsets.assign(send_offsets.begin(), send_offsets.end());
  p.recv_bytes.assign(recv_bytes.begin(), recv_bytes.end());
  p.recv_offsets.assign(recv_offsets.begin(), recv_offsets.end());
  return post(std::move(p));
}

void LocalCommunicator::do_allgather(const void* send, void* recv, std::size_t bytes) {
  Part p = exchange("allgather", send, recv, std::size_t(size()));
  for (std::size_t j = 0; j < std::size_t(size()); ++j) {
    p.send_bytes[j] = p.recv_bytes[j] = bytes;
    p.recv_offsets[j] = j * bytes;
  }
  run(std::move(p));
}

void LocalCommunicator::do_allgatherv(const void* send, void* recv, std::span<const std::size_t> bytes) {
  Part p = exchange("allgatherv", send, recv, std::size_t(size()));
  p.recv_bytes.assign(bytes.begin(), bytes.end());
  p.recv_offsets = back_to_back(p.recv_bytes);
  p.send_bytes.assign(std::size_t(size()), bytes[std::size_t(rank())]);
  run(std::move(p));
}

void LocalCommunicator::do_gather(const void* send, void* recv, std::size_t bytes, int root) {
  Part p = exchange("gather", send, recv, std::size_t(size()));
  p.send_bytes[std::size_t(root)] = bytes;
  if (rank() == root)
    for (std::size_t j = 0; j < std::size_t(size()); ++j) {
      p.recv_bytes[j] = bytes;
      p.recv_offsets[j] = j * bytes;
    }
  run(std::move(p));
}

void LocalCommunicator::do_reduce_scatter_sum(const float* send, float* recv, std::size_t count) {
  do_reduce_scatter_sum_v(send, recv, std::vector<std::size_t>(std::size_t(size()), count));
}

void LocalCommunicator::do_reduce_scatter_sum_v(const float* send, float* recv, std::span<const std::size_t> counts) {
  Part p;
  p.kind = Kind::reduce_scatter;
  p.call = "reduce_scatter";
  p.send = send;
  p.recv = recv;
  p.counts.assign(counts.begin(), counts.end());
  run(std::move(p));
}

void LocalCommunicator::do_allreduce(void* data, std::size_t n, ScalarType type, ReduceOp op) {
  Part p;
  p.kind = Kind::allreduce;
  p.call = "allreduce";
  p.recv = data;
  p.n = n;
  p.type = type;
  p.op = op;
  const std::size_t bytes = n * (type == ScalarType::f32 ? sizeof(float) : sizeof(double));
  p.input.resize(bytes);
  if (bytes > 0) std::memcpy(p.input.data(), data, bytes);  // in place: the others read the copy
  run(std::move(p));
}

void LocalCommunicator::do_broadcast(void* data, std::size_t bytes, int root) {
  Part p = exchange("broadcast", data, data, std::size_t(size()));
  if (rank() == root) p.send_bytes.assign(std::size_t(size()), bytes);
  p.send_bytes[std::size_t(rank())] = 0;  // the root keeps its own data
  if (rank() != root) p.recv_bytes[std::size_t(root)] = bytes;
  run(std::move(p));
}

void LocalCommunicator::do_barrier() { run(exchange("barrier", nullptr, nullptr, std::size_t(size()))); }

std::unique_ptr<Request::Impl> LocalCommunicator::do_isend(const void* data, std::size_t bytes, int dest, int tag) {
  if (dest < 0 || dest >= size()) throw Error(fmt::format("isend: no rank {} among {}", dest, size()));
  check_alive();
  auto st =
      post_p2p(group_->boxes[std::size_t(dest)], {rank(), tag, const_cast<void*>(data), bytes, nullptr, nullptr}, true);
  const std::string& op = current_op();
  return std::make_unique<P2pRequest>(group_, rank(), dest, dest, std::move(st), shared_watchdog(),
                                      fmt::format("the send '{}' to rank {} (tag {}, {} bytes)",
                                                  op.empty() ? "isend" : op, dest, tag, bytes));
}

std::unique_ptr<Request::Impl> LocalCommunicator::do_irecv(void* data, std::size_t bytes, int src, int tag) {
  if (src < 0 || src >= size()) throw Error(fmt::format("irecv: no rank {} among {}", src, size()));
  check_alive();
  auto st = post_p2p(group_->boxes[std::size_t(rank())], {src, tag, data, bytes, nullptr, nullptr}, false);
  return std::make_unique<P2pRequest>(group_, rank(), rank(), src, std::move(st), shared_watchdog(),
                                      fmt::format("the receive from rank {} (tag {}, {} bytes)", src, tag, bytes));
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int key) {
  if (color < 0) throw Error(fmt::format("split: color must be >= 0, got {}", color));
  std::shared_ptr<Group> child;
  int child_rank = 0;
  Part p;
  p.kind = Kind::split;
  p.call = "split";
  p.color = color;
  p.key = key;
  p.child = &child;
  p.child_rank = &child_rank;
  run(std::move(p));
  auto sub = std::make_unique<LocalCommunicator>(std::move(child), child_rank);
  share_watchdog(*sub);
  return sub;
}

// ---- ranks as threads ----------------------------------------------------------------------

Communicator* local_world() { return t_world; }

void run_local(int n, const std::function<void(Communicator&)>& fn) {
  run_local_shared(n, [&](const std::shared_ptr<Communicator>& comm) { fn(*comm); });
}

void run_local_shared(int n, const std::function<void(const std::shared_ptr<Communicator>&)>& fn) {
  if (n < 1) throw Error(fmt::format("run_local: the number of ranks must be >= 1, got {}", n));
  std::vector<int> ranks(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) ranks[std::size_t(r)] = r;
  auto world = std::make_shared<local::World>();
  auto group = std::make_shared<Group>(world, ranks);
  const int threads = std::max(1, omp_get_max_threads() / n);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> pool;
  for (int r = 0; r < n; ++r)
    pool.emplace_back([&, r] {
      set_threads(threads);
      const auto comm = std::make_shared<LocalCommunicator>(group, r);
      t_world = comm.get();
      try {
        fn(comm);
        world->leave(r);  // a peer still waiting for this rank fails now, naming it
      } catch (const std::exception& e) {
        errors[std::size_t(r)] = std::current_exception();
        world->fail(r, e.what());
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
        world->fail(r, "an exception that is not a std::exception");
      }
      t_world = nullptr;
    });
  for (std::thread& t : pool) t.join();
  const int origin = world->origin();
  world->end(
      fmt::format("the local group of {} ranks has ended (its run returned): a rank's communicator, and "
                  "what is built on it, works only while the run's function runs",
                  n));
  if (origin >= 0 && errors[std::size_t(origin)]) std::rethrow_exception(errors[std::size_t(origin)]);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ulysses
