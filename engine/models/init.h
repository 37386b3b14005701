// Parameter initialisation with torchvision's distributions, from a seeded counter-based generator.
//
// Distributions (fan_in = I·kH·kW of a conv weight O×I×kH×kW, or I of a linear weight [O, I]; fan_out = O·kH·kW):
//   pytorch_default        conv/linear weight ~ U(−b, b), b = gain·sqrt(3/fan_in) with kaiming_uniform's a = √5,
//                          gain = sqrt(2/(1 + a²)), i.e. b = 1/sqrt(fan_in); bias ~ U(−1/sqrt(fan_in), 1/sqrt(fan_in))
//                          (torch.nn.Conv2d / Linear reset_parameters: LeNet-5, AlexNet, every model's fc)
//   kaiming_normal_fan_out conv weight ~ N(0, 2/fan_out) (kaiming_normal_, mode fan_out, relu), bias 0
//                          (torchvision's ResNet and VGG)
//   normal_0_01            linear weight ~ N(0, 0.01²), bias 0 (torchvision's VGG classifier)
//   batch norm             weight 1, bias 0 (buffers keep their running_mean 0, running_var 1)
//
// Values are a function of (seed, parameter name, element index) only — a 64-bit mix of the three gives two
// uniform 32-bit draws per element (uniform) or per pair of elements (normal: Box-Muller makes two normals of
// them) — so the same seed gives the same model, bit for bit, whatever the thread count and whatever the order
// parameters are visited in. They are not PyTorch's numbers (its generator is a different one): the same
// distributions, not the same draws.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/parameters.h"

namespace tessera::engine {

enum class ConvInit { pytorch_default, kaiming_normal_fan_out };
enum class LinearInit { pytorch_default, normal_0_01 };

struct InitScheme {
  ConvInit conv = ConvInit::pytorch_default;
  LinearInit linear = LinearInit::pytorch_default;
};

// Initialises every parameter by its kind; a bias takes its fan-in from the weight of the same module ("x.bias"
// ↔ "x.weight"), which must be in `params`. Throws InternalError when it is not.
void initialize(const std::vector<Param*>& params, const InitScheme& scheme, std::uint64_t seed);

// The building blocks (seeded per parameter name, as above).
void fill_uniform(Param& param, double bound, std::uint64_t seed);  // U(−bound, bound)
void fill_normal(Param& param, double stddev, std::uint64_t seed);  // N(0, stddev²)
void fill_constant(Param& param, float value);

}  // namespace tessera::engine
