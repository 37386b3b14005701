// Residual addition — the join of a ResNet block — and the sum of two gradients, on oneDNN's binary add.
//
//   forward:   dst = a + b            (relu: dst = max(a + b, 0), the block's final ReLU fused in)
//   backward:  diff = diff_dst        (relu: diff = diff_dst · [dst > 0])
//              and `diff` is the gradient of BOTH a and b: the block passes the same tensor to the backward
//              of each branch (every Module takes diff_dst in any layout and reorders if it must).
//   shapes: a and b have the same dims (N×C×H×W or N×C); dst and diff are in a's layout, b is reordered into
//   a's layout first if its own differs.
//
// A ResNet basic block with input x, main path F and shortcut S (identity or a 1×1 conv + BN):
//   forward:   y  = join.forward(F.forward(x), S(x))                    join = ResidualAdd(name, relu=true)
//   backward:  g  = join.backward(dy)
//              dx = grad_sum.forward(F.backward(g), S ? S.backward(g) : g)   grad_sum = ResidualAdd(name)
// so the second use, without relu, adds the two gradients that reach x.
//
// int8 inference (engine/precision.h): after set_int8(dst_scale), quantized inputs are added by oneDNN's binary
// add with each input's scale over dst_scale as its scale, into u8 (relu: the saturation at 0 is the ReLU) or s8
// in a's layout; b is brought into a's layout keeping its own type and scale. Float inputs are added in float.
// observe() records the float32 dst range of each forward (calibration, in fp32).
//
// Not a Module: it has two inputs. Like a Module, its results belong to it and stay valid until its next call
// of the same kind, and primitives are built once per pair of input descs.
#pragma once

#include <string>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/tensor.h"

namespace tessera::engine {

class ResidualAdd {
 public:
  explicit ResidualAdd(std::string name, bool relu = false);
  ResidualAdd(const ResidualAdd&) = delete;
  ResidualAdd& operator=(const ResidualAdd&) = delete;

  const std::string& name() const { return name_; }
  bool relu() const { return relu_; }

  // Prepares for inputs with these descs (a no-op when they are the last ones); returns dst's desc (a's).
  // Throws InternalError when the dims differ.
  dnnl::memory::desc setup(const dnnl::memory::desc& a, const dnnl::memory::desc& b);
  const Tensor& forward(const Tensor& a, const Tensor& b);
  // int8 inference: dst is quantized with `dst_scale` (real value per step) when an input is quantized.
  // InternalError for a scale that is not a positive finite number. set_int8(0) returns to float.
  void set_int8(float dst_scale);
  // Calibration: while set, every float32 forward widens `dst` by its result. nullptr stops.
  void observe(ValueRange* dst) { observe_dst_ = dst; }
  // The gradient for both inputs, in dst's layout. Without relu this is diff_dst itself (no copy).
  const Tensor& backward(const Tensor& diff_dst);

 private:
  [[noreturn]] void fail(const std::string& message) const;
  // The quantized sum's primitive for these inputs (rebuilt when their descs or scales change).
  void setup_int8(const Tensor& a, const Tensor& b);

  std::string name_;
  bool relu_;
  bool set_up_ = false;
  bool forwarded_ = false;
  dnnl::memory::desc a_desc_;
  dnnl::memory::desc b_desc_;
  dnnl::binary::primitive_desc forward_pd_;
  dnnl::binary forward_;
  dnnl::eltwise_forward::primitive_desc relu_forward_pd_;  // relu on a channel-padded layout only (see setup)
  dnnl::eltwise_forward relu_forward_;
  dnnl::eltwise_backward::primitive_desc relu_backward_pd_;  // relu only, built on the first backward
  dnnl::eltwise_backward relu_backward_;
  float dst_scale_ = 0.0f;  // int8: dst's scale; 0 = float
  ValueRange* observe_dst_ = nullptr;
  dnnl::memory::desc int8_a_desc_, int8_b_desc_;  // the inputs the quantized primitive was built for
  float int8_a_scale_ = 0.0f, int8_b_scale_ = 0.0f;
  dnnl::binary::primitive_desc int8_pd_;
  dnnl::binary int8_forward_;
  Tensor int8_dst_;
  Reorderer b_reorder_;
  Reorderer diff_dst_reorder_;
  Tensor dst_;
  Tensor diff_;
};

}  // namespace tessera::engine
