// This machine's rates and links (calibrate.hpp): timed locally, fitted to the α–β model of
// planner.hpp, agreed on across ranks.
#include "ulysses/plan/calibrate.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>
#include <vector>

#include "ulysses/comm/communicator_factory.hpp"
#include "ulysses/infer/cached_attention.hpp"
#include "ulysses/infer/kv_cache.hpp"
#include "ulysses/kernels/read_probe.hpp"
#include "ulysses/kernels/attention.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

namespace {

// Bytes mapped for one measurement and unmapped after it: a training run calibrates before its
// first step, and the allocator would keep a freed 16 MB vector resident beside the run's own
// buffers for the whole run (train keeps freed memory, train_command.cpp), 14 MiB over its
// predicted peak on a small model.
class Mapped {
 public:
  explicit Mapped(std::size_t bytes, char fill = 0) : bytes_(std::max<std::size_t>(bytes, 1)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(p);
    if (fill != 0) std::memset(data_, fill, bytes_);
  }
  ~Mapped() { ::munmap(data_, bytes_); }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  char* data() { return data_; }

 private:
  std::size_t bytes_;
  char* data_ = nullptr;
};

double median_of(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The fastest of `runs` runs of `op` (each after a barrier), the slowest rank's seconds in each.
// The fastest, not the median: on a shared machine a slow run is another process's time slice,
// not the link's, and the grid's measurements are each strategy's best run too. Collective.
template <class Op>
double slowest_best(Communicator& comm, Op&& op, int runs = 3) {
  double best = INFINITY;
  for (int i = 0; i < runs; ++i) {
    comm.barrier();
    const double t0 = comm.now();
    op();
    double dt = comm.now() - t0;
    comm.allreduce_max(&dt, 1);
    best = std::min(best, dt);
  }
  return best;
}

// Ping-pong between rank 0 and `peer`: α from 8 B, β from 16 MB. Collective (the others wait).
Link fit_link(Communicator& comm, int peer) {
  Link l;
  if (peer <= 0 || peer >= comm.size()) return l;
  auto one_way = [&](std::size_t bytes) {
    Mapped buf(bytes, 1);
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) {
      comm.barrier();
      const double t0 = comm.now();
      if (comm.rank() == 0) {
        comm.isend({buf.data(), bytes}, peer, 9, "calibrate").wait();
        comm.irecv({buf.data(), bytes}, peer, 9).wait();
      } else if (comm.rank() == peer) {
        comm.irecv({buf.data(), bytes}, 0, 9).wait();
        comm.isend({buf.data(), bytes}, 0, 9, "calibrate").wait();
      }
      t.push_back((comm.now() - t0) / 2);
    }
    double m = *std::min_element(t.begin(), t.end());  // the fastest, as slowest_best's
    comm.broadcast(&m, sizeof(m), 0);
    return m;
  };
  const double small = one_way(8), large = one_way(16 << 20);
  l.latency = small;
  l.bandwidth = double(16 << 20) / std::max(1e-9, large - small);
  return l;
}

// Every rank exchanges with the same slot on the next node and the previous one at once, so
// each node's inter-node link carries all its ranks' flows both ways: α from 8 B, β per rank
// from 16 MB. Collective; needs 2 nodes or more.
Link fit_concurrent(Communicator& comm, int per_node) {
  const int to = (comm.rank() + per_node) % comm.size(), from = (comm.rank() - per_node + comm.size()) % comm.size();
  auto timed = [&](std::size_t bytes) {
    Mapped send(bytes, 1), recv(bytes);
    return slowest_best(
        comm,
        [&] {
          Request r = comm.irecv({recv.data(), bytes}, from, 10);
          comm.isend({send.data(), bytes}, to, 10, "calibrate").wait();
          r.wait();
        },
        5);
  };
  const std::size_t large = 16 << 20;
  const double small = timed(8), big = timed(large);
  return {double(large) / std::max(1e-9, big - small), small};
}

// MPI_Alltoall: α per peer from 8 B blocks, β from blocks of 4 MiB / peers (at least 64 KiB):
// each rank's two buffers stay near 8 MiB whatever the group's size (4 MiB blocks to every
// peer took 8 MiB x ranks per rank, the square of the ranks on a node: 64 local ranks ran out
// of memory). Bandwidth is what moves per rank, so it fits as well from the smaller blocks.
Link fit_alltoall(Communicator& comm) {
  const int g = comm.size();
  auto timed = [&](std::size_t block) {
    Mapped send(block * std::size_t(g), 1), recv(block * std::size_t(g));
    return slowest_best(
        comm, [&] { comm.alltoall(send.data(), recv.data(), block, "calibrate"); }, 5);
  };
  const std::size_t large = std::max<std::size_t>(64 << 10, (std::size_t(4) << 20) / std::size_t(g));
  const double small = timed(8), big = timed(large);
  return {double(large) * (g - 1) / std::max(1e-9, big - small), small / std::max(1, g - 1)};
}

constexpr std::size_t kRingMessage = std::size_t(8) << 20;

// The forward calls a ring step makes while its K/V transfer is in flight: `pieces` non-causal
// calls of len × len tokens on 4 heads, Request::test() on the step's requests between them (the
// ring's progress callback: over TCP a nonblocking transfer moves mostly inside such calls).
class RingStepCalls {
 public:
  RingStepCalls(std::int64_t len, std::int64_t d, DType dtype)
      : q_({1, len, 4, d}, dtype), k_(q_.shape(), dtype), v_(q_.shape(), dtype), o_(q_.shape(), dtype),
        lse_(lse_tensor(q_.shape())) {
    for (auto [t, seed] : {std::pair{&q_, 1}, {&k_, 2}, {&v_, 3}}) fill_uniform(t->view(), std::uint64_t(seed));
  }
  void run(int pieces, const std::function<void()>& progress) {
    for (int i = 0; i < pieces; ++i) {
      flash_attention_forward(o_.view(), lse_.view(), q_.view(), k_.view(), v_.view(), AttentionParams{});
      progress();
    }
  }

