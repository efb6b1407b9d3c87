// The strategies section's replay (replay.hpp) against the strategies themselves: for every
// registered configuration, the toy strategy's from outside the library included, what the
// replay sends per counter (bytes, messages, calls) equals what a real forward and backward
// sent on the same ranks, and both equal the formula. The benchmark's own test, beside it: the
// tests never include bench code.
#include <gtest/gtest.h>

#include "mpi_helpers.hpp"
#include "replay.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "worlds.hpp"

namespace ulysses {
namespace {

// Every plain configuration of every registered strategy at cp, and each one's tunings (a2a's
// overlap chunks: its transposes in several all-to-alls).
std::vector<CpConfig> configs(int cp, std::int64_t kv_heads) {
  std::vector<CpConfig> out;
  for (const Strategy* strategy : strategies()) {
    const std::vector<CpConfig> plain = strategy->plan_configs(cp, true);
    out.insert(out.end(), plain.begin(), plain.end());
    for (const CpConfig& tuned : strategy->tunings(plain.front(), cp, kv_heads)) out.push_back(tuned);
  }
  return out;
}

CommCounter counter(const std::map<std::string, CommCounter>& m, const std::string& op) {
  const auto it = m.find(op);
  return it == m.end() ? CommCounter{} : it->second;
}

// Tokens and heads that split evenly, so that every rank sends what the busiest one does.
COMM_TEST(Replay, SendsWhatTheStrategySends) {
  const int cp = comm.size();
  const Shape q{1, 16 * cp, 2 * cp, 8};
  const std::int64_t kv_heads = 2 * cp;
  const std::vector<CpConfig> all = configs(cp, kv_heads);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const CpConfig& cfg = all[i];
    SCOPED_TRACE(find_strategy(cfg.cp_comm_type).config_name(cfg) + ", configuration " + std::to_string(i));
    const CommVolume v = predicted_comm_volume(cfg, cp, q, kv_heads, DType::f32);
    testing::run_layer(comm, cfg, q, kv_heads);  // splits its subgroups first
    comm.reset_counters();
    testing::run_layer(comm, cfg, q, kv_heads);
    const std::map<std::string, CommCounter> real = comm.counters();
    comm.reset_counters();
    bench::Replay replay(comm, v);
    replay.run();
    const std::map<std::string, CommCounter> replayed = replay.counters();
    for (const auto& [op, fwd] : v.forward_bytes) {
      const auto bwd = v.backward_bytes.count(op) ? v.backward_bytes.at(op) : 0;
      const CommCounter r = counter(replayed, op), sent = counter(real, op);
      EXPECT_EQ(r.bytes_sent, fwd + bwd) << op;
      EXPECT_EQ(r.bytes_sent, sent.bytes_sent) << op;
      EXPECT_EQ(r.messages, sent.messages) << op;
      if (sent.messages > 0) EXPECT_EQ(r.calls, sent.calls) << op;  // a group of one calls, sending nothing
    }
    for (const auto& [op, c] : replayed) EXPECT_TRUE(v.transfers.count(op)) << op << " replayed, not in the formula";
  }
}

}  // namespace
}  // namespace ulysses
