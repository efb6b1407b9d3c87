#include "ulysses/cached_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "../cp/merge.hpp"
#include "../cp/ring_attention.hpp"
#include "ulysses/all_to_all.hpp"
#include "ulysses/attention.hpp"
#include "ulysses/error.hpp"
#include "ulysses/sharding.hpp"

namespace ulysses {
namespace {

// Heads [first, first + count) of a [b, s, h, d] view.
TensorView head_slice(const TensorView& x, std::int64_t first, std::int64_t count) {
  TensorView s = x;
  s.data = x.row(0, 0, first);
  s.shape.h = count;
  return s;
}

// Runs fn(), a collective, counting it and its time in stats.
template <class Fn>
void timed(Communicator& comm, CachedAttentionStats* stats, Fn&& fn) {
  const double t0 = comm.now();
  fn();
  if (stats) {
    stats->collectives += 1;
    stats->comm_s += comm.now() - t0;
  }
}

// Interleaved prefill: this rank's new tokens (k, v [1, n, kv_heads, d]), at positions
// [first, first + n) after the cached ones, go to their owners (position mod cp) in one
// all-to-all(v); each rank appends what it receives, in position order (the ranks' chunks are
// contiguous in rank order).
void scatter_interleaved(Communicator& comm, KvCache& cache, std::int64_t layer,
                         const std::vector<std::int64_t>& rank_tokens, const TensorView& k, const TensorView& v,
                         CachedAttentionStats* stats) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t row = k.shape.h * k.shape.d, origin = cache.tokens(layer),
                     first = origin + std::accumulate(rank_tokens.begin(), rank_tokens.begin() + me, std::int64_t(0));
  const std::int64_t total = std::accumulate(rank_tokens.begin(), rank_tokens.end(), std::int64_t(0));
  // Tokens of rank r's chunk [a, a + n) that rank j owns: kv_rows counts them.
  auto owned = [&](std::int64_t a, std::int64_t n, int j) {
    return kv_rows(KvLayout::interleaved, a + n, cp, j) - kv_rows(KvLayout::interleaved, a, cp, j);
  };
  const std::size_t ranks = static_cast<std::size_t>(cp);
  std::vector<std::size_t> sb(ranks), so(ranks), rb(ranks), ro(ranks);
  std::int64_t at = origin;
  for (int j = 0; j < cp; ++j) {
    sb[std::size_t(j)] = std::size_t(2 * owned(first, k.shape.s, j) * row) * sizeof(float);
    rb[std::size_t(j)] = std::size_t(2 * owned(at, rank_tokens[std::size_t(j)], me) * row) * sizeof(float);
    at += rank_tokens[std::size_t(j)];
  }
  std::exclusive_scan(sb.begin(), sb.end(), so.begin(), std::size_t(0));
  std::exclusive_scan(rb.begin(), rb.end(), ro.begin(), std::size_t(0));
  std::vector<float> send(std::size_t(2 * k.shape.s * row)), recv((ro.back() + rb.back()) / sizeof(float));
  for (int j = 0; j < cp; ++j) {  // block j: the K rows rank j owns, then their V rows
    float* dst = send.data() + so[std::size_t(j)] / sizeof(float);
    const std::int64_t n = owned(first, k.shape.s, j);
    for (std::int64_t i = 0, p = (j - first % cp + cp) % cp; i < n; ++i, p += cp) {
      for (const TensorView* x : {&k, &v}) {
        const float* src = x->f32(0, p, 0);
        std::copy(src, src + row, dst + (x == &k ? i : n + i) * row);
      }
    }
  }
  timed(comm, stats, [&] {
    comm.ialltoallv(Buffer{send.data(), send.size() * sizeof(float)}, sb, so,
                    Buffer{recv.data(), recv.size() * sizeof(float)}, rb, ro, "prefill_scatter")
        .wait();
  });
  const std::int64_t mine = std::int64_t(recv.size()) / (2 * row);
  Tensor kr({1, mine, k.shape.h, k.shape.d}), vr({1, mine, k.shape.h, k.shape.d});
  std::int64_t r = 0;
  for (int j = 0; j < cp; ++j) {
    const float* blk = recv.data() + ro[std::size_t(j)] / sizeof(float);
    const std::int64_t n = std::int64_t(rb[std::size_t(j)] / sizeof(float)) / (2 * row);
    std::copy(blk, blk + n * row, kr.view().f32(0, r, 0));
    std::copy(blk + n * row, blk + 2 * n * row, vr.view().f32(0, r, 0));
    r += n;
  }
  cache.append(layer, total, kr.view(), vr.view());
}

// Ulysses: the K and V heads the transpose brought are the heads layout's rows; the queries
// attend to every cached row before theirs (a prompt over a cache: q_offset = tokens cached).
void prefill_ulysses(Communicator& comm, KvCache& cache, std::int64_t layer,
                     const std::vector<std::int64_t>& rank_tokens, const TensorView& q, const TensorView& k,
                     const TensorView& v, const TensorView& out, CachedAttentionStats* stats) {
  const std::int64_t origin = cache.tokens(layer);
  const HeadSplit split = ulysses_head_split(comm.size(), q.shape.h, k.shape.h);
  const SeqShard in[] = {{q, split.q}, {k, split.kv}, {v, split.kv}};
  FusedHeads qkv;
  timed(comm, stats, [&] { post_seq_to_head(comm, in, rank_tokens, qkv).wait(); });
  TensorView keys = qkv.part(1), values = qkv.part(2);
  if (cache.layout() == KvLayout::heads) {
    cache.append(layer, qkv.seq(), keys, values);
    keys = cache.keys(layer);
    values = cache.values(layer);
  }
  const TensorView qh = qkv.part(0);
  FusedHeads oh(DType::f32, 1, rank_tokens, q.shape.d, {qh.shape.h});
  const Tensor lse = lse_tensor(qh.shape);
  flash_attention_forward(oh.part(0), lse.view(), qh, keys, values,
                          AttentionParams{.causal = true, .q_offset = origin});
  const SeqShard o[] = {{out, split.q}};
  timed(comm, stats, [&] { post_head_to_seq(comm, oh, o).wait(); });
  if (cache.layout() == KvLayout::interleaved) scatter_interleaved(comm, cache, layer, rank_tokens, k, v, stats);
}

// out [1, n, h, d] = the LSE merge, in rank order, of every rank's partial rows: parts holds
// cp blocks of n rows of (out [h, d], lse [h]).
void merge_rows(const std::vector<float>& parts, int cp, std::int64_t n, std::int64_t h, std::int64_t d,
                const TensorView& out) {
  const std::int64_t row = h * d + h;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t g = 0; g < h; ++g) {
      auto at = [&](int r) { return parts.data() + (r * n + i) * row; };
      float m = -std::numeric_limits<float>::infinity(), total = 0;
      for (int r = 0; r < cp; ++r) m = std::max(m, at(r)[h * d + g]);
      float* o = out.f32(0, i, g);
      std::fill_n(o, d, 0.0f);
      for (int r = 0; r < cp; ++r) {
        const float w = m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(at(r)[h * d + g] - m);
        total += w;
        for (std::int64_t c = 0; c < d; ++c) o[c] += w * at(r)[g * d + c];
      }
      for (std::int64_t c = 0; c < d; ++c) o[c] = total > 0 ? o[c] / total : 0.0f;
    }
}

