// Conv2d: 2-D convolution on oneDNN, with optional bias and optional fused ReLU, as torch.nn.Conv2d
// (groups = 1, square kernel, symmetric zero padding).
//
//   src N×C×H×W  →  dst N×O×OH×OW,   OH = floor((H + 2·padding − dilation·(kernel − 1) − 1) / stride) + 1
//   dst[n,o,y,x] = bias[o] + Σ_{c,i,j} weight[o,c,i,j] · src[n, c, y·stride − padding + i·dilation,
//                                                               x·stride − padding + j·dilation]
//   with relu: dst = max(that, 0)
// Parameters (PyTorch names under the module's name): `weight` O×C×kernel×kernel (conv_weight), `bias` [O]
// (bias, when enabled). Backward: diff_src = convᵀ(diff_dst), grad(weight) += Σ diff_dst ⊗ src,
// grad(bias) += Σ_{n,y,x} diff_dst; with relu, diff_dst is first masked by dst > 0 (ReLU backward from dst).
//
// oneDNN: src, weights and dst are `format_tag::any`, so the convolution picks its fastest layouts (blocked
// nChw8c / nChw16c and matching blocked weights on AVX2 / AVX-512); an input in another layout is reordered on
// the way in, and the output stays in the chosen layout for the next layer. The master weights stay OIHW in the
// Param (the optimizer and checkpoints see only that) and are reordered into the primitive's layout on each
// forward; weight gradients are reordered back and added to Param::grad in the same pass. The forward
// primitive is created in setup; the backward ones on the first backward after a setup. The ReLU is a post-op
// of the forward convolution and, in backward, an eltwise_relu_use_dst_for_bwd step on the module's own dst.
//
// Reduced precision (engine/precision.h): set_compute_type(bf16) makes src, weights and dst bfloat16 (the bias
// stays float32; oneDNN accumulates in float32). An fp32 input is converted on the way in by the same src reorder.
// For inference (Weights::fixed) the bf16 weights are made once per setup from the float32 Param and kept; for
// training (Weights::trained) on every forward, as the f32 ones are reordered. bf16 backward: diff_dst and
// diff_src bfloat16, the weight and bias gradients float32 (added to Param::grad as in f32); on a small output
// (kSmallOutput), and for a 1×1 kernel with a stride, backward weights runs oneDNN's f32 kernel on src and
// diff_dst converted to float32.
//
// int8 (inference only, engine/precision.h): set_int8 makes src u8 (s8 where the calibrated input can be
// negative) with one scale, the weights s8 with one scale per output channel (max |w| of the channel / 127), and
// dst u8 after a fused ReLU, else s8, with the calibrated output scale; oneDNN accumulates in s32 and applies
// src scale × weight scale[o] / dst scale per output channel (set_output_scales, mask 1 << 1). The bias stays
// float32 in the accumulator's units (bias[o] / (src scale × weight scale[o])), as oneDNN 2.x adds it before
// the output scale. An input in another type or scale is quantized (or requantized) by the src reorder.
// observe() records the float32 src and dst ranges of each forward (calibration, in fp32).
#pragma once

#include <string>
#include <vector>

#include "engine/module.h"

namespace tessera::engine {

struct Conv2dOptions {
  int in = 0;   // input channels C
  int out = 0;  // output channels O
  int kernel = 1;
  int stride = 1;
  int padding = 0;
  int dilation = 1;   // PyTorch's convention: 1 = adjacent taps
  bool bias = true;   // PyTorch's default; torchvision's ResNets use false (a BatchNorm follows)
  bool relu = false;  // fuse a ReLU after the convolution
};

class Conv2d : public Module {
 public:
  // Parameters start at zero; the model initialises them (or loads a checkpoint).
  Conv2d(std::string name, const Conv2dOptions& options);

  std::string type() const override { return "Conv2d"; }
  void collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) override;

  const Conv2dOptions& options() const { return options_; }
  Param& weight() { return weight_; }
  const Param& weight() const { return weight_; }
  // nullptr without bias.
  Param* bias() { return options_.bias ? &bias_ : nullptr; }
  const Param* bias() const { return options_.bias ? &bias_ : nullptr; }

