// seq_to_head / head_to_seq: pack into the all-to-all's block order, one all-to-all(v), and
// (only on the sequence-sharded side) unpack. See all_to_all.hpp for the layout.
#include "ulysses/comm/all_to_all.hpp"

#include <fmt/format.h>

#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "ulysses/core/device_ops.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

FusedHeads::FusedHeads(DType dtype, std::int64_t batch, std::vector<std::int64_t> rank_tokens, std::int64_t head_dim,
                       std::vector<std::int64_t> local_heads, void* storage, Device device)
    : local_heads_(std::move(local_heads)), rank_tokens_(std::move(rank_tokens)), batch_(batch), head_dim_(head_dim) {
  total_heads_ = std::accumulate(local_heads_.begin(), local_heads_.end(), std::int64_t(0));
  seq_ = std::accumulate(rank_tokens_.begin(), rank_tokens_.end(), std::int64_t(0));
  const Shape shape{batch, seq_, total_heads_, head_dim};
  if (storage == nullptr) {
    buffer_ = Tensor::uninitialized(shape, dtype, Layout::sbhd, device);
    storage = buffer_.data();
  }
  whole_ = TensorView::dense(storage, dtype, shape, Layout::sbhd, device);
}

std::size_t FusedHeads::bytes_for(DType dtype, std::int64_t batch, const std::vector<std::int64_t>& rank_tokens,
                                  std::int64_t head_dim, const std::vector<std::int64_t>& local_heads) {
  const std::int64_t s = std::accumulate(rank_tokens.begin(), rank_tokens.end(), std::int64_t(0));
  const std::int64_t h = std::accumulate(local_heads.begin(), local_heads.end(), std::int64_t(0));
  return std::size_t(batch * s * h * head_dim) * dtype_size(dtype);
}

std::int64_t FusedHeads::head_offset(int t) const {
  return std::accumulate(local_heads_.begin(), local_heads_.begin() + t, std::int64_t(0));
}

TensorView FusedHeads::part(int t) const {
  TensorView v = whole_;
  v.data = static_cast<std::byte*>(v.data) + head_offset(t) * head_dim_ * std::int64_t(dtype_size(dtype()));
  v.shape.h = local_heads_[t];
  return v;
}

FusedHeads FusedHeads::converted(DType dtype) const {
  FusedHeads out(dtype, batch_, rank_tokens_, head_dim_, local_heads_, nullptr, device());
  copy(whole(), out.whole());
  return out;
}

namespace {

// A fingerprint of every tensor's head ranges: ranks compare it instead of the lists (one
// line per tensor whatever cp is).
std::uint64_t heads_hash(const std::vector<HeadRange>& heads) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const HeadRange& r : heads)
    for (std::int64_t x : {r.first, r.count}) h = (h ^ std::uint64_t(x)) * 1099511628211ull;
  return h;
}

// What every rank must agree on: the tensors' dtype, b, h, d and head ranges (not n_r).
std::string describe_shards(std::span<const SeqShard> shards) {
  std::string s = fmt::format("{} tensors, dtype {}", shards.size(), to_string(shards[0].view.dtype));
  for (const SeqShard& t : shards) {
    const Shape& sh = t.view.shape;
    s += fmt::format(", [{}, *, {}, {}] heads #{:016x}", sh.b, sh.h, sh.d, heads_hash(t.heads));
  }
  return s;
}

// "" or why tensor t cannot take part.
std::string shard_error(std::span<const SeqShard> shards, std::size_t t, int cp, const char* op) {
  const TensorView& v = shards[t].view;
  const TensorView& v0 = shards[0].view;
  if (v.data == nullptr && v.shape.numel() > 0) return fmt::format("{}: tensor {} has no data", op, t);
  if (v.device != v0.device)
    return fmt::format("{}: tensor {} is on {} but tensor 0 on {}", op, t, to_string(v.device), to_string(v0.device));
  if (v.dtype != v0.dtype || v.shape.b != v0.shape.b || v.shape.s != v0.shape.s || v.shape.d != v0.shape.d)
    return fmt::format("{}: tensor {} is {} {} but tensor 0 is {} {}; b, n_r, d and dtype must match", op, t,
                       v.shape.str(), to_string(v.dtype), v0.shape.str(), to_string(v0.dtype));
  if (shards[t].heads.size() != std::size_t(cp))
    return fmt::format("{}: tensor {} lists the heads of {} ranks for {} ranks", op, t, shards[t].heads.size(), cp);
  for (const HeadRange& r : shards[t].heads)
    if (r.first < 0 || r.count < 0 || r.first + r.count > v.shape.h)
      return fmt::format("{}: tensor {} gives a rank heads [{}, {}) of its {}", op, t, r.first, r.first + r.count,
                         v.shape.h);
  return "";
}

}  // namespace

