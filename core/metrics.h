// Classification metrics for validation and prediction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tessera::core {

// Area under the ROC curve of scores for binary labels (1 positive, 0 negative): the probability that a random
// positive scores above a random negative, ties counting one half (the Mann–Whitney statistic; what
// sklearn.metrics.roc_auc_score gives). NaN when one class is absent. Sizes must match (InternalError).
double roc_auc(std::span<const float> scores, std::span<const std::uint8_t> labels);

// Running sums of a validation or prediction pass: loss, accuracy and the scores for the AUC.
struct BinaryEvaluation {
  double loss_sum = 0.0;  // sum over tiles of the per-tile loss
  std::int64_t count = 0;
  std::int64_t correct = 0;   // argmax == label
  std::vector<float> scores;  // P(tumour) per tile
  std::vector<std::uint8_t> labels;

  double loss() const { return count > 0 ? loss_sum / static_cast<double>(count) : 0.0; }
  double accuracy() const { return count > 0 ? static_cast<double>(correct) / static_cast<double>(count) : 0.0; }
  double auc() const { return roc_auc(scores, labels); }
};

}  // namespace tessera::core
