#include "ring_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "merge.hpp"
#include "ulysses/core/documents.hpp"
#include "tensor_ops.hpp"

namespace ulysses {

namespace {

constexpr int kTagKv = 1, kTagDkv = 2;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::int64_t max_length(const std::vector<std::vector<SeqChunk>>& chunks) {
  std::int64_t n = 0;
  for (const auto& list : chunks)
    for (const SeqChunk& c : list) n = std::max(n, c.length);
  return n;
}

// Rows of the member holding the most tokens: every ring buffer is sized for it.
std::int64_t max_rows(const std::vector<std::vector<SeqChunk>>& chunks) {
  std::int64_t n = 0;
  for (const auto& list : chunks) n = std::max(n, total_tokens(list));
  return n;
}

// A member's K|V [2b, rows, h_kv, d] at the start of a buffer sized for the largest member:
// what travels is exactly the member's rows, never the buffer's padding.
TensorView member_kv(const Tensor& buffer, std::int64_t rows) {
  const Shape& s = buffer.shape();
  return TensorView::dense(buffer.data(), buffer.dtype(), {s.b, rows, s.h, s.d}, Layout::bshd, buffer.device());
}

// Posts the next step's K/V transfer: `held` (member src's) to the next rank, member src − 1's
// from the previous rank into `next`. Nothing at the last step.
void post_kv_step(Communicator& ring, int step, const RingSaved& saved, const TensorView& held, const Tensor& next,
                  Request& send, Request& recv) {
  const int R = ring.size(), me = ring.rank();
  if (step + 1 >= R) return;
  const std::vector<SeqChunk>& arriving = saved.chunks[std::size_t((me - step - 1 + 2 * R) % R)];
  recv = ring.irecv(buffer_of(member_kv(next, total_tokens(arriving))), (me - 1 + R) % R, kTagKv);
  send = ring.isend(buffer_of(held), (me + 1) % R, kTagKv, "p2p_kv");
}

// What the watchdog says this rank was doing.
std::string ring_step_name(const char* pass, int step, int R) {
  return std::string("ring ") + pass + " step " + std::to_string(step + 1) + " of " + std::to_string(R);
}

// Rows of ring member r.
std::int64_t member_rows(const RingSaved& saved, int r) { return total_tokens(saved.chunks[std::size_t(r)]); }

}  // namespace

PairScratch::PairScratch(const RingSaved& saved, bool backward) {
  const std::int64_t B = saved.q.shape.b, H = saved.q.shape.h;
  const std::int64_t n = std::max(max_length(saved.chunks), max_length({saved.queries}));  // keys', queries' rows
  const Shape kvs = saved.kv.shape();
  const Device dev = saved.q.device;
  if (!backward) {
    o = Tensor::uninitialized({B, n, H, saved.q.shape.d}, DType::f32, Layout::bshd, dev);
    lse = lse_tensor({B, n, H, 1}, dev);
    return;
  }
  dq = Tensor::uninitialized({B, n, H, saved.q.shape.d}, DType::f32, Layout::bshd, dev);
  dk = Tensor::uninitialized({kvs.b / 2, n, kvs.h, kvs.d}, DType::f32, Layout::bshd, dev);
  dv = Tensor::uninitialized(dk.shape(), DType::f32, Layout::bshd, dev);
}

namespace {

// Calls f(ia, ic, p) for every (own query chunk ia, key chunk ic) pair the mask does not hide
// entirely, p: the kernel's params with the chunks' global positions as offsets.
template <typename F>
void for_each_visible_pair(const RingSaved& saved, const std::vector<SeqChunk>& keys, CpStats& stats, F&& f) {
  const std::vector<SeqChunk>& mine = saved.queries;
  for (std::size_t ia = 0; ia < mine.size(); ++ia)
    for (std::size_t ic = 0; ic < keys.size(); ++ic) {
      const std::int64_t pairs = visible_pairs(saved.params, mine[ia], keys[ic]);
      if (pairs == 0) continue;  // hidden entirely (causal, window, no document in common)
      AttentionParams p = saved.params;
      p.q_offset = mine[ia].begin;
      p.k_offset = keys[ic].begin;
      f(ia, ic, p);
      stats.score_pairs += pairs * saved.q.shape.b * saved.q.shape.h;
    }
}

}  // namespace

void forward_pairs(RingSaved& saved, const TensorView& out, const TensorView& kv, const std::vector<SeqChunk>& keys,
                   PairScratch& scratch, CpStats& stats, const std::function<void()>& progress) {
  const std::vector<SeqChunk>& mine = saved.queries;
  const std::int64_t B = saved.q.shape.b, H = saved.q.shape.h;
  for_each_visible_pair(saved, keys, stats, [&](std::size_t ia, std::size_t ic, const AttentionParams& p) {
    const SeqChunk &a = mine[ia], &c = keys[ic];
    const std::int64_t ra = chunk_row(mine, ia), rc = chunk_row(keys, ic);
    const TensorView op = rows(scratch.o.view(), 0, a.length);
    const TensorView lp =
        TensorView::dense(scratch.lse.data(), DType::f32, {B, a.length, H, 1}, Layout::bhsd, scratch.lse.device());
    flash_attention_forward(op, lp, rows(saved.q, ra, a.length), rows(kv_half(kv, 0), rc, c.length),
                            rows(kv_half(kv, 1), rc, c.length), p);
    merge_attention(rows(out, ra, a.length), saved.lse[ia].view(), op, lp);
    progress();
  });
}

void backward_pairs(const RingSaved& saved, const TensorView& dq, const TensorView& dkv, const TensorView& dout,
                    const TensorView& kv, const std::vector<SeqChunk>& keys, PairScratch& scratch, CpStats& stats,
                    const std::function<void()>& progress) {
  const std::vector<SeqChunk>& mine = saved.queries;
  for_each_visible_pair(saved, keys, stats, [&](std::size_t ia, std::size_t ic, const AttentionParams& p) {
    const SeqChunk &a = mine[ia], &c = keys[ic];
    const std::int64_t ra = chunk_row(mine, ia), rc = chunk_row(keys, ic);
    const TensorView dqp = rows(scratch.dq.view(), 0, a.length), dkp = rows(scratch.dk.view(), 0, c.length),
                     dvp = rows(scratch.dv.view(), 0, c.length);
    flash_attention_backward(dqp, dkp, dvp, rows(dout, ra, a.length), rows(saved.q, ra, a.length),
                             rows(kv_half(kv, 0), rc, c.length), rows(kv_half(kv, 1), rc, c.length),
                             rows(saved.out, ra, a.length), saved.lse[ia].view(), p);
    accumulate(rows(dq, ra, a.length), dqp);
    accumulate(rows(kv_half(dkv, 0), rc, c.length), dkp);
    accumulate(rows(kv_half(dkv, 1), rc, c.length), dvp);
    progress();
  });
}

StrategyOption per_document_option() {
  StrategyOption o{"per-document",
                   "0|1",
                   "with packed documents under zigzag: 1 (the default) cuts every document into 2*cp chunks and "
                   "zigzags each, balancing the causal work; 0 zigzags the whole sequence",
                   "per_document",
                   "1",
                   1,
                   "",
                   [](const CpConfig& c) {
                     return c.per_document ? std::vector<std::int64_t>() : std::vector<std::int64_t>{0};
                   },
                   [](CpConfig& c, const std::vector<std::int64_t>& v) { c.per_document = v.at(0) != 0; }};
  o.least = 0;
  return o;
}

void ring_attention_forward(Communicator& ring, const TensorView& out, RingSaved& saved, const TensorView& q,
                            const TensorView& k, const TensorView& v, const std::vector<std::vector<SeqChunk>>& chunks,
                            const std::vector<SeqChunk>& queries, const AttentionParams& params, CpStats& stats) {
  const int R = ring.size(), me = ring.rank();
  const Shape& ks = k.shape;
  const std::int64_t B = q.shape.b, H = q.shape.h;
  const DType wire = q.dtype;
  const Device dev = q.device;
  saved = RingSaved{q,      out,    Tensor({2 * ks.b, ks.s, ks.h, ks.d}, wire, Layout::bshd, dev),
                    {},     chunks, queries,
                    params, wire,   me,
                    {},     {}};
  copy(k, kv_half(saved.kv.view(), 0));
  copy(v, kv_half(saved.kv.view(), 1));
  zero(out);
  for (const SeqChunk& a : saved.queries) {
    saved.lse.push_back(lse_tensor({B, a.length, H, q.shape.d}, dev));
    fill(saved.lse.back().view(), kNegInf);
  }
  if (uses_halo(params)) return halo_attention_forward(ring, out, saved, stats);

  const Shape cap{2 * ks.b, max_rows(saved.chunks), ks.h, ks.d};
  Tensor buf[2] = {Tensor::uninitialized(cap, wire, Layout::bshd, dev),
                   Tensor::uninitialized(cap, wire, Layout::bshd, dev)};
  copy(saved.kv.view(), member_kv(buf[0], ks.s));
  PairScratch pair(saved, false);
  for (int step = 0; step < R; ++step) {
    const WatchdogStep named(ring, ring_step_name("forward", step, R));
    const int src = (me - step + R) % R, cur = step % 2;
    const TensorView held = member_kv(buf[cur], member_rows(saved, src));
    Request send, recv;
    post_kv_step(ring, step, saved, held, buf[1 - cur], send, recv);  // before computing this step
    double t0 = ring.now();
    forward_pairs(saved, out, held, saved.chunks[std::size_t(src)], pair, stats, [&] {
      recv.test();  // let MPI progress the transfer between tiles
      send.test();
    });
    const double t1 = ring.now();
    stats.compute_s += t1 - t0;
    ring.trace(fmt::format("fwd step {}/{}", step + 1, R), t0, t1);
    send.wait();
    recv.wait();
    stats.comm_exposed_s += ring.now() - t1;
  }
}

std::vector<SeqChunk> shifted(std::vector<SeqChunk> chunks, std::int64_t offset) {
  for (SeqChunk& c : chunks) c.begin += offset;
  return chunks;
}

void ring_attention_backward(Communicator& ring, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dout, const RingSaved& saved, CpStats& stats) {
  if (uses_halo(saved.params)) return halo_attention_backward(ring, dq, dk, dv, dout, saved, stats);
  const int R = ring.size(), me = ring.rank();
  const Shape kvs = saved.kv.shape();
  const Device dev = saved.q.device;

  const Shape cap{kvs.b, max_rows(saved.chunks), kvs.h, kvs.d};
  Tensor buf[2] = {Tensor::uninitialized(cap, saved.wire, Layout::bshd, dev),
                   Tensor::uninitialized(cap, saved.wire, Layout::bshd, dev)};
  copy(saved.kv.view(), member_kv(buf[0], kvs.s));
  Tensor dkv[2] = {Tensor(cap, DType::f32, Layout::bshd, dev), Tensor(cap, DType::f32, Layout::bshd, dev)},
         dkv_in(cap, DType::f32, Layout::bshd, dev);
  PairScratch pair(saved, true);
  zero(dq);
  Request dkv_send[2];

  for (int step = 0; step < R; ++step) {
    const WatchdogStep named(ring, ring_step_name("backward", step, R));
    const int src = (me - step + R) % R, cur = step % 2;
    const std::int64_t src_rows = member_rows(saved, src);
    const TensorView held = member_kv(buf[cur], src_rows), acc_in = member_kv(dkv_in, src_rows);
    Request send, recv, dkv_recv;
    post_kv_step(ring, step, saved, held, buf[1 - cur], send, recv);
    // The accumulator for `src` arrives from the previous rank, which handled src one step ago.
    if (step > 0) dkv_recv = ring.irecv(buffer_of(acc_in), (me - 1 + R) % R, kTagDkv);
    double t0 = ring.now();
    dkv_send[cur].wait();  // the buffer's send from two steps ago
    const TensorView acc = member_kv(dkv[cur], src_rows);
    zero(acc);
    backward_pairs(saved, dq, acc, dout, held, saved.chunks[std::size_t(src)], pair, stats, [&] {
      recv.test();
      send.test();
    });
    const double t1 = ring.now();
    stats.compute_s += t1 - t0;
    ring.trace(fmt::format("bwd step {}/{}", step + 1, R), t0, t1);
    if (step > 0) {
      dkv_recv.wait();
      accumulate(acc, acc_in);
    }
    if (R > 1) dkv_send[cur] = ring.isend(buffer_of(acc), (me + 1) % R, kTagDkv, "p2p_dkv");
    send.wait();
    recv.wait();
    stats.comm_exposed_s += ring.now() - t1;
  }
  const double t2 = ring.now();
  const TensorView mine_total = member_kv(R > 1 ? dkv_in : dkv[0], kvs.s);  // R == 1: the only accumulator is ours
  if (R > 1) ring.irecv(buffer_of(mine_total), (me - 1 + R) % R, kTagDkv).wait();
  dkv_send[0].wait();
  dkv_send[1].wait();
  stats.comm_exposed_s += ring.now() - t2;
  copy(kv_half(mine_total, 0), dk);
  copy(kv_half(mine_total, 1), dv);
}

}  // namespace ulysses
