#include "core/metrics.h"

#include <algorithm>
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

}  // namespace tessera::core
