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
#include <string>
#include <vector>

namespace ulysses::train {

struct Batch {
  std::int64_t batch = 0, seq = 0;
  std::vector<int> tokens, labels;    // [batch, seq]; labels[i] = token i+1 of the sequence, or
                                      // kNoLabel where i ends a packed document
  std::vector<std::uint8_t> scored;   // [batch, seq]: 1 where the label is a retrieval answer
  std::vector<std::int64_t> cu_seqlens = {};  // packed documents (batch 1); empty: one document
  std::int64_t targets() const;       // labels that count in the loss
};

constexpr int kNoLabel = -1;  // a token whose next token belongs to another document

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
  bool packed() const { return !documents_.empty(); }

  // "" if sequences of `seq` tokens can be drawn (for training and, when text is held out,
  // for evaluation), else why not (names the values).
  std::string error_for(std::int64_t seq) const;
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
  Batch make(std::int64_t batch, std::int64_t seq, std::uint64_t seed, std::int64_t step, bool held_out) const;

  std::string path_;
  double holdout_ = 0;
  std::vector<std::uint8_t> text_;
  std::int64_t cut_ = 0;  // training reads text_[0, cut_), evaluation text_[cut_, end)
  std::vector<std::pair<std::int64_t, std::int64_t>> documents_, held_documents_;  // [begin, end) in text_
};

}  // namespace ulysses::train
