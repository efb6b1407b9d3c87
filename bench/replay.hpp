// A strategy's communication without its compute: every counter of its CommVolume sent again as
// the collective its Transfer declares, in the group it declares, with the bytes and messages
// of the formula. The strategies section times it as "comm" (the same transfers alone); it
// reads only the volume, so a strategy registered tomorrow replays without an edit here.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/cp/traffic.hpp"

namespace ulysses::bench {

class Replay {
 public:
  // Collective over `comm`, a strategy's group: splits the subgroups `volume` declares. Every
  // rank passes the same volume (the busiest rank's, predicted_comm_volume without a rank), so
  // every rank sends what the busiest one does. `comm` must outlive this object.
  Replay(Communicator& comm, CommVolume volume);
  // Collective. One forward's and one backward's transfers, each counted on its group's
  // communicator under its counter's name. Returns this rank's seconds.
  double run();
  // Not collective. Every counter of this rank's communicators (the group's and its subgroups').
  std::map<std::string, CommCounter> counters() const;

 private:
  // Counter `op`: `bytes` in `messages` messages, as its transfer declares.
  void send(const std::string& op, std::int64_t bytes, std::int64_t messages);
  Communicator& group_of(const Transfer& transfer);

  Communicator& comm_;
  CommVolume volume_;
  std::map<std::string, std::unique_ptr<Communicator>> groups_;
  std::vector<char> a_, b_;
};

}  // namespace ulysses::bench
