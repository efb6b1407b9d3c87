// The sharded KV cache (kv_cache.hpp) and attention over it (cached_attention.hpp): bytes held
// equal the formula; prefill and every decode step equal float64 attention over all tokens so
// far, on every layout, at every group size (a rank with an empty shard included).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/isa.hpp"
#include "test_util.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/infer/cached_attention.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/infer/kv_cache.hpp"
#include "worlds.hpp"

using namespace ulysses;

namespace {

constexpr double kTol = 1e-5;

// A deterministic value in [-1, 1) for (seed, index): the same on every rank.
float value(std::uint64_t seed, std::int64_t i) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + std::uint64_t(i) * 0xbf58476d1ce4e5b9ull + 1;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
  z ^= z >> 29;
  return float(double(z >> 11) / double(1ull << 53) * 2.0 - 1.0);
}

// [tokens][heads][d] rows of the whole sequence.
struct Rows {
  std::int64_t heads, d;
  std::vector<float> x;
  Rows(std::uint64_t seed, std::int64_t tokens, std::int64_t heads, std::int64_t d) : heads(heads), d(d) {
    x.resize(std::size_t(tokens * heads * d));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 2.0f * value(seed, std::int64_t(i));
  }
  const float* at(std::int64_t t, std::int64_t h) const { return x.data() + (t * heads + h) * d; }
  // Tokens [t, t + n) as a [1, n, heads, d] view.
  TensorView view(std::int64_t t, std::int64_t n) const {
    return TensorView::dense(const_cast<float*>(at(t, 0)), DType::f32, {1, n, heads, d}, Layout::bshd);
  }
};

// x ([1, s, h, d]) copied into a [h, s, d] block per head (bhsd), the order the cache keeps.
Tensor head_major(const TensorView& x) {
  Tensor t(x.shape, DType::f32, Layout::bhsd);
  copy(x, t.view());
  return t;
}

// f(level's name) under every ISA level this CPU runs (the decode kernel's pass is one per level)
// and both prefetch distances (chosen by vendor, so a CPU runs only one of them otherwise).
template <class F>
void for_every_isa(F f) {
  const kernels::Isa before = kernels::active_isa();
  const kernels::DecodePrefetch distance = kernels::decode_prefetch();
  for (const kernels::Isa isa : kernels::supported_isas())
    for (const kernels::DecodePrefetch ahead : {kernels::DecodePrefetch::kilobyte, kernels::DecodePrefetch::block}) {
      kernels::force_isa(isa);
      kernels::force_decode_prefetch(ahead);
      f((std::string(kernels::to_string(isa)) +
         (ahead == kernels::DecodePrefetch::block ? ", a block ahead" : ", a kilobyte ahead"))
            .c_str());
    }
  kernels::force_isa(before);
  kernels::force_decode_prefetch(distance);
}

// Float64: query `t` of q (heads [first, first + count), every head by default) against keys
// 0..keys−1; returns the largest error of got (those heads' rows).
double worst_error(const Rows& q, const Rows& k, const Rows& v, std::int64_t t, std::int64_t keys, const float* got,
                   std::int64_t first = 0, std::int64_t count = -1) {
  const std::int64_t h = q.heads, d = q.d, group = h / k.heads, end = count < 0 ? h : first + count;
  double worst = 0;
  for (std::int64_t i = first; i < end; ++i) {
    std::vector<double> s(static_cast<std::size_t>(keys));
    double mx = -1e300, sum = 0;
    for (std::int64_t j = 0; j < keys; ++j) {
      double dot = 0;
      for (std::int64_t c = 0; c < d; ++c) dot += double(q.at(t, i)[c]) * double(k.at(j, i / group)[c]);
      s[std::size_t(j)] = dot / std::sqrt(double(d));
      mx = std::max(mx, s[std::size_t(j)]);
    }
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (std::int64_t c = 0; c < d; ++c) {
      double o = 0;
      for (std::int64_t j = 0; j < keys; ++j) o += s[std::size_t(j)] / sum * double(v.at(j, i / group)[c]);
      worst = std::max(worst, std::abs(o - double(got[(i - first) * d + c])) / (1.0 + std::abs(o)));
    }
  }
  return worst;
}

