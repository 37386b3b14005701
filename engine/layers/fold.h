// Batch-norm folding for inference: an eval-mode BatchNorm2d after a Conv2d is an affine map per output
// channel, so it can live in the convolution's weights and bias and cost nothing at run time.
//
//   s[o]      = bn.weight[o] / sqrt(bn.running_var[o] + eps)
//   weight'   = weight[o,·,·,·] · s[o]
//   bias'[o]  = (bias[o] − bn.running_mean[o]) · s[o] + bn.bias[o]      (bias = 0 when the conv had none)
//
// The batch norm's fused ReLU (if any) becomes the convolution's fused ReLU. Afterwards the convolution has a
// bias, the batch norm is marked folded (forward passes its input through; training and backward are refused),
// and both give, in eval mode, the outputs the pair gave before (up to float rounding). The model is then for
// inference only: its conv parameters no longer match a trainable checkpoint.
#pragma once

#include "engine/layers/batchnorm.h"
#include "engine/layers/conv.h"

namespace tessera::engine {

// Throws InternalError when the pair cannot be folded: channel counts differ, the batch norm is already
// folded, or the convolution has a fused ReLU (then the batch norm does not follow the convolution directly).
void fold_batchnorm(Conv2d& conv, BatchNorm2d& bn);

}  // namespace tessera::engine