// Every query of a turn over this rank's shard, into part (T rows of out [h, d], lse [h]): the
// rows cached before the turn are visible to every query (one flash call without a mask: its
// query tiles reuse each row they load, where a matrix-vector product per query would read the
// shard T times); the turn's own rows, at most ⌈T/cp⌉ of them, per query up to its position
// (over a strided shard the causal mask is no band the kernel knows); the two merged by LSE.
void shard_partials(const KvCache& cache, std::int64_t layer, std::int64_t origin, const TensorView& q,
                    std::int64_t group, std::vector<float>& part) {
  const int cp = cache.cp(), me = cache.rank();
  const std::int64_t T = q.shape.s, h = q.shape.h, d = q.shape.d, row = h * d + h;
  const std::int64_t old = kv_rows(KvLayout::interleaved, origin, cp, me);
  Tensor acc(q.shape), turn(q.shape), acc_lse = lse_tensor(q.shape), turn_lse = lse_tensor(q.shape);
  float *al = acc_lse.view().f32(0, 0, 0), *tl = turn_lse.view().f32(0, 0, 0);  // bhsd: [h][T]
  std::fill_n(al, h * T, -std::numeric_limits<float>::infinity());
  if (old > 0)
    flash_attention_forward(acc.view(), acc_lse.view(), q, rows(cache.keys(layer), 0, old),
                            rows(cache.values(layer), 0, old), AttentionParams{});
  std::vector<float> lse(static_cast<std::size_t>(h));
  for (std::int64_t t = 0; t < T; ++t) {  // query t sees the turn's rows at positions <= origin + t
    const std::int64_t seen = kv_rows(KvLayout::interleaved, origin + t + 1, cp, me) - old;
    decode_attention_local(turn.view().f32(0, t, 0), lse.data(), q.f32(0, t, 0), h, 0,
                           rows(cache.keys(layer), old, seen), rows(cache.values(layer), old, seen), 0, group,
                           1.0f / std::sqrt(float(d)));
    for (std::int64_t g = 0; g < h; ++g) tl[g * T + t] = lse[static_cast<std::size_t>(g)];
  }
  merge_attention(acc.view(), acc_lse.view(), turn.view(), turn_lse.view());
  for (std::int64_t t = 0; t < T; ++t) {
    std::copy_n(acc.view().f32(0, t, 0), h * d, part.data() + t * row);
    for (std::int64_t g = 0; g < h; ++g) part[static_cast<std::size_t>(t * row + h * d + g)] = al[g * T + t];
  }
}

