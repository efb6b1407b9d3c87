#include "train/data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ulysses/error.hpp"
#include "ulysses/input_file.hpp"

namespace ulysses::train {

namespace {

class Rng {  // splitmix64
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::int64_t below(std::int64_t n) { return std::int64_t(next() % std::uint64_t(n)); }

 private:
  std::uint64_t s_;
};

// Token ids of the synthetic task (byte vocabulary).
constexpr int kNoiseFirst = 'a', kNoiseCount = 16;  // 'a'..'p'
constexpr int kPairBase = 128;                      // 128 + key·10 + value
constexpr int kQueryBase = 224;                     // 224 + key
constexpr int kAnswerBase = '0';                    // '0' + value

}  // namespace

DataSource DataSource::synthetic() { return DataSource(); }

DataSource DataSource::text_file(const std::string& path, double holdout) {
  if (!(holdout >= 0 && holdout < 1)) throw Error(fmt::format("--holdout must be in [0, 1), got {}", holdout));
  const std::string text = read_input_within_memory("--data", path);
  DataSource d;
  d.synthetic_ = false;
  d.path_ = path;
  d.holdout_ = holdout;
  d.text_.assign(text.begin(), text.end());
  d.cut_ = std::int64_t(d.text_.size()) - std::int64_t(std::ceil(holdout * double(d.text_.size())));
  return d;
}

DataSource DataSource::packed_documents(const std::string& path, const std::string& separator, double holdout) {
  if (separator.empty()) throw Error("--doc-separator must not be empty");
  DataSource d = text_file(path, holdout);
  const std::string_view text(reinterpret_cast<const char*>(d.text_.data()), d.text_.size());
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t end = std::min(text.find(separator, pos), text.size());
    if (end > pos) (std::int64_t(pos) < d.cut_ ? d.documents_ : d.held_documents_).push_back({std::int64_t(pos), std::int64_t(end)});
    pos = end + separator.size();
  }
  if (d.documents_.empty() && d.held_documents_.empty())
    throw Error(fmt::format("--data {}: no documents (only separators)", path));
  // A document that starts before the cut is trained on whole: the held-out text starts after it.
  d.cut_ = d.held_documents_.empty() ? std::int64_t(d.text_.size()) : d.held_documents_.front().first;
  return d;
}

std::int64_t Batch::targets() const {
  return std::int64_t(std::count_if(labels.begin(), labels.end(), [](int l) { return l != kNoLabel; }));
}

std::string DataSource::error_for(std::int64_t seq) const {
  if (synthetic_ && seq < 64)
    return fmt::format("the synthetic task needs --seq >= 64 (a needle and {} queries), got {}", kQueries, seq);
  if (synthetic_) return "";
  const std::string held = holdout_ > 0 ? fmt::format(" (--holdout {} holds out {} of its {} bytes)", holdout_,
                                                      held_out_bytes(), text_.size())
                                        : "";
  if (packed()) {
    if (documents_.empty()) return fmt::format("--data {} leaves no document to train on{}", path_, held);
    if (holdout_ > 0 && held_documents_.empty())
      return fmt::format("--data {}: --holdout {} holds out no whole document (the last one starts before the cut); "
                         "use a larger --holdout", path_, holdout_);
    return "";
  }
  if (cut_ < seq + 1)
    return fmt::format("--data {} has {} bytes to train on{}; sequences of {} tokens need at least {}", path_, cut_, held,
                       seq, seq + 1);
  if (holdout_ > 0 && held_out_bytes() < seq + 1)
    return fmt::format("--data {}: --holdout {} holds out {} bytes; held-out sequences of {} tokens need at least {} "
                       "(a larger --holdout or a shorter --seq)", path_, holdout_, held_out_bytes(), seq, seq + 1);
  return "";
}

std::string DataSource::describe() const {
  const std::string held =
      held_out_bytes() > 0 ? fmt::format("; the last {} bytes held out (--holdout {})", held_out_bytes(), holdout_) : "";
  if (packed())
    return fmt::format("byte-level documents from {} ({} documents, {} bytes), packed with document masking and "
                       "per-document positions{}", path_, documents_.size() + held_documents_.size(), text_.size(), held);
  return synthetic_ ? fmt::format("synthetic needle retrieval: one value token hidden at a random position, {} "
                                  "queries for it at the end", kQueries)
                    : fmt::format("byte-level text from {} ({} bytes){}", path_, text_.size(), held);
}