TransposeCheck local_transpose_check(std::span<const SeqShard> shards, int cp, const char* op) {
  std::string err = shards.empty() ? fmt::format("{}: no tensors given", op) : "";
  for (std::size_t t = 0; t < shards.size() && err.empty(); ++t) err = shard_error(shards, t, cp, op);
  return {err, err.empty() ? describe_shards(shards) : ""};
}

// Local checks, then one agreement across ranks that also carries every rank's n_r.
std::vector<std::int64_t> check_transpose(Communicator& comm, std::span<const SeqShard> shards, const char* op,
                                          const std::string& local_error) {
  TransposeCheck c = local_transpose_check(shards, comm.size(), op);
  if (!local_error.empty()) c.error = local_error;
  const std::int64_t tokens = c.error.empty() ? shards[0].view.shape.s : 0;
  return comm.agree_all(c.error, fmt::format("{} inputs", op), c.description, std::span(&tokens, 1));
}

void PendingTranspose::wait() {
  request_.wait();
  if (finish_) std::exchange(finish_, nullptr)();
}

namespace {

// This rank's blocks on both sides of the transpose, rank j's block being:
//   sequence-sharded side  [n_me, b, H_j, d], the other ranks' back to back in rank order
//                          (this rank's own block is packed straight into the other side);
//   head-sharded side      rows [Σ_{i<j} n_i, Σ_{i<=j} n_i) of [s, b, H_me, d];
// H_j being every tensor's heads on rank j. Own counts are 0: the caller moves that block.
struct Blocks {
  std::vector<std::int64_t> heads;              // H_j
  std::vector<std::vector<std::int64_t>> slot;  // [t][j]: where tensor t's heads start in H_j
  std::vector<std::size_t> seq_bytes, seq_offsets, head_bytes, head_offsets;
  std::size_t seq_side_bytes = 0;  // the other ranks' blocks on the sequence side
  std::size_t own_offset = 0;      // this rank's rows on the head-sharded side
};

Blocks blocks_of(std::span<const SeqShard> shards, const std::vector<std::int64_t>& tokens, int me,
                 std::size_t row_bytes) {
  const std::size_t cp = tokens.size(), b = std::size_t(shards[0].view.shape.b);
  Blocks k;
  k.heads.assign(cp, 0);
  for (const SeqShard& t : shards) {
    k.slot.push_back(k.heads);
    for (std::size_t j = 0; j < cp; ++j) k.heads[j] += t.heads[j].count;
  }
  const std::size_t mine = std::size_t(tokens[std::size_t(me)]), my_heads = std::size_t(k.heads[std::size_t(me)]);
  std::size_t row = 0;
  for (std::size_t j = 0; j < cp; ++j) {
    const bool own = j == std::size_t(me);
    const std::size_t seq_block = mine * b * std::size_t(k.heads[j]) * row_bytes;
    const std::size_t head_block = std::size_t(tokens[j]) * b * my_heads * row_bytes;
    k.seq_offsets.push_back(own ? 0 : k.seq_side_bytes);
    k.seq_bytes.push_back(own ? 0 : seq_block);
    k.seq_side_bytes += own ? 0 : seq_block;
    k.head_offsets.push_back(row);
    k.head_bytes.push_back(own ? 0 : head_block);
    if (own) k.own_offset = row;
    row += head_block;
  }
  return k;
}

// Per tensor, per head: the (rank, slot in H_rank) of every copy on the head-sharded side.
using Holders = std::vector<std::vector<std::vector<std::pair<std::size_t, std::int64_t>>>>;

Holders holders_of(std::span<const SeqShard> shards, const Blocks& k) {
  Holders out(shards.size());
  for (std::size_t t = 0; t < shards.size(); ++t) {
    out[t].resize(std::size_t(shards[t].view.shape.h));
    for (std::size_t j = 0; j < shards[t].heads.size(); ++j) {
      const HeadRange& r = shards[t].heads[j];
      for (std::int64_t i = 0; i < r.count; ++i) out[t][std::size_t(r.first + i)].push_back({j, k.slot[t][j] + i});
    }
  }
  return out;
}

// Heads [slot, slot + count) of rank j's block [n, b, H_j, d] at `base`, as a [b, n, count, d]
// view (n, b, d and the dtype of `like`).
TensorView seq_block(const Blocks& k, std::byte* base, int j, std::int64_t slot, std::int64_t count,
                     const TensorView& like) {
  const std::int64_t d = like.shape.d, hj = k.heads[std::size_t(j)];
  TensorView v{base + std::size_t(slot * d) * dtype_size(like.dtype),
               like.dtype,
               {like.shape.b, like.shape.s, count, d},
               hj * d,
               like.shape.b * hj * d,
               d,
               like.device};
  return v;
}

}  // namespace

