#include "train/data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ulysses/core/error.hpp"
#include "ulysses/io/input_file.hpp"

namespace ulysses::train {

namespace {

using Docs = std::vector<std::pair<std::int64_t, std::int64_t>>;

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
    if (end > pos)
      (std::int64_t(pos) < d.cut_ ? d.documents_ : d.held_documents_).push_back({std::int64_t(pos), std::int64_t(end)});
    pos = end + separator.size();
  }
  if (d.documents_.empty() && d.held_documents_.empty())
    throw Error(fmt::format("--data {}: no documents (only separators)", path));
  // A document that starts before the cut is trained on whole: the held-out text starts after it.
  d.cut_ = d.held_documents_.empty() ? std::int64_t(d.text_.size()) : d.held_documents_.front().first;
  return d;
}

DataSource DataSource::documents(const std::string& path, const std::string& separator, double holdout) {
  DataSource d = packed_documents(path, separator, holdout);
  d.whole_documents_ = true;
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
  if (packed() || whole_documents_) {
    if (documents_.empty()) return fmt::format("--data {} leaves no document to train on{}", path_, held);
    if (holdout_ > 0 && held_documents_.empty())
      return fmt::format(
          "--data {}: --holdout {} holds out no whole document (the last one starts before the cut); "
          "use a larger --holdout",
          path_, holdout_);
    return "";
  }
  if (cut_ < seq + 1)
    return fmt::format("--data {} has {} bytes to train on{}; sequences of {} tokens need at least {}", path_, cut_,
                       held, seq, seq + 1);
  if (holdout_ > 0 && held_out_bytes() < seq + 1)
    return fmt::format(
        "--data {}: --holdout {} holds out {} bytes; held-out sequences of {} tokens need at least {} "
        "(a larger --holdout or a shorter --seq)",
        path_, holdout_, held_out_bytes(), seq, seq + 1);
  return "";
}

std::string DataSource::error_for(const StepShape& shape) const {
  if (shape.tokens_per_step > 0 && !whole_documents_)
    return fmt::format("--tokens-per-step {} samples whole documents: it needs --data FILE (without --pack)",
                       shape.tokens_per_step);
  if (whole_documents_) {
    if (shape.tokens_per_step <= 0) return "whole documents are sampled by a token budget: give --tokens-per-step N";
    if (std::string e = error_for(std::int64_t(0)); !e.empty()) return e;
    return first_document_error([&](std::int64_t len) -> std::string {
      if (len < 2) return "a document needs 2 tokens or more (its last token has no label): remove it";
      if (len > shape.tokens_per_step)
        return fmt::format("--tokens-per-step {} is smaller: a budget of at least the longest document is needed",
                           shape.tokens_per_step);
      return "";
    });
  }
  if (shape.lengths.empty()) return error_for(shape.seq);
  for (std::int64_t len : shape.lengths)
    if (std::string e = error_for(len); !e.empty()) return e;
  return "";
}

std::string DataSource::first_document_error(const std::function<std::string(std::int64_t)>& check) const {
  const Docs* sets[2] = {&documents_, &held_documents_};
  for (const Docs* docs : sets)
    for (std::size_t k = 0; k < docs->size(); ++k) {
      const auto [begin, end] = (*docs)[k];
      const std::string e = check(end - begin);
      if (e.empty()) continue;
      const std::int64_t line = 1 + std::count(text_.begin(), text_.begin() + begin, std::uint8_t('\n'));
      return fmt::format("--data {}: the {}document {} (line {}, byte {}) has {} token(s): {}", path_,
                         docs == &held_documents_ ? "held-out " : "", k + 1, line, begin, end - begin, e);
    }
  return "";
}

std::string DataSource::describe() const {
  const std::string held = held_out_bytes() > 0
                               ? fmt::format("; the last {} bytes held out (--holdout {})", held_out_bytes(), holdout_)
                               : "";
  if (whole_documents_)
    return fmt::format("byte-level documents from {} ({} documents, {} bytes), one sequence each, of its own length{}",
                       path_, documents_.size() + held_documents_.size(), text_.size(), held);
  if (packed())
    return fmt::format(
        "byte-level documents from {} ({} documents, {} bytes), packed with document masking and "
        "per-document positions{}",
        path_, documents_.size() + held_documents_.size(), text_.size(), held);
  return synthetic_ ? fmt::format(
                          "synthetic needle retrieval: one value token hidden at a random position, {} "
                          "queries for it at the end",
                          kQueries)
                    : fmt::format("byte-level text from {} ({} bytes){}", path_, text_.size(), held);
}

