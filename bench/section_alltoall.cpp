// Section 2: seq_to_head of Q, K and V against a raw MPI_Alltoall of the same bytes (warm,
// preallocated buffers) and a memcpy of the same bytes, on all ranks.
#include <fmt/format.h>

#include <array>
#include <cstring>

#include "bench.hpp"
#include "ulysses/comm/all_to_all.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses::bench {

nlohmann::json alltoall_section(Communicator& world, const Options& o) {
  const int R = world.size();
  const std::int64_t b = 1, sl = o.seq / R, h = 8, d = 64;
  nlohmann::json rows = nlohmann::json::array();
  if (world.rank() == 0)
    fmt::print(
        "\n[2] seq_to_head of Q, K, V ([{}, {}, {}, {}] each per rank) vs raw MPI_Alltoall and memcpy of "
        "the same bytes; slowest rank, medians\n{:>5} {:>10} {:>12} {:>12} {:>12} {:>9} {:>9}\n",
        b, sl, h, d, "dtype", "MB/rank", "seq_to_head", "MPI_Alltoall", "memcpy", "s2h/a2a", "a2a/copy");
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor q({b, sl, h, d}, dtype), k(q.shape(), dtype), v(q.shape(), dtype);
    for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}}) fill_uniform(t->view(), std::uint64_t(seed));
    const HeadSplit heads = ulysses_head_split(R, h, h);
    const std::array<SeqShard, 3> in{{{q.view(), heads.q}, {k.view(), heads.kv}, {v.view(), heads.kv}}};
    const std::size_t bytes = 3 * q.nbytes();
    std::vector<char> send(bytes, 1), recv(bytes, 0);
    std::vector<double> t_s2h, t_raw, t_copy;
    for (int i = 0; i < o.reps + 1; ++i) {  // the first round warms up
      world.barrier();
      double t0 = world.now();
      FusedHeads x = seq_to_head(world, in);
      const double s2h = slowest(world, world.now() - t0);
      world.barrier();
      t0 = world.now();
      MPI_Alltoall(send.data(), int(bytes / std::size_t(R)), MPI_BYTE, recv.data(), int(bytes / std::size_t(R)),
                   MPI_BYTE, MPI_COMM_WORLD);
      const double raw = slowest(world, world.now() - t0);
      world.barrier();
      t0 = world.now();
      std::memcpy(recv.data(), send.data(), bytes);
      const double cp = slowest(world, world.now() - t0);
      if (i > 0) {
        t_s2h.push_back(s2h);
        t_raw.push_back(raw);
        t_copy.push_back(cp);
      }
    }
    const double s2h = median(t_s2h), raw = median(t_raw), cpy = median(t_copy);
    if (world.rank() == 0) {
      fmt::print("{:>5} {:>10.2f} {:>10.2f}ms {:>10.2f}ms {:>10.2f}ms {:>9.2f} {:>9.2f}\n", to_string(dtype),
                 double(bytes) / 1e6, s2h * 1e3, raw * 1e3, cpy * 1e3, s2h / raw, raw / cpy);
      rows.push_back({{"dtype", to_string(dtype)},
                      {"bytes_per_rank", bytes},
                      {"seq_to_head_s", s2h},
                      {"mpi_alltoall_s", raw},
                      {"memcpy_s", cpy},
                      {"seq_to_head_over_alltoall", s2h / raw}});
    }
  }
  return world.rank() == 0 ? rows : nlohmann::json();
}

}  // namespace ulysses::bench
