// The timeline trace (trace.hpp) and the seed section's tables (bench/seed.hpp), on every rank
// count: the trace is valid Chrome JSON with one track per rank whose intervals nest and whose
// communication events carry exactly the bytes the counters counted; the counted operations,
// messages and bytes equal the formulas the seed section plots; the valid-cp table equals
// what the library accepts.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "../bench/seed.hpp"
#include "mpi_helpers.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses/trace.hpp"

namespace ulysses {
namespace {

using nlohmann::json;

// One causal forward + backward of `cfg` on comm, global q `g` with kv_heads KV heads.
void run_layer(Communicator& comm, const CpConfig& cfg, const Shape& g, std::int64_t kv_heads) {
  const auto chunks = rank_chunks(cfg, comm.size(), comm.rank(), g.s);
  const Shape qs{g.b, total_tokens(chunks), g.h, g.d}, ks{g.b, qs.s, kv_heads, g.d};
  Tensor q(qs), k(ks), v(ks), out(qs), dout(qs), dq(qs), dk(ks), dv(ks);
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&dout, 4}}) fill_uniform_shard(t->view(), seed, chunks);
  ContextParallelAttention attn(comm, cfg);
  const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
  attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
}

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

// Claims 1 and 2 at cp = this job's size, for every shape the seed section measures: the
// counters equal the formulas on every rank, and the seed's count of forward operations.
COMM_TEST(SeedTables, CountedTrafficEqualsTheFormulas) {
  Communicator& world = comm;
  const int cp = world.size();
  const std::vector<int> cps = seed::run_cps();
  if (std::find(cps.begin(), cps.end(), cp) == cps.end())
    return;  // not plotted (a skip would mark every local world skipped)
  for (const seed::PlotShape& shape : seed::run_shapes())
    for (const std::string strategy : {"a2a", "p2p", "all_gather"}) {
      const CpConfig cfg{strategy, {}, true};
      const auto chunks = rank_chunks(cfg, cp, world.rank(), shape.q.s);
      const Shape qs{1, total_tokens(chunks), shape.q.h, shape.q.d}, ks{1, qs.s, shape.kv_heads, shape.q.d};
      Tensor q(qs), k(ks), v(ks), out(qs), dout(qs), dq(qs), dk(ks), dv(ks);
      ContextParallelAttention attn(world, cfg);
      world.reset_counters();
      const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
      const seed::Traffic fwd = seed::counted_traffic(world.counters());
      world.reset_counters();
      attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
      const seed::Traffic bwd = seed::counted_traffic(world.counters());
      const auto formula = [&](bool b) {
        return seed::formula_traffic(cfg, cp, world.rank(), shape.q, shape.kv_heads, DType::f32, b);
      };
      EXPECT_EQ(fwd, formula(false)) << strategy << " " << shape.name;
      EXPECT_EQ(bwd, formula(true)) << strategy << " " << shape.name;
      // The seed's counts: a2a 2 all-to-alls of cp − 1 messages; the ring cp − 1 steps.
      if (strategy != "all_gather") EXPECT_EQ(fwd.calls, seed::seed_forward_calls(strategy, cp)) << strategy;
      EXPECT_EQ(fwd.messages, strategy == "a2a" ? 2 * (cp - 1) : cp - 1) << strategy;
      if (strategy == "p2p") EXPECT_EQ(bwd.calls, 2 * cp - 1);
    }
}

// Claim 4's experiment: CpConfig::zigzag = false keeps a causal ring's chunks contiguous.
TEST(SeedTables, RingWithoutZigzagHoldsContiguousChunks) {
  const CpConfig contiguous{"p2p", {}, true, std::nullopt, false}, zigzag{"p2p", {}, true};
  EXPECT_FALSE(uses_zigzag(contiguous));
  EXPECT_TRUE(uses_zigzag(zigzag));
  EXPECT_EQ(rank_chunks(contiguous, 4, 3, 16), (std::vector<SeqChunk>{{12, 4}}));
  EXPECT_EQ(rank_chunks(zigzag, 4, 3, 16), (std::vector<SeqChunk>{{6, 2}, {8, 2}}));
}

// Claim 7 at cp = this job's size: a real a2a forward runs exactly where the table says the
// library accepts it (the other cps through validate_cp_config, the same rule).
COMM_TEST(SeedTables, ValidCpTableEqualsTheLibrary) {
  Communicator& world = comm;
  const int cp = world.size();
  for (const seed::Model& m : seed::common_models()) {
    for (int c : seed::table_cps())
      EXPECT_EQ(seed::cp_validity(m.heads, m.kv_heads, c).library_a2a,
                seed::library_accepts({"a2a"}, c, m.heads, m.kv_heads))
          << m.name << " cp " << c;
    const auto cps = seed::table_cps();
    if (std::find(cps.begin(), cps.end(), cp) == cps.end()) continue;
    bool ran = true;
    try {
      run_layer(world, {"a2a", {}, true}, {1, 2 * cp, m.heads, 4}, m.kv_heads);
    } catch (const Error&) {  // agreed on every rank
      ran = false;
    }
    EXPECT_EQ(ran, seed::cp_validity(m.heads, m.kv_heads, cp).library_a2a) << m.name << " cp " << cp;
  }
}

// The table's rows for two models, written out: the seed's rules and the library's.
TEST(SeedTables, ValidCpRowsOfQwen2AndLlama70B) {
  const auto cps_where = [](std::int64_t h, std::int64_t kv, bool seed::CpValidity::*field) {
    std::vector<int> out;
    for (int c : seed::table_cps())
      if (seed::cp_validity(h, kv, c).*field) out.push_back(c);
    return out;
  };
  EXPECT_EQ(cps_where(28, 4, &seed::CpValidity::seed_rule), (std::vector<int>{2, 4, 7, 14, 28}));
  EXPECT_EQ(cps_where(28, 4, &seed::CpValidity::seed_kv_rule), (std::vector<int>{2, 4}));
  EXPECT_EQ(cps_where(28, 4, &seed::CpValidity::library_a2a), (std::vector<int>{2, 4, 7, 8, 14, 16, 28}));
  EXPECT_EQ(cps_where(64, 8, &seed::CpValidity::seed_kv_rule), (std::vector<int>{2, 4, 8}));
  EXPECT_EQ(cps_where(64, 8, &seed::CpValidity::library_a2a), (std::vector<int>{2, 4, 7, 8, 14, 16, 28, 32, 64}));
  EXPECT_EQ(seed::cp_validity(28, 4, 64).hierarchical,
            (std::vector<std::array<int, 2>>{{2, 32}, {4, 16}, {8, 8}, {16, 4}}));
}

}  // namespace
}  // namespace ulysses
