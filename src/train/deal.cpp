#include "train/deal.hpp"

namespace ulysses::train {

namespace {

std::int64_t held(const std::vector<SeqChunk>& chunks) {
  std::int64_t n = 0;
  for (const SeqChunk& c : chunks) n += c.length;
  return n;
}

void append_shard(Shard& out, const Batch& seq, const std::vector<SeqChunk>& chunks) {
  for (const SeqChunk& c : chunks)
    for (std::int64_t p = c.begin; p < c.begin + c.length; ++p) {
      out.push_back(seq.tokens[std::size_t(p)]);
      out.push_back(seq.labels[std::size_t(p)]);
      out.push_back(seq.scored[std::size_t(p)]);
    }
}

}  // namespace

std::map<int, Shard> deal_sequences(Communicator& world, const BalancePlan& plan,
                                    const std::function<std::vector<SeqChunk>(int, int)>& chunks,
                                    const std::function<Batch(int)>& load) {
  const int W = world.size(), me = world.rank(), count = int(plan.groups.size());
  std::map<int, Batch> loaded;
  for (int i = me; i < count; i += W) loaded.emplace(i, load(i));
  // Send: to each rank d, in sequence order, its shard of every sequence this rank loaded.
  Shard send;
  std::vector<std::size_t> send_bytes(std::size_t(W), 0), send_off(std::size_t(W), 0);
  for (int d = 0; d < W; ++d) {
    send_off[std::size_t(d)] = send.size() * sizeof(std::int32_t);
    for (const auto& [i, seq] : loaded)
      if (plan.groups[std::size_t(i)].contains(d))
        append_shard(send, seq, chunks(i, d - plan.groups[std::size_t(i)].first_rank));
    send_bytes[std::size_t(d)] = send.size() * sizeof(std::int32_t) - send_off[std::size_t(d)];
  }
  // Receive: from each loader, in sequence order, this rank's shard of every sequence of its groups.
  std::vector<std::size_t> recv_bytes(std::size_t(W), 0), recv_off(std::size_t(W), 0);
  std::map<int, std::size_t> at;  // sequence -> its shard's first int in recv
  std::size_t total = 0;
  for (int s = 0; s < W; ++s) {
    recv_off[std::size_t(s)] = total * sizeof(std::int32_t);
    for (int i = s; i < count; i += W)
      if (const BalanceGroup& g = plan.groups[std::size_t(i)]; g.contains(me)) {
        at[i] = total;
        total += std::size_t(3 * held(chunks(i, me - g.first_rank)));
      }
    recv_bytes[std::size_t(s)] = total * sizeof(std::int32_t) - recv_off[std::size_t(s)];
  }
  Shard recv(total);
  world.alltoallv(send.data(), send_bytes, send_off, recv.data(), recv_bytes, recv_off, "deal");
  std::map<int, Shard> mine;
  for (const auto& [i, first] : at) {
    const BalanceGroup& g = plan.groups[std::size_t(i)];
    const std::size_t n = std::size_t(3 * held(chunks(i, me - g.first_rank)));
    mine.emplace(i, Shard(recv.begin() + std::ptrdiff_t(first), recv.begin() + std::ptrdiff_t(first + n)));
  }
  return mine;
}

}  // namespace ulysses::train