// Pass-Q over an interleaved cache: the new tokens' K and V go to their owners; every query goes
// to every rank (one all-gather), which attends it over the rows of its shard at or before the
// query's position; the partial (out, lse) rows go back to the queries' ranks (one
// all-to-all(v)) and merge by LSE. Only queries and partial outputs travel, never the cache.
void prefill_pass_q(Communicator& comm, KvCache& cache, std::int64_t layer,
                    const std::vector<std::int64_t>& rank_tokens, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& out, CachedAttentionStats* stats) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t origin = cache.tokens(layer), h = q.shape.h, d = q.shape.d, row = h * d + h,
                     mine = rank_tokens[std::size_t(me)], group = h / k.shape.h;
  scatter_interleaved(comm, cache, layer, rank_tokens, k, v, stats);
  std::vector<std::size_t> qb, sb, so, rb, ro;
  std::int64_t T = 0;
  for (int r = 0; r < cp; ++r) {
    const std::int64_t n = rank_tokens[std::size_t(r)];
    qb.push_back(std::size_t(n * h * d) * sizeof(float));
    so.push_back(std::size_t(T * row) * sizeof(float));
    sb.push_back(std::size_t(n * row) * sizeof(float));
    ro.push_back(std::size_t(r * mine * row) * sizeof(float));
    rb.push_back(std::size_t(mine * row) * sizeof(float));
    T += n;
  }
  std::vector<float> qall(static_cast<std::size_t>(T * h * d)), part(static_cast<std::size_t>(T * row)),
      back(static_cast<std::size_t>(cp * mine * row));
  timed(comm, stats, [&] {
    comm.allgatherv(buffer_of(q), Buffer{qall.data(), qall.size() * sizeof(float)}, qb, "pass_q_gather");
  });
  shard_partials(cache, layer, origin, TensorView::dense(qall.data(), DType::f32, {1, T, h, d}, Layout::bshd), group,
                 part);
  timed(comm, stats, [&] {
    comm.ialltoallv(Buffer{part.data(), part.size() * sizeof(float)}, sb, so,
                    Buffer{back.data(), back.size() * sizeof(float)}, rb, ro, "pass_q_return")
        .wait();
  });
  merge_rows(back, cp, mine, h, d, out);
}