// Each KV head's rows are one contiguous [s, d] block (the decode kernel streams a head's K and
// V in address order), and an append lands where keys() reads it.
TEST(KvCache, KeepsEachKvHeadsRowsContiguous) {
  KvCache cache(KvLayout::interleaved, {1, 4, 2, 8, 10}, 1, 0);
  const Rows k(5, 3, 2, 8), v(6, 3, 2, 8);
  cache.append(0, 3, k.view(0, 3), v.view(0, 3));
  const TensorView keys = cache.keys(0), values = cache.values(0);
  EXPECT_EQ(keys.stride_s, 8);
  EXPECT_EQ(keys.stride_h, 10 * 8);  // the capacity's rows of a head, then the next head
  for (std::int64_t t = 0; t < 3; ++t)
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(keys.f32(0, t, h)[3], k.at(t, h)[3]);
      EXPECT_EQ(values.f32(0, t, h)[7], v.at(t, h)[7]);
    }
}

TEST(KvCache, BytesHeldEqualTheFormula) {
  for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved})
    for (int cp = 1; cp <= 6; ++cp)
      for (int rank = 0; rank < cp; ++rank) {
        const KvCacheShape shape{3, 6, 2, 8, 13};
        const KvCache cache(layout, shape, cp, rank);
        EXPECT_EQ(cache.bytes(), kv_bytes_formula(layout, shape, cp, rank)) << to_string(layout) << " cp " << cp;
      }
  EXPECT_EQ(KvCache(KvLayout::heads, {1, 8, 2, 4, 10}, 4, 3).replication(), 2);  // 4 ranks, 2 KV heads
  EXPECT_EQ(KvCache(KvLayout::heads, {1, 8, 4, 4, 10}, 4, 3).replication(), 1);
  EXPECT_EQ(kv_bytes_formula(KvLayout::interleaved, {2, 8, 2, 4, 10}, 4, 3), 2 * 2 * 2 * 2 * 4 * 4);  // rows 3, 7
}

TEST(KvCache, RefusesWhatItCannotHold) {
  EXPECT_NE(kv_layout_error(KvLayout::heads, {1, 4, 2, 8, 16}, 8).find("--kv-layout interleaved"), std::string::npos);
  EXPECT_EQ(kv_layout_error(KvLayout::interleaved, {1, 4, 2, 8, 16}, 8), "");
  EXPECT_THROW(KvCache(KvLayout::heads, {1, 4, 2, 8, 16}, 8, 0), Error);
  KvCache full(KvLayout::heads, {1, 2, 1, 4, 1}, 1, 0);
  Rows kv(1, 2, 1, 4);
  full.append(0, 1, kv.view(0, 1), kv.view(0, 1));
  EXPECT_THROW(full.append(0, 1, kv.view(1, 1), kv.view(1, 1)), Error);
  EXPECT_THROW(parse_kv_layout("rows"), Error);
}

// Tokens [begin, begin + count) split over the ranks, contiguous; checks each rank's rows of
// their attention (prefilled `how` into an empty cache, else extended over it) against float64.
void prompt_part(Communicator& comm, KvCache& cache, const Rows& q, const Rows& k, const Rows& v, std::int64_t begin,
                 std::int64_t count, Prefill how) {
  const int cp = comm.size(), me = comm.rank();
  std::vector<std::int64_t> rank_tokens;
  for (int r = 0; r < cp; ++r) rank_tokens.push_back(count * (r + 1) / cp - count * r / cp);
  const std::int64_t first = begin + count * me / cp, n = rank_tokens[std::size_t(me)];
  Tensor out({1, n, q.heads, q.d});
  const TensorView qs = q.view(first, n), ks = k.view(first, n), vs = v.view(first, n);
  if (begin == 0) prefill(comm, cache, how, 0, rank_tokens, qs, ks, vs, out.view());
  if (begin > 0) extend(comm, cache, 0, rank_tokens, qs, ks, vs, out.view());
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_LT(worst_error(q, k, v, first + i, first + i + 1, out.view().f32(0, i, 0)), kTol)
        << to_string(cache.layout()) << (begin > 0 ? " extend" : " prefill") << " row " << first + i;
}

