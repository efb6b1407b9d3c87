#include "ring_attention.hpp"


#include <algorithm>
#include <limits>

#include "merge.hpp"
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

bool hidden(const SeqChunk& q, const SeqChunk& k, bool causal) {
  return causal && k.begin > q.begin + q.length - 1;
}

// The K/V of the current ring step as float32 (converting from the wire dtype if needed).
TensorView compute_view(const Tensor& wire, Tensor& scratch) {
  if (wire.dtype() == DType::f32) return wire.view();
  copy(wire.view(), scratch.view());
  return scratch.view();
}


}  // namespace

std::int64_t visible_pairs(const SeqChunk& q, const SeqChunk& k, bool causal) {
  if (!causal) return q.length * k.length;
  std::int64_t n = 0;
  for (std::int64_t p = q.begin; p < q.begin + q.length; ++p) n += std::clamp<std::int64_t>(p - k.begin + 1, 0, k.length);
  return n;
}

void ring_attention_forward(Communicator& ring, const TensorView& out, RingSaved& saved, const TensorView& q,
                            const TensorView& k, const TensorView& v,
                            std::vector<std::vector<SeqChunk>> chunks, const AttentionParams& params,
                            DType wire, CpStats& stats) {
  const int R = ring.size(), me = ring.rank();
  const Shape& ks = k.shape;
  const std::int64_t B = q.shape.b, H = q.shape.h;
  saved = RingSaved{q, out, Tensor({2 * ks.b, ks.s, ks.h, ks.d}), {}, std::move(chunks), params, wire};
  copy(k, kv_half(saved.kv.view(), 0));
  copy(v, kv_half(saved.kv.view(), 1));
  const std::vector<SeqChunk>& mine = saved.chunks[std::size_t(me)];

  Tensor buf[2] = {Tensor::uninitialized(saved.kv.shape(), wire), Tensor::uninitialized(saved.kv.shape(), wire)};
  Tensor scratch = wire == DType::f32 ? Tensor() : Tensor::uninitialized(saved.kv.shape());
  copy(saved.kv.view(), buf[0].view());
  const std::int64_t maxlen = max_length(saved.chunks);
  Tensor o_part = Tensor::uninitialized({B, maxlen, H, q.shape.d});
  Tensor lse_buffer = lse_tensor({B, maxlen, H, 1});
  zero(out);
  for (const SeqChunk& a : mine) {
    saved.lse.push_back(lse_tensor({B, a.length, H, q.shape.d}));
    std::fill_n(saved.lse.back().f32(), B * H * a.length, kNegInf);
  }

  for (int step = 0; step < R; ++step) {
    const int src = (me - step + R) % R, cur = step % 2;
    Request send, recv;
    if (step + 1 < R) {  // post the next step's transfer before computing this one
      recv = ring.irecv(buf[1 - cur].data(), buf[cur].nbytes(), (me - 1 + R) % R, kTagKv);
      send = ring.isend(buf[cur].data(), buf[cur].nbytes(), (me + 1) % R, kTagKv, "p2p_kv");
    }
    double t0 = ring.now();
    const TensorView kv = compute_view(buf[cur], scratch);
    const std::vector<SeqChunk>& theirs = saved.chunks[std::size_t(src)];
    for (std::size_t ia = 0; ia < mine.size(); ++ia)
      for (std::size_t ic = 0; ic < theirs.size(); ++ic) {
        const SeqChunk &a = mine[ia], &c = theirs[ic];
        if (hidden(a, c, params.causal)) continue;
        AttentionParams p = params;
        p.q_offset = a.begin;
        p.k_offset = c.begin;
        const std::int64_t ra = chunk_row(mine, ia), rc = chunk_row(theirs, ic);
        const TensorView op = rows(o_part.view(), 0, a.length);
        const TensorView lp = TensorView::dense(lse_buffer.data(), DType::f32, {B, a.length, H, 1}, Layout::bhsd);
        flash_attention_forward(op, lp, rows(q, ra, a.length), rows(kv_half(kv, 0), rc, c.length),
                                rows(kv_half(kv, 1), rc, c.length), p);
        merge_attention(rows(out, ra, a.length), saved.lse[ia].f32(), op, lse_buffer.f32());
        stats.score_pairs += visible_pairs(a, c, params.causal) * B * H;
        recv.test();  // let MPI progress the transfer between tiles
        send.test();
      }
    const double t1 = ring.now();
    stats.compute_s += t1 - t0;
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

  Tensor buf[2] = {Tensor::uninitialized(kvs, saved.wire), Tensor::uninitialized(kvs, saved.wire)};
  Tensor scratch = saved.wire == DType::f32 ? Tensor() : Tensor::uninitialized(kvs);
  copy(saved.kv.view(), buf[0].view());
  Tensor dkv[2] = {Tensor(kvs), Tensor(kvs)}, dkv_in(kvs);
  const std::int64_t maxlen = max_length(saved.chunks);
  Tensor dq_part = Tensor::uninitialized({B, maxlen, H, saved.q.shape.d});
  Tensor dk_part = Tensor::uninitialized({B, maxlen, kvs.h, kvs.d}), dv_part(dk_part.shape());
  zero(dq);
  Request dkv_send[2];

  for (int step = 0; step < R; ++step) {
    const int src = (me - step + R) % R, cur = step % 2;
    Request send, recv, dkv_recv;
    if (step + 1 < R) {
      recv = ring.irecv(buf[1 - cur].data(), buf[cur].nbytes(), (me - 1 + R) % R, kTagKv);
      send = ring.isend(buf[cur].data(), buf[cur].nbytes(), (me + 1) % R, kTagKv, "p2p_kv");
    }
    // The accumulator for `src` arrives from the previous rank, which handled src one step ago.
    if (step > 0) dkv_recv = ring.irecv(dkv_in.data(), dkv_in.nbytes(), (me - 1 + R) % R, kTagDkv);
    double t0 = ring.now();
    dkv_send[cur].wait();  // the buffer's send from two steps ago
    const TensorView acc = dkv[cur].view();
    zero(acc);
    const TensorView kv = compute_view(buf[cur], scratch);
    const std::vector<SeqChunk>& theirs = saved.chunks[std::size_t(src)];
    for (std::size_t ia = 0; ia < mine.size(); ++ia)
      for (std::size_t ic = 0; ic < theirs.size(); ++ic) {
        const SeqChunk &a = mine[ia], &c = theirs[ic];
        if (hidden(a, c, saved.params.causal)) continue;
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
        stats.score_pairs += visible_pairs(a, c, saved.params.causal) * B * H;
        recv.test();
        send.test();
      }
    const double t1 = ring.now();
    stats.compute_s += t1 - t0;
    if (step > 0) {
      dkv_recv.wait();
      accumulate(acc, dkv_in.view());
    }
    if (R > 1) dkv_send[cur] = ring.isend(dkv[cur].data(), dkv[cur].nbytes(), (me + 1) % R, kTagDkv, "p2p_dkv");
    send.wait();
    recv.wait();
    stats.comm_exposed_s += ring.now() - t1;
  }
  const double t2 = ring.now();
  const Tensor* mine_total = &dkv[0];  // R == 1: the only accumulator is ours
  if (R > 1) {
    ring.irecv(dkv_in.data(), dkv_in.nbytes(), (me - 1 + R) % R, kTagDkv).wait();
    mine_total = &dkv_in;
  }
  dkv_send[0].wait();
  dkv_send[1].wait();
  stats.comm_exposed_s += ring.now() - t2;
  copy(kv_half(mine_total->view(), 0), dk);
  copy(kv_half(mine_total->view(), 1), dv);
}

}  // namespace ulysses
