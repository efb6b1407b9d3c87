// The seed's claims 4 and 5, measured on rank 0 alone with every core: each rank's attention
// kernels replayed one rank at a time (the library's own chunks and head split, the ring's
// skipping of fully masked blocks), so oversubscribed ranks do not blur per-rank times.
#include "seed_kernels.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>

#include "bench.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"

namespace ulysses::seed {

namespace {

// Global q, k, v, dout, out and their gradients [1, s, h, d]: what the replayed calls slice.
struct Global {
  Tensor q, k, v, dout, out, dq, dk, dv;
  explicit Global(const Shape& s) : q(s), k(s), v(s), dout(s), out(s), dq(s), dk(s), dv(s) {
    fill_uniform(q.view(), 1);
    fill_uniform(k.view(), 2);
    fill_uniform(v.view(), 3);
    fill_uniform(dout.view(), 4);
  }
};

// One ring block: queries `a` against keys `c`, forward then backward, as ring_attention runs it.
void block_fwd_bwd(const Global& g, const SeqChunk& a, const SeqChunk& c, bool causal) {
  const AttentionParams p{causal, std::nullopt, a.begin, c.begin};
  const Tensor lse = lse_tensor({1, a.length, g.q.shape().h, g.q.shape().d});
  const TensorView q = rows(g.q.view(), a.begin, a.length), o = rows(g.out.view(), a.begin, a.length);
  const TensorView k = rows(g.k.view(), c.begin, c.length), v = rows(g.v.view(), c.begin, c.length);
  flash_attention_forward(o, lse.view(), q, k, v, p);
  flash_attention_backward(rows(g.dq.view(), a.begin, a.length), rows(g.dk.view(), c.begin, c.length),
                           rows(g.dv.view(), c.begin, c.length), rows(g.dout.view(), a.begin, a.length), q, k, v, o,
                           lse.view(), p);
}

// Rank r's ring work: its chunks against every member's visible chunks.
void ring_rank(const Global& g, const std::vector<std::vector<SeqChunk>>& chunks, int r) {
  for (const auto& theirs : chunks)
    for (const SeqChunk& a : chunks[std::size_t(r)])
      for (const SeqChunk& c : theirs)
        if (visible_pairs({}, true, a, c) > 0) block_fwd_bwd(g, a, c, true);
}

// Rank r's Ulysses work: its heads over the whole sequence.
void ulysses_rank(const Shape& s, int cp, int r) {
  const Global g({1, s.s, ulysses_heads(cp, r, s.h, s.h).q.count, s.d});
  block_fwd_bwd(g, {0, s.s}, {0, s.s}, true);
}

// Per-rank seconds of fn(rank), the best of `rounds` rounds that each run every rank once: on a
// shared machine other work only ever adds time, and round-robin spreads slow periods over
// all ranks instead of charging them to one.
std::vector<double> best_of_rounds(int ranks, int rounds, const std::function<void(int)>& fn) {
  std::vector<double> best(std::size_t(ranks), 1e300);
  for (int i = 0; i < rounds; ++i)
    for (int r = 0; r < ranks; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      fn(r);
      best[std::size_t(r)] =
          std::min(best[std::size_t(r)], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  return best;
}

}  // namespace

std::vector<BalanceRow> measure_balance(const Shape& s, const std::vector<int>& cps, int rounds) {
  const Global g(s);
  std::vector<BalanceRow> rows;
  for (int cp : cps)
    for (const char* layout : {"p2p contiguous", "p2p zigzag", "a2a"}) {
      const CpConfig cfg{
          layout[0] == 'a' ? "a2a" : "p2p", {}, true, std::nullopt, std::string(layout) != "p2p contiguous"};
      const bool ring = cfg.cp_comm_type == "p2p";
      const auto chunks = all_rank_chunks(cfg, cp, s.s);
      const auto rank_work = [&](int r) { ring ? ring_rank(g, chunks, r) : ulysses_rank(s, cp, r); };
      BalanceRow row{layout, cp, best_of_rounds(cp, rounds, rank_work), {}};
      for (int r = 0; r < cp; ++r) row.pairs.push_back(find_strategy(cfg.cp_comm_type).work(cfg, cp, r, s, s.s, s.h));
      rows.push_back(row);
    }
  return rows;
}

std::vector<KernelRow> measure_kernel_efficiency(const Shape& s, const std::vector<int>& cps, double min_seconds) {
  struct Case {
    std::size_t row;
    double KernelRow::*gflops;
    std::unique_ptr<Global> g;
    Tensor lse;
    double best = 1e300;
  };
  std::vector<KernelRow> rows;
  std::vector<Case> cases;
  for (int cp : cps) {
    rows.push_back({cp, 0, 0, 0});
    // The call each strategy makes: Ulysses [s, h/cp]; the ring [s/cp] x [s/cp], all h heads;
    // zigzag's half-chunks [s/2cp] x [s/2cp].
    for (auto [field, x] : {std::pair{&KernelRow::ulysses_gflops, Shape{1, s.s, s.h / cp, s.d}},
                            {&KernelRow::ring_gflops, Shape{1, s.s / cp, s.h, s.d}},
                            {&KernelRow::zigzag_gflops, Shape{1, s.s / (2 * cp), s.h, s.d}}})
      if (x.h >= 1 && x.s >= 1) cases.push_back({rows.size() - 1, field, std::make_unique<Global>(x), lse_tensor(x)});
  }
  // Rounds over every case: a slow period of the machine costs each case at most one round.
  for (int round = 0; round < 5; ++round)
    for (Case& c : cases) {
      const Global& g = *c.g;
      const auto call = [&] {
        flash_attention_forward(g.out.view(), c.lse.view(), g.q.view(), g.k.view(), g.v.view(), {});
      };
      c.best = std::min(c.best, bench::time_per_call(min_seconds, call));
    }
  for (const Case& c : cases) {
    const Shape x = c.g->q.shape();
    rows[c.row].*c.gflops = attention_forward_flops(1, x.s, x.s, x.h, x.d, false) / c.best * 1e-9;
  }
  return rows;
}

}  // namespace ulysses::seed
