// The planner: units, validity rules, recommendations that follow the seed's reasoning, the
// paper's scaling claim; its byte counts against real runs are in test_context_parallel.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "cp/ring_attention.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/documents.hpp"
#include "test_util.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/plan/calibrate.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"

using namespace ulysses;
using test_util::error_of;

namespace {

PlanInput gpt(std::int64_t seq, std::int64_t heads, std::int64_t kv, int cp) {
  PlanInput in;
  in.seq = seq;
  in.heads = heads;
  in.kv_heads = kv;
  in.head_dim = 128;
  in.cp = cp;
  return in;
}

const PlanRow& row(const Plan& p, const std::string& name) {
  return test_util::row_where(p.rows, &PlanRow::name, name);
}

TEST(Planner, ParsesUnitsAndRejectsUnknownOnes) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("450GB/s"), 450e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("400 Gb/s"), 50e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1.2TB/s"), 1.2e12);
  EXPECT_DOUBLE_EQ(parse_latency("2us"), 2e-6);
  EXPECT_DOUBLE_EQ(parse_latency("5 µs"), 5e-6);
  EXPECT_DOUBLE_EQ(parse_latency("800ns"), 800e-9);
  for (const char* bad : {"450", "450GiB/s", "fast", "-3GB/s", "0GB/s"})
    EXPECT_THROW(parse_bandwidth(bad), Error) << bad;
  try {
    parse_latency("3 fortnights");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown unit 'fortnights'"), std::string::npos) << e.what();
  }
}

TEST(Planner, RejectsImpossibleInputs) {
  EXPECT_THROW(make_plan(gpt(0, 32, 8, 8)), Error);
  EXPECT_THROW(make_plan(gpt(4096, 32, 8, -2)), Error);
  EXPECT_THROW(make_plan(gpt(4096, 32, 7, 8)), Error);  // heads % kv_heads
}

TEST(Planner, BytesAreTheExactFormulas) {
  const PlanInput in = gpt(65536, 32, 8, 8);
  const Plan p = make_plan(in);
  for (const PlanRow& r : p.rows) {
    if (!r.valid) continue;
    const CommVolume v = predicted_comm_volume(r.config, 8, {1, 65536, 32, 128}, 8, DType::bf16);
    EXPECT_EQ(r.forward_bytes_per_rank, v.total_forward_bytes()) << r.name;
    EXPECT_EQ(r.backward_bytes_per_rank, v.total_backward_bytes()) << r.name;
  }
  // Ulysses: (s/cp)·h·d·(cp−1)/cp per tensor, Q + 2·KV in, O out, bf16.
  const std::int64_t per = 65536 / 8 * 128 * 7 / 8 * 2;
  EXPECT_EQ(row(p, "a2a").forward_bytes_per_rank, per * (32 + 2 * 8) + per * 32);
}

TEST(Planner, EveryRowsMemoryIsItsStrategysOneModel) {
  // A row's working set: the busiest rank's q, k, v and out, counted here, and the forward of
  // its strategy's one memory model (Strategy::memory), which training reads too (test_train);
  // self- and cross-attention, bf16 and float32, every registered strategy and configuration.
  for (const DType dtype : {DType::bf16, DType::f32})
    for (const auto& [seq, kv_seq, heads, kv, cp] :
         {std::tuple{65536, 0, 32, 8, 8}, {4099, 0, 8, 2, 3}, {8192, 1000, 16, 16, 4}}) {
      PlanInput in = gpt(seq, heads, kv, cp);
      in.kv_seq = kv_seq, in.dtype = dtype, in.batch = 2, in.causal = kv_seq == 0;
      const std::int64_t k_seq = kv_seq > 0 ? kv_seq : seq;
      const double caller =
          2.0 * 2 * 128 * double(dtype_size(dtype)) * double((seq + cp - 1) / cp * heads + (k_seq + cp - 1) / cp * kv);
      int rows = 0;
      for (const PlanRow& r : make_plan(in).rows) {
        if (!r.valid) continue;
        SCOPED_TRACE(fmt::format("{} {} s {} s_k {} cp {}", r.name, to_string(dtype), seq, k_seq, cp));
        const StrategyMemory m =
            find_strategy(r.config.cp_comm_type).memory(r.config, cp, {2, seq, heads, 128}, k_seq, kv, dtype);
        EXPECT_DOUBLE_EQ(r.memory_bytes, caller + m.forward);
        EXPECT_GE(m.forward, m.kept);
        ++rows;
      }
      EXPECT_GE(rows, 3);
    }
}

TEST(Planner, FollowsTheSeedsJudgement) {
  // More ranks than heads: Ulysses is invalid and the reason says why; a ring takes over.
  Plan p = make_plan(gpt(262144, 8, 8, 16));
  EXPECT_FALSE(row(p, "a2a").valid);
  EXPECT_NE(row(p, "a2a").reason.find("num_heads (8) must be at least cp (16)"), std::string::npos);
  ASSERT_GE(p.best, 0);
  EXPECT_NE(p.rows[std::size_t(p.best)].name, "a2a");
  EXPECT_NE(p.recommendation.find("a2a is ruled out"), std::string::npos);
  // Nothing valid: every strategy's reason, each once (its first row's, in registry order).
  PlanInput tiny = gpt(4, 8, 8, 8);
  tiny.causal = true;
  const Plan none = make_plan(tiny);
  EXPECT_EQ(none.best, -1);
  for (const std::string& type : {"a2a", "p2p", "all_gather"}) {
    const std::string& reason = row(none, type).reason;
    const std::size_t at = none.recommendation.find(reason);
    EXPECT_NE(at, std::string::npos) << type;
    EXPECT_EQ(none.recommendation.find(reason, at + 1), std::string::npos) << type << " said twice";
  }
  // all_gather holds the full K and V whatever cp is; Ulysses' memory shrinks as 1/cp.
  const double full_kv = 2.0 * 131072 * 8 * 128 * 2;
  const double ag8 = row(make_plan(gpt(131072, 32, 8, 8)), "all_gather").memory_bytes;
  const double ag16 = row(make_plan(gpt(131072, 32, 8, 16)), "all_gather").memory_bytes;
  const double u8 = row(make_plan(gpt(131072, 32, 8, 8)), "a2a").memory_bytes;
  const double u16 = row(make_plan(gpt(131072, 32, 8, 16)), "a2a").memory_bytes;
  EXPECT_GE(ag8, full_kv);
  EXPECT_GE(ag16, full_kv);
  EXPECT_LT(u16, 0.6 * u8);
  EXPECT_LT(u16, ag16);
  // A long sequence across nodes: the ring hides most of its traffic behind compute.
  const PlanRow ring = row(make_plan(gpt(1 << 20, 32, 8, 32)), "p2p");  // a copy: the Plan is a temporary
  EXPECT_GT(ring.hidden_s, 0.8 * ring.comm_s);
  // Ulysses never hides its all-to-alls.
  EXPECT_EQ(row(make_plan(gpt(1 << 20, 32, 8, 32)), "a2a").hidden_s, 0.0);
}

