// Every strategy (a2a, p2p, all_gather, a2a+p2p at every factorisation) against the float64
// single-process reference at every rank count: forward and all gradients, batch > 1, both
// layouts, bf16, GQA split and replicated, MQA; exact byte and message counts; equal causal
// work per rank; the same clear error on every rank for every bad input; shards made on each
// rank and gathered back to one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mpi_helpers.hpp"
#include "ulysses/comm_volume.hpp"
#include "ulysses/context_parallel.hpp"
#include "ulysses/planner.hpp"
#include "ulysses/reference.hpp"
#include "ulysses/sharding.hpp"

using namespace ulysses;

namespace {

struct Case {
  std::int64_t b, sl;  // batch, tokens per rank
  int heads_per_rank;
  int kv;              // KV heads: 0 means cp (split); otherwise that many
  std::int64_t d;
  bool causal;
  Layout layout;
  DType dtype;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "case"; }

std::string name_of(const Case& c) {
  return "b" + std::to_string(c.b) + "_sl" + std::to_string(c.sl) + "_hpr" + std::to_string(c.heads_per_rank) +
         "_kv" + (c.kv == 0 ? std::string("cp") : std::to_string(c.kv)) + "_d" + std::to_string(c.d) +
         (c.causal ? "_causal_" : "_full_") + to_string(c.layout) + "_" + to_string(c.dtype);
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

RefTensor select_rows(const RefTensor& t, const std::vector<std::int64_t>& positions) {
  RefTensor r({t.shape.b, std::int64_t(positions.size()), t.shape.h, t.shape.d});
  for (std::int64_t b = 0; b < t.shape.b; ++b)
    for (std::size_t s = 0; s < positions.size(); ++s)
      for (std::int64_t h = 0; h < t.shape.h; ++h)
        for (std::int64_t x = 0; x < t.shape.d; ++x) r.at(b, std::int64_t(s), h, x) = t.at(b, positions[s], h, x);
  return r;
}

class StrategyTest : public ::testing::TestWithParam<Case> {};

TEST_P(StrategyTest, EveryStrategyMatchesFloat64Reference) {
  const Case c = GetParam();
  MpiCommunicator comm;
  const int cp = comm.size(), rank = comm.rank();
  const std::int64_t h = std::int64_t(c.heads_per_rank) * cp, hkv = c.kv == 0 ? cp : c.kv, s = c.sl * cp;
  // Global tensors (rounded to the storage dtype, as the shards are) and the reference.
  Tensor gq({c.b, s, h, c.d}, c.dtype), gk({c.b, s, hkv, c.d}, c.dtype), gv(gk.shape(), c.dtype),
      gdout(gq.shape(), c.dtype);
  for (auto [t, seed] : {std::pair{&gq, 1}, {&gk, 2}, {&gv, 3}, {&gdout, 4}}) fill_uniform(t->view(), std::uint64_t(seed));
  const RefTensor rq = RefTensor::from(gq.view()), rk = RefTensor::from(gk.view()), rv = RefTensor::from(gv.view());
  const AttentionParams p{c.causal, 0.0f, 0, 0};
  RefTensor rout, rdq, rdk, rdv;
  std::vector<double> lse;
  reference_attention_forward(rout, lse, rq, rk, rv, p);
  reference_attention_backward(rdq, rdk, rdv, RefTensor::from(gdout.view()), rq, rk, rv, p);
  const double tol_out = c.dtype == DType::f32 ? 1e-5 : 1e-2;
  const double tol_grad = c.dtype == DType::f32 ? 1e-4 : 2.5e-2;

  for (const CpConfig& cfg : strategies(cp, c.causal)) {
    SCOPED_TRACE(describe(cfg));
    const std::vector<SeqChunk> chunks = rank_chunks(cfg, cp, rank, s);
    const std::vector<std::int64_t> pos = token_positions(chunks);
    Tensor q({c.b, c.sl, h, c.d}, c.dtype, c.layout), k({c.b, c.sl, hkv, c.d}, c.dtype, c.layout),
        v(k.shape(), c.dtype, c.layout), dout(q.shape(), c.dtype, c.layout);
    shard_sequence(gq.view(), q.view(), chunks);
    shard_sequence(gk.view(), k.view(), chunks);
    shard_sequence(gv.view(), v.view(), chunks);
    shard_sequence(gdout.view(), dout.view(), chunks);
    Tensor out(q.shape(), c.dtype, c.layout), dq(q.shape(), c.dtype, c.layout), dk(k.shape(), c.dtype, c.layout),
        dv(k.shape(), c.dtype, c.layout);
    ContextParallelAttention attn(comm, cfg);
    // The all-to-all strategies need the KV heads to split or replicate over their group.
    const int group = cfg.cp_comm_type == "a2a"       ? cp
                      : cfg.cp_comm_type == "a2a+p2p" ? cfg.hierarchical_context_parallel_sizes[0]
                                                      : 0;
    if (group > 0 && hkv % group != 0 && group % hkv != 0) {
      ulysses::testing::expect_same_error_everywhere(
          comm, [&] { (void)attn.forward(out.view(), q.view(), k.view(), v.view()); }, "does not fit");
      continue;
    }
    const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
    attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
    EXPECT_LT(relative_error(out.view(), select_rows(rout, pos)), tol_out);
    EXPECT_LT(relative_error(dq.view(), select_rows(rdq, pos)), tol_grad);
    EXPECT_LT(relative_error(dk.view(), select_rows(rdk, pos)), tol_grad);
    EXPECT_LT(relative_error(dv.view(), select_rows(rdv, pos)), tol_grad);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, StrategyTest,
    ::testing::Values(Case{1, 8, 1, 0, 8, false, Layout::bshd, DType::f32},
                      Case{2, 12, 2, 0, 16, true, Layout::bshd, DType::f32},    // batch > 1
                      Case{2, 12, 2, 0, 16, true, Layout::sbhd, DType::f32},    // seq-first
                      Case{2, 10, 2, 1, 16, true, Layout::bshd, DType::f32},    // MQA
                      Case{1, 8, 4, 2, 8, true, Layout::bshd, DType::f32},      // GQA, 2 KV heads
                      Case{1, 70, 2, 0, 32, true, Layout::bshd, DType::f32},    // crosses a kernel block
                      Case{2, 12, 2, 1, 16, false, Layout::sbhd, DType::bf16},  // bf16, MQA
                      Case{1, 16, 1, 0, 64, true, Layout::bshd, DType::bf16}),
    [](const auto& info) { return name_of(info.param); });

TEST(Ulysses, OddTokensPerRankWithoutZigzag) {
  // a2a never zigzags, so s/cp may be odd even under a causal mask.
  MpiCommunicator comm;
  const int cp = comm.size();
  const std::int64_t sl = 9, s = sl * cp, h = 2 * cp, d = 8;
  Tensor gq({1, s, h, d}), q({1, sl, h, d}), out(q.shape());
  fill_uniform(gq.view(), 5);
  const CpConfig cfg{"a2a", {}, true, 0.0f};
  const auto chunks = rank_chunks(cfg, cp, comm.rank(), s);
  shard_sequence(gq.view(), q.view(), chunks);
  ContextParallelAttention attn(comm, cfg);
  (void)attn.forward(out.view(), q.view(), q.view(), q.view());
  const RefTensor rq = RefTensor::from(gq.view());
  RefTensor rout;
  std::vector<double> lse;
  reference_attention_forward(rout, lse, rq, rq, rq, {true, 0.0f, 0, 0});
  EXPECT_LT(relative_error(out.view(), select_rows(rout, token_positions(chunks))), 1e-5);
}

// What the CLI does with every input and output: shards cut from a global tensor or drawn in
// place, gathered back to rank 0, are the global tensor bit for bit (rounded to the shards'
// dtype), for contiguous and zigzag chunks, both layouts and both dtypes.
TEST(Sharding, GatheringShardsGivesTheGlobalTensorBack) {
  MpiCommunicator comm;
  const int cp = comm.size(), rank = comm.rank();
  const Shape g{2, 4 * cp, 3, 8};
  Tensor global(g);
  fill_uniform(global.view(), 7);
  for (const CpConfig& cfg : {CpConfig{"a2a", {}, true, 0.0f}, CpConfig{"p2p", {}, true, 0.0f}})
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
          EXPECT_EQ(comm.counters().at("report").bytes_sent, rank == 0 ? 0 : shard.shape.numel() * 4);
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

// Bytes each rank sends, per operation, for one forward and one backward: the formulas.
TEST(Strategies, BytesAndMessagesEqualTheFormulas) {
  MpiCommunicator comm;
  const int cp = comm.size();
  struct S { std::int64_t b, sl, d, hpr; DType dtype; std::int64_t hkv; };
  for (const S& sh : {S{2, 8, 16, 2, DType::f32, cp}, S{2, 8, 16, 2, DType::bf16, 1}, S{1, 12, 8, 3, DType::f32, 3 * cp},
                      S{3, 4, 32, 1, DType::bf16, 1}}) {
  const std::int64_t b = sh.b, sl = sh.sl, d = sh.d, h = sh.hpr * cp;
  for (auto [dtype, hkv] : {std::pair{sh.dtype, sh.hkv}}) {
    const std::int64_t es = std::int64_t(dtype_size(dtype));
    for (const CpConfig& cfg : strategies(cp, true)) {
      SCOPED_TRACE(describe(cfg) + " " + to_string(dtype));
      Tensor q({b, sl, h, d}, dtype), k({b, sl, hkv, d}, dtype), out(q.shape(), dtype), dk(k.shape(), dtype);
      ContextParallelAttention attn(comm, cfg);
      (void)attn.forward(out.view(), q.view(), k.view(), k.view());  // creates sub-communicators first
      comm.reset_counters();
      const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), k.view());
      const auto fwd = comm.counters();
      comm.reset_counters();
      attn.backward(ctx, out.view(), dk.view(), dk.view(), out.view());
      const auto bwd = comm.counters();
      auto bytes = [](const std::map<std::string, CommCounter>& m, const char* op) {
        auto it = m.find(op);
        return it == m.end() ? std::int64_t(0) : it->second.bytes_sent;
      };
      auto msgs = [](const std::map<std::string, CommCounter>& m, const char* op) {
        auto it = m.find(op);
        return it == m.end() ? std::int64_t(0) : it->second.messages;
      };
      // The library's own prediction (the planner's input) must equal the counters too.
      const CommVolume predicted = predicted_comm_volume(cfg, cp, {b, sl * cp, h, d}, hkv, dtype);
      // ... and so must the planner's rows (the same shape planned for this cp).
      PlanInput in;
      in.seq = sl * cp;
      in.batch = b;
      in.heads = h;
      in.kv_heads = hkv;
      in.head_dim = d;
      in.cp = cp;
      in.dtype = dtype;
      for (const PlanRow& r : make_plan(in).rows)
        if (r.config.cp_comm_type == cfg.cp_comm_type &&
            r.config.hierarchical_context_parallel_sizes == cfg.hierarchical_context_parallel_sizes) {
          EXPECT_TRUE(r.valid) << r.reason;
          std::int64_t f = 0, bw = 0;
          for (const auto& [op, c] : fwd)
            if (!op.ends_with("validate")) f += c.bytes_sent;
          for (const auto& [op, c] : bwd)
            if (!op.ends_with("validate")) bw += c.bytes_sent;
          EXPECT_EQ(r.forward_bytes_per_rank, f) << r.name;
          EXPECT_EQ(r.backward_bytes_per_rank, bw) << r.name;
        }
      for (const auto& [op, n] : predicted.forward_bytes) EXPECT_EQ(bytes(fwd, op.c_str()), n) << op;
      for (const auto& [op, n] : predicted.backward_bytes) EXPECT_EQ(bytes(bwd, op.c_str()), n) << op;
      for (const auto& [op, n] : predicted.forward_messages) EXPECT_EQ(msgs(fwd, op.c_str()), n) << op;
      for (const auto& [op, n] : predicted.backward_messages) EXPECT_EQ(msgs(bwd, op.c_str()), n) << op;
      for (const auto& [op, c] : fwd) EXPECT_TRUE(op.ends_with("validate") || predicted.forward_bytes.count(op)) << op;
      const std::int64_t kv_block = 2 * b * sl * hkv * d;  // own K and V, elements
      const std::string& type = cfg.cp_comm_type;  // the built-ins' formulas, written out again
      if (type == "a2a") {
          // (s/cp)·heads·d·(cp−1)/cp per tensor; KV heads actually sent: max(h_kv, cp).
          const std::int64_t kvs = std::max<std::int64_t>(hkv, cp);
          auto per = [&](std::int64_t heads) { return b * sl * heads * d * (cp - 1) / cp * es; };
          EXPECT_EQ(bytes(fwd, "seq_to_head"), per(h) + 2 * per(kvs));
          EXPECT_EQ(bytes(fwd, "head_to_seq"), per(h));
          EXPECT_EQ(bytes(bwd, "seq_to_head"), per(h));
          EXPECT_EQ(bytes(bwd, "head_to_seq"), per(h) + 2 * per(kvs));
      } else if (type == "p2p") {  // K/V once around the ring; dK/dV (float32) all the way home
          EXPECT_EQ(bytes(fwd, "p2p_kv"), (cp - 1) * kv_block * es);
          EXPECT_EQ(msgs(fwd, "p2p_kv"), cp - 1);
          EXPECT_EQ(bytes(bwd, "p2p_kv"), (cp - 1) * kv_block * es);
          EXPECT_EQ(bytes(bwd, "p2p_dkv"), cp > 1 ? cp * kv_block * 4 : 0);
          EXPECT_EQ(msgs(bwd, "p2p_dkv"), cp > 1 ? cp : 0);
      } else if (type == "all_gather") {
          EXPECT_EQ(bytes(fwd, "all_gather_kv"), (cp - 1) * kv_block * es);
          EXPECT_EQ(bytes(bwd, "all_gather_dkv"), (cp - 1) * kv_block * 4);
      } else if (type == "a2a+p2p") {
          // Ulysses inside groups of I ranks (KV heads sent: h_kv or I when replicated),
          // then the ring over O members, each holding I·sl tokens of kvs/I KV heads.
          const int I = cfg.hierarchical_context_parallel_sizes[0], O = cfg.hierarchical_context_parallel_sizes[1];
          const std::int64_t kvs = hkv % I == 0 ? hkv : I, ring_block = 2 * b * sl * kvs * d;
          auto per = [&](std::int64_t heads) { return b * sl * heads * d * (I - 1) / I * es; };
          EXPECT_EQ(bytes(fwd, "inner.seq_to_head"), per(h) + 2 * per(kvs));
          EXPECT_EQ(bytes(fwd, "inner.head_to_seq"), per(h));
          EXPECT_EQ(bytes(fwd, "outer.p2p_kv"), (O - 1) * ring_block * es);
          EXPECT_EQ(msgs(fwd, "outer.p2p_kv"), O - 1);
          EXPECT_EQ(bytes(bwd, "inner.seq_to_head"), per(h));
          EXPECT_EQ(bytes(bwd, "inner.head_to_seq"), per(h) + 2 * per(kvs));
          EXPECT_EQ(bytes(bwd, "outer.p2p_kv"), (O - 1) * ring_block * es);
          EXPECT_EQ(bytes(bwd, "outer.p2p_dkv"), O > 1 ? O * ring_block * 4 : 0);
      }
    }
  }
  }
}

// One attention problem: global tensors, this rank's shards, outputs, and the float64 answers.
struct Problem {
  Tensor q, k, v, dout, out, dq, dk, dv;
  RefTensor rout, rdq, rdk, rdv;
  Problem(const CpConfig& cfg, int cp, int rank, Shape global, std::uint64_t seed) {
    Tensor g[4] = {Tensor(global), Tensor(global), Tensor(global), Tensor(global)};
    for (int i = 0; i < 4; ++i) fill_uniform(g[i].view(), seed + std::uint64_t(i));
    const auto chunks = rank_chunks(cfg, cp, rank, global.s);
    const Shape local{global.b, global.s / cp, global.h, global.d};
    for (Tensor* t : {&q, &k, &v, &dout, &out, &dq, &dk, &dv}) *t = Tensor(local);
    Tensor* in[4] = {&q, &k, &v, &dout};
    for (int i = 0; i < 4; ++i) shard_sequence(g[i].view(), in[i]->view(), chunks);
    const RefTensor rq = RefTensor::from(g[0].view()), rk = RefTensor::from(g[1].view()), rv = RefTensor::from(g[2].view());
    const AttentionParams p{cfg.causal, 0.0f, 0, 0};
    std::vector<double> lse;
    reference_attention_forward(rout, lse, rq, rk, rv, p);
    reference_attention_backward(rdq, rdk, rdv, RefTensor::from(g[3].view()), rq, rk, rv, p);
    const std::vector<std::int64_t> pos = token_positions(chunks);
    rout = select_rows(rout, pos);
    rdq = select_rows(rdq, pos);
    rdk = select_rows(rdk, pos);
    rdv = select_rows(rdv, pos);
  }
  void expect_matches() const {
    EXPECT_LT(relative_error(out.view(), rout), 1e-5);
    EXPECT_LT(relative_error(dq.view(), rdq), 1e-4);
    EXPECT_LT(relative_error(dk.view(), rdk), 1e-4);
    EXPECT_LT(relative_error(dv.view(), rdv), 1e-4);
  }
};

TEST(Strategies, SeveralForwardsInFlightBeforeTheirBackwards) {
  // Two layers (or micro-batches, or a checkpointed recompute): both forwards run before
  // either backward, and the backwards run in reverse order, as autograd does.
  MpiCommunicator comm;
  const int cp = comm.size();
  for (const CpConfig& cfg : strategies(cp, true)) {
    SCOPED_TRACE(describe(cfg));
    ContextParallelAttention attn(comm, cfg);
    Problem a(cfg, cp, comm.rank(), {2, 8 * cp, 2 * cp, 16}, 10), b(cfg, cp, comm.rank(), {2, 8 * cp, 2 * cp, 16}, 20);
    const CpContext ca = attn.forward(a.out.view(), a.q.view(), a.k.view(), a.v.view());
    const CpContext cb = attn.forward(b.out.view(), b.q.view(), b.k.view(), b.v.view());
    attn.backward(cb, b.dq.view(), b.dk.view(), b.dv.view(), b.dout.view());
    attn.backward(ca, a.dq.view(), a.dk.view(), a.dv.view(), a.dout.view());
    a.expect_matches();
    b.expect_matches();
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

TEST(Strategies, ZigzagGivesEveryRankTheSameCausalWork) {
  MpiCommunicator comm;
  const int cp = comm.size();
  const std::int64_t b = 1, sl = 16, h = 2 * cp, d = 8, s = sl * cp;
  for (const CpConfig& cfg : strategies(cp, true)) {
    SCOPED_TRACE(describe(cfg));
    Tensor q({b, sl, h, d}), out(q.shape());
    ContextParallelAttention attn(comm, cfg);
    const CpContext ctx = attn.forward(out.view(), q.view(), q.view(), q.view());
    std::int64_t w[2] = {ctx.stats().score_pairs, ctx.stats().score_pairs};
    comm.allreduce_min(&w[0], 1);
    comm.allreduce_max(&w[1], 1);
    EXPECT_EQ(w[0], w[1]) << "ranks do different amounts of causal work";
    double total = double(ctx.stats().score_pairs);
    comm.allreduce_sum(&total, 1);
    EXPECT_EQ(total, double(b * h * s * (s + 1) / 2));  // every visible pair exactly once
  }
}

TEST(Errors, HeadsNotDivisibleByCpNamesValuesRuleAndP2p) {
  MpiCommunicator comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP();
  Tensor q({1, 4, cp + 1, 8}), k({1, 4, 1, 8}), out({1, 4, cp + 1, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  const std::string values = "num_heads (" + std::to_string(cp + 1) + ") must be divisible by cp (" + std::to_string(cp) + ")";
  ulysses::testing::expect_same_error_everywhere(comm, [&] { (void)attn.forward(out.view(), q.view(), k.view(), k.view()); }, values);
  ulysses::testing::expect_same_error_everywhere(comm, [&] { (void)attn.forward(out.view(), q.view(), k.view(), k.view()); }, "p2p");
  // ... and p2p really has no such constraint.
  ContextParallelAttention ring(comm, CpConfig{"p2p", {}, false, 0.0f});
  (void)ring.forward(out.view(), q.view(), k.view(), k.view());
}

TEST(Errors, InvalidKvHeadsGiveTheSameErrorEverywhere) {
  MpiCommunicator comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP();
  const std::int64_t hkv = cp + 1, h = cp * hkv;  // neither hkv % cp nor cp % hkv is 0
  Tensor q({1, 4, h, 8}), k({1, 4, hkv, 8}), out({1, 4, h, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(out.view(), q.view(), k.view(), k.view()); },
      "num_kv_heads (" + std::to_string(hkv) + ") does not fit cp (" + std::to_string(cp) + ")");
}

TEST(Errors, ShapesThatDifferBetweenRanksAreRefusedEverywhere) {
  MpiCommunicator comm;
  const int cp = comm.size();
  if (cp == 1) GTEST_SKIP();
  const std::int64_t sl = comm.rank() == cp - 1 ? 6 : 4;
  Tensor q({2, sl, cp, 8}), out({2, sl, cp, 8});
  for (const CpConfig& cfg : strategies(cp, true)) {
    ContextParallelAttention attn(comm, cfg);
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); },
        "rank 0 has q [2, 4, " + std::to_string(cp) + ", 8]");
  }
}

TEST(Errors, LocalShapeErrorsAndMisuseAreAgreed) {
  MpiCommunicator comm;
  const int cp = comm.size();
  Tensor q({1, 4, cp, 8}), bad_out({1, 4, cp, 16}), out_ok({1, 4, cp, 8});
  ContextParallelAttention attn(comm, CpConfig{});
  const TensorView out = comm.rank() == cp - 1 ? bad_out.view() : out_ok.view();  // only the last rank is wrong
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(out, q.view(), q.view(), q.view()); }, "out must be [1, 4, ");
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { attn.backward(CpContext(), q.view(), q.view(), q.view(), q.view()); }, "without a successful forward");
}