 private:
  Tensor q_, k_, v_, o_, lse_;
};

// The call length whose `pieces` calls take about `seconds` on every rank, from calls of `from`
// tokens timed here (the slowest rank's): a call's time grows as len² (its score pairs).
// Collective.
std::int64_t calls_length(Communicator& comm, std::int64_t d, DType dtype, double seconds, int pieces,
                          std::int64_t from) {
  RingStepCalls probe(from, d, dtype);
  const double t = slowest_best(comm, [&] { probe.run(1, [] {}); });
  const double len = double(from) * std::sqrt(std::max(seconds, 1e-6) / pieces / std::max(t, 1e-9));
  return std::clamp<std::int64_t>(std::llround(len / 64) * 64, 64, 4096);
}

// The share of a ring step's K/V transfer hidden behind its compute on the link from each rank
// to the rank `shift` after it, every rank at once (a ring's hop: each sends `bytes` on and
// receives as many from the rank `shift` before): the transfer alone (T), the step's calls alone
// (K, sized to T), both (B), overlap_fraction's (K + T − B) / min(K, T). Each the fastest of 9
// runs, the three interleaved: a difference of times on a loaded machine, where a slow round
// is another process's, not the transfer's. Collective.
double fit_overlap(Communicator& comm, int shift, std::int64_t d, DType dtype, std::size_t bytes, int pieces) {
  const int n = comm.size(), to = (comm.rank() + shift) % n, from = (comm.rank() - shift % n + n) % n;
  if (n < 2 || to == comm.rank()) return 1;
  Mapped send(bytes, 1), recv(bytes);
  Request s, r;
  auto post = [&] {
    r = comm.irecv({recv.data(), bytes}, from, 11);
    s = comm.isend({send.data(), bytes}, to, 11, "calibrate");
  };
  auto transfer = [&] {
    post();
    s.wait();
    r.wait();
  };
  transfer();  // warm: the buffers' pages
  const double alone = slowest_best(comm, transfer);
  std::int64_t len = calls_length(comm, d, dtype, alone, pieces, 256);
  len = calls_length(comm, d, dtype, alone, pieces, len);  // once more from the first guess: closer to T
  RingStepCalls calls(len, d, dtype);
  double t[3] = {INFINITY, INFINITY, INFINITY};
  for (int round = 0; round < 3; ++round) {
    t[0] = std::min(t[0], slowest_best(comm, transfer));
    t[1] = std::min(t[1], slowest_best(comm, [&] { calls.run(pieces, [] {}); }));
    t[2] = std::min(t[2], slowest_best(comm, [&] {
                      post();
                      calls.run(pieces, [&] {
                        r.test();
                        s.test();
                      });
                      s.wait();
                      r.wait();
                    }));
  }
  return overlap_fraction(t[1], t[0], t[2]);
}

// Collective. Ranks per node, when every node holds as many contiguous ranks (mpirun's
// --map-by slot), as the planner's model assumes; else Error on every rank.
int contiguous_ranks_per_node(Communicator& comm) {
  std::int64_t n = comm.ranks_on_this_node(), lo = n, hi = n;
  comm.allreduce_min(&lo, 1);
  comm.allreduce_max(&hi, 1);
  std::unique_ptr<Communicator> node = comm.split(int(comm.rank() / n), comm.rank());
  std::int64_t split_ok = node->ranks_on_this_node() == node->size() ? 1 : 0;  // my slot group is my node
  comm.allreduce_min(&split_ok, 1);
  if (lo != hi || !split_ok)
    throw Error(
        fmt::format("calibration needs the same number of ranks on every node, placed contiguously "
                    "(mpirun --map-by slot); nodes hold {} to {} ranks",
                    lo, hi));
  return int(n);
}

// Collective. The links inside a node (ranks 0 and 1) and between nodes (rank 0 and the first
// rank of the next node; then every rank across at once), and the all-to-all inside a node.
void calibrate_links(Communicator& comm, int per_node, std::int64_t head_dim, DType dtype, Cluster& cluster) {
  cluster.ranks_per_node = per_node;
  cluster.intra = per_node > 1 ? fit_link(comm, 1) : Link{};
  cluster.inter = per_node < comm.size() ? fit_link(comm, per_node) : cluster.intra;
  if (per_node < comm.size()) cluster.inter_concurrent = fit_concurrent(comm, per_node);
  if (per_node == 1) cluster.intra = cluster.inter;
  std::unique_ptr<Communicator> node = comm.split(comm.rank() / per_node, comm.rank());
  cluster.alltoall_intra = fit_alltoall(*node);
  // The ring's hop inside a node and across; 8 MiB: the median K/V message of the grid's shapes
  // at cp 2 (2-32 MiB). Four calls a step, a full mask's pair calls under zigzag: the share grows
  // with the polls after the first (Link::overlap_calls), so one count prices the others.
  constexpr int kCalls = 4;
  if (per_node > 1) cluster.intra.overlap = fit_overlap(*node, 1, head_dim, dtype, kRingMessage, kCalls);
  if (per_node < comm.size())
    cluster.inter.overlap = fit_overlap(comm, per_node, head_dim, dtype, kRingMessage, kCalls);
  if (per_node == 1) cluster.intra.overlap = cluster.inter.overlap;
  if (per_node == comm.size()) cluster.inter.overlap = cluster.intra.overlap;  // one node: inter is intra's copy
  cluster.intra.overlap_calls = cluster.inter.overlap_calls = kCalls;
}

// C[m, n] (+)= op(A) · op(B), row-major (one BLAS thread per caller).
void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
           const float* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              1.0f, a, int(lda), b, int(ldb), accumulate ? 1.0f : 0.0f, c, int(ldc));
}

