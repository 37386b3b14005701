// VGG (torchvision's vgg11, vgg16 and their batch-norm variants vgg11_bn, vgg16_bn).
//
//   features    configuration A (vgg11): 64 M 128 M 256 256 M 512 512 M 512 512 M
//               configuration D (vgg16): 64 64 M 128 128 M 256 256 256 M 512 512 512 M 512 512 512 M
//               a number v: conv 3×3 pad 1 (→ v channels, with bias) + ReLU, or conv + BN + ReLU for _bn;
//               M: max-pool 2×2/2                                                 S → S/32
//   avgpool     adaptive average pool to 7×7 (any input ≥ 32 px works: a 96 px tile's 3×3 map is spread
//               over 7×7, as torchvision does)
//   classifier  Linear(512·7·7 → W) ReLU Dropout Linear(W → W) ReLU Dropout Linear(W → K),  W = 4096
//
// Names follow torchvision's Sequential indices: every conv, ReLU, BN and pool takes an index even where the
// ReLU is fused away, so the convolutions of vgg11 are features.0, .3, .6, .8, ... (vgg11_bn: .0, .4, .8, .11,
// ...; the BN after conv i is features.(i+1)) and the linear layers classifier.0, .3, .6.
//
// Initialisation as torchvision: convs kaiming_normal_(fan_out, relu) with bias 0, BN weight 1 bias 0, linear
// N(0, 0.01) with bias 0. Parameters at 1000 classes: vgg11 132,863,336; vgg11_bn 132,868,840; vgg16
// 138,357,544; vgg16_bn 138,365,992. Forward at 224 px: 15.2 (vgg11) and 30.9 (vgg16) GFLOP per image.
// `classifier_width` (ModelOptions; the train key model.classifier_width, recorded in a checkpoint's /meta) shrinks W
// for small tile classifiers; 4096 is torchvision's.
#pragma once

#include <memory>

#include "engine/models/model.h"

namespace tessera::engine {

std::unique_ptr<Model> build_vgg11(const ModelOptions& options);
std::unique_ptr<Model> build_vgg11_bn(const ModelOptions& options);
std::unique_ptr<Model> build_vgg16(const ModelOptions& options);
std::unique_ptr<Model> build_vgg16_bn(const ModelOptions& options);

}  // namespace tessera::engine
