// ContextParallelAttention: validate collectively, then dispatch on cp_comm_type.
#include "ulysses/context_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <optional>
#include <numeric>

#include "ulysses/error.hpp"
#include "all_gather_attention.hpp"
#include "ring_attention.hpp"
#include "ulysses/sharding.hpp"
#include "ulysses_attention.hpp"
#include "ulysses/communicator.hpp"

namespace ulysses {

struct CpSaved {
  bool valid = false;
  Shape q_shape, kv_shape;
  DType dtype = DType::f32;
  int kv_replicas = 1;
  CpStats forward_stats, backward_stats;
  UlyssesSaved ulysses;          // a2a
  Tensor q32, out32;             // p2p, all_gather, cp = 1: float32 local q and output
  Tensor q_in, k_in, v_in;       // cp = 1: copies of the inputs, in their dtype
  std::vector<float> lse;        // cp = 1
  AttentionParams params;        // cp = 1
  RingSaved ring;                // p2p, a2a+p2p
  AllGatherSaved all_gather;     // all_gather
  FusedHeads qkv, out_heads;     // a2a+p2p: head-sharded inside the inner group
  std::unique_ptr<Communicator> inner, outer;  // a2a+p2p sub-communicators (made at the first forward)
};

const char* to_string(CpCommType type) {
  switch (type) {
    case CpCommType::p2p: return "p2p";
    case CpCommType::a2a: return "a2a";
    case CpCommType::all_gather: return "all_gather";
    case CpCommType::a2a_p2p: return "a2a+p2p";
  }
  return "?";
}

CpCommType parse_cp_comm_type(std::string_view name) {
  for (CpCommType t : {CpCommType::p2p, CpCommType::a2a, CpCommType::all_gather, CpCommType::a2a_p2p})
    if (name == to_string(t)) return t;
  throw Error(fmt::format("unknown cp_comm_type '{}': expected p2p, a2a, all_gather or a2a+p2p", name));
}

namespace {

// Local checks of one rank's tensors: "" or the first problem found.
std::string local_error(const TensorView& out, const TensorView& q, const TensorView& k,
                        const TensorView& v) {
  const Shape& s = q.shape;
  if (s.b <= 0 || s.s <= 0 || s.h <= 0 || s.d <= 0)
    return fmt::format("q must have positive sizes [b, s/cp, h, d], got {}", s.str());
  if (k.shape.h <= 0) return fmt::format("k must have at least one head, got {}", k.shape.str());
  Shape kv{s.b, s.s, k.shape.h, s.d};
  for (auto [name, view, want] : {std::tuple{"k", &k, kv}, {"v", &v, kv}, {"out", &out, s}}) {
    std::string e = shape_error(name, *view, want);
    if (!e.empty()) return e + fmt::format(" (q is {})", s.str());
  }
  for (const TensorView* t : {&k, &v, &out})
    if (t->dtype != q.dtype)
      return fmt::format("q, k, v and out must share one dtype; q is {}, got {}", to_string(q.dtype),
                         to_string(t->dtype));
  for (const TensorView* t : {&q, &k, &v, &out})
    if (t->data == nullptr) return "a tensor has no data (null pointer)";
  return "";
}

// KV replication for an all-to-all over `group` ranks (Ulysses rules); throws otherwise.
int kv_replicas_for(int group, std::int64_t heads, std::int64_t kv_heads, const char* group_name,
                    const char* strategy) {
  if (heads % group != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by {} ({}) for cp_comm_type {}: Ulysses gives "
                            "every rank of the all-to-all num_heads/{} whole heads. cp_comm_type p2p "
                            "(ring attention) has no head constraint",
                            heads, group_name, group, strategy, group));
  if (kv_heads % group == 0) return 1;
  if (group % kv_heads == 0) return int(group / kv_heads);
  throw Error(fmt::format("num_kv_heads ({}) does not fit {} ({}) for cp_comm_type {}: it needs "
                          "num_kv_heads % {} == 0 (split the KV heads) or {} % num_kv_heads == 0 "
                          "(replicate each KV head {}/num_kv_heads times). cp_comm_type p2p "
                          "(ring attention) has no head constraint",
                          kv_heads, group_name, group, strategy, group, group, group));
}

// Strategy rules, the same on every rank once the shapes agree. Returns the KV replication
// of the all-to-all (1 when the strategy has none).
int check_strategy(const CpConfig& cfg, int cp, std::int64_t heads, std::int64_t kv_heads) {
  if (heads % kv_heads != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by num_kv_heads ({}) (GQA groups)",
                            heads, kv_heads));
  switch (cfg.cp_comm_type) {
    case CpCommType::a2a: return kv_replicas_for(cp, heads, kv_heads, "cp", "a2a");
    case CpCommType::a2a_p2p: {
      const auto& hs = cfg.hierarchical_context_parallel_sizes;
      if (hs.size() != 2 || hs[0] < 1 || hs[1] < 1 || hs[0] * hs[1] != cp)
        throw Error(fmt::format("a2a+p2p needs hierarchical_context_parallel_sizes = [inner, outer] with "
                                "inner * outer == cp ({}), got [{}]",
                                cp, fmt::join(hs, ", ")));
      return kv_replicas_for(hs[0], heads, kv_heads, "the inner (a2a) size", "a2a+p2p");
    }
    default: return 1;
  }
}

