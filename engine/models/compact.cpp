#include "engine/models/compact.h"

#include <string>
#include <utility>

#include "engine/layers/batchnorm.h"
#include "engine/layers/conv.h"
#include "engine/layers/dropout.h"
#include "engine/layers/global_pool.h"
#include "engine/layers/linear.h"
#include "engine/layers/pool.h"
#include "engine/models/init.h"

namespace tessera::engine {
namespace {

constexpr int stages = 5;
constexpr int pooled_stages = 4;                       // the last stage keeps its map
constexpr int width_factor[stages] = {1, 2, 4, 8, 8};  // stage channels in units of the width
constexpr int tiny_channels = 4;                       // as scripts/torch_checkpoint.py's TinyCNN

Conv2dOptions conv3x3(int in, int out) {
  return {.in = in, .out = out, .kernel = 3, .stride = 1, .padding = 1, .bias = false};
}

}  // namespace

std::unique_ptr<Model> build_compact(const ModelOptions& options) {
  auto model = std::make_unique<Model>("CompactCNN", options);
  auto features = std::make_unique<Sequential>("features");
  int index = 0;
  int in = options.channels;
  for (int stage = 0; stage < stages; ++stage) {
    const int out = options.width * width_factor[stage];
    features->add(std::make_unique<Conv2d>("features." + std::to_string(index), conv3x3(in, out)));
    features->add(
        std::make_unique<BatchNorm2d>("features." + std::to_string(index + 1), out, BatchNorm2dOptions{.relu = true}));
    index += 3;  // conv, BN, ReLU (fused)
    if (stage < pooled_stages) {
      features->add(std::make_unique<MaxPool2d>("features." + std::to_string(index), Pool2dOptions{.kernel = 2}));
      ++index;
    }
    in = out;
  }
  Sequential& body = model->body();
  body.add(std::move(features));
  body.add(std::make_unique<AdaptiveAvgPool2d>("avgpool"));
  if (options.dropout > 0.0f) body.add(std::make_unique<Dropout>("dropout", options.dropout));
  body.add(std::make_unique<Linear>("fc", LinearOptions{.in = in, .out = options.num_classes}));
  initialize(model->parameters(), {ConvInit::kaiming_normal_fan_out, LinearInit::pytorch_default}, options.seed);
  return model;
}

std::unique_ptr<Model> build_tiny_cnn(const ModelOptions& options) {
  auto model = std::make_unique<Model>("TinyCNN", options);
  Sequential& body = model->body();
  body.add(std::make_unique<Conv2d>("conv1", conv3x3(options.channels, tiny_channels)));
  body.add(std::make_unique<BatchNorm2d>("bn1", tiny_channels, BatchNorm2dOptions{.relu = true}));
  body.add(std::make_unique<AdaptiveAvgPool2d>("avgpool"));
  body.add(std::make_unique<Linear>("fc", LinearOptions{.in = tiny_channels, .out = options.num_classes}));
  initialize(model->parameters(), {ConvInit::kaiming_normal_fan_out, LinearInit::pytorch_default}, options.seed);
  return model;
}

}  // namespace tessera::engine
