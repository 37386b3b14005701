// Naive reference fully connected layer on plain arrays: the test oracle for engine/layers/linear.h.
//
//   y[n, o] = Σ_i x[n, i] · W[o, i] + b[o]        x N×I, W O×I (PyTorch's [out, in]), b O (optional), y N×O
//   backward:  diff_x = diff_y · W   (N×I),   diff_W = diff_yᵀ · x   (O×I),   diff_b[o] = Σ_n diff_y[n, o]
//
// A 4-D input N×C×H×W enters as N×(C·H·W) in NCHW order, exactly as PyTorch's flatten(1).
#pragma once

#include <vector>

namespace tessera::engine::reference {

struct LinearShape {
  int batch = 1;    // N
  int inputs = 1;   // I
  int outputs = 1;  // O
};

// `bias` may be empty (no bias).
std::vector<float> linear_forward(const std::vector<float>& x, const std::vector<float>& weight,
                                  const std::vector<float>& bias, const LinearShape& shape);

struct LinearGrads {
  std::vector<float> diff_x;       // N×I
  std::vector<float> diff_weight;  // O×I
  std::vector<float> diff_bias;    // O
};

LinearGrads linear_backward(const std::vector<float>& x, const std::vector<float>& weight,
                            const std::vector<float>& diff_y, const LinearShape& shape);

}  // namespace tessera::engine::reference
