// Prints the errors of bf16 compute against float64 for every strategy at cp = 1, 2, 4, 8 (ranks
// as threads: the local communicator), beside one process computing the same bf16 inputs in
// float32, on the CPU's level and on the emulated AVX512_BF16 one: the table of
// docs/strategies.md#bf16-compute. Usage: bf16_error_table [s [emulated]].
#include <fmt/format.h>
#include <omp.h>

#include <cstdlib>
#include <string>

#include "kernels/engines.hpp"
#include "kernels/isa.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/comm/local_communicator.hpp"
#include "ulysses/kernels/reference_attention.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"

using namespace ulysses;

namespace {

constexpr std::int64_t kHeads = 8, kKvHeads = 2, kHeadDim = 64;

struct Problem {
  Tensor q, k, v, dout;
  RefTensor out, dq, dk, dv;
  Problem(std::int64_t s, bool causal)
      : q({1, s, kHeads, kHeadDim}, DType::bf16), k({1, s, kKvHeads, kHeadDim}, DType::bf16), v(k.shape(), DType::bf16),
        dout(q.shape(), DType::bf16) {
    std::uint64_t seed = 1;
    for (Tensor* t : {&q, &k, &v, &dout}) fill_uniform(t->view(), seed++);
    const RefTensor rq = RefTensor::from(q.view()), rk = RefTensor::from(k.view()), rv = RefTensor::from(v.view());
    std::vector<double> lse;
    reference_attention_forward(out, lse, rq, rk, rv, {causal});
    reference_attention_backward(dq, dk, dv, RefTensor::from(dout.view()), rq, rk, rv, {causal});
  }
  std::string errors(const Tensor& o, const Tensor& a, const Tensor& b, const Tensor& c) const {
    return fmt::format("{:.2e} / {:.2e} / {:.2e} / {:.2e}", relative_error(o.view(), out), relative_error(a.view(), dq),
                       relative_error(b.view(), dk), relative_error(c.view(), dv));
  }
};

// One process, the bf16 inputs widened to float32, outputs rounded to bf16 (what --check prints).
std::string float32_compute(const Problem& p, bool causal) {
  const Tensor q = copy_of(p.q.view(), DType::f32), k = copy_of(p.k.view(), DType::f32),
               v = copy_of(p.v.view(), DType::f32), dout = copy_of(p.dout.view(), DType::f32);
  Tensor out(q.shape()), lse = lse_tensor(q.shape());
  Tensor dq(q.shape(), DType::bf16), dk(k.shape(), DType::bf16), dv(k.shape(), DType::bf16);
  flash_attention_forward(out.view(), lse.view(), q.view(), k.view(), v.view(), {causal});
  flash_attention_backward(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(), out.view(),
                           lse.view(), {causal});
  return p.errors(copy_of(out.view(), DType::bf16), dq, dk, dv);
}

// `cfg` on cp ranks as threads, its outputs gathered into global bf16 tensors.
std::string strategy_errors(const Problem& p, const CpConfig& cfg, int cp) {
  Tensor out(p.q.shape(), DType::bf16), dq(p.q.shape(), DType::bf16), dk(p.k.shape(), DType::bf16),
      dv(p.k.shape(), DType::bf16);
  run_local(cp, [&](Communicator& comm) {
    omp_set_num_threads(1);
    const std::vector<SeqChunk> chunks = rank_chunks(cfg, cp, comm.rank(), p.q.shape().s);
    auto shard = [&](const Tensor& t) { return shard_of(t.view(), chunks, DType::bf16, Layout::bshd); };
    const Tensor q = shard(p.q), k = shard(p.k), v = shard(p.v), dout = shard(p.dout);
    Tensor o(q.shape(), DType::bf16), a(q.shape(), DType::bf16), b(k.shape(), DType::bf16), c(k.shape(), DType::bf16);
    ContextParallelAttention attn(comm, cfg);
    const CpContext ctx = attn.forward(o.view(), q.view(), k.view(), v.view());
    attn.backward(ctx, a.view(), b.view(), c.view(), dout.view());
    for (auto [local, global] : {std::pair{&o, &out}, {&a, &dq}, {&b, &dk}, {&c, &dv}})
      unshard_sequence(local->view(), global->view(), chunks);  // disjoint rows per rank
  });
  return p.errors(out, dq, dk, dv);
}

// cp 1, then every strategy at 2, 4, 8 (a hierarchical one with inner size 2, at cp 2 with 1:
// a ring either way).
std::vector<std::pair<int, CpConfig>> configs(bool causal) {
  std::vector<std::pair<int, CpConfig>> out{{1, CpConfig{"p2p", {}, causal, std::nullopt}}};
  for (int cp : {2, 4, 8})
    for (const Strategy* strategy : strategies())
      for (const CpConfig& c : strategy->plan_configs(cp, causal))
        if (!strategy->hierarchical() || c.hierarchical_context_parallel_sizes[0] == (cp == 2 ? 1 : 2))
          out.emplace_back(cp, c);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t s = argc > 1 ? std::atoll(argv[1]) : 2048;
  static const kernels::KernelLevel emulated{"emulated-avx512bf16", &kernels::emulated::avx512_f32,
                                             &kernels::emulated::avx512_bf16, kernels::emulated::avx512_vec};
  const bool emulate = argc > 2;
  fmt::print("s {}, h {}, h_kv {}, d {}; errors out / dq / dk / dv\n", s, kHeads, kKvHeads, kHeadDim);
  for (bool causal : {true, false}) {
    const Problem p(s, causal);
    fmt::print("{} | float32 compute, one process | {}\n", causal ? "causal" : "full", float32_compute(p, causal));
    kernels::use_level_for_testing(emulate ? &emulated : nullptr);
    for (const auto& [cp, cfg] : configs(causal))
      fmt::print("{} | {} cp {} on {} | {}\n", causal ? "causal" : "full",
                 find_strategy(cfg.cp_comm_type).config_name(cfg), cp, kernels::active_level().name,
                 strategy_errors(p, cfg, cp));
    std::fflush(stdout);
    kernels::use_level_for_testing(nullptr);
  }
}
