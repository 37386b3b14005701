#include "engine/reference/loss.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "core/error.h"

namespace tessera::engine::reference {

CrossEntropyResult softmax_cross_entropy(const std::vector<float>& logits, const std::vector<int>& labels, int classes,
                                         const std::vector<float>& class_weights) {
  const auto n_count = static_cast<int>(labels.size());
  if (classes < 1 || logits.size() != static_cast<std::size_t>(n_count) * classes) {
    throw core::InternalError("reference cross-entropy: " + std::to_string(logits.size()) + " logits for " +
                              std::to_string(n_count) + " labels and " + std::to_string(classes) + " classes");
  }
  if (!class_weights.empty() && class_weights.size() != static_cast<std::size_t>(classes)) {
    throw core::InternalError("reference cross-entropy: " + std::to_string(class_weights.size()) +
                              " class weights for " + std::to_string(classes) + " classes");
  }
  CrossEntropyResult r;
  r.probabilities.resize(logits.size());
  r.diff_logits.resize(logits.size());
  std::vector<double> log_p(logits.size());
  double total_weight = 0.0, weighted_nll = 0.0;
  for (int n = 0; n < n_count; ++n) {
    const int t = labels[n];
    if (t < 0 || t >= classes) {
      throw core::InternalError("reference cross-entropy: label " + std::to_string(t) + " outside [0, " +
                                std::to_string(classes) + ")");
    }
    const float* z = &logits[static_cast<std::size_t>(n) * classes];
    const double z_max = *std::max_element(z, z + classes);
    double sum = 0.0;
    for (int k = 0; k < classes; ++k) sum += std::exp(z[k] - z_max);
    for (int k = 0; k < classes; ++k) {
      log_p[n * classes + k] = z[k] - z_max - std::log(sum);
      r.probabilities[n * classes + k] = static_cast<float>(std::exp(log_p[n * classes + k]));
    }
    const double w = class_weights.empty() ? 1.0 : class_weights[t];
    total_weight += w;
    weighted_nll -= w * log_p[n * classes + t];
  }
  r.loss = total_weight > 0.0 ? weighted_nll / total_weight : 0.0;
  for (int n = 0; n < n_count; ++n) {
    const int t = labels[n];
    const double w = class_weights.empty() ? 1.0 : class_weights[t];
    for (int k = 0; k < classes; ++k) {
      const double g =
          total_weight > 0.0 ? w * (std::exp(log_p[n * classes + k]) - (k == t ? 1.0 : 0.0)) / total_weight : 0.0;
      r.diff_logits[n * classes + k] = static_cast<float>(g);
    }
  }
  return r;
}

}  // namespace tessera::engine::reference
