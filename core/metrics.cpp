#include "core/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "core/error.h"

namespace tessera::core {

double roc_auc(std::span<const float> scores, std::span<const std::uint8_t> labels) {
  if (scores.size() != labels.size()) {
    throw core::InternalError("roc_auc: " + std::to_string(scores.size()) + " scores for " +
                              std::to_string(labels.size()) + " labels");
  }
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
  // Sum of the (tie-averaged, 1-based) ranks of the positives.
  double positive_rank_sum = 0.0;
  std::int64_t positives = 0;
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2.0;
    for (std::size_t k = i; k < j; ++k) {
      if (labels[order[k]] != 0) {
        positive_rank_sum += mean_rank;
        ++positives;
      }
    }
    i = j;
  }
  const auto negatives = static_cast<std::int64_t>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  const double p = static_cast<double>(positives);
  return (positive_rank_sum - p * (p + 1.0) / 2.0) / (p * static_cast<double>(negatives));
}

namespace {

double ratio(std::int64_t numerator, std::int64_t denominator) {
  return denominator > 0 ? static_cast<double>(numerator) / static_cast<double>(denominator)
                         : std::numeric_limits<double>::quiet_NaN();
}

void check_sizes(const char* what, std::size_t scores, std::size_t labels) {
  if (scores != labels) {
    throw core::InternalError(std::string(what) + ": " + std::to_string(scores) + " scores for " +
                              std::to_string(labels) + " labels");
  }
}

}  // namespace

double OperatingPoint::sensitivity() const { return ratio(tp, tp + fn); }
double OperatingPoint::specificity() const { return ratio(tn, tn + fp); }
double OperatingPoint::precision() const { return ratio(tp, tp + fp); }
double OperatingPoint::f1() const { return ratio(2 * tp, 2 * tp + fp + fn); }
double OperatingPoint::balanced_accuracy() const { return (sensitivity() + specificity()) / 2.0; }
double OperatingPoint::accuracy() const { return ratio(tp + tn, tp + tn + fp + fn); }

OperatingPoint operating_point(std::span<const float> scores, std::span<const std::uint8_t> labels, double threshold) {
  check_sizes("operating_point", scores.size(), labels.size());
  OperatingPoint point;
  point.threshold = threshold;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const bool called = static_cast<double>(scores[i]) >= threshold;
    if (labels[i] != 0) {
      (called ? point.tp : point.fn) += 1;
    } else {
      (called ? point.fp : point.tn) += 1;
    }
  }
  return point;
}

double balanced_threshold(std::span<const float> scores, std::span<const std::uint8_t> labels) {
  check_sizes("balanced_threshold", scores.size(), labels.size());
  const auto positives = std::count_if(labels.begin(), labels.end(), [](std::uint8_t l) { return l != 0; });
  const auto negatives = static_cast<std::int64_t>(labels.size()) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return scores[a] > scores[b]; });
  // Walk the thresholds from above every score down: at each distinct score s, the rule "≥ s" calls every score
  // seen so far positive. J = tp/P − fp/N is compared exactly as tp·N − fp·P.
  std::int64_t tp = 0, fp = 0;
  std::int64_t best = 0;  // J·P·N of calling nothing positive
  double lowest_called = std::numeric_limits<double>::infinity();
  std::size_t best_end = 0;  // scores [0, best_end) of `order` are called positive
  for (std::size_t i = 0; i < order.size();) {
    const float score = scores[order[i]];
    for (; i < order.size() && scores[order[i]] == score; ++i) (labels[order[i]] != 0 ? tp : fp) += 1;
    const std::int64_t j = tp * negatives - fp * static_cast<std::int64_t>(positives);
    if (j > best) {
      best = j;
      lowest_called = score;
      best_end = i;
    }
  }
  if (best_end == 0) return lowest_called;  // no rule beats calling nothing: threshold above every score
  if (best_end == order.size()) return lowest_called;
  const double below = scores[order[best_end]];
  return below + (lowest_called - below) / 2.0;
}

}  // namespace tessera::core
