// ContextParallelAttention: validate and agree across ranks, then run the registered strategy
// (or, on one rank, plain flash attention).
#include "ulysses/cp/context_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <numeric>
#include <unordered_map>

#include "ring_attention.hpp"
#include "ulysses/core/device_ops.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {

namespace {

// What the forward's one agreement names when the ranks' settings differ.
constexpr const char* kForwardAgreement = "attention inputs and settings";

// One rank: every strategy is plain flash attention on copies of the inputs (kept for the
// backward) in their own dtype: bf16 runs on the level's bf16 engine where there is one.
struct LocalContext final : StrategyContext {
  Tensor q, k, v, out32, lse;
  AttentionParams params;
};

std::unique_ptr<StrategyContext> local_forward(const Communicator& comm, const CpConfig& config, const TensorView& out,
                                               const TensorView& q, const TensorView& k, const TensorView& v,
                                               CpStats& stats) {
  const double t0 = comm.now();
  auto ctx = std::make_unique<LocalContext>();
  ctx->q = copy_of(q, q.dtype);
  ctx->k = copy_of(k, k.dtype);
  ctx->v = copy_of(v, v.dtype);
  ctx->out32 = Tensor::uninitialized(q.shape, DType::f32, Layout::bshd, q.device);
  ctx->lse = lse_tensor(q.shape, q.device);
  ctx->params = attention_params(config);
  flash_attention_forward(ctx->out32.view(), ctx->lse.view(), ctx->q.view(), ctx->k.view(), ctx->v.view(), ctx->params);
  copy(ctx->out32.view(), out);
  stats.compute_s += comm.now() - t0;
  comm.trace("flash forward", t0, comm.now());
  stats.score_pairs +=
      visible_pairs(ctx->params, {ctx->params.q_offset, q.shape.s}, {0, k.shape.s}) * q.shape.b * q.shape.h;
  return ctx;
}

void local_backward(const Communicator& comm, const LocalContext& ctx, const TensorView& dq, const TensorView& dk,
                    const TensorView& dv, const TensorView& dout, CpStats& stats) {
  const double t0 = comm.now();
  flash_attention_backward(dq, dk, dv, dout, ctx.q.view(), ctx.k.view(), ctx.v.view(), ctx.out32.view(), ctx.lse.view(),
                           ctx.params);
  stats.compute_s += comm.now() - t0;
  comm.trace("flash backward", t0, comm.now());
  const std::int64_t s = ctx.q.shape().s, sk = ctx.k.shape().s;
  stats.score_pairs += visible_pairs(ctx.params, {ctx.params.q_offset, s}, {0, sk}) * ctx.q.shape().b * ctx.q.shape().h;
}

// "" when every tensor is on the first one's device and that device has an operations table.
std::string device_error(std::initializer_list<const TensorView*> views) {
  try {
    ops_for(views);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Local checks of one rank's tensors: "" or the first problem found.
std::string local_error(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v) {
  const Shape& s = q.shape;
  if (s.b <= 0 || s.s <= 0 || s.h <= 0 || s.d <= 0)
    return fmt::format("q must have positive sizes [b, s_r, h, d], got {}", s.str());
  if (k.shape.h <= 0 || k.shape.s <= 0)
    return fmt::format("k must have at least one head and one token, got {}", k.shape.str());
  Shape kv{s.b, k.shape.s, k.shape.h, s.d};  // k/v may hold another length (cross-attention)
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
  return device_error({&q, &k, &v, &out});
}

// "" or the first gradient/dout that does not match the forward's inputs.
std::string backward_error(const CpContext& ctx, const Shape& q, const Shape& kv, DType dtype, const TensorView& dq,
                           const TensorView& dk, const TensorView& dv, const TensorView& dout) {
  if (!ctx.valid()) return "backward called without a successful forward";
  for (auto [name, view, want] : {std::tuple{"dout", &dout, q}, {"dq", &dq, q}, {"dk", &dk, kv}, {"dv", &dv, kv}}) {
    std::string e = shape_error(name, *view, want);
    if (!e.empty()) return e;
    if (view->dtype != dtype) return fmt::format("{} must be {} like the forward's inputs", name, to_string(dtype));
  }
  return device_error({&dout, &dq, &dk, &dv});
}

}  // namespace

namespace {

// A strategy's options(), made once a thread: validation reads every strategy's options at each
// call (a planner row validates three times, a plan prices 10^5 rows) and options() builds their
// strings afresh each time. A registered strategy lives, and declares the same options, for good.
const std::vector<StrategyOption>& declared_options(const Strategy& strategy) {
  thread_local std::unordered_map<const Strategy*, std::vector<StrategyOption>> kept;
  auto [it, fresh] = kept.try_emplace(&strategy);
  if (fresh) it->second = strategy.options();
  return it->second;
}

bool declares(const Strategy& strategy, const std::string& flag) {
  for (const StrategyOption& o : declared_options(strategy))
    if (o.flag == flag) return true;
  return false;
}

// Throws Error when `config` sets an option that its strategy does not declare.
void check_options(const CpConfig& config, const Strategy& chosen) {
  for (const Strategy* s : strategies())
    for (const StrategyOption& o : declared_options(*s))
      if (const std::vector<std::int64_t> v = option_value(o, config); !v.empty() && !declares(chosen, o.flag))
        throw Error(fmt::format("{} must be {} for cp_comm_type {} (an option of {}), got {}", o.name, o.unset,
                                chosen.name(), s->name(), fmt::join(v, ", ")));
  for (const auto& [flag, v] : config.options)
    if (!declares(chosen, flag))
      throw Error(fmt::format("cp_comm_type {} has no option {}", chosen.name(), flag.substr(0, 40)));
}

// Cross-attention's rules (is_cross), after the strategy's own.
void validate_cross(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_seq) {
  if (config.causal && !config.q_offset)
    throw Error(
        fmt::format("cross-attention with a causal mask needs q_offset (the key position of query 0): "
                    "k/v hold s_k = {} tokens, q holds s = {}",
                    kv_seq, q.s));
  if (!find_strategy(config.cp_comm_type).supports_cross()) {
    std::vector<std::string_view> cross;
    for (const Strategy* s : strategies())
      if (s->supports_cross()) cross.push_back(s->name());
    throw Error(fmt::format("cp_comm_type {} does not support cross-attention (s_k = {}, s = {}{}); use {}",
                            config.cp_comm_type, kv_seq, q.s, config.q_offset ? ", q_offset set" : "",
                            fmt::join(cross, " or ")));
  }
  if (std::int64_t end; config.q_offset && __builtin_add_overflow(*config.q_offset, q.s, &end))
    throw Error(fmt::format("q_offset {} + s = {} passes the largest position (int64)", *config.q_offset, q.s));
  for (const StrategyOption& o : find_strategy(config.cp_comm_type).options())
    if (const std::vector<std::int64_t> v = option_value(o, config); !o.cross && !v.empty())
      throw Error(fmt::format("{} must be {} with cross-attention, got {}", o.name, o.unset, fmt::join(v, ", ")));
  if (!config.cu_seqlens.empty()) throw Error("cross-attention does not take packed documents (cu_seqlens)");
  if (config.window_left >= 0 || config.window_right >= 0)
    throw Error("cross-attention does not take a sliding window (window_size)");
  check_rank_chunks(config, cp, kv_seq);
}

}  // namespace

void validate_cp_config(const CpConfig& config, int cp, const Shape& q, std::int64_t kv_heads, std::int64_t kv_seq) {
  if (q.b <= 0 || q.s <= 0 || q.h <= 0 || q.d <= 0 || kv_heads <= 0)
    throw Error(fmt::format("attention sizes must be positive: q {} with {} KV heads", q.str(), kv_heads));
  const Strategy& strategy = find_strategy(config.cp_comm_type);  // once: a name compared a strategy
  strategy.validate_heads(config, cp, q.h, kv_heads);
  strategy.validate(config, cp, q, kv_heads);
  check_options(config, strategy);
  check_rank_chunks(config, cp, q.s);
  // The window and scale alone: attention_params would copy every document boundary.
  AttentionParams params;
  params.scale = config.scale, params.window_left = config.window_left, params.window_right = config.window_right;
  check_window(params);
  check_scale(params);
  if ((config.window_left >= 0 || config.window_right >= 0) && !strategy.supports_window())
    throw Error(fmt::format("cp_comm_type {} does not support a sliding window (window_size)", config.cp_comm_type));
  if (kv_seq == 0) kv_seq = q.s;
  if (is_cross(config, q.s, kv_seq)) validate_cross(config, cp, q, kv_seq);
  if (config.cu_seqlens.empty()) return;
  if (!strategy.supports_documents())
    throw Error(fmt::format("cp_comm_type {} does not support packed documents (cu_seqlens)", config.cp_comm_type));
  if (q.b != 1)
    throw Error(
        fmt::format("cu_seqlens (packed documents) needs batch 1: the documents are packed along the "
                    "sequence (thd layout), got batch {}",
                    q.b));
  if (const std::string e = documents_error(config, q.s); !e.empty()) throw Error(e);
}

std::string cp_heads_error(const CpConfig& config, int cp, std::int64_t batch, std::int64_t heads,
                           std::int64_t head_dim, std::int64_t kv_heads) {
  if (batch <= 0 || heads <= 0 || head_dim <= 0 || kv_heads <= 0) return "";  // that error names the length
  try {
    find_strategy(config.cp_comm_type).validate_heads(config, cp, heads, kv_heads);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

AttentionParams attention_params(const CpConfig& config) {
  return {config.causal,     config.scale,       config.q_offset.value_or(0), 0,
          config.cu_seqlens, config.window_left, config.window_right};
}

CpContext::CpContext() = default;
CpContext::~CpContext() = default;
CpContext::CpContext(CpContext&&) noexcept = default;
CpContext& CpContext::operator=(CpContext&&) noexcept = default;

ContextParallelAttention::ContextParallelAttention(Communicator& comm, CpConfig config)
    : config_(std::move(config)), strategy_(find_strategy(config_.cp_comm_type)),
      group_(std::make_unique<CpGroup>(comm)) {}

ContextParallelAttention::~ContextParallelAttention() = default;

namespace {

// " options {flag [values]; ...}" for every option set (declared by any strategy, or by none:
// refused later, the same way everywhere), "" without.
std::string options_text(const CpConfig& config) {
  std::map<std::string, std::vector<std::int64_t>> set = config.options;
  for (const Strategy* s : strategies())
    for (const StrategyOption& o : s->options())
      if (std::vector<std::int64_t> v = option_value(o, config); !v.empty()) set[o.flag] = std::move(v);
  std::string text;
  for (const auto& [flag, v] : set) text += fmt::format("{} [{}]; ", flag, fmt::join(v, ", "));
  return text.empty() ? "" : " options {" + text + "}";
}

// What every rank must agree on: all but the token count, which rank_chunks sets per rank; the
// strategies' options through their declarations (options_text).
std::string describe(const CpConfig& config, const TensorView& q, const TensorView& k) {
  return fmt::format(
             "q [{}, *, {}, {}] k/v heads {} dtype {} cp_comm_type {} causal {} scale {}{} cu_seqlens [{}]"
             " window ({}, {}) q_offset {}",
             q.shape.b, q.shape.h, q.shape.d, k.shape.h, to_string(q.dtype), config.cp_comm_type, config.causal,
             config.scale ? fmt::format("{}", *config.scale) : "unset", config.zigzag ? "" : " no zigzag",
             fmt::join(config.cu_seqlens, ", "), config.window_left, config.window_right,
             config.q_offset ? std::to_string(*config.q_offset) : "unset") +
         options_text(config);
}

// "" when rank r holds tokens[r] tokens, the count rank_chunks gives it for s = Σ tokens.
std::string token_count_error(const CpConfig& config, const std::vector<std::int64_t>& tokens, std::int64_t seq,
                              const char* what) {
  const int cp = int(tokens.size());
  for (int r = 0; r < cp; ++r) {
    const std::int64_t want = tokens_held(config, cp, r, 1, seq);
    if (tokens[std::size_t(r)] != want)
      return fmt::format("rank {} holds {} {}tokens but cp_comm_type {} with s = {} gives it {} (rank_chunks)", r,
                         tokens[std::size_t(r)], what, config.cp_comm_type, seq, want);
  }
  return "";
}

}  // namespace

void ContextParallelAttention::refuse_forward(const std::string& error) {
  if (error.empty()) throw Error("refuse_forward needs the error that stops this rank");
  const std::array<std::int64_t, 2> none{0, 0};  // run_forward's record: every rank's q and k/v tokens
  group_->comm().agree_all(error, kForwardAgreement, "", none);
  throw Error(error);  // not reached: agree_all throws the agreed error on every rank
}

CpContext ContextParallelAttention::forward(const TensorView& out, const TensorView& q, const TensorView& k,
                                            const TensorView& v) {
  return run_forward(config_, out, q, k, v);
}

CpContext ContextParallelAttention::forward(const TensorView& out, const TensorView& q, const TensorView& k,
                                            const TensorView& v, std::vector<std::int64_t> cu_seqlens) {
  CpConfig config = config_;
  config.cu_seqlens = std::move(cu_seqlens);
  return run_forward(config, out, q, k, v);
}

CpContext ContextParallelAttention::run_forward(const CpConfig& config, const TensorView& out, const TensorView& q,
                                                const TensorView& k, const TensorView& v) {
  Communicator& comm = group_->comm();
  const double t0 = comm.now();
  // One small all-gather agrees on the errors and settings and tells every rank every rank's
  // token counts, so the checks below throw the same Error everywhere; the strategy trusts
  // what it is handed and adds none of its own before its first transfer.
  const std::array<std::int64_t, 2> mine{q.shape.s, k.shape.s};  // refuse_forward's record has this size
  const std::vector<std::int64_t> counts =
      comm.agree_all(local_error(out, q, k, v), kForwardAgreement, describe(config, q, k), mine);
  std::vector<std::int64_t> tokens, kv_tokens;
  for (std::size_t r = 0; r < counts.size(); r += 2) {
    tokens.push_back(counts[r]);
    kv_tokens.push_back(counts[r + 1]);
  }
  const std::int64_t seq = std::accumulate(tokens.begin(), tokens.end(), std::int64_t(0));
  const std::int64_t kv_seq = std::accumulate(kv_tokens.begin(), kv_tokens.end(), std::int64_t(0));
  const int cp = comm.size();
  validate_cp_config(config, cp, {q.shape.b, seq, q.shape.h, q.shape.d}, k.shape.h, kv_seq);
  if (const std::string err = token_count_error(config, tokens, seq, ""); !err.empty()) throw Error(err);
  if (const std::string err = token_count_error(config, kv_tokens, kv_seq, "k/v "); !err.empty()) throw Error(err);
  CpContext ctx;
  if (cp == 1)
    ctx.impl_ = local_forward(comm, config, out, q, k, v, ctx.stats_);
  else
    ctx.impl_ = strategy_.forward(*group_, config, all_rank_chunks(config, cp, seq),
                                  all_rank_chunks(config, cp, kv_seq), out, q, k, v, ctx.stats_);
  ctx.q_shape_ = q.shape;
  ctx.kv_shape_ = k.shape;
  ctx.dtype_ = q.dtype;
  comm.trace("forward " + config_.cp_comm_type, t0, comm.now(), "phase");
  return ctx;
}

CpStats ContextParallelAttention::backward(const CpContext& ctx, const TensorView& dq, const TensorView& dk,
                                           const TensorView& dv, const TensorView& dout) {
  return run_backward(ctx, nullptr, dq, dk, dv, dout);
}

CpStats ContextParallelAttention::backward(CpContext&& ctx, const TensorView& dq, const TensorView& dk,
                                           const TensorView& dv, const TensorView& dout) {
  const CpStats stats = run_backward(ctx, ctx.impl_.get(), dq, dk, dv, dout);
  ctx = CpContext();
  return stats;
}

// consumed: the context's own state when it is not needed afterwards (Strategy::backward_consuming),
// else null.
CpStats ContextParallelAttention::run_backward(const CpContext& ctx, StrategyContext* consumed, const TensorView& dq,
                                               const TensorView& dk, const TensorView& dv, const TensorView& dout) {
  Communicator& comm = group_->comm();
  const double t0 = comm.now();
  comm.agree(backward_error(ctx, ctx.q_shape_, ctx.kv_shape_, ctx.dtype_, dq, dk, dv, dout));
  CpStats stats;
  if (comm.size() == 1)
    local_backward(comm, static_cast<const LocalContext&>(*ctx.impl_), dq, dk, dv, dout, stats);
  else if (consumed)
    strategy_.backward_consuming(*group_, *consumed, dq, dk, dv, dout, stats);
  else
    strategy_.backward(*group_, *ctx.impl_, dq, dk, dv, dout, stats);
  comm.trace("backward " + config_.cp_comm_type, t0, comm.now(), "phase");
  return stats;
}

}  // namespace ulysses