  // Structural changes for batch-norm folding (engine/layers/fold.h): add a zero bias, fuse or unfuse the ReLU.
  // Both take effect at the next forward (which rebuilds the primitives).
  void enable_bias();
  void set_relu(bool relu);
  // The data type of src, weights and dst: f32 (the default) or bf16. Takes effect at the next forward. With
  // Weights::fixed (inference) the bf16 weights are made once per setup, so changing the Param afterwards needs
  // another call (or a new setup) to be seen, and backward refuses (InternalError); with Weights::trained on every
  // forward.
  void set_compute_type(dnnl::memory::data_type type, Weights weights = Weights::fixed);
  // s8 after set_int8.
  dnnl::memory::data_type compute_type() const { return compute_; }
  // int8 inference (see the header comment): `src_scale` and `dst_scale` are real value per step of the stored
  // integers, `src_signed` chooses s8 over u8 for src. InternalError in train mode or for a scale that is not a
  // positive finite number. Takes effect at the next forward; set_compute_type(f32) returns to float32.
  void set_int8(float src_scale, bool src_signed, float dst_scale);
  // Calibration: while set, every forward (float32 only) widens these ranges by its src and dst. nullptr stops.
  void observe(ValueRange* src, ValueRange* dst) {
    observe_src_ = src;
    observe_dst_ = dst;
  }

  // Output spatial size for an input size, or <= 0 when the input is too small.
  int output_size(int input) const;

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  void build_backward();
  dnnl::memory weights_memory();
  dnnl::memory bias_memory();

  // bf16 training: backward weights runs in f32 on outputs of at most this many pixels per image, and for 1×1
  // kernels with a stride (measured with oneDNN 2.6 on AMX: 6×6 and 3×3 outputs of ResNet-18 ran 1.7–5× slower in
  // bf16 than in f32, its 1×1 stride-2 shortcut to 12×12 6.8× slower, most other 12×12 and larger ones faster).
  static constexpr dnnl::memory::dim kSmallOutput = 36;

  Conv2dOptions options_;
  dnnl::memory::data_type compute_ = dnnl::memory::data_type::f32;
  Weights weights_ = Weights::fixed;  // bf16: converted once per setup (fixed) or on every forward (trained)
  float src_scale_ = 1.0f;            // int8: the scales set_int8 was given
  bool src_signed_ = false;
  float dst_scale_ = 1.0f;
  std::vector<float> weight_scales_;  // int8, per setup: max |w| / 127 per output channel
  std::vector<float> bias_int8_;      // int8, per setup: the bias in accumulator units
  ValueRange* observe_src_ = nullptr;
  ValueRange* observe_dst_ = nullptr;
  Param weight_;
  Param bias_;

  // Per setup.
  dnnl::convolution_forward::primitive_desc fwd_pd_;
  dnnl::convolution_forward fwd_;
  Tensor dst_;
  Tensor src_saved_;            // the src of the last forward, in fwd_pd_'s layout (for backward weights)
  dnnl::memory weights_saved_;  // the weights of the last forward, in fwd_pd_'s layout (for backward data)
  dnnl::memory weights_low_;    // reduced precision: the weights converted once after this setup

  // Per setup, created on the first backward.
  bool backward_built_ = false;
  bool built_propagate_down_ = true;
  dnnl::eltwise_backward::primitive_desc relu_bwd_pd_;
  dnnl::eltwise_backward relu_bwd_;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd_;
  dnnl::convolution_backward_weights bwd_weights_;
  Tensor diff_pre_;  // dL/d(pre-ReLU output), dst's layout
  Tensor diff_src_;
  Tensor diff_weights_;
  Tensor diff_bias_;

  Reorderer src_reorder_;
  Reorderer weights_reorder_;
  Reorderer weights_bwd_reorder_;
  Reorderer bias_reorder_;
  Reorderer diff_dst_reorder_;          // incoming diff_dst → dst's layout
  Reorderer diff_dst_data_reorder_;     // → backward-data's diff_dst layout
  Reorderer diff_dst_weights_reorder_;  // → backward-weights' diff_dst layout
  Reorderer src_weights_reorder_;       // saved src → backward-weights' src layout
  AccumulatingReorder weights_grad_;
  AccumulatingReorder bias_grad_;
};

}  // namespace tessera::engine