// The ring (pass-KV): each rank's queries stay, K and V go round; the ring's R − 1 steps are
// counted as its collectives.
void prefill_ring(Communicator& comm, KvCache& cache, std::int64_t layer, const std::vector<std::int64_t>& rank_tokens,
                  const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                  CachedAttentionStats* stats) {
  std::vector<std::vector<SeqChunk>> chunks;
  for (std::int64_t r = 0, at = 0; r < std::int64_t(rank_tokens.size()); at += rank_tokens[std::size_t(r++)])
    chunks.push_back({SeqChunk{at, rank_tokens[std::size_t(r)]}});
  RingSaved saved;
  CpStats ring_stats;
  ring_attention_forward(comm, out, saved, q, k, v, chunks, chunks[std::size_t(comm.rank())],
                         AttentionParams{.causal = true}, ring_stats);
  if (stats) {
    stats->collectives += comm.size() - 1;
    stats->comm_s += ring_stats.comm_exposed_s;
  }
  if (cache.layout() == KvLayout::interleaved) return scatter_interleaved(comm, cache, layer, rank_tokens, k, v, stats);
  const HeadSplit split = ulysses_head_split(comm.size(), q.shape.h, k.shape.h);
  const SeqShard in[] = {{k, split.kv}, {v, split.kv}};
  FusedHeads kv;
  timed(comm, stats, [&] { post_seq_to_head(comm, in, rank_tokens, kv).wait(); });
  cache.append(layer, kv.seq(), kv.part(0), kv.part(1));
}

}  // namespace

Prefill parse_prefill(std::string_view name) {
  if (name == "ulysses") return Prefill::ulysses;
  if (name == "ring") return Prefill::ring;
  throw Error(fmt::format("unknown prefill '{}' (ulysses | ring)", name));
}

const char* to_string(Prefill prefill) { return prefill == Prefill::ulysses ? "ulysses" : "ring"; }

void prefill(Communicator& comm, KvCache& cache, Prefill how, std::int64_t layer,
             const std::vector<std::int64_t>& rank_tokens, const TensorView& q, const TensorView& k,
             const TensorView& v, const TensorView& out, CachedAttentionStats* stats) {
  if (cache.tokens(layer) != 0)
    throw Error(fmt::format("a prefill fills an empty cache; layer {} holds {} tokens", layer, cache.tokens(layer)));
  if (how == Prefill::ulysses) return prefill_ulysses(comm, cache, layer, rank_tokens, q, k, v, out, stats);
  prefill_ring(comm, cache, layer, rank_tokens, q, k, v, out, stats);
}

void extend(Communicator& comm, KvCache& cache, std::int64_t layer, const std::vector<std::int64_t>& rank_tokens,
            const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
            CachedAttentionStats* stats) {
  if (cache.layout() == KvLayout::heads) return prefill_ulysses(comm, cache, layer, rank_tokens, q, k, v, out, stats);
  prefill_pass_q(comm, cache, layer, rank_tokens, q, k, v, out, stats);
}

void decode_attention(Communicator& comm, KvCache& cache, std::int64_t layer, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& out, CachedAttentionStats* stats) {
  decode_attention(comm, std::vector<KvCache*>{&cache}, layer, q, k, v, out, stats);
}

