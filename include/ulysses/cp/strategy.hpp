// Strategy — one context-parallel algorithm behind one interface, and the registry that
// finds it by Megatron's cp_comm_type name.
//
// A strategy knows everything about itself: which inputs it accepts, where tokens live, its
// forward and backward (one pair for self- and cross-attention: self-attention is the case
// where the query and key/value chunks coincide), and, apart from the execution, its analytics:
// the exact bytes it sends, its work, what the planner should expect it to cost, its memory
// (one model, for the planner and training alike), and the options it adds to CpConfig. ContextParallelAttention,
// validate_cp_config, the planner, predicted_comm_volume, the training memory model, the CLI
// (its flags and help) and the parametrised tests all iterate the registry and never compare a
// strategy's name, so adding a strategy is one new file under src/cp/strategies/ plus one line
// in src/cp/strategy.cpp (or register_strategy() from outside the library). The built-ins, in registry order:
//   a2a         DeepSpeed-Ulysses: all-to-all seq→head, local attention over the full
//               sequence on h/cp heads, all-to-all head→seq.
//   p2p         ring attention: K/V travel around the ring, overlapped with compute.
//   all_gather  gather the full K/V once; reduce-scatter dK/dV.
//   a2a+p2p     Ulysses inside groups of `inner` contiguous ranks, a ring across the `outer`
//               groups (hierarchical_context_parallel_sizes = {inner, outer}).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/comm/communicator.hpp"
#include "ulysses/cp/cost_model.hpp"
#include "ulysses/cp/cp_config.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/core/tensor.hpp"
#include "ulysses/cp/traffic.hpp"

namespace ulysses {

// What a strategy's forward keeps for its backward (the autograd context). Each strategy
// derives its own; it owns its tensors and may point into the CpGroup it ran on.
class StrategyContext {
 public:
  virtual ~StrategyContext() = default;
};

// The communicator a ContextParallelAttention runs on, and the sub-communicators its
// strategy splits off: made on first use (collectively) and reused by every later call.
class CpGroup {
 public:
  explicit CpGroup(Communicator& comm) : comm_(comm) {}
  Communicator& comm() const { return comm_; }
  // Collective the first time a name is used: comm().split(color, key), kept under `name`.
  // The bytes it sends are reported on comm() as "<name>.<op>" by absorb().
  Communicator& subgroup(const std::string& name, int color, int key);
  // Not collective. Moves every subgroup's counters onto comm() under "<name>.<op>".
  void absorb();