std::vector<std::vector<SeqChunk>> all_chunks(const CpConfig& cfg, int cp, std::int64_t seq) {
  std::vector<std::vector<SeqChunk>> c;
  for (int r = 0; r < cp; ++r) c.push_back(rank_chunks(cfg, cp, r, seq));
  return c;
}

// For the ring of a2a+p2p: member o holds, after the inner all-to-all, the chunks of inner
// ranks o·inner + 0 .. o·inner + inner−1, in that order.
std::vector<std::vector<SeqChunk>> outer_chunks(const std::vector<std::vector<SeqChunk>>& per_rank, int inner) {
  std::vector<std::vector<SeqChunk>> c(per_rank.size() / std::size_t(inner));
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    c[r / std::size_t(inner)].insert(c[r / std::size_t(inner)].end(), per_rank[r].begin(), per_rank[r].end());
  return c;
}

// One rank: every strategy is plain flash attention on copies of the inputs (kept for the
// backward) in their own dtype: bf16 runs on the level's bf16 engine where there is one.
void local_forward(const Communicator& comm, CpSaved& sv, const TensorView& out, const TensorView& q, const TensorView& k,
                   const TensorView& v, const AttentionParams& params) {
  const double t0 = comm.now();
  sv.q_in = copy_of(q, q.dtype);
  sv.k_in = copy_of(k, k.dtype);
  sv.v_in = copy_of(v, v.dtype);
  sv.out32 = Tensor::uninitialized(q.shape);
  sv.lse.resize(std::size_t(q.shape.b * q.shape.h * q.shape.s));
  flash_attention_forward(sv.out32.view(), sv.lse.data(), sv.q_in.view(), sv.k_in.view(), sv.v_in.view(), params);
  copy(sv.out32.view(), out);
  sv.params = params;
  sv.forward_stats.compute_s += comm.now() - t0;
  sv.forward_stats.score_pairs += visible_pairs({0, q.shape.s}, {0, q.shape.s}, params.causal) * q.shape.b * q.shape.h;
}

void local_backward(const Communicator& comm, CpSaved& sv, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const TensorView& dout) {
  const double t0 = comm.now();
  flash_attention_backward(dq, dk, dv, dout, sv.q_in.view(), sv.k_in.view(), sv.v_in.view(), sv.out32.view(),
                           sv.lse.data(), sv.params);
  sv.backward_stats.compute_s += comm.now() - t0;
  sv.backward_stats.score_pairs += sv.forward_stats.score_pairs;
}

