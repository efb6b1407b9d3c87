#include "ulysses/cp/sharding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "ulysses/core/error.hpp"

namespace ulysses {

namespace {
// Copies rows between a global tensor and the concatenation of its chunks.
void move_rows(const TensorView& global, const TensorView& local, const std::vector<SeqChunk>& chunks, bool to_local) {
  if (total_tokens(chunks) != local.shape.s)
    throw Error(fmt::format("chunks hold {} tokens but the local tensor has {}", total_tokens(chunks), local.shape.s));
  std::int64_t row = 0;
  for (const SeqChunk& c : chunks) {
    if (c.begin < 0 || c.begin + c.length > global.shape.s)
      throw Error(fmt::format("chunk [{}, {}) is outside the sequence of {} tokens", c.begin, c.begin + c.length,
                              global.shape.s));
    TensorView g = global, l = local;
    g.data = global.row(0, c.begin, 0);
    l.data = local.row(0, row, 0);
    g.shape.s = l.shape.s = c.length;
    if (to_local)
      copy(g, l);
    else
      copy(l, g);
    row += c.length;
  }
}
}  // namespace

void shard_sequence(const TensorView& global, const TensorView& local, const std::vector<SeqChunk>& chunks) {
  move_rows(global, local, chunks, true);
}

void unshard_sequence(const TensorView& local, const TensorView& global, const std::vector<SeqChunk>& chunks) {
  move_rows(global, local, chunks, false);
}

namespace {

// "" when `chunks_per_rank` can be gathered to `root`, else why not.
std::string gather_error(const Communicator& comm, const std::vector<std::vector<SeqChunk>>& chunks_per_rank,
                         int root) {
  if (root < 0 || root >= comm.size()) return fmt::format("root {} is not in [0, {})", root, comm.size());
  if (chunks_per_rank.size() != std::size_t(comm.size()))
    return fmt::format("chunks of {} ranks given for {} ranks", chunks_per_rank.size(), comm.size());
  return "";
}

// "" when every rank's shard (its length in `lengths`) holds that rank's chunks.
std::string shard_length_error(const std::vector<std::vector<SeqChunk>>& chunks_per_rank,
                               const std::vector<std::int64_t>& lengths) {
  for (std::size_t r = 0; r < lengths.size(); ++r)
    if (total_tokens(chunks_per_rank[r]) != lengths[r])
      return fmt::format("rank {}'s chunks hold {} tokens but the shard has {}", r, total_tokens(chunks_per_rank[r]),
                         lengths[r]);
  return "";
}
}  // namespace

Tensor shard_of(const TensorView& global, const std::vector<SeqChunk>& chunks, DType dtype, Layout layout) {
  const Shape& g = global.shape;
  Tensor t = Tensor::uninitialized({g.b, total_tokens(chunks), g.h, g.d}, dtype, layout,
                                   global.device);  // every row is copied
  shard_sequence(global, t.view(), chunks);
  return t;
}

void fill_uniform_shard(const TensorView& local, std::uint64_t seed, const std::vector<SeqChunk>& chunks) {
  if (total_tokens(chunks) != local.shape.s)
    throw Error(fmt::format("chunks hold {} tokens but the local tensor has {}", total_tokens(chunks), local.shape.s));
  for (std::size_t i = 0; i < chunks.size(); ++i) {  // fill_uniform offset by each chunk's global position
    TensorView part = local;
    part.data = local.row(0, chunk_row(chunks, i), 0);
    part.shape.s = chunks[i].length;
    fill_uniform(part, seed, chunks[i].begin);
  }
}

Tensor gather_global(Communicator& comm, const TensorView& shard,
                     const std::vector<std::vector<SeqChunk>>& chunks_per_rank, int root) {
  comm.agree(gather_error(comm, chunks_per_rank, root));
  const std::vector<std::int64_t> lengths = comm.allgather_value(shard.shape.s, "validate");
  comm.agree(shard_length_error(chunks_per_rank, lengths));  // against every rank's own list
  const Shape& sh = shard.shape;
  comm.agree_identical("gather_global shard shapes", fmt::format("[{}, *, {}, {}]", sh.b, sh.h, sh.d));
  const Tensor mine = copy_of(shard, DType::f32);  // dense bshd: one contiguous block per rank
  constexpr int kTag = 3;
  if (comm.rank() != root) {  // point to point: the shards' sizes differ between ranks
    comm.isend(buffer_of(mine), root, kTag, "report").wait();
    return {};
  }
  Tensor global({sh.b, std::accumulate(lengths.begin(), lengths.end(), std::int64_t(0)), sh.h, sh.d}, DType::f32,
                Layout::bshd, shard.device);
  for (int r = 0; r < comm.size(); ++r) {
    const std::size_t i = std::size_t(r);
    Tensor theirs = r == root
                        ? Tensor()
                        : Tensor::uninitialized({sh.b, lengths[i], sh.h, sh.d}, DType::f32, Layout::bshd, shard.device);
    if (r != root) comm.irecv(buffer_of(theirs), r, kTag).wait();
    unshard_sequence(r == root ? mine.view() : theirs.view(), global.view(), chunks_per_rank[i]);
  }
  return global;
}

}  // namespace ulysses
