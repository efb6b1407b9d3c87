// Training data, generated deterministically from (seed, step) so every rank builds the same
// global batch and a resumed run sees exactly the batches it would have seen.
//
// The default is a synthetic long-range retrieval task that can only be solved by attending
// across the whole sequence: a "needle" token carrying a value (one of 10) is hidden at a
// random position, a predictable cycle of letters fills the rest, and the sequence ends with
// queries whose answer is the needle's value. The needle lands on any rank's shard and the
// queries on the last one, so correct answers prove that attention spans shards (a model
// that only saw its own shard would score about chance, 10%). Accuracy counts answers only.
// kPairs > 1 hides several (key, value) needles and asks for keys: a harder task.
//
// Text (--data) can hold out its tail (--holdout, a fraction of the bytes): batch() never
// draws from it and held_out_batch() draws only from it, so the held-out loss measures
// generalization to text the model never trained on.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ulysses::train {

struct Batch {
  std::int64_t batch = 0, seq = 0;
  std::vector<int> tokens, labels;            // [batch, seq]; labels[i] = token i+1 of the sequence, or
                                              // kNoLabel where i ends a packed document
  std::vector<std::uint8_t> scored;           // [batch, seq]: 1 where the label is a retrieval answer
  std::vector<std::int64_t> cu_seqlens = {};  // packed documents (batch 1); empty: one document
  std::int64_t targets() const;               // labels that count in the loss
};

constexpr int kNoLabel = -1;  // a token whose next token belongs to another document

// One sequence of a step as every rank knows it before any rank loads its tokens: its length
// (the balancer's input), its documents (the attention's mask) and its labels' count (the
// loss's normalisation), so only the rank that loads a sequence reads its text, and the
// all-to-all that deals it out knows every shard's size on both sides.
struct SequenceLayout {
  std::int64_t length = 0;
  std::vector<std::int64_t> cu_seqlens = {};  // packed documents; empty: one document
  std::int64_t targets = 0;                   // labels that count in the loss
  std::int64_t index = 0;                     // its place in the step (what its tokens are drawn from)
  std::int64_t source = 0;                    // where its text starts: a byte offset or a document
};

// What every step holds: `batch` sequences of `seq` tokens; or, with `lengths`, sequences of
// those lengths; or, with `tokens_per_step`, whole documents (DataSource::documents) up to that
// many tokens. Sequences keep their own lengths: nothing is padded.
struct StepShape {
  std::int64_t batch = 0, seq = 0;
  std::vector<std::int64_t> lengths = {};
  std::int64_t tokens_per_step = 0;
};

class DataSource {
 public:
  static DataSource synthetic();
  // Byte-level text, its last `holdout` fraction held out. Throws Error if the file cannot be
  // read or holdout is not in [0, 1).
  static DataSource text_file(const std::string& path, double holdout = 0);
  // Byte-level documents packed into each sequence: the file split on `separator` (empty
  // documents dropped), consecutive documents from a random one on, cut at the sequence's end.
  // The batch carries their cu_seqlens; no label crosses a document boundary. The documents
  // that start in the last `holdout` fraction of the file are held out whole.
  static DataSource packed_documents(const std::string& path, const std::string& separator, double holdout = 0);
  // Byte-level documents, each one sequence of its own length (split as packed_documents
  // does): steps take consecutive documents from a random one on while they fit the token
  // budget (StepShape::tokens_per_step). A document's last token has no label.
  static DataSource documents(const std::string& path, const std::string& separator, double holdout = 0);
  bool packed() const { return !documents_.empty() && !whole_documents_; }
  bool whole_documents() const { return whole_documents_; }

  // "" if sequences of `seq` tokens can be drawn (for training and, when text is held out,
  // for evaluation), else why not (names the values).
  std::string error_for(std::int64_t seq) const;
  // The same for every sequence of `shape` (its lengths, or every document against the budget).
  std::string error_for(const StepShape& shape) const;
  // Whole documents (documents()): "" when `check(length)` is "" for every document, held-out
  // ones too, else its error prefixed with the first failing document, its line and length,
  // so a document that could never be trained on is named before step 1, not when drawn.
  std::string first_document_error(const std::function<std::string(std::int64_t)>& check) const;
  // Not collective, cheap (no text is read): the sequences of step `step` (held out: of
  // held-out batch `step`), the same on every rank.
  std::vector<SequenceLayout> step_layout(const StepShape& shape, std::uint64_t seed, std::int64_t step,
                                          bool held_out) const;
  // The tokens of one sequence of step_layout(…, seed, step, held_out): a Batch of 1.
  Batch sequence(const SequenceLayout& layout, std::uint64_t seed, std::int64_t step, bool held_out) const;
  Batch batch(std::int64_t batch, std::int64_t seq, std::uint64_t seed, std::int64_t step) const;
  // Held-out batch number `index`: sequences training never draws. Text: windows laid one after
  // another through the held-out tail (the same for every seed); synthetic: other seeds.
  Batch held_out_batch(std::int64_t batch, std::int64_t seq, std::uint64_t seed, std::int64_t index) const;
  // Bytes of text held out (0: none, or synthetic data).
  std::int64_t held_out_bytes() const { return std::int64_t(text_.size()) - cut_; }
  bool synthetic_task() const { return synthetic_; }
  std::string describe() const;

  static constexpr int kPairs = 1, kQueries = 16;

 private:
  bool synthetic_ = true;
  bool whole_documents_ = false;
  SequenceLayout layout_of(std::int64_t length, std::uint64_t seed, std::int64_t step, std::int64_t index,
                           std::int64_t window, bool held_out) const;
  std::vector<SequenceLayout> document_step(std::int64_t budget, std::uint64_t seed, std::int64_t step,
                                            bool held_out) const;

  std::string path_;
  double holdout_ = 0;
  std::vector<std::uint8_t> text_;
  std::int64_t cut_ = 0;  // training reads text_[0, cut_), evaluation text_[cut_, end)
  std::vector<std::pair<std::int64_t, std::int64_t>> documents_, held_documents_;  // [begin, end) in text_
};

}  // namespace ulysses::train
