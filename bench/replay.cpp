#include "replay.hpp"

#include <utility>

namespace ulysses::bench {

Replay::Replay(Communicator& comm, CommVolume volume) : comm_(comm), volume_(std::move(volume)) {
  for (const auto& [name, shape] : volume_.groups) groups_[name] = comm_.split(shape.color(comm_.rank()), comm_.rank());
}

Communicator& Replay::group_of(const Transfer& transfer) {
  return transfer.group.empty() ? comm_ : *groups_.at(transfer.group);
}

double Replay::run() {
  comm_.barrier();
  const double t0 = comm_.now();
  for (const auto& [bytes, messages] : {std::pair{&volume_.forward_bytes, &volume_.forward_messages},
                                        std::pair{&volume_.backward_bytes, &volume_.backward_messages}})
    for (const auto& [op, n] : *bytes) send(op, n, messages->count(op) ? messages->at(op) : 0);
  return comm_.now() - t0;
}

// Equal blocks: the bytes per rank are the formula's when they divide evenly (the busiest rank's
// counts of an even split do), a few bytes under it otherwise.
void Replay::send(const std::string& op, std::int64_t bytes, std::int64_t messages) {
  const Transfer& t = volume_.transfers.at(op);
  Communicator& c = group_of(t);
  const int R = c.size();
  const std::int64_t calls = t.calls(messages, R);
  if (R == 1 || bytes == 0 || calls == 0) return;
  // Each call's block to one other member: a ring step's whole message, a collective's 1/(R − 1).
  const std::size_t block = std::size_t(t.collective == Collective::ring ? bytes / calls : bytes / calls / (R - 1));
  if (a_.size() < block * std::size_t(R)) {
    a_.assign(block * std::size_t(R), 1);
    b_.assign(block * std::size_t(R), 0);
  }
  for (std::int64_t i = 0; i < calls; ++i) switch (t.collective) {
      case Collective::all_to_all: c.alltoall(a_.data(), b_.data(), block, op); break;
      case Collective::ring: {
        Request r = c.irecv({b_.data(), block}, (c.rank() - 1 + R) % R, 7);
        c.isend({a_.data(), block}, (c.rank() + 1) % R, 7, op).wait();
        r.wait();
        break;
      }
      case Collective::all_gather: c.allgather(a_.data(), b_.data(), block, op); break;
      case Collective::reduce_scatter: {
        const std::size_t count = block / sizeof(float);
        std::vector<float> in(count * std::size_t(R), 1.0f), out(count);
        c.reduce_scatter_sum(in.data(), out.data(), count, op);
        break;
      }
    }
}

std::map<std::string, CommCounter> Replay::counters() const {
  std::map<std::string, CommCounter> all = comm_.counters();
  for (const auto& [name, c] : groups_)
    for (const auto& [op, n] : c->counters()) {
      CommCounter& into = all[op];
      into.calls += n.calls;
      into.bytes_sent += n.bytes_sent;
      into.messages += n.messages;
    }
  return all;
}

}  // namespace ulysses::bench
