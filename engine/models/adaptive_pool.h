// Adaptive average pooling to a fixed grid, as torch.nn.AdaptiveAvgPool2d((out_h, out_w)) — the `avgpool` of
// torchvision's VGG (7×7) and AlexNet (6×6), which lets those models take any input size.
//
//   src N×C×H×W  →  dst N×C×out_h×out_w
//   dst[n,c,y,x] = mean of src[n,c,i,j] over i ∈ [floor(y·H/out_h), ceil((y+1)·H/out_h)),
//                                          j ∈ [floor(x·W/out_w), ceil((x+1)·W/out_w))
//   backward: each diff_dst[n,c,y,x] is spread evenly over its window (windows may overlap when H is not a
//   multiple of out_h, or when H < out_h: then input cells are repeated, and their gradients add up).
//
// Three ways to run it, chosen per input shape:
//   identity  H = out_h and W = out_w (VGG at 224 px): dst is src itself, no copy, diff_src is diff_dst;
//   uniform   H, W multiples of out_h, out_w: the windows are a regular tiling, which is oneDNN's average
//             pooling with kernel = stride = H/out_h, in src's own layout;
//   general   anything else: plain loops over NCHW (src is reordered to nchw; the tensors are small here —
//             the end of a feature extractor), OpenMP over the N·C planes. dst and diff_src are plain nchw.
#pragma once

#include <string>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/module.h"
#include "engine/tensor.h"

namespace tessera::engine {

class AdaptiveAvgPool2dTo : public Module {
 public:
  AdaptiveAvgPool2dTo(std::string name, int out_h, int out_w);
  std::string type() const override { return "AdaptiveAvgPool2d"; }

  int out_h() const { return out_h_; }
  int out_w() const { return out_w_; }

  enum class Path { identity, uniform, general };
  // How the last setup runs it (for tests).
  Path path() const { return path_; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  int out_h_;
  int out_w_;
  Path path_ = Path::identity;

  // uniform
  dnnl::pooling_forward::primitive_desc forward_pd_;
  dnnl::pooling_forward forward_;
  dnnl::pooling_backward::primitive_desc backward_pd_;  // built on the first backward
  dnnl::pooling_backward backward_;

  Tensor dst_;                  // identity: src itself (shared)
  Tensor diff_src_;             // identity: diff_dst itself (shared)
  Reorderer src_reorder_;       // general: src → nchw
  Reorderer diff_dst_reorder_;  // → the layout the backward wants
};

}  // namespace tessera::engine
