// Device-neutral data movement: the strategies, the all-to-all and the sharding helpers run on
// a device whose memory the host cannot touch. The "poison" device's allocator maps its blocks
// PROT_NONE; only its operations table, its attention kernels and the communicator's staging
// (through the table's to_host/from_host) open them, for the duration of one call. Any other
// read or write of tensor memory in src/cp or src/comm/all_to_all.cpp is a SIGSEGV. Every
// strategy, forward and backward, at 1, 2 and 4 ranks (as threads), must then give the CPU's
// results bit for bit.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ulysses/kernels/attention.hpp"
#include "ulysses/infer/cached_attention.hpp"
#include "ulysses/cp/context_parallel.hpp"
#include "ulysses/core/device_ops.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/infer/kv_cache.hpp"
#include "ulysses/comm/local_communicator.hpp"
#include "ulysses/cp/sharding.hpp"
#include "ulysses/cp/strategy.hpp"

using namespace ulysses;

namespace {

constexpr Device kPoison = static_cast<Device>(7);

// The poison device's memory: page-aligned blocks, PROT_NONE except while a Window is open.
// Windows nest across threads (rank threads run ops at once): the blocks open with the first
// and close with the last.
class PoisonMemory final : public Allocator {
 public:
  Device device() const override { return kPoison; }
  void* allocate(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::size_t n = pages(bytes);
    void* p = mmap(nullptr, n, open_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("poison device: out of memory");
    blocks_[p] = n;
    return p;
  }
  void deallocate(void* p, std::size_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    munmap(p, blocks_.at(p));
    blocks_.erase(p);
  }
  void fill_zero(void* p, std::size_t bytes) override;

  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_++ == 0) protect(PROT_READ | PROT_WRITE);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_ == 0) protect(PROT_NONE);
  }

 private:
  static std::size_t pages(std::size_t bytes) {
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
    return (std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
  }
  void protect(int prot) {
    for (const auto& block : blocks_) mprotect(block.first, block.second, prot);
  }
  std::mutex mu_;
  std::map<void*, std::size_t> blocks_;
  int open_ = 0;
};

PoisonMemory& poison_memory() {
  static PoisonMemory m;
  return m;
}

// The host may touch poison memory while one of these lives.
struct Window {
  Window() { poison_memory().open(); }
  ~Window() { poison_memory().close(); }
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
};

void PoisonMemory::fill_zero(void* p, std::size_t bytes) {
  const Window w;
  std::memset(p, 0, bytes);
}

// The poison device's table: the CPU's loops, inside a window.
const DeviceOps& cpu() { return device_ops(Device::cpu); }

const DeviceOps kPoisonOps{
    kPoison,
    &poison_memory(),
    [](std::span<const ViewCopy> copies) {
      const Window w;
      cpu().copy(copies);
    },
    [](const TensorView& dst, float value) {
      const Window w;
      cpu().fill(dst, value);
    },
    [](const TensorView& dst, const TensorView& src) {
      const Window w;
      cpu().accumulate(dst, src);
    },
    [](const TensorView& dst, std::span<const TensorView> srcs) {
      const Window w;
      cpu().sum(dst, srcs);
    },
    [](const TensorView& acc, const TensorView& acc_lse, const TensorView& part, const TensorView& part_lse) {
      const Window w;
      cpu().merge(acc, acc_lse, part, part_lse);
    },
    [](void* host, const void* src, std::size_t bytes) {
      const Window w;
      std::memcpy(host, src, bytes);
    },
    [](void* dst, const void* host, std::size_t bytes) {
      const Window w;
      std::memcpy(dst, host, bytes);
    },
};

TensorView on_cpu(TensorView v) {
  v.device = Device::cpu;
  return v;
}

// Its attention kernels: the CPU's, inside a window.
const AttentionKernels kPoisonKernels{
    kPoison,
    [](const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k, const TensorView& v,
       const AttentionParams& p) {
      const Window w;
      flash_attention_forward(on_cpu(out), on_cpu(lse), on_cpu(q), on_cpu(k), on_cpu(v), p);
    },
    [](const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout, const TensorView& q,
       const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
       const AttentionParams& p) {
      const Window w;
      flash_attention_backward(on_cpu(dq), on_cpu(dk), on_cpu(dv), on_cpu(dout), on_cpu(q), on_cpu(k), on_cpu(v),
                               on_cpu(out), on_cpu(lse), p);
    },
    [](const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k, const TensorView& v,
       const DecodeParams& p) {
      const Window w;
      decode_attention_forward(on_cpu(out), on_cpu(lse), on_cpu(q), on_cpu(k), on_cpu(v), p);
    },
};