// A prompt of `prompt` tokens (prefilled `how`; none: decode from an empty cache), a second turn
// of `turn` tokens over it, then `steps` decode steps, every output checked against float64.
void prefill_then_decode(Communicator& comm, KvLayout layout, std::int64_t prompt, std::int64_t steps,
                         Prefill how = Prefill::ulysses, std::int64_t turn = 0) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t h = 4, hkv = 2, d = 8, total = prompt + turn + steps;
  if (!kv_layout_error(layout, {1, h, hkv, d, total}, cp).empty()) return;
  const Rows q(1, total, h, d), k(2, total, hkv, d), v(3, total, hkv, d);
  KvCache cache(layout, {1, h, hkv, d, total}, cp, me);
  if (prompt > 0) prompt_part(comm, cache, q, k, v, 0, prompt, how);
  if (turn > 0) prompt_part(comm, cache, q, k, v, prompt, turn, how);
  CachedAttentionStats stats;
  for (std::int64_t t = prompt + turn; t < total; ++t) {
    Tensor out({1, 1, h, d});
    decode_attention(comm, cache, 0, q.view(t, 1), k.view(t, 1), v.view(t, 1), out.view(), &stats);
    EXPECT_LT(worst_error(q, k, v, t, t + 1, out.view().f32(0, 0, 0)), kTol)
        << to_string(layout) << " " << to_string(how) << " step " << t;
  }
  EXPECT_EQ(stats.collectives, steps);  // one per decode step, nothing else
  EXPECT_EQ(cache.tokens(0), total);
}

COMM_TEST(CachedAttention, ASecondTurnOverTheCacheEqualsFloat64) {
  for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved})
    prefill_then_decode(comm, layout, 9, 3, Prefill::ulysses, 7);
}

COMM_TEST(CachedAttention, DecodeFromAnEmptyCacheEqualsFloat64) {
  for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved}) prefill_then_decode(comm, layout, 0, 6);
}

COMM_TEST(CachedAttention, PrefillThenDecodeEqualsFloat64) {
  for (Prefill how : {Prefill::ulysses, Prefill::ring})
    for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved}) prefill_then_decode(comm, layout, 11, 5, how);
}

TEST(CachedAttention, LocalKernelOverManyRowsEqualsFloat64) {
  const std::int64_t rows = 3000, h = 4, hkv = 2, d = 16;
  const Rows q(4, 1, h, d), k(5, rows, hkv, d), v(6, rows, hkv, d);
  std::vector<float> out(static_cast<std::size_t>(h * d)), lse(static_cast<std::size_t>(h));
  const TensorView ov = TensorView::dense(out.data(), DType::f32, {1, 1, h, d}, Layout::bshd),
                   lv = TensorView::dense(lse.data(), DType::f32, {1, 1, h, 1}, Layout::bhsd),
                   qv = TensorView::dense(const_cast<float*>(q.at(0, 0)), DType::f32, {1, 1, h, d}, Layout::bshd);
  const Tensor kh = head_major(k.view(0, rows)), vh = head_major(v.view(0, rows));
  for_every_isa([&](const char* isa) {
    decode_attention_forward(ov, lv, qv, kh.view(), vh.view(), DecodeParams{.group = h / hkv});
    EXPECT_LT(worst_error(q, k, v, 0, rows, out.data()), kTol) << isa;
  });
  decode_attention_forward(ov, lv, qv, k.view(0, 0), v.view(0, 0), DecodeParams{.group = h / hkv, .scale = 1.0f});
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[0], 0.0f);
}