// a2a+p2p: Ulysses inside contiguous groups of `inner` ranks, the ring across groups.
void hierarchical_forward(Communicator& comm, CpSaved& sv, const TensorView& out, const TensorView& q, const TensorView& k,
                          const TensorView& v, std::vector<std::vector<SeqChunk>> ring_chunks,
                          const AttentionParams& params, int inner) {
  if (!sv.inner) {  // contiguous inner groups, strided outer groups (Megatron / TE)
    sv.inner = comm.split(comm.rank() / inner, comm.rank());
    sv.outer = comm.split(comm.rank() % inner, comm.rank());
  }
  const std::array<SeqShard, 3> in{{{q, 1}, {k, sv.kv_replicas}, {v, sv.kv_replicas}}};
  double t0 = comm.now();
  sv.qkv = seq_to_head(*sv.inner, in);
  if (sv.qkv.dtype() != DType::f32) sv.qkv = sv.qkv.converted(DType::f32);
  sv.forward_stats.comm_exposed_s += comm.now() - t0;
  const TensorView hq = sv.qkv.part(0);
  sv.out_heads = FusedHeads(DType::f32, hq.shape.b, hq.shape.s, hq.shape.d, {hq.shape.h});
  ring_attention_forward(*sv.outer, sv.out_heads.part(0), sv.ring, hq, sv.qkv.part(1), sv.qkv.part(2),
                         std::move(ring_chunks), params, q.dtype, sv.forward_stats);
  t0 = comm.now();
  const std::array<SeqShard, 1> o{{{out, 1}}};
  if (q.dtype == DType::f32) head_to_seq(*sv.inner, sv.out_heads, o);
  else head_to_seq(*sv.inner, sv.out_heads.converted(q.dtype), o);
  sv.forward_stats.comm_exposed_s += comm.now() - t0;
  comm.absorb_counters(*sv.inner, "inner");
  comm.absorb_counters(*sv.outer, "outer");
}

void hierarchical_backward(Communicator& comm, CpSaved& sv, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                           const TensorView& dout) {
  const std::array<SeqShard, 1> g{{{dout, 1}}};
  double t0 = comm.now();
  FusedHeads hdout = seq_to_head(*sv.inner, g);
  if (hdout.dtype() != DType::f32) hdout = hdout.converted(DType::f32);
  sv.backward_stats.comm_exposed_s += comm.now() - t0;
  const FusedHeads& x = sv.qkv;
  FusedHeads grads(DType::f32, x.batch(), x.seq(), x.head_dim(), {x.local_heads(0), x.local_heads(1), x.local_heads(2)});
  ring_attention_backward(*sv.outer, grads.part(0), grads.part(1), grads.part(2), hdout.part(0), sv.ring,
                          sv.backward_stats);
  t0 = comm.now();
  const int r = sv.kv_replicas;
  const std::array<SeqShard, 3> out{{{dq, 1}, {dk, r}, {dv, r}}};
  if (sv.dtype == DType::f32) head_to_seq(*sv.inner, grads, out);
  else head_to_seq(*sv.inner, grads.converted(sv.dtype), out);
  sv.backward_stats.comm_exposed_s += comm.now() - t0;
  comm.absorb_counters(*sv.inner, "inner");
  comm.absorb_counters(*sv.outer, "outer");
}

}  // namespace

void validate_cp_config(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads) {
  if (q.b <= 0 || q.s <= 0 || q.h <= 0 || q.d <= 0 || kv_heads <= 0)
    throw Error(fmt::format("attention sizes must be positive: q {} with {} KV heads", q.str(), kv_heads));
  check_strategy(config, cp, q.h, kv_heads);
  rank_chunks(config, cp, 0, q.s);
}

ContextParallelAttention::ContextParallelAttention(Communicator& comm, CpConfig config)
    : comm_(comm), config_(std::move(config)), saved_(std::make_unique<CpSaved>()) {}

ContextParallelAttention::~ContextParallelAttention() = default;

