// 2-D max and average pooling on oneDNN (torch.nn.MaxPool2d / AvgPool2d with ceil_mode false).
//
//   src N×C×H×W  →  dst N×C×OH×OW,   OH = floor((H + 2·padding − kernel) / stride) + 1,   OW likewise
//   max: dst = max over the window (padding never wins). Training keeps oneDNN's workspace (the argmax of each
//        window) so backward routes each diff_dst element to the input that won, without src.
//   avg: dst = window sum / kernel² with count_include_pad (PyTorch's default: padding counts as zeros), or
//        / (cells inside the image) without; backward spreads diff_dst over the window the same way.
//
// dst keeps src's layout (nChw8c stays nChw8c) and data type (bf16 in reduced-precision inference), and diff_src comes back in src's layout. In eval mode max
// pooling runs the inference primitive (no workspace), so backward needs a training-mode forward.
#pragma once

#include <string>
#include <utility>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/module.h"
#include "engine/tensor.h"

namespace tessera::engine {

struct Pool2dOptions {
  int kernel = 2;
  int stride = 0;  // 0: the kernel size (PyTorch's default)
  int padding = 0;
  bool count_include_pad = true;  // average pooling only
};

// Shared implementation; use MaxPool2d or AvgPool2d.
class Pool2d : public Module {
 public:
  const Pool2dOptions& options() const { return options_; }
  void set_mode(Mode mode) override;

 protected:
  Pool2d(std::string name, const Pool2dOptions& options, bool max);

  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  dnnl::algorithm algorithm() const;
  void setup_backward();

  Pool2dOptions options_;
  bool max_;
  dnnl::pooling_forward::primitive_desc forward_pd_;
  dnnl::pooling_forward forward_;
  dnnl::pooling_backward::primitive_desc backward_pd_;  // built on the first backward
  dnnl::pooling_backward backward_;
  dnnl::memory workspace_;  // max pooling in training only
  Tensor dst_;
  Tensor diff_src_;
  Reorderer diff_dst_reorder_;
};

class MaxPool2d : public Pool2d {
 public:
  MaxPool2d(std::string name, const Pool2dOptions& options) : Pool2d(std::move(name), options, true) {}
  std::string type() const override { return "MaxPool2d"; }
};

class AvgPool2d : public Pool2d {
 public:
  AvgPool2d(std::string name, const Pool2dOptions& options) : Pool2d(std::move(name), options, false) {}
  std::string type() const override { return "AvgPool2d"; }
};

}  // namespace tessera::engine
