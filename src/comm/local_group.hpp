// The shared state of a local group (LocalCommunicator's ranks): what each rank publishes for
// a collective, how far every rank has got, and the mailboxes of point-to-point messages.
// Internal to src/comm; local_communicator.cpp drives it, local_group.cpp moves the data.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"

namespace ulysses::local {

class Group;

// What every group split from one run_local shares: whether it failed. A failed world
// releases every wait of every group in it.
class World {
 public:
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The first failure wins; the world rank it names is the one run_local rethrows for. Its
  // first line is what the released ranks quote (a Python error carries its traceback).
  void fail(int world_rank, const std::string& why) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (failed()) return;
    origin_ = world_rank;
    why_ = why.substr(0, why.find('\n'));
    failed_.store(true, std::memory_order_release);
  }
  int origin() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return origin_;
  }
  std::string why() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return origin_ < 0 ? why_ : fmt::format("rank {} of the local world failed: {}", origin_, why_);
  }
  // After run_local: every communicator of the world (Python may hold one) fails at once,
  // whatever failed before, with `why` naming what ended.
  void end(const std::string& why) {
    const std::lock_guard<std::mutex> lock(mu_);
    origin_ = -1;
    why_ = why;
    ended_.store(true, std::memory_order_release);
    failed_.store(true, std::memory_order_release);
  }
  bool ended() const { return ended_.load(std::memory_order_acquire); }
  // A rank whose function returned: it will make no more calls, so a peer waiting for it
  // would wait for ever. Every call of a rank completes before its function returns.
  void leave(int world_rank) {
    const std::lock_guard<std::mutex> lock(mu_);
    if (std::size_t(world_rank) >= left_.size()) left_.resize(std::size_t(world_rank) + 1, 0);
    left_[std::size_t(world_rank)] = 1;
    any_left_.store(true, std::memory_order_release);
  }
  // The first of `world_ranks` that has left, or -1.
  int first_left(const std::vector<int>& world_ranks) const {
    if (!any_left_.load(std::memory_order_acquire)) return -1;
    const std::lock_guard<std::mutex> lock(mu_);
    for (int r : world_ranks)
      if (std::size_t(r) < left_.size() && left_[std::size_t(r)]) return r;
    return -1;
  }

 private:
  std::atomic<bool> failed_{false}, ended_{false}, any_left_{false};
  mutable std::mutex mu_;
  int origin_ = -1;
  std::string why_;
  std::vector<char> left_;  // by world rank
};

enum class Kind { exchange, allreduce, reduce_scatter, split };

// One rank's share of a collective: its buffers and sizes, which the other ranks read while
// the collective is in progress.
struct Part {
  Kind kind = Kind::exchange;
  const char* call = "";  // "alltoallv", "allgather", ... (for messages)
  const void* send = nullptr;
  void* recv = nullptr;
  std::vector<std::size_t> send_bytes, send_offsets, recv_bytes, recv_offsets;  // exchange (size() each)
  std::vector<std::byte> input;                                                 // allreduce: a copy
  std::size_t n = 0;                                                            // allreduce elements
  ScalarType type = ScalarType::f32;
  ReduceOp op = ReduceOp::sum;
  std::vector<std::size_t> counts;  // reduce_scatter: floats per rank
  int color = 0, key = 0;           // split
  std::shared_ptr<Group>* child = nullptr;
  int* child_rank = nullptr;
};

// One collective in progress: every rank's part, and who has read what it receives. A rank's
// buffers stay valid until every rank has read them (done == size).
struct Op {
  std::mutex mu;
  std::vector<Part> parts;
  std::vector<char> arrived_from, pulled_by;
  int arrived = 0, done = 0, readers = 0;
  bool cancelled = false;                          // a rank left early: nobody starts reading
  std::map<int, std::shared_ptr<Group>> children;  // split: the new group of each color
};

// A posted send or receive that has not met its partner yet.
struct P2pState {
  std::atomic<bool> done{false};
  std::string error;  // set before done
};
struct Pending {
  int src, tag;
  void* data;  // the receive buffer, or the send buffer (never written)
  std::size_t bytes;
  std::shared_ptr<P2pState> state;
  std::shared_ptr<std::vector<std::byte>> copy;  // an eager send's bytes
};

// A send this small that finds no receive waiting is copied and complete at once, as MPI's
// eager protocol does: code that waits for a small send before posting its receive works on
// both backends (a large one waits for its receive, as over MPI).
constexpr std::size_t kEagerBytes = 64 << 10;
struct Mailbox {
  std::mutex mu;
  std::deque<Pending> sends, recvs;  // to this rank, in posting order
};

class Group {
 public:
  Group(std::shared_ptr<World> w, std::vector<int> world_ranks)
      : world(std::move(w)), world_rank(std::move(world_ranks)), boxes(world_rank.size()) {}
  int size() const { return int(world_rank.size()); }
  // The collective with this sequence number, made by the first rank to get there.
  std::shared_ptr<Op> op(std::uint64_t seq) {
    const std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<Op>& o = ops[seq];
    if (!o) {
      o = std::make_shared<Op>();
      o->parts.resize(std::size_t(size()));
      o->arrived_from.assign(std::size_t(size()), 0);
      o->pulled_by.assign(std::size_t(size()), 0);
    }
    return o;
  }
  void retire(std::uint64_t seq) {
    const std::lock_guard<std::mutex> lock(mu);
    ops.erase(seq);
  }
  std::string me(int rank) const {
    const int w = world_rank[std::size_t(rank)];
    if (w == rank) return fmt::format("local rank {} of {}", rank, size());
    return fmt::format("local rank {} of {} (world rank {})", rank, size(), w);
  }
  std::string name() const {
    std::string list;
    for (int w : world_rank) list += fmt::format("{}{}", list.empty() ? "" : ",", w);
    return fmt::format("the local group of {} ranks (world ranks {})", size(), list);
  }

  const std::shared_ptr<World> world;
  const std::vector<int> world_rank;  // of each member
  std::vector<Mailbox> boxes;         // one per destination

 private:
  std::mutex mu;
  std::map<std::uint64_t, std::shared_ptr<Op>> ops;
};

// This rank's share of a collective once every rank has arrived: it copies (or reduces) what
// it receives from the others' parts into its own buffers. Returns "" or what is wrong (the
// ranks' parts do not fit together), having moved nothing then.
std::string pull(Op& op, const Group& g, int me);

}  // namespace ulysses::local
