#include "ulysses/sharding.hpp"

#include <fmt/format.h>

#include "ulysses/error.hpp"
#include "ulysses/strategy.hpp"

namespace ulysses {

bool uses_zigzag(const CpConfig& c) { return find_strategy(c.cp_comm_type).token_layout(c) == TokenLayout::zigzag; }

std::vector<SeqChunk> rank_chunks(const CpConfig& config, int cp, int rank, std::int64_t seq) {
  if (cp < 1 || rank < 0 || rank >= cp) throw Error(fmt::format("rank {} is not in [0, cp = {})", rank, cp));
  if (!uses_zigzag(config)) {
    if (seq % cp != 0)
      throw Error(fmt::format("sequence length ({}) must be divisible by cp ({}): every rank holds s/cp "
                              "tokens (uneven sharding is not supported yet)", seq, cp));
    const std::int64_t n = seq / cp;
    return {{rank * n, n}};
  }
  if (seq % (2 * cp) != 0)
    throw Error(fmt::format("sequence length ({}) must be divisible by 2*cp ({}) for cp_comm_type {} with "
                            "a causal mask: the zigzag layout cuts it into 2*cp equal chunks",
                            seq, 2 * cp, config.cp_comm_type));
  const std::int64_t c = seq / (2 * cp);
  return {{rank * c, c}, {(2 * cp - 1 - rank) * c, c}};
}

std::vector<std::vector<SeqChunk>> all_rank_chunks(const CpConfig& config, int cp, std::int64_t seq) {
  std::vector<std::vector<SeqChunk>> c;
  for (int r = 0; r < cp; ++r) c.push_back(rank_chunks(config, cp, r, seq));
  return c;
}

std::int64_t chunk_row(const std::vector<SeqChunk>& chunks, std::size_t i) {
  std::int64_t r = 0;
  for (std::size_t j = 0; j < i; ++j) r += chunks[j].length;
  return r;
}

std::vector<std::int64_t> token_positions(const std::vector<SeqChunk>& chunks) {
  std::vector<std::int64_t> pos;
  for (const SeqChunk& c : chunks)
    for (std::int64_t i = 0; i < c.length; ++i) pos.push_back(c.begin + i);
  return pos;
}

namespace {
// Copies rows between a global tensor and the concatenation of its chunks.
void move_rows(const TensorView& global, const TensorView& local, const std::vector<SeqChunk>& chunks,
               bool to_local) {
  std::int64_t total = 0;
  for (const SeqChunk& c : chunks) total += c.length;
  if (total != local.shape.s)
    throw Error(fmt::format("chunks hold {} tokens but the local tensor has {}", total, local.shape.s));
  std::int64_t row = 0;
  for (const SeqChunk& c : chunks) {
    if (c.begin < 0 || c.begin + c.length > global.shape.s)
      throw Error(fmt::format("chunk [{}, {}) is outside the sequence of {} tokens", c.begin,
                              c.begin + c.length, global.shape.s));
    TensorView g = global, l = local;
    g.data = global.row(0, c.begin, 0);
    l.data = local.row(0, row, 0);
    g.shape.s = l.shape.s = c.length;
    if (to_local) copy(g, l);
    else copy(l, g);
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
std::int64_t total_tokens(const std::vector<SeqChunk>& chunks) {
  std::int64_t n = 0;
  for (const SeqChunk& c : chunks) n += c.length;
  return n;
}

// "" when a gather of `shard` to `root` can assemble the sequence, else why not. A gather
// moves equal blocks, so every rank's chunks must hold as many tokens as this shard.
std::string gather_error(const Communicator& comm, const TensorView& shard,
                         const std::vector<std::vector<SeqChunk>>& chunks_per_rank, int root) {
  if (root < 0 || root >= comm.size()) return fmt::format("root {} is not in [0, {})", root, comm.size());
  if (chunks_per_rank.size() != std::size_t(comm.size()))
    return fmt::format("chunks of {} ranks given for {} ranks", chunks_per_rank.size(), comm.size());
  for (std::size_t r = 0; r < chunks_per_rank.size(); ++r)
    if (total_tokens(chunks_per_rank[r]) != shard.shape.s)
      return fmt::format("rank {}'s chunks hold {} tokens but the shard has {}", r, total_tokens(chunks_per_rank[r]),
                         shard.shape.s);
  return "";
}
}  // namespace

Tensor shard_of(const TensorView& global, const std::vector<SeqChunk>& chunks, DType dtype, Layout layout) {
  const Shape& g = global.shape;
  Tensor t = Tensor::uninitialized({g.b, total_tokens(chunks), g.h, g.d}, dtype, layout);  // every row is copied
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
  comm.agree(gather_error(comm, shard, chunks_per_rank, root));
  comm.agree_identical("gather_global shard shapes", shard.shape.str());
  const Shape& sh = shard.shape;
  const Tensor mine = copy_of(shard, DType::f32);  // dense bshd: one contiguous block per rank
  const std::size_t n = std::size_t(sh.numel());
  std::vector<float> all(comm.rank() == root ? n * std::size_t(comm.size()) : 0);
  comm.gather(mine.data(), all.data(), mine.nbytes(), root, "report");
  if (comm.rank() != root) return {};
  Tensor global({sh.b, sh.s * comm.size(), sh.h, sh.d});
  for (int r = 0; r < comm.size(); ++r)
    unshard_sequence(TensorView::dense(all.data() + n * std::size_t(r), DType::f32, sh, Layout::bshd), global.view(),
                     chunks_per_rank[std::size_t(r)]);
  return global;
}

}  // namespace ulysses
