#include "engine/models/alexnet.h"

#include <string>
#include <utility>

#include "engine/layers/conv.h"
#include "engine/layers/dropout.h"
#include "engine/layers/linear.h"
#include "engine/layers/pool.h"
#include "engine/layers/relu.h"
#include "engine/models/adaptive_pool.h"
#include "engine/models/init.h"

namespace tessera::engine {
namespace {

constexpr int pooled_size = 6;  // the adaptive pool's output edge
constexpr int last_channels = 256;

}  // namespace

std::unique_ptr<Model> build_alexnet(const ModelOptions& options) {
  auto model = std::make_unique<Model>("AlexNet", options);
  const auto feature = [](int i) { return "features." + std::to_string(i); };
  const auto conv = [&](int i, int in, int out, int kernel, int stride, int padding) {
    return std::make_unique<Conv2d>(
        feature(i),
        Conv2dOptions{
            .in = in, .out = out, .kernel = kernel, .stride = stride, .padding = padding, .bias = true, .relu = true});
  };
  const auto pool = [&](int i) {
    return std::make_unique<MaxPool2d>(feature(i), Pool2dOptions{.kernel = 3, .stride = 2});
  };
  auto features = std::make_unique<Sequential>("features");
  features->add(conv(0, options.channels, 64, 11, 4, 2));
  features->add(pool(2));
  features->add(conv(3, 64, 192, 5, 1, 2));
  features->add(pool(5));
  features->add(conv(6, 192, 384, 3, 1, 1));
  features->add(conv(8, 384, 256, 3, 1, 1));
  features->add(conv(10, 256, last_channels, 3, 1, 1));
  features->add(pool(12));

  const int hidden = options.classifier_width;
  const auto at = [](int i) { return "classifier." + std::to_string(i); };
  auto classifier = std::make_unique<Sequential>("classifier");
  // Without dropout its indices stay unused, so the names stay torchvision's.
  if (options.dropout > 0.0f) classifier->add(std::make_unique<Dropout>(at(0), options.dropout));
  classifier->add(
      std::make_unique<Linear>(at(1), LinearOptions{.in = last_channels * pooled_size * pooled_size, .out = hidden}));
  classifier->add(std::make_unique<ReLU>(at(2)));
  if (options.dropout > 0.0f) classifier->add(std::make_unique<Dropout>(at(3), options.dropout));
  classifier->add(std::make_unique<Linear>(at(4), LinearOptions{.in = hidden, .out = hidden}));
  classifier->add(std::make_unique<ReLU>(at(5)));
  classifier->add(std::make_unique<Linear>(at(6), LinearOptions{.in = hidden, .out = options.num_classes}));

  Sequential& body = model->body();
  body.add(std::move(features));
  body.add(std::make_unique<AdaptiveAvgPool2dTo>("avgpool", pooled_size, pooled_size));
  body.add(std::move(classifier));
  initialize(model->parameters(), {ConvInit::pytorch_default, LinearInit::pytorch_default}, options.seed);
  return model;
}

}  // namespace tessera::engine