 private:
  Communicator& comm_;
  std::vector<std::pair<std::string, std::unique_ptr<Communicator>>> subgroups_;
};

// The planner's estimate for one configuration, one layer.
struct StrategyCost {
  double comm_s = 0;    // all transfers, forward + backward
  double hidden_s = 0;  // of comm_s, hidden behind compute
  // Forward (+ backward) compute at the block shapes it runs (kernel_model.hpp), the time its
  // transfers hide behind; < 0: the planner's flat estimate.
  double compute_s = -1;
};

// A strategy's one memory model: one layer's attention on the busiest rank, in bytes, beyond the
// caller's q, k, v and out. The planner's working set (planned_memory_bytes: plan, the attention
// command's admission) reads `forward`; training's (train/memory.cpp) reads `kept` per layer in
// flight and `backward` once, so the two cannot disagree.
struct StrategyMemory {
  double forward = 0;   // the forward's peak: what it keeps and its transfer buffers at their largest
  double kept = 0;      // what one forward keeps for its backward (its StrategyContext), exactly
  double backward = 0;  // the backward's own buffers on top of `kept` (head-sharded dout and
                        // gradients, send buffers, the ring's K/V in flight), fitted to measured peaks
};

// A setting a strategy adds to CpConfig, declared by the strategy: the CLI's attention and
// train commands make --<flag> of every registered strategy's options and refuse one that the
// chosen strategy does not declare, and validate_cp_config refuses an option set on a strategy
// that does not declare it. Values are positive integers.
struct StrategyOption {
  std::string flag;       // "cp-sizes": --cp-sizes on the command line, options["cp-sizes"] in a CpConfig
  std::string metavar;    // "INNER,OUTER": the integers it takes, by their names
  std::string help;       // one line
  std::string name;       // in CpConfig and errors: "hierarchical_context_parallel_sizes"
  std::string unset;      // what it must be on another strategy: "1", "empty"
  std::int64_t most = 0;  // the largest value it takes; 0: int's
  // Non-empty: the strategy needs the option and this is its rule, "{}" standing for cp.
  std::string required = {};
  // Its value in a config (empty: unset) and its setter. Null: CpConfig::options[flag], where
  // a strategy from outside the library keeps its own; the built-ins' have fields of their own.
  std::vector<std::int64_t> (*get)(const CpConfig&) = nullptr;
  void (*set)(CpConfig&, const std::vector<std::int64_t>&) = nullptr;
  std::int64_t least = 1;  // the smallest value it takes
  // False: the option must stay unset under cross-attention (is_cross), which
  // validate_cp_config refuses naming it.
  bool cross = true;
};

// The inputs beyond plain self-attention that a strategy runs. validate_cp_config refuses a
// config that needs one the strategy does not accept, before any data moves.
struct StrategyInputs {
  // Packed documents (config.cu_seqlens): forward and backward pass attention_params(config) to
  // the kernels, chunks' global positions as offsets. Refused rather than let tokens attend
  // across a boundary.
  bool documents = false;
  // The same for config.window_left / window_right (a sliding window over global positions).
  bool window = false;
  // Cross-attention (is_cross): q of s tokens against k/v of s_k tokens, each sharded by
  // rank_chunks over its own length. A strategy that does not accept it only ever sees
  // s_k == s in its forward, traffic and work.
  bool cross = false;
};

// What a strategy is, declared once where it is made (the built-ins' make_*_strategy(), or the
// code that calls register_strategy()): the base class answers name(), summary() and the
// capability questions from it.
struct StrategyTraits {
  std::string name;  // Megatron's cp_comm_type
  // True when the strategy needs hierarchical_context_parallel_sizes ({inner, outer}).
  bool hierarchical = false;
  // True when token_layout's default zigzag becomes per_document_layout's with packed
  // documents (every document zigzagged on its own, unless config.per_document is false): the
  // ring strategies, whose causal work per rank plain zigzag leaves uneven there.
  bool per_document_zigzag = false;
  std::string summary;  // one line, for help texts
  StrategyInputs accepts;
};

class Strategy {
 public:
  explicit Strategy(StrategyTraits traits) : traits_(std::move(traits)) {}
  virtual ~Strategy() = default;
  std::string_view name() const { return traits_.name; }
  std::string_view summary() const { return traits_.summary; }

  // ---- What it accepts and adds: capabilities, options, validation, placement. ----
  // What its StrategyTraits declare.
  bool hierarchical() const { return traits_.hierarchical; }
  bool supports_documents() const { return traits_.accepts.documents; }
  bool supports_window() const { return traits_.accepts.window; }
  bool supports_cross() const { return traits_.accepts.cross; }

  // The options it adds to CpConfig (none by default): the same list at every call, which
  // validation reads once a thread.
  virtual std::vector<StrategyOption> options() const { return {}; }
  // Not collective. `config`, set for some number of ranks, resized to a group of `cp` ranks:
  // what training runs on groups of changing size (its balancer's), so every option that
  // depends on the ranks is resized by the strategy that declares it. By default `config`
  // unchanged; a2a+p2p keeps as much of its inner size as divides cp.
  virtual CpConfig config_for_size(const CpConfig& config, int cp) const;
  // Lines about the options of `config` for a run's header, each "  ...\n" ("" by default).
  virtual std::string describe(const CpConfig& config, int cp, std::int64_t kv_heads) const;
  // The variants of a validated `config` the planner picks from (plan_tuning) when the user set
  // none of its options: a2a's overlap_chunks. None by default.
  virtual std::vector<CpConfig> tunings(const CpConfig& config, int cp, std::int64_t kv_heads) const;

  // Not collective. Throws Error when `config` cannot run on cp ranks with global q
  // [b, s, h, d] and kv_heads KV heads (head rules, hierarchical sizes). The sequence length
  // is rank_chunks()'s (token_layout.hpp). By default: whole GQA groups only (heads % kv_heads == 0).
  virtual void validate(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads) const;
  // The part of validate that reads neither the batch, the sequence nor the head dim: the
  // size's head rules. validate_cp_config runs it before validate, so a size it refuses is
  // refused at every length with its message (cp_heads_error: a planner asking thousands of
  // lengths at a size learns that once). Nothing by default.
  virtual void validate_heads(const CpConfig& config, int cp, std::int64_t heads, std::int64_t kv_heads) const;
  // By default, what a sequence-sharded strategy needs: zigzag under a causal mask (equal
  // work per rank) unless config.zigzag is false, contiguous otherwise; refined to
  // per_document_layout's when its traits say per_document_zigzag (the ring strategies).
  virtual TokenLayout token_layout(const CpConfig& config) const;

