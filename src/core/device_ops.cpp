// The device table registry and the CPU's table: host loops over strided views, OpenMP over
// rows.
#include "ulysses/core/device_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ulysses/core/error.hpp"

namespace ulysses {

namespace {

// Row (b, s, *) of one copy: a memcpy per head, or a conversion through `row` (d floats).
void copy_rows(const ViewCopy& c, std::int64_t b, std::int64_t s, float* row) {
  const TensorView &from = c.src, &to = c.dst;
  if (from.dtype != to.dtype) {
    for (std::int64_t h = 0; h < from.shape.h; ++h) {
      load_row(from, b, s, h, row);
      store_row(to, b, s, h, row);
    }
    return;
  }
  const std::size_t es = dtype_size(from.dtype), row_bytes = std::size_t(from.shape.d) * es;
  const std::byte* src = static_cast<const std::byte*>(from.data) + std::size_t(from.offset(b, s, 0)) * es;
  std::byte* dst = static_cast<std::byte*>(to.data) + std::size_t(to.offset(b, s, 0)) * es;
  for (std::int64_t h = 0; h < from.shape.h; ++h)
    std::memcpy(dst + std::size_t(h * to.stride_h) * es, src + std::size_t(h * from.stride_h) * es, row_bytes);
}

// Threads take (s, b) rows and copy them in every view: a pack's destination is then written
// in one pass, its blocks' rows next to each other, as the all-to-all lays them out.
void cpu_copy(std::span<const ViewCopy> copies) {
  std::int64_t ns = 0, nb = 0, d = 0;
  for (const ViewCopy& c : copies) {
    ns = std::max(ns, c.src.shape.s);
    nb = std::max(nb, c.src.shape.b);
    d = std::max(d, c.src.shape.d);
  }
#pragma omp parallel
  {
    std::vector<float> row(static_cast<std::size_t>(d));
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t s = 0; s < ns; ++s)
      for (std::int64_t b = 0; b < nb; ++b)
        for (const ViewCopy& c : copies)
          if (s < c.src.shape.s && b < c.src.shape.b) copy_rows(c, b, s, row.data());
  }
}

void cpu_fill(const TensorView& t, float value) {
  const std::vector<float> z(static_cast<std::size_t>(t.shape.d), value);
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < t.shape.b; ++b)
    for (std::int64_t s = 0; s < t.shape.s; ++s)
      for (std::int64_t h = 0; h < t.shape.h; ++h) store_row(t, b, s, h, z.data());
}

void cpu_accumulate(const TensorView& dst, const TensorView& src) {
  const Shape& s = dst.shape;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t i = 0; i < s.s; ++i)
      for (std::int64_t h = 0; h < s.h; ++h) {
        float* o = dst.f32(b, i, h);
        const float* x = src.f32(b, i, h);
        for (std::int64_t c = 0; c < s.d; ++c) o[c] += x[c];
      }
}

void cpu_sum(const TensorView& dst, std::span<const TensorView> srcs) {
  const Shape& sh = dst.shape;
  const std::size_t d = std::size_t(sh.d);
#pragma omp parallel
  {
    std::vector<float> acc(d), row(d);
#pragma omp for collapse(2) schedule(static)
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t s = 0; s < sh.s; ++s)
        for (std::int64_t h = 0; h < sh.h; ++h) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (const TensorView& src : srcs) {
            load_row(src, b, s, h, row.data());
            for (std::size_t x = 0; x < d; ++x) acc[x] += row[x];
          }
          store_row(dst, b, s, h, acc.data());
        }
  }
}

void cpu_merge(const TensorView& acc, const TensorView& acc_lse, const TensorView& part, const TensorView& part_lse) {
  const Shape& s = acc.shape;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t i = 0; i < s.s; ++i) {
        float& L = *acc_lse.f32(b, i, h);
        const float Li = *part_lse.f32(b, i, h);
        if (std::isinf(Li) && Li < 0) continue;  // the part saw no key for this row
        float* o = acc.f32(b, i, h);
        const float* oi = part.f32(b, i, h);
        if (std::isinf(L) && L < 0) {  // first contribution
          for (std::int64_t x = 0; x < s.d; ++x) o[x] = oi[x];
          L = Li;
          continue;
        }
        // σ(Li − L) = weight of the new part; log σ(L − Li) = −softplus(Li − L).
        const float w = 1.0f / (1.0f + std::exp(L - Li));
        for (std::int64_t x = 0; x < s.d; ++x) o[x] -= w * (o[x] - oi[x]);
        // max(L, Li) + softplus(−|Li − L|): never below either lse (the backward's exp relies on
        // lse >= every scaled score, flash_backward.cpp), finite for finite L, Li.
        L = std::max(L, Li) + std::log1p(std::exp(-std::abs(Li - L)));
      }
}

void host_bytes(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }

PerDevice<DeviceOps>& tables() {
  static const DeviceOps cpu{Device::cpu, &host_allocator(), cpu_copy,   cpu_fill,  cpu_accumulate,
                             cpu_sum,     cpu_merge,         host_bytes, host_bytes};
  static PerDevice<DeviceOps> t = [] {
    PerDevice<DeviceOps> p;
    p.set(cpu);
    return p;
  }();
  return t;
}

}  // namespace

const DeviceOps& device_ops(Device device) {
  const DeviceOps* t = tables().find(device);
  if (t == nullptr) throw Error(fmt::format("no operations table for device {}", to_string(device)));
  return *t;
}

Allocator& device_allocator(Device device) { return *device_ops(device).allocator; }

void register_device_ops(const DeviceOps& ops) { tables().set(ops); }

const DeviceOps& ops_for(std::initializer_list<const TensorView*> views) {
  const Device d = (*views.begin())->device;
  for (const TensorView* v : views)
    if (v->device != d)
      throw Error(fmt::format("views on two devices, {} and {}: data moves within one device", to_string(d),
                              to_string(v->device)));
  return device_ops(d);
}

}  // namespace ulysses
