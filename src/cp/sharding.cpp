#include "ulysses/sharding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "ulysses/error.hpp"
#include "ulysses/strategy.hpp"

namespace ulysses {

bool uses_zigzag(const CpConfig& c) { return find_strategy(c.cp_comm_type).token_layout(c) == TokenLayout::zigzag; }

namespace {

// Part i of n items cut into `parts` contiguous parts whose sizes differ by at most one, the
// first n % parts one larger (torch.tensor_split): tokens over ranks, heads over ranks.
HeadRange even_part(std::int64_t n, std::int64_t parts, std::int64_t i) {
  const std::int64_t base = n / parts, extra = n % parts;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// Which part of even_part(n, parts, ·) item x falls in.
std::int64_t part_holding(std::int64_t n, std::int64_t parts, std::int64_t x) {
  const std::int64_t base = n / parts, extra = n % parts, long_items = extra * (base + 1);
  return x < long_items ? x / (base + 1) : extra + (x - long_items) / base;
}

SeqChunk chunk(const HeadRange& r) { return {r.first, r.count}; }

// Whether `config` lays the tokens out in zigzag. Throws Error unless every rank gets at
// least one token (zigzag: two chunks of at least one).
bool zigzag_layout(const CpConfig& config, int cp, std::int64_t seq) {
  const bool zigzag = uses_zigzag(config);
  if (!zigzag && seq < cp)
    throw Error(
        fmt::format("sequence length ({}) must be at least cp ({}): every rank holds at least one token", seq, cp));
  if (zigzag && seq < 2 * std::int64_t(cp))
    throw Error(
        fmt::format("sequence length ({}) must be at least 2*cp ({}) for cp_comm_type {} with a causal "
                    "mask: the zigzag layout cuts it into 2*cp chunks of at least one token",
                    seq, 2 * std::int64_t(cp), config.cp_comm_type));
  return zigzag;
}

// Items in parts [first, first + count) of even_part(n, parts, ·), which lie back to back.
std::int64_t items_in_parts(std::int64_t n, std::int64_t parts, std::int64_t first, std::int64_t count) {
  if (count == 0) return 0;
  const HeadRange last = even_part(n, parts, first + count - 1);
  return last.first + last.count - even_part(n, parts, first).first;
}

}  // namespace

std::vector<SeqChunk> rank_chunks(const CpConfig& config, int cp, int rank, std::int64_t seq) {
  if (cp < 1 || rank < 0 || rank >= cp) throw Error(fmt::format("rank {} is not in [0, cp = {})", rank, cp));
  if (!zigzag_layout(config, cp, seq)) return {chunk(even_part(seq, cp, rank))};
  const std::int64_t parts = 2 * std::int64_t(cp);
  return {chunk(even_part(seq, parts, rank)), chunk(even_part(seq, parts, parts - 1 - rank))};
}

std::int64_t tokens_held(const CpConfig& config, int cp, int first_rank, int ranks, std::int64_t seq) {
  if (first_rank < 0 || ranks < 0 || first_rank > cp - ranks)
    throw Error(fmt::format("ranks [{}, {}) are not in [0, cp = {})", first_rank, first_rank + ranks, cp));
  if (!zigzag_layout(config, cp, seq)) return items_in_parts(seq, cp, first_rank, ranks);
  // Chunks [first, first + ranks) and their mirror images [2cp − first − ranks, 2cp − first).
  const std::int64_t parts = 2 * std::int64_t(cp);
  return items_in_parts(seq, parts, first_rank, ranks) + items_in_parts(seq, parts, parts - first_rank - ranks, ranks);
}

RankHeads ulysses_heads(int group, int rank, std::int64_t heads, std::int64_t kv_heads) {
  const std::int64_t g = heads / kv_heads;  // query heads per KV head
  if (kv_heads >= group) {
    const HeadRange kv = even_part(kv_heads, group, rank);
    return {{kv.first * g, kv.count * g}, kv};
  }
  const std::int64_t k = part_holding(group, kv_heads, rank);
  const HeadRange sharers = even_part(group, kv_heads, k);
  const HeadRange q = even_part(g, sharers.count, rank - sharers.first);
  return {{k * g + q.first, q.count}, {k, 1}};
}

std::int64_t ulysses_kv_heads_held(int group, std::int64_t kv_heads) { return std::max<std::int64_t>(kv_heads, group); }

std::int64_t most_heads(const std::vector<HeadRange>& ranges) {
  std::int64_t n = 0;
  for (const HeadRange& r : ranges) n = std::max(n, r.count);
  return n;
}

HeadSplit ulysses_head_split(int group, std::int64_t heads, std::int64_t kv_heads) {
  HeadSplit s;
  for (int r = 0; r < group; ++r) {
    const RankHeads mine = ulysses_heads(group, r, heads, kv_heads);
    s.q.push_back(mine.q);
    s.kv.push_back(mine.kv);
  }
  return s;
}

int ulysses_overlap_chunks(int requested, int group, std::int64_t kv_heads) {
  const std::int64_t fewest_kv = kv_heads >= group ? kv_heads / group : 1;
  return int(std::clamp<std::int64_t>(requested, 1, fewest_kv));
}

HeadSplit ulysses_head_chunk(const HeadSplit& split, int chunks, int i) {
  if (chunks == 1) return split;
  HeadSplit c;
  for (std::size_t r = 0; r < split.kv.size(); ++r) {
    const HeadRange kv = split.kv[r], part = even_part(kv.count, chunks, i);
    const std::int64_t g = split.q[r].count / kv.count;  // whole groups when chunks > 1
    c.kv.push_back({kv.first + part.first, part.count});
    c.q.push_back({split.q[r].first + part.first * g, part.count * g});
  }
  return c;
}

std::vector<std::vector<SeqChunk>> all_rank_chunks(const CpConfig& config, int cp, std::int64_t seq) {
  std::vector<std::vector<SeqChunk>> c;
  for (int r = 0; r < cp; ++r) c.push_back(rank_chunks(config, cp, r, seq));
  return c;
}

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