PendingTranspose post_seq_to_head(Communicator& comm, std::span<const SeqShard> inputs,
                                  const std::vector<std::int64_t>& rank_tokens, FusedHeads& out, void* storage) {
  const Shape& sh0 = inputs[0].view.shape;
  const DType dtype = inputs[0].view.dtype;
  const std::size_t row_bytes = std::size_t(sh0.d) * dtype_size(dtype);
  const int me = comm.rank(), cp = comm.size();
  std::vector<std::int64_t> local_heads;
  for (const SeqShard& t : inputs) local_heads.push_back(t.heads[std::size_t(me)].count);
  out = FusedHeads(dtype, sh0.b, rank_tokens, sh0.d, local_heads, storage, inputs[0].view.device);
  auto k = std::make_shared<const Blocks>(blocks_of(inputs, out.rank_tokens(), me, row_bytes));

  // Rank j's block [n, b, H_j, d]: ours packed straight into place in the output, the others
  // into the send buffer.
  auto send = std::make_shared<Tensor>(Tensor::uninitialized({1, std::int64_t(k->seq_side_bytes / row_bytes), 1, sh0.d},
                                                             dtype, Layout::bshd, out.device()));
  std::byte* sbuf = static_cast<std::byte*>(send->data());
  std::byte* obuf = static_cast<std::byte*>(out.whole().data);
  std::vector<ViewCopy> pack;
  for (int j = 0; j < cp; ++j) {
    const std::size_t J = std::size_t(j);
    std::byte* base = j == me ? obuf + k->own_offset : sbuf + k->seq_offsets[J];
    for (std::size_t t = 0; t < inputs.size(); ++t) {
      const TensorView& in = inputs[t].view;
      const HeadRange& r = inputs[t].heads[J];
      TensorView src = in;
      src.data = in.row(0, 0, r.first);
      src.shape.h = r.count;
      pack.push_back({src, seq_block(*k, base, j, k->slot[t][J], r.count, in)});
    }
  }
  device_ops(out.device()).copy(pack);
  // The other ranks' blocks land in place too.
  Request r = comm.ialltoallv(buffer_of(*send), k->seq_bytes, k->seq_offsets, buffer_of(out.whole()), k->head_bytes,
                              k->head_offsets, "seq_to_head");
  return PendingTranspose(std::move(r), [send, k] {});
}

FusedHeads seq_to_head(Communicator& comm, std::span<const SeqShard> inputs) {
  const std::vector<std::int64_t> tokens = check_transpose(comm, inputs, "seq_to_head");
  FusedHeads out;
  post_seq_to_head(comm, inputs, tokens, out).wait();
  return out;
}