// [begin, end) of `n` for this OpenMP thread: the same contiguous split the layers use.
std::pair<std::int64_t, std::int64_t> my_range(std::int64_t n) {
  const std::int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
  return {n * t / T, n * (t + 1) / T};
}

}  // namespace

double overlap_fraction(double compute_s, double transfer_s, double both_s) {
  const bool measured = std::isfinite(compute_s) && std::isfinite(transfer_s) && std::isfinite(both_s) &&
                        compute_s > 0 && transfer_s > 0 && both_s > 0;
  if (!measured) return 1;
  return std::clamp((compute_s + transfer_s - both_s) / std::min(compute_s, transfer_s), 0.0, 1.0);
}

double local_median_seconds(const Communicator& comm, const std::function<void()>& run) {
  run();
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const double t0 = comm.now();
    run();
    t.push_back(comm.now() - t0);
  }
  return median_of(t);
}

AttentionRates attention_rates(std::int64_t d, DType dtype, const std::function<double()>& seconds) {
  if (d < 1 || !seconds)
    throw Error(fmt::format("attention_rates: needs head_dim >= 1 and a clock; got head_dim {}", d));
  const std::int64_t s = kRateTokens, h = kRateHeads;
  Tensor q({1, s, h, d}, dtype), k(q.shape(), dtype), v(q.shape(), dtype), o(q.shape(), dtype), g(q.shape(), dtype),
      dq(q.shape(), dtype), dk(q.shape(), dtype), dv(q.shape(), dtype);
  for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}, {&g, 4}}) fill_uniform(t->view(), std::uint64_t(seed));
  const Tensor lse = lse_tensor(q.shape());
  const AttentionParams p{.causal = true};
  // The forward and the backward timed apart: a forward alone (inference, --mode forward) runs at
  // the forward's rate, not at the pair's over its 3.5 forwards' FLOPs.
  std::vector<double> fwd, bwd;
  for (int i = 0; i < 6; ++i) {
    const double t0 = seconds();
    flash_attention_forward(o.view(), lse.view(), q.view(), k.view(), v.view(), p);
    const double t1 = seconds();
    flash_attention_backward(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), o.view(),
                             lse.view(), p);
    const double t2 = seconds();
    if (i == 0) continue;  // the warm-up
    fwd.push_back(t1 - t0);
    bwd.push_back(t2 - t1);
  }
  const double f = median_of(fwd);
  return {attention_forward_flops(1, s, s, h, d, true) / f, median_of(bwd) / f};
}

