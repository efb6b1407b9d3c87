// Sliding-window attention over sequence chunks without a ring: a halo exchange (see
// ring_attention.hpp). Every member posts its receives and sends of exactly the K/V rows the
// others' bands reach, computes its own chunks meanwhile, then the halos as they arrive. The
// halos are kept (in the wire dtype, which the kernels compute in) for the backward, which
// sends their float32 dK/dV home.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "ring_attention.hpp"
#include "tensor_ops.hpp"
#include "ulysses/core/saturating.hpp"

namespace ulysses {

namespace {

constexpr int kTagHalo = 3, kTagHaloGrad = 4;

// Calls f(own_row, halo_row, n) for each piece of `halo` (rows of this member's `mine`, in
// order): where it lies in the own K/V and in the halo message.
template <typename F>
void for_each_piece(const std::vector<SeqChunk>& mine, const std::vector<SeqChunk>& halo, F&& f) {
  std::int64_t at = 0;
  for (const SeqChunk& piece : halo) {
    for (std::size_t ic = 0; ic < mine.size(); ++ic) {
      const SeqChunk& c = mine[ic];
      if (piece.begin >= c.begin && piece.begin + piece.length <= c.begin + c.length)
        f(chunk_row(mine, ic) + piece.begin - c.begin, at, piece.length);
    }
    at += piece.length;
  }
}

}  // namespace

bool uses_halo(const AttentionParams& p) { return p.window_left >= 0 && (p.causal || p.window_right >= 0); }

bool uses_halo(const CpConfig& c) { return c.window_left >= 0 && (c.causal || c.window_right >= 0); }

std::vector<SeqChunk> halo_rows(const std::vector<SeqChunk>& queries, const std::vector<SeqChunk>& keys,
                                const AttentionParams& p) {
  const std::int64_t left = p.window_left, right = p.causal ? 0 : p.window_right;
  // Query chunk a sees keys [a.begin − left, a.end + right). The chunks are disjoint, so in
  // position order those reaching a key chunk are one run: its first has the lowest band start,
  // its last the highest band end (O((n + m) log n) for the planner's thousands of chunks).
  std::vector<SeqChunk> q = queries;
  std::sort(q.begin(), q.end(), [](const SeqChunk& x, const SeqChunk& y) { return x.begin < y.begin; });
  std::vector<SeqChunk> out;
  for (const SeqChunk& c : keys) {
    const std::int64_t c_end = c.begin + c.length;
    // Band ends saturate (saturating.hpp): a window up to INT64_MAX reaches every chunk.
    auto band_end = [&](const SeqChunk& a) { return sat_add(a.begin + a.length, right); };
    const auto first =
        std::partition_point(q.begin(), q.end(), [&](const SeqChunk& a) { return band_end(a) <= c.begin; });
    const auto last =
        std::partition_point(first, q.end(), [&](const SeqChunk& a) { return sat_sub(a.begin, left) < c_end; });
    if (first == last) continue;
    const std::int64_t lo = std::max(c.begin, sat_sub(first->begin, left));
    const std::int64_t hi = std::min(c_end, band_end(*(last - 1)));
    if (lo < hi) out.push_back({lo, hi - lo});
  }
  return out;
}

RingSeconds halo_seconds(const Link& link, const CommVolume& v, const std::string& prefix, double fwd_s) {
  auto seconds = [&](const std::map<std::string, std::int64_t>& bytes, const std::map<std::string, std::int64_t>& msgs,
                     const std::string& op) {
    const auto b = bytes.find(prefix + op), m = msgs.find(prefix + op);
    return (b == bytes.end() ? 0.0 : double(b->second) / link.bandwidth) +
           (m == msgs.end() ? 0.0 : double(m->second) * link.latency);
  };
  const double fwd = seconds(v.forward_bytes, v.forward_messages, "p2p_kv");
  return {fwd + seconds(v.backward_bytes, v.backward_messages, "p2p_dkv"), std::min(fwd, fwd_s)};
}

void halo_attention_forward(Communicator& ring, const TensorView& out, RingSaved& saved, CpStats& stats) {
  const int R = ring.size(), me = ring.rank();
  const Shape ks = saved.kv.shape();
  const std::vector<SeqChunk>& mine = saved.chunks[std::size_t(me)];
  const WatchdogStep named(ring, "halo forward");
  const double t0 = ring.now();
  saved.halo_rows.assign(std::size_t(R), {});
  saved.halos.clear();
  saved.halos.resize(std::size_t(R));
  std::vector<Tensor> in(static_cast<std::size_t>(R)), give(static_cast<std::size_t>(R));
  std::vector<Request> recvs(static_cast<std::size_t>(R)), sends(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) {
    if (r == me) continue;
    saved.halo_rows[std::size_t(r)] = halo_rows(mine, saved.chunks[std::size_t(r)], saved.params);
    if (const std::int64_t n = total_tokens(saved.halo_rows[std::size_t(r)]); n > 0) {
      in[std::size_t(r)] = Tensor::uninitialized({ks.b, n, ks.h, ks.d}, saved.wire, Layout::bshd, saved.q.device);
      recvs[std::size_t(r)] = ring.irecv(buffer_of(in[std::size_t(r)]), r, kTagHalo);
    }
    const std::vector<SeqChunk> theirs = halo_rows(saved.chunks[std::size_t(r)], mine, saved.params);
    if (theirs.empty()) continue;
    Tensor& t = give[std::size_t(r)] =
        Tensor::uninitialized({ks.b, total_tokens(theirs), ks.h, ks.d}, saved.wire, Layout::bshd, saved.q.device);
    for_each_piece(mine, theirs, [&](std::int64_t own, std::int64_t at, std::int64_t n) {
      copy(rows(saved.kv.view(), own, n), rows(t.view(), at, n));
    });
    sends[std::size_t(r)] = ring.isend(buffer_of(t), r, kTagHalo, "p2p_kv");
  }
  PairScratch pair(saved, false);
  auto progress = [&] {
    for (Request& x : recvs) x.test();
    for (Request& x : sends) x.test();
  };
  double t1 = ring.now();
  stats.comm_exposed_s += t1 - t0;
  forward_pairs(saved, out, saved.kv.view(), mine, pair, stats, progress);  // while the halos travel
  for (int r = 0; r < R; ++r) {
    if (in[std::size_t(r)].data() == nullptr) continue;
    const double t2 = ring.now();
    stats.compute_s += t2 - t1;
    recvs[std::size_t(r)].wait();
    t1 = ring.now();
    stats.comm_exposed_s += t1 - t2;
    saved.halos[std::size_t(r)] = std::move(in[std::size_t(r)]);
    forward_pairs(saved, out, saved.halos[std::size_t(r)].view(), saved.halo_rows[std::size_t(r)], pair, stats,
                  progress);
  }
  const double t2 = ring.now();
  stats.compute_s += t2 - t1;
  ring.trace("fwd halo", t0, t2);
  for (Request& x : sends) x.wait();
  stats.comm_exposed_s += ring.now() - t2;
}

void halo_attention_backward(Communicator& ring, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dout, const RingSaved& saved, CpStats& stats) {
  const int R = ring.size(), me = ring.rank();
  const std::vector<SeqChunk>& mine = saved.chunks[std::size_t(me)];
  const WatchdogStep named(ring, "halo backward");
  const double t0 = ring.now();
  std::vector<std::vector<SeqChunk>> theirs(static_cast<std::size_t>(R));
  std::vector<Tensor> in(static_cast<std::size_t>(R)), grads(static_cast<std::size_t>(R));
  std::vector<Request> recvs(static_cast<std::size_t>(R)), sends(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) {  // the dK/dV of what we gave each member comes back
    if (r == me) continue;
    theirs[std::size_t(r)] = halo_rows(saved.chunks[std::size_t(r)], mine, saved.params);
    if (theirs[std::size_t(r)].empty()) continue;
    const Shape ks = saved.kv.shape();
    in[std::size_t(r)] = Tensor::uninitialized({ks.b, total_tokens(theirs[std::size_t(r)]), ks.h, ks.d}, DType::f32,
                                               Layout::bshd, saved.q.device);
    recvs[std::size_t(r)] = ring.irecv(buffer_of(in[std::size_t(r)]), r, kTagHaloGrad);
  }
  PairScratch pair(saved, true);
  auto progress = [&] {
    for (Request& x : recvs) x.test();
    for (Request& x : sends) x.test();
  };
  Tensor own(saved.kv.shape(), DType::f32, Layout::bshd, saved.q.device);  // float32 dK|dV of the own rows, zeroed
  zero(dq);
  backward_pairs(saved, dq, own.view(), dout, saved.kv.view(), mine, pair, stats, progress);
  for (int r = 0; r < R; ++r) {
    const Tensor& halo = saved.halos[std::size_t(r)];
    if (halo.data() == nullptr) continue;
    grads[std::size_t(r)] = Tensor(halo.shape(), DType::f32, Layout::bshd, saved.q.device);
    backward_pairs(saved, dq, grads[std::size_t(r)].view(), dout, halo.view(), saved.halo_rows[std::size_t(r)], pair,
                   stats, progress);
    sends[std::size_t(r)] = ring.isend(buffer_of(grads[std::size_t(r)]), r, kTagHaloGrad, "p2p_dkv");
  }
  const double t1 = ring.now();
  stats.compute_s += t1 - t0;
  ring.trace("bwd halo", t0, t1);
  for (int r = 0; r < R; ++r) {
    if (in[std::size_t(r)].data() == nullptr) continue;
    recvs[std::size_t(r)].wait();
    for_each_piece(mine, theirs[std::size_t(r)], [&](std::int64_t own_row, std::int64_t at, std::int64_t n) {
      accumulate(rows(own.view(), own_row, n), rows(in[std::size_t(r)].view(), at, n));
    });
  }
  for (Request& x : sends) x.wait();
  stats.comm_exposed_s += ring.now() - t1;
  copy(kv_half(own.view(), 0), dk);
  copy(kv_half(own.view(), 1), dv);
}

}  // namespace ulysses
