// seq_to_head / head_to_seq: pack into the all-to-all's block order, one MPI_Alltoall, and
// (only on the sequence-sharded side) unpack. See all_to_all.hpp for the layout.
#include "ulysses/all_to_all.hpp"

#include <fmt/format.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "ulysses/error.hpp"

namespace ulysses {

FusedHeads::FusedHeads(DType dtype, std::int64_t batch, std::int64_t seq, std::int64_t head_dim,
                       std::vector<std::int64_t> local_heads)
    : local_heads_(std::move(local_heads)), batch_(batch), seq_(seq), head_dim_(head_dim) {
  total_heads_ = std::accumulate(local_heads_.begin(), local_heads_.end(), std::int64_t(0));
  buffer_ = Tensor::uninitialized({batch, seq, total_heads_, head_dim}, dtype, Layout::sbhd);
}

std::int64_t FusedHeads::head_offset(int t) const {
  return std::accumulate(local_heads_.begin(), local_heads_.begin() + t, std::int64_t(0));
}

TensorView FusedHeads::part(int t) const {
  TensorView v = buffer_.view();
  v.data = static_cast<std::byte*>(v.data) + head_offset(t) * head_dim_ * std::int64_t(dtype_size(dtype()));
  v.shape.h = local_heads_[t];
  return v;
}

FusedHeads FusedHeads::converted(DType dtype) const {
  FusedHeads out(dtype, batch_, seq_, head_dim_, local_heads_);
  copy(whole(), out.whole());
  return out;
}

namespace {

// What every rank must agree on: the tensors' dtype, shapes and replication.
std::string describe_shards(std::span<const SeqShard> shards) {
  std::string s = fmt::format("{} tensors, dtype {}", shards.size(), to_string(shards[0].view.dtype));
  for (const SeqShard& t : shards) s += fmt::format(", {} x{}", t.view.shape.str(), t.replicas);
  return s;
}

// Local checks, then agreement across ranks. Returns local heads per tensor.
std::vector<std::int64_t> check_shards(Communicator& comm, std::span<const SeqShard> shards,
                                       const char* op) {
  const int cp = comm.size();
  std::string err;
  std::vector<std::int64_t> local_heads;
  if (shards.empty()) err = fmt::format("{}: no tensors given", op);
  for (std::size_t t = 0; t < shards.size() && err.empty(); ++t) {
    const TensorView& v = shards[t].view;
    const TensorView& v0 = shards[0].view;
    const std::int64_t slots = v.shape.h * shards[t].replicas;
    if (v.data == nullptr && v.shape.numel() > 0) err = fmt::format("{}: tensor {} has no data", op, t);
    else if (shards[t].replicas < 1) err = fmt::format("{}: tensor {} has replicas {} < 1", op, t, shards[t].replicas);
    else if (v.dtype != v0.dtype || v.shape.b != v0.shape.b || v.shape.s != v0.shape.s || v.shape.d != v0.shape.d)
      err = fmt::format("{}: tensor {} is {} {} but tensor 0 is {} {}; b, s/cp, d and dtype must match",
                        op, t, v.shape.str(), to_string(v.dtype), v0.shape.str(), to_string(v0.dtype));
    else if (slots % cp != 0)
      err = fmt::format("{}: tensor {} has {} heads (x{} replicas) which is not divisible by cp ({})",
                        op, t, v.shape.h, shards[t].replicas, cp);
    local_heads.push_back(cp > 0 ? slots / cp : 0);
  }
  comm.agree(err);
  comm.agree_identical(fmt::format("{} inputs", op), describe_shards(shards));
  return local_heads;
}

}  // namespace

FusedHeads seq_to_head(Communicator& comm, std::span<const SeqShard> inputs) {
  std::vector<std::int64_t> local_heads = check_shards(comm, inputs, "seq_to_head");
  const int cp = comm.size();
  const Shape& sh0 = inputs[0].view.shape;
  const std::int64_t b = sh0.b, sl = sh0.s, d = sh0.d;
  const DType dtype = inputs[0].view.dtype;
  FusedHeads out(dtype, b, sl * cp, d, local_heads);
  const std::int64_t H = out.total_heads();
  const std::size_t row_bytes = std::size_t(d) * dtype_size(dtype);

  // Block j ([s/cp, b, H, d]) goes to rank j. Our own block is packed straight into place in
  // the output; the others into a send buffer of cp−1 blocks in rank order.
  const std::size_t block = std::size_t(sl * b * H) * row_bytes;
  const int me = comm.rank();
  Tensor send = Tensor::uninitialized({b, sl * (cp - 1), H, d}, dtype, Layout::sbhd);
  std::byte* sbuf = static_cast<std::byte*>(send.data());
  std::byte* obuf = static_cast<std::byte*>(out.whole().data);
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t j = 0; j < cp; ++j)
    for (std::int64_t s = 0; s < sl; ++s) {
      std::byte* base = j == me ? obuf + std::size_t(j) * block : sbuf + std::size_t(j < me ? j : j - 1) * block;
      for (std::int64_t bb = 0; bb < b; ++bb) {
        std::byte* dst = base + std::size_t((s * b + bb) * H) * row_bytes;
        for (std::size_t t = 0; t < inputs.size(); ++t) {
          const std::int64_t L = local_heads[t];
          for (std::int64_t i = 0; i < L; ++i, dst += row_bytes) {
            const std::int64_t head = (j * L + i) / inputs[t].replicas;
            std::memcpy(dst, inputs[t].view.row(bb, s, head), row_bytes);
          }
        }
      }
    }
  // The other ranks' blocks land in place too.
  comm.alltoall_others(sbuf, false, obuf, true, block, "seq_to_head");
  return out;
}

