// Small CNNs for pathology tiles: `compact`, Tessera's fast classifier for ~96 px tiles, and `tiny_cnn`, the
// smallest model with every kind of layer, for tests and smoke runs (scripts/torch_checkpoint.py defines it too).
//
// compact, width w (ModelOptions::width, default 32), input C×S×S:
//   stage 1..4   conv 3×3 pad 1 (→ w, 2w, 4w, 8w; no bias) · BN+ReLU · max-pool 2×2/2      S → S/16
//   stage 5      conv 3×3 pad 1 (8w → 8w) · BN+ReLU                                        (6×6 at 96 px)
//   avgpool (global) · dropout (ModelOptions::dropout) · fc Linear(8w → K)
// Why this shape: a tile classifier needs texture and nuclear detail more than large-scale layout, so five
// single-conv stages (receptive field 78 px at the last conv) with channels doubling as the map halves keep
// the per-stage cost flat (≈ 85 MFLOP each for stages 2–4 at 96 px) and the whole net under a tenth of
// ResNet-18's cost at the same size; batch norm after every conv lets it train at large rates in few epochs.
// At 96 px, w = 32, 3 channels, 2 classes: 979,746 parameters and 313 MFLOP per image forward (ResNet-18: 670
// MFLOP at 96 px), so a training step of 64 tiles is ≈ 60 GFLOP — a fraction of a second on two cores.
// Minimum input 16 px; any larger size works (global pooling).
//
// Names, as this plain torch.nn module (the Sequential indices of fused ReLUs and of pools stay reserved):
//   features = nn.Sequential(conv(C,w), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2),        # 0 1 2 3
//                            conv(w,2w), BN, ReLU, MaxPool, conv(2w,4w), BN, ReLU, MaxPool,   # 4 … 11
//                            conv(4w,8w), BN, ReLU, MaxPool, conv(8w,8w), BN, ReLU)           # 12 … 18
//   avgpool = nn.AdaptiveAvgPool2d(1); dropout = nn.Dropout(p); fc = nn.Linear(8w, K)
//   with conv(i, o) = nn.Conv2d(i, o, 3, padding=1, bias=False)
// so features.0.weight, features.1.running_mean, ..., features.16.weight, features.17.*, fc.weight, fc.bias.
//
// tiny_cnn: conv1 3×3 pad 1 (C → 4, no bias) · bn1+ReLU · avgpool (global) · fc Linear(4 → K).
//
// Initialisation as torchvision's ResNet: convs kaiming_normal_(fan_out, relu), BN 1/0, fc PyTorch's default.
#pragma once

#include <memory>

#include "engine/models/model.h"

namespace tessera::engine {

std::unique_ptr<Model> build_compact(const ModelOptions& options);
std::unique_ptr<Model> build_tiny_cnn(const ModelOptions& options);

}  // namespace tessera::engine