TEST(Planner, UnevenHeadsCostTheBusiestRanksCompute) {
  // 6 heads on 4 ranks: Ulysses' busiest rank computes 2 heads where an even split gives 1.5;
  // the ring computes every head on its tokens, evenly. Odd sequences plan too.
  const Plan p = make_plan(gpt(65537, 6, 6, 4));
  EXPECT_DOUBLE_EQ(row(p, "a2a").head_imbalance, 2.0 / 1.5);
  EXPECT_DOUBLE_EQ(row(p, "p2p").head_imbalance, 1.0);
  // (Up to the ring's odd token: the work is counted exactly, so its busiest rank holds 16385.)
  EXPECT_NEAR(row(p, "a2a").compute_s / row(p, "p2p").compute_s, 4.0 / 3.0, 1e-7);
  EXPECT_DOUBLE_EQ(row(p, "a2a+p2p [2,2]").head_imbalance, 1.0);  // 3 heads on each pair
  const Plan even = make_plan(gpt(65536, 8, 8, 4));
  EXPECT_DOUBLE_EQ(row(even, "a2a").head_imbalance, 1.0);
  // The busiest rank's bytes: rank 0 holds 16385 tokens and sends 4 of the 6 heads of them.
  const CommVolume rank0 = predicted_comm_volume(row(p, "a2a").config, 4, 0, {1, 65537, 6, 128}, 6, DType::bf16);
  EXPECT_EQ(rank0.forward_bytes.at("seq_to_head"), 16385LL * 4 * 3 * 128 * 2);
}

TEST(Planner, DocumentsSetTheWorkPerRankAndItsBalance) {
  // One long document and many short ones, causal, on 8 ranks: a global zigzag (all_gather's)
  // gives the ranks unequal work; the ring's per-document zigzag and Ulysses' head split do not.
  PlanInput in = gpt(65536, 32, 8, 8);
  in.documents.assign(8, 2048);
  in.documents.push_back(65536 - 8 * 2048);
  const Plan p = make_plan(in);
  EXPECT_DOUBLE_EQ(row(p, "a2a").work_imbalance, 1.0);
  EXPECT_DOUBLE_EQ(row(p, "p2p").work_imbalance, 1.0);  // every document cuts into 16 equal chunks
  EXPECT_GT(row(p, "all_gather").work_imbalance, 1.2);
  CpConfig plain = planned_config(in, row(p, "p2p"));
  plain.per_document = false;
  double most = 0, total = 0;  // the ring in plain zigzag, as all_gather
  for (int r = 0; r < 8; ++r) {
    const double w = double(find_strategy("p2p").work(plain, 8, r, {1, 65536, 32, 128}, 65536, 8));
    most = std::max(most, w);
    total += w;
  }
  EXPECT_DOUBLE_EQ(most * 8 / total, row(p, "all_gather").work_imbalance);
  // Less work than one causal document of the same length, so less compute.
  EXPECT_LT(row(p, "a2a").compute_s, row(make_plan(gpt(65536, 32, 8, 8)), "a2a").compute_s);
  EXPECT_NE(p.recommendation.find("best balanced by a2a"), std::string::npos) << p.recommendation;
  in.documents.back() -= 1;
  EXPECT_THROW(make_plan(in), Error);  // lengths must add up to seq
  in.documents.back() += 1;
  in.batch = 2;
  EXPECT_THROW(make_plan(in), Error);  // documents need batch 1
}

TEST(Planner, TheContiguousRingIsListedWhereItIsFasterThoughBalancedAlike) {
  // Eight documents of a rank's chunk each: the contiguous ring balances as well as the zigzag
  // (each rank holds one whole document) and runs longer kernel blocks, so it is its own row,
  // the faster. Without documents the twin is listed for its imbalance; with full attention
  // both layouts are contiguous and nothing is listed twice.
  PlanInput in = gpt(131072, 32, 32, 8);
  in.cluster.kernel.kv_half = 256;  // short key blocks run slower
  in.documents.assign(8, 16384);
  const Plan p = make_plan(in);
  EXPECT_DOUBLE_EQ(row(p, "p2p --no-zigzag").work_imbalance, row(p, "p2p").work_imbalance);
  EXPECT_LT(row(p, "p2p --no-zigzag").predicted_step_s, row(p, "p2p").predicted_step_s);
  in.documents.clear();
  EXPECT_GT(row(make_plan(in), "p2p --no-zigzag").work_imbalance, 1.5);
  in.causal = false;
  for (const PlanRow& r : make_plan(in).rows) EXPECT_EQ(r.name.find("--no-zigzag"), std::string::npos) << r.name;
}

TEST(Planner, RowsLeaveTheDocumentsToTheInputAndPlannedConfigAddsThemBack) {
  // A row keeps its configuration without the documents' boundaries (millions of them would be
  // copied into every row); planned_config gives the configuration the row was priced with.
  PlanInput in = gpt(8192, 32, 8, 8);
  in.documents = {100, 3000, 1, 4091, 1000};
  in.window_left = 64;
  const Plan p = make_plan(in);
  const std::vector<std::int64_t> cu = cu_seqlens_of(in.documents);
  for (const PlanRow& r : p.rows) {
    EXPECT_TRUE(r.config.cu_seqlens.empty()) << r.name;
    const CpConfig c = planned_config(in, r);
    EXPECT_EQ(c.cu_seqlens, cu) << r.name;
    EXPECT_EQ(c.window_left, 64) << r.name;
    if (!r.valid) continue;
    const CommVolume v = predicted_comm_volume(c, in.cp, {1, 8192, 32, 128}, in.kv_heads, in.dtype, 8192);
    EXPECT_EQ(r.forward_bytes_per_rank, v.total_forward_bytes()) << r.name;
    EXPECT_EQ(r.backward_bytes_per_rank, v.total_backward_bytes()) << r.name;
  }
  in.mode = PlanMode::decode;  // decode plans one new token: no documents
  EXPECT_TRUE(planned_config(in, p.rows.front()).cu_seqlens.empty());
}

