// A soak: many rounds of forward + backward at the job's cp over a mix of strategies and
// shapes (causal and not, uneven sequence and heads, GQA, bf16, packed documents). After the
// first round, every later round gives bit-identical outputs and gradients, and the process's
// peak memory (RSS high-water mark) stops growing: nothing leaks, nothing accumulates in the
// allocator's pool, nothing depends on what ran before.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>

#include "mpi_helpers.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"

using namespace ulysses;

namespace {

struct Shape_ {
  std::int64_t s, h, hkv, d;
  bool causal;
  DType dtype;
  bool documents;
};

std::int64_t peak_rss_kb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// FNV-1a over a tensor's bytes.
std::uint64_t digest(const Tensor& t, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// One forward + backward of every valid configuration on every shape: a digest of the results.
std::uint64_t round_of(Communicator& comm, const std::vector<Shape_>& shapes) {
  const int cp = comm.size();
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const Shape_& x : shapes)
    for (const Strategy* strategy : strategies())
      for (CpConfig cfg : strategy->plan_configs(cp, x.causal)) {
        if (x.documents) cfg.cu_seqlens = {0, 1, x.s / 3, x.s / 3 + 7, x.s};
        try {
          validate_cp_config(cfg, cp, {1, x.s, x.h, x.d}, x.hkv);
        } catch (const Error&) {
          continue;  // e.g. fewer heads than an all-to-all group
        }
        const std::vector<SeqChunk> mine = rank_chunks(cfg, cp, comm.rank(), x.s);
        const std::int64_t n = total_tokens(mine);
        Tensor q({1, n, x.h, x.d}, x.dtype), k({1, n, x.hkv, x.d}, x.dtype), v(k.shape(), x.dtype);
        Tensor g(q.shape(), x.dtype), o(q.shape(), x.dtype), dq(q.shape(), x.dtype), dk(k.shape(), x.dtype),
            dv(k.shape(), x.dtype);
        for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&g, 4}})
          fill_uniform_shard(t->view(), std::uint64_t(seed), mine);
        ContextParallelAttention attn(comm, cfg);
        const CpContext ctx = attn.forward(o.view(), q.view(), k.view(), v.view());
        attn.backward(ctx, dq.view(), dk.view(), dv.view(), g.view());
        for (const Tensor* t : {&o, &dq, &dk, &dv}) h = digest(*t, h);
      }
  return h;
}

TEST(Soak, RoundsAreBitIdenticalAndMemoryStaysFlat) {
  MpiCommunicator comm;
  const int cp = comm.size();
  const std::vector<Shape_> shapes{{40 * cp + 3, 2 * cp, cp, 16, true, DType::f32, false},
                                   {24 * cp, 2 * cp + 1, 1, 32, false, DType::f32, false},
                                   {32 * cp + 1, 2 * cp, 2, 16, true, DType::bf16, false},
                                   {30 * cp + 5, 2 * cp, cp, 16, true, DType::f32, true}};
  const std::uint64_t first = round_of(comm, shapes);
  const std::int64_t warm = peak_rss_kb();
  for (int round = 1; round < 12; ++round) ASSERT_EQ(round_of(comm, shapes), first) << "round " << round;
  const std::int64_t grown = peak_rss_kb() - warm;
  if (comm.rank() == 0)
    std::printf("soak: 12 rounds at cp %d, peak RSS %lld KB after round 1, +%lld KB after all\n", cp, (long long)warm,
                (long long)grown);
  EXPECT_LE(grown, 1024) << "peak RSS grew by " << grown << " KB after the first round";
}

}  // namespace
