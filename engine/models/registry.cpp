#include "engine/models/registry.h"

#include <cmath>

#include <fmt/format.h>

#include "core/config.h"
#include "core/error.h"
#include "engine/models/alexnet.h"
#include "engine/models/compact.h"
#include "engine/models/lenet.h"
#include "engine/models/resnet.h"
#include "engine/models/vgg.h"

namespace tessera::engine {
namespace {

constexpr ModelEntry models[] = {
    {"lenet5", "LeNet-5 with ReLU and max-pooling, classic at 32 px", &build_lenet5},
    {"alexnet", "AlexNet (torchvision), 61 M parameters at 1000 classes, inputs from 63 px", &build_alexnet,
     ModelSize::classifier_width},
    {"vgg11", "VGG-11 (torchvision), configuration A", &build_vgg11, ModelSize::classifier_width},
    {"vgg11_bn", "VGG-11 with batch normalization", &build_vgg11_bn, ModelSize::classifier_width},
    {"vgg16", "VGG-16 (torchvision), configuration D", &build_vgg16, ModelSize::classifier_width},
    {"vgg16_bn", "VGG-16 with batch normalization", &build_vgg16_bn, ModelSize::classifier_width},
    {"resnet18", "ResNet-18 (torchvision), basic blocks", &build_resnet18},
    {"resnet34", "ResNet-34 (torchvision), basic blocks", &build_resnet34},
    {"resnet50", "ResNet-50 (torchvision v1.5), bottleneck blocks", &build_resnet50},
    {"compact", "Tessera's compact CNN for small tiles: 5 conv-BN-ReLU stages, 313 MFLOP at 96 px", &build_compact,
     ModelSize::width},
    {"tiny_cnn", "one conv, BN, global pool and linear layer, for tests and smoke runs", &build_tiny_cnn},
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

void require(bool ok, const char* key, const std::string& message) {
  if (!ok) throw core::ConfigError(message, "", 0, key);
}

}  // namespace

std::span<const ModelEntry> model_registry() { return models; }

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& entry : models) names.emplace_back(entry.name);
  return names;
}

const ModelEntry& model_entry(const std::string& architecture) {
  for (const auto& entry : models) {
    if (architecture == entry.name) return entry;
  }
  const std::vector<std::string> names = model_names();
  std::string message = "unknown model architecture '" + architecture + "' (known: " + join(names) + ")";
  if (const std::string guess = core::closest_match(architecture, names); !guess.empty()) {
    message += "; did you mean '" + guess + "'?";
  }
  throw core::ConfigError(message, "", 0, "model.architecture");
}

std::unique_ptr<Model> make_model(const ModelOptions& options) {
  const ModelEntry& entry = model_entry(options.architecture);
  require(options.input_size >= 1, "model.input_size",
          "input size must be at least 1 px, got " + std::to_string(options.input_size));
  require(options.num_classes >= 1, "model.num_classes",
          "the number of classes must be at least 1, got " + std::to_string(options.num_classes));
  require(options.channels >= 1, "model.channels",
          "the number of input channels must be at least 1, got " + std::to_string(options.channels));
  require(std::isfinite(options.dropout) && options.dropout >= 0.0f && options.dropout < 1.0f, "model.dropout",
          "dropout must be in [0, 1), got " + std::to_string(options.dropout));
  require(options.width >= 1 && options.width <= kMaxModelWidth, "model.width",
          fmt::format("width must be in [1, {}], got {}", kMaxModelWidth, options.width));
  require(options.classifier_width >= 1 && options.classifier_width <= kMaxClassifierWidth, "model.classifier_width",
          fmt::format("classifier_width must be in [1, {}], got {}", kMaxClassifierWidth, options.classifier_width));
  std::unique_ptr<Model> model = entry.build(options);
  model->layers(options.input_size);  // throws, naming the layer, when the input is too small
  model->reseed(options.seed);
  model->set_propagate_down(false);
  return model;
}

void describe_model(const ModelOptions& options, io::CheckpointMeta& meta) {
  const ModelSize size = model_entry(options.architecture).size;
  meta.architecture = options.architecture;
  meta.input_size = options.input_size;
  meta.num_classes = options.num_classes;
  meta.width.reset();
  meta.classifier_width.reset();
  if (size == ModelSize::width) meta.width = options.width;
  if (size == ModelSize::classifier_width) meta.classifier_width = options.classifier_width;
}

ModelOptions checkpoint_model_options(const io::CheckpointMeta& meta) {
  ModelOptions o;
  o.architecture = meta.architecture;
  o.input_size = static_cast<int>(meta.input_size);
  o.num_classes = static_cast<int>(meta.num_classes);
  if (meta.width) o.width = static_cast<int>(*meta.width);
  if (meta.classifier_width) o.classifier_width = static_cast<int>(*meta.classifier_width);
  return o;
}

std::string other_model_size(const io::CheckpointMeta& meta, const ModelOptions& job) {
  const ModelOptions saved = checkpoint_model_options(meta);
  if (saved.architecture != job.architecture) return "";
  switch (model_entry(job.architecture).size) {
    case ModelSize::width:
      if (saved.width == job.width) return "";
      return fmt::format("a {} of width {}, and the job trains one of width {} (model.width)", job.architecture,
                         saved.width, job.width);
    case ModelSize::classifier_width:
      if (saved.classifier_width == job.classifier_width) return "";
      return fmt::format(
          "a {} with a classifier of width {}, and the job trains one of width {} "
          "(model.classifier_width)",
          job.architecture, saved.classifier_width, job.classifier_width);
    case ModelSize::none:
      break;
  }
  return "";
}

}  // namespace tessera::engine