void register_poison() {
  static const bool once = [] {
    register_device_ops(kPoisonOps);
    register_attention_kernels(kPoisonKernels);
    return true;
  }();
  (void)once;
}

// `t`'s elements in a new tensor on `device` (the test's own copy: a window when poison).
Tensor on(Device device, const Tensor& t) {
  Tensor out(t.shape(), t.dtype(), t.layout(), device);
  const Window w;
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Window w;
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// One rank's problem on one device: its shards of q, k, v, dout, and the outputs.
struct Problem {
  Tensor q, k, v, dout, out, dq, dk, dv;
  Problem(const Problem& host, Device device)
      : q(on(device, host.q)), k(on(device, host.k)), v(on(device, host.v)), dout(on(device, host.dout)),
        out(on(device, host.out)), dq(on(device, host.dq)), dk(on(device, host.dk)), dv(on(device, host.dv)) {}
  Problem(const CpConfig& cfg, int cp, int rank, const Shape& global, std::int64_t kv_heads, DType dtype) {
    const auto chunks = rank_chunks(cfg, cp, rank, global.s);
    const Shape mine{global.b, total_tokens(chunks), global.h, global.d}, kv{mine.b, mine.s, kv_heads, mine.d};
    int seed = 1;
    for (auto [t, shape] : {std::pair{&q, mine}, {&k, kv}, {&v, kv}, {&dout, mine}}) {
      *t = Tensor(shape, dtype);
      fill_uniform_shard(t->view(), std::uint64_t(seed++), chunks);
    }
    for (auto [t, like] : {std::pair{&out, &q}, {&dq, &q}, {&dk, &k}, {&dv, &k}}) *t = Tensor(like->shape(), dtype);
  }
  void forward_backward(Communicator& comm, const CpConfig& cfg) {
    ContextParallelAttention attn(comm, cfg);
    const CpContext ctx = attn.forward(out.view(), q.view(), k.view(), v.view());
    attn.backward(ctx, dq.view(), dk.view(), dv.view(), dout.view());
  }
};

std::vector<CpConfig> configs(int cp) {
  std::vector<CpConfig> out;
  for (const Strategy* s : strategies())
    for (const CpConfig& c : s->plan_configs(cp, true)) out.push_back(c);
  CpConfig window{"p2p", {}, true};  // the halo exchange
  window.window_left = 3;
  out.push_back(window);
  CpConfig overlap{"a2a", {}, true};  // pipelined transposes
  overlap.overlap_chunks = 2;
  out.push_back(overlap);
  return out;
}

void expect_poison_equals_cpu(int ranks, DType dtype, std::int64_t kv_heads) {
  register_poison();
  run_local(ranks, [&](Communicator& comm) {
    for (const CpConfig& cfg : configs(comm.size())) {
      SCOPED_TRACE(find_strategy(cfg.cp_comm_type).config_name(cfg) + " on " + std::to_string(ranks) + " ranks");
      Problem host(cfg, comm.size(), comm.rank(), {2, 13 * comm.size() + 1, 4 * comm.size(), 16}, kv_heads, dtype);
      Problem poison(host, kPoison);
      host.forward_backward(comm, cfg);
      poison.forward_backward(comm, cfg);
      EXPECT_TRUE(same_bytes(poison.out, host.out));
      EXPECT_TRUE(same_bytes(poison.dq, host.dq));
      EXPECT_TRUE(same_bytes(poison.dk, host.dk));
      EXPECT_TRUE(same_bytes(poison.dv, host.dv));
    }
  });
}

// Inference with the cache and every tensor on `device`: a prompt prefilled (`how`), a next
// turn over it (Ulysses over the cache or pass-Q), then decode steps; every output.
std::vector<Tensor> infer_outputs(Communicator& comm, Device device, KvLayout layout, Prefill how) {
  const int cp = comm.size(), me = comm.rank();
  const std::int64_t h = 4, hkv = 2, d = 8, prompt = 5 * cp + 1, turn = 2 * cp + 1, steps = 3;
  KvCache cache(layout, {1, h, hkv, d, prompt + turn + steps}, cp, me, device);
  std::vector<Tensor> outs;
  std::uint64_t seed = 1;
  auto input = [&](std::int64_t first, std::int64_t n, std::int64_t heads) {
    Tensor t({1, n, heads, d});
    fill_uniform(t.view(), seed++, first);  // rank-independent values of global token positions
    return on(device, t);
  };
  for (const std::int64_t origin : {std::int64_t(0), prompt}) {
    const std::int64_t total = origin == 0 ? prompt : turn, first = origin + total * me / cp;
    std::vector<std::int64_t> rank_tokens;
    for (int r = 0; r < cp; ++r) rank_tokens.push_back(total * (r + 1) / cp - total * r / cp);
    const std::int64_t n = rank_tokens[std::size_t(me)];
    const Tensor q = input(first, n, h), k = input(first, n, hkv), v = input(first, n, hkv);
    outs.emplace_back(Shape{1, n, h, d}, DType::f32, Layout::bshd, device);
    if (origin == 0)
      prefill(comm, cache, how, 0, rank_tokens, q.view(), k.view(), v.view(), outs.back().view());
    else
      extend(comm, cache, 0, rank_tokens, q.view(), k.view(), v.view(), outs.back().view());
  }
  for (std::int64_t t = prompt + turn; t < prompt + turn + steps; ++t) {
    const Tensor q = input(t, 1, h), k = input(t, 1, hkv), v = input(t, 1, hkv);
    outs.emplace_back(Shape{1, 1, h, d}, DType::f32, Layout::bshd, device);
    decode_attention(comm, cache, 0, q.view(), k.view(), v.view(), outs.back().view());
  }
  return outs;
}

TEST(PoisonDevice, InferenceMatchesTheCpuBitForBit) {
  register_poison();
  for (int ranks : {1, 2, 3})
    run_local(ranks, [&](Communicator& comm) {
      for (KvLayout layout : {KvLayout::heads, KvLayout::interleaved})
        for (Prefill how : {Prefill::ulysses, Prefill::ring}) {
          SCOPED_TRACE(std::string(to_string(layout)) + ", " + to_string(how) + ", cp " + std::to_string(ranks));
          const std::vector<Tensor> host = infer_outputs(comm, Device::cpu, layout, how),
                                    poison = infer_outputs(comm, kPoison, layout, how);
          ASSERT_EQ(host.size(), poison.size());
          for (std::size_t i = 0; i < host.size(); ++i) EXPECT_TRUE(same_bytes(poison[i], host[i])) << "output " << i;
        }
    });
}

TEST(PoisonDevice, HostAccessFaults) {
  register_poison();
  Tensor t({1, 1, 1, 4}, DType::f32, Layout::bshd, kPoison);
  EXPECT_EQ(t.view().device, kPoison);
  EXPECT_DEATH(t.f32()[0] = 1.0f, "");
}

TEST(PoisonDevice, EveryStrategyMatchesTheCpuBitForBit) {
  for (int ranks : {1, 2, 4}) expect_poison_equals_cpu(ranks, DType::f32, 2);
}

TEST(PoisonDevice, Bf16AndSharedKvHeads) {
  // One KV head for 4 ranks: the unpack sums the copies of a shared head.
  expect_poison_equals_cpu(4, DType::bf16, 1);
}

TEST(PoisonDevice, ShardAndGatherStayOnTheDevice) {
  register_poison();
  run_local(3, [](Communicator& comm) {
    const CpConfig cfg{"p2p", {}, true};
    const Shape g{1, 20, 2, 8};
    Tensor global(g);
    fill_uniform(global.view(), 5);
    const auto all = all_rank_chunks(cfg, comm.size(), g.s);
    const Tensor device_global = on(kPoison, global);
    const Tensor shard = shard_of(device_global.view(), all[std::size_t(comm.rank())], DType::f32, Layout::bshd);
    EXPECT_EQ(shard.device(), kPoison);
    const Tensor back = gather_global(comm, shard.view(), all, 0);
    if (comm.rank() == 0) {
      EXPECT_EQ(back.device(), kPoison);
      EXPECT_TRUE(same_bytes(back, device_global));
    }
  });
}

TEST(PoisonDevice, TensorsOnTwoDevicesAreRefusedOnEveryRank) {
  register_poison();
  run_local(2, [](Communicator& comm) {
    const CpConfig cfg{"a2a", {}, true};
    Problem host(cfg, comm.size(), comm.rank(), {1, 8, 2, 8}, 2, DType::f32);
    // Rank 1 hands its k on the poison device, q, v and out on the CPU; rank 0 is fine.
    const Tensor k = on(comm.rank() == 1 ? kPoison : Device::cpu, host.k);
    ContextParallelAttention attn(comm, cfg);
    try {
      (void)attn.forward(host.out.view(), host.q.view(), k.view(), host.v.view());
      ADD_FAILURE() << "no error on rank " << comm.rank();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("two devices"), std::string::npos) << e.what();
    }
    const Tensor zero(host.out.shape());
    EXPECT_TRUE(same_bytes(host.out, zero));  // nothing written
  });
}

}  // namespace