void ContextParallelAttention::forward(const TensorView& out, const TensorView& q,
                                       const TensorView& k, const TensorView& v) {
  saved_->valid = false;
  comm_.agree(local_error(out, q, k, v));
  comm_.agree_identical("attention inputs and settings",
                        fmt::format("q {} k/v {} dtype {} cp_comm_type {} causal {} scale {} cp sizes [{}]",
                                    q.shape.str(), k.shape.str(), to_string(q.dtype), to_string(config_.cp_comm_type),
                                    config_.causal, config_.scale, fmt::join(config_.hierarchical_context_parallel_sizes, ", ")));
  const int cp = comm_.size();
  const int replicas = check_strategy(config_, cp, q.shape.h, k.shape.h);
  const std::vector<std::vector<SeqChunk>> chunks = all_chunks(config_, cp, q.shape.s * cp);
  const AttentionParams params{config_.causal, config_.scale, 0, 0};
  CpSaved& sv = *saved_;
  sv.forward_stats = CpStats{};
  sv.kv_replicas = replicas;
  if (cp == 1) {
    local_forward(comm_, sv, out, q, k, v, params);
  } else {
  switch (config_.cp_comm_type) {
    case CpCommType::a2a:
      ulysses_attention_forward(comm_, out, sv.ulysses, q, k, v, params, replicas, sv.forward_stats);
      break;
    case CpCommType::p2p:
    case CpCommType::all_gather:
      sv.q32 = copy_of(q, DType::f32);
      sv.out32 = Tensor::uninitialized(q.shape);
      if (config_.cp_comm_type == CpCommType::p2p)
        ring_attention_forward(comm_, sv.out32.view(), sv.ring, sv.q32.view(), k, v, chunks, params, q.dtype,
                               sv.forward_stats);
      else
        all_gather_attention_forward(comm_, sv.out32.view(), sv.all_gather, sv.q32.view(), k, v, chunks, params,
                                     q.dtype, sv.forward_stats);
      copy(sv.out32.view(), out);
      break;
    case CpCommType::a2a_p2p:
      hierarchical_forward(comm_, sv, out, q, k, v, outer_chunks(chunks, config_.hierarchical_context_parallel_sizes[0]),
                           params, config_.hierarchical_context_parallel_sizes[0]);
      break;
  }
  }
  sv.q_shape = q.shape;
  sv.kv_shape = k.shape;
  sv.dtype = q.dtype;
  sv.valid = true;
}

const CpStats& ContextParallelAttention::forward_stats() const { return saved_->forward_stats; }
const CpStats& ContextParallelAttention::backward_stats() const { return saved_->backward_stats; }

void ContextParallelAttention::backward(const TensorView& dq, const TensorView& dk,
                                        const TensorView& dv, const TensorView& dout) {
  std::string err;
  if (!saved_->valid) err = "backward called without a successful forward";
  else {
    for (auto [name, view, want] : {std::tuple{"dout", &dout, saved_->q_shape}, {"dq", &dq, saved_->q_shape},
                                    {"dk", &dk, saved_->kv_shape}, {"dv", &dv, saved_->kv_shape}}) {
      if (err.empty()) err = shape_error(name, *view, want);
      if (err.empty() && view->dtype != saved_->dtype)
        err = fmt::format("{} must be {} like the forward's inputs", name, to_string(saved_->dtype));
    }
  }
  comm_.agree(err);
  CpSaved& sv = *saved_;
  sv.backward_stats = CpStats{};
  if (comm_.size() == 1) {
    local_backward(comm_, sv, dq, dk, dv, dout);
    return;
  }
  switch (config_.cp_comm_type) {
    case CpCommType::a2a:
      ulysses_attention_backward(comm_, dq, dk, dv, dout, sv.ulysses, sv.backward_stats);
      break;
    case CpCommType::p2p:
    case CpCommType::all_gather: {
      const Tensor dout32 = copy_of(dout, DType::f32);
      Tensor dq32 = Tensor::uninitialized(dq.shape), dk32 = Tensor::uninitialized(dk.shape),
             dv32 = Tensor::uninitialized(dv.shape);
      if (config_.cp_comm_type == CpCommType::p2p)
        ring_attention_backward(comm_, dq32.view(), dk32.view(), dv32.view(), dout32.view(), sv.ring,
                                sv.backward_stats);
      else
        all_gather_attention_backward(comm_, dq32.view(), dk32.view(), dv32.view(), dout32.view(), sv.all_gather,
                                      sv.backward_stats);
      copy(dq32.view(), dq);
      copy(dk32.view(), dk);
      copy(dv32.view(), dv);
      break;
    }
    case CpCommType::a2a_p2p:
      hierarchical_backward(comm_, sv, dq, dk, dv, dout);
      break;
  }
}

}  // namespace ulysses
