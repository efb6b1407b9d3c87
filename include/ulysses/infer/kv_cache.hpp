// A key/value cache sharded over the `cp` ranks of a context-parallel group: this rank's part,
// per layer. Two layouts:
//   heads        Ulysses: every token, this rank's KV heads (ulysses_heads in sharding.hpp).
//                With fewer KV heads than ranks each KV head is held by cp / kv_heads ranks
//                (replication() says by how many): the query heads still split, the cache does not.
//   interleaved  token i on rank i mod cp, every KV head: any kv_heads, and a new token shards
//                itself (the decode step appends it on one rank only). A rank may hold no token.
// Rows are float32, per layer for K and for V, viewed as [1, rows, kv_heads_local, head_dim] but
// held head by head ([kv_heads_local, capacity, head_dim], bhsd): each KV head's rows are one
// contiguous block, which the decode kernel reads in address order (the hardware prefetchers
// follow it; attention.hpp). All of the capacity is allocated at construction: bytes() is what
// is held, bytes_formula() the closed form it must equal. Not collective; owned by the rank
// that made it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ulysses/core/ranges.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses {

enum class KvLayout : int { heads = 0, interleaved = 1 };
KvLayout parse_kv_layout(std::string_view name);  // "heads" | "interleaved"; Error otherwise
const char* to_string(KvLayout layout);

// What the cache holds for the whole group: capacity in tokens (prompt + generated).
struct KvCacheShape {
  std::int64_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0, capacity = 0;
};

// "" when `layout` can hold a model of `shape` at cp ranks, else the reason and what would work
// (heads needs heads >= cp: every rank of the all-to-all gets a query head).
std::string kv_layout_error(KvLayout layout, const KvCacheShape& shape, int cp);

// Rows (token slots) rank `rank` of `cp` holds for `tokens` tokens under `layout`.
std::int64_t kv_rows(KvLayout layout, std::int64_t tokens, int cp, int rank);
// KV heads rank `rank` holds under `layout`.
std::int64_t kv_heads_held(KvLayout layout, const KvCacheShape& shape, int cp, int rank);
// The bytes rank `rank` holds: layers · 2 (K, V) · kv_rows(capacity) · kv_heads_held · head_dim · 4.
std::int64_t kv_bytes_formula(KvLayout layout, const KvCacheShape& shape, int cp, int rank);

class KvCache {
 public:
  // Throws Error for a bad shape or kv_layout_error's reason. The rows live on `device` (its
  // allocator); appends copy through its table (device_ops.hpp).
  KvCache(KvLayout layout, const KvCacheShape& shape, int cp, int rank, Device device = Device::cpu);

  KvLayout layout() const { return layout_; }
  const KvCacheShape& shape() const { return shape_; }
  int cp() const { return cp_; }
  int rank() const { return rank_; }
  // This rank's query and KV heads (all of them under interleaved).
  const RankHeads& heads() const { return heads_; }
  // How many ranks hold each KV head: cp / kv_heads under heads when kv_heads < cp, else 1.
  std::int64_t replication() const;
  // The rank that caches token `position` (interleaved); -1 under heads (every rank does).
  int owner(std::int64_t position) const;
  // Tokens of the group cached in `layer`, and this rank's rows of them.
  std::int64_t tokens(std::int64_t layer) const { return tokens_[std::size_t(layer)]; }
  std::int64_t rows(std::int64_t layer) const { return kv_rows(layout_, tokens(layer), cp_, rank_); }
  // [1, rows(layer), kv heads held, d] views of this rank's cached keys and values.
  TensorView keys(std::int64_t layer) const;
  TensorView values(std::int64_t layer) const;
  // Appends `n` tokens of the group to `layer`: k, v hold this rank's rows of them
  // ([1, kv_rows(tokens + n) − rows, kv heads held, d], any strides). Error past the capacity.
  void append(std::int64_t layer, std::int64_t n, const TensorView& k, const TensorView& v);
  // Forgets every token (the memory stays).
  void clear();
  // The bytes this rank holds (the allocated tensors); equals kv_bytes_formula.
  std::int64_t bytes() const;

 private:
  KvLayout layout_;
  KvCacheShape shape_;
  int cp_, rank_;
  RankHeads heads_;
  std::vector<Tensor> k_, v_;  // per layer, capacity rows
  std::vector<std::int64_t> tokens_;
};

}  // namespace ulysses