namespace {

// Heads layout: each rank its query heads of every request over its KV heads; one
// all-gather(v) of [requests, the rank's heads, d] blocks, then each block into place.
void decode_heads(Communicator& comm, const std::vector<KvCache*>& caches, std::int64_t layer, const TensorView& q,
                  const TensorView& k, const TensorView& v, const TensorView& out, CachedAttentionStats* stats) {
  const KvCacheShape& s = caches[0]->shape();
  const std::int64_t d = s.head_dim, group = s.heads / s.kv_heads, B = std::int64_t(caches.size());
  const RankHeads& mine = caches[0]->heads();
  std::vector<float> part(std::size_t(B * mine.q.count * d)), lse(std::size_t(mine.q.count));
  for (std::int64_t b = 0; b < B; ++b) {
    KvCache& cache = *caches[std::size_t(b)];
    cache.append(layer, 1, head_slice(rows(k, b, 1), mine.kv.first, mine.kv.count),
                 head_slice(rows(v, b, 1), mine.kv.first, mine.kv.count));
    decode_attention_local(part.data() + b * mine.q.count * d, lse.data(), q.f32(0, b, mine.q.first), mine.q.count,
                           mine.q.first, cache.keys(layer), cache.values(layer), mine.kv.first, group,
                           1.0f / std::sqrt(float(d)));
  }
  const HeadSplit split = ulysses_head_split(comm.size(), s.heads, s.kv_heads);
  std::vector<std::size_t> bytes;
  for (const HeadRange& r : split.q) bytes.push_back(std::size_t(B * r.count * d) * sizeof(float));
  std::vector<float> all(std::size_t(B * s.heads * d));
  timed(comm, stats, [&] {
    comm.allgatherv(Buffer{part.data(), part.size() * sizeof(float)}, Buffer{all.data(), all.size() * sizeof(float)},
                    bytes, "decode_gather");
  });
  const float* blk = all.data();
  for (const HeadRange& r : split.q)  // rank r's block: [B, its heads, d]
    for (std::int64_t b = 0; b < B; ++b, blk += r.count * d) std::copy_n(blk, r.count * d, out.f32(0, b, r.first));
}

// Interleaved layout: each rank every head of every request over its shard (an empty shard gives
// lse = −inf); one all-gather of the partial (out, lse) of every request, merged by LSE in rank
// order on every rank (every rank gets the same bits).
void decode_interleaved(Communicator& comm, const std::vector<KvCache*>& caches, std::int64_t layer,
                        const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        CachedAttentionStats* stats) {
  const KvCacheShape& s = caches[0]->shape();
  const std::int64_t d = s.head_dim, group = s.heads / s.kv_heads, B = std::int64_t(caches.size()), h = s.heads,
                     n = h * d + h, cp = comm.size();  // a request's partial: out [h, d], then lse [h]
  std::vector<float> part(static_cast<std::size_t>(B * n)), all(static_cast<std::size_t>(B * n * cp));
  for (std::int64_t b = 0; b < B; ++b) {
    KvCache& cache = *caches[std::size_t(b)];
    const bool owner = cache.owner(cache.tokens(layer)) == cache.rank();
    cache.append(layer, 1, rows(k, b, owner ? 1 : 0), rows(v, b, owner ? 1 : 0));
    float* p = part.data() + b * n;
    decode_attention_local(p, p + h * d, q.f32(0, b, 0), h, 0, cache.keys(layer), cache.values(layer), 0, group,
                           1.0f / std::sqrt(float(d)));
  }
  timed(comm, stats, [&] {
    comm.allgatherv(Buffer{part.data(), part.size() * sizeof(float)}, Buffer{all.data(), all.size() * sizeof(float)},
                    std::vector<std::size_t>(std::size_t(cp), std::size_t(B * n) * sizeof(float)), "decode_merge");
  });
  auto out_of = [&](float* p) { return TensorView::dense(p, DType::f32, {1, 1, h, d}, Layout::bshd); };
  auto lse_of = [&](float* p) { return TensorView::dense(p + h * d, DType::f32, {1, 1, h, 1}, Layout::bhsd); };
  for (std::int64_t b = 0; b < B; ++b) {
    float* acc = all.data() + b * n;
    for (std::int64_t r = 1; r < cp; ++r) {
      float* p = all.data() + (r * B + b) * n;
      merge_attention(out_of(acc), lse_of(acc), out_of(p), lse_of(p));
    }
    copy(out_of(acc), rows(out, b, 1));
  }
}

}  // namespace

void decode_attention(Communicator& comm, const std::vector<KvCache*>& caches, std::int64_t layer, const TensorView& q,
                      const TensorView& k, const TensorView& v, const TensorView& out, CachedAttentionStats* stats) {
  if (caches.empty() || std::int64_t(caches.size()) != q.shape.s)
    throw Error(fmt::format("a decode step of {} query rows for {} caches", q.shape.s, caches.size()));
  if (caches[0]->layout() == KvLayout::heads) return decode_heads(comm, caches, layer, q, k, v, out, stats);
  decode_interleaved(comm, caches, layer, q, k, v, out, stats);
}

}  // namespace ulysses