  // The query and KV heads rank `rank` computes attention on. By default all of them
  // (sequence-sharded strategies); Ulysses splits them (ulysses_heads.hpp).
  virtual RankHeads heads_of(const CpConfig& config, int cp, int rank, std::int64_t heads, std::int64_t kv_heads) const;

  // ---- Execution. ----
  // Collective over group.comm() (size > 1). The inputs are validated and agreed across ranks
  // (context_parallel.hpp has the shapes); q_chunks[r] are rank r's query tokens and
  // kv_chunks[r] its K/V tokens (rank_chunks over s and s_k: the same chunks for
  // self-attention; the ranks' q may differ in length). Writes out; returns what the backward
  // needs.
  virtual std::unique_ptr<StrategyContext> forward(CpGroup& group, const CpConfig& config,
                                                   const std::vector<std::vector<SeqChunk>>& q_chunks,
                                                   const std::vector<std::vector<SeqChunk>>& kv_chunks,
                                                   const TensorView& out, const TensorView& q, const TensorView& k,
                                                   const TensorView& v, CpStats& stats) const = 0;
  // Collective. Writes dq, dk, dv for the forward that made `context`.
  virtual void backward(CpGroup& group, const StrategyContext& context, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const TensorView& dout, CpStats& stats) const = 0;
  // Collective. The same for a context that is not needed afterwards (ContextParallelAttention's
  // backward of a CpContext&&): a strategy may compute in the context's own buffers to save a
  // second copy of their size. By default the plain backward.
  virtual void backward_consuming(CpGroup& group, StrategyContext& context, const TensorView& dq, const TensorView& dk,
                                  const TensorView& dv, const TensorView& dout, CpStats& stats) const {
    backward(group, context, dq, dk, dv, dout, stats);
  }

  // ---- Analytics, apart from the execution: not collective, for a validated config. ----
  // The attention work rank `rank` computes in one forward, exactly: visible (query, key)
  // pairs summed over the batch and its query heads (what CpStats::score_pairs counts; the
  // planner's compute time and load balance), for global q [b, s, h, d] against k/v of kv_seq
  // tokens (s for self-attention). By default a sequence-sharded strategy's: its query tokens
  // (rank_chunks over s, at q_offset) against every key, on every head.
  virtual std::int64_t work(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                            std::int64_t kv_heads) const;
  // work() of every rank, [0, cp), in one call: what the planner asks at every cp, so a strategy
  // whose ranks share a computation (a group's tokens) counts it once, not once per member. By
  // default, work() rank by rank.
  virtual std::vector<std::int64_t> work_of_ranks(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                                  std::int64_t kv_heads) const;
  // Exact bytes and messages rank `rank` sends in one layer, by counter name (validated
  // config; k/v of kv_seq tokens, s for self-attention; ranks differ when the tokens or heads do
  // not split evenly).
  virtual CommVolume traffic(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                             std::int64_t kv_heads, DType dtype) const = 0;
  // What traffic() reads of `rank`: a few integers (its tokens, its heads, its ring neighbour's
  // tokens, a halo's counts) such that ranks with equal keys send alike. predicted_comm_volume prices the busiest
  // rank from each distinct key once: under an even split a handful at any cp, where every
  // rank's formula, cp of them per planned row, made a plan at cp 65536 take a second. By
  // default the rank itself (every rank priced); a strategy's traffic() must read `rank` only
  // through its own key, which the tests check against every rank's formula.
  using TrafficKey = std::array<std::int64_t, 12>;
  virtual TrafficKey traffic_key(const CpConfig& config, int cp, int rank, const Shape& q, std::int64_t kv_seq,
                                 std::int64_t kv_heads) const;
  // Every rank's traffic_key, in rank order (what predicted_comm_volume asks): by default rank by
  // rank; a strategy whose keys read tokens per rank reads them for all ranks at once
  // (tokens_of_ranks: per-document zigzag costs O(documents) a rank asked alone).
  virtual std::vector<TrafficKey> traffic_keys(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                               std::int64_t kv_heads) const;
  // traffic() of `rank` whose traffic_key is `key`, as predicted_comm_volume asks it with the key
  // traffic_keys gave: by default traffic(rank); a strategy whose traffic() reads only its key
  // prices the key itself, where asking its key again rank by rank reads per-document tokens
  // (O(documents) a rank) and a halo's counts that traffic_keys read for all ranks at once.
  virtual CommVolume keyed_traffic(const CpConfig& config, int cp, int rank, const TrafficKey& key, const Shape& q,
                                   std::int64_t kv_seq, std::int64_t kv_heads, DType dtype) const;