// Every way the kernel cuts a GQA group (units of 4, 2 and 1 query heads on one KV head), head
// sizes with and without a tail past whole vectors, a rank's slice of the query heads starting
// inside a group and of the KV heads from a later one, and row counts that leave a short last
// block (the prefetches a kilobyte ahead then run past the rows), Llama's head size 128 under GQA
// and many blocks at 32: each against float64.
TEST(CachedAttention, LocalKernelOverEveryGqaShapeEqualsFloat64) {
  struct Case {
    std::int64_t h, hkv, d, q_first, q_count, kv_first, rows;
  };
  const Case cases[] = {{8, 2, 64, 0, 8, 0, 3001},   {8, 8, 32, 0, 8, 0, 700},   {6, 2, 12, 0, 6, 0, 333},
                        {12, 2, 20, 0, 12, 0, 129},  {5, 1, 8, 0, 5, 0, 65},     {8, 2, 64, 2, 5, 0, 300},
                        {8, 4, 16, 3, 4, 1, 97},     {16, 2, 24, 9, 7, 1, 1000}, {4, 4, 3, 1, 2, 1, 7},
                        {8, 2, 128, 0, 8, 0, 1001},  {4, 4, 32, 0, 4, 0, 4099},  {16, 2, 128, 0, 16, 0, 1001},
                        {14, 2, 128, 0, 14, 0, 333}, {16, 1, 128, 3, 12, 0, 300}};
  for (const Case& c : cases) {
    const Rows q(7, 1, c.h, c.d), k(8, c.rows, c.hkv, c.d), v(9, c.rows, c.hkv, c.d);
    const std::int64_t group = c.h / c.hkv, held = (c.q_first + c.q_count - 1) / group - c.kv_first + 1;
    std::vector<float> out(static_cast<std::size_t>(c.q_count * c.d)), lse(static_cast<std::size_t>(c.q_count));
    const Shape rows{1, 1, c.q_count, c.d};
    const TensorView ov = TensorView::dense(out.data(), DType::f32, rows, Layout::bshd),
                     lv = TensorView::dense(lse.data(), DType::f32, {1, 1, c.q_count, 1}, Layout::bhsd),
                     qv = TensorView::dense(const_cast<float*>(q.at(0, c.q_first)), DType::f32, rows, Layout::bshd);
    TensorView kv = k.view(0, c.rows), vv = v.view(0, c.rows);
    for (TensorView* x : {&kv, &vv}) {  // the KV heads [kv_first, kv_first + held) of every row
      x->data = x->f32(0, 0, c.kv_first);
      x->shape.h = held;
    }
    const Tensor kh = head_major(kv), vh = head_major(vv);
    for_every_isa([&](const char* isa) {
      for (const bool cache_order : {false, true}) {
        decode_attention_forward(ov, lv, qv, cache_order ? kh.view() : kv, cache_order ? vh.view() : vv,
                                 DecodeParams{.q_first = c.q_first, .kv_first = c.kv_first, .group = group});
        EXPECT_LT(worst_error(q, k, v, 0, c.rows, out.data(), c.q_first, c.q_count), kTol)
            << isa << (cache_order ? " [h_kv, s, d]" : " [s, h_kv, d]") << " h " << c.h << " h_kv " << c.hkv << " d "
            << c.d << " heads from " << c.q_first << " rows " << c.rows;
      }
    });
  }
}

// The prefetch distance moves no bits: under each ISA level, a kilobyte and a block ahead give
// the same output and LSE (Llama's GQA at d 128 and MHA at d 32, short last blocks, so the block
// ahead runs past the rows).
TEST(CachedAttention, LocalKernelsPrefetchDistanceChangesNoBits) {
  for (const auto& [h, hkv, d, rows] : {std::array<std::int64_t, 4>{8, 2, 128, 1001}, {4, 4, 32, 4099}}) {
    const Rows q(7, 1, h, d), k(8, rows, hkv, d), v(9, rows, hkv, d);
    const Tensor kh = head_major(k.view(0, rows)), vh = head_major(v.view(0, rows));
    std::vector<float> got[2] = {std::vector<float>(std::size_t(h * (d + 1))),
                                 std::vector<float>(std::size_t(h * (d + 1)))};
    int i = 0;
    for_every_isa([&](const char* isa) {
      std::vector<float>& out = got[i++ % 2];
      const TensorView ov = TensorView::dense(out.data(), DType::f32, {1, 1, h, d}, Layout::bshd),
                       lv = TensorView::dense(out.data() + h * d, DType::f32, {1, 1, h, 1}, Layout::bhsd),
                       qv = TensorView::dense(const_cast<float*>(q.at(0, 0)), DType::f32, {1, 1, h, d}, Layout::bshd);
      decode_attention_forward(ov, lv, qv, kh.view(), vh.view(), DecodeParams{.group = h / hkv});
      if (i % 2 == 0) EXPECT_EQ(got[0], got[1]) << isa << " d " << d;  // bitwise: no NaN in either
    });
  }
}

