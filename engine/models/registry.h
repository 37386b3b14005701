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
//
// An architecture's entry also says which size of ModelOptions it is built with (ModelSize); describe_model and
// checkpoint_model_options carry the options to and from a checkpoint's /meta, where that size is recorded.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/models/model.h"
#include "io/checkpoint.h"

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

// The model in /meta: architecture, input size, classes, and the size its architecture is built with (width for
// compact, classifier_width for AlexNet and VGG, left unset for the others: ModelSize above). ConfigError
// on "model.architecture" for an architecture the registry does not have.
void describe_model(const ModelOptions& options, io::CheckpointMeta& meta);
// And back: the options the checkpoint's model is built with (seed, channels and dropout as ModelOptions' defaults).
// A size /meta does not record (a file written before it was, or converted without it) is the default: width 32,
// classifier_width 4096.
ModelOptions checkpoint_model_options(const io::CheckpointMeta& meta);
// How the checkpoint's model differs in size from the job's of the same architecture, for a message that goes on
// from "holds " ("a compact of width 8, and the job trains one of width 32 (model.width)"); "" when it does not (or
// the architectures differ, which the caller reports).
std::string other_model_size(const io::CheckpointMeta& meta, const ModelOptions& job);

}  // namespace tessera::engine