double attention_rate(const Communicator& comm, std::int64_t d, DType dtype) {
  const AttentionRates r = attention_rates(d, dtype, [&] { return comm.now(); });
  return 3.5 * r.forward / (1 + r.backward_ratio);
}

double gemm_rate(const Communicator& comm, std::int64_t n, std::int64_t ic, std::int64_t oc) {
  std::vector<float> x(std::size_t(n * ic), 0.5f), w(std::size_t(ic * oc), 0.25f), y(std::size_t(n * oc)),
      dy(y.size(), 1.0f), dx(x.size()), dw(w.size());
  auto run = [&] {
#pragma omp parallel
    {
      const auto [r0, r1] = my_range(n);
      if (r0 < r1) {
        sgemm(false, false, r1 - r0, oc, ic, x.data() + r0 * ic, ic, w.data(), oc, y.data() + r0 * oc, oc, false);
        sgemm(false, true, r1 - r0, ic, oc, dy.data() + r0 * oc, oc, w.data(), oc, dx.data() + r0 * ic, ic, true);
      }
#pragma omp barrier
      const auto [c0, c1] = my_range(oc);
      if (c0 < c1) sgemm(true, false, ic, c1 - c0, n, x.data(), ic, dy.data() + c0, oc, dw.data() + c0, oc, true);
    }
  };
  return 6.0 * double(n) * double(ic) * double(oc) / local_median_seconds(comm, run);
}

DecodeRate decode_rate(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, double bytes) {
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || head_dim < 1 || !(bytes > 0))
    throw Error(
        fmt::format("decode_rate: needs heads a multiple of kv_heads >= 1, head_dim >= 1 and bytes > 0; got "
                    "{}, {}, {}, {}",
                    heads, kv_heads, head_dim, bytes));
  const std::int64_t row_bytes = 2 * kv_heads * head_dim * std::int64_t(sizeof(float));
  const std::int64_t rows = std::max<std::int64_t>(1, std::int64_t(std::ceil(bytes / double(row_bytes))));
  const Tensor k({1, rows, kv_heads, head_dim}, DType::f32, Layout::bhsd),
      v({1, rows, kv_heads, head_dim}, DType::f32, Layout::bhsd);
  std::fill(k.f32(), k.f32() + k.nbytes() / sizeof(float), 0.25f);  // written: every page resident
  std::fill(v.f32(), v.f32() + v.nbytes() / sizeof(float), 0.5f);
  std::vector<float> q(std::size_t(heads * head_dim), 0.5f), out(q.size()), lse(static_cast<std::size_t>(heads));
  const Shape one{1, 1, heads, head_dim};
  const TensorView qv = TensorView::dense(q.data(), DType::f32, one, Layout::bshd),
                   ov = TensorView::dense(out.data(), DType::f32, one, Layout::bshd),
                   lv = TensorView::dense(lse.data(), DType::f32, {1, 1, heads, 1}, Layout::bhsd);
  const DecodeParams params{.group = heads / kv_heads};
  const std::size_t floats = k.nbytes() / sizeof(float);
  // Back to back, as decode steps re-read the same cache (one that fits the last-level cache stays
  // there); the best of 7 passes of each.
  double kernel = 1e30, read = 1e30;
  for (int rep = 0; rep < 8; ++rep) {
    const double t0 = kernels::probe_clock();
    decode_attention_forward(ov, lv, qv, k.view(), v.view(), params);
    if (rep > 0) kernel = std::min(kernel, kernels::probe_clock() - t0);
  }
  for (int rep = 0; rep < 8; ++rep) {
    const double t = kernels::read_seconds(k.f32(), floats) + kernels::read_seconds(v.f32(), floats);
    if (rep > 0) read = std::min(read, t);
  }
  const double total = double(k.nbytes() + v.nbytes());
  return {total / kernel, total / read, total};
}

