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

// A decision rule "positive when the score is at or above `threshold`" applied to labelled scores: its confusion
// counts and the rates people report. A rate whose denominator is 0 is NaN (sensitivity without positives,
// precision without positive calls, F1 when both are undefined).
struct OperatingPoint {
  double threshold = 0.5;
  std::int64_t tp = 0, fp = 0, tn = 0, fn = 0;

  double sensitivity() const;        // recall, true-positive rate: tp / (tp + fn)
  double specificity() const;        // true-negative rate: tn / (tn + fp)
  double precision() const;          // positive predictive value: tp / (tp + fp)
  double f1() const;                 // 2 tp / (2 tp + fp + fn)
  double balanced_accuracy() const;  // (sensitivity + specificity) / 2
  double accuracy() const;           // (tp + tn) / all
};

// The rule at `threshold` on these scores. Sizes must match (InternalError).
OperatingPoint operating_point(std::span<const float> scores, std::span<const std::uint8_t> labels, double threshold);

// The threshold with the highest balanced accuracy on these scores (Youden's J: sensitivity + specificity − 1, the
// ROC point farthest above the chance line), for use on other scores: the midpoint between the lowest score called
// positive and the highest score below it, so that a score equal to neither falls on the side the choice implies.
// Among equal balanced accuracies the highest threshold wins (fewer positive calls). NaN when a class is absent;
// infinity (nothing called positive) when no threshold beats chance.
double balanced_threshold(std::span<const float> scores, std::span<const std::uint8_t> labels);

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
