#include "train/generate.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ulysses/core/cpu_clock.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses::train {

std::string generate_error(const GptConfig& model, const GenerateConfig& config, int cp, std::int64_t prompt_tokens,
                           std::int64_t new_tokens, std::int64_t max_positions) {
  if (prompt_tokens <= 0) return "the prompt is empty: generation needs at least one prompt token";
  if (new_tokens <= 0) return fmt::format("--max-new-tokens must be positive, got {}", new_tokens);
  if (max_positions > 0 && prompt_tokens > max_positions)
    return fmt::format("the prompt has {} tokens, longer than the model's {} positions (the length it was trained at)",
                       prompt_tokens, max_positions);
  if (prompt_tokens + new_tokens > config.capacity)
    return fmt::format("the prompt's {} tokens and {} new ones do not fit in the KV cache's capacity of {} tokens",
                       prompt_tokens, new_tokens, config.capacity);
  if (prompt_tokens < cp)
    return fmt::format("the prompt has {} tokens, fewer than the {} ranks: the prefill gives every rank a token",
                       prompt_tokens, cp);
  return kv_layout_error(config.layout, {model.layers, model.heads, model.kv_heads, model.head_dim, config.capacity},
                         cp);
}

KvPeak peak_kv(const GptConfig& m, const std::vector<GenerateConfig>& requests,
               const std::vector<std::vector<std::size_t>>& held, int cp, int rank) {
  KvPeak peak;
  for (const std::vector<std::size_t>& set : held) {
    std::int64_t bytes = 0;
    for (const std::size_t i : set) {
      if (i >= requests.size()) throw Error(fmt::format("request {} of {} held", i, requests.size()));
      const GenerateConfig& c = requests[i];
      bytes += kv_bytes_formula(c.layout, {m.layers, m.heads, m.kv_heads, m.head_dim, c.capacity}, cp, rank);
    }
    if (peak.requests.empty() || bytes > peak.bytes) peak = {set, bytes};
  }
  return peak;
}

MemoryEstimate predict_generate_memory(const GptConfig& m, const std::vector<GenerateConfig>& requests,
                                       const std::vector<std::vector<std::size_t>>& held, int cp, int rank,
                                       std::int64_t longest_prompt, double scratch) {
  constexpr double f = sizeof(float);
  const double P = double(m.num_params()), C = double(m.width), F = double(m.hidden), h = double(m.heads);
  const double QD = h * double(m.head_dim), KD = double(m.kv_heads * m.head_dim);
  const double n = double((longest_prompt + cp - 1) / cp);
  MemoryEstimate e;
  e.weights = 3 * P * f;
  e.attention = double(peak_kv(m, requests, held, cp, rank).bytes);
  // Generator::layer's buffers (x, xn, y, q, att, k, v, then the MLP's two) on this rank's rows
  // and the all-to-all's packed copy of its q, k, v; the transposes' q, k, v and output of every
  // prompt token on this rank's heads (at least one).
  const double heads_share = std::max(1.0, std::ceil(h / cp)) / h;
  // Under interleaved the new K and V rows then go to their owners while those are still held:
  // the all-to-all's send and receive buffers and the received K and V (4 of the rank's rows of
  // KD each; measured 4-8 MiB over the model without them at 8192 tokens, cp 2).
  const bool scatter = std::any_of(requests.begin(), requests.end(),
                                   [](const GenerateConfig& c) { return c.layout == KvLayout::interleaved; });
  const double prefill = n * (3 * C + 3 * QD + 4 * KD + 2 * F + (scatter ? 4 * KD : 0)) * f +
                         double(longest_prompt) * heads_share * (2 * QD + 2 * KD + h) * f;
  // The probe comes after the prefill, whose buffers are returned by then: the tensors' pool
  // releases kept blocks before a new one would take it past its high-water (tensor.cpp), and
  // glibc maps the vectors' large blocks. Measured at 8192 and 16384 tokens, cp 1 and 2: the
  // peak is the larger of the two, not their sum (0.72-0.86 of the sum).
  e.activations = std::max({prefill, scratch, 3 * P * f});  // the file: parameters and moments again
  TrainConfig probe;
  probe.model = m;
  e.baseline = predict_memory(probe, 1).baseline;  // the process's, as measured for train
  return e;
}

