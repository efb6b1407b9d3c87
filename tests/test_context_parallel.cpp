// Every strategy (a2a, p2p, all_gather, a2a+p2p at every factorisation) against the float64
// single-process reference at every rank count: forward and all gradients, batch > 1, both
// layouts, bf16, GQA split and replicated, MQA, sequences and head counts that do not divide
// by cp; exact byte and message counts of every rank; equal causal work per rank; the same
// clear error on every rank for every bad input; shards made on each rank and gathered back
// to one.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "kernels/engines.hpp"
#include "kernels/isa.hpp"
#include "mpi_helpers.hpp"
#include "test_util.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/cp/comm_volume.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/documents.hpp"
#include "ulysses/comm/local_communicator.hpp"
#include "ulysses/plan/planner.hpp"
#include "ulysses/kernels/reference_attention.hpp"
#include "ulysses/cp/sharding.hpp"
#if ULYSSES_TEST_CLI
#include "options.hpp"
#endif

using namespace ulysses;
using ulysses::testing::forward_backward_counted;
using ulysses::testing::select_rows;

namespace {

struct Case {
  std::int64_t b, sl;  // batch, tokens per rank
  int extra_tokens;    // s = sl·cp + extra_tokens: the first ranks (chunks) hold one more
  int heads_per_rank;
  int kv;  // KV heads: 0 means cp (split); otherwise that many
  std::int64_t d;
  bool causal;
  Layout layout;
  DType dtype;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "case"; }

std::string name_of(const Case& c) {
  return "b" + std::to_string(c.b) + "_sl" + std::to_string(c.sl) + "_x" + std::to_string(c.extra_tokens) + "_hpr" +
         std::to_string(c.heads_per_rank) + "_kv" + (c.kv == 0 ? std::string("cp") : std::to_string(c.kv)) + "_d" +
         std::to_string(c.d) + (c.causal ? "_causal_" : "_full_") + to_string(c.layout) + "_" + to_string(c.dtype);
}

// Every configuration of every registered strategy at this cp (a2a+p2p at each
// factorisation, and any strategy a test registers, such as toy_strategy.cpp's).
std::vector<CpConfig> strategies(int cp, bool causal) {
  std::vector<CpConfig> out;
  for (const Strategy* s : ulysses::strategies())
    for (const CpConfig& c : s->plan_configs(cp, causal)) out.push_back(c);
  return out;
}

std::string describe(const CpConfig& c) { return find_strategy(c.cp_comm_type).config_name(c); }

// Bytes or messages of counter `op` (0 when this rank never used it).
std::int64_t bytes(const std::map<std::string, CommCounter>& m, const std::string& op) {
  auto it = m.find(op);
  return it == m.end() ? std::int64_t(0) : it->second.bytes_sent;
}
std::int64_t msgs(const std::map<std::string, CommCounter>& m, const std::string& op) {
  auto it = m.find(op);
  return it == m.end() ? std::int64_t(0) : it->second.messages;
}

// Every counter of one forward and backward equals the strategy's traffic() on cp ranks, and
// nothing else was sent (but the validation's all-gathers). Each counter's calls are what its
// declared transfer makes of its messages: what the benchmark's replay runs.
void expect_traffic(const ulysses::testing::SentCounters& sent, const CommVolume& predicted, int cp) {
  for (const auto& [op, n] : predicted.forward_bytes) EXPECT_EQ(bytes(sent.fwd, op), n) << op;
  for (const auto& [op, n] : predicted.backward_bytes) EXPECT_EQ(bytes(sent.bwd, op), n) << op;
  for (const auto& [counted, messages] :
       {std::pair{&sent.fwd, &predicted.forward_messages}, std::pair{&sent.bwd, &predicted.backward_messages}})
    for (const auto& [op, n] : *messages) {
      EXPECT_EQ(msgs(*counted, op), n) << op;
      ASSERT_TRUE(predicted.transfers.count(op)) << op << " has no transfer";
      const Transfer& t = predicted.transfers.at(op);
      const auto c = counted->find(op);  // a group of one calls, sending nothing
      if (n > 0) EXPECT_EQ(c == counted->end() ? 0 : c->second.calls, t.calls(n, predicted.members(t, cp))) << op;
    }
  for (const auto& [op, c] : sent.fwd) EXPECT_TRUE(op.ends_with("validate") || predicted.forward_bytes.count(op)) << op;
  for (const auto& [op, c] : sent.bwd)
    EXPECT_TRUE(op.ends_with("validate") || predicted.backward_bytes.count(op)) << op;
}

// The strategy's own error for this shape, or "" (the same on every rank: no collective).
std::string config_error(const CpConfig& cfg, int cp, const Shape& q, std::int64_t kv_heads) {
  try {
    validate_cp_config(cfg, cp, q, kv_heads);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A global attention problem (in the storage dtype) and its float64 answers, computed once
// for every strategy that runs it.
struct GlobalProblem {
  Tensor q, k, v, dout;
  RefTensor out, dq, dk, dv;
  bool causal;
  GlobalProblem(Shape global, std::int64_t kv_heads, DType dtype, bool causal_mask, std::uint64_t seed,
                std::vector<std::int64_t> cu_seqlens = {}, void (*edit)(GlobalProblem&) = nullptr, Window window = {})
      : q(global, dtype), k({global.b, global.s, kv_heads, global.d}, dtype), v(k.shape(), dtype), dout(global, dtype),
        causal(causal_mask) {
    for (auto [t, i] : {std::pair{&q, 0}, {&k, 1}, {&v, 2}, {&dout, 3}})
      fill_uniform(t->view(), seed + std::uint64_t(i));
    if (edit != nullptr) edit(*this);
    const RefTensor rq = RefTensor::from(q.view()), rk = RefTensor::from(k.view()), rv = RefTensor::from(v.view());
    const AttentionParams p{causal, std::nullopt, 0, 0, std::move(cu_seqlens), window.left, window.right};
    std::vector<double> lse;
    reference_attention_forward(out, lse, rq, rk, rv, p);
    reference_attention_backward(dq, dk, dv, RefTensor::from(dout.view()), rq, rk, rv, p);
  }
};

// One rank's shards of a global problem under one configuration (its own token count), its
// outputs, and the reference's rows for them.
struct Problem {
  Tensor q, k, v, dout, out, dq, dk, dv;
  RefTensor rout, rdq, rdk, rdv;
  Problem(const GlobalProblem& g, const CpConfig& cfg, int cp, int rank, Layout layout) {
    const auto chunks = rank_chunks(cfg, cp, rank, g.q.shape().s);
    const DType dtype = g.q.dtype();
    for (auto [local, global] : {std::pair{&q, &g.q}, {&k, &g.k}, {&v, &g.v}, {&dout, &g.dout}})
      *local = shard_of(global->view(), chunks, dtype, layout);
    for (auto [grad, like] : {std::pair{&out, &q}, {&dq, &q}, {&dk, &k}, {&dv, &k}})
      *grad = Tensor(like->shape(), dtype, layout);
    const std::vector<std::int64_t> pos = token_positions(chunks);
    rout = select_rows(g.out, pos);
    rdq = select_rows(g.dq, pos);
    rdk = select_rows(g.dk, pos);
    rdv = select_rows(g.dv, pos);
  }
  void run(ContextParallelAttention& attn) {
    const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
    attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
  }
  void expect_matches(double tol_out = 1e-5, double tol_grad = 1e-4) const {
    EXPECT_LT(relative_error(out.view(), rout), tol_out);
    EXPECT_LT(relative_error(dq.view(), rdq), tol_grad);
    EXPECT_LT(relative_error(dk.view(), rdk), tol_grad);
    EXPECT_LT(relative_error(dv.view(), rdv), tol_grad);
  }
  // At the tolerances of dtype's kernels.
  void expect_matches(DType dtype) const {
    if (dtype == DType::f32)
      expect_matches();
    else
      expect_matches(1e-2, 2.5e-2);
  }
};

// Collective: the visible (query, key) pairs every rank computed in ctx's forward, summed.
double summed_pairs(Communicator& comm, const CpContext& ctx) {
  double total = double(ctx.stats().score_pairs);
  comm.allreduce_sum(&total, 1);
  return total;
}

class StrategyTest : public ::testing::TestWithParam<Case> {};

COMM_TEST_P(StrategyTest, EveryStrategyMatchesFloat64Reference) {
  const Case c = GetParam();
  const int cp = comm.size();
  const std::int64_t h = std::int64_t(c.heads_per_rank) * cp, hkv = c.kv == 0 ? cp : c.kv;
  const GlobalProblem global({c.b, c.sl * cp + c.extra_tokens, h, c.d}, hkv, c.dtype, c.causal, 1);
  const double tol_out = c.dtype == DType::f32 ? 1e-5 : 1e-2;
  const double tol_grad = c.dtype == DType::f32 ? 1e-4 : 2.5e-2;
  for (const CpConfig& cfg : strategies(cp, c.causal)) {
    SCOPED_TRACE(describe(cfg));
    Problem p(global, cfg, cp, comm.rank(), c.layout);
    ContextParallelAttention attn(comm, cfg);
    p.run(attn);
    p.expect_matches(tol_out, tol_grad);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, StrategyTest,
    ::testing::Values(Case{1, 8, 0, 1, 0, 8, false, Layout::bshd, DType::f32},
                      Case{2, 12, 0, 2, 0, 16, true, Layout::bshd, DType::f32},    // batch > 1
                      Case{2, 12, 0, 2, 0, 16, true, Layout::sbhd, DType::f32},    // seq-first
                      Case{2, 10, 0, 2, 1, 16, true, Layout::bshd, DType::f32},    // MQA
                      Case{1, 8, 0, 4, 2, 8, true, Layout::bshd, DType::f32},      // GQA, 2 KV heads
                      Case{1, 70, 0, 2, 0, 32, true, Layout::bshd, DType::f32},    // crosses a kernel block
                      Case{2, 12, 0, 2, 1, 16, false, Layout::sbhd, DType::bf16},  // bf16, MQA
                      Case{1, 16, 0, 1, 0, 64, true, Layout::bshd, DType::bf16},
                      // s % cp != 0 (and s % 2cp != 0 under zigzag): ranks hold different counts
                      Case{1, 1, 1, 1, 0, 8, false, Layout::bshd, DType::f32},    // s = cp + 1
                      Case{2, 2, 0, 2, 0, 8, true, Layout::bshd, DType::f32},     // s = 2cp: zigzag chunks of 1
                      Case{2, 2, 1, 2, 1, 16, true, Layout::sbhd, DType::f32},    // s = 2cp + 1, MQA
                      Case{1, 5, 1, 4, 2, 8, true, Layout::bshd, DType::f32},     // s = 5cp + 1, GQA
                      Case{2, 7, 3, 1, 0, 16, false, Layout::sbhd, DType::bf16},  // bf16
                      Case{1, 70, 1, 2, 0, 32, true, Layout::bshd, DType::f32}),  // crosses a kernel block
    [](const auto& info) { return name_of(info.param); });

COMM_TEST(Ulysses, OddTokensPerRankWithoutZigzag) {
  // a2a never zigzags, so s/cp may be odd even under a causal mask.
  const int cp = comm.size();
  const std::int64_t sl = 9, s = sl * cp, h = 2 * cp, d = 8;
  Tensor gq({1, s, h, d}), q({1, sl, h, d}), out(q.shape());
  fill_uniform(gq.view(), 5);
  const CpConfig cfg{"a2a", {}, true, std::nullopt};
  const auto chunks = rank_chunks(cfg, cp, comm.rank(), s);
  shard_sequence(gq.view(), q.view(), chunks);
  ContextParallelAttention attn(comm, cfg);
  (void)attn.forward(out.view(), q.view(), q.view(), q.view());
  const RefTensor rq = RefTensor::from(gq.view());
  RefTensor rout;
  std::vector<double> lse;
  reference_attention_forward(rout, lse, rq, rq, rq, {true, std::nullopt, 0, 0});
  EXPECT_LT(relative_error(out.view(), select_rows(rout, token_positions(chunks))), 1e-5);
}

// Collectives this rank entered in `run` that are not transfers (counted operations but the
// validation's): what synchronises the ranks on top of the data the strategy moves.
template <class Run>
std::int64_t small_collectives(Communicator& comm, Run run) {
  comm.reset_counters();
  const std::int64_t before = comm.collectives();
  run();
  std::int64_t transfers = 0;
  for (const auto& [op, c] : comm.counters())
    if (!op.ends_with("validate")) transfers += c.calls;
  return comm.collectives() - before - transfers;
}

// ContextParallelAttention validates and agrees in one small all-gather (the backward in one
// all-reduce); the Ulysses strategy trusts what it is handed, so every other collective of its
// forward and backward is one of its all-to-alls: one each way per chunk of heads.
COMM_TEST(Ulysses, OneSmallCollectiveBeforeTheAllToAlls) {
  const int cp = comm.size();
  const GlobalProblem g({2, 6 * cp + 1, 4 * cp, 8}, 2 * cp, DType::f32, true, 17);
  for (const int chunks : {1, 2}) {
    CpConfig cfg{"a2a", {}, true, std::nullopt};
    cfg.overlap_chunks = chunks;
    Problem p(g, cfg, cp, comm.rank(), Layout::bshd);
    ContextParallelAttention attn(comm, cfg);
    CpContext ctx;
    EXPECT_EQ(small_collectives(comm, [&] { ctx = attn.forward(p.out.view(), p.q.view(), p.k.view(), p.v.view()); }),
              1);
    EXPECT_EQ(comm.counters().count("seq_to_head") ? comm.counters().at("seq_to_head").calls : 0, cp == 1 ? 0 : chunks);
    EXPECT_EQ(small_collectives(comm,
                                [&] { attn.backward(ctx, p.dq.view(), p.dk.view(), p.dv.view(), p.dout.view()); }),
              1);
    EXPECT_EQ(comm.counters().count("head_to_seq") ? comm.counters().at("head_to_seq").calls : 0, cp == 1 ? 0 : chunks);
    p.expect_matches();
  }
}

// A rank whose inputs failed a caller's own checks (the Python module's) joins the forward's
// one agreement through refuse_forward: every rank throws that rank's error, no rank waits, and
// the caller's checks cost no collective of their own.
COMM_TEST(Ulysses, ARefusedForwardIsOneErrorOnEveryRank) {
  const int cp = comm.size(), last = cp - 1;
  const GlobalProblem g({1, 4 * cp, 2 * cp, 8}, 2 * cp, DType::f32, true, 5);
  CpConfig cfg{"a2a", {}, true, std::nullopt};
  Problem p(g, cfg, cp, comm.rank(), Layout::bshd);
  ContextParallelAttention attn(comm, cfg);
  const std::int64_t before = comm.collectives();
  const std::string err = test_util::error_of([&] {
    if (comm.rank() == last) attn.refuse_forward("q has dtype torch.float16");
    (void)attn.forward(p.out.view(), p.q.view(), p.k.view(), p.v.view());
  });
  EXPECT_EQ(err, cp > 1 ? fmt::format("rank {}: q has dtype torch.float16", last) : "q has dtype torch.float16");
  EXPECT_EQ(comm.collectives() - before, 4);  // the all-gather; the error: an all-reduce, two broadcasts
}

// Head counts that do not divide by cp (or by the inner size of a2a+p2p): whole GQA groups
// per rank, or KV heads shared by the ranks splitting their group (also when cp % h_kv != 0),
// with an uneven sequence too. A2a (inner) groups larger than h are refused everywhere.
COMM_TEST(Strategies, UnevenHeadSplitsMatchFloat64Reference) {
  const int cp = comm.size();
  for (auto [h, hkv] : {std::pair<std::int64_t, std::int64_t>{6, 6}, {6, 3}, {6, 1}, {12, 3}, {5, 5}})
    for (bool causal : {false, true}) {
      const GlobalProblem global({1, 3 * cp + 1, h, 8}, hkv, DType::f32, causal, 5);
      for (const CpConfig& cfg : strategies(cp, causal)) {
        SCOPED_TRACE(describe(cfg) + " h " + std::to_string(h) + " h_kv " + std::to_string(hkv));
        Problem p(global, cfg, cp, comm.rank(), Layout::bshd);
        ContextParallelAttention attn(comm, cfg);
        const std::string err = config_error(cfg, cp, global.q.shape(), hkv);
        if (!err.empty()) {
          EXPECT_NE(err.find("must be at least"), std::string::npos) << err;
          ulysses::testing::expect_same_error_everywhere(
              comm, [&] { p.run(attn); }, err);
          continue;
        }
        p.run(attn);
        p.expect_matches();
      }
    }
}

// Packed documents (cu_seqlens) of every awkward kind, every strategy, forward and gradients:
// lengths 1 and prime, an empty document, one longer than a shard, one inside a shard,
// boundaries exactly on every chunk boundary of the strategy's (plain zigzag) layout, and
// documents shorter than 2·cp; the ring strategies in per-document zigzag and in plain zigzag;
// the work counted is exactly the documents' visible pairs.
std::vector<std::vector<std::int64_t>> document_sets(const CpConfig& cfg, int cp, std::int64_t s) {
  std::vector<std::int64_t> on_chunks{0};
  for (const auto& chunks : all_rank_chunks(cfg, cp, s))
    for (const SeqChunk& c : chunks) on_chunks.push_back(c.begin + c.length);
  std::sort(on_chunks.begin(), on_chunks.end());
  const std::int64_t long_doc = s / 2;
  const std::int64_t two_cp = 2 * std::int64_t(cp);
  return {cu_seqlens_of(std::vector<std::int64_t>{1, 0, 5, 13, long_doc, s - 19 - long_doc}),
          on_chunks,
          {0, s / 3, s / 3 + 1, s},
          cu_seqlens_of(std::vector<std::int64_t>{2, two_cp - 1, 1, two_cp + 1, 3, s - 3 * two_cp - 5, two_cp - 1})};
}

// `base` and, when documents make it per-document zigzag, the same in plain zigzag.
std::vector<CpConfig> with_plain_zigzag(const CpConfig& base) {
  if (token_layout(base) != TokenLayout::per_document) return {base};
  CpConfig plain = base;
  plain.per_document = false;
  return {base, plain};
}

// The strategies that run each document set: the float64 reference of a set is computed once for
// all of them (every rank computes it whole; at 8 ranks on 2 cores it was most of the test's time).
std::map<std::vector<std::int64_t>, std::vector<CpConfig>> strategies_by_documents(int cp, bool causal,
                                                                                   std::int64_t s) {
  std::map<std::vector<std::int64_t>, std::vector<CpConfig>> by_documents;
  for (const CpConfig& base : strategies(cp, causal))
    for (const std::vector<std::int64_t>& cu : document_sets(base, cp, s)) by_documents[cu].push_back(base);
  return by_documents;
}

COMM_TEST(Documents, EveryStrategyMatchesFloat64Reference) {
  const int cp = comm.size();
  const std::int64_t s = 12 * cp + 29, h = 2 * cp;
  for (bool causal : {true, false})
    for (const auto& [cu, bases] : strategies_by_documents(cp, causal, s))
      for (auto [hkv, dtype] : {std::pair{h, DType::f32}, {std::int64_t(1), DType::f32}, {h / 2, DType::bf16}}) {
        if (hkv < 1) continue;
        const GlobalProblem global({1, s, h, 16}, hkv, dtype, causal, 7, cu);
        for (const CpConfig& base : bases) {
          CpConfig with_documents = base;
          with_documents.cu_seqlens = cu;
          for (const CpConfig& cfg : with_plain_zigzag(with_documents)) {
            SCOPED_TRACE(fmt::format("{} ({}) h_kv {} {} cu_seqlens [{}]", describe(cfg),
                                     layout_name(token_layout(cfg)), hkv, to_string(dtype), fmt::join(cu, ",")));
            Problem p(global, cfg, cp, comm.rank(), Layout::bshd);
            ContextParallelAttention attn(comm, cfg);
            const CpContext ctx = attn.forward(p.out.view(), p.q.view(), p.k.view(), p.v.view());
            attn.backward(ctx, p.dq.view(), p.dk.view(), p.dv.view(), p.dout.view());
            p.expect_matches(dtype);
            EXPECT_EQ(summed_pairs(comm, ctx), double(h * visible_pairs(cu, causal, {0, s}, {0, s})));
            // What the planner predicts for this rank is what it computed.
            EXPECT_EQ(ctx.stats().score_pairs,
                      find_strategy(cfg.cp_comm_type).work(cfg, cp, comm.rank(), {1, s, h, 16}, s, hkv));
          }
        }
      }
}

// Changing one document's inputs leaves every other token's output and gradients bit for bit
// as they were, in every strategy: nothing crosses a boundary, also not through the ring's
// merges or the all-to-alls.
COMM_TEST(Documents, NothingLeaksAcrossABoundary) {
  const int cp = comm.size();
  const std::int64_t s = 10 * cp + 3, h = 2 * cp;
  const std::vector<std::int64_t> cu{0, 3, s / 2, s / 2 + 4, s};
  auto perturb = [](GlobalProblem& g) {  // document 1: positions [3, s/2)
    const std::int64_t row = g.q.shape().h * g.q.shape().d, end = g.q.shape().s / 2;
    for (Tensor* t : {&g.q, &g.k, &g.v, &g.dout})
      for (std::int64_t i = 3 * row; i < end * row; ++i) t->f32()[i] = -t->f32()[i] + 0.25f;
  };
  const GlobalProblem plain({1, s, h, 8}, h, DType::f32, true, 3, cu),
      changed({1, s, h, 8}, h, DType::f32, true, 3, cu, perturb);
  for (const CpConfig& base : strategies(cp, true)) {
    CpConfig cfg = base;
    cfg.cu_seqlens = cu;
    SCOPED_TRACE(describe(cfg));
    Problem a(plain, cfg, cp, comm.rank(), Layout::bshd), b(changed, cfg, cp, comm.rank(), Layout::bshd);
    ContextParallelAttention attn(comm, cfg);
    a.run(attn);
    b.run(attn);
    a.expect_matches();
    b.expect_matches();
    const std::vector<std::int64_t> pos = token_positions(rank_chunks(cfg, cp, comm.rank(), s));
    for (std::size_t i = 0; i < pos.size(); ++i) {
      if (pos[i] >= 3 && pos[i] < s / 2) continue;
      for (auto [x, y] : {std::pair{&a.out, &b.out}, {&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}}) {
        const std::size_t row = std::size_t(x->shape().h * x->shape().d);
        ASSERT_EQ(0, std::memcmp(x->f32() + i * row, y->f32() + i * row, row * sizeof(float)))
            << "position " << pos[i] << " changed";
      }
    }
  }
}

// Per-document zigzag under sliding windows (the halo exchange, every member asked) and
// without (the ring), with documents shorter than 2·cp, GQA and MQA: forward and gradients
// against float64, the work counted exactly, and every counter equal to traffic().
COMM_TEST(Documents, PerDocumentZigzagWithWindowsMatchesFloat64AndItsTraffic) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t s = 10 * cp + 7, h = 2 * cp, d = 8;
  const std::vector<std::int64_t> cu = cu_seqlens_of(std::vector<std::int64_t>{1, 2 * cp - 1, 3, s - 2 * cp - 9, 5});
  for (const Window window : {Window{}, Window{0, -1}, Window{3, -1}, Window{2 * cp + 1, -1}})
    for (std::int64_t hkv : {h, std::int64_t(1)}) {
      const GlobalProblem global({1, s, h, d}, hkv, DType::f32, true, 11, cu, nullptr, window);
      const AttentionParams whole{true, std::nullopt, 0, 0, cu, window.left, window.right};
      for (CpConfig cfg : strategies(cp, true)) {
        cfg.cu_seqlens = cu;
        cfg.window_left = window.left;
        if (token_layout(cfg) != TokenLayout::per_document) continue;
        SCOPED_TRACE(fmt::format("{} window {} h_kv {}", describe(cfg), window.left, hkv));
        if (!config_error(cfg, cp, global.q.shape(), hkv).empty()) continue;  // heads for the inner a2a
        Problem p(global, cfg, cp, me, Layout::bshd);
        ContextParallelAttention attn(comm, cfg);
        p.run(attn);  // creates sub-communicators first
        std::pair<CpStats, CpStats> stats;
        const auto sent = forward_backward_counted(comm, attn, p, &stats);
        p.expect_matches();
        double total = double(stats.first.score_pairs);
        comm.allreduce_sum(&total, 1);
        EXPECT_EQ(total, double(h * visible_pairs(whole, {0, s}, {0, s})));
        EXPECT_EQ(stats.first.score_pairs, find_strategy(cfg.cp_comm_type).work(cfg, cp, me, {1, s, h, d}, s, hkv));
        expect_traffic(sent, predicted_comm_volume(cfg, cp, me, {1, s, h, d}, hkv, DType::f32), cp);
      }
    }
}

// The option on a strategy that does not declare it, and values it does not take: the same
// error on every rank, before any data moves.
COMM_TEST(Errors, PerDocumentOptionIsRefusedWhereItMeansNothing) {
  const int cp = comm.size();
  const std::int64_t s = 4 * cp;
  for (const char* type : {"a2a", "all_gather"}) {
    CpConfig cfg{type, {}, true, std::nullopt};
    cfg.cu_seqlens = {0, 1, s};
    cfg.per_document = false;
    Tensor q({1, total_tokens(rank_chunks(cfg, cp, comm.rank(), s)), 2 * cp, 8}), out(q.shape());
    ContextParallelAttention attn(comm, cfg);
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); },
        fmt::format("per_document must be 1 for cp_comm_type {} (an option of p2p), got 0", type));
  }
  const StrategyOption option = find_strategy("p2p").options().at(0);
  CpConfig cfg{"p2p", {}, true, std::nullopt};
  EXPECT_EQ(test_util::error_of([&] { set_option(option, cfg, {2}); }),
            "per_document must be 0|1 (an integer in [0, 1]), got [2]");
  set_option(option, cfg, {0});
  EXPECT_FALSE(cfg.per_document);
}

