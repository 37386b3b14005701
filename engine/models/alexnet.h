// AlexNet (torchvision's alexnet, the one-GPU variant of the paper).
//
//   features    conv 11×11/4 pad 2 (C→64) ReLU · max-pool 3×3/2 · conv 5×5 pad 2 (→192) ReLU · max-pool 3×3/2 ·
//               conv 3×3 pad 1 (→384) ReLU · conv 3×3 (→256) ReLU · conv 3×3 (→256) ReLU · max-pool 3×3/2
//   avgpool     adaptive average pool to 6×6
//   classifier  Dropout Linear(256·6·6 → W) ReLU Dropout Linear(W → W) ReLU Linear(W → K),  W = 4096
//
// Names follow torchvision's Sequential indices (fused ReLUs keep their index): convs features.0, .3, .6, .8,
// .10; linear layers classifier.1, .4, .6. The smallest input is 63 px (the third max-pool needs a 3×3 map).
// Initialisation: PyTorch's defaults (torchvision's AlexNet sets none of its own). Parameters at 1000 classes:
// 61,100,840. Forward at 224 px: 1.43 GFLOP per image.
#pragma once

#include <memory>

#include "engine/models/model.h"

namespace tessera::engine {

std::unique_ptr<Model> build_alexnet(const ModelOptions& options);

}  // namespace tessera::engine