double decode_gather_seconds(Communicator& comm, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  const std::int64_t rows = std::max<std::int64_t>(1, (1 << 20) / (2 * kv_heads * head_dim * 4));
  const Tensor k({1, rows, kv_heads, head_dim}, DType::f32, Layout::bhsd),
      v({1, rows, kv_heads, head_dim}, DType::f32, Layout::bhsd);
  std::vector<float> q(static_cast<std::size_t>(heads * head_dim), 0.5f), out(q.size()),
      lse(static_cast<std::size_t>(heads));
  const Shape one{1, 1, heads, head_dim};
  const TensorView qv = TensorView::dense(q.data(), DType::f32, one, Layout::bshd),
                   ov = TensorView::dense(out.data(), DType::f32, one, Layout::bshd),
                   lv = TensorView::dense(lse.data(), DType::f32, {1, 1, heads, 1}, Layout::bhsd);
  const std::size_t part = std::size_t(heads * (head_dim + 1)) * sizeof(float);  // interleaved's (out, lse)
  std::vector<char> send(part, 1), recv(part * std::size_t(comm.size()));
  const std::vector<std::size_t> bytes(std::size_t(comm.size()), part);
  std::vector<double> t;
  for (int i = 0; i < 45; ++i) {  // each gather after a kernel pass, as a step's layers run
    decode_attention_forward(ov, lv, qv, k.view(), v.view(), DecodeParams{.group = heads / kv_heads});
    const double t0 = kernels::probe_clock();
    comm.allgatherv({send.data(), part}, {recv.data(), recv.size()}, bytes, "calibrate");
    if (i >= 5) t.push_back(kernels::probe_clock() - t0);
  }
  double seconds = median_of(t);
  comm.allreduce_max(&seconds, 1);
  return seconds;
}

namespace {

// Caches of one layer for `batch` requests under `layout` on comm, each holding one row a rank.
std::vector<std::unique_ptr<KvCache>> one_row_caches(const Communicator& comm, KvLayout layout,
                                                     const KvCacheShape& shape, std::int64_t batch) {
  std::vector<std::unique_ptr<KvCache>> caches;
  const int cp = comm.size();
  for (std::int64_t b = 0; b < batch; ++b) {
    caches.push_back(std::make_unique<KvCache>(layout, shape, cp, comm.rank()));
    KvCache& c = *caches.back();
    const std::int64_t rows = kv_rows(layout, cp, cp, comm.rank()), kv = c.heads().kv.count;
    std::vector<float> kv_rows_of(static_cast<std::size_t>(std::max<std::int64_t>(rows, 1) * kv * shape.head_dim),
                                  0.25f);
    const TensorView x = TensorView::dense(kv_rows_of.data(), DType::f32, {1, rows, kv, shape.head_dim}, Layout::bshd);
    c.append(0, cp, x, x);
  }
  return caches;
}

// The median over `pairs` of (a layer of 1 + n requests − a layer of 1) / n, on comm.
double request_slope(Communicator& comm, KvLayout layout, std::int64_t heads, std::int64_t kv_heads,
                     std::int64_t head_dim) {
  constexpr std::int64_t n = 32;
  constexpr int pairs = 15;
  const KvCacheShape shape{1, heads, kv_heads, head_dim, comm.size() + pairs + 1};
  std::vector<float> q(static_cast<std::size_t>((n + 1) * heads * head_dim), 0.5f), out(q.size()),
      kv(static_cast<std::size_t>((n + 1) * kv_heads * head_dim), 0.25f);
  auto layer = [&](std::vector<std::unique_ptr<KvCache>>& caches) {
    std::vector<KvCache*> ptrs;
    for (auto& c : caches) ptrs.push_back(c.get());
    const std::int64_t b = std::int64_t(ptrs.size());
    auto view = [&](std::vector<float>& t, std::int64_t h) {
      return TensorView::dense(t.data(), DType::f32, {1, b, h, head_dim}, Layout::bshd);
    };
    const double t0 = kernels::probe_clock();
    decode_attention(comm, ptrs, 0, view(q, heads), view(kv, kv_heads), view(kv, kv_heads), view(out, heads));
    return kernels::probe_clock() - t0;
  };
  auto one = one_row_caches(comm, layout, shape, 1), many = one_row_caches(comm, layout, shape, 1 + n);
  layer(one), layer(many);  // warm: the buffers, the caches' pages
  std::vector<double> d;
  for (int i = 0; i < pairs; ++i) d.push_back((layer(many) - layer(one)) / double(n));
  return std::max(0.0, median_of(d));
}

}  // namespace