  // Its memory model (StrategyMemory) for global q [b, s, h, d] against k/v of kv_seq tokens
  // with kv_heads KV heads, stored in `dtype`, on cp > 1 ranks (one rank runs plain flash
  // attention, whatever the strategy). By default a sequence-sharded strategy's: q, k, v of the
  // busiest rank's tokens in `dtype`, out and lse in float32; forward adds three K/V blocks (the
  // one computed on, two in flight) and a partial out, backward 3.5 contexts (fitted to the measured peaks of p2p).
  virtual StrategyMemory memory(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq,
                                std::int64_t kv_heads, DType dtype) const;

  // The configurations the planner compares: by default just this strategy; a2a+p2p gives
  // one per factorisation of cp.
  virtual std::vector<CpConfig> plan_configs(int cp, bool causal) const;
  // The planner's name of a configuration: "a2a", "a2a+p2p [2,4]".
  virtual std::string config_name(const CpConfig& config) const;
  // Communication time and hidden time for a validated configuration whose exact
  // traffic is `volume` (each counter's busiest rank) and whose attention compute takes
  // fwd_s + bwd_s per layer on the busiest rank.
  virtual StrategyCost cost(const PlanInput& in, const CpConfig& config, const CommVolume& volume, double fwd_s,
                            double bwd_s) const = 0;

 private:
  StrategyTraits traits_;
};

// The local kernels' settings for `config`: its mask (causal, documents), scale and q_offset
// (0 when unset); k_offset 0 (chunked strategies set the offsets per call).
AttentionParams attention_params(const CpConfig& config);

// Cross-attention: k/v hold another length than q (kv_seq != q_seq) or config.q_offset is set.
bool is_cross(const CpConfig& config, std::int64_t q_seq, std::int64_t kv_seq);
// The same for a forward's chunks (every rank's; the lengths they cover).
bool is_cross(const CpConfig& config, const std::vector<std::vector<SeqChunk>>& q_chunks,
              const std::vector<std::vector<SeqChunk>>& kv_chunks);

// Every rank's visible (query, key) pairs, one head and one sequence: its query chunks (at
// q_offset) against all kv_seq keys (what Strategy::work counts a rank), at once
// (for_each_rank_chunk).
std::vector<std::int64_t> pairs_of_ranks(const CpConfig& config, int cp, std::int64_t seq, std::int64_t kv_seq);

// The attention working set per rank of one layer for a validated `config` (what plan reports
// and caps, and the attention command admits): the busiest rank's q, k, v and out in in.dtype
// plus the strategy's forward (Strategy::memory).
double planned_memory_bytes(const Strategy& strategy, const PlanInput& in, const CpConfig& config);

// The registry, in registration order (the built-ins first, in the order listed above).
const Strategy& find_strategy(std::string_view name);  // throws Error naming the known ones
std::vector<const Strategy*> strategies();
// "a2a | p2p | all_gather | a2a+p2p" with the given separator.
std::string strategy_names(std::string_view separator);
// Adds a strategy; throws Error if its name is taken. Call before any attention runs.
void register_strategy(std::unique_ptr<Strategy> strategy);

// An option's value in `config` (empty: unset) and its setter (StrategyOption::get and set, or
// config.options[option.flag]). set_option throws Error naming option.name unless the values
// pass option_values_error.
std::vector<std::int64_t> option_value(const StrategyOption& option, const CpConfig& config);
void set_option(const StrategyOption& option, CpConfig& config, const std::vector<std::int64_t>& values);
// "" when `values` are as many as the option's metavar names, each in [least, most]; else what
// they must be: "must be 0|1 (an integer in [0, 1])".
std::string option_values_error(const StrategyOption& option, const std::vector<std::int64_t>& values);

}  // namespace ulysses
