// The collectives over Buffers: memory the backend reaches goes through as is, any other
// through host copies made with the device's table (a device-unaware MPI's staging); then the
// host_* halves in communicator.cpp count and trace them.
#include <fmt/format.h>

#include <functional>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "ulysses/comm/communicator.hpp"
#include "ulysses/core/device_ops.hpp"
#include "ulysses/core/error.hpp"

namespace ulysses {

Buffer buffer_of(const TensorView& v) {
  if (!v.is_dense(Layout::bshd) && !v.is_dense(Layout::sbhd) && !v.is_dense(Layout::bhsd))
    throw Error(fmt::format("a communicated view must be one dense block, got {} with strides [{}, {}, {}]",
                            v.shape.str(), v.stride_b, v.stride_s, v.stride_h));
  return {v.data, std::size_t(v.shape.numel()) * dtype_size(v.dtype), v.dtype, v.device};
}

Buffer buffer_of(const Tensor& t) { return buffer_of(t.view()); }

namespace {

// Throws unless every block [offsets[j], offsets[j] + bytes[j]) lies inside `b`.
void check_holds(const Buffer& b, std::span<const std::size_t> bytes, std::span<const std::size_t> offsets,
                 const char* what) {
  for (std::size_t j = 0; j < bytes.size() && j < offsets.size(); ++j)
    if (bytes[j] > 0 && (offsets[j] > b.bytes || bytes[j] > b.bytes - offsets[j]))
      throw Error(fmt::format("{}: block {} [{}, {}) passes the end of its buffer of {} bytes", what, j, offsets[j],
                              offsets[j] + bytes[j], b.bytes));
}

void check_holds(const Buffer& b, std::size_t bytes, const char* what) {
  const std::size_t zero = 0;
  check_holds(b, {&bytes, 1}, {&zero, 1}, what);
}

// Where the backend reads or writes a Buffer: the buffer itself when it reaches the device, else
// a host copy (filled from the device when `fill`).
class Staged {
 public:
  Staged(const Communicator& comm, const Buffer& b, bool fill) : b_(b), direct_(comm.reaches(b.device)) {
    if (direct_) return;
    host_.resize(b.bytes);
    if (fill) device_ops(b.device).to_host(host_.data(), b.data, b.bytes);
  }
  void* data() { return direct_ ? b_.data : host_.data(); }
  bool direct() const { return direct_; }
  // Bytes [offset, offset + bytes) back to the device.
  void write_back(std::size_t offset, std::size_t bytes) {
    if (!direct_ && bytes > 0)
      device_ops(b_.device).from_host(static_cast<std::byte*>(b_.data) + offset, host_.data() + offset, bytes);
  }
  void write_back() { write_back(0, b_.bytes); }

 private:
  Buffer b_;
  bool direct_;
  std::vector<std::byte> host_;
};

// A request over staged buffers: wait() completes it, then writes back what was received.
class StagedRequest final : public Request::Impl {
 public:
  StagedRequest(Request inner, std::function<void()> finish) : finish_(std::move(finish)), inner_(std::move(inner)) {}
  void wait() override {
    inner_.wait();
    if (finish_) std::exchange(finish_, nullptr)();
  }
  bool test() override { return inner_.test(); }

 private:
  std::function<void()> finish_;  // owns the host copies; destroyed after inner_, which waits
  Request inner_;
};

Request staged(Request inner, std::function<void()> finish) {
  return Request(std::make_unique<StagedRequest>(std::move(inner), std::move(finish)));
}

}  // namespace

Request Communicator::ialltoallv(const Buffer& send, std::span<const std::size_t> send_bytes,
                                 std::span<const std::size_t> send_offsets, const Buffer& recv,
                                 std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_offsets,
                                 const std::string& op) {
  check_per_rank("ialltoallv", {send_bytes.size(), send_offsets.size(), recv_bytes.size(), recv_offsets.size()});
  check_holds(send, send_bytes, send_offsets, "ialltoallv send");
  check_holds(recv, recv_bytes, recv_offsets, "ialltoallv recv");
  auto s = std::make_shared<Staged>(*this, send, true);
  auto r = std::make_shared<Staged>(*this, recv, false);
  Request inner = host_ialltoallv(s->data(), send_bytes, send_offsets, r->data(), recv_bytes, recv_offsets, op);
  if (s->direct() && r->direct()) return inner;
  return staged(std::move(inner), [s, r, bytes = std::vector<std::size_t>(recv_bytes.begin(), recv_bytes.end()),
                                   offsets = std::vector<std::size_t>(recv_offsets.begin(), recv_offsets.end())] {
    for (std::size_t j = 0; j < bytes.size(); ++j) r->write_back(offsets[j], bytes[j]);
  });
}

void Communicator::allgatherv(const Buffer& send, const Buffer& recv, std::span<const std::size_t> bytes,
                              const std::string& op) {
  check_per_rank("allgatherv", {bytes.size()});
  check_holds(send, bytes[std::size_t(rank_)], "allgatherv send");
  check_holds(recv, std::accumulate(bytes.begin(), bytes.end(), std::size_t(0)), "allgatherv recv");
  Staged s(*this, send, true), r(*this, recv, false);
  host_allgatherv(s.data(), r.data(), bytes, op);
  r.write_back();
}

void Communicator::reduce_scatter_sum(const Buffer& send, const Buffer& recv, std::span<const std::size_t> counts,
                                      const std::string& op) {
  check_per_rank("reduce_scatter_sum", {counts.size()});
  if (send.dtype != DType::f32 || recv.dtype != DType::f32)
    throw Error(
        fmt::format("reduce_scatter_sum adds float32, got {} and {}", to_string(send.dtype), to_string(recv.dtype)));
  check_holds(send, std::accumulate(counts.begin(), counts.end(), std::size_t(0)) * 4, "reduce_scatter_sum send");
  check_holds(recv, counts[std::size_t(rank_)] * 4, "reduce_scatter_sum recv");
  Staged s(*this, send, true), r(*this, recv, false);
  host_reduce_scatter_sum(static_cast<const float*>(s.data()), static_cast<float*>(r.data()), counts, op);
  r.write_back();
}

Request Communicator::isend(const Buffer& data, int dest, int tag, const std::string& op) {
  auto s = std::make_shared<Staged>(*this, data, true);
  Request inner = host_isend(s->data(), data.bytes, dest, tag, op);
  if (s->direct()) return inner;
  return staged(std::move(inner), [s] {});
}

Request Communicator::irecv(const Buffer& data, int src, int tag, const std::string& op) {
  auto r = std::make_shared<Staged>(*this, data, false);
  Request inner = host_irecv(r->data(), data.bytes, src, tag, op);
  if (r->direct()) return inner;
  return staged(std::move(inner), [r] { r->write_back(); });
}

}  // namespace ulysses
