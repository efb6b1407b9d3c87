// Shared by the training tests (test_train.cpp, test_train_dp.cpp): the small model they train.
#pragma once

#include <cmath>
#include <vector>

#include "train/trainer.hpp"
#include "ulysses/cp/cp_config.hpp"

namespace train_test {

// A 2-layer GPT of width 32 (4 heads, 2 KV heads of 8, vocabulary 256) on batches of 2
// sequences of 96 tokens: 20 steps, 5 of them warm-up, at lr 1e-2, seed 3.
inline ulysses::train::TrainConfig small_config(const ulysses::CpConfig& cp) {
  ulysses::train::TrainConfig t;
  t.model = ulysses::train::GptConfig{256, 2, 32, 4, 2, 8, 64};
  t.cp = cp;
  t.batch = 2;
  t.seq = 96;
  t.steps = 20;
  t.warmup = 5;
  t.lr = 1e-2f;
  t.seed = 3;
  return t;
}

// ‖a − ref‖ / ‖ref‖ over the elements, in double.
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += std::pow(double(a[i]) - ref[i], 2);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace train_test
