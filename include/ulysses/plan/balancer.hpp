// The balancer: which ranks compute which sequence of a variable-length step.
//
// A step is a list of sequences of their own lengths (no padding). The balancer gives every
// sequence a CP group — a contiguous range of ranks [first_rank, first_rank + size), any size
// >= 1 the strategy supports — and so every rank a list of sequences, run one after another.
// Contiguous groups keep a group on as few nodes as possible (ranks are placed contiguously,
// ranks_per_node per node, as in the planner) and make every group a cacheable split.
//
// Deadlock freedom: every rank runs its sequences in increasing sequence index. The lowest
// unfinished index then always has all its group's ranks at it (each finished everything
// lower), so the collectives of a step always make progress, whatever the groups.
//
// Deterministic: a pure function of its input, so every rank computes the same plan; callers
// agree on the input (Communicator::agree_identical) before acting on the plan.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ulysses/cp/cp_config.hpp"
#include "ulysses/plan/planner.hpp"

namespace ulysses {

enum class BalancePolicy {
  static_,  // every sequence over groups of world/dp ranks, dealt round-robin (i % dp)
  pow2,     // Megatron's hybrid CP: cp = next power of two of len / max_tokens_per_rank
  dynamic,  // ours: minimise the predicted step time of the slowest rank (balancer.cpp says how)
};
// "static" | "pow2" | "dynamic"; parse throws Error naming the text and the choices.
const char* policy_name(BalancePolicy p);
BalancePolicy parse_policy(const std::string& text);

// sequence_cost's answers kept by (length, size) across balance() calls. A cost depends on the
// model, the strategy, the GEMMs and the memory model, not on the world, dp, the step or the
// policy, so a caller planning one step at several worlds under each policy prices each (length,
// size) once instead of once a world and policy (with a2a+p2p, whose rows price every
// factorisation, most of such a plan's time). Every input sharing one must agree on everything
// but lengths, world, dp and max_tokens_per_rank: balance() throws Error when one sequence's cost
// on one rank (the model's shape, dtype, rates, GEMMs, memory model and cap), the strategy, the
// node size or the links differ from the first input's; the rest (a kernel model, a window) is the
// caller's to keep. balance() calls sharing one may run at once on several threads (each with its
// own BalanceInput: a memory_per_rank may keep state between its calls, as the CLI's does). It
// also keeps pow2's groups of each (world, max_tokens_per_rank, step): a pow2 plan and a dynamic
// one (which weighs pow2's groups as a candidate) of the same step make them once.
class BalanceCosts;
std::shared_ptr<BalanceCosts> make_balance_costs();

struct BalanceInput {
  std::vector<std::int64_t> lengths;  // the step's sequences, in loader order (each >= 1)
  int world = 1;                      // ranks in all
  int dp = 1;                         // static: groups of world / dp ranks (dp must divide world)
  // The per-sequence model the cost is computed for: heads, kv_heads, head_dim, layers,
  // causal, window, dtype, cluster and the strategy (cp_comm_type); seq, cp and documents
  // are set per sequence by the balancer.
  PlanInput model;
  std::string cp_comm_type = CpConfig().cp_comm_type;
  // Projections and MLP: FLOPs per token, forward + backward, all layers (6 · weights for a
  // dense model); they run sequence-sharded, so a group of c ranks does 1/c of them each.
  double gemm_flops_per_token = 0;
  // The GEMMs' rate in FLOP/s (plan --calibrate measures BLAS apart from attention); 0: the
  // cluster's peak_flops × efficiency, as the attention's.
  double gemm_flops_rate = 0;
  // Bytes per rank a sequence of `len` tokens needs at CP size `cp` (the training memory
  // model); empty: no memory model. max_memory: the cap per rank (0: none).
  std::function<double(std::int64_t len, int cp)> memory_per_rank;
  double max_memory = 0;
  // pow2 only: the most tokens one rank may hold (Megatron's max_seqlen_per_dp_cp_rank); 0: the
  // longest sequence's tokens over world (so the longest gets every rank).
  std::int64_t max_tokens_per_rank = 0;
  // How many threads balance() may use (dynamic builds its candidate plans at once); the plan is
  // the same at any count. 1: the caller's thread only, as a training rank, whose node's cores
  // are its ranks', wants.
  int threads = 1;
  // Shared by the calls that plan one step at several worlds or policies (BalanceCosts above);
  // null: each call prices its own.
  std::shared_ptr<BalanceCosts> costs;
};

struct BalanceGroup {
  int first_rank = 0;
  int size = 1;
  bool contains(int rank) const { return rank >= first_rank && rank < first_rank + size; }
  bool operator==(const BalanceGroup& o) const { return first_rank == o.first_rank && size == o.size; }
};

struct BalancePlan {
  BalancePolicy policy = BalancePolicy::static_;
  std::vector<BalanceGroup> groups;  // groups[i]: the ranks of sequence i
  // Predicted time at which each rank finishes its sequences (world entries): their costs plus
  // the waiting the execution model implies (a group starts a sequence when all its members are
  // free, in increasing index).
  std::vector<double> rank_seconds;
  std::vector<double> rank_busy_seconds;  // of rank_seconds, computing (the sum of its sequences' costs)
  std::vector<double> rank_memory;        // predicted peak bytes of each rank (0 without a model)
  std::vector<double> rank_bytes;         // bytes each rank sends, all its sequences, all layers
  std::vector<double> sequence_seconds;   // sequence i's predicted time on groups[i]
  std::vector<CpConfig> configs;          // the configuration sequence i's cost is for (a2a+p2p: its factorisation)
  double step_seconds = 0;                // the slowest rank's
  // The sequences rank `rank` computes, in the order it must run them (increasing index).
  std::vector<int> sequences_of(int rank) const;
};

// Not collective. Throws Error (the same on every rank, as the input is) for an empty step, a
// length < 1, dp not dividing world, or a sequence that fits no group under the memory cap
// (naming the sequence, its length and the bytes the smallest-footprint group would need).
BalancePlan balance(const BalanceInput& in, BalancePolicy policy);

// The cost model of one sequence of `length` tokens on a contiguous group of `size` ranks that
// starts on a node boundary (or fits inside one node): the planner's row of in.cp_comm_type at
// seq = length, cp = size (a2a+p2p: its fastest factorisation), all layers, plus the
// sequence-sharded GEMMs. `valid` false, with the reason, when the strategy cannot run at that
// size, the group holds more ranks than the sequence has tokens, or the memory cap is exceeded.
// Not collective; throws Error for a model the planner refuses.
struct SequenceCost {
  bool valid = false;
  std::string reason;
  double seconds = 0;  // attention (planner row: compute + exposed communication) + GEMMs
  double bytes = 0;    // bytes the busiest member sends, forward + backward, all layers
  double memory = 0;   // bytes per rank (in.memory_per_rank; 0 without it)
  CpConfig config;
};
SequenceCost sequence_cost(const BalanceInput& in, std::int64_t length, int size);

// Not collective. The predictions of a given assignment (groups[i] for lengths[i]) under the
// execution model: what balance() returns for its own groups (policy: dynamic, as a chosen
// assignment). Throws Error for a group outside the world or a sequence its group cannot run
// (naming both).
BalancePlan predict_plan(const BalanceInput& in, const std::vector<BalanceGroup>& groups);

}  // namespace ulysses
