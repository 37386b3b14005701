// LeNet-5, with the modern substitutions (ReLU for the scaled tanh, max-pool for the trainable subsampling, a
// full C→6 first convolution), as the classic small baseline.
//
//   conv1 5×5 (C→6) ReLU · pool1 max 2×2/2 · conv2 5×5 (6→16) ReLU · pool2 max 2×2/2       S → s = ⌊(⌊(S−4)/2⌋−4)/2⌋
//   fc1 Linear(16·s·s → 120) ReLU · fc2 Linear(120 → 84) ReLU · fc3 Linear(84 → K)
//
// At the classic 32 px, s = 5 and fc1 has 400 inputs; other input sizes resize fc1 (the model then takes only
// inputs that give the same s). The smallest input is 16 px. Not a torchvision model; its names are those of
// this plain torch.nn module:
//   class LeNet5(nn.Module):  conv1 = nn.Conv2d(C, 6, 5); conv2 = nn.Conv2d(6, 16, 5)
//                             fc1 = nn.Linear(16*s*s, 120); fc2 = nn.Linear(120, 84); fc3 = nn.Linear(84, K)
//     forward: x = max_pool2d(relu(conv1(x)), 2); x = max_pool2d(relu(conv2(x)), 2); x = flatten(x, 1)
//              return fc3(relu(fc2(relu(fc1(x)))))
// Initialisation: PyTorch's defaults. Parameters at 32 px, 10 classes: 61,706 for one input channel as in
// the paper, 62,006 for RGB. Forward at 32 px (RGB): 1.30 MFLOP per image.
#pragma once

#include <memory>

#include "engine/models/model.h"

namespace tessera::engine {

std::unique_ptr<Model> build_lenet5(const ModelOptions& options);

}  // namespace tessera::engine
