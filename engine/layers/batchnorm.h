// BatchNorm2d on oneDNN, as torch.nn.BatchNorm2d (affine, track_running_stats), with an optional fused ReLU.
//
//   src, dst N×C×H×W (dst in src's layout);  weight (gamma), bias (beta), running_mean, running_var [C]
//   train: mean, var = batch mean and biased variance over N·H·W (M values) per channel
//          dst = weight·(src − mean)/sqrt(var + eps) + bias                 (then max(·, 0) with relu)
//          running_mean ← (1 − momentum)·running_mean + momentum·mean
//          running_var  ← (1 − momentum)·running_var  + momentum·var·M/(M − 1)   (unbiased, as PyTorch)
//   eval:  the same with mean, var := running_mean, running_var; nothing is updated
//   backward (train): with x̂ = (src − mean)/sqrt(var + eps), dy = diff_dst (masked by dst > 0 with relu),
//          grad(bias) += Σ dy,  grad(weight) += Σ dy·x̂,
//          diff_src = weight/sqrt(var + eps) · (dy − Σdy/M − x̂·Σ(dy·x̂)/M)
//   backward (eval, frozen statistics): diff_src = weight/sqrt(var + eps) · dy, same parameter gradients.
// Parameters: `weight` (norm_weight, starts at 1), `bias` (norm_bias, starts at 0); buffers `running_mean`
// (starts at 0), `running_var` (starts at 1). PyTorch's `num_batches_tracked` is not kept (only used when
// momentum is None).
//
// oneDNN: batch_normalization in the input's own layout (blocked nChw8c stays blocked), scale and shift as
// separate [C] arguments taken straight from the Params; the fused ReLU (fuse_norm_relu) keeps a bit mask
// workspace for backward. Eval runs with use_global_stats on the running buffers. Primitives for each mode are
// created on first use after a setup and reused.
//
// After fold_batchnorm() (engine/layers/fold.h) the module is folded: it passes its input through untouched
// (its scale and shift now live in the convolution) and refuses training.
#pragma once

#include <string>
#include <vector>

#include "engine/module.h"

namespace tessera::engine {

struct BatchNorm2dOptions {
  float eps = 1e-5f;
  float momentum = 0.1f;
  bool relu = false;  // fuse a ReLU after the normalization
};

class BatchNorm2d : public Module {
 public:
  BatchNorm2d(std::string name, int channels, const BatchNorm2dOptions& options = {});

  std::string type() const override { return "BatchNorm2d"; }
  void collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) override;

  int channels() const { return channels_; }
  const BatchNorm2dOptions& options() const { return options_; }
  // The weight of the next training batch's statistics in the running ones (1/k for the k-th batch gives their
  // plain mean, as PyTorch's momentum=None; engine/batchnorm_recalibration.h). Fails outside [0, 1].
  void set_momentum(float momentum);
  Param& weight() { return weight_; }
  Param& bias() { return bias_; }
  Buffer& running_mean() { return running_mean_; }
  Buffer& running_var() { return running_var_; }
  const Param& weight() const { return weight_; }
  const Param& bias() const { return bias_; }
  const Buffer& running_mean() const { return running_mean_; }
  const Buffer& running_var() const { return running_var_; }

  // Marks the module as folded into the preceding convolution (fold_batchnorm does this): forward becomes the
  // identity, backward and train mode are refused.
  void set_folded();
  bool folded() const { return folded_; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  // Primitives for one mode (train: batch statistics; eval: global statistics).
  struct Primitives {
    bool built = false;
    dnnl::batch_normalization_forward::primitive_desc fwd_pd;
    dnnl::batch_normalization_forward fwd;
    bool backward_built = false;
    dnnl::batch_normalization_backward::primitive_desc bwd_pd;
    dnnl::batch_normalization_backward bwd;
  };
  Primitives& primitives(Mode mode);
  void build_backward(Primitives& p, Mode mode);
  dnnl::normalization_flags flags(Mode mode) const;
  void update_running_stats();

  int channels_;
  BatchNorm2dOptions options_;
  Param weight_;
  Param bias_;
  Buffer running_mean_;
  Buffer running_var_;
  bool folded_ = false;

  Primitives train_;
  Primitives eval_;
  dnnl::memory::desc src_md_;        // input desc of the current setup
  Mode forward_mode_ = Mode::train;  // mode of the last forward, which backward must match
  Tensor src_saved_;
  Tensor dst_;
  Tensor mean_;       // batch statistics of the last training forward, [C]
  Tensor variance_;   // biased
  Tensor workspace_;  // ReLU mask of the last forward (fused relu only)
  Tensor diff_src_;
  std::vector<float> diff_scale_;
  std::vector<float> diff_shift_;
  Reorderer diff_dst_reorder_;
};

}  // namespace tessera::engine
