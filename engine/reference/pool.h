// Naive reference pooling on plain NCHW float arrays: the test oracle for engine/layers/pool.h and
// engine/layers/global_pool.h. Plain loops, no threading, no layouts — meant to be checked by eye.
//
// Shapes: src N×C×H×W, dst N×C×OH×OW with (ceil_mode false, PyTorch's default)
//   OH = floor((H + 2·pad_h − kernel_h) / stride_h) + 1,   OW likewise.
// Window of output (oy, ox): rows oy·stride_h − pad_h … + kernel_h − 1, columns likewise.
//   max:  dst = max over the window cells inside the image (padding never wins);
//         backward routes diff_dst to the first maximum in row-major window order.
//   avg:  dst = sum over the window cells inside the image / divisor, where divisor is kernel_h·kernel_w when
//         count_include_pad (PyTorch's default; padding counts as zeros) and the number of cells inside the
//         image otherwise; backward spreads diff_dst / divisor over those cells.
//   adaptive avg to OH×OW (PyTorch's AdaptiveAvgPool2d): output row oy averages input rows
//         floor(oy·H/OH) … ceil((oy+1)·H/OH) − 1, columns likewise; OH = OW = 1 is the global average.
#pragma once

#include <vector>

namespace tessera::engine::reference {

// A pooling window with symmetric zero padding.
struct PoolWindow {
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;

  int out_h(int h) const { return (h + 2 * pad_h - kernel_h) / stride_h + 1; }
  int out_w(int w) const { return (w + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// Shape of a plain NCHW array.
struct PoolInput {
  int n = 1, c = 1, h = 1, w = 1;
  int size() const { return n * c * h * w; }
};

std::vector<float> max_pool_forward(const std::vector<float>& src, const PoolInput& shape, const PoolWindow& window);
// diff_src (N×C×H×W) from src and diff_dst (N×C×OH×OW).
std::vector<float> max_pool_backward(const std::vector<float>& src, const std::vector<float>& diff_dst,
                                     const PoolInput& shape, const PoolWindow& window);

std::vector<float> avg_pool_forward(const std::vector<float>& src, const PoolInput& shape, const PoolWindow& window,
                                    bool count_include_pad = true);
std::vector<float> avg_pool_backward(const std::vector<float>& diff_dst, const PoolInput& shape,
                                     const PoolWindow& window, bool count_include_pad = true);

// dst N×C×out_h×out_w.
std::vector<float> adaptive_avg_pool_forward(const std::vector<float>& src, const PoolInput& shape, int out_h,
                                             int out_w);
std::vector<float> adaptive_avg_pool_backward(const std::vector<float>& diff_dst, const PoolInput& shape, int out_h,
                                              int out_w);

}  // namespace tessera::engine::reference