COMM_TEST(Errors, BadDocumentsAreRefusedEverywhereBeforeAnyData) {
  const int cp = comm.size();
  const std::int64_t s = 4 * cp;
  for (auto [cu, b, needle] : {std::tuple{std::vector<std::int64_t>{1, s}, 1, "must start at 0"},
                               {std::vector<std::int64_t>{0, 3, 2, s}, 1, "cu_seqlens[2] = 2 after 3"},
                               {std::vector<std::int64_t>{0, s - 1}, 1, "must end at the sequence length"},
                               {std::vector<std::int64_t>{0, s}, 2, "needs batch 1"}}) {
    CpConfig cfg{"p2p", {}, true, std::nullopt, true, cu};
    const CpConfig one_document{"p2p", {}, true, std::nullopt};  // bad documents have no layout
    Tensor q({b, total_tokens(rank_chunks(one_document, cp, comm.rank(), s)), cp, 8}), out(q.shape());
    ContextParallelAttention attn(comm, cfg);
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); }, needle);
  }
}

// Sliding windows (FlashAttention's window_size) in every strategy, both layouts, GQA/MQA, f32
// and bf16: forward and gradients against the float64 reference, the work counted exactly (the
// planner's Strategy::work), and the bytes and messages of every counter equal to traffic():
// the ring's halo exchange included. Windows 0, 1, around a chunk, wider than s, right windows,
// one side unbounded (the ring with a kernel mask), and sides near INT64_MAX (saturated).
COMM_TEST(Windows, EveryStrategyMatchesFloat64ReferenceAndItsTraffic) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t s = 12 * cp + 5, h = 2 * cp, d = 8, max = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::pair<bool, Window>> masks{{true, {0, -1}},  {true, {1, -1}},   {true, {5, -1}},
                                                   {true, {12, -1}}, {true, {30, -1}},  {true, {s + 9, -1}},
                                                   {false, {3, 2}},  {false, {0, 0}},   {false, {20, -1}},
                                                   {false, {-1, 4}}, {true, {max, -1}}, {false, {max - 1, max}},
                                                   {false, {2, max}}};
  for (const auto& [causal, window] : masks)
    for (auto [hkv, dtype] : {std::pair{h, DType::f32}, {std::int64_t(1), DType::bf16}}) {
      const GlobalProblem global({1, s, h, d}, hkv, dtype, causal, 9, {}, nullptr, window);
      const AttentionParams whole{causal, std::nullopt, 0, 0, {}, window.left, window.right};
      for (const CpConfig& base : strategies(cp, causal))
        for (bool zigzag : {true, false}) {
          if (!causal && !zigzag) continue;  // contiguous either way
          CpConfig cfg = base;
          cfg.zigzag = zigzag;
          cfg.window_left = window.left;
          cfg.window_right = window.right;
          SCOPED_TRACE(fmt::format("{}{} causal {} window ({}, {}) h_kv {} {}", describe(cfg),
                                   zigzag ? "" : " contiguous", causal, window.left, window.right, hkv,
                                   to_string(dtype)));
          Problem p(global, cfg, cp, me, Layout::bshd);
          ContextParallelAttention attn(comm, cfg);
          if (const std::string err = config_error(cfg, cp, global.q.shape(), hkv); !err.empty()) {
            EXPECT_NE(err.find("does not support a sliding window"), std::string::npos) << err;
            ulysses::testing::expect_same_error_everywhere(
                comm, [&] { p.run(attn); }, err);
            continue;
          }
          p.run(attn);  // creates sub-communicators first
          comm.reset_counters();
          const CpContext ctx = attn.forward(p.out.view(), p.q.view(), p.k.view(), p.v.view());
          const auto fwd = comm.counters();
          comm.reset_counters();
          attn.backward(ctx, p.dq.view(), p.dk.view(), p.dv.view(), p.dout.view());
          const auto bwd = comm.counters();
          p.expect_matches(dtype);
          EXPECT_EQ(summed_pairs(comm, ctx), double(h * visible_pairs(whole, {0, s}, {0, s})));
          EXPECT_EQ(ctx.stats().score_pairs, find_strategy(cfg.cp_comm_type).work(cfg, cp, me, {1, s, h, d}, s, hkv));
          expect_traffic({fwd, bwd}, predicted_comm_volume(cfg, cp, me, {1, s, h, d}, hkv, dtype), cp);
        }
    }
}

