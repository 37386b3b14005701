// Naive reference convolution on plain NCHW float arrays: the test oracle for engine/layers/conv.h.
// Plain loops with double accumulators, no threading, no layouts — meant to be checked by eye.
//
// Shapes: src N×C×H×W, weights O×C×KH×KW (PyTorch OIHW), bias [O] (optional), dst N×O×OH×OW with
//   OH = floor((H + 2·pad_h − dilation_h·(KH − 1) − 1) / stride_h) + 1,   OW likewise.
// Forward:
//   dst[n,o,y,x] = bias[o] + Σ_{c,i,j} src[n, c, y·stride_h − pad_h + i·dilation_h, x·stride_w − pad_w + j·dilation_w]
//                                      · weights[o,c,i,j]          (source pixels outside the image count as 0)
// Backward (for dL/d(dst) = diff_dst):
//   diff_src[n,c,h,w]   = Σ over every (o,y,x,i,j) whose source pixel is (h,w) of diff_dst[n,o,y,x]·weights[o,c,i,j]
//   diff_weights[o,c,i,j] = Σ_{n,y,x} diff_dst[n,o,y,x] · src[n, c, source pixel of (y,x) and tap (i,j)]
//   diff_bias[o]        = Σ_{n,y,x} diff_dst[n,o,y,x]
// Dilation follows PyTorch: 1 means adjacent taps.
#pragma once

#include <vector>

namespace tessera::engine::reference {

struct ConvShape {
  int n = 1, c = 1, h = 1, w = 1;  // src
  int o = 1;                       // output channels
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int dilation_h = 1, dilation_w = 1;

  int out_h() const { return (h + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1; }
  int out_w() const { return (w + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1; }
  int src_size() const { return n * c * h * w; }
  int weights_size() const { return o * c * kernel_h * kernel_w; }
  int dst_size() const { return n * o * out_h() * out_w(); }
};

// `bias` may be empty (no bias).
std::vector<float> conv_forward(const std::vector<float>& src, const std::vector<float>& weights,
                                const std::vector<float>& bias, const ConvShape& shape);
std::vector<float> conv_backward_data(const std::vector<float>& diff_dst, const std::vector<float>& weights,
                                      const ConvShape& shape);
std::vector<float> conv_backward_weights(const std::vector<float>& src, const std::vector<float>& diff_dst,
                                         const ConvShape& shape);
std::vector<float> conv_backward_bias(const std::vector<float>& diff_dst, const ConvShape& shape);

}  // namespace tessera::engine::reference
