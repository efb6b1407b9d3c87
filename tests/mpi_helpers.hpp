// Helpers shared by the communicator tests (over MPI, or ranks as threads: worlds.hpp).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/comm/mpi_communicator.hpp"
#include "ulysses/kernels/reference_attention.hpp"
#include "ulysses/cp/sharding.hpp"
#include "worlds.hpp"

namespace ulysses::testing {

// Runs `fn`, expecting an Error on every rank whose message contains `needle`, and checks
// that all ranks saw the very same message (compared through its length and a hash).
template <class Fn>
void expect_same_error_everywhere(Communicator& comm, Fn&& fn, const std::string& needle) {
  std::string msg;
  try {
    fn();
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(needle), std::string::npos) << "rank " << comm.rank() << " got: '" << msg << "'";
  std::int64_t fp[2] = {std::int64_t(msg.size()), std::int64_t(std::hash<std::string>{}(msg) >> 1)};
  std::int64_t lo[2] = {fp[0], fp[1]}, hi[2] = {fp[0], fp[1]};
  comm.allreduce_min(lo, 2);
  comm.allreduce_max(hi, 2);
  EXPECT_TRUE(lo[0] == hi[0] && lo[1] == hi[1])
      << "ranks disagree on the error; rank " << comm.rank() << " has: " << msg;
}

// What one forward and then one backward of `attn` sent, each counted from zero. `p` holds the
// rank's out, q, k, v, dout and gradient tensors; `stats` (if given) gets the two calls' CpStats.
struct SentCounters {
  std::map<std::string, CommCounter> fwd, bwd;
};
template <class P>
SentCounters forward_backward_counted(Communicator& comm, ContextParallelAttention& attn, P& p,
                                      std::pair<CpStats, CpStats>* stats = nullptr) {
  comm.reset_counters();
  const CpContext ctx = attn.forward(p.out.view(), p.q.view(), p.k.view(), p.v.view());
  SentCounters sent{comm.counters(), {}};
  comm.reset_counters();
  const CpStats bwd = attn.backward(ctx, p.dq.view(), p.dk.view(), p.dv.view(), p.dout.view());
  sent.bwd = comm.counters();
  if (stats) *stats = {ctx.stats(), bwd};
  return sent;
}

// One causal forward + backward of `cfg` on comm, global q `g` with kv_heads KV heads, on
// random inputs that do not depend on cp.
inline void run_layer(Communicator& comm, const CpConfig& cfg, const Shape& g, std::int64_t kv_heads) {
  const auto chunks = rank_chunks(cfg, comm.size(), comm.rank(), g.s);
  const Shape qs{g.b, total_tokens(chunks), g.h, g.d}, ks{g.b, qs.s, kv_heads, g.d};
  Tensor q(qs), k(ks), v(ks), out(qs), dout(qs), dq(qs), dk(ks), dv(ks);
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&dout, 4}}) fill_uniform_shard(t->view(), seed, chunks);
  ContextParallelAttention attn(comm, cfg);
  const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
  attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
}

// The rows of t [b, s, h, d] at `positions`, in that order (a rank's tokens of a global tensor).
inline RefTensor select_rows(const RefTensor& t, const std::vector<std::int64_t>& positions) {
  RefTensor r({t.shape.b, std::int64_t(positions.size()), t.shape.h, t.shape.d});
  for (std::int64_t b = 0; b < t.shape.b; ++b)
    for (std::size_t s = 0; s < positions.size(); ++s)
      for (std::int64_t h = 0; h < t.shape.h; ++h)
        for (std::int64_t x = 0; x < t.shape.d; ++x) r.at(b, std::int64_t(s), h, x) = t.at(b, positions[s], h, x);
  return r;
}

}  // namespace ulysses::testing