namespace {

// Walks consecutive documents from `first` on (wrapping around) through a sequence of S tokens
// and the one label past it: calls take(document, start, count) for each piece.
template <class Take>
void walk_documents(const Docs& docs, std::size_t first, std::int64_t S, Take&& take) {
  std::int64_t filled = 0;
  for (std::size_t d = first; filled <= S; d = (d + 1) % docs.size()) {
    const std::int64_t count = std::min(docs[d].second - docs[d].first, S + 1 - filled);
    take(d, filled, count);
    filled += count;
  }
}

// A packed sequence's documents (cu_seqlens) and its labels: every token but the last of each
// document that starts inside it.
void packed_layout(const Docs& docs, SequenceLayout& l) {
  const std::int64_t S = l.length;
  l.cu_seqlens.clear();
  std::int64_t cut_labels = 0;
  walk_documents(docs, std::size_t(l.source), S, [&](std::size_t, std::int64_t start, std::int64_t) {
    if (start < S) l.cu_seqlens.push_back(start);
    if (start > 0) ++cut_labels;
  });
  l.cu_seqlens.push_back(S);
  l.targets = S - cut_labels;
}

Rng sequence_rng(std::uint64_t seed, std::int64_t step, std::int64_t index) {
  return Rng(seed * 0x100000001b3ull ^ (std::uint64_t(step) << 20) ^ std::uint64_t(index) * 0x9e3779b97f4a7c15ull);
}

// Held-out synthetic sequences are training's draws under other seeds and steps.
void held_out_synthetic(std::uint64_t& seed, std::int64_t& step, bool& held_out) {
  seed ^= 0xe7a1u;
  step += 1000000000;
  held_out = false;
}

// Filler: a cycle of letters, learnable from the previous token, so the loss that remains is
// the retrieval itself; kPairs (key, value) needles at random positions, kQueries queries at the end.
void synthetic_tokens(Rng& rng, std::vector<int>& seqbuf, std::vector<std::uint8_t>& is_answer, int K, int Q) {
  const std::int64_t S = std::int64_t(seqbuf.size()) - 1;
  const int phase = int(rng.below(kNoiseCount));
  for (std::size_t i = 0; i < seqbuf.size(); ++i) seqbuf[i] = kNoiseFirst + int((i + std::size_t(phase)) % kNoiseCount);
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
}

}  // namespace

SequenceLayout DataSource::layout_of(std::int64_t L, std::uint64_t seed, std::int64_t step, std::int64_t index,
                                     std::int64_t window, bool held_out) const {
  SequenceLayout l{L, {}, L, index, 0};
  if (synthetic_) return l;
  Rng rng = sequence_rng(seed, step, index);
  if (packed()) {
    const Docs& docs = held_out ? held_documents_ : documents_;
    l.source = held_out ? window % std::int64_t(docs.size()) : rng.below(std::int64_t(docs.size()));
    packed_layout(docs, l);
  } else {
    l.source = held_out ? cut_ + window * (L + 1) % (held_out_bytes() - L) : rng.below(cut_ - L);
  }
  return l;
}

std::vector<SequenceLayout> DataSource::document_step(std::int64_t budget, std::uint64_t seed, std::int64_t step,
                                                      bool held_out) const {
  const Docs& docs = held_out ? held_documents_ : documents_;
  std::vector<SequenceLayout> out;
  if (docs.empty()) return out;
  Rng rng = sequence_rng(seed, step, -1);
  const std::size_t first = std::size_t(rng.below(std::int64_t(docs.size())));
  std::int64_t used = 0;
  for (std::size_t k = 0; k < docs.size(); ++k) {  // each document at most once a step
    const std::size_t d = (first + k) % docs.size();
    const std::int64_t len = docs[d].second - docs[d].first;
    if (used + len > budget) break;
    used += len;
    out.push_back({len, {}, len - 1, std::int64_t(out.size()), std::int64_t(d)});
  }
  return out;
}

