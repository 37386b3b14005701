// Naive reference batch normalization on plain NCHW float arrays: the test oracle for
// engine/layers/batchnorm.h. Plain loops with double accumulators, no threading.
//
// Shapes: src, dst N×C×H×W; gamma (weight), beta (bias), mean, var, running_mean, running_var [C]; M = N·H·W.
// Training (batch statistics):
//   mean[c] = Σ_{n,h,w} x / M,   var[c] = Σ (x − mean)² / M           (biased, used to normalize)
//   x̂ = (x − mean[c]) / sqrt(var[c] + eps),   dst = gamma[c]·x̂ + beta[c]
//   running_mean ← (1 − momentum)·running_mean + momentum·mean
//   running_var  ← (1 − momentum)·running_var  + momentum·var·M/(M − 1)   (unbiased, as PyTorch does)
// Eval: the same with mean, var := running_mean, running_var.
// Backward, training (mean and var depend on x):
//   diff_beta[c]  = Σ dy,   diff_gamma[c] = Σ dy·x̂
//   diff_src      = gamma[c] / sqrt(var[c] + eps) · (dy − diff_beta[c]/M − x̂·diff_gamma[c]/M)
// Backward, eval (statistics are constants):
//   diff_src      = gamma[c] / sqrt(var[c] + eps) · dy,   diff_gamma and diff_beta as above.
#pragma once

#include <vector>

namespace tessera::engine::reference {

struct NormShape {
  int n = 1, c = 1, h = 1, w = 1;
  int size() const { return n * c * h * w; }
};

struct NormStats {
  std::vector<float> mean;  // [C]
  std::vector<float> var;   // [C], biased
};

// Batch statistics of src.
NormStats batchnorm_statistics(const std::vector<float>& src, const NormShape& shape);
// dst = gamma·(src − mean)/sqrt(var + eps) + beta with the given statistics (batch or running).
std::vector<float> batchnorm_forward(const std::vector<float>& src, const NormStats& stats,
                                     const std::vector<float>& gamma, const std::vector<float>& beta, float eps,
                                     const NormShape& shape);
// Running averages update after a training step on a batch with statistics `batch`.
void batchnorm_update_running(const NormStats& batch, float momentum, const NormShape& shape,
                              std::vector<float>& running_mean, std::vector<float>& running_var);

struct NormGradients {
  std::vector<float> diff_src;    // N×C×H×W
  std::vector<float> diff_gamma;  // [C]
  std::vector<float> diff_beta;   // [C]
};

// `training` true: statistics are the batch's own (and depend on src); false: constants (eval).
NormGradients batchnorm_backward(const std::vector<float>& src, const std::vector<float>& diff_dst,
                                 const NormStats& stats, const std::vector<float>& gamma, float eps, bool training,
                                 const NormShape& shape);

}  // namespace tessera::engine::reference