// How many of a KV head's query heads one pass takes moves no bits: Llama-3-70B's group of 8 at
// d 128 (four pairs over each block under AVX-512) equals the same heads asked for two at a time.
TEST(CachedAttention, LocalKernelGroupOfEightEqualsItsPairsBitwise) {
  const std::int64_t h = 16, hkv = 2, d = 128, rows = 1001;
  const Rows q(7, 1, h, d), k(8, rows, hkv, d), v(9, rows, hkv, d);
  const Tensor kh = head_major(k.view(0, rows)), vh = head_major(v.view(0, rows));
  auto run = [&](std::int64_t first, std::int64_t count, float* out, float* lse) {
    const TensorView ov = TensorView::dense(out, DType::f32, {1, 1, count, d}, Layout::bshd),
                     lv = TensorView::dense(lse, DType::f32, {1, 1, count, 1}, Layout::bhsd),
                     qv = TensorView::dense(const_cast<float*>(q.at(0, first)), DType::f32, {1, 1, count, d},
                                            Layout::bshd);
    decode_attention_forward(ov, lv, qv, kh.view(), vh.view(), DecodeParams{.q_first = first, .group = h / hkv});
  };
  for_every_isa([&](const char* isa) {
    std::vector<float> whole(std::size_t(h * (d + 1))), pairs(whole.size());
    run(0, h, whole.data(), whole.data() + h * d);
    for (std::int64_t j = 0; j < h; j += 2) run(j, 2, pairs.data() + j * d, pairs.data() + h * d + j);
    EXPECT_EQ(whole, pairs) << isa;  // bitwise: no NaN in either
  });
}

// The rule the benchmark reports beside each shape (ulysses_bench --only decode): a block ahead
// only under the block distance and four query heads a KV head or more.
TEST(CachedAttention, ABlockAheadOnlyWhereAKvHeadServesFourHeadsOrMore) {
  const kernels::DecodePrefetch distance = kernels::decode_prefetch();
  kernels::force_decode_prefetch(kernels::DecodePrefetch::block);
  for (const std::int64_t group : {1, 2, 3, 4, 8, 16}) EXPECT_EQ(kernels::decode_prefetches_block(group), group >= 4);
  kernels::force_decode_prefetch(kernels::DecodePrefetch::kilobyte);
  for (const std::int64_t group : {1, 2, 4, 8}) EXPECT_FALSE(kernels::decode_prefetches_block(group));
  kernels::force_decode_prefetch(distance);
}

TEST(CachedAttention, LocalKernelRefusesHeadsItDoesNotHold) {
  const Rows q(4, 1, 4, 8), k(5, 10, 2, 8);
  std::vector<float> out(32), lse(4);
  const TensorView ov = TensorView::dense(out.data(), DType::f32, {1, 1, 4, 8}, Layout::bshd),
                   lv = TensorView::dense(lse.data(), DType::f32, {1, 1, 4, 1}, Layout::bhsd),
                   qv = TensorView::dense(const_cast<float*>(q.at(0, 0)), DType::f32, {1, 1, 4, 8}, Layout::bshd);
  // 4 query heads at group 1 need 4 KV heads: the cache holds 2.
  const std::string heads =
      test_util::error_of([&] { decode_attention_forward(ov, lv, qv, k.view(0, 10), k.view(0, 10), {}); });
  EXPECT_NE(heads.find("read KV heads [0, 3] of the 2 held"), std::string::npos) << heads;
  const std::string shape = test_util::error_of(
      [&] { decode_attention_forward(ov, lv, qv, k.view(0, 10), k.view(0, 9), DecodeParams{.group = 2}); });
  EXPECT_NE(shape.find("v must be [1, 10, 2, 8] like k"), std::string::npos) << shape;
}

}  // namespace
