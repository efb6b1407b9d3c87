// The planner's cost model, its inputs and its primitives: a layer and its cluster
// (PlanInput), an α–β model per link (latency α per message, bandwidth β), and the seconds of
// the transfers the strategies make. It sits below the strategies, whose Strategy::cost is
// written in these terms, and below the planner (planner.hpp), which asks every strategy.
//
// Links between ranks of one node are "intra" (NVLink by default), others "inter"
// (InfiniBand); ranks are placed contiguously, ranks_per_node per node.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ulysses/cp/kernel_model.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

struct Link {
  double bandwidth = 450e9;  // bytes per second, one direction, per rank
  double latency = 2e-6;     // seconds per message
  // The share of a ring step's transfer that runs while the step computes (up to the compute's
  // length). 1 on a link that moves data on its own (NVLink, RDMA, the GPU presets); less where a
  // transfer advances only inside the library's MPI calls and shares the rank's core with the
  // kernel (TCP): `plan --calibrate` measures it (calibrate.hpp).
  double overlap = 1;
  // The kernel calls a step made when `overlap` was measured (0: it holds for any count). Over
  // TCP a large message moves only when the rank polls: its first poll (after the step's first
  // call) answers the rendezvous, and each later one hands the socket what it holds, so the share
  // hidden grows with the polls after the first, (calls − 1) / (overlap_calls − 1) of `overlap`.
  int overlap_calls = 0;
};

struct Cluster {
  int ranks_per_node = 8;
  Link intra{450e9, 2e-6};  // NVLink 4 (H100): ~450 GB/s per direction per GPU
  Link inter{50e9, 5e-6};   // 400 Gb/s InfiniBand per GPU
  // All-to-all inside a node, when it behaves unlike point-to-point (a calibrated fit);
  // a bandwidth of 0 means "use intra".
  Link alltoall_intra{0, 0};
  // Ranks under one PCIe switch (0: a switch-free fabric such as NVSwitch): an all-to-all
  // within one switch moves at the point-to-point rate; a wider one shares the links above the
  // switches, alltoall_intra's rate.
  int switch_ranks = 0;
  // Ranks under one CPU socket (0: the node is one tier). PCIe GPUs without peer-to-peer reach
  // each other through their socket's root complex, and across sockets through the host: an
  // all-to-all within a socket moves at alltoall_socket's rate, a wider one at alltoall_intra's,
  // and a ring whose members span sockets passes its blocks at cross_socket's (point to point).
  int socket_ranks = 0;
  Link alltoall_socket{0, 0};
  Link cross_socket{0, 0};
  // The inter-node link per rank when every rank of a node sends across at once (a calibrated
  // fit): ranks that share one NIC (or one shaped link) split it. A bandwidth of 0 means "a
  // link per rank" (one NIC per GPU): concurrent flows cost what one does.
  Link inter_concurrent{0, 0};
  double peak_flops = 989e12;  // H100 dense bf16
  double efficiency = 0.5;     // achieved fraction of peak in attention (on long blocks, head dim 128)
  // The rate at the block shapes each strategy runs, and the fixed costs per call
  // (kernel_model.hpp); the default is flat: every block at peak × efficiency.
  KernelModel kernel;
};

// What a step computes. train: forward and backward (the default); forward: the forward alone
// (a forward-only benchmark); prefill: the forward over a prompt (what inference's first step
// does, its K/V kept as the cache); decode: one new query token per sequence (× batch: the
// concurrent sequences) against a cache of seq tokens, forward only.
enum class PlanMode { train, forward, prefill, decode };

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
  // position q_offset (CpConfig::q_offset). Bytes follow Strategy::traffic, work the
  // visible pairs against the k/v; strategies without Strategy::supports_cross are refused.
  std::int64_t kv_seq = 0;
  std::optional<std::int64_t> q_offset;
  PlanMode mode = PlanMode::train;
  // Memory per rank a row may need (0: no cap): the attention working set (PlanRow::memory_bytes)
  // or, decoding, the KV cache a rank holds; a row over it is refused and says so.
  double max_memory_bytes = 0;
};

// True when the step has a backward (PlanMode::train).
bool has_backward(const PlanInput& in);
// The forward and backward (0 without one) seconds of a strategy's `calls` on the busiest rank
// whose work takes flat_fwd_s at peak × efficiency: kernel_seconds under in.cluster.kernel.
KernelSeconds attention_seconds(const PlanInput& in, const KernelCalls& calls, double flat_fwd_s);
// Whether the busiest ring member's calls are counted per visible chunk pair
// (KernelModel::ring_pair_calls): under that model, for one sequence of self-attention (the
// layout the pair count knows; documents and cross-attention keep one call per step).
bool counts_ring_pairs(const PlanInput& in);
// The busiest member's calls of a ring of `members` members each holding `per_member` equal
// chunks of the s queries and s_k keys (ring_visible_pairs): a call per visible pair, q and kv
// one chunk each, each merged and packing its key chunk; the diagonal pairs' share of the work.
KernelCalls ring_pair_calls(const PlanInput& in, std::int64_t members, std::int64_t per_member, bool zigzag,
                            bool causal, double q_heads, double kv_heads);

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
// The link an all-to-all over `group` contiguous ranks of one node moves at: the point-to-point
// link under one switch, the socket's all-to-all rate within a socket, else the node's.
Link alltoall_link(const Cluster& cluster, int group);
// The inter-node link each of `flows` ranks of one node gets while they all send across at
// once: the point-to-point fit, or the node's share (inter_concurrent × ranks_per_node) split
// `flows` ways when that is less.
Link inter_link(const Cluster& cluster, int flows);
// The slowest hop of a ring of `members` ranks `stride` apart (contiguous placement): when it
// leaves the node, min(stride, ranks_per_node) ranks of each node send across at once; inside a
// node whose ring spans sockets, the hop between sockets (cross_socket) when it is slower.
Link ring_link(const Cluster& cluster, int members, int stride);
// A ring over `link`: forward (members−1) K/V steps, each hidden behind one step's compute up to
// link.overlap of the shorter of the two; backward K/V steps plus dK/dV steps, the last dK/dV hop
// exposed. No backward (a forward-only mode) when dkv_bytes and bwd_s are both 0.
// `step_calls`: the kernel calls a ring step makes (KernelCalls::calls / members; 1 for one call
// a step), which sets the share hidden on a link whose overlap was measured at a count (step_overlap).
struct RingSeconds {
  double comm = 0, hidden = 0;
};
RingSeconds ring_seconds(const Link& link, int members, double kv_bytes, double dkv_bytes, double fwd_s, double bwd_s,
                         double step_calls = 1);
// The share of a step's transfer hidden on `link` at `step_calls` calls a step: link.overlap where
// it holds for any count (overlap_calls < 2), else link.overlap · (step_calls − 1) / (overlap_calls − 1);
// within [0, 1], 0 for a non-finite input.
double step_overlap(const Link& link, double step_calls);

// A pipeline of `chunks` steps (overlapped Ulysses): step i computes for `compute_s` while the
// next chunk's input (`in_s`) and the previous chunk's output (`out_s`) travel; what does not
// fit behind the compute is exposed, and so are the first input and the last output.
double pipeline_exposed(int chunks, double in_s, double out_s, double compute_s);

}  // namespace ulysses
