// The timeline trace (trace.hpp), on every rank count: the trace is valid Chrome JSON with one
// track per rank whose intervals nest and whose communication events carry exactly the bytes
// the counters counted.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "mpi_helpers.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/comm/trace.hpp"

namespace ulysses {
namespace {

using nlohmann::json;

using testing::run_layer;

std::vector<CpConfig> traced_configs(int cp) {
  std::vector<CpConfig> c{{"a2a", {}, true}, {"p2p", {}, true}, {"p2p", {}, true, std::nullopt, false}};
  if (cp >= 4 && cp % 2 == 0) c.push_back({"a2a+p2p", {2, cp / 2}, true});
  return c;
}

struct Interval {
  std::int64_t begin, end;  // nanoseconds
};

// True when any two intervals are disjoint or one contains the other.
bool nests(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
  });
  std::vector<Interval> open;
  for (const Interval& x : v) {
    while (!open.empty() && open.back().end <= x.begin) open.pop_back();
    if (!open.empty() && x.end > open.back().end) return false;
    open.push_back(x);
  }
  return true;
}

std::int64_t ns(const json& microseconds) { return std::llround(double(microseconds) * 1000); }

// Rank 0's checks of the whole document against every rank's counted bytes.
void check_trace(const json& doc, const std::vector<std::int64_t>& counted, const std::vector<CpConfig>& configs) {
  const int cp = int(counted.size());
  std::map<int, std::vector<Interval>> tracks;
  std::map<int, std::int64_t> bytes;
  std::map<int, std::set<std::string>> names, labels;
  for (const json& e : doc.at("traceEvents")) {
    const int pid = e.at("pid");
    if (e.at("ph") == "M") labels[pid].insert(std::string(e.at("args").at("name")));
    if (e.at("ph") != "X") continue;
    EXPECT_EQ(e.at("tid"), 0);
    EXPECT_GE(double(e.at("dur")), 0.0);
    tracks[pid].push_back({ns(e.at("ts")), ns(e.at("ts")) + ns(e.at("dur"))});
    names[pid].insert(std::string(e.at("name")));
    if (e.at("cat") == "comm" && e.at("args").contains("bytes")) bytes[pid] += std::int64_t(e.at("args").at("bytes"));
  }
  ASSERT_EQ(int(tracks.size()), cp);  // one track per rank, pids 0 .. cp−1
  for (int r = 0; r < cp; ++r) {
    EXPECT_TRUE(nests(tracks[r])) << "rank " << r;
    EXPECT_EQ(bytes[r], counted[std::size_t(r)]) << "rank " << r;
    EXPECT_EQ(labels[r], std::set<std::string>{"rank " + std::to_string(r)});
    for (const CpConfig& c : configs) {
      EXPECT_TRUE(names[r].contains("forward " + c.cp_comm_type)) << c.cp_comm_type;
      EXPECT_TRUE(names[r].contains("backward " + c.cp_comm_type)) << c.cp_comm_type;
    }
    if (cp == 1) continue;
    const std::string last = std::to_string(cp) + "/" + std::to_string(cp);
    // The ring's last dK/dV receive is always waited for; other waits only when compute did not hide them.
    const std::vector<std::string> expected{"seq_to_head", "head_to_seq",      "p2p_kv",
                                            "wait recv",   "fwd step " + last, "bwd step " + last};
    for (const std::string& n : expected) EXPECT_TRUE(names[r].contains(n)) << n << " on rank " << r;
    if (configs.back().cp_comm_type == "a2a+p2p")
      for (const std::string& n :
           std::vector<std::string>{"inner.seq_to_head", "outer.p2p_kv", "outer.fwd step 1/" + std::to_string(cp / 2)})
        EXPECT_TRUE(names[r].contains(n)) << n << " on rank " << r;
  }
}

COMM_TEST(Trace, OneTrackPerRankNestedIntervalsCarryingTheCountedBytes) {
  Communicator& world = comm;
  const std::vector<CpConfig> configs = traced_configs(world.size());
  std::string text;
  std::int64_t counted = 0;
  {
    Tracer tracer(world);
    world.reset_counters();
    for (const CpConfig& c : configs) run_layer(world, c, {1, 8 * world.size(), 8, 8}, 2);
    for (const auto& [op, c] : world.counters()) counted += c.bytes_sent;
    text = chrome_trace_json(world, tracer.events());
  }
  const std::vector<std::int64_t> all = world.allgather_value(counted);
  if (world.rank() != 0) {
    EXPECT_EQ(text, "");
    return;
  }
  const json doc = json::parse(text);  // throws (fails the test) unless valid JSON
  EXPECT_EQ(doc.at("displayTimeUnit"), "ms");
  check_trace(doc, all, configs);
}

COMM_TEST(Trace, AttachedOnlyWhileTheTracerLives) {
  Communicator& world = comm;
  EXPECT_EQ(world.tracer(), nullptr);
  {
    Tracer tracer(world);
    EXPECT_EQ(world.tracer(), &tracer);
    run_layer(world, {"a2a", {}, true}, {1, 4 * world.size(), 8, 8}, 8);
    EXPECT_FALSE(tracer.events().empty());
  }
  EXPECT_EQ(world.tracer(), nullptr);
}

TEST(Trace, NamesAreEscapedAndTimesAreIntegralNanoseconds) {
  const std::vector<TraceEvent> events{{"a \"quoted\" name", "compute", 0.0015, 0.0025, 42, 3}};
  const json doc = json::parse("[" + chrome_trace_events(events, 5) + "]");
  ASSERT_EQ(doc.size(), 2u);
  EXPECT_EQ(doc[0].at("args").at("name"), "rank 5");
  EXPECT_EQ(doc[1].at("name"), "a \"quoted\" name");
  EXPECT_EQ(doc[1].at("pid"), 5);
  EXPECT_EQ(ns(doc[1].at("ts")), 1500000);
  EXPECT_EQ(ns(doc[1].at("dur")), 1000000);
  EXPECT_EQ(doc[1].at("args").at("bytes"), 42);
  EXPECT_EQ(doc[1].at("args").at("messages"), 3);
}

TEST(Trace, IntervalsThatOverlapWithoutNestingAreCaught) {
  EXPECT_TRUE(nests({{0, 10}, {2, 5}, {5, 7}, {10, 12}}));
  EXPECT_FALSE(nests({{0, 10}, {5, 12}}));
}

}  // namespace
}  // namespace ulysses