// The halo written out: contiguous chunks of 16 tokens under a causal window of 5, so rank r
// sends its last 5 rows of K/V to rank r + 1 (one message), which sends their float32 dK/dV
// back, instead of cp − 1 ring steps; a window of 20 reaches two ranks back.
COMM_TEST(Windows, RingSendsOnlyTheHalo) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t sl = 16, s = sl * cp, h = 2, hkv = 1, d = 8, kv_row = 2 * hkv * d;
  for (std::int64_t w : {5, 20}) {
    const CpConfig cfg{"p2p", {}, true, std::nullopt, false, {}, w, -1};
    SCOPED_TRACE("window " + std::to_string(w));
    const GlobalProblem global({1, s, h, d}, hkv, DType::bf16, true, 4, {}, nullptr, {w, -1});
    Problem p(global, cfg, cp, me, Layout::bshd);
    ContextParallelAttention attn(comm, cfg);
    const auto [fwd, bwd] = forward_backward_counted(comm, attn, p);
    p.expect_matches(1e-2, 2.5e-2);
    // Rows to rank me + k (k = 1, 2): min(w, sl) and the rest; the same from rank me − k.
    std::int64_t given = 0, to = 0, held = 0, from = 0;
    for (int k = 1; k <= 2; ++k)
      if (const std::int64_t n = std::clamp<std::int64_t>(w - (k - 1) * sl, 0, sl); n > 0) {
        if (me + k < cp) given += n, ++to;
        if (me - k >= 0) held += n, ++from;
      }
    EXPECT_EQ(bytes(fwd, "p2p_kv"), given * kv_row * 2);
    EXPECT_EQ(msgs(fwd, "p2p_kv"), to);
    EXPECT_EQ(bytes(bwd, "p2p_kv"), 0);
    EXPECT_EQ(bytes(bwd, "p2p_dkv"), held * kv_row * 4);
    EXPECT_EQ(msgs(bwd, "p2p_dkv"), from);
  }
}

