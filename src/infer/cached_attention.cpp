#include "ulysses/infer/cached_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "../cp/merge.hpp"
#include "../cp/ring_attention.hpp"
#include "../cp/tensor_ops.hpp"
#include "ulysses/comm/all_to_all.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/device_ops.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {
namespace {

// Heads [first, first + count) of a [b, s, h, d] view.
TensorView head_slice(const TensorView& x, std::int64_t first, std::int64_t count) {
  TensorView s = x;
  s.data = x.row(0, 0, first);
  s.shape.h = count;
  return s;
}

// An uninitialised float32 tensor of `floats` elements on `device`: a buffer the views below
// carve up, every element of it written before it is read.
Tensor flat(std::int64_t floats, Device device) {
  return Tensor::uninitialized({1, std::max<std::int64_t>(floats, 1), 1, 1}, DType::f32, Layout::bshd, device);
}

// A dense float32 view of `shape` in `layout` at element `at` of a flat buffer.
TensorView carve(const Tensor& buffer, std::int64_t at, const Shape& shape, Layout layout) {
  return TensorView::dense(buffer.view().row(0, at, 0), DType::f32, shape, layout, buffer.device());
}

// Rows first, first + step, ... (n of them) of a [1, s, h, d] view.
TensorView every(const TensorView& x, std::int64_t first, std::int64_t n, std::int64_t step) {
  if (n == 0) return rows(x, 0, 0);
  TensorView e = rows(x, first, 1);
  e.shape.s = n;
  e.stride_s = x.stride_s * step;
  return e;
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
  std::int64_t at = origin, mine = 0;
  for (int j = 0; j < cp; ++j) {
    sb[std::size_t(j)] = std::size_t(2 * owned(first, k.shape.s, j) * row) * sizeof(float);
    rb[std::size_t(j)] = std::size_t(2 * owned(at, rank_tokens[std::size_t(j)], me) * row) * sizeof(float);
    mine += owned(at, rank_tokens[std::size_t(j)], me);
    at += rank_tokens[std::size_t(j)];
  }
  std::exclusive_scan(sb.begin(), sb.end(), so.begin(), std::size_t(0));
  std::exclusive_scan(rb.begin(), rb.end(), ro.begin(), std::size_t(0));
  const Shape send_rows{1, 2 * k.shape.s, k.shape.h, k.shape.d}, recv_rows{1, 2 * mine, k.shape.h, k.shape.d};
  const Tensor send(send_rows, DType::f32, Layout::bshd, k.device), recv(recv_rows, DType::f32, Layout::bshd, k.device);
  std::vector<ViewCopy> pack, unpack;
  const Tensor kr({1, mine, k.shape.h, k.shape.d}, DType::f32, Layout::bshd, k.device),
      vr({1, mine, k.shape.h, k.shape.d}, DType::f32, Layout::bshd, k.device);
  for (std::int64_t j = 0, to = 0, from = 0, r = 0; j < cp; ++j) {  // block j: the K rows rank j owns, then their V
    const std::int64_t n = owned(first, k.shape.s, int(j)), p = (j - first % cp + cp) % cp;
    const std::int64_t got = std::int64_t(rb[std::size_t(j)] / sizeof(float)) / (2 * row);
    pack.push_back({every(k, p, n, cp), rows(send.view(), to, n)});
    pack.push_back({every(v, p, n, cp), rows(send.view(), to + n, n)});
    unpack.push_back({rows(recv.view(), from, got), rows(kr.view(), r, got)});
    unpack.push_back({rows(recv.view(), from + got, got), rows(vr.view(), r, got)});
    to += 2 * n, from += 2 * got, r += got;
  }
  const DeviceOps& ops = device_ops(k.device);
  ops.copy(pack);
  timed(comm, stats,
        [&] { comm.ialltoallv(buffer_of(send), sb, so, buffer_of(recv), rb, ro, "prefill_scatter").wait(); });
  ops.copy(unpack);
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
  FusedHeads oh(DType::f32, 1, rank_tokens, q.shape.d, {qh.shape.h}, nullptr, q.device);
  const Tensor lse = lse_tensor(qh.shape, q.device);
  flash_attention_forward(oh.part(0), lse.view(), qh, keys, values,
                          AttentionParams{.causal = true, .q_offset = origin});
  const SeqShard o[] = {{out, split.q}};
  timed(comm, stats, [&] { post_head_to_seq(comm, oh, o).wait(); });
  if (cache.layout() == KvLayout::interleaved) scatter_interleaved(comm, cache, layer, rank_tokens, k, v, stats);
}

// A block of n partial rows in a flat buffer at element `at`: out [1, n, h, d] dense, then its
// lse [1, n, h, 1] dense bhsd (merge_attention's operands as they travel).
struct Partials {
  TensorView out, lse;
  Partials(const Tensor& buffer, std::int64_t at, std::int64_t n, std::int64_t h, std::int64_t d)
      : out(carve(buffer, at, {1, n, h, d}, Layout::bshd)),
        lse(carve(buffer, at + n * h * d, {1, n, h, 1}, Layout::bhsd)) {}
};

// Every query of a turn over this rank's shard, into part: the rows of rank r's queries as one
// Partials block at element Σ_{i<r} n_i · (h·d + h). The rows cached before the turn are visible
// to every query (one flash call without a mask: its query tiles reuse each row they load, where
// a matrix-vector product per query would read the shard T times); the turn's own rows, at most
// ⌈T/cp⌉ of them, per query up to its position (over a strided shard the causal mask is no band
// the kernel knows); the two merged by LSE.
void shard_partials(const KvCache& cache, std::int64_t layer, std::int64_t origin, const TensorView& q,
                    std::int64_t group, const std::vector<std::int64_t>& rank_tokens, const Tensor& part) {
  const int cp = cache.cp(), me = cache.rank();
  const std::int64_t T = q.shape.s, h = q.shape.h, d = q.shape.d;
  const std::int64_t old = kv_rows(KvLayout::interleaved, origin, cp, me);
  const Tensor acc(q.shape, DType::f32, Layout::bshd, q.device), turn(q.shape, DType::f32, Layout::bshd, q.device),
      acc_lse = lse_tensor(q.shape, q.device), turn_lse = lse_tensor(q.shape, q.device);
  zero(acc.view());
  fill(acc_lse.view(), -std::numeric_limits<float>::infinity());
  if (old > 0)
    flash_attention_forward(acc.view(), acc_lse.view(), q, rows(cache.keys(layer), 0, old),
                            rows(cache.values(layer), 0, old), AttentionParams{});
  for (std::int64_t t = 0; t < T; ++t) {  // query t sees the turn's rows at positions <= origin + t
    const std::int64_t seen = kv_rows(KvLayout::interleaved, origin + t + 1, cp, me) - old;
    decode_attention_forward(rows(turn.view(), t, 1), rows(turn_lse.view(), t, 1), rows(q, t, 1),
                             rows(cache.keys(layer), old, seen), rows(cache.values(layer), old, seen),
                             DecodeParams{.group = group});
  }
  merge_attention(acc.view(), acc_lse.view(), turn.view(), turn_lse.view());
  std::vector<ViewCopy> pack;
  for (std::int64_t r = 0, a = 0; r < cp; a += rank_tokens[std::size_t(r++)]) {
    const std::int64_t n = rank_tokens[std::size_t(r)];
    const Partials block(part, a * (h * d + h), n, h, d);
    pack.push_back({rows(acc.view(), a, n), block.out});
    pack.push_back({rows(acc_lse.view(), a, n), block.lse});
  }
  device_ops(q.device).copy(pack);
}

// Pass-Q over an interleaved cache: the new tokens' K and V go to their owners; every query goes
// to every rank (one all-gather), which attends it over the rows of its shard at or before the
// query's position; the partial (out, lse) rows go back to the queries' ranks (one
// all-to-all(v)) and merge by LSE in rank order. Only queries and partial outputs travel, never
// the cache.
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
  const Tensor qall({1, T, h, d}, DType::f32, Layout::bshd, q.device), part = flat(T * row, q.device),
                                                                       back = flat(cp * mine * row, q.device);
  timed(comm, stats, [&] { comm.allgatherv(buffer_of(q), buffer_of(qall), qb, "pass_q_gather"); });
  shard_partials(cache, layer, origin, qall.view(), group, rank_tokens, part);
  timed(comm, stats,
        [&] { comm.ialltoallv(buffer_of(part), sb, so, buffer_of(back), rb, ro, "pass_q_return").wait(); });
  const Partials acc(back, 0, mine, h, d);
  for (std::int64_t r = 1; r < cp; ++r) {
    const Partials p(back, r * mine * row, mine, h, d);
    merge_attention(acc.out, acc.lse, p.out, p.lse);
  }
  copy(acc.out, out);
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
  const Tensor part({1, B, mine.q.count, d}, DType::f32, Layout::bshd, q.device),
      lse = lse_tensor({1, 1, mine.q.count, d}, q.device), all = flat(B * s.heads * d, q.device);
  for (std::int64_t b = 0; b < B; ++b) {
    KvCache& cache = *caches[std::size_t(b)];
    cache.append(layer, 1, head_slice(rows(k, b, 1), mine.kv.first, mine.kv.count),
                 head_slice(rows(v, b, 1), mine.kv.first, mine.kv.count));
    decode_attention_forward(rows(part.view(), b, 1), lse.view(), head_slice(rows(q, b, 1), mine.q.first, mine.q.count),
                             cache.keys(layer), cache.values(layer),
                             DecodeParams{.q_first = mine.q.first, .kv_first = mine.kv.first, .group = group});
  }
  const HeadSplit split = ulysses_head_split(comm.size(), s.heads, s.kv_heads);
  std::vector<std::size_t> bytes;
  for (const HeadRange& r : split.q) bytes.push_back(std::size_t(B * r.count * d) * sizeof(float));
  timed(comm, stats, [&] { comm.allgatherv(buffer_of(part), buffer_of(all), bytes, "decode_gather"); });
  std::vector<ViewCopy> unpack;
  std::int64_t at = 0;
  for (const HeadRange& r : split.q)  // rank r's block: [B, its heads, d]
    for (std::int64_t b = 0; b < B; ++b, at += r.count * d)
      unpack.push_back(
          {carve(all, at, {1, 1, r.count, d}, Layout::bshd), head_slice(rows(out, b, 1), r.first, r.count)});
  device_ops(q.device).copy(unpack);
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
  const Tensor part = flat(B * n, q.device), all = flat(B * n * cp, q.device);
  for (std::int64_t b = 0; b < B; ++b) {
    KvCache& cache = *caches[std::size_t(b)];
    const bool owner = cache.owner(cache.tokens(layer)) == cache.rank();
    cache.append(layer, 1, rows(k, b, owner ? 1 : 0), rows(v, b, owner ? 1 : 0));
    const Partials p(part, b * n, 1, h, d);
    decode_attention_forward(p.out, p.lse, rows(q, b, 1), cache.keys(layer), cache.values(layer),
                             DecodeParams{.group = group});
  }
  timed(comm, stats, [&] {
    comm.allgatherv(buffer_of(part), buffer_of(all),
                    std::vector<std::size_t>(std::size_t(cp), std::size_t(B * n) * sizeof(float)), "decode_merge");
  });
  for (std::int64_t b = 0; b < B; ++b) {
    const Partials acc(all, b * n, 1, h, d);
    for (std::int64_t r = 1; r < cp; ++r) {
      const Partials p(all, (r * B + b) * n, 1, h, d);
      merge_attention(acc.out, acc.lse, p.out, p.lse);
    }
    copy(acc.out, rows(out, b, 1));
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