std::vector<SequenceLayout> DataSource::step_layout(const StepShape& shape, std::uint64_t seed, std::int64_t step,
                                                    bool held_out) const {
  if (synthetic_ && held_out) held_out_synthetic(seed, step, held_out);
  if (shape.tokens_per_step > 0) return document_step(shape.tokens_per_step, seed, step, held_out);
  std::vector<std::int64_t> lengths = shape.lengths;
  if (lengths.empty()) lengths.assign(std::size_t(std::max<std::int64_t>(0, shape.batch)), shape.seq);
  const std::int64_t count = std::int64_t(lengths.size());
  std::vector<SequenceLayout> out;
  for (std::int64_t i = 0; i < count; ++i)
    out.push_back(layout_of(lengths[std::size_t(i)], seed, step, i, step * count + i, held_out));
  return out;
}

Batch DataSource::sequence(const SequenceLayout& l, std::uint64_t seed, std::int64_t step, bool held_out) const {
  if (synthetic_ && held_out) held_out_synthetic(seed, step, held_out);
  const std::int64_t S = l.length;
  Batch out{1,
            S,
            std::vector<int>(std::size_t(S)),
            std::vector<int>(std::size_t(S)),
            std::vector<std::uint8_t>(std::size_t(S), 0),
            l.cu_seqlens};
  std::vector<int> seqbuf(std::size_t(S + 1));
  std::vector<std::uint8_t> is_answer(std::size_t(S + 1), 0);
  if (synthetic_) {
    Rng rng = sequence_rng(seed, step, l.index);
    synthetic_tokens(rng, seqbuf, is_answer, kPairs, kQueries);
  } else if (whole_documents_) {
    const auto [begin, end] = (held_out ? held_documents_ : documents_)[std::size_t(l.source)];
    for (std::int64_t i = begin; i < end; ++i) seqbuf[std::size_t(i - begin)] = text_[std::size_t(i)];
    out.labels[std::size_t(S - 1)] = kNoLabel;
  } else if (packed()) {
    const Docs& docs = held_out ? held_documents_ : documents_;
    walk_documents(docs, std::size_t(l.source), S, [&](std::size_t d, std::int64_t start, std::int64_t count) {
      if (start > 0) out.labels[std::size_t(start - 1)] = kNoLabel;  // kept by the shift below
      for (std::int64_t i = 0; i < count; ++i) seqbuf[std::size_t(start + i)] = text_[std::size_t(docs[d].first + i)];
    });
  } else {
    for (std::int64_t i = 0; i <= S; ++i) seqbuf[std::size_t(i)] = text_[std::size_t(l.source + i)];
  }
  // Shift before sharding: input i predicts token i+1, so no label is lost at a boundary.
  for (std::int64_t i = 0; i < S; ++i) {
    out.tokens[std::size_t(i)] = seqbuf[std::size_t(i)];
    int& label = out.labels[std::size_t(i)];
    if (label != kNoLabel) label = seqbuf[std::size_t(i + 1)];
    out.scored[std::size_t(i)] = is_answer[std::size_t(i + 1)];
  }
  return out;
}

namespace {

// Sequences of one length stacked into a [batch, seq] Batch.
Batch stack(const std::vector<Batch>& seqs, std::int64_t S) {
  Batch out;
  out.batch = std::int64_t(seqs.size());
  out.seq = S;
  for (const Batch& b : seqs) {
    out.tokens.insert(out.tokens.end(), b.tokens.begin(), b.tokens.end());
    out.labels.insert(out.labels.end(), b.labels.begin(), b.labels.end());
    out.scored.insert(out.scored.end(), b.scored.begin(), b.scored.end());
    out.cu_seqlens = b.cu_seqlens;
  }
  return out;
}

}  // namespace

Batch DataSource::batch(std::int64_t B, std::int64_t S, std::uint64_t seed, std::int64_t step) const {
  std::vector<Batch> seqs;
  for (const SequenceLayout& l : step_layout({B, S}, seed, step, false)) seqs.push_back(sequence(l, seed, step, false));
  return stack(seqs, S);
}

Batch DataSource::held_out_batch(std::int64_t B, std::int64_t S, std::uint64_t seed, std::int64_t index) const {
  std::vector<Batch> seqs;
  for (const SequenceLayout& l : step_layout({B, S}, seed, index, true)) seqs.push_back(sequence(l, seed, index, true));
  return stack(seqs, S);
}

}  // namespace ulysses::train
