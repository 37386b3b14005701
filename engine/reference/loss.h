// Naive reference softmax cross-entropy on plain arrays: the test oracle for engine/layers/loss.h.
//
//   logits z N×K (row-major), labels t[n] ∈ [0, K), optional class weights w K (empty = all ones):
//     p[n, k]   = exp(z[n, k]) / Σ_j exp(z[n, j])
//     loss      = − Σ_n w[t_n] · log p[n, t_n]  /  Σ_n w[t_n]          (PyTorch's weighted "mean")
//     diff_z    = w[t_n] · (p[n, k] − [k = t_n])  /  Σ_n w[t_n]
// When Σ_n w[t_n] = 0 (every target weighted zero) the batch carries no signal: loss 0 and zero gradient.
#pragma once

#include <vector>

namespace tessera::engine::reference {

struct CrossEntropyResult {
  double loss = 0.0;
  std::vector<float> probabilities;  // N×K
  std::vector<float> diff_logits;    // N×K, gradient of `loss`
};

CrossEntropyResult softmax_cross_entropy(const std::vector<float>& logits, const std::vector<int>& labels, int classes,
                                         const std::vector<float>& class_weights = {});

}  // namespace tessera::engine::reference