Generator::Generator(Communicator& comm, const GptConfig& model, const std::vector<float>& params,
                     const GenerateConfig& config)
    : comm_(comm), model_(model), layout_(model), params_(params), config_(config),
      sampler_(config.seed * 0x9e3779b97f4a7c15ull + 1) {
  if (std::int64_t(params.size()) != layout_.total)
    throw Error(fmt::format("{} parameters given for a model of {}", params.size(), layout_.total));
  // The cache comes with the first prefill; its shape is refused here, before anything runs.
  if (const std::string e = kv_layout_error(config.layout, cache_shape(), comm.size()); !e.empty()) throw Error(e);
}

KvCacheShape Generator::cache_shape() const {
  return {model_.layers, model_.heads, model_.kv_heads, model_.head_dim, config_.capacity};
}

const KvCache& Generator::cache() const {
  if (!cache_) throw Error("this request holds no KV cache: it has not been prefilled, or it was released");
  return *cache_;
}

KvCache& Generator::held() { return const_cast<KvCache&>(cache()); }

namespace {

// One layer of `c` on N rows of x (in place) at positions pos; attend(l, q, k, v, out) is its
// attention. The Generator's layer and the prefill row probe's alike.
template <class Attend>
void layer_rows(const GptConfig& c, const ParamLayout& layout, const float* P, std::int64_t l, std::vector<float>& x,
                const std::vector<std::int64_t>& pos, Attend&& attend) {
  const std::int64_t N = std::int64_t(pos.size()), C = c.width, QD = c.heads * c.head_dim, KD = c.kv_heads * c.head_dim,
                     F = c.hidden;
  const auto& L = layout.layer[static_cast<std::size_t>(l)];
  std::vector<float> xn(static_cast<std::size_t>(N * C)), rstd(static_cast<std::size_t>(N)),
      q(static_cast<std::size_t>(N * QD)), k(static_cast<std::size_t>(N * KD)), v(k.size()), att(q.size()),
      y(xn.size());
  rmsnorm_forward(xn.data(), rstd.data(), x.data(), P + L.rms1, N, C);
  matmul_forward(q.data(), xn.data(), P + L.wq, N, C, QD);
  matmul_forward(k.data(), xn.data(), P + L.wk, N, C, KD);
  matmul_forward(v.data(), xn.data(), P + L.wv, N, C, KD);
  RopeTable<float> rope;
  rope.build(pos.data(), N, c.head_dim);
  rope_forward(q.data(), rope, N, c.heads, c.head_dim);
  rope_forward(k.data(), rope, N, c.kv_heads, c.head_dim);
  auto view = [&](std::vector<float>& t, std::int64_t h) {
    return TensorView::dense(t.data(), DType::f32, {1, N, h, c.head_dim}, Layout::bshd);
  };
  attend(l, view(q, c.heads), view(k, c.kv_heads), view(v, c.kv_heads), view(att, c.heads));
  matmul_forward(y.data(), att.data(), P + L.wo, N, QD, C);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
  rmsnorm_forward(xn.data(), rstd.data(), x.data(), P + L.rms2, N, C);
  std::vector<float> a(static_cast<std::size_t>(N * F)), g(a.size());
  matmul_forward(a.data(), xn.data(), P + L.w1, N, C, F);
  matmul_forward(g.data(), xn.data(), P + L.w3, N, C, F);
  swiglu_forward(a.data(), a.data(), g.data(), N * F);
  matmul_forward(y.data(), a.data(), P + L.w2, N, F, C);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

}  // namespace

template <class Attend>
void Generator::layer(std::int64_t l, std::vector<float>& x, const std::vector<std::int64_t>& pos, Attend&& attend) {
  layer_rows(model_, layout_, params_.data(), l, x, pos, std::forward<Attend>(attend));
}

double prefill_row_seconds(const GptConfig& model, std::int64_t rows) {
  if (rows < 1) throw Error(fmt::format("prefill_row_seconds: rows must be >= 1, got {}", rows));
  const ParamLayout layout(model);
  const std::vector<float> params(static_cast<std::size_t>(layout.total), 0.01f);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) pos[static_cast<std::size_t>(i)] = i;
  std::vector<int> tokens(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) tokens[static_cast<std::size_t>(i)] = int(i % model.vocab);
  // The attention replaced by a copy of the queries (its own time is priced apart).
  auto copy_q = [](std::int64_t, const TensorView& q, const TensorView&, const TensorView&, const TensorView& out) {
    std::memcpy(out.data, q.data, std::size_t(q.shape.numel()) * sizeof(float));
  };
  std::vector<double> t;
  for (int pass = 0; pass < 4; ++pass) {  // the first warms the weights and the allocator
    const double c0 = process_cpu_seconds();
    std::vector<float> x(static_cast<std::size_t>(rows * model.width));
    embedding_forward(x.data(), tokens.data(), params.data() + layout.wte, rows, model.width);
    for (std::int64_t l = 0; l < model.layers; ++l) layer_rows(model, layout, params.data(), l, x, pos, copy_q);
    if (pass > 0) t.push_back(process_cpu_seconds() - c0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] / double(rows);
}

std::vector<float> Generator::logits(const float* x) {
  const std::int64_t C = model_.width, V = model_.vocab;
  std::vector<float> xn(static_cast<std::size_t>(C)), out(static_cast<std::size_t>(V));
  float rstd = 0;
  rmsnorm_forward(xn.data(), &rstd, x, params_.data() + layout_.rmsf, 1, C);
  matmul_forward(out.data(), xn.data(), params_.data() + layout_.lm_head, 1, C, V);
  return out;
}

std::vector<float> Generator::prefill(const std::vector<int>& prompt) {
  if (cache_)
    cache_->clear();
  else
    cache_.emplace(config_.layout, cache_shape(), comm_.size(), comm_.rank());
  return run_prompt(prompt);
}

std::vector<float> Generator::extend(const std::vector<int>& tokens) {
  const std::int64_t T = std::int64_t(tokens.size()), cached = held().tokens(0);
  if (T < comm_.size() || cached + T > config_.capacity)
    throw Error(
        fmt::format("a turn of {} tokens over {} cached needs at least {} tokens (one a rank) and fits "
                    "a capacity of {}",
                    T, cached, comm_.size(), config_.capacity));
  return run_prompt(tokens);
}

std::vector<float> Generator::run_prompt(const std::vector<int>& tokens) {
  const int cp = comm_.size(), me = comm_.rank();
  const std::int64_t T = std::int64_t(tokens.size()), C = model_.width, origin = held().tokens(0);
  std::vector<std::int64_t> rank_tokens;
  for (int r = 0; r < cp; ++r) rank_tokens.push_back(T * (r + 1) / cp - T * r / cp);
  const std::int64_t first = T * me / cp, n = rank_tokens[static_cast<std::size_t>(me)];
  std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = origin + first + i;
  stats_ = {};
  std::vector<float> x(static_cast<std::size_t>(n * C));
  embedding_forward(x.data(), tokens.data() + first, params_.data() + layout_.wte, n, C);
  if (on_layer_) on_layer_(0, model_.layers);
  for (std::int64_t l = 0; l < model_.layers; ++l) {
    layer(l, x, pos, [&](std::int64_t layer, auto q, auto k, auto v, auto out) {
      if (origin == 0)
        return ulysses::prefill(comm_, held(), config_.prefill, layer, rank_tokens, q, k, v, out, &stats_);
      ulysses::extend(comm_, held(), layer, rank_tokens, q, k, v, out, &stats_);
    });
    if (on_layer_) on_layer_(l + 1, model_.layers);
  }
  // The last position is the last rank's last row; its logits go to every rank.
  std::vector<float> out =
      me == cp - 1 ? logits(x.data() + (n - 1) * C) : std::vector<float>(static_cast<std::size_t>(model_.vocab));
  const double t0 = comm_.now();
  comm_.broadcast(out.data(), out.size() * sizeof(float), cp - 1);
  stats_.collectives += 1;
  stats_.comm_s += comm_.now() - t0;
  return out;
}

namespace {
// omp_set_num_threads(n) for this scope, the previous count restored on leaving it.
struct ScopedThreads {
  int saved = omp_get_max_threads();
  explicit ScopedThreads(int n) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(saved); }
};
}  // namespace

