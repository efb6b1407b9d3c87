// ContextParallelAttention: validate collectively, then dispatch on cp_comm_type.
#include "ulysses/context_parallel.hpp"

#include <fmt/format.h>

#include <bit>
#include <numeric>

#include "ulysses/error.hpp"
#include "ulysses_attention.hpp"
#include "validate.hpp"

namespace ulysses {

struct CpSaved {
  bool valid = false;
  Shape q_shape, kv_shape;
  DType dtype = DType::f32;
  UlyssesSaved ulysses;
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

std::string describe_call(const std::vector<std::int64_t>& s) {
  return fmt::format("q {} k/v {} dtype {} cp_comm_type {} causal {} scale bits {:#x} "
                     "cp sizes [{}, {}]",
                     Shape{s[0], s[1], s[2], s[3]}.str(), Shape{s[4], s[5], s[6], s[7]}.str(),
                     to_string(DType(s[8])), to_string(CpCommType(s[9])), s[10] != 0, s[11],
                     s[12], s[13]);
}

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

// Strategy rules, the same on every rank once the shapes agree. Returns the KV replication.
int check_strategy(const CpConfig& cfg, int cp, std::int64_t heads, std::int64_t kv_heads) {
  if (heads % kv_heads != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by num_kv_heads ({}) (GQA groups)",
                            heads, kv_heads));
  if (cfg.cp_comm_type == CpCommType::a2a_p2p) {
    const auto& hs = cfg.hierarchical_context_parallel_sizes;
    const int prod = std::accumulate(hs.begin(), hs.end(), 1, std::multiplies<int>());
    if (hs.size() != 2 || prod != cp)
      throw Error(fmt::format("a2a+p2p needs hierarchical_context_parallel_sizes = [inner, outer] "
                              "with inner * outer == cp ({}), got {} values with product {}",
                              cp, hs.size(), prod));
  }
  if (cfg.cp_comm_type != CpCommType::a2a)
    throw Error(fmt::format("cp_comm_type {} is not implemented yet; use a2a", to_string(cfg.cp_comm_type)));
  if (heads % cp != 0)
    throw Error(fmt::format("num_heads ({}) must be divisible by cp ({}) for cp_comm_type a2a: "
                            "Ulysses gives every rank num_heads/cp whole heads. cp_comm_type p2p "
                            "(ring attention) has no head constraint",
                            heads, cp));
  if (kv_heads % cp == 0) return 1;
  if (cp % kv_heads == 0) return int(cp / kv_heads);
  throw Error(fmt::format("num_kv_heads ({}) does not fit cp ({}) for cp_comm_type a2a: it needs "
                          "num_kv_heads % cp == 0 (split the KV heads) or cp % num_kv_heads == 0 "
                          "(replicate each KV head cp/num_kv_heads times). cp_comm_type p2p "
                          "(ring attention) has no head constraint",
                          kv_heads, cp));
}

}  // namespace

ContextParallelAttention::ContextParallelAttention(Comm& comm, CpConfig config)
    : comm_(comm), config_(std::move(config)), saved_(std::make_unique<CpSaved>()) {}

ContextParallelAttention::~ContextParallelAttention() = default;

void ContextParallelAttention::forward(const TensorView& out, const TensorView& q,
                                       const TensorView& k, const TensorView& v) {
  saved_->valid = false;
  comm_.agree(local_error(out, q, k, v));
  const std::vector<std::int64_t> sig{q.shape.b, q.shape.s, q.shape.h, q.shape.d,
                                      k.shape.b, k.shape.s, k.shape.h, k.shape.d,
                                      std::int64_t(q.dtype), std::int64_t(config_.cp_comm_type),
                                      config_.causal, std::int64_t(std::bit_cast<std::uint32_t>(config_.scale))};
  // (hierarchical sizes are compared too, padded to two entries)
  std::vector<std::int64_t> full = sig;
  for (std::size_t i = 0; i < 2; ++i)
    full.push_back(i < config_.hierarchical_context_parallel_sizes.size()
                       ? config_.hierarchical_context_parallel_sizes[i] : -1);
  agree_identical(comm_, full, "attention inputs and settings", describe_call);
  const int replicas = check_strategy(config_, comm_.size(), q.shape.h, k.shape.h);
  AttentionParams params{config_.causal, config_.scale, 0, 0};
  ulysses_attention_forward(comm_, out, saved_->ulysses, q, k, v, params, replicas);
  saved_->q_shape = q.shape;
  saved_->kv_shape = k.shape;
  saved_->dtype = q.dtype;
  saved_->valid = true;
}

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
  ulysses_attention_backward(comm_, dq, dk, dv, dout, saved_->ulysses);
}

}  // namespace ulysses
