// The planner: for a model shape, a sequence length and a cluster, which context-parallel
// strategy to use and what it costs, from 2 CPUs to thousands of GPUs.
//
// Communication volumes are the exact formulas of comm_volume.hpp (checked to the byte
// against real runs). Times use an α–β model per link (latency α per message, bandwidth β):
// links between ranks of one node are "intra" (NVLink by default), others "inter"
// (InfiniBand). Ranks are placed contiguously, ranks_per_node per node. Compute is the
// attention core on the busiest rank: 4·d FLOPs per visible (query, key) pair it computes
// (Strategy::work: its heads and tokens under the causal mask and the documents; backward
// 2.5×) at peak × efficiency. The ring (p2p, and the outer ring of a2a+p2p) hides each step's
// transfer behind that step's compute; all-to-all and all-gather are barriers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ulysses/cp_config.hpp"
#include "ulysses/tensor.hpp"

namespace ulysses {

class Strategy;

struct Link {
  double bandwidth = 450e9;  // bytes per second, one direction, per rank
  double latency = 2e-6;     // seconds per message
};

struct Cluster {
  int ranks_per_node = 8;
  Link intra{450e9, 2e-6};  // NVLink 4 (H100): ~450 GB/s per direction per GPU
  Link inter{50e9, 5e-6};   // 400 Gb/s InfiniBand per GPU
  // All-to-all inside a node, when it behaves unlike point-to-point (a calibrated fit);
  // a bandwidth of 0 means "use intra".
  Link alltoall_intra{0, 0};
  // The inter-node link per rank when every rank of a node sends across at once (a calibrated
  // fit): ranks that share one NIC (or one shaped link) split it. A bandwidth of 0 means "a
  // link per rank" (one NIC per GPU): concurrent flows cost what one does.
  Link inter_concurrent{0, 0};
  double peak_flops = 989e12;  // H100 dense bf16
  double efficiency = 0.5;     // achieved fraction of peak in attention
};

struct PlanInput {
  std::int64_t seq = 0, batch = 1, heads = 0, kv_heads = 0, head_dim = 128, layers = 1;
  int cp = 1;
  bool causal = true;
  DType dtype = DType::bf16;
  // Packed documents: their lengths, summing to seq (batch 1); empty: one document.
  std::vector<std::int64_t> documents;
  Cluster cluster;
  // Sliding window (FlashAttention's window_size); -1: unbounded side.
  std::int64_t window_left = -1, window_right = -1;
  // Cross-attention (is_cross in strategy.hpp): k/v of kv_seq tokens (0: seq) and queries at key
  // position q_offset (CpConfig::q_offset). Bytes follow Strategy::traffic_cross, work the
  // visible pairs against the k/v; strategies without Strategy::supports_cross are refused.
  std::int64_t kv_seq = 0;
  std::optional<std::int64_t> q_offset;
};

struct PlanRow {
  CpConfig config;
  std::string name;  // "a2a", "a2a+p2p [2,8]", ...
  bool valid = false;
  std::string reason;  // why invalid, or ""
  // One layer, each counter's busiest rank (every rank's when tokens and heads split evenly).
  std::int64_t forward_bytes_per_rank = 0, backward_bytes_per_rank = 0;
  std::int64_t forward_messages = 0, backward_messages = 0;
  double head_imbalance = 1;    // the busiest rank's query heads over the average (uneven Ulysses splits)
  double work_imbalance = 1;    // the busiest rank's attention work over the average (Strategy::work:
                                // heads, tokens, the causal mask, documents)
  double compute_s = 0;         // per layer, forward + backward, on the busiest rank
  double comm_s = 0;            // per layer, all transfers
  double hidden_s = 0;          // of comm_s, hidden behind compute
  double memory_bytes = 0;      // attention working set per rank, one layer
  double predicted_step_s = 0;  // all layers, forward + backward
};

struct Plan {
  std::vector<PlanRow> rows;  // every registered strategy's plan_configs (a2a+p2p at every factorisation) of cp
  int best = -1;              // index of the recommendation (-1: nothing valid)
  std::string recommendation;
};

// Cost-model building blocks, shared by the strategies' Strategy::cost.
// The most tokens a rank holds: ceil(seq / cp), whatever the token layout.
std::int64_t busiest_tokens(const PlanInput& in);
// The most k/v tokens a rank holds: ceil(s_k / cp) (busiest_tokens without cross-attention).
std::int64_t busiest_kv_tokens(const PlanInput& in);
// The k/v length s_k: in.kv_seq, or in.seq when it is 0.
std::int64_t kv_seq_of(const PlanInput& in);
// One message of `bytes` on a link: latency + bytes / bandwidth.
double message_seconds(const Link& link, double bytes);
// An all-to-all over `group` contiguous ranks, `bytes` sent per rank: intra- and inter-node
// peers send in parallel, and the group's ranks on one node share its inter-node link
// (inter_link); each peer costs one latency.
double all_to_all_seconds(const Cluster& cluster, int group, double bytes);
// The inter-node link each of `flows` ranks of one node gets while they all send across at
// once: the point-to-point fit, or the node's share (inter_concurrent × ranks_per_node) split
// `flows` ways when that is less.
Link inter_link(const Cluster& cluster, int flows);
// The slowest hop of a ring of `members` ranks `stride` apart (contiguous placement): when it
// leaves the node, min(stride, ranks_per_node) ranks of each node send across at once.
Link ring_link(const Cluster& cluster, int members, int stride);
// A ring over `link`: forward (members−1) K/V steps, each hidden behind one step's compute;
// backward K/V steps plus dK/dV steps, the last dK/dV hop exposed.
struct RingSeconds {
  double comm = 0, hidden = 0;
};
RingSeconds ring_seconds(const Link& link, int members, double kv_bytes, double dkv_bytes, double fwd_s, double bwd_s);

// A pipeline of `chunks` steps (overlapped Ulysses): step i computes for `compute_s` while the
// next chunk's input (`in_s`) and the previous chunk's output (`out_s`) travel; what does not
// fit behind the compute is exposed, and so are the first input and the last output.
double pipeline_exposed(int chunks, double in_s, double out_s, double compute_s);

// The attention work the planner counts for rank `rank` of `strategy` under `config` (a row's
// config): Strategy::work, or under cross-attention (in.kv_seq, in.q_offset) the same rank's
// queries counted against the k/v under the mask at q_offset.
std::int64_t rank_work(const PlanInput& in, const Strategy& strategy, const CpConfig& config, int rank);

// The most ranks the planner models (its per-rank formulas run once per rank).
inline constexpr int kMaxPlanRanks = 1 << 16;
// "" when make_plan accepts `in`, else why not: non-positive sizes, heads % kv_heads != 0, cp
// above kMaxPlanRanks, or sizes whose byte counts would not fit 64 bits.
std::string plan_input_error(const PlanInput& in);
// Throws Error with plan_input_error's message for impossible inputs.
Plan make_plan(const PlanInput& in);
// make_plan's rows of one strategy alone (its plan_configs at in.cp): what the balancer prices a
// sequence with, without the other strategies' rows. Throws as make_plan does.
std::vector<PlanRow> strategy_rows(const PlanInput& in, const Strategy& strategy);

// CpConfig::overlap_chunks for a2a on `in`: the count (1 to 8, clamped by
// ulysses_overlap_chunks) whose predicted step time is the lowest, the fewest on a tie, and
// the exposed communication per layer (forward + backward) it predicts against plain a2a's.
// chunks is 1 when a2a is invalid for `in`; impossible inputs throw as make_plan does.
struct OverlapPlan {
  int chunks = 1;
  double exposed_s = 0, plain_exposed_s = 0;
};
OverlapPlan plan_overlap(const PlanInput& in);

// "450GB/s", "400Gb/s", "1.2TB/s", "900MB/s" → bytes/s; "2us", "5 µs", "1ms", "800ns" → s.
// Throws Error naming the text and the accepted units.
double parse_bandwidth(const std::string& text);
double parse_latency(const std::string& text);

}  // namespace ulysses