std::vector<float> Generator::decode(int token) {
  const std::int64_t C = model_.width;
  const std::vector<std::int64_t> pos{held().tokens(0)};
  stats_ = {};
  // One row: a parallel region costs more than its work (on a loaded machine, a scheduler
  // quantum whenever a team member is descheduled), so the row runs on one thread and only the
  // attention, which streams the cache, gets the team.
  const int threads = omp_get_max_threads();
  const ScopedThreads one(1);
  std::vector<float> x(static_cast<std::size_t>(C));
  embedding_forward(x.data(), &token, params_.data() + layout_.wte, 1, C);
  for (std::int64_t l = 0; l < model_.layers; ++l)
    layer(l, x, pos, [&](std::int64_t layer, auto q, auto k, auto v, auto out) {
      const ScopedThreads team(threads);
      decode_attention(comm_, held(), layer, q, k, v, out, &stats_);
    });
  return logits(x.data());
}

std::vector<std::vector<float>> Generator::decode(const std::vector<Generator*>& requests,
                                                  const std::vector<int>& tokens) {
  if (requests.empty() || requests.size() != tokens.size())
    throw Error(fmt::format("a decode step of {} tokens for {} requests", tokens.size(), requests.size()));
  Generator& g = *requests[0];
  const std::int64_t C = g.model_.width, B = std::int64_t(requests.size());
  std::vector<std::int64_t> pos;
  std::vector<KvCache*> caches;
  for (Generator* r : requests) {
    pos.push_back(r->held().tokens(0));
    caches.push_back(&r->held());
  }
  CachedAttentionStats stats;
  const int threads = omp_get_max_threads();  // as in decode(int): few rows, one thread
  const ScopedThreads one(1);
  std::vector<float> x(static_cast<std::size_t>(B * C));
  embedding_forward(x.data(), tokens.data(), g.params_.data() + g.layout_.wte, B, C);
  for (std::int64_t l = 0; l < g.model_.layers; ++l)
    g.layer(l, x, pos, [&](std::int64_t layer, auto q, auto k, auto v, auto out) {
      const ScopedThreads team(threads);
      decode_attention(g.comm_, caches, layer, q, k, v, out, &stats);
    });
  std::vector<std::vector<float>> out;
  for (std::int64_t b = 0; b < B; ++b) {
    out.push_back(g.logits(x.data() + b * C));
    requests[std::size_t(b)]->stats_ = stats;
  }
  return out;
}

int Generator::next_token(const std::vector<float>& logits) {
  const auto best = std::max_element(logits.begin(), logits.end());
  if (config_.temperature <= 0) return int(best - logits.begin());
  std::uint64_t z = (sampler_ += 0x9e3779b97f4a7c15ull);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  const double u = double((z ^ (z >> 31)) >> 11) / double(1ull << 53);
  double total = 0;
  std::vector<double> w(logits.size());
  for (std::size_t i = 0; i < w.size(); ++i)
    total += (w[i] = std::exp(double(logits[i] - *best) / config_.temperature));
  double at = u * total;
  for (std::size_t i = 0; i < w.size(); ++i)
    if ((at -= w[i]) < 0) return int(i);
  return int(w.size() - 1);
}

}  // namespace ulysses::train