COMM_TEST(Errors, NegativeWindowsAreRefusedEverywhere) {
  const int cp = comm.size();
  for (const CpConfig& base : strategies(cp, true)) {
    CpConfig cfg = base;
    cfg.window_left = -3;
    Tensor q({1, total_tokens(rank_chunks(cfg, cp, comm.rank(), 4 * cp)), 2 * cp, 8}), out(q.shape());
    ContextParallelAttention attn(comm, cfg);
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); },
        "window_left must be -1 (unbounded) or >= 0, got -3");
  }
}

COMM_TEST(Errors, NonFiniteAndNonPositiveScalesAreRefusedEverywhere) {
  const int cp = comm.size();
  for (const CpConfig& base : strategies(cp, true))
    for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(), -1.0f, 0.0f}) {
      CpConfig cfg = base;
      cfg.scale = bad;
      Tensor q({1, total_tokens(rank_chunks(cfg, cp, comm.rank(), 4 * cp)), 2 * cp, 8}), out(q.shape());
      ContextParallelAttention attn(comm, cfg);
      ulysses::testing::expect_same_error_everywhere(
          comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); },
          fmt::format("scale must be finite and > 0 (unset: 1/sqrt(head_dim)), got {}", bad));
    }
}

// Which heads the all-to-all strategies give each rank: the worked examples at cp = 4.
TEST(Strategies, HeadsPerRankFollowTheGqaGroups) {
  const Strategy& a2a = find_strategy("a2a");
  auto counts = [&](std::int64_t h, std::int64_t hkv) {
    std::vector<std::int64_t> q, kv;
    for (int r = 0; r < 4; ++r) {
      const RankHeads mine = a2a.heads_of(CpConfig{}, 4, r, h, hkv);
      q.push_back(mine.q.count);
      kv.push_back(mine.kv.count);
    }
    return std::pair{q, kv};
  };
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(counts(6, 6), std::pair(V{2, 2, 1, 1}, V{2, 2, 1, 1}));
  EXPECT_EQ(counts(6, 3), std::pair(V{1, 1, 2, 2}, V{1, 1, 1, 1}));  // KV head 0 shared by ranks 0 and 1
  EXPECT_EQ(counts(6, 1), std::pair(V{2, 2, 1, 1}, V{1, 1, 1, 1}));
  EXPECT_EQ(counts(8, 2), std::pair(V{2, 2, 2, 2}, V{1, 1, 1, 1}));  // even: the seed's split
  // a2a+p2p [2, 2]: ranks 0, 1 and 2, 3 split like an a2a over 2; p2p computes every head.
  const CpConfig hier{"a2a+p2p", {2, 2}, false, std::nullopt};
  EXPECT_EQ(find_strategy("a2a+p2p").heads_of(hier, 4, 3, 5, 5).q, (HeadRange{3, 2}));
  EXPECT_EQ(find_strategy("p2p").heads_of(CpConfig{"p2p", {}, false, std::nullopt}, 4, 3, 6, 3).q, (HeadRange{0, 6}));
}

// What the CLI does with every input and output: shards cut from a global tensor or drawn in
// place, gathered back to rank 0, are the global tensor bit for bit (rounded to the shards'
// dtype), for contiguous and zigzag chunks, even and uneven, both layouts and both dtypes.
COMM_TEST(Sharding, GatheringShardsGivesTheGlobalTensorBack) {
  const int cp = comm.size(), rank = comm.rank();
  for (const Shape g : {Shape{2, 4 * cp, 3, 8}, Shape{2, 4 * cp + 2 * cp - 1, 3, 8}}) {  // even, uneven
    Tensor global(g);
    fill_uniform(global.view(), 7);
    for (const CpConfig& cfg : {CpConfig{"a2a", {}, true, std::nullopt}, CpConfig{"p2p", {}, true, std::nullopt}})
      for (DType dtype : {DType::f32, DType::bf16})
        for (Layout layout : {Layout::bshd, Layout::sbhd}) {
          SCOPED_TRACE(describe(cfg) + " " + to_string(dtype) + " " + to_string(layout));
          std::vector<std::vector<SeqChunk>> chunks;
          for (int r = 0; r < cp; ++r) chunks.push_back(rank_chunks(cfg, cp, r, g.s));
          const Tensor expected = copy_of(copy_of(global.view(), dtype).view(), DType::f32);
          const Tensor cut = shard_of(global.view(), chunks[std::size_t(rank)], dtype, layout);
          Tensor drawn(cut.shape(), dtype, layout);
          fill_uniform_shard(drawn.view(), 7, chunks[std::size_t(rank)]);
          for (const auto& [name, shard] : {std::pair{"cut", cut.view()}, {"drawn", drawn.view()}}) {
            SCOPED_TRACE(name);
            comm.reset_counters();
            const Tensor back = gather_global(comm, shard, chunks);
            EXPECT_EQ(bytes(comm.counters(), "report"), rank == 0 ? 0 : shard.shape.numel() * 4);
            if (rank != 0) {
              EXPECT_EQ(back.nbytes(), 0u);
              continue;
            }
            EXPECT_EQ(back.dtype(), DType::f32);
            EXPECT_EQ(back.shape(), g);
            if (back.shape() == g) EXPECT_EQ(std::memcmp(back.data(), expected.data(), expected.nbytes()), 0);
          }
        }
  }
}

// The built-ins' bytes written out again, per rank, in terms of who sends what to whom (the
// library computes them as totals minus this rank's share): for one forward and one backward.
struct Expected {
  std::map<std::string, std::int64_t> fwd, bwd;
};