DecodeModel::RequestCost decode_request_seconds(Communicator& comm, std::int64_t heads, std::int64_t kv_heads,
                                                std::int64_t head_dim) {
  const KvCacheShape shape{1, heads, kv_heads, head_dim, 1};
  double s[3] = {request_slope(*make_self_communicator(comm), KvLayout::heads, heads, kv_heads, head_dim), 0, 0};
  if (comm.size() > 1)
    for (int i : {1, 2}) {
      const KvLayout layout = i == 1 ? KvLayout::heads : KvLayout::interleaved;
      if (kv_layout_error(layout, shape, comm.size()).empty())
        s[i] = request_slope(comm, layout, heads, kv_heads, head_dim);
    }
  comm.allreduce_max(s, 3);
  return {s[0], s[1], s[2]};
}

double row_rate(const std::vector<std::pair<std::int64_t, std::int64_t>>& products) {
  std::vector<std::vector<float>> w;
  std::int64_t widest = 1;
  double flops = 0;
  for (auto [in, out] : products) {
    if (in < 1 || out < 1) throw Error(fmt::format("row_rate: a product [{}, {}] needs both >= 1", in, out));
    w.emplace_back(std::size_t(in * out), 0.01f);
    widest = std::max({widest, in, out});
    flops += 2.0 * double(in) * double(out);
  }
  if (products.empty()) throw Error("row_rate: no products to time");
  std::vector<float> x(static_cast<std::size_t>(widest), 0.5f), y(static_cast<std::size_t>(widest));
  constexpr int kRows = 20;  // rows one after another, as steps follow each other: microseconds each
  const auto run = [&] {
    for (int r = 0; r < kRows; ++r)
      for (std::size_t i = 0; i < products.size(); ++i) {
        const auto [in, out] = products[i];
        sgemm(false, false, 1, out, in, x.data(), in, w[i].data(), out, y.data(), out, false);
      }
  };
  std::vector<double> t;
  for (int rep = 0; rep < 8; ++rep) {  // on probe_clock, as the decode rate: the load is not the row's
    const double t0 = kernels::probe_clock();
    run();
    if (rep > 0) t.push_back(kernels::probe_clock() - t0);
  }
  return kRows * flops / median_of(t);
}

Calibration calibrate(Communicator& comm, std::int64_t head_dim, DType dtype, std::int64_t gemm_in,
                      std::int64_t gemm_out) {
  // Arguments every rank was given alike: the same Error everywhere, before any measurement.
  if (head_dim < 1 || gemm_in < 0 || gemm_out < 0 || (gemm_in > 0) != (gemm_out > 0))
    throw Error(
        fmt::format("calibrate: head_dim must be >= 1 and the GEMM layer [in, out] both 0 (none) or both "
                    ">= 1; got head_dim {}, [{}, {}]",
                    head_dim, gemm_in, gemm_out));
  Calibration c;
  // Seconds per FLOP, so the all-reduce's max is the slowest rank's rate.
  // The forward's seconds per FLOP, the backward's per forward FLOP, the GEMM's.
  const AttentionRates a = attention_rates(head_dim, dtype, [&] { return comm.now(); });
  double per_flop[3] = {1.0 / a.forward, a.backward_ratio / a.forward,
                        gemm_in > 0 ? 1.0 / gemm_rate(comm, 1024, gemm_in, gemm_out) : 0.0};
  comm.allreduce_max(per_flop, 3);
  c.cluster.peak_flops = 1.0 / per_flop[0];
  c.cluster.kernel.backward_ratio = per_flop[1] / per_flop[0];
  c.cluster.efficiency = 1.0;
  c.gemm_flops = gemm_in > 0 ? 1.0 / per_flop[2] : 0.0;
  calibrate_links(comm, contiguous_ranks_per_node(comm), head_dim, dtype,
                  c.cluster);  // its Error is the same on every rank
  return c;
}

}  // namespace ulysses
