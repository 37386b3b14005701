// Naive reference ReLU on float arrays of any shape: the test oracle for engine/layers/relu.h and for the
// ReLUs fused into Conv2d and BatchNorm2d.
//   dst = max(src, 0);   diff_src = diff_dst where dst > 0, else 0   (the derivative at 0 is taken as 0,
//   as PyTorch does; gradient checks skip points near 0)
#pragma once

#include <vector>

namespace tessera::engine::reference {

std::vector<float> relu_forward(const std::vector<float>& src);
// From the forward output `dst` (dst > 0 exactly where src > 0).
std::vector<float> relu_backward(const std::vector<float>& dst, const std::vector<float>& diff_dst);

}  // namespace tessera::engine::reference
