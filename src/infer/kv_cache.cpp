#include "ulysses/infer/kv_cache.hpp"

#include <fmt/format.h>

#include "ulysses/core/error.hpp"
#include "ulysses/cp/sharding.hpp"

namespace ulysses {

KvLayout parse_kv_layout(std::string_view name) {
  if (name == "heads") return KvLayout::heads;
  if (name == "interleaved") return KvLayout::interleaved;
  throw Error(fmt::format("unknown KV cache layout '{}' (heads | interleaved)", name));
}

const char* to_string(KvLayout layout) { return layout == KvLayout::heads ? "heads" : "interleaved"; }

std::string kv_layout_error(KvLayout layout, const KvCacheShape& s, int cp) {
  if (cp < 1) return fmt::format("cp must be positive, got {}", cp);
  for (auto [name, v] : {std::pair{"layers", s.layers},
                         {"heads", s.heads},
                         {"kv_heads", s.kv_heads},
                         {"head_dim", s.head_dim},
                         {"capacity", s.capacity}})
    if (v <= 0) return fmt::format("KV cache {} must be positive, got {}", name, v);
  if (s.heads % s.kv_heads != 0)
    return fmt::format("heads ({}) must be divisible by kv_heads ({})", s.heads, s.kv_heads);
  if (layout == KvLayout::heads && s.heads < cp)
    return fmt::format(
        "KV layout heads cannot hold {} query heads at cp = {}: every rank needs a query head; use "
        "--kv-layout interleaved (any cp) or cp <= {}",
        s.heads, cp, s.heads);
  return "";
}

std::int64_t kv_rows(KvLayout layout, std::int64_t tokens, int cp, int rank) {
  if (layout == KvLayout::heads) return tokens;
  return tokens > rank ? (tokens - rank + cp - 1) / cp : 0;  // positions rank, rank + cp, …
}

std::int64_t kv_heads_held(KvLayout layout, const KvCacheShape& s, int cp, int rank) {
  if (layout == KvLayout::interleaved) return s.kv_heads;
  return ulysses_heads(cp, rank, s.heads, s.kv_heads).kv.count;
}

std::int64_t kv_bytes_formula(KvLayout layout, const KvCacheShape& s, int cp, int rank) {
  return s.layers * 2 * kv_rows(layout, s.capacity, cp, rank) * kv_heads_held(layout, s, cp, rank) * s.head_dim *
         std::int64_t(sizeof(float));
}

KvCache::KvCache(KvLayout layout, const KvCacheShape& shape, int cp, int rank, Device device)
    : layout_(layout), shape_(shape), cp_(cp), rank_(rank) {
  if (const std::string e = kv_layout_error(layout, shape, cp); !e.empty()) throw Error(e);
  if (rank < 0 || rank >= cp) throw Error(fmt::format("rank {} is not in a group of {}", rank, cp));
  heads_ = layout == KvLayout::heads ? ulysses_heads(cp, rank, shape.heads, shape.kv_heads)
                                     : RankHeads{{0, shape.heads}, {0, shape.kv_heads}};
  const Shape rows{1, kv_rows(layout, shape.capacity, cp, rank), heads_.kv.count, shape.head_dim};
  for (std::int64_t l = 0; l < shape.layers; ++l) {
    k_.emplace_back(rows, DType::f32, Layout::bhsd, device);
    v_.emplace_back(rows, DType::f32, Layout::bhsd, device);
  }
  tokens_.assign(std::size_t(shape.layers), 0);
}

std::int64_t KvCache::replication() const {
  if (layout_ == KvLayout::interleaved || shape_.kv_heads >= cp_) return 1;
  return cp_ / shape_.kv_heads;
}

int KvCache::owner(std::int64_t position) const { return layout_ == KvLayout::heads ? -1 : int(position % cp_); }

TensorView KvCache::keys(std::int64_t layer) const {
  return ulysses::rows(k_[std::size_t(layer)].view(), 0, rows(layer));
}

TensorView KvCache::values(std::int64_t layer) const {
  return ulysses::rows(v_[std::size_t(layer)].view(), 0, rows(layer));
}

void KvCache::append(std::int64_t layer, std::int64_t n, const TensorView& k, const TensorView& v) {
  const std::int64_t t = tokens(layer);
  if (n < 0 || t + n > shape_.capacity)
    throw Error(
        fmt::format("KV cache full: {} tokens cached, {} more do not fit in a capacity of {}", t, n, shape_.capacity));
  const std::int64_t first = rows(layer), count = kv_rows(layout_, t + n, cp_, rank_) - first;
  const Shape expected{1, count, heads_.kv.count, shape_.head_dim};
  for (const TensorView* x : {&k, &v})
    if (x->shape != expected) throw Error(shape_error("appended KV rows", *x, expected));
  if (count > 0) {
    copy(k, ulysses::rows(k_[std::size_t(layer)].view(), first, count));
    copy(v, ulysses::rows(v_[std::size_t(layer)].view(), first, count));
  }
  tokens_[std::size_t(layer)] = t + n;
}

void KvCache::clear() { tokens_.assign(tokens_.size(), 0); }

std::int64_t KvCache::bytes() const {
  std::int64_t total = 0;
  for (std::size_t l = 0; l < k_.size(); ++l) total += std::int64_t(k_[l].nbytes() + v_[l].nbytes());
  return total;
}

}  // namespace ulysses
