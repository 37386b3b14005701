// Naive reference dropout and elementwise addition on plain arrays: the test oracles for
// engine/layers/dropout.h and engine/layers/add.h. Any shape; arrays are flat.
//
//   dropout (training, drop probability p, keep mask m ∈ {0, 1}):
//     y = x · m / (1 − p)          diff_x = diff_y · m / (1 − p)
//   dropout (eval): identity.
//   add:  y = a + b                diff_a = diff_b = diff_y
//   add with ReLU after the sum (a residual block's output):
//     y = max(a + b, 0)            diff_a = diff_b = diff_y · [y > 0]
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::engine::reference {

// `keep` holds 1 for kept elements and 0 for dropped ones; p in [0, 1).
std::vector<float> dropout_forward(const std::vector<float>& x, const std::vector<std::uint8_t>& keep, float p);
std::vector<float> dropout_backward(const std::vector<float>& diff_y, const std::vector<std::uint8_t>& keep, float p);

std::vector<float> add_forward(const std::vector<float>& a, const std::vector<float>& b, bool relu = false);
// The gradient each branch receives (the same for both); `y` is the forward output (used only with relu).
std::vector<float> add_backward(const std::vector<float>& diff_y, const std::vector<float>& y, bool relu = false);

}  // namespace tessera::engine::reference