TEST(Planner, SlidingWindowRingBytesFollowTheWindowNotTheSequence) {
  // A worked example: ring with W = 4k at s = 128k, cp = 16 (bf16, 8 KV heads, d = 128).
  // Zigzag chunks of s/32 = 4k tokens each need the last W rows of one neighbour chunk: two
  // halos of W rows forward, their float32 dK/dV back; doubling s changes nothing.
  PlanInput in = gpt(131072, 32, 8, 16);
  in.window_left = 4096;
  const std::int64_t halo = 2 * 4096 * 2 * 8 * 128;  // two halos of K and V, elements
  for (std::int64_t s : {131072, 262144}) {
    in.seq = s;
    const Plan p = make_plan(in);
    const PlanRow& r = row(p, "p2p");
    EXPECT_EQ(r.forward_bytes_per_rank, halo * 2) << s;
    EXPECT_EQ(r.backward_bytes_per_rank, halo * 4) << s;
    EXPECT_EQ(r.forward_messages + r.backward_messages, 4) << s;
  }
  in.seq = 131072;
  const Plan full = make_plan(gpt(131072, 32, 8, 16)), band = make_plan(in);
  const PlanRow &plain = row(full, "p2p"), &windowed = row(band, "p2p");
  EXPECT_EQ(plain.forward_bytes_per_rank, std::int64_t(15) * 8192 * (2 * 8 * 128) * 2);  // 15 shards of 8k tokens

  EXPECT_LT(windowed.compute_s * 10, plain.compute_s);  // the band's work, not the triangle's
  in.window_left = -2;
  EXPECT_THROW(make_plan(in), Error);
  // A window past every sequence is no window: the same work and bytes, never an overflowed 0.
  for (std::int64_t w : {std::int64_t(1) << 40, std::numeric_limits<std::int64_t>::max() - 1,
                         std::numeric_limits<std::int64_t>::max()}) {
    in.window_left = w;
    const Plan wide_plan = make_plan(in);  // row() returns a reference into it
    EXPECT_DOUBLE_EQ(row(wide_plan, "p2p").compute_s, plain.compute_s) << w;
  }
}

// traffic() asks only the members near a rank; against asking all of them, at cp the MPI tests
// do not reach: zigzag and contiguous, uneven chunks, windows within a chunk and across many.
TEST(Planner, HaloVolumeEqualsAskingEveryMember) {
  for (int cp : {16, 37})
    for (bool zigzag : {true, false})
      for (auto [left, right, causal] : {std::tuple{0, -1, true},
                                         {3, -1, true},
                                         {40, -1, true},
                                         {300, -1, true},
                                         {5, 9, false},
                                         {0, 0, false},
                                         {70, 2, false}}) {
        const std::int64_t s = 20 * cp + 7, per_token = 2 * 8;
        const CpConfig cfg{"p2p", {}, causal, std::nullopt, zigzag, {}, left, right};
        SCOPED_TRACE(::testing::Message() << "cp " << cp << " zigzag " << zigzag << " window " << left << "," << right);
        const auto chunks = all_rank_chunks(cfg, cp, s);
        for (int me = 0; me < cp; ++me) {
          std::int64_t given = 0, held = 0;
          for (int r = 0; r < cp; ++r)
            if (r != me) {
              given += total_tokens(halo_rows(chunks[std::size_t(r)], chunks[std::size_t(me)], attention_params(cfg)));
              held += total_tokens(halo_rows(chunks[std::size_t(me)], chunks[std::size_t(r)], attention_params(cfg)));
            }
          const CommVolume v = predicted_comm_volume(cfg, cp, me, {1, s, 8, 1}, 8, DType::f32);
          ASSERT_EQ(v.forward_bytes.at("p2p_kv"), given * per_token * 4) << "rank " << me;
          ASSERT_EQ(v.backward_bytes.at("p2p_dkv"), held * per_token * 4) << "rank " << me;
        }
      }
}

TEST(Planner, UlyssesPerGpuVolumeIsConstantWhenSequenceAndGpusGrowTogether) {
  // The paper's claim: N and P grow together, Ulysses' bytes per GPU stay (nearly) constant.
  double first = 0;
  for (int P = 8; P <= 1024; P *= 2) {
    const Plan p = make_plan(gpt(8192LL * P, 1024, 1024, P));  // enough heads for 1024 ranks
    const double b = double(row(p, "a2a").forward_bytes_per_rank);
    if (first == 0) first = b;
    EXPECT_NEAR(b / first, 1.0, 0.15) << P << " GPUs";
  }
}

// Two hosts of two ranks whose ranks share one slow link (the namespace cluster's shaped veth):
// flows that cross at once split it, so the ring across hosts at stride 2 ([2,2]'s outer ring)
// and the all-to-all cost more, the stride-1 ring (one flow per host) does not.
TEST(Planner, RanksSendingAcrossAtOnceShareTheNodesLink) {
  PlanInput in = gpt(8192, 8, 8, 4);
  in.cluster.ranks_per_node = 2;
  in.cluster.intra = {1e9, 0};
  in.cluster.inter = {25e6, 0};
  const Plan own = make_plan(in);  // inter_concurrent unset: a link per rank
  in.cluster.inter_concurrent = {12.5e6, 0};
  const Cluster& c = in.cluster;
  EXPECT_DOUBLE_EQ(inter_link(c, 1).bandwidth, 25e6);
  EXPECT_DOUBLE_EQ(inter_link(c, 2).bandwidth, 12.5e6);
  EXPECT_DOUBLE_EQ(ring_link(c, 2, 1).bandwidth, 1e9);     // inside a host
  EXPECT_DOUBLE_EQ(ring_link(c, 4, 1).bandwidth, 25e6);    // one rank per host crosses
  EXPECT_DOUBLE_EQ(ring_link(c, 2, 2).bandwidth, 12.5e6);  // both ranks of a host cross
  // 3 MB per rank to 3 peers: 1 MB inside the host, 2 MB across on a link shared by 2 ranks.
  EXPECT_DOUBLE_EQ(all_to_all_seconds(c, 4, 3e6), 2e6 / 12.5e6);
  const Plan shared = make_plan(in);
  EXPECT_DOUBLE_EQ(row(shared, "p2p").comm_s, row(own, "p2p").comm_s);
  EXPECT_GT(row(shared, "a2a").comm_s, 1.9 * row(own, "a2a").comm_s);
  EXPECT_GT(row(shared, "a2a+p2p [2,2]").comm_s, 1.5 * row(own, "a2a+p2p [2,2]").comm_s);
  // One NIC per rank (inter_concurrent = inter): nothing changes.
  in.cluster.inter_concurrent = in.cluster.inter;
  EXPECT_DOUBLE_EQ(row(make_plan(in), "a2a+p2p [2,2]").comm_s, row(own, "a2a+p2p [2,2]").comm_s);
}