namespace {

// "" when `in` is the head-sharded side of `outputs` on this rank.
std::string head_side_error(const Communicator& comm, const FusedHeads& in, std::span<const SeqShard> outputs) {
  const Shape& sh0 = outputs[0].view.shape;
  const std::size_t me = std::size_t(comm.rank());
  bool match = in.batch() == sh0.b && in.head_dim() == sh0.d && in.dtype() == outputs[0].view.dtype &&
               in.device() == outputs[0].view.device && in.num_parts() == int(outputs.size()) &&
               in.rank_tokens().size() == std::size_t(comm.size()) && in.rank_tokens()[me] == sh0.s;
  for (int t = 0; match && t < in.num_parts(); ++t)
    match = in.local_heads(t) == outputs[std::size_t(t)].heads[me].count;
  if (match) return "";
  return fmt::format(
      "head_to_seq: head-sharded input (b={}, s={}, d={}, {} parts) does not match the outputs "
      "(b={}, n_r={}, d={}, cp={}, {} parts)",
      in.batch(), in.seq(), in.head_dim(), in.num_parts(), sh0.b, sh0.s, sh0.d, comm.size(), outputs.size());
}

// head_to_seq's second half: a head one rank holds is copied back (the heads of a rank's range
// as one view); one that several ranks hold (a shared KV head) is the sum of their gradients
// (in float32, in rank order).
void unpack_seq_side(const FusedHeads& in, std::span<const SeqShard> outputs, const Blocks& k, const Tensor& recv,
                     int me) {
  std::byte* rbuf = static_cast<std::byte*>(recv.data());
  std::byte* own = static_cast<std::byte*>(in.whole().data) + k.own_offset;
  const Holders holders = holders_of(outputs, k);
  auto block = [&](const TensorView& o, std::pair<std::size_t, std::int64_t> holder) {
    const std::size_t j = holder.first;
    return seq_block(k, j == std::size_t(me) ? own : rbuf + k.seq_offsets[j], int(j), holder.second, 1, o);
  };
  std::vector<ViewCopy> copies;
  std::vector<std::pair<TensorView, std::vector<TensorView>>> sums;
  for (std::size_t t = 0; t < outputs.size(); ++t) {
    const TensorView& o = outputs[t].view;
    std::pair<std::size_t, std::int64_t> next{std::size_t(-1), 0};  // the holder extending the last copy
    for (std::int64_t head = 0; head < o.shape.h; ++head) {
      const auto& held = holders[t][std::size_t(head)];
      TensorView dst = o;
      dst.data = o.row(0, 0, head);
      dst.shape.h = 1;
      if (held.size() == 1 && held[0] == next) {
        ++copies.back().src.shape.h;
        ++copies.back().dst.shape.h;
      } else if (held.size() == 1) {
        copies.push_back({block(o, held[0]), dst});
      } else if (held.size() > 1) {  // none: another chunk's head (post_head_to_seq of some heads)
        sums.push_back({dst, {}});
        for (const auto& c : held) sums.back().second.push_back(block(o, c));
      }
      next =
          held.size() == 1 ? std::pair{held[0].first, held[0].second + 1} : std::pair{std::size_t(-1), std::int64_t(0)};
    }
  }
  const DeviceOps& ops = device_ops(in.device());
  ops.copy(copies);
  for (const auto& [dst, srcs] : sums) ops.sum(dst, srcs);
}

}  // namespace

PendingTranspose post_head_to_seq(Communicator& comm, const FusedHeads& in, std::span<const SeqShard> outputs) {
  const Shape& sh0 = outputs[0].view.shape;
  const DType dtype = in.dtype();
  const std::size_t row_bytes = std::size_t(sh0.d) * dtype_size(dtype);
  auto k = std::make_shared<const Blocks>(blocks_of(outputs, in.rank_tokens(), comm.rank(), row_bytes));
  // The head-sharded buffer already is the send buffer; our own block is unpacked straight
  // from it, the others arrive back to back.
  auto recv = std::make_shared<Tensor>(Tensor::uninitialized({1, std::int64_t(k->seq_side_bytes / row_bytes), 1, sh0.d},
                                                             dtype, Layout::bshd, in.device()));
  Request r = comm.ialltoallv(buffer_of(in.whole()), k->head_bytes, k->head_offsets, buffer_of(*recv), k->seq_bytes,
                              k->seq_offsets, "head_to_seq");
  std::vector<SeqShard> outs(outputs.begin(), outputs.end());
  return PendingTranspose(std::move(r), [&in, outs = std::move(outs), k, recv, me = comm.rank()] {
    unpack_seq_side(in, outs, *k, *recv, me);
  });
}

void head_to_seq(Communicator& comm, const FusedHeads& in, std::span<const SeqShard> outputs) {
  std::string err = local_transpose_check(outputs, comm.size(), "head_to_seq").error;
  if (err.empty()) err = head_side_error(comm, in, outputs);  // reads heads[rank]: only once they are checked
  check_transpose(comm, outputs, "head_to_seq", err);
  post_head_to_seq(comm, in, outputs).wait();
}

}  // namespace ulysses