// A Ulysses all-to-all over `members` (global ranks, in group order) on `row` bytes per token
// and head: rank me sends its tokens of every other member's heads, and gets their tokens of
// its own heads.
void ulysses_bytes(Expected& e, const std::string& prefix, const std::vector<int>& members, int me,
                   const std::vector<std::int64_t>& tokens, const HeadSplit& heads, std::int64_t row) {
  const std::size_t i = std::size_t(std::find(members.begin(), members.end(), me) - members.begin());
  const std::int64_t q = heads.q[i].count, kv = heads.kv[i].count;
  std::int64_t s2h = 0, s2h_q = 0, h2s = 0, h2s_qkv = 0;
  for (std::size_t j = 0; j < members.size(); ++j) {
    if (j == i) continue;
    s2h += tokens[std::size_t(me)] * (heads.q[j].count + 2 * heads.kv[j].count) * row;
    s2h_q += tokens[std::size_t(me)] * heads.q[j].count * row;
    h2s += tokens[std::size_t(members[j])] * q * row;
    h2s_qkv += tokens[std::size_t(members[j])] * (q + 2 * kv) * row;
  }
  e.fwd[prefix + "seq_to_head"] = s2h;
  e.fwd[prefix + "head_to_seq"] = h2s;
  e.bwd[prefix + "seq_to_head"] = s2h_q;
  e.bwd[prefix + "head_to_seq"] = h2s_qkv;
}

// A ring whose member m holds elems[m] K/V elements: at step i rank me forwards member
// (me − i)'s K/V (i < R − 1) and member (me − i)'s float32 dK/dV accumulator (every step).
void ring_bytes(Expected& e, const std::string& prefix, int me, const std::vector<std::int64_t>& elems,
                std::int64_t es) {
  const int R = int(elems.size());
  std::int64_t kv = 0, dkv = 0;
  for (int i = 0; i < R; ++i) {
    const std::int64_t held = elems[std::size_t((me - i + R) % R)];
    if (i < R - 1) kv += held * es;
    if (R > 1) dkv += held * 4;
  }
  e.fwd[prefix + "p2p_kv"] = kv;
  e.bwd[prefix + "p2p_kv"] = kv;
  e.bwd[prefix + "p2p_dkv"] = dkv;
}

Expected built_in_bytes(const CpConfig& cfg, int cp, int me, const Shape& q, std::int64_t hkv, DType dtype) {
  const std::int64_t es = std::int64_t(dtype_size(dtype)), kv_token = 2 * q.b * hkv * q.d;
  std::vector<std::int64_t> held;
  for (int r = 0; r < cp; ++r) held.push_back(total_tokens(rank_chunks(cfg, cp, r, q.s)));
  Expected e;
  std::vector<int> everyone(static_cast<std::size_t>(cp));
  std::iota(everyone.begin(), everyone.end(), 0);
  const std::string& type = cfg.cp_comm_type;
  if (type == "a2a") ulysses_bytes(e, "", everyone, me, held, ulysses_head_split(cp, q.h, hkv), q.b * q.d * es);
  if (type == "p2p") {
    std::vector<std::int64_t> elems;
    for (std::int64_t n : held) elems.push_back(n * kv_token);
    ring_bytes(e, "", me, elems, es);
  }
  if (type == "all_gather") {  // own K/V to everyone; the others' float32 dK/dV rows back
    e.fwd["all_gather_kv"] = (cp - 1) * held[std::size_t(me)] * kv_token * es;
    e.bwd["all_gather_dkv"] = (q.s - held[std::size_t(me)]) * kv_token * 4;
  }
  if (type == "a2a+p2p") {  // Ulysses in groups of I; a ring over O members each holding its group's tokens
    const int I = cfg.hierarchical_context_parallel_sizes[0], O = cfg.hierarchical_context_parallel_sizes[1];
    const HeadSplit heads = ulysses_head_split(I, q.h, hkv);
    std::vector<int> group(static_cast<std::size_t>(I));
    std::iota(group.begin(), group.end(), me / I * I);
    ulysses_bytes(e, "inner.", group, me, held, heads, q.b * q.d * es);
    const std::int64_t kv_of_mine = 2 * q.b * heads.kv[std::size_t(me % I)].count * q.d;
    std::vector<std::int64_t> elems(std::size_t(O), 0);
    for (int r = 0; r < cp; ++r) elems[std::size_t(r / I)] += held[std::size_t(r)] * kv_of_mine;
    ring_bytes(e, "outer.", me / I, elems, es);
  }
  return e;
}

// Bytes each rank sends, per operation, for one forward and one backward: the strategy's
// formula for this very rank (Strategy::traffic), the built-ins' written out again, and the
// planner's rows (each counter's busiest rank), for even and uneven tokens and heads.
COMM_TEST(Strategies, BytesAndMessagesEqualTheFormulas) {
  const int cp = comm.size(), me = comm.rank();
  struct S {
    std::int64_t b, s, h, hkv, d;
    DType dtype;
  };
  for (const S& sh : {S{2, 8 * cp, 2 * cp, cp, 16, DType::f32}, S{2, 8 * cp, 2 * cp, 1, 16, DType::bf16},
                      S{1, 12 * cp, 3 * cp, 3 * cp, 8, DType::f32}, S{3, 4 * cp, cp, 1, 32, DType::bf16},
                      S{2, 8 * cp + 1, 2 * cp, cp, 16, DType::f32}, S{1, 3 * cp + 1, 6, 6, 8, DType::f32},
                      S{1, 5 * cp + 3, 12, 3, 8, DType::bf16}, S{2, 4 * cp - 1, 6, 1, 8, DType::f32}}) {
    const Shape q{sh.b, sh.s, sh.h, sh.d};
    const GlobalProblem global(q, sh.hkv, sh.dtype, true, 3);
    for (const CpConfig& cfg : strategies(cp, true)) {
      SCOPED_TRACE(describe(cfg) + " q " + q.str() + " h_kv " + std::to_string(sh.hkv) + " " + to_string(sh.dtype));
      if (!config_error(cfg, cp, q, sh.hkv).empty()) continue;  // too few heads for an all-to-all: tested above
      Problem p(global, cfg, cp, me, Layout::bshd);
      ContextParallelAttention attn(comm, cfg);
      p.run(attn);  // creates sub-communicators first
      const auto [fwd, bwd] = forward_backward_counted(comm, attn, p);
      const CommVolume predicted = predicted_comm_volume(cfg, cp, me, q, sh.hkv, sh.dtype);
      expect_traffic({fwd, bwd}, predicted, cp);
      const Expected e = built_in_bytes(cfg, cp, me, q, sh.hkv, sh.dtype);
      for (const auto& [op, n] : e.fwd) EXPECT_EQ(bytes(fwd, op), n) << op;
      for (const auto& [op, n] : e.bwd) EXPECT_EQ(bytes(bwd, op), n) << op;
      // The planner's row for this shape: each counter's busiest rank, summed.
      std::int64_t most[2] = {0, 0};
      for (int dir = 0; dir < 2; ++dir)
        for (const auto& [op, n] : (dir == 0 ? predicted.forward_bytes : predicted.backward_bytes)) {
          std::int64_t top = bytes(dir == 0 ? fwd : bwd, op);
          comm.allreduce_max(&top, 1);
          most[dir] += top;
        }
      PlanInput in;
      in.seq = q.s;
      in.batch = q.b;
      in.heads = q.h;
      in.kv_heads = sh.hkv;
      in.head_dim = q.d;
      in.cp = cp;
      in.dtype = sh.dtype;
      for (const PlanRow& r : make_plan(in).rows)
        if (r.config.cp_comm_type == cfg.cp_comm_type &&
            r.config.hierarchical_context_parallel_sizes == cfg.hierarchical_context_parallel_sizes) {
          EXPECT_TRUE(r.valid) << r.reason;
          EXPECT_EQ(r.forward_bytes_per_rank, most[0]) << r.name;
          EXPECT_EQ(r.backward_bytes_per_rank, most[1]) << r.name;
        }
    }
  }
}

COMM_TEST(Strategies, SeveralForwardsInFlightBeforeTheirBackwards) {
  // Two layers (or micro-batches, or a checkpointed recompute): both forwards run before
  // either backward, and the backwards run in reverse order, as autograd does.
  // The second has another (uneven) sequence length: contexts keep their own shapes.
  const int cp = comm.size();
  const GlobalProblem first({2, 8 * cp, 2 * cp, 16}, 2 * cp, DType::f32, true, 10),
      second({2, 8 * cp + 3, 2 * cp, 16}, 2 * cp, DType::f32, true, 20);
  for (const CpConfig& cfg : strategies(cp, true)) {
    SCOPED_TRACE(describe(cfg));
    ContextParallelAttention attn(comm, cfg);
    Problem a(first, cfg, cp, comm.rank(), Layout::bshd), b(second, cfg, cp, comm.rank(), Layout::bshd);
    const CpContext ca = attn.forward(a.out.view(), a.q.view(), a.k.view(), a.v.view());
    const CpContext cb = attn.forward(b.out.view(), b.q.view(), b.k.view(), b.v.view());
    attn.backward(cb, b.dq.view(), b.dk.view(), b.dv.view(), b.dout.view());
    attn.backward(ca, a.dq.view(), a.dk.view(), a.dv.view(), a.dout.view());
    a.expect_matches();
    b.expect_matches();
  }
}

