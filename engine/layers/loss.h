// Softmax cross-entropy on N×K logits with integer labels (torch.nn.CrossEntropyLoss, reduction "mean",
// optional per-class weights), and softmax probabilities for prediction.
//
//   p[n, k] = exp(z[n, k]) / Σ_j exp(z[n, j])                    z: logits N×K, t[n] ∈ [0, K), w: weights K
//   loss    = − Σ_n w[t_n] · log p[n, t_n]  /  Σ_n w[t_n]       (w = 1 without class weights: the plain mean)
//   dL/dz[n, k] = w[t_n] · (p[n, k] − [k = t_n])  /  Σ_n w[t_n]
// When every target in the batch has weight 0 the batch carries no signal: loss 0, zero gradient (PyTorch
// would give NaN).
//
// log p comes from oneDNN's log-softmax (stable for large logits, no log of an underflowed p); the loss and the
// gradient are one pass over N×K. Logits in any 2-D layout are reordered to plain nc first (N×K is tiny).
#pragma once

#include <span>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/tensor.h"

namespace tessera::engine {

class SoftmaxCrossEntropy {
 public:
  // `class_weights`: empty (all classes weigh 1) or one non-negative weight per class.
  explicit SoftmaxCrossEntropy(std::vector<float> class_weights = {});
  SoftmaxCrossEntropy(const SoftmaxCrossEntropy&) = delete;
  SoftmaxCrossEntropy& operator=(const SoftmaxCrossEntropy&) = delete;

  const std::vector<float>& class_weights() const { return class_weights_; }

  // The loss of a batch; keeps the probabilities and the gradient. Throws InternalError when the logits are
  // not N×K with N = labels.size(), a label is outside [0, K), or K does not match the class weights.
  // `gradient_scale` multiplies the gradient only (not the loss): 1/k for one of k accumulated micro-batches.
  double forward(const Tensor& logits, std::span<const int> labels, double gradient_scale = 1.0);
  // dL/d(logits) of the last forward, N×K plain (nc). It does not depend on the loss's own upstream gradient:
  // the loss is the end of the graph.
  const Tensor& backward() const;
  // Softmax probabilities of the last forward (or predict), N×K row-major.
  const std::vector<float>& probabilities() const { return probabilities_; }

  // Softmax probabilities without labels or loss (inference), N×K row-major.
  const std::vector<float>& predict(const Tensor& logits);

 private:
  // Builds the log-softmax primitive when the dims change, then fills log_p_ and probabilities_.
  void prepare(const Tensor& logits);

  std::vector<float> class_weights_;
  dims_t dims_;
  dnnl::softmax_v2_forward::primitive_desc log_softmax_pd_;
  dnnl::softmax_v2_forward log_softmax_;
  Reorderer logits_reorder_;
  Tensor log_p_;  // N×K plain
  Tensor diff_;   // N×K plain
  std::vector<float> probabilities_;
  bool forwarded_ = false;
};

}  // namespace tessera::engine