// A ring step hides link.overlap of the shorter of its transfer and its compute (the measured
// share over TCP, 1 by default): every figure by hand, forward only and with a backward.
TEST(Planner, RingHidesTheMeasuredShareOfItsTransfers) {
  Link l{1e9, 0};  // 4e6 bytes in 4 ms
  // 4 members, forward only: 3 K/V steps of 4 ms, each behind a step's 12 / 4 = 3 ms of compute.
  const RingSeconds full = ring_seconds(l, 4, 4e6, 0, 12e-3, 0);
  EXPECT_DOUBLE_EQ(full.comm, 12e-3);
  EXPECT_DOUBLE_EQ(full.hidden, 9e-3);
  l.overlap = 0.25;
  const RingSeconds part = ring_seconds(l, 4, 4e6, 0, 12e-3, 0);
  EXPECT_DOUBLE_EQ(part.comm, 12e-3);
  EXPECT_DOUBLE_EQ(part.hidden, 0.25 * 9e-3);
  // With a backward (8 ms of dK/dV a step, 40 / 4 = 10 ms of compute): 3 forward steps hide
  // min(4, 3), 3 backward steps min(4 + 8, 10) of 3·4 + 3·4 + 4·8 = 56 ms.
  EXPECT_DOUBLE_EQ(ring_seconds(l, 4, 4e6, 8e6, 12e-3, 40e-3).comm, 56e-3);
  EXPECT_DOUBLE_EQ(ring_seconds(l, 4, 4e6, 8e6, 12e-3, 40e-3).hidden, 0.25 * (9e-3 + 30e-3));
  l.overlap = 0;
  EXPECT_DOUBLE_EQ(ring_seconds(l, 4, 4e6, 8e6, 12e-3, 40e-3).hidden, 0);
  // The inter-node link keeps its fraction when ranks that cross at once share it.
  Cluster c;
  c.ranks_per_node = 2;
  c.inter = {25e6, 0, 0.4};
  c.inter_concurrent = {10e6, 0};
  EXPECT_DOUBLE_EQ(inter_link(c, 2).overlap, 0.4);
  EXPECT_DOUBLE_EQ(ring_link(c, 4, 1).overlap, 0.4);
  EXPECT_DOUBLE_EQ(ring_link(c, 2, 1).overlap, 1);  // inside a node: intra's default
  // A plan's ring rows expose what is no longer hidden; the collectives do not move.
  PlanInput in = gpt(8192, 8, 8, 4);
  in.cluster.ranks_per_node = 1;
  in.cluster.inter = {1e9, 0};
  const Plan before = make_plan(in);
  in.cluster.inter.overlap = 0.5;
  const Plan after = make_plan(in);
  const PlanRow &p0 = row(before, "p2p"), &p1 = row(after, "p2p");
  EXPECT_GT(p0.hidden_s, 0);
  EXPECT_DOUBLE_EQ(p1.hidden_s, 0.5 * p0.hidden_s);
  EXPECT_DOUBLE_EQ(row(after, "a2a").predicted_step_s, row(before, "a2a").predicted_step_s);
}

// Over TCP the share hidden grows with the polls after a step's first call: measured at 4 calls,
// 1 call hides nothing, 2 a third, 4 all of the measured share; a count-free link keeps its share.
TEST(Planner, RingOverlapScalesWithTheCallsAStepMakes) {
  Link l{1e9, 0, 0.6, 4};
  EXPECT_DOUBLE_EQ(step_overlap(l, 1), 0);
  EXPECT_DOUBLE_EQ(step_overlap(l, 2), 0.2);
  EXPECT_DOUBLE_EQ(step_overlap(l, 4), 0.6);
  EXPECT_DOUBLE_EQ(step_overlap(l, 10), 1);  // never more than the whole transfer
  EXPECT_DOUBLE_EQ(step_overlap(l, 0.5), 0);
  EXPECT_DOUBLE_EQ(step_overlap(l, double(NAN)), 0);
  // 4 members, forward only, 2.5 calls a step: half of the measured share of min(4, 3) ms a step.
  EXPECT_DOUBLE_EQ(ring_seconds(l, 4, 4e6, 0, 12e-3, 0, 2.5).hidden, 3 * 0.3 * 3e-3);
  l.overlap_calls = 0;  // measured with no count (the default, the GPU presets): any count
  EXPECT_DOUBLE_EQ(step_overlap(l, 1), 0.6);
  EXPECT_DOUBLE_EQ(ring_seconds(l, 4, 4e6, 0, 12e-3, 0, 2.5).hidden, 3 * 0.6 * 3e-3);
  // A plan's ring over such a link: the zigzag's pair calls at cp 2 (3 a step, causal) hide more
  // than the contiguous ring's single call a step, which hides nothing.
  PlanInput in = gpt(8192, 8, 8, 2);
  in.cluster.ranks_per_node = 1;
  in.cluster.kernel.ring_pair_calls = true;
  in.cluster.inter = {1e8, 0, 0.6, 4};
  const Plan p = make_plan(in);
  EXPECT_GT(row(p, "p2p").hidden_s, 0);
  EXPECT_DOUBLE_EQ(row(p, "p2p --no-zigzag").hidden_s, 0);
}

// The overlap a calibration derives from the transfer alone, the compute alone and both at once.
TEST(Planner, OverlapFractionFromThreeTimes) {
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 10, 10), 1);               // both at once take the longer's time
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 10, 20), 0);               // they add up
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 4, 12), 0.5);              // 2 of the 4 s transfer hidden
  EXPECT_DOUBLE_EQ(overlap_fraction(4, 10, 12), 0.5);              // the shorter one is the compute
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 4, 16), 0);                // slower than both in a row: none
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 4, 9), 1);                 // faster than the longer (noise): all
  for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)}) {  // nothing measured: the default
    EXPECT_DOUBLE_EQ(overlap_fraction(bad, 4, 9), 1);
    EXPECT_DOUBLE_EQ(overlap_fraction(10, bad, 9), 1);
    EXPECT_DOUBLE_EQ(overlap_fraction(10, 4, bad), 1);
  }
}

}  // namespace

// ---- cross-attention (k/v of s_k tokens, queries at q_offset) -------------------------------

