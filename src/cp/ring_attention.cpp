#include "ring_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "merge.hpp"
#include "ulysses/documents.hpp"
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
  return TensorView::dense(buffer.data(), buffer.dtype(), {s.b, rows, s.h, s.d}, Layout::bshd);
}

std::size_t bytes_of(const TensorView& v) { return std::size_t(v.shape.numel()) * dtype_size(v.dtype); }

// The K/V of the current ring step as float32 (converting from the wire dtype if needed).
TensorView compute_view(const TensorView& wire, const Tensor& scratch) {
  if (wire.dtype == DType::f32) return wire;
  const TensorView f = member_kv(scratch, wire.shape.s);
  copy(wire, f);
  return f;
}

// Posts the next step's K/V transfer: `held` (member src's) to the next rank, member src − 1's
// from the previous rank into `next`. Nothing at the last step.
void post_kv_step(Communicator& ring, int step, const RingSaved& saved, const TensorView& held, const Tensor& next,
                  Request& send, Request& recv) {
  const int R = ring.size(), me = ring.rank();
  if (step + 1 >= R) return;
  const std::vector<SeqChunk>& arriving = saved.chunks[std::size_t((me - step - 1 + 2 * R) % R)];
  recv = ring.irecv(next.data(), bytes_of(member_kv(next, total_tokens(arriving))), (me - 1 + R) % R, kTagKv);
  send = ring.isend(held.data, bytes_of(held), (me + 1) % R, kTagKv, "p2p_kv");
}

// What the watchdog says this rank was doing.
std::string ring_step_name(const char* pass, int step, int R) {
  return std::string("ring ") + pass + " step " + std::to_string(step + 1) + " of " + std::to_string(R);
}

// Rows of ring member r.
std::int64_t member_rows(const RingSaved& saved, int r) {
  return total_tokens(saved.chunks[std::size_t(r)]);
}

}  // namespace

void ring_attention_forward(Communicator& ring, const TensorView& out, RingSaved& saved, const TensorView& q,
                            const TensorView& k, const TensorView& v,
                            const std::vector<std::vector<SeqChunk>>& chunks, const AttentionParams& params,
                            DType wire, CpStats& stats) {
  const int R = ring.size(), me = ring.rank();
  const Shape& ks = k.shape;
  const std::int64_t B = q.shape.b, H = q.shape.h;
  saved = RingSaved{q, out, Tensor({2 * ks.b, ks.s, ks.h, ks.d}), {}, chunks, params, wire};
  copy(k, kv_half(saved.kv.view(), 0));
  copy(v, kv_half(saved.kv.view(), 1));
  const std::vector<SeqChunk>& mine = saved.chunks[std::size_t(me)];

  const Shape cap{2 * ks.b, max_rows(saved.chunks), ks.h, ks.d};
  Tensor buf[2] = {Tensor::uninitialized(cap, wire), Tensor::uninitialized(cap, wire)};
  Tensor scratch = wire == DType::f32 ? Tensor() : Tensor::uninitialized(cap);
  copy(saved.kv.view(), member_kv(buf[0], ks.s));
  const std::int64_t maxlen = max_length(saved.chunks);
  Tensor o_part = Tensor::uninitialized({B, maxlen, H, q.shape.d});
  Tensor lse_buffer = lse_tensor({B, maxlen, H, 1});
  zero(out);
  for (const SeqChunk& a : mine) {
    saved.lse.push_back(lse_tensor({B, a.length, H, q.shape.d}));
    std::fill_n(saved.lse.back().f32(), B * H * a.length, kNegInf);
  }

  for (int step = 0; step < R; ++step) {
    const WatchdogStep named(ring, ring_step_name("forward", step, R));
    const int src = (me - step + R) % R, cur = step % 2;
    const TensorView held = member_kv(buf[cur], member_rows(saved, src));
    Request send, recv;
    post_kv_step(ring, step, saved, held, buf[1 - cur], send, recv);  // before computing this step
    double t0 = ring.now();
    const TensorView kv = compute_view(held, scratch);
    const std::vector<SeqChunk>& theirs = saved.chunks[std::size_t(src)];
    for (std::size_t ia = 0; ia < mine.size(); ++ia)
      for (std::size_t ic = 0; ic < theirs.size(); ++ic) {
        const SeqChunk &a = mine[ia], &c = theirs[ic];
        // Pairs the mask hides entirely (causal, or no document in common) are skipped.
        const std::int64_t pairs = visible_pairs(params, a, c);
        if (pairs == 0) continue;
        AttentionParams p = params;
        p.q_offset = a.begin;
        p.k_offset = c.begin;
        const std::int64_t ra = chunk_row(mine, ia), rc = chunk_row(theirs, ic);
        const TensorView op = rows(o_part.view(), 0, a.length);
        const TensorView lp = TensorView::dense(lse_buffer.data(), DType::f32, {B, a.length, H, 1}, Layout::bhsd);
        flash_attention_forward(op, lp, rows(q, ra, a.length), rows(kv_half(kv, 0), rc, c.length),
                                rows(kv_half(kv, 1), rc, c.length), p);
        merge_attention(rows(out, ra, a.length), saved.lse[ia].f32(), op, lse_buffer.f32());
        stats.score_pairs += pairs * B * H;
        recv.test();  // let MPI progress the transfer between tiles
        send.test();
      }
    const double t1 = ring.now();
    stats.compute_s += t1 - t0;
    ring.trace(fmt::format("fwd step {}/{}", step + 1, R), t0, t1);
    send.wait();
    recv.wait();
    stats.comm_exposed_s += ring.now() - t1;
  }
}

