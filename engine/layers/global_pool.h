// Global average pooling to N×C: torch.nn.AdaptiveAvgPool2d((1, 1)) followed by flatten(1), as at the end of
// torchvision's ResNets (`avgpool`, then `fc`).
//
//   src N×C×H×W (any layout)  →  dst N×C (plain nc),   dst[n, c] = (1 / H·W) Σ_{y,x} src[n, c, y, x]
//   backward: diff_src[n, c, y, x] = diff_dst[n, c] / (H·W), in src's layout
//
// The averaging runs as a oneDNN pooling with an H×W kernel in src's layout; only the N×C×1×1 result (a few
// thousand values) is reordered into the plain N×C output, so a blocked producer costs no reorder of its
// activations. A bf16 src (reduced-precision inference) is pooled in bf16 and the N×C output is float32; a
// quantized src (int8) is pooled in its own type and dequantized with its scale into the float32 output.
#pragma once

#include <string>
#include <utility>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/module.h"
#include "engine/tensor.h"

namespace tessera::engine {

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::string name) : Module(std::move(name)) {}
  std::string type() const override { return "AdaptiveAvgPool2d"; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  void setup_backward();

  dnnl::pooling_forward::primitive_desc forward_pd_;
  dnnl::pooling_forward forward_;
  dnnl::pooling_backward::primitive_desc backward_pd_;  // built on the first backward
  dnnl::pooling_backward backward_;
  Tensor pooled_;              // N×C×1×1 in the pooling primitive's layout
  Tensor dst_;                 // N×C plain
  dnnl::memory dst_4d_;        // dst_'s buffer seen as N×C×1×1 nchw
  dnnl::reorder to_dst_;       // pooled_ → dst_4d_
  float to_dst_scale_ = 1.0f;  // the output scale to_dst_ applies (a quantized src's scale)
  Tensor diff_dst_4d_;         // diff_dst as N×C×1×1 in the pooling primitive's layout
  dnnl::reorder from_diff_dst_;
  Tensor diff_src_;
  Reorderer diff_dst_reorder_;  // a diff_dst that is not plain nc
};

}  // namespace tessera::engine