void head_to_seq(Communicator& comm, const FusedHeads& in, std::span<const SeqShard> outputs) {
  std::vector<std::int64_t> local_heads = check_shards(comm, outputs, "head_to_seq");
  const int cp = comm.size();
  const Shape& sh0 = outputs[0].view.shape;
  const std::int64_t b = sh0.b, sl = sh0.s, d = sh0.d;
  std::string err;
  bool match = in.batch() == b && in.seq() == sl * cp && in.head_dim() == d &&
               in.dtype() == outputs[0].view.dtype && in.num_parts() == int(outputs.size());
  for (int t = 0; match && t < in.num_parts(); ++t) match = in.local_heads(t) == local_heads[t];
  if (!match)
    err = fmt::format("head_to_seq: head-sharded input (b={}, s={}, d={}, {} parts) does not match "
                      "the outputs (b={}, s/cp={}, d={}, cp={}, {} parts)",
                      in.batch(), in.seq(), in.head_dim(), in.num_parts(), b, sl, d, cp,
                      outputs.size());
  comm.agree(err);

  const DType dtype = in.dtype();
  const std::int64_t H = in.total_heads();
  const std::size_t row_bytes = std::size_t(d) * dtype_size(dtype);
  // The head-sharded buffer already is the send buffer: [cp (destination), s/cp, b, H, d].
  // Our own block is unpacked straight from it; the others arrive in cp−1 blocks.
  const std::size_t block = std::size_t(sl * b * H) * row_bytes;
  const int me = comm.rank();
  Tensor recv = Tensor::uninitialized({b, sl * (cp - 1), H, d}, dtype, Layout::sbhd);
  comm.alltoall_others(in.whole().data, true, recv.data(), false, block, "head_to_seq");
  const std::byte* rbuf = static_cast<const std::byte*>(recv.data());
  const std::byte* own = static_cast<const std::byte*>(in.whole().data) + std::size_t(me) * block;

  // recv block j holds heads [j*L_t, (j+1)*L_t) of every tensor t. A head replicated r times
  // occupies slots [head*r, head*r + r): the adjoint of replication sums them (in float32).
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<std::size_t>(d)), row(static_cast<std::size_t>(d));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t s = 0; s < sl; ++s)
      for (std::int64_t bb = 0; bb < b; ++bb)
        for (std::size_t t = 0; t < outputs.size(); ++t) {
          const TensorView& o = outputs[t].view;
          const std::int64_t L = local_heads[t], r = outputs[t].replicas, off = in.head_offset(int(t));
          auto src_row = [&](std::int64_t slot) {
            const std::int64_t j = slot / L, i = slot % L;
            const std::byte* base = j == me ? own : rbuf + std::size_t(j < me ? j : j - 1) * block;
            return base + std::size_t((s * b + bb) * H + off + i) * row_bytes;
          };
          for (std::int64_t head = 0; head < o.shape.h; ++head) {
            if (r == 1) {
              std::memcpy(o.row(bb, s, head), src_row(head), row_bytes);
              continue;
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (std::int64_t k = 0; k < r; ++k) {
              TensorView one{const_cast<std::byte*>(src_row(head * r + k)), dtype, {1, 1, 1, d}, 0, 0, 0};
              load_row(one, 0, 0, 0, row.data());
              for (std::int64_t x = 0; x < d; ++x) acc[std::size_t(x)] += row[std::size_t(x)];
            }
            store_row(o, bb, s, head, acc.data());
          }
        }
  }
}

}  // namespace ulysses