// The last backward of a context (CpContext&&, as training runs it) may compute in the
// context's buffers (a2a: the head-sharded gradients over its k, v and out): the same gradients
// bit for bit as the backward that keeps the context, for every strategy, with shared KV heads,
// uneven heads, overlapped chunks and bf16 (which keeps its own buffers); the context is empty after.
COMM_TEST(Strategies, ConsumingBackwardGivesTheSameGradientsBitForBit) {
  const int cp = comm.size();
  struct S {
    Shape q;
    std::int64_t hkv;
    DType dtype;
    int overlap;
  };
  for (const S& sh : {S{{2, 8 * cp + 3, 2 * cp, 16}, 2 * cp, DType::f32, 1},
                      S{{1, 8 * cp, 2 * cp, 8}, 1, DType::f32, 1},  // KV head shared by the ranks
                      S{{1, 5 * cp + 2, 2 * (2 * cp + 1), 8}, 2 * cp + 1, DType::f32, 2},  // uneven heads, 2 chunks
                      S{{2, 6 * cp, 2 * cp, 16}, cp, DType::bf16, 1}}) {
    const GlobalProblem global(sh.q, sh.hkv, sh.dtype, true, 30);
    std::vector<CpConfig> configs = strategies(cp, true);
    if (sh.overlap > 1) configs = {CpConfig{"a2a", {}, true, std::nullopt}}, configs[0].overlap_chunks = sh.overlap;
    for (const CpConfig& cfg : configs) {
      if (!config_error(cfg, cp, sh.q, sh.hkv).empty()) continue;
      SCOPED_TRACE(fmt::format("{}, q {} h_kv {} {}", describe(cfg), sh.q.str(), sh.hkv, to_string(sh.dtype)));
      ContextParallelAttention attn(comm, cfg);
      Problem kept(global, cfg, cp, comm.rank(), Layout::bshd), consumed(global, cfg, cp, comm.rank(), Layout::bshd);
      CpContext ctx = attn.forward(kept.out.view(), kept.q.view(), kept.k.view(), kept.v.view());
      attn.backward(ctx, kept.dq.view(), kept.dk.view(), kept.dv.view(), kept.dout.view());
      attn.backward(std::move(ctx), consumed.dq.view(), consumed.dk.view(), consumed.dv.view(), consumed.dout.view());
      EXPECT_FALSE(ctx.valid());
      for (auto [a, b] : {std::pair{&kept.dq, &consumed.dq}, {&kept.dk, &consumed.dk}, {&kept.dv, &consumed.dv}})
        EXPECT_EQ(std::memcmp(a->data(), b->data(), a->nbytes()), 0);
      kept.expect_matches(sh.dtype == DType::f32 ? 1e-5 : 1e-2, sh.dtype == DType::f32 ? 1e-4 : 2.5e-2);
    }
  }
}

TEST(Registry, AStrategyFromItsOwnFileIsEverywhere) {
  // tests/toy_strategy.cpp registers itself; nothing else in the tests or the library names it.
  const Strategy& toy = find_strategy("toy_all_gather_halves");
  EXPECT_NE(strategy_names(", ").find("toy_all_gather_halves"), std::string::npos);
  bool planned = false;
  PlanInput in;
  in.seq = 4096;
  in.heads = 8;
  in.kv_heads = 8;
  in.cp = 4;
  for (const PlanRow& r : make_plan(in).rows) planned |= r.name == toy.name() && r.valid;
  EXPECT_TRUE(planned);
  EXPECT_THROW(find_strategy("no_such_strategy"), Error);
}

#if ULYSSES_TEST_CLI
// The toy's own option: a flag of the CLI's commands (which iterate the registry), parsed into
// CpConfig::options, checked by its validate, refused on the command line and in the library
// for any other strategy.
TEST(Registry, AStrategysOptionReachesTheCommandLineAndValidation) {
  CLI::App app;
  cli::StrategyOptionTexts given;
  cli::add_strategy_options(&app, given);
  app.parse("--toy-max-cp 2", false);
  const CpConfig cfg = cli::parse_strategy("toy_all_gather_halves", given, 4);
  EXPECT_EQ(cfg.options.at("toy-max-cp"), std::vector<std::int64_t>{2});
  const Shape q{1, 64, 8, 8};
  EXPECT_EQ(config_error(cfg, 2, q, 8), "");
  EXPECT_EQ(config_error(cfg, 4, q, 8), "toy_all_gather_halves: cp 4 is more than toy-max-cp 2");
  for (const char* other : {"a2a", "p2p"}) {
    try {
      cli::parse_strategy(other, given, 4);
      ADD_FAILURE() << other << " took --toy-max-cp";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "--toy-max-cp applies to --strategy toy_all_gather_halves only");
    }
    CpConfig elsewhere = cfg;
    elsewhere.cp_comm_type = other;
    EXPECT_EQ(config_error(elsewhere, 2, q, 8),
              fmt::format("toy-max-cp must be unset for cp_comm_type {} (an option of toy_all_gather_halves), got 2",
                          other));
  }
  EXPECT_THROW(cli::parse_strategy("toy_all_gather_halves", {{"toy-max-cp", "0"}}, 4), Error);
}
#endif

// Every strategy's one memory model (Strategy::memory) against what its forward allocates on
// the busiest rank: what it keeps (the tensors alive while its context is) exactly, in either
// dtype; its forward's peak within 30 % above (the planner admits by it, so never below). At
// bf16 the kernels' float32 copies on a CPU without a bf16 engine come on top, so the peak is
// checked at float32 only. The planner's working set and training read the same declaration
// (test_planner, test_train).
TEST(Registry, EveryStrategyAllocatesWhatItsMemoryModelSays) {
  MpiCommunicator comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP() << "one rank runs plain flash attention, whatever the strategy";
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const auto& [global, hkv] :
         {std::pair{Shape{2, 64 * cp, 8, 16}, 4}, {Shape{1, 256 * cp, 4, 32}, 4}, {Shape{3, 96 * cp, 4, 8}, 2}})
      for (const Strategy* strategy : ulysses::strategies())
        for (const CpConfig& cfg : strategy->plan_configs(cp, true)) {
          SCOPED_TRACE(fmt::format("{} {} [{}, {}, {}, {}] kv {}", strategy->config_name(cfg), to_string(dtype),
                                   global.b, global.s, global.h, global.d, hkv));
          if (!config_error(cfg, cp, global, hkv).empty()) continue;
          Tensor q({global.b, total_tokens(rank_chunks(cfg, cp, comm.rank(), global.s)), global.h, global.d}, dtype);
          Tensor kv({q.shape().b, q.shape().s, hkv, global.d}, dtype), out(q.shape(), dtype);
          ContextParallelAttention attn(comm, cfg);
          { const CpContext warm = attn.forward(out.view(), q.view(), kv.view(), kv.view()); }  // sub-communicators
          reset_tensor_bytes_peak();
          const double base = double(tensor_bytes_in_use());
          const CpContext ctx = attn.forward(out.view(), q.view(), kv.view(), kv.view());
          double measured[2] = {double(tensor_bytes_in_use()) - base, double(tensor_bytes_peak()) - base};
          comm.allreduce_max(measured, 2);
          const StrategyMemory model = strategy->memory(cfg, cp, global, global.s, hkv, dtype);
          EXPECT_EQ(measured[0], model.kept);
          if (dtype == DType::f32) {
            EXPECT_GE(model.forward, measured[1]);
            EXPECT_LE(model.forward, 1.3 * measured[1]);
          }
        }
}

// Zigzag gives every rank the same causal work; when s % 2cp != 0, within one query row per
// chunk (each of a rank's two chunks may hold one token more than another rank's, and a token
// sees at most s keys). Every visible pair is computed exactly once.
COMM_TEST(Strategies, ZigzagGivesEveryRankTheSameCausalWork) {
  const int cp = comm.size();
  const std::int64_t b = 1, h = 2 * cp, d = 8;
  for (const std::int64_t s : {16 * cp, 16 * cp + 1, 16 * cp + 2 * cp - 1})
    for (const CpConfig& cfg : strategies(cp, true)) {
      SCOPED_TRACE(describe(cfg) + " s " + std::to_string(s));
      Tensor q({b, total_tokens(rank_chunks(cfg, cp, comm.rank(), s)), h, d}), out(q.shape());
      ContextParallelAttention attn(comm, cfg);
      const CpContext ctx = attn.forward(out.view(), q.view(), q.view(), q.view());
      std::int64_t w[2] = {ctx.stats().score_pairs, ctx.stats().score_pairs};
      comm.allreduce_min(&w[0], 1);
      comm.allreduce_max(&w[1], 1);
      if (s % (2 * cp) == 0) EXPECT_EQ(w[0], w[1]) << "ranks do different amounts of causal work";
      EXPECT_LE(w[1] - w[0], 2 * s * b * h) << "more than one query row per chunk apart";
      EXPECT_EQ(summed_pairs(comm, ctx), double(b * h * s * (s + 1) / 2));  // every visible pair exactly once
    }
}

COMM_TEST(Errors, FewerHeadsThanCpNamesValuesRuleAndP2p) {
  const int cp = comm.size();
  if (cp == 1) return;  // needs two ranks (a skip would mark the local worlds of 2 to 4 skipped too)
  Tensor q({1, 4, cp - 1, 8}), k({1, 4, 1, 8}), out({1, 4, cp - 1, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  const std::string values =
      "num_heads (" + std::to_string(cp - 1) + ") must be at least cp (" + std::to_string(cp) + ")";
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(out.view(), q.view(), k.view(), k.view()); }, values);
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(out.view(), q.view(), k.view(), k.view()); }, "p2p");
  // ... and p2p really has no such constraint.
  ContextParallelAttention ring(comm, CpConfig{"p2p", {}, false, std::nullopt});
  (void)ring.forward(out.view(), q.view(), k.view(), k.view());
}

