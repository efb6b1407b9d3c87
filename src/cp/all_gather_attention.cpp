#include "all_gather_attention.hpp"


#include <limits>

#include "tensor_ops.hpp"

namespace ulysses {

void all_gather_attention_forward(Communicator& comm, const TensorView& out, AllGatherSaved& saved, const TensorView& q,
                                  const TensorView& k, const TensorView& v,
                                  std::vector<std::vector<SeqChunk>> chunks, const AttentionParams& params,
                                  DType wire, CpStats& stats) {
  const int R = comm.size();
  const Shape& ks = k.shape;
  const std::int64_t B = q.shape.b, H = q.shape.h, S = ks.s * R;
  saved = AllGatherSaved{q, out, Tensor::uninitialized({2 * ks.b, S, ks.h, ks.d}), {}, std::move(chunks), params, wire};

  double t0 = comm.now();
  Tensor local = Tensor::uninitialized({2 * ks.b, ks.s, ks.h, ks.d}, wire);
  copy(k, kv_half(local.view(), 0));
  copy(v, kv_half(local.view(), 1));
  Tensor gathered = Tensor::uninitialized({2 * ks.b * R, ks.s, ks.h, ks.d}, wire);
  comm.allgather(local.data(), gathered.data(), local.nbytes(), "all_gather_kv");
  for (int r = 0; r < R; ++r) {  // rank r's chunks into sequence order
    TensorView block = gathered.view();
    block.shape.b = 2 * ks.b;
    block.data = gathered.view().row(2 * ks.b * r, 0, 0);
    for (int which = 0; which < 2; ++which)
      unshard_sequence(kv_half(block, which), kv_half(saved.kv_full.view(), which), saved.chunks[std::size_t(r)]);
  }
  double t1 = comm.now();
  stats.comm_exposed_s += t1 - t0;

  const std::vector<SeqChunk>& mine = saved.chunks[std::size_t(comm.rank())];
  const TensorView kf = kv_half(saved.kv_full.view(), 0), vf = kv_half(saved.kv_full.view(), 1);
  for (std::size_t ia = 0; ia < mine.size(); ++ia) {
    const SeqChunk& a = mine[ia];
    AttentionParams p = params;
    p.q_offset = a.begin;
    p.k_offset = 0;
    saved.lse.emplace_back(std::size_t(B * H * a.length));
    const std::int64_t ra = chunk_row(mine, ia);
    flash_attention_forward(rows(out, ra, a.length), saved.lse.back().data(), rows(q, ra, a.length), kf, vf, p);
    stats.score_pairs += visible_pairs(a, {0, S}, params.causal) * B * H;
  }
  stats.compute_s += comm.now() - t1;
}

void all_gather_attention_backward(Communicator& comm, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                   const TensorView& dout, const AllGatherSaved& saved, CpStats& stats) {
  const int R = comm.size();
  const Shape full = saved.kv_full.shape();  // [2b, s, h_kv, d]
  const std::int64_t B = saved.q.shape.b, H = saved.q.shape.h, m = full.s / R;
  const std::vector<SeqChunk>& mine = saved.chunks[std::size_t(comm.rank())];
  const TensorView kf = kv_half(saved.kv_full.view(), 0), vf = kv_half(saved.kv_full.view(), 1);

  double t0 = comm.now();
  Tensor dkv_full(full), dk_part = Tensor::uninitialized(kf.shape), dv_part = Tensor::uninitialized(kf.shape);
  for (std::size_t ia = 0; ia < mine.size(); ++ia) {
    const SeqChunk& a = mine[ia];
    AttentionParams p = saved.params;
    p.q_offset = a.begin;
    p.k_offset = 0;
    const std::int64_t ra = chunk_row(mine, ia);
    flash_attention_backward(rows(dq, ra, a.length), dk_part.view(), dv_part.view(), rows(dout, ra, a.length),
                             rows(saved.q, ra, a.length), kf, vf, rows(saved.out, ra, a.length),
                             saved.lse[ia].data(), p);
    accumulate(kv_half(dkv_full.view(), 0), dk_part.view());
    accumulate(kv_half(dkv_full.view(), 1), dv_part.view());
    stats.score_pairs += visible_pairs(a, {0, full.s}, saved.params.causal) * B * H;
  }
  // Rank r's rows of dK/dV, in its local order, as block r of the reduce-scatter.
  Tensor blocks = Tensor::uninitialized({full.b * R, m, full.h, full.d});
  for (int r = 0; r < R; ++r) {
    TensorView block = blocks.view();
    block.shape.b = full.b;
    block.data = blocks.view().row(full.b * r, 0, 0);
    for (int which = 0; which < 2; ++which)
      shard_sequence(kv_half(dkv_full.view(), which), kv_half(block, which), saved.chunks[std::size_t(r)]);
  }
  double t1 = comm.now();
  stats.compute_s += t1 - t0;
  Tensor mine_total = Tensor::uninitialized({full.b, m, full.h, full.d});
  comm.reduce_scatter_sum(blocks.f32(), mine_total.f32(), std::size_t(mine_total.shape().numel()), "all_gather_dkv");
  stats.comm_exposed_s += comm.now() - t1;
  copy(kv_half(mine_total.view(), 0), dk);
  copy(kv_half(mine_total.view(), 1), dv);
}

}  // namespace ulysses