namespace {

// Fills buf (S + 1 tokens) with consecutive documents from `first` on (wrapping around); sets
// out.cu_seqlens and marks the label of each document's last token (of sequence b) kNoLabel.
void pack(const std::vector<std::uint8_t>& text, const std::vector<std::pair<std::int64_t, std::int64_t>>& docs,
          std::size_t first, std::vector<int>& buf, Batch& out, std::int64_t b) {
  const std::int64_t S = out.seq;
  out.cu_seqlens.clear();
  std::size_t filled = 0;
  for (std::size_t d = first; filled < buf.size(); d = (d + 1) % docs.size()) {
    const std::int64_t start = std::int64_t(filled);
    if (start < S) out.cu_seqlens.push_back(start);
    if (start > 0) out.labels[std::size_t(b * S + start - 1)] = kNoLabel;  // kept by the shift in batch()
    for (std::int64_t i = docs[d].first; i < docs[d].second && filled < buf.size(); ++i) buf[filled++] = text[std::size_t(i)];
  }
  out.cu_seqlens.push_back(S);
}

}  // namespace

Batch DataSource::batch(std::int64_t B, std::int64_t S, std::uint64_t seed, std::int64_t step) const {
  return make(B, S, seed, step, false);
}

Batch DataSource::held_out_batch(std::int64_t B, std::int64_t S, std::uint64_t seed, std::int64_t index) const {
  if (synthetic_) return make(B, S, seed ^ 0xe7a1u, 1000000000 + index, false);
  return make(B, S, seed, index, true);
}

Batch DataSource::make(std::int64_t B, std::int64_t S, std::uint64_t seed, std::int64_t step, bool held_out) const {
  Batch out{B, S, std::vector<int>(std::size_t(B * S)), std::vector<int>(std::size_t(B * S)),
            std::vector<std::uint8_t>(std::size_t(B * S), 0)};
  std::vector<int> seqbuf(std::size_t(S + 1));
  for (std::int64_t b = 0; b < B; ++b) {
    Rng rng(seed * 0x100000001b3ull ^ (std::uint64_t(step) << 20) ^ std::uint64_t(b) * 0x9e3779b97f4a7c15ull);
    std::vector<std::uint8_t> is_answer(std::size_t(S + 1), 0);
    if (synthetic_) {
      // Filler: a cycle of letters, learnable from the previous token, so the loss that
      // remains is the retrieval itself.
      const int phase = int(rng.below(kNoiseCount));
      for (std::size_t i = 0; i < seqbuf.size(); ++i) seqbuf[i] = kNoiseFirst + int((i + std::size_t(phase)) % kNoiseCount);
      const int K = kPairs, Q = kQueries;
      std::vector<int> value(static_cast<std::size_t>(K));
      const std::int64_t span = S + 1 - 2 * Q;  // where pairs may go
      std::vector<std::int64_t> slots(static_cast<std::size_t>(span));
      std::iota(slots.begin(), slots.end(), 0);
      for (int k = 0; k < K; ++k) {  // distinct random positions (partial Fisher-Yates)
        std::swap(slots[std::size_t(k)], slots[std::size_t(k + rng.below(span - k))]);
        value[std::size_t(k)] = int(rng.below(10));
        seqbuf[std::size_t(slots[std::size_t(k)])] = kPairBase + 10 * k + value[std::size_t(k)];
      }
      for (int i = 0; i < Q; ++i) {
        const int k = int(rng.below(K));
        const std::int64_t at = span + 2 * i;
        seqbuf[std::size_t(at)] = kQueryBase + k;
        seqbuf[std::size_t(at + 1)] = kAnswerBase + value[std::size_t(k)];
        is_answer[std::size_t(at + 1)] = 1;
      }
    } else if (packed()) {
      const std::size_t window = std::size_t(step * B + b);
      pack(text_, held_out ? held_documents_ : documents_,
           held_out ? window % held_documents_.size() : std::size_t(rng.below(std::int64_t(documents_.size()))), seqbuf,
           out, b);
    } else {
      const std::int64_t off = held_out ? cut_ + (step * B + b) * (S + 1) % (held_out_bytes() - S) : rng.below(cut_ - S);
      for (std::int64_t i = 0; i <= S; ++i) seqbuf[std::size_t(i)] = text_[std::size_t(off + i)];
    }
    // Shift before sharding: input i predicts token i+1, so no label is lost at a boundary.
    for (std::int64_t i = 0; i < S; ++i) {
      out.tokens[std::size_t(b * S + i)] = seqbuf[std::size_t(i)];
      int& label = out.labels[std::size_t(b * S + i)];
      if (label != kNoLabel) label = seqbuf[std::size_t(i + 1)];
      out.scored[std::size_t(b * S + i)] = is_answer[std::size_t(i + 1)];
    }
  }
  return out;
}

}  // namespace ulysses::train