COMM_TEST(Errors, PartialGqaGroupsGiveTheSameErrorEverywhere) {
  const int cp = comm.size();
  const std::int64_t hkv = 2, h = 2 * cp + 1;  // h % h_kv != 0: the one impossible head count
  Tensor q({1, 4, h, 8}), k({1, 4, hkv, 8}), out({1, 4, h, 8});
  for (const CpConfig& cfg : strategies(cp, false)) {
    ContextParallelAttention attn(comm, cfg);
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), k.view(), k.view()); },
        "num_heads (" + std::to_string(h) + ") must be divisible by num_kv_heads (2)");
  }
}

// Ranks may hold different token counts, but only those rank_chunks gives them; anything else
// (here: the last rank holds two more) is refused with the same message everywhere, naming
// the first wrong rank. Other shape differences stay errors of their own.
COMM_TEST(Errors, WrongTokenCountsAndShapesThatDifferAreRefusedEverywhere) {
  const int cp = comm.size();
  if (cp == 1) return;  // needs two ranks (a skip would mark the local worlds of 2 to 4 skipped too)
  auto held = [&](int r) { return std::int64_t(r == cp - 1 ? 6 : 4); };
  const std::int64_t s = 4 * cp + 2;
  Tensor q({2, held(comm.rank()), cp, 8}), out(q.shape());
  for (const CpConfig& cfg : strategies(cp, true)) {
    ContextParallelAttention attn(comm, cfg);
    int wrong = 0;
    while (total_tokens(rank_chunks(cfg, cp, wrong, s)) == held(wrong)) ++wrong;
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); },
        "rank " + std::to_string(wrong) + " holds " + std::to_string(held(wrong)) + " tokens but cp_comm_type " +
            cfg.cp_comm_type + " with s = " + std::to_string(s) + " gives it " +
            std::to_string(total_tokens(rank_chunks(cfg, cp, wrong, s))));
  }
  Tensor wide({2, 4, comm.rank() == cp - 1 ? 2 * cp : cp, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(wide.view(), wide.view(), wide.view(), wide.view()); },
      "rank 0 has q [2, *, " + std::to_string(cp) + ", 8]");
}

COMM_TEST(Errors, LocalShapeErrorsAndMisuseAreAgreed) {
  const int cp = comm.size();
  Tensor q({1, 4, cp, 8}), bad_out({1, 4, cp, 16}), out_ok({1, 4, cp, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  const TensorView out = comm.rank() == cp - 1 ? bad_out.view() : out_ok.view();  // only the last rank is wrong
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(out, q.view(), q.view(), q.view()); }, "out must be [1, 4, ");
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.backward(CpContext(), q.view(), q.view(), q.view(), q.view()); },
      "without a successful forward");
}

COMM_TEST(Errors, HierarchicalSizesMustMultiplyToCp) {
  const int cp = comm.size();
  Tensor q({1, 4, cp, 8}), out({1, 4, cp, 8});
  for (std::vector<int> sizes : {std::vector<int>{cp, 2}, {}, {cp}, {0, cp}, {cp, 1, 1}}) {
    ContextParallelAttention attn(comm, CpConfig{"a2a+p2p", sizes, false, std::nullopt});
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); }, "inner * outer == cp");
  }
}

COMM_TEST(Errors, ZigzagNeedsTwoTokensPerRank) {
  const int cp = comm.size();
  Tensor q({1, 1, cp, 8}), out({1, 1, cp, 8});
  ContextParallelAttention attn(comm, CpConfig{"p2p", {}, true, std::nullopt});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); },
      "sequence length (" + std::to_string(cp) + ") must be at least 2*cp (" + std::to_string(2 * cp) + ")");
}

COMM_TEST(Errors, GatheringShardsThatDoNotFitIsRefusedEverywhere) {
  const int cp = comm.size();
  std::vector<std::vector<SeqChunk>> chunks;
  for (int r = 0; r < cp; ++r) chunks.push_back({{4 * r, 4}});
  const bool last = comm.rank() == cp - 1;  // only the last rank is wrong
  Tensor longer({1, last ? 5 : 4, 2, 8}), wider({1, 4, last ? 3 : 2, 8});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { gather_global(comm, longer.view(), chunks); }, "chunks hold 4 tokens but the shard has 5");
  if (cp == 1) return;
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { gather_global(comm, wider.view(), chunks); }, "shard shapes differ between ranks");
}

}  // namespace

// Overlapped Ulysses (overlap_chunks): the heads cut into chunks of whole GQA groups and
// pipelined; the same answers as plain a2a, the same bytes in chunks × the messages.
COMM_TEST(Overlap, ChunkedUlyssesMatchesFloat64ReferenceAndCountsItsMessages) {
  const int cp = comm.size(), me = comm.rank();
  struct S {
    std::int64_t b, s, h, hkv, d;
    bool causal;
    DType dtype;
  };
  for (const S& sh : {S{2, 8 * cp, 4 * cp, 4 * cp, 16, true, DType::f32},      // MHA, 4 heads per rank
                      S{1, 9 * cp + 1, 8 * cp, 2 * cp, 8, false, DType::f32},  // GQA, 2 KV heads per rank
                      S{2, 6 * cp, 6 * cp, 3 * cp, 16, true, DType::bf16},     // GQA, bf16
                      S{1, 5 * cp + 2, 2 * (2 * cp + 1), 2 * cp + 1, 8, true, DType::f32}}) {  // uneven heads
    const Shape q{sh.b, sh.s, sh.h, sh.d};
    const GlobalProblem global(q, sh.hkv, sh.dtype, sh.causal, 5);
    const double tol_out = sh.dtype == DType::f32 ? 1e-5 : 1e-2, tol_grad = sh.dtype == DType::f32 ? 1e-4 : 2.5e-2;
    for (int chunks : {1, 2, 3}) {
      CpConfig cfg{"a2a", {}, sh.causal, std::nullopt};
      cfg.overlap_chunks = chunks;
      SCOPED_TRACE(fmt::format("{} chunks, q {} h_kv {} {}", chunks, q.str(), sh.hkv, to_string(sh.dtype)));
      Problem p(global, cfg, cp, me, Layout::bshd);
      ContextParallelAttention attn(comm, cfg);
      const auto [fwd, bwd] = forward_backward_counted(comm, attn, p);
      p.expect_matches(tol_out, tol_grad);
      if (cp == 1) continue;
      // Every rank holds at least 2 KV heads here, 3 only when h_kv >= 3cp.
      const int used = ulysses_overlap_chunks(chunks, cp, sh.hkv);
      EXPECT_EQ(used, std::min<std::int64_t>(chunks, sh.hkv / cp));
      const CommVolume predicted = predicted_comm_volume(cfg, cp, me, q, sh.hkv, sh.dtype);
      CpConfig plain = cfg;
      plain.overlap_chunks = 1;
      const CommVolume once = predicted_comm_volume(plain, cp, me, q, sh.hkv, sh.dtype);
      for (const char* op : {"seq_to_head", "head_to_seq"}) {
        EXPECT_EQ(bytes(fwd, op), predicted.forward_bytes.at(op)) << op;
        EXPECT_EQ(bytes(bwd, op), predicted.backward_bytes.at(op)) << op;
        EXPECT_EQ(msgs(fwd, op), predicted.forward_messages.at(op)) << op;
        EXPECT_EQ(msgs(bwd, op), predicted.backward_messages.at(op)) << op;
        EXPECT_EQ(predicted.forward_bytes.at(op), once.forward_bytes.at(op)) << op;
        EXPECT_EQ(msgs(fwd, op), used * (cp - 1)) << op;
        EXPECT_EQ(fwd.at(op).calls, used) << op;
      }
    }
  }
}