void ring_attention_backward(Communicator& ring, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dout, const RingSaved& saved, CpStats& stats) {
  const int R = ring.size(), me = ring.rank();
  const Shape kvs = saved.kv.shape();
  const std::int64_t B = saved.q.shape.b, H = saved.q.shape.h;
  const std::vector<SeqChunk>& mine = saved.chunks[std::size_t(me)];

  const Shape cap{kvs.b, max_rows(saved.chunks), kvs.h, kvs.d};
  Tensor buf[2] = {Tensor::uninitialized(cap, saved.wire), Tensor::uninitialized(cap, saved.wire)};
  Tensor scratch = saved.wire == DType::f32 ? Tensor() : Tensor::uninitialized(cap);
  copy(saved.kv.view(), member_kv(buf[0], kvs.s));
  Tensor dkv[2] = {Tensor(cap), Tensor(cap)}, dkv_in(cap);
  const std::int64_t maxlen = max_length(saved.chunks);
  Tensor dq_part = Tensor::uninitialized({B, maxlen, H, saved.q.shape.d});
  Tensor dk_part = Tensor::uninitialized({B, maxlen, kvs.h, kvs.d}), dv_part(dk_part.shape());
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
    if (step > 0) dkv_recv = ring.irecv(acc_in.data, bytes_of(acc_in), (me - 1 + R) % R, kTagDkv);
    double t0 = ring.now();
    dkv_send[cur].wait();  // the buffer's send from two steps ago
    const TensorView acc = member_kv(dkv[cur], src_rows);
    zero(acc);
    const TensorView kv = compute_view(held, scratch);
    const std::vector<SeqChunk>& theirs = saved.chunks[std::size_t(src)];
    for (std::size_t ia = 0; ia < mine.size(); ++ia)
      for (std::size_t ic = 0; ic < theirs.size(); ++ic) {
        const SeqChunk &a = mine[ia], &c = theirs[ic];
        const std::int64_t pairs = visible_pairs(saved.params, a, c);
        if (pairs == 0) continue;
        AttentionParams p = saved.params;
        p.q_offset = a.begin;
        p.k_offset = c.begin;
        const std::int64_t ra = chunk_row(mine, ia), rc = chunk_row(theirs, ic);
        const TensorView dqp = rows(dq_part.view(), 0, a.length), dkp = rows(dk_part.view(), 0, c.length),
                         dvp = rows(dv_part.view(), 0, c.length);
        flash_attention_backward(dqp, dkp, dvp, rows(dout, ra, a.length), rows(saved.q, ra, a.length),
                                 rows(kv_half(kv, 0), rc, c.length), rows(kv_half(kv, 1), rc, c.length),
                                 rows(saved.out, ra, a.length), saved.lse[ia].view(), p);
        accumulate(rows(dq, ra, a.length), dqp);
        accumulate(rows(kv_half(acc, 0), rc, c.length), dkp);
        accumulate(rows(kv_half(acc, 1), rc, c.length), dvp);
        stats.score_pairs += pairs * B * H;
        recv.test();
        send.test();
      }
    const double t1 = ring.now();
    stats.compute_s += t1 - t0;
    ring.trace(fmt::format("bwd step {}/{}", step + 1, R), t0, t1);
    if (step > 0) {
      dkv_recv.wait();
      accumulate(acc, acc_in);
    }
    if (R > 1) dkv_send[cur] = ring.isend(acc.data, bytes_of(acc), (me + 1) % R, kTagDkv, "p2p_dkv");
    send.wait();
    recv.wait();
    stats.comm_exposed_s += ring.now() - t1;
  }
  const double t2 = ring.now();
  const TensorView mine_total = member_kv(R > 1 ? dkv_in : dkv[0], kvs.s);  // R == 1: the only accumulator is ours
  if (R > 1) ring.irecv(mine_total.data, bytes_of(mine_total), (me - 1 + R) % R, kTagDkv).wait();
  dkv_send[0].wait();
  dkv_send[1].wait();
  stats.comm_exposed_s += ring.now() - t2;
  copy(kv_half(mine_total, 0), dk);
  copy(kv_half(mine_total, 1), dv);
}

}  // namespace ulysses
