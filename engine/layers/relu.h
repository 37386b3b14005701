// ReLU on oneDNN, as torch.nn.ReLU.
//
//   src, dst: any shape, dst in src's layout;   dst = max(src, 0)
//   backward: diff_src = diff_dst where dst > 0, else 0   (computed from dst, so src need not be kept)
//
// oneDNN: eltwise with eltwise_relu_use_dst_for_bwd in the input's own layout (blocked stays blocked). Prefer
// fusing the ReLU into the preceding Conv2d or BatchNorm2d (their `relu` option), which saves a full pass over
// the activations; this module is for the places where nothing can absorb it.
#pragma once

#include <string>

#include "engine/module.h"

namespace tessera::engine {

class ReLU : public Module {
 public:
  explicit ReLU(std::string name) : Module(std::move(name)) {}

  std::string type() const override { return "ReLU"; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  dnnl::eltwise_forward::primitive_desc fwd_pd_;
  dnnl::eltwise_forward fwd_;
  bool backward_built_ = false;
  dnnl::eltwise_backward::primitive_desc bwd_pd_;
  dnnl::eltwise_backward bwd_;
  Tensor dst_;
  Tensor diff_src_;
  Reorderer diff_dst_reorder_;
};

}  // namespace tessera::engine