COMM_TEST(Overlap, MoreChunksThanKvHeadsAreClampedAndBadCountsRefused) {
  EXPECT_EQ(ulysses_overlap_chunks(8, 4, 8), 2);  // 2 KV heads per rank: 2 chunks
  EXPECT_EQ(ulysses_overlap_chunks(8, 4, 2), 1);  // KV heads shared by ranks: no chunks
  EXPECT_EQ(ulysses_overlap_chunks(3, 2, 7), 3);  // 4 and 3 KV heads: 3 chunks
  EXPECT_EQ(ulysses_overlap_chunks(4, 2, 7), 3);
  const HeadSplit split = ulysses_head_split(2, 14, 7);  // rank 0: KV 0..3, rank 1: KV 4..6; 2 q heads each
  const HeadSplit last = ulysses_head_chunk(split, 3, 2);
  EXPECT_EQ(last.kv[0], (HeadRange{3, 1}));
  EXPECT_EQ(last.q[0], (HeadRange{6, 2}));
  EXPECT_EQ(last.kv[1], (HeadRange{6, 1}));
  EXPECT_EQ(last.q[1], (HeadRange{12, 2}));
  const int cp = comm.size();
  const Shape q{1, 4 * cp, 2 * cp, 8};
  // a2a's own rule, and the registry's for an option set on a strategy that does not declare it.
  for (auto [type, chunks, error] :
       {std::tuple{"a2a", 0, "overlap_chunks must be 1, or more for cp_comm_type a2a; got 0 for a2a"},
        {"p2p", 2, "overlap_chunks must be 1 for cp_comm_type p2p (an option of a2a), got 2"},
        {"all_gather", 3, "overlap_chunks must be 1 for cp_comm_type all_gather (an option of a2a), got 3"}}) {
    CpConfig cfg{type, {}, false, std::nullopt};
    cfg.overlap_chunks = chunks;
    EXPECT_EQ(config_error(cfg, cp, q, cp), error);
  }
  CpConfig sizes{"p2p", {1, cp}, false, std::nullopt};
  EXPECT_EQ(config_error(sizes, cp, q, cp),
            fmt::format("hierarchical_context_parallel_sizes must be empty for cp_comm_type p2p (an option of "
                        "a2a+p2p), got 1, {}",
                        cp));
  CpConfig unknown{"a2a", {}, false, std::nullopt};
  unknown.options["no-such-option"] = {1};
  EXPECT_EQ(config_error(unknown, cp, q, cp), "cp_comm_type a2a has no option no-such-option");
  PlanInput in;
  in.seq = 1 << 17, in.heads = 32, in.kv_heads = 8, in.cp = 4;
  // a2a alone has tunings among the built-ins (the toy strategy declares none).
  const std::vector<TuningPlan> tuned = plan_tunings(in);
  ASSERT_EQ(tuned.size(), 1u);
  EXPECT_EQ(tuned[0].config.cp_comm_type, "a2a");
  EXPECT_GE(tuned[0].config.overlap_chunks, 1);
  EXPECT_LE(tuned[0].config.overlap_chunks, 2);
  EXPECT_LE(tuned[0].exposed_s, tuned[0].plain_exposed_s);
  in.cluster.intra.latency = 1;  // a second per message: chunks only cost
  EXPECT_EQ(plan_tunings(in).at(0).config.overlap_chunks, 1);
  in.heads = in.kv_heads = 2;  // fewer heads than ranks: a2a cannot run, nothing to tune
  EXPECT_TRUE(plan_tunings(in).empty());
}

TEST(Overlap, PipelineExposesTheFirstInputTheLastOutputAndWhatComputeCannotHide) {
  EXPECT_DOUBLE_EQ(pipeline_exposed(1, 2, 3, 10), 5);
  EXPECT_DOUBLE_EQ(pipeline_exposed(4, 1, 1, 10), 2);                 // all hidden but the ends
  EXPECT_DOUBLE_EQ(pipeline_exposed(3, 4, 4, 5), 4 + 4 + 0 + 3 + 0);  // middle step: 8 in flight, 5 of compute
}

// bf16 compute in every strategy: Q, K, V stay bf16 on the wire and in the kernels while the
// partial outputs, their LSE merges and the gradient sums stay float32 across ring steps and
// ranks, rounded to bf16 once. So the error against float64 is within a2a's bf16 bound and no
// more than 1.5× that of one process computing the same bf16 inputs (cp = 1): rounding a
// partial to bf16 at every ring step would make it grow with the ring size. Run on the CPU's
// own level and, where that has no bf16 engine, on the emulated AVX512_BF16 one (P and dS
// rounded to bf16 for their GEMMs, as on Zen 4), GQA/MQA, uneven, documents and windows.
namespace {

struct Bf16Case {
  const char* name;
  bool causal;
  int extra_tokens;  // s = 16·cp + extra_tokens
  int kv;            // KV heads: 0 means cp
  bool documents;
  Window window;
};

const Bf16Case kBf16Cases[] = {{"causal GQA", true, 0, 0, false, {}},
                               {"full MQA uneven", false, 5, 1, false, {}},
                               {"causal documents uneven", true, 3, 0, true, {}},
                               {"causal window (halo)", true, 1, 1, false, {7, -1}},
                               {"full window", false, 0, 0, false, {9, 4}}};

// One process's flash kernels on a global problem's inputs (the cp = 1 run), outputs rounded
// to the inputs' dtype once per element, as a strategy's are.
struct OneProcess {
  Tensor out, dq, dk, dv;
  OneProcess(const GlobalProblem& g, const AttentionParams& p)
      : out(g.q.shape()), dq(g.q.shape(), g.q.dtype()), dk(g.k.shape(), g.q.dtype()), dv(g.k.shape(), g.q.dtype()) {
    const Tensor lse = lse_tensor(g.q.shape());
    flash_attention_forward(out.view(), lse.view(), g.q.view(), g.k.view(), g.v.view(), p);
    flash_attention_backward(dq.view(), dk.view(), dv.view(), g.dout.view(), g.q.view(), g.k.view(), g.v.view(),
                             out.view(), lse.view(), p);
  }
  // Its relative errors (out, dq, dk, dv) on the rows of `chunks` against `rows`' reference.
  std::array<double, 4> errors(const std::vector<SeqChunk>& chunks, const Problem& rows) const {
    auto err = [&](const Tensor& t, const RefTensor& ref) {
      return relative_error(shard_of(t.view(), chunks, dq.dtype(), Layout::bshd).view(), ref);
    };
    return {err(out, rows.rout), err(dq, rows.rdq), err(dk, rows.rdk), err(dv, rows.rdv)};
  }
};

// True when some rank computes a KV head without all of its query heads (a head-split strategy
// whose ranks share that KV head): its partial dK/dV travel in bf16 to be summed, one more bf16
// rounding per rank sharing the head (at most h/h_kv of them, whatever the ring size).
bool partial_kv_gradients(const Strategy& strategy, const CpConfig& cfg, int cp, std::int64_t h, std::int64_t hkv) {
  for (int r = 0; r < cp; ++r)
    if (const RankHeads mine = strategy.heads_of(cfg, cp, r, h, hkv); mine.q.count < mine.kv.count * (h / hkv))
      return true;
  return false;
}

void expect_bf16_compute_bounded(Communicator& comm, const Bf16Case& c) {
  const int cp = comm.size();
  const std::int64_t s = 16 * cp + c.extra_tokens, h = 2 * cp, hkv = c.kv == 0 ? cp : c.kv;
  const std::vector<std::int64_t> cu =
      c.documents ? std::vector<std::int64_t>{0, s / 3, s / 3 + 1, s - 2, s} : std::vector<std::int64_t>{};
  const GlobalProblem global({1, s, h, 32}, hkv, DType::bf16, c.causal, 11, cu, nullptr, c.window);
  const OneProcess one(global, {c.causal, std::nullopt, 0, 0, cu, c.window.left, c.window.right});
  for (const CpConfig& base : strategies(cp, c.causal)) {
    const Strategy& strategy = find_strategy(base.cp_comm_type);
    if ((c.documents && !strategy.supports_documents()) || (c.window.bounded() && !strategy.supports_window()))
      continue;
    CpConfig cfg = base;
    cfg.cu_seqlens = cu;
    cfg.window_left = c.window.left;
    cfg.window_right = c.window.right;
    SCOPED_TRACE(fmt::format("{}, {}, {}", describe(cfg), c.name, kernels::active_level().name));
    Problem p(global, cfg, cp, comm.rank(), Layout::bshd);
    ContextParallelAttention attn(comm, cfg);
    p.run(attn);
    p.expect_matches(1e-2, 2.5e-2);
    const std::array<double, 4> at_cp = {relative_error(p.out.view(), p.rout), relative_error(p.dq.view(), p.rdq),
                                         relative_error(p.dk.view(), p.rdk), relative_error(p.dv.view(), p.rdv)},
                                at_1 = one.errors(rank_chunks(cfg, cp, comm.rank(), s), p);
    const std::size_t checked = partial_kv_gradients(strategy, cfg, cp, h, hkv) ? 2 : 4;  // out, dq [, dk, dv]
    for (std::size_t i = 0; i < checked; ++i)
      EXPECT_LE(at_cp[i], 1.5 * at_1[i]) << std::array{"out", "dq", "dk", "dv"}[i] << " at cp " << cp;
  }
}

// The levels of the bf16 tests, for the time one runs (nullptr: the CPU's own).
class Bf16Levels {
 public:
  static std::vector<const kernels::KernelLevel*> all() {
    static const kernels::KernelLevel emulated{"emulated-avx512bf16", &kernels::emulated::avx512_f32,
                                               &kernels::emulated::avx512_bf16, kernels::emulated::avx512_vec};
    std::vector<const kernels::KernelLevel*> v{nullptr};
    if (kernels::active_level().bf16 == nullptr) v.push_back(&emulated);
    return v;
  }
  explicit Bf16Levels(const kernels::KernelLevel* level) { kernels::use_level_for_testing(level); }
  ~Bf16Levels() { kernels::use_level_for_testing(nullptr); }
  Bf16Levels(const Bf16Levels&) = delete;
  Bf16Levels& operator=(const Bf16Levels&) = delete;
};

}  // namespace

// Set outside the worlds: the level is the process's, which a local world's rank threads share.
TEST(Bf16Compute, EveryStrategyWithinTheBoundAndNotGrowingWithTheRing) {
  for (const kernels::KernelLevel* level : Bf16Levels::all()) {
    const Bf16Levels use(level);
    ulysses::testing::on_every_world([](Communicator& comm) {
      for (const Bf16Case& c : kBf16Cases) expect_bf16_compute_bounded(comm, c);
    });
  }
}

// Eight ranks as threads (cheaper than eight processes on a small machine).
TEST(Bf16Compute, EightLocalRanksDoNotGrowTheError) {
  if (!ulysses::testing::local_worlds()) GTEST_SKIP() << "runs with --local";
  for (const kernels::KernelLevel* level : Bf16Levels::all()) {
    const Bf16Levels use(level);
    for (const Bf16Case& c : kBf16Cases)
      run_local(8, [&](Communicator& comm) { expect_bf16_compute_bounded(comm, c); });
  }
}
