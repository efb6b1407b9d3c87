#include "train/deal.hpp"

namespace ulysses::train {

namespace {

std::size_t ints_of(const std::vector<SeqChunk>& chunks) {
  std::size_t n = 0;
  for (const SeqChunk& c : chunks) n += std::size_t(3 * c.length);
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

std::map<int, Shard> deal_sequences(Communicator& world, const std::vector<Placement>& placements,
                                    const std::map<int, Batch>& loaded) {
  const int W = world.size(), me = world.rank(), count = int(placements.size());
  // Send: to each rank d, in sequence order, its shard of every sequence this rank loaded.
  Shard send;
  std::vector<std::size_t> send_bytes(std::size_t(W), 0), send_off(std::size_t(W), 0);
  for (int d = 0; d < W; ++d) {
    send_off[std::size_t(d)] = send.size() * sizeof(std::int32_t);
    for (const auto& [i, seq] : loaded)
      if (const Placement& p = placements[std::size_t(i)]; p.group.contains(d)) append_shard(send, seq, p.of(d));
    send_bytes[std::size_t(d)] = send.size() * sizeof(std::int32_t) - send_off[std::size_t(d)];
  }
  // Receive: from each loader, in sequence order, this rank's shard of every sequence of its groups.
  std::vector<std::size_t> recv_bytes(std::size_t(W), 0), recv_off(std::size_t(W), 0);
  std::map<int, std::pair<std::size_t, std::size_t>> at;  // sequence -> its shard's [first, end) in recv
  std::size_t total = 0;
  for (int s = 0; s < W; ++s) {
    recv_off[std::size_t(s)] = total * sizeof(std::int32_t);
    for (int i = s; i < count; i += W)
      if (const Placement& p = placements[std::size_t(i)]; p.group.contains(me)) {
        at[i] = {total, total + ints_of(p.of(me))};
        total = at[i].second;
      }
    recv_bytes[std::size_t(s)] = total * sizeof(std::int32_t) - recv_off[std::size_t(s)];
  }
  Shard recv(total);
  world.alltoallv(send.data(), send_bytes, send_off, recv.data(), recv_bytes, recv_off, "deal");
  std::map<int, Shard> mine;
  for (const auto& [i, span] : at)
    mine.emplace(i, Shard(recv.begin() + std::ptrdiff_t(span.first), recv.begin() + std::ptrdiff_t(span.second)));
  return mine;
}

}  // namespace ulysses::train
