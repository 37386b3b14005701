// Fully connected layer on oneDNN's inner product (torch.nn.Linear, with PyTorch's flatten(1) built in).
//
//   src N×I, or N×C×H×W with C·H·W = I (any layout)       weight O×I ([out, in], Param "<name>.weight")
//   dst[n, o] = Σ_i src[n, i] · weight[o, i] + bias[o]    dst N×O          bias O (Param "<name>.bias")
//   backward:  diff_src = diff_dst · weight,  weight.grad += diff_dstᵀ · src,  bias.grad += Σ_n diff_dst[n, ·]
//
// A 4-D input is flattened in PyTorch's order (index i = (c·H + y)·W + x) without moving it: the primitive
// sees weight as O×C×H×W (the same numbers, OIHW) and picks a weight layout that matches src's, blocked or not,
// so a blocked producer (nChw8c) feeds the layer directly and gets its diff_src back in its own layout. The
// master weight stays [out, in] in the Param and is reordered into the primitive's layout on each forward;
// diff_weights are reordered back and added to Param::grad in the same pass.
//
// Reduced precision (engine/precision.h): set_compute_type(bf16) makes src and weights bfloat16 (an fp32 src is
// converted on the way in; the weights once per setup for inference, on every forward for training) while dst and
// bias stay float32, so the logits after the last layer are float32. bf16 backward: diff_dst converted to
// bfloat16, diff_src bfloat16 in the layout the primitive read src in, weight and bias gradients float32.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/module.h"
#include "engine/parameters.h"
#include "engine/tensor.h"

namespace tessera::engine {

struct LinearOptions {
  int in = 0;   // I: input features (C·H·W for a 4-D input)
  int out = 0;  // O: output features
  bool bias = true;
};

class Linear : public Module {
 public:
  Linear(std::string name, const LinearOptions& options);
  std::string type() const override { return "Linear"; }
  const LinearOptions& options() const { return options_; }

  void collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) override;

  // Parameters start at zero; the model initialises them (or loads a checkpoint).
  Param& weight() { return weight_; }
  const Param& weight() const { return weight_; }
  // nullptr without bias.
  Param* bias() { return options_.bias ? &bias_ : nullptr; }
  const Param* bias() const { return options_.bias ? &bias_ : nullptr; }

  // The data type of src and weights: f32 (the default) or bf16; dst stays f32. Takes effect at the next forward.
  // bf16 weights are made once per setup with Weights::fixed (inference; backward refuses: InternalError), on every
  // forward with Weights::trained.
  void set_compute_type(dnnl::memory::data_type type, Weights weights = Weights::fixed);
  dnnl::memory::data_type compute_type() const { return compute_; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  void setup_backward();
  void check_params() const;

  LinearOptions options_;
  Param weight_;        // O×I
  Param bias_;          // O, when options_.bias
  dims_t weight_dims_;  // {O, I} or {O, C, H, W}: weight as the primitive sees it
  dnnl::memory::data_type compute_ = dnnl::memory::data_type::f32;
  Weights weights_ = Weights::fixed;
  bool weights_converted_ = false;  // reduced precision: weights_mem_ holds the converted weights of this setup
  Reorderer src_reorder_;           // src → the primitive's src desc, when its data type differs
  dnnl::inner_product_forward::primitive_desc forward_pd_;
  dnnl::inner_product_forward forward_;
  dnnl::inner_product_backward_data::primitive_desc backward_data_pd_;  // built on the first backward
  dnnl::inner_product_backward_data backward_data_;
  dnnl::inner_product_backward_weights::primitive_desc backward_weights_pd_;
  dnnl::inner_product_backward_weights backward_weights_;
  bool weights_plain_ = false;  // the primitive's weight layout is the Param's own: no reorder
  dnnl::memory weights_mem_;    // weight in the forward primitive's layout (the Param's buffer when plain)
  dnnl::reorder to_weights_;    // Param → weights_mem_, when not plain
  dnnl::memory bias_mem_;       // the bias Param's buffer
  Tensor src_;                  // kept for backward (shared handle)
  Tensor dst_;
  Tensor diff_src_;
  Tensor diff_weights_;
  Tensor diff_bias_;
  Reorderer diff_dst_reorder_;
  bool backward_weights_plain_ = false;  // backward data reads the Param's buffer directly
  dnnl::memory backward_weights_mem_;    // weights in the backward-data primitive's layout, when it differs
  dnnl::reorder to_backward_weights_;
  AccumulatingReorder accumulate_weight_grad_;
  AccumulatingReorder accumulate_bias_grad_;
};

}  // namespace tessera::engine
