// The one list of model architectures (docs/ARCHITECTURE.md "Conventions": explicit registries): name → builder. No
// static self-registration: a new model is one line in registry.cpp.
//
//   lenet5      LeNet-5 (ReLU, max-pool), classic at 32 px             lenet.h
//   alexnet     torchvision's AlexNet                                   alexnet.h
//   vgg11, vgg11_bn, vgg16, vgg16_bn   torchvision's VGG                vgg.h
//   resnet18, resnet34, resnet50       torchvision's ResNet             resnet.h
//   compact     Tessera's fast tile classifier (≈ 96 px)                compact.h
//   tiny_cnn    conv + BN + pool + linear, for tests and smoke runs     compact.h
//
// make_model checks the options (each a ConfigError on its key "model.<field>": an unknown architecture lists
// the known ones, an input too small names the layer and the smallest size), builds the model with its
// parameters initialised from options.seed, seeds its dropout layers, and leaves it in train mode with
// propagate_down false (nobody needs dL/d(image)).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/models/model.h"

namespace tessera::engine {

// Which size of ModelOptions an architecture is built with: compact's `width` (its stages' channels), AlexNet's and
// VGG's `classifier_width` (hidden units); the others have fixed shapes and ignore both.
enum class ModelSize { none, width, classifier_width };

struct ModelEntry {
  const char* name;
  const char* doc;
  std::unique_ptr<Model> (*build)(const ModelOptions& options);
  ModelSize size = ModelSize::none;
};

std::span<const ModelEntry> model_registry();
std::vector<std::string> model_names();
// The entry of `architecture`; an unknown name is a ConfigError on "model.architecture" listing the known ones.
const ModelEntry& model_entry(const std::string& architecture);

std::unique_ptr<Model> make_model(const ModelOptions& options);

}  // namespace tessera::engine
