#include "engine/layers/fold.h"

#include <cmath>
#include <cstddef>
#include <string>

#include "core/error.h"

namespace tessera::engine {

void fold_batchnorm(Conv2d& conv, BatchNorm2d& bn) {
  const std::string what = "fold '" + bn.name() + "' into '" + conv.name() + "': ";
  if (bn.channels() != conv.options().out) {
    throw core::InternalError(what + "batch norm has " + std::to_string(bn.channels()) + " channels, convolution has " +
                              std::to_string(conv.options().out) + " outputs");
  }
  if (bn.folded()) throw core::InternalError(what + "batch norm is already folded");
  if (conv.options().relu) throw core::InternalError(what + "convolution has a fused ReLU before the batch norm");

  conv.enable_bias();
  Param& weight = conv.weight();
  Param& bias = *conv.bias();
  const auto outputs = static_cast<std::size_t>(conv.options().out);
  const std::size_t per_output = weight.value.size() / outputs;
  for (std::size_t o = 0; o < outputs; ++o) {
    const double scale =
        bn.weight().value[o] / std::sqrt(static_cast<double>(bn.running_var().value[o]) + bn.options().eps);
    for (std::size_t k = 0; k < per_output; ++k) {
      float& w = weight.value[o * per_output + k];
      w = static_cast<float>(w * scale);
    }
    bias.value[o] = static_cast<float>((bias.value[o] - static_cast<double>(bn.running_mean().value[o])) * scale +
                                       bn.bias().value[o]);
  }
  conv.set_relu(bn.options().relu);
  bn.set_folded();
}

}  // namespace tessera::engine
