#include "guard.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <sstream>

#include "report.hpp"
#include "train/memory.hpp"
#include "ulysses/io/input_file.hpp"
#include "ulysses/core/error.hpp"
#include "ulysses/core/tensor.hpp"

namespace ulysses::cli {

namespace {

CLI::Validator sign_check(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& text) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(text.c_str(), &end);
        if (end != text.c_str() && *end == '\0' && (x > 0 || (zero_ok && x == 0))) return "";
        return fmt::format("must be {}, got '{}'", zero_ok ? "zero or positive" : "positive", text.substr(0, 40));
      },
      zero_ok ? "NONNEGATIVE" : "POSITIVE");
}

}  // namespace

CLI::Validator positive_number() { return sign_check(false); }
CLI::Validator non_negative_number() { return sign_check(true); }

void check_memory(const std::string& what, double per_rank, double root_extra, int ranks_on_node) {
  const std::int64_t available = available_memory_bytes();
  const double need = per_rank * ranks_on_node + root_extra;
  if (available < 0 || need <= double(available)) return;
  throw Error(
      fmt::format("{} needs about {} of memory on this node ({} rank(s) x {}, plus {} on rank 0), only {} "
                  "available (MemAvailable): use a smaller problem or more nodes",
                  what, human_bytes(need), ranks_on_node, human_bytes(per_rank), human_bytes(root_extra),
                  human_bytes(double(available))));
}

MemoryRoom memory_room(Communicator& comm) {
  MemoryRoom room;
  room.available = available_memory_bytes();
  room.on_node = std::max(1, comm.ranks_on_this_node());
  std::int64_t least = room.available < 0 ? std::numeric_limits<std::int64_t>::max() : room.available / room.on_node;
  comm.allreduce_min(&least, 1);
  room.known = least != std::numeric_limits<std::int64_t>::max();
  room.per_rank = 0.9 * double(least);
  return room;
}

std::string MemoryRoom::refusal(const std::string& what, double need, const std::string& described,
                                const std::string& remedy) const {
  if (!known || need <= per_rank) return "";
  return fmt::format(
      "{} needs a predicted {} per rank, more than this machine has: {} per rank (90 % of {} available "
      "(MemAvailable or the cgroup's limit) over {} rank(s) on this node; the least of any node): {}",
      what, described, train::format_bytes(per_rank), train::format_bytes(double(available)), on_node, remedy);
}

void check_finite(const NpyArray& a, const char* name, const std::string& path) {
  const Shape sh{a.shape[0], a.shape[1], a.shape[2], a.shape[3]};
  const std::string err =
      nonfinite_error(name, TensorView::dense(const_cast<float*>(a.data.data()), DType::f32, sh, Layout::bshd));
  if (!err.empty()) throw Error(fmt::format("{} ({}); --allow-nonfinite computes with it anyway", err, path));
}

void agree_same_inputs(Communicator& comm, const std::vector<const NpyArray*>& arrays) {
  std::string description;
  for (const NpyArray* a : arrays) {
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over pairs of floats
    for (std::size_t i = 0; i < a->data.size(); i += 2) {
      std::uint64_t word = 0;
      std::memcpy(&word, &a->data[i], i + 1 < a->data.size() ? 8 : 4);
      h = (h ^ word) * 0x100000001b3ull;
    }
    description +=
        fmt::format("{}shape ({}) hash {:016x}", description.empty() ? "" : "; ", fmt::join(a->shape, ", "), h);
  }
  comm.agree_identical("the input files' contents", description);
}

}  // namespace ulysses::cli
