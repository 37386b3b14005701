#include "engine/models/vgg.h"

#include <string>
#include <utility>
#include <vector>

#include "engine/layers/batchnorm.h"
#include "engine/layers/conv.h"
#include "engine/layers/dropout.h"
#include "engine/layers/linear.h"
#include "engine/layers/pool.h"
#include "engine/layers/relu.h"
#include "engine/models/adaptive_pool.h"
#include "engine/models/init.h"

namespace tessera::engine {
namespace {

constexpr int pool_marker = 0;  // "M" in a configuration
constexpr int pooled_size = 7;  // the adaptive pool's output edge
constexpr int last_channels = 512;

const std::vector<int> config_a = {64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0};
const std::vector<int> config_d = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};

std::unique_ptr<Model> build_vgg(const ModelOptions& options, const std::vector<int>& config, bool batch_norm) {
  auto model = std::make_unique<Model>("VGG", options);
  auto features = std::make_unique<Sequential>("features");
  // Indices as torchvision's Sequential: a fused ReLU still takes its place.
  int index = 0;
  const auto next = [&](int taken) {
    const std::string name = "features." + std::to_string(index);
    index += taken;
    return name;
  };
  int in = options.channels;
  for (const int v : config) {
    if (v == pool_marker) {
      features->add(std::make_unique<MaxPool2d>(next(1), Pool2dOptions{.kernel = 2, .stride = 2}));
      continue;
    }
    const Conv2dOptions conv{
        .in = in, .out = v, .kernel = 3, .stride = 1, .padding = 1, .bias = true, .relu = !batch_norm};
    if (batch_norm) {
      features->add(std::make_unique<Conv2d>(next(1), conv));
      features->add(std::make_unique<BatchNorm2d>(next(2), v, BatchNorm2dOptions{.relu = true}));
    } else {
      features->add(std::make_unique<Conv2d>(next(2), conv));
    }
    in = v;
  }
  Sequential& body = model->body();
  body.add(std::move(features));
  body.add(std::make_unique<AdaptiveAvgPool2dTo>("avgpool", pooled_size, pooled_size));

  const int hidden = options.classifier_width;
  auto classifier = std::make_unique<Sequential>("classifier");
  const auto at = [](int i) { return "classifier." + std::to_string(i); };
  classifier->add(
      std::make_unique<Linear>(at(0), LinearOptions{.in = last_channels * pooled_size * pooled_size, .out = hidden}));
  classifier->add(std::make_unique<ReLU>(at(1)));
  // Without dropout its index stays unused, so the names stay torchvision's.
  if (options.dropout > 0.0f) classifier->add(std::make_unique<Dropout>(at(2), options.dropout));
  classifier->add(std::make_unique<Linear>(at(3), LinearOptions{.in = hidden, .out = hidden}));
  classifier->add(std::make_unique<ReLU>(at(4)));
  if (options.dropout > 0.0f) classifier->add(std::make_unique<Dropout>(at(5), options.dropout));
  classifier->add(std::make_unique<Linear>(at(6), LinearOptions{.in = hidden, .out = options.num_classes}));
  body.add(std::move(classifier));

  initialize(model->parameters(), {ConvInit::kaiming_normal_fan_out, LinearInit::normal_0_01}, options.seed);
  return model;
}

}  // namespace

std::unique_ptr<Model> build_vgg11(const ModelOptions& options) { return build_vgg(options, config_a, false); }
std::unique_ptr<Model> build_vgg11_bn(const ModelOptions& options) { return build_vgg(options, config_a, true); }
std::unique_ptr<Model> build_vgg16(const ModelOptions& options) { return build_vgg(options, config_d, false); }
std::unique_ptr<Model> build_vgg16_bn(const ModelOptions& options) { return build_vgg(options, config_d, true); }

}  // namespace tessera::engine