TEST(Errors, HierarchicalSizesMustMultiplyToCp) {
  MpiCommunicator comm;
  const int cp = comm.size();
  Tensor q({1, 4, cp, 8}), out({1, 4, cp, 8});
  for (std::vector<int> sizes : {std::vector<int>{cp, 2}, {}, {cp}, {0, cp}, {cp, 1, 1}}) {
    ContextParallelAttention attn(comm, CpConfig{"a2a+p2p", sizes, false, 0.0f});
    ulysses::testing::expect_same_error_everywhere(
        comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); }, "inner * outer == cp");
  }
}

TEST(Errors, ZigzagNeedsEvenTokensPerRank) {
  MpiCommunicator comm;
  const int cp = comm.size();
  Tensor q({1, 5, cp, 8}), out({1, 5, cp, 8});
  ContextParallelAttention attn(comm, CpConfig{"p2p", {}, true, 0.0f});
  ulysses::testing::expect_same_error_everywhere(
      comm, [&] { (void)attn.forward(out.view(), q.view(), q.view(), q.view()); },
      "sequence length (" + std::to_string(5 * cp) + ") must be divisible by 2*cp (" + std::to_string(2 * cp) + ")");
}

TEST(Errors, GatheringShardsThatDoNotFitIsRefusedEverywhere) {
  MpiCommunicator comm;
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