namespace {

PlanInput cross(std::int64_t seq, std::int64_t kv_seq, std::optional<std::int64_t> q_offset, bool causal, int cp) {
  PlanInput in = gpt(seq, 8, 2, cp);
  in.head_dim = 16;
  in.kv_seq = kv_seq;
  in.q_offset = q_offset;
  in.causal = causal;
  return in;
}

// The global query positions whose attention `rank` computes: all of them for Ulysses, the
// inner group's tokens for a2a+p2p, its own tokens otherwise.
std::vector<std::int64_t> query_positions(const CpConfig& cfg, int cp, int rank, std::int64_t seq) {
  int first = rank, count = 1;
  if (cfg.cp_comm_type == "a2a") first = 0, count = cp;
  if (cfg.cp_comm_type == "a2a+p2p") count = cfg.hierarchical_context_parallel_sizes[0], first = rank / count * count;
  std::vector<std::int64_t> out;
  for (int r = first; r < first + count; ++r)
    for (const SeqChunk& c : rank_chunks(cfg, cp, r, seq))
      for (std::int64_t i = c.begin; i < c.begin + c.length; ++i) out.push_back(i);
  return out;
}

// Brute force: query i sees key j in [0, s_k) unless causal and j > q_offset + i.
std::int64_t brute_pairs(const std::vector<std::int64_t>& queries, std::int64_t kv_seq, bool causal,
                         std::int64_t offset) {
  std::int64_t n = 0;
  for (std::int64_t i : queries)
    for (std::int64_t j = 0; j < kv_seq; ++j) n += !causal || j <= offset + i;
  return n;
}

}  // namespace

TEST(PlannerCross, WorkIsTheVisiblePairsAgainstTheKv) {
  for (int cp : {1, 2, 3, 4})
    for (auto [seq, kv_seq, offset, causal] : {std::tuple{12, 29, std::optional<std::int64_t>{}, false},
                                               {12, 29, 17, true},
                                               {12, 29, 0, true},
                                               {13, 7, 3, true},
                                               {10, 6, -3, true},
                                               {16, 16, 5, true},
                                               {10, 40, 35, true},
                                               {9, 5, std::optional<std::int64_t>{}, false}}) {
      const PlanInput in = cross(seq, kv_seq, offset, causal, cp);
      const Plan p = make_plan(in);
      for (const PlanRow& r : p.rows) {
        const Strategy& st = find_strategy(r.config.cp_comm_type);
        if (!st.supports_cross()) continue;
        ASSERT_TRUE(r.valid) << r.name << ": " << r.reason;
        std::int64_t total = 0;
        for (int rank = 0; rank < cp; ++rank) {
          const std::int64_t heads = in.batch * st.heads_of(r.config, cp, rank, in.heads, in.kv_heads).q.count;
          const std::int64_t want =
              heads * brute_pairs(query_positions(r.config, cp, rank, seq), kv_seq, causal, offset.value_or(0));
          EXPECT_EQ(rank_work(in, st, r.config, rank), want) << r.name << " cp " << cp << " rank " << rank << " s "
                                                             << seq << " s_k " << kv_seq << " causal " << causal;
          total += want;
        }
        std::vector<std::int64_t> all(std::size_t(seq), 0);
        for (std::int64_t i = 0; i < seq; ++i) all[std::size_t(i)] = i;
        EXPECT_EQ(total, in.batch * in.heads * brute_pairs(all, kv_seq, causal, offset.value_or(0))) << r.name;
      }
    }
}

TEST(PlannerCross, BytesAreTrafficAndTheOthersAreRefused) {
  const PlanInput in = [] {
    PlanInput x = cross(4096, 12288, 8192, true, 8);
    x.heads = 32, x.kv_heads = 8, x.head_dim = 128;
    return x;
  }();
  const Shape q{1, 4096, 32, 128};
  const Plan p = make_plan(in);
  int cross_rows = 0;
  for (const PlanRow& r : p.rows) {
    const Strategy& st = find_strategy(r.config.cp_comm_type);
    if (!st.supports_cross()) {
      EXPECT_FALSE(r.valid) << r.name;
      EXPECT_NE(r.reason.find("does not support cross-attention"), std::string::npos) << r.name << ": " << r.reason;
      continue;
    }
    ++cross_rows;
    ASSERT_TRUE(r.valid) << r.name << ": " << r.reason;
    ASSERT_EQ(r.config.q_offset, std::optional<std::int64_t>(8192));
    // Each counter's busiest rank, from the strategy's own formula.
    std::map<std::string, std::int64_t> fwd, bwd;
    for (int rank = 0; rank < 8; ++rank) {
      const CommVolume v = st.traffic(r.config, 8, rank, q, 12288, 8, DType::bf16);
      for (const auto& [op, b] : v.forward_bytes) fwd[op] = std::max(fwd[op], b);
      for (const auto& [op, b] : v.backward_bytes) bwd[op] = std::max(bwd[op], b);
    }
    std::int64_t f = 0, b = 0;
    for (const auto& [op, n] : fwd) f += n;
    for (const auto& [op, n] : bwd) b += n;
    EXPECT_EQ(r.forward_bytes_per_rank, f) << r.name;
    EXPECT_EQ(r.backward_bytes_per_rank, b) << r.name;
  }
  EXPECT_GE(cross_rows, 2);  // a2a and all_gather at least
  EXPECT_GE(p.best, 0);
}

TEST(PlannerCross, KvBytesAndTimeFollowTheKvLength) {
  // all_gather moves only K/V: doubling s_k doubles its bytes and (latency aside) its
  // communication time; a2a's q and out parts stay.
  PlanInput a = cross(8192, 16384, std::optional<std::int64_t>{}, false, 8);
  a.cluster.intra.latency = 1e-15;
  PlanInput b = a;
  b.kv_seq = 32768;
  const Plan pa = make_plan(a), pb = make_plan(b);
  const PlanRow &ga = row(pa, "all_gather"), &gb = row(pb, "all_gather");
  EXPECT_EQ(gb.forward_bytes_per_rank, 2 * ga.forward_bytes_per_rank);
  EXPECT_EQ(gb.backward_bytes_per_rank, 2 * ga.backward_bytes_per_rank);
  EXPECT_NEAR(gb.comm_s / ga.comm_s, 2.0, 1e-6);
  const PlanRow &ua = row(pa, "a2a"), &ub = row(pb, "a2a");
  EXPECT_GT(ub.forward_bytes_per_rank, ua.forward_bytes_per_rank);
  EXPECT_LT(ub.forward_bytes_per_rank, 2 * ua.forward_bytes_per_rank);
  EXPECT_DOUBLE_EQ(ub.compute_s, 2 * ua.compute_s);  // no mask: pairs ∝ s_k
}

