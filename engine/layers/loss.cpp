#include "engine/layers/loss.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"
#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;

SoftmaxCrossEntropy::SoftmaxCrossEntropy(std::vector<float> class_weights) : class_weights_(std::move(class_weights)) {
  for (std::size_t k = 0; k < class_weights_.size(); ++k) {
    if (!(class_weights_[k] >= 0.0f) || !std::isfinite(class_weights_[k])) {
      throw core::InternalError("SoftmaxCrossEntropy: class weight " + std::to_string(k) + " is " +
                                std::to_string(class_weights_[k]) + "; weights must be finite and non-negative");
    }
  }
}

void SoftmaxCrossEntropy::prepare(const Tensor& logits) {
  const dims_t d = logits.dims();
  if (d.size() != 2 || d[1] < 1) throw core::InternalError("SoftmaxCrossEntropy: logits must be N×K");
  if (!class_weights_.empty() && d[1] != static_cast<memory::dim>(class_weights_.size())) {
    throw core::InternalError("SoftmaxCrossEntropy: " + std::to_string(d[1]) + " logits per sample but " +
                              std::to_string(class_weights_.size()) + " class weights");
  }
  if (d != dims_) {
    const auto& engine = Context::get().engine();
    const memory::desc plain = plain_desc(d);
    const dnnl::softmax_v2_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_log, plain,
                                              plain, 1);
    log_softmax_pd_ = dnnl::softmax_v2_forward::primitive_desc(desc, Context::default_attr(), engine);
    log_softmax_ = dnnl::softmax_v2_forward(log_softmax_pd_);
    log_p_ = Tensor(plain);
    diff_ = Tensor(plain);
    dims_ = d;
  }
  forwarded_ = false;
  const Tensor& z = logits_reorder_(logits, log_p_.desc());
  Context::get().execute(log_softmax_, log_softmax_pd_, {{DNNL_ARG_SRC, z.memory()}, {DNNL_ARG_DST, log_p_.memory()}});
  probabilities_.resize(static_cast<std::size_t>(d[0] * d[1]));
  const float* log_p = log_p_.data();
  const auto count = static_cast<std::int64_t>(probabilities_.size());
  // log-softmax can come out a rounding error above 0 for the winning class, and exp of that is 1.0000001:
  // a probability outside [0, 1] that every reader of the outputs rightly refuses. exp is never negative;
  // a NaN (from a NaN logit) stays NaN rather than passing for a certain 1.
  for (std::int64_t i = 0; i < count; ++i) {
    const float p = std::exp(log_p[i]);
    probabilities_[i] = p > 1.0f ? 1.0f : p;
  }
}

double SoftmaxCrossEntropy::forward(const Tensor& logits, std::span<const int> labels, double gradient_scale) {
  if (logits.empty() || logits.dims().size() != 2 || logits.dims()[0] != static_cast<memory::dim>(labels.size())) {
    throw core::InternalError("SoftmaxCrossEntropy: logits for " + std::to_string(labels.size()) + " labels must be " +
                              std::to_string(labels.size()) + "×K");
  }
  prepare(logits);
  const auto n_count = static_cast<std::int64_t>(dims_[0]), classes = static_cast<std::int64_t>(dims_[1]);
  const float* log_p = log_p_.data();
  double total_weight = 0.0, weighted_nll = 0.0;
  for (std::int64_t n = 0; n < n_count; ++n) {
    const int t = labels[n];
    if (t < 0 || t >= classes) {
      throw core::InternalError("SoftmaxCrossEntropy: label " + std::to_string(t) + " of sample " + std::to_string(n) +
                                " is outside [0, " + std::to_string(classes) + ")");
    }
    const double w = class_weights_.empty() ? 1.0 : class_weights_[t];
    total_weight += w;
    weighted_nll -= w * log_p[n * classes + t];
  }
  // Zero total weight: no target counts, so neither loss nor gradient (instead of 0/0).
  const double inverse_total = total_weight > 0.0 ? 1.0 / total_weight : 0.0;
  float* diff = diff_.data();
  for (std::int64_t n = 0; n < n_count; ++n) {
    const int t = labels[n];
    const double w = (class_weights_.empty() ? 1.0 : class_weights_[t]) * inverse_total * gradient_scale;
    for (std::int64_t k = 0; k < classes; ++k) {
      const double target = k == t ? 1.0 : 0.0;
      diff[n * classes + k] = static_cast<float>(w * (probabilities_[n * classes + k] - target));
    }
  }
  forwarded_ = true;
  return weighted_nll * inverse_total;
}

const Tensor& SoftmaxCrossEntropy::backward() const {
  if (!forwarded_) throw core::InternalError("SoftmaxCrossEntropy: backward without a forward");
  return diff_;
}

const std::vector<float>& SoftmaxCrossEntropy::predict(const Tensor& logits) {
  if (logits.empty()) throw core::InternalError("SoftmaxCrossEntropy: predict of an empty tensor");
  prepare(logits);
  return probabilities_;
}

}  // namespace tessera::engine
