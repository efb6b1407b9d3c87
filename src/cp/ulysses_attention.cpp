#include "ulysses_attention.hpp"

#include <array>

#include "ring_attention.hpp"

namespace ulysses {

void ulysses_attention_forward(Communicator& comm, const TensorView& out, UlyssesSaved& saved,
                               const TensorView& q, const TensorView& k, const TensorView& v,
                               const AttentionParams& params, int kv_replicas, CpStats& stats) {
  const std::array<SeqShard, 3> in{{{q, 1}, {k, kv_replicas}, {v, kv_replicas}}};
  double t0 = comm.now();
  saved.qkv = seq_to_head(comm, in);  // in the wire dtype: the kernels take bf16 as it is
  double t1 = comm.now();
  saved.params = params;
  saved.kv_replicas = kv_replicas;
  saved.dtype = q.dtype;
  const TensorView hq = saved.qkv.part(0);
  saved.out = FusedHeads(DType::f32, hq.shape.b, hq.shape.s, hq.shape.d, {hq.shape.h});
  saved.lse.assign(std::size_t(hq.shape.b * hq.shape.h * hq.shape.s), 0.0f);
  flash_attention_forward(saved.out.part(0), saved.lse.data(), hq, saved.qkv.part(1),
                          saved.qkv.part(2), params);
  const double t2 = comm.now();
  const std::array<SeqShard, 1> o{{{out, 1}}};
  if (saved.dtype == DType::f32) head_to_seq(comm, saved.out, o);
  else head_to_seq(comm, saved.out.converted(saved.dtype), o);
  stats.compute_s += t2 - t1;
  stats.comm_exposed_s += (t1 - t0) + (comm.now() - t2);
  stats.score_pairs += visible_pairs({0, hq.shape.s}, {0, hq.shape.s}, params.causal) * hq.shape.b * hq.shape.h;
}

void ulysses_attention_backward(Communicator& comm, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const TensorView& dout,
                                const UlyssesSaved& saved, CpStats& stats) {
  const std::array<SeqShard, 1> g{{{dout, 1}}};
  const double t0 = comm.now();
  const FusedHeads hdout = seq_to_head(comm, g);
  const double t1 = comm.now();
  const FusedHeads& qkv = saved.qkv;
  FusedHeads grads(saved.dtype, qkv.batch(), qkv.seq(), qkv.head_dim(),
                   {qkv.local_heads(0), qkv.local_heads(1), qkv.local_heads(2)});
  flash_attention_backward(grads.part(0), grads.part(1), grads.part(2), hdout.part(0), qkv.part(0),
                           qkv.part(1), qkv.part(2), saved.out.part(0), saved.lse.data(),
                           saved.params);
  const double t2 = comm.now();
  const int r = saved.kv_replicas;
  const std::array<SeqShard, 3> out{{{dq, 1}, {dk, r}, {dv, r}}};
  head_to_seq(comm, grads, out);
  stats.compute_s += t2 - t1;
  stats.comm_exposed_s += (t1 - t0) + (comm.now() - t2);
  const std::int64_t s = qkv.seq();
  stats.score_pairs += visible_pairs({0, s}, {0, s}, saved.params.causal) * qkv.batch() * qkv.local_heads(0);
}

}  // namespace ulysses