TEST(PlannerCross, CausalWithoutAnOffsetIsAnInputError) {
  try {
    make_plan(cross(4096, 8192, std::optional<std::int64_t>{}, true, 4));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs q_offset"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_plan(cross(4096, -1, 0, true, 4)), Error);
}

namespace {

TEST(PlannerBounds, HugeSizesAndRankCountsAreRefused) {
  PlanInput in;
  in.seq = 288230376151711744;  // 2^58: s *= 2 used to overflow in the SVG's loop
  in.heads = in.kv_heads = 8;
  EXPECT_NE(plan_input_error(in).find("too large to plan"), std::string::npos);
  EXPECT_THROW(make_plan(in), Error);
  in.seq = 1024;
  in.cp = 2000000000;
  EXPECT_EQ(plan_input_error(in), "cp must be at most 65536, got 2000000000");
  in.cp = 8;
  in.heads = in.kv_heads = 2147483647;  // near 2^31: the byte counts fit int64
  in.head_dim = 128;
  EXPECT_EQ(plan_input_error(in), "");
  const Plan p = make_plan(in);
  for (const PlanRow& r : p.rows)
    if (r.valid) EXPECT_GT(r.forward_bytes_per_rank, 0) << r.name;
}

TEST(PlannerBounds, WorkPast64BitsIsRefusedUnlessAWindowOrDocumentsBoundIt) {
  PlanInput in;
  in.seq = std::int64_t(1) << 31;  // 32 heads: s^2 h = 2^67 pairs x heads; a2a's work wrapped to 0
  in.heads = in.kv_heads = 32;
  in.cp = 8;
  EXPECT_NE(plan_input_error(in).find("too large to plan: a rank's work"), std::string::npos) << plan_input_error(in);
  EXPECT_THROW(check_plan_input(in), Error);
  in.seq = std::int64_t(1) << 28;  // 2^61 at most a rank: planned, compute grows as s^2
  ASSERT_EQ(plan_input_error(in), "");
  const double small = row(make_plan(in), "a2a").compute_s;
  in.seq = std::int64_t(1) << 32;
  in.window_left = 4096, in.window_right = 0;  // at most 4097 keys a query
  ASSERT_EQ(plan_input_error(in), "");
  const Plan windowed = make_plan(in);
  // Query p sees min(p + 1, 4097) keys; a2a's rank all of them on 32 / 8 heads, 4 d FLOPs a pair
  // forward and backward_ratio times that back, at the flat rate (the default kernel model).
  const double s = double(in.seq), pairs = s * 4097 - 4096.0 * 4097 / 2;
  const double flops = 4 * 128 * pairs * 4 * (1 + in.cluster.kernel.backward_ratio);
  EXPECT_NEAR(row(windowed, "a2a").compute_s / (flops / (in.cluster.peak_flops * in.cluster.efficiency)), 1, 1e-9);
  EXPECT_LT(row(windowed, "a2a").compute_s, small);
  in.window_left = in.window_right = -1;
  in.documents.assign(std::size_t(1) << 22, 1024);  // documents of 1024 bound it too
  EXPECT_EQ(plan_input_error(in), "");
  in.documents.clear();
  in.seq = std::int64_t(1) << 30;  // decode's time to first token plans the prompt on one rank:
  in.mode = PlanMode::decode;      // 2^30 x (2^30 + 1) / 2 pairs on 32 heads pass 2^63
  EXPECT_NE(plan_input_error(in).find("over 1 rank(s)"), std::string::npos) << plan_input_error(in);
  EXPECT_THROW(check_plan_input(in), Error);
}

TEST(PlannerBounds, AnInfiniteComputeRateIsRefused) {
  PlanInput in;
  in.seq = 1024;
  in.heads = in.kv_heads = 8;
  in.cluster.peak_flops = std::numeric_limits<double>::infinity();
  EXPECT_EQ(plan_input_error(in), "the compute rate must be finite, got inf FLOP/s");
}

TEST(PlannerBounds, UnitsThatOverflowOrUnderflowAreRefused) {
  EXPECT_EQ(parse_bandwidth("450GB/s"), 450e9);
  EXPECT_NE(error_of([] { parse_bandwidth("1e308TB/s"); }).find("must be positive and finite"), std::string::npos);
  EXPECT_THROW(parse_latency("1e-320ns"), Error);  // underflows
  const std::string e = error_of([] { parse_latency(std::string(5000, '9') + "parsecs"); });
  EXPECT_LT(e.size(), 300u) << e;  // the text is clipped, not echoed whole
  // Past these a step's bytes over the bandwidth, or its messages times the latency, could pass a
  // double's range: 1e-300B/s priced every row's communication inf and its hidden share nan.
  EXPECT_EQ(parse_bandwidth("1B/s"), 1.0);
  EXPECT_EQ(error_of([] { parse_bandwidth("1e-300B/s"); }), "bandwidth '1e-300B/s' is below 1 B/s");
  EXPECT_EQ(parse_latency("1000s"), 1000.0);
  EXPECT_EQ(error_of([] { parse_latency("1e30s"); }), "latency '1e30s' is above 1000 s");
}

TEST(PlannerBounds, AComputeRateBelowOneFlopASecondIsRefused) {
  PlanInput in;
  in.seq = 1024;
  in.heads = in.kv_heads = 8;
  in.cluster.peak_flops = 989e12;
  in.cluster.efficiency = 1e-300;  // priced the compute at 1.6e298 s, with more layers inf
  EXPECT_NE(plan_input_error(in).find("must be at least 1 FLOP/s"), std::string::npos) << plan_input_error(in);
  in.cluster.efficiency = 1e-14;  // 9.89 FLOP/s: slow, finite
  EXPECT_EQ(plan_input_error(in), "");
}

}  // namespace

TEST(Planner, WorkOfRanksIsWorkRankByRank) {
  // Every strategy's one-call count equals its rank-by-rank one, plain, with packed documents
  // (uneven, one crossing many ranks; 400 shorter than 2·cp, most ranks holding none of each)
  // and with a window, at cp 8; at cp 0 it is empty.
  const Shape q{1, 4000, 8, 16};
  const std::vector<std::int64_t> docs{100, 2900, 1000}, short_docs(400, 10);
  for (const Strategy* s : strategies())
    for (const CpConfig& base : s->plan_configs(8, true))
      for (int variant = 0; variant < 4; ++variant) {
        CpConfig cfg = base;
        if (variant == 1 && s->supports_documents()) cfg.cu_seqlens = cu_seqlens_of(docs);
        if (variant == 3 && s->supports_documents()) cfg.cu_seqlens = cu_seqlens_of(short_docs);
        if (variant == 2 && s->supports_window()) cfg.window_left = 300, cfg.window_right = 0;
        try {
          validate_cp_config(cfg, 8, q, 4, q.s);
        } catch (const Error&) {
          continue;  // a factorisation this shape does not take
        }
        const std::vector<std::int64_t> all = s->work_of_ranks(cfg, 8, q, q.s, 4);
        ASSERT_EQ(all.size(), 8u);
        for (int r = 0; r < 8; ++r)
          EXPECT_EQ(all[std::size_t(r)], s->work(cfg, 8, r, q, q.s, 4)) << s->config_name(cfg);
      }
  EXPECT_TRUE(find_strategy("p2p").work_of_ranks(CpConfig{}, 0, q, q.s, 4).empty());
}

namespace {

void expect_same_volume(const CommVolume& a, const CommVolume& b, const std::string& what) {
  EXPECT_EQ(a.forward_bytes, b.forward_bytes) << what;
  EXPECT_EQ(a.backward_bytes, b.backward_bytes) << what;
  EXPECT_EQ(a.forward_messages, b.forward_messages) << what;
  EXPECT_EQ(a.backward_messages, b.backward_messages) << what;
}

// Every counter's largest over every rank's own formula: what the busiest-rank volume was
// before it priced each distinct traffic key once.
CommVolume busiest_by_every_rank(const CpConfig& cfg, int cp, const Shape& q, std::int64_t kv_heads,
                                 std::int64_t kv_seq) {
  CommVolume most;
  auto take = [](std::map<std::string, std::int64_t>& into, const std::map<std::string, std::int64_t>& from) {
    for (const auto& [op, n] : from) into[op] = std::max(into[op], n);
  };
  for (int r = 0; r < cp; ++r) {
    const CommVolume v = predicted_comm_volume(cfg, cp, r, q, kv_heads, DType::bf16, kv_seq);
    take(most.forward_bytes, v.forward_bytes);
    take(most.backward_bytes, v.backward_bytes);
    take(most.forward_messages, v.forward_messages);
    take(most.backward_messages, v.backward_messages);
  }
  return most;
}

}  // namespace

TEST(Planner, RanksWithEqualTrafficKeysSendAlike) {
  // A strategy's traffic must read the rank only through its traffic_key: every rank of every
  // configuration sends what the first rank with its key sends, and the busiest-rank volume
  // (each key priced once) equals the largest over every rank's formula. Uneven tokens and
  // heads, GQA, full and causal, contiguous, documents, windows (every rank its own key) and
  // cross-attention.
  struct Case {
    std::int64_t s, h, kv;
    bool causal, zigzag;
    std::vector<std::int64_t> docs;
    std::int64_t window = -1, kv_seq = 0;
    std::optional<std::int64_t> q_offset = std::nullopt;
  };
  const std::vector<Case> cases{{1000, 12, 4, true, true, {}},
                                {1003, 12, 3, false, true, {}},
                                {997, 24, 6, true, false, {}},
                                {1000, 8, 8, true, true, {100, 650, 250}},
                                {1001, 12, 12, true, true, {}, 30},
                                {1000, 12, 4, false, true, {}, -1, 333, 5},
                                {1000, 6, 2, false, true, {}, -1, 1777},
                                {1000, 8, 8, true, true, std::vector<std::int64_t>(100, 10)},
                                {1000, 8, 8, true, true, {100, 650, 250}, 40}};
  int checked = 0;
  for (const Case& c : cases)
    for (int cp : {1, 2, 3, 4, 6, 8, 12})
      for (const Strategy* s : strategies())
        for (CpConfig cfg : s->plan_configs(cp, c.causal)) {
          cfg.zigzag = c.zigzag;
          if (!c.docs.empty()) cfg.cu_seqlens = cu_seqlens_of(c.docs);
          cfg.window_left = c.window;
          cfg.q_offset = c.q_offset;
          const Shape q{2, c.s, c.h, 16};
          const std::int64_t kv_seq = c.kv_seq ? c.kv_seq : c.s;
          try {
            validate_cp_config(cfg, cp, q, c.kv, kv_seq);
          } catch (const Error&) {
            continue;  // a factorisation or an input this strategy does not take
          }
          const std::string what = fmt::format("{} cp {} s {} h {}/{}", s->config_name(cfg), cp, c.s, c.h, c.kv);
          std::map<Strategy::TrafficKey, int> first;
          const std::vector<Strategy::TrafficKey> keys = s->traffic_keys(cfg, cp, q, kv_seq, c.kv);
          ASSERT_EQ(keys.size(), std::size_t(cp)) << what;
          for (int r = 0; r < cp; ++r) {
            EXPECT_EQ(keys[std::size_t(r)], s->traffic_key(cfg, cp, r, q, kv_seq, c.kv)) << what << " rank " << r;
            const int r0 = first.emplace(s->traffic_key(cfg, cp, r, q, kv_seq, c.kv), r).first->second;
            expect_same_volume(s->traffic(cfg, cp, r, q, kv_seq, c.kv, DType::bf16),
                               s->traffic(cfg, cp, r0, q, kv_seq, c.kv, DType::bf16),
                               fmt::format("{}: rank {} against rank {}", what, r, r0));
          }
          expect_same_volume(predicted_comm_volume(cfg, cp, q, c.kv, DType::bf16, kv_seq),
                             busiest_by_every_rank(cfg, cp, q, c.kv, kv_seq), what);
          ++checked;
        }
  EXPECT_GT(checked, 150);  // the cases are valid for most strategies, not skipped
}

TEST(Planner, BusiestVolumeAtAWorldOf65536IsEveryRanksLargest) {
  // What made a plan at cp 65536 slow, priced by key, against every rank's formula; the ring's
  // bytes also against the closed form: K/V all but the next rank's 2 tokens, dK/dV all of it.
  const Shape q{1, 131072, 32, 128};
  for (const CpConfig& cfg : {CpConfig{"p2p", {}, true}, CpConfig{"all_gather", {}, true},
                              CpConfig{"a2a+p2p", {16, 4096}, true}, CpConfig{"p2p", {}, false}}) {
    const CommVolume v = predicted_comm_volume(cfg, 65536, q, 8, DType::bf16);
    expect_same_volume(v, busiest_by_every_rank(cfg, 65536, q, 8, 0), find_strategy(cfg.cp_comm_type).config_name(cfg));
  }
  const CommVolume ring = predicted_comm_volume(CpConfig{"p2p", {}, true}, 65536, q, 8, DType::bf16);
  const std::int64_t per_token = 2 * 8 * 128;
  EXPECT_EQ(ring.forward_bytes.at("p2p_kv"), (131072 - 2) * per_token * 2);
  EXPECT_EQ(ring.backward_bytes.at("p2p_dkv"), 131072 * per_token * 4);
}

TEST(PlannerTieBand, MeasuredBandIsTheMedianOfThePairsRatioErrors) {
  // Predicted ratio over measured ratio per pair in one shape, max(x, 1/x) - 1: 1.1 -> 0.1,
  // 1.05 -> 0.05, 0.8 -> 0.25, and an exact pair 0; a row not run (measured 0) pairs with none.
  const std::vector<std::vector<ValidatedRow>> shapes = {{{1, 1}, {2, 2.2}},
                                                         {{1, 1}, {1, 1.05}, {1, 0}},
                                                         {{2, 2}, {1, 1.25}},
                                                         {{3, 3}, {1, 1}}};
  const MeasuredBand m = measured_tie_band(shapes);
  EXPECT_EQ(m.pairs, 4);
  EXPECT_NEAR(m.band, (0.05 + 0.1) / 2, 1e-12);  // the median of 0, 0.05, 0.1, 0.25
  // Either order of a pair gives the same error; an odd count its middle one.
  EXPECT_NEAR(measured_tie_band({{{2, 2.2}, {1, 1}}}).band, 0.1, 1e-12);
  EXPECT_NEAR(measured_tie_band({shapes[0], shapes[1], shapes[2]}).band, 0.1, 1e-12);
  // Three rows of a shape are three pairs: ratios 1.1 (a, b), 1 (a, c) and 1.1 (b, c).
  const MeasuredBand three = measured_tie_band({{{1, 1}, {1, 1.1}, {1, 1}}});
  EXPECT_EQ(three.pairs, 3);
  EXPECT_NEAR(three.band, 0.1, 1e-12);
  // No pair: no band, and a calibrated plan keeps the published one.
  EXPECT_EQ(measured_tie_band({{{1, 1}}, {}}).pairs, 0);
  const TieBand none = calibrated_tie_band({}, "nowhere", false);
  EXPECT_EQ(none.band, kPlanTieBand);
  EXPECT_TRUE(none.source.empty() && !none.memory_decides);
  EXPECT_TRUE(calibrated_tie_band({}, "nowhere", true).memory_decides);
  const TieBand t = calibrated_tie_band(m, "on a test", false);
  EXPECT_EQ(t.band, m.band);
  EXPECT_FALSE(t.memory_decides);
  EXPECT_NE(t.source.find("4 pairs of strategies measured on a test"), std::string::npos) << t.source;
  EXPECT_TRUE(calibrated_tie_band(m, "x", true).memory_decides);
}

TEST(PlannerTieBand, BadMeasurementsAndBandsAreErrors) {
  for (ValidatedRow bad : std::vector<ValidatedRow>{{0, 1}, {-1, 1}, {NAN, 1}, {INFINITY, 1}, {1, NAN}, {1, INFINITY}})
    EXPECT_NE(error_of([&] {
                measured_tie_band({{{1, 1}, bad}});
              }).find("a measured row needs positive, finite"),
              std::string::npos)
        << bad.predicted_s << " " << bad.measured_s;
  for (double band : {-0.01, double(NAN), double(INFINITY)}) {
    EXPECT_NE(error_of([&] {
                check_tie_band({band, "", true});
              }).find("the tie band must be finite and not negative"),
              std::string::npos)
        << band;
    EXPECT_THROW(make_plan(gpt(8192, 32, 8, 8), TieBand{band, "", true}), Error) << band;
  }
  EXPECT_THROW(calibrated_tie_band({NAN, 3}, "a broken measurement", false), Error);
  // A model measured no better than a guess (a loaded machine): every pair ties, the fastest kept.
  const PlanInput in = gpt(8192, 32, 8, 8);
  const Plan guess = make_plan(in, calibrated_tie_band({28.6, 21}, "under load", false));
  EXPECT_EQ(guess.best, make_plan(in, TieBand{0, "", false}).best);
  EXPECT_NE(guess.recommendation.find("within 2860.0%"), std::string::npos) << guess.recommendation;
}

// The valid row of least predicted time (the first of equals).
int fastest_row(const Plan& p) {
  int best = -1;
  for (std::size_t i = 0; i < p.rows.size(); ++i)
    if (p.rows[i].valid && (best < 0 || p.rows[i].predicted_step_s < p.rows[std::size_t(best)].predicted_step_s))
      best = int(i);
  return best;
}

TEST(PlannerTieBand, InsideTheBandMemoryDecidesOnlyWhereTold) {
  // GQA at cp 8: the rows' predicted times within a few percent, their memory up to 3x apart.
  const PlanInput in = gpt(131072, 32, 8, 8);
  const Plan fastest = make_plan(in, TieBand{0.5, "on a test", false});
  EXPECT_EQ(fastest.best, fastest_row(fastest));
  // Its runner-up, a2a+p2p [1,8], is p2p itself: equal predictions, the first listed wins.
  EXPECT_NE(fastest.recommendation.find("(a tie: equal predictions: the first listed wins; memory does not decide)"),
            std::string::npos)
      << fastest.recommendation;
  // A runner-up predicted slower says by which term.
  PlanInput a100 = in;
  a100.seq = 65536;
  a100.cluster.kernel.call_s = 1e-4;
  const Plan by_term = make_plan(a100, TieBand{0.5, "on a test", false});
  EXPECT_NE(by_term.recommendation.find("(a tie: the predicted faster wins, by "), std::string::npos)
      << by_term.recommendation;
  EXPECT_NE(fastest.recommendation.find("50.0%, the model's error on a test"), std::string::npos)
      << fastest.recommendation;
  // Memory deciding a wide band: a slower row with under 0.9x the memory wins, and says so.
  const Plan memory = make_plan(in, TieBand{0.5, "on a test", true});
  const PlanRow& b = memory.rows[std::size_t(memory.best)];
  const PlanRow& f = memory.rows[std::size_t(fastest_row(memory))];
  ASSERT_NE(memory.best, fastest_row(memory)) << memory.recommendation;
  EXPECT_LT(b.memory_bytes, 0.9 * f.memory_bytes);
  EXPECT_LT(b.predicted_step_s, 1.5 * f.predicted_step_s);
  EXPECT_NE(memory.recommendation.find("memory decides: "), std::string::npos) << memory.recommendation;
  // No band: the fastest, whatever the memory; the published band keeps its words.
  EXPECT_EQ(make_plan(in, TieBand{0, "on a test", true}).best, fastest_row(memory));
  const Plan published = make_plan(in);
  EXPECT_EQ(published.best, make_plan(in, TieBand{}).best);
  EXPECT_EQ(published.recommendation, make_plan(in, TieBand{}).recommendation);
  EXPECT_EQ(published.recommendation.find("memory decides"), std::string::npos) << published.recommendation;
}
