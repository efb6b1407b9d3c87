// Training data, generated deterministically from (seed, step) so every rank builds the same
// global batch and a resumed run sees exactly the batches it would have seen.
//
// The default is a synthetic long-range retrieval task that can only be solved by attending
// across the whole sequence: 8 (key, value) pair tokens are scattered at random positions,
// noise fills the rest, and the sequence ends with 8 queries "key? → value". The pairs land on
// every rank's shard, the queries at the end, so a correct answer proves attention spans
// shards. Accuracy is measured on the answers only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ulysses::train {

struct Batch {
  std::int64_t batch = 0, seq = 0;
  std::vector<int> tokens, labels;    // [batch, seq]; labels[i] = token i+1 of the sequence
  std::vector<std::uint8_t> scored;   // [batch, seq]: 1 where the label is a retrieval answer
};

class DataSource {
 public:
  static DataSource synthetic();
  // Byte-level text. Throws Error if the file cannot be read.
  static DataSource text_file(const std::string& path);

  // "" if sequences of `seq` tokens can be drawn, else why not (names the values).
  std::string error_for(std::int64_t seq) const;
  Batch batch(std::int64_t batch, std::int64_t seq, std::uint64_t seed, std::int64_t step) const;
  bool synthetic_task() const { return synthetic_; }
  std::string describe() const;

  static constexpr int kPairs = 8, kQueries = 8;

 private:
  bool synthetic_ = true;
  std::string path_;
  std::vector<std::uint8_t> text_;
};

}  // namespace ulysses::train
