// How a local group's collectives move data: each rank, once all have arrived, reads what it
// receives straight from the other ranks' published buffers.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "local_group.hpp"

namespace ulysses::local {

namespace {

std::string check_exchange(const std::vector<Part>& parts, int me) {
  const Part& mine = parts[std::size_t(me)];
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const std::size_t sent = parts[j].send_bytes[std::size_t(me)];
    if (sent != mine.recv_bytes[j])
      return fmt::format("{}: rank {} sends {} bytes to rank {}, which expects {}", mine.call, j, sent, me,
                         mine.recv_bytes[j]);
  }
  return "";
}

std::string pull_exchange(const std::vector<Part>& parts, int me) {
  if (std::string e = check_exchange(parts, me); !e.empty()) return e;
  const Part& mine = parts[std::size_t(me)];
  for (std::size_t j = 0; j < parts.size(); ++j)
    if (mine.recv_bytes[j] > 0)
      std::memcpy(static_cast<std::byte*>(mine.recv) + mine.recv_offsets[j],
                  static_cast<const std::byte*>(parts[j].send) + parts[j].send_offsets[std::size_t(me)],
                  mine.recv_bytes[j]);
  return "";
}

template <class T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
  }
  return a;
}

// out[i] = part 0's element i combined with part 1's, then part 2's, ...: in rank order, so
// the same on every rank and every run.
template <class T>
void reduce_in_rank_order(const std::vector<Part>& parts, T* out, std::size_t n, ReduceOp op) {
  for (std::size_t i = 0; i < n; ++i) {
    T acc = reinterpret_cast<const T*>(parts[0].input.data())[i];
    for (std::size_t j = 1; j < parts.size(); ++j)
      acc = combine(acc, reinterpret_cast<const T*>(parts[j].input.data())[i], op);
    out[i] = acc;
  }
}

std::string pull_allreduce(const std::vector<Part>& parts, int me) {
  const Part& mine = parts[std::size_t(me)];
  for (std::size_t j = 0; j < parts.size(); ++j)
    if (parts[j].n != mine.n || parts[j].type != mine.type || parts[j].op != mine.op)
      return fmt::format("allreduce: rank {} reduces {} elements, rank {} {} (or another type or operation)", j,
                         parts[j].n, me, mine.n);
  switch (mine.type) {
    case ScalarType::f32: reduce_in_rank_order(parts, static_cast<float*>(mine.recv), mine.n, mine.op); break;
    case ScalarType::f64: reduce_in_rank_order(parts, static_cast<double*>(mine.recv), mine.n, mine.op); break;
    case ScalarType::i64: reduce_in_rank_order(parts, static_cast<std::int64_t*>(mine.recv), mine.n, mine.op); break;
  }
  return "";
}

std::string pull_reduce_scatter(const std::vector<Part>& parts, int me) {
  const Part& mine = parts[std::size_t(me)];
  for (std::size_t j = 0; j < parts.size(); ++j)
    if (parts[j].counts != mine.counts)
      return fmt::format("reduce_scatter: ranks {} and {} give different block counts", j, me);
  std::size_t offset = 0;
  for (int j = 0; j < me; ++j) offset += mine.counts[std::size_t(j)];
  float* out = static_cast<float*>(mine.recv);
  for (std::size_t i = 0; i < mine.counts[std::size_t(me)]; ++i) {
    float acc = static_cast<const float*>(parts[0].send)[offset + i];
    for (std::size_t j = 1; j < parts.size(); ++j) acc += static_cast<const float*>(parts[j].send)[offset + i];
    out[i] = acc;
  }
  return "";
}

// This rank's new group: the ranks of its color ordered by (key, rank), made once per color.
std::string pull_split(Op& op, const Group& g, int me) {
  const Part& mine = op.parts[std::size_t(me)];
  std::vector<std::pair<int, int>> members;  // (key, rank)
  for (int j = 0; j < g.size(); ++j)
    if (op.parts[std::size_t(j)].color == mine.color) members.emplace_back(op.parts[std::size_t(j)].key, j);
  std::sort(members.begin(), members.end());
  std::vector<int> world_ranks;
  for (std::size_t i = 0; i < members.size(); ++i) {
    world_ranks.push_back(g.world_rank[std::size_t(members[i].second)]);
    if (members[i].second == me) *mine.child_rank = int(i);
  }
  const std::lock_guard<std::mutex> lock(op.mu);
  std::shared_ptr<Group>& child = op.children[mine.color];
  if (!child) child = std::make_shared<Group>(g.world, std::move(world_ranks));
  *mine.child = child;
  return "";
}

}  // namespace

std::string pull(Op& op, const Group& g, int me) {
  switch (op.parts[std::size_t(me)].kind) {
    case Kind::exchange: return pull_exchange(op.parts, me);
    case Kind::allreduce: return pull_allreduce(op.parts, me);
    case Kind::reduce_scatter: return pull_reduce_scatter(op.parts, me);
    case Kind::split: return pull_split(op, g, me);
  }
  return "";
}

}  // namespace ulysses::local
