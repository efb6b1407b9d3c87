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
  // Byte-level text. Throws Error if the file cannot be read.
  static DataSource text_file(const std::string& path);
  // Byte-level documents packed into each sequence: the file split on `separator` (empty
  // documents dropped), consecutive documents from a random one on, cut at the sequence's end.
  // The batch carries their cu_seqlens; no label crosses a document boundary.
  static DataSource packed_documents(const std::string& path, const std::string& separator);
  bool packed() const { return !documents_.empty(); }

  // "" if sequences of `seq` tokens can be drawn, else why not (names the values).
  std::string error_for(std::int64_t seq) const;
  Batch batch(std::int64_t batch, std::int64_t seq, std::uint64_t seed, std::int64_t step) const;
  bool synthetic_task() const { return synthetic_; }
  std::string describe() const;

  static constexpr int kPairs = 1, kQueries = 16;

 private:
  bool synthetic_ = true;
  std::string path_;
  std::vector<std::uint8_t> text_;
  std::vector<std::pair<std::int64_t, std::int64_t>> documents_;  // [begin, end) in text_
};

}  // namespace ulysses::train
