#include "engine/models/lenet.h"

#include <string>

#include "core/error.h"
#include "engine/layers/conv.h"
#include "engine/layers/linear.h"
#include "engine/layers/pool.h"
#include "engine/layers/relu.h"
#include "engine/models/init.h"

namespace tessera::engine {
namespace {

constexpr int kernel = 5;
constexpr int minimum_input = 16;  // the smallest S with s = ⌊(⌊(S−4)/2⌋−4)/2⌋ ≥ 1

}  // namespace

std::unique_ptr<Model> build_lenet5(const ModelOptions& options) {
  const int s = ((options.input_size - (kernel - 1)) / 2 - (kernel - 1)) / 2;
  if (options.input_size < minimum_input || s < 1) {
    throw core::ConfigError("lenet5 cannot take a " + std::to_string(options.input_size) +
                                " px input (the smallest input it takes is " + std::to_string(minimum_input) + " px)",
                            "", 0, "model.input_size");
  }
  auto model = std::make_unique<Model>("LeNet", options);
  Sequential& body = model->body();
  const Pool2dOptions pool{.kernel = 2, .stride = 2};
  body.add(std::make_unique<Conv2d>(
      "conv1", Conv2dOptions{.in = options.channels, .out = 6, .kernel = kernel, .bias = true, .relu = true}));
  body.add(std::make_unique<MaxPool2d>("pool1", pool));
  body.add(std::make_unique<Conv2d>("conv2",
                                    Conv2dOptions{.in = 6, .out = 16, .kernel = kernel, .bias = true, .relu = true}));
  body.add(std::make_unique<MaxPool2d>("pool2", pool));
  body.add(std::make_unique<Linear>("fc1", LinearOptions{.in = 16 * s * s, .out = 120}));
  body.add(std::make_unique<ReLU>("relu3"));
  body.add(std::make_unique<Linear>("fc2", LinearOptions{.in = 120, .out = 84}));
  body.add(std::make_unique<ReLU>("relu4"));
  body.add(std::make_unique<Linear>("fc3", LinearOptions{.in = 84, .out = options.num_classes}));
  initialize(model->parameters(), {ConvInit::pytorch_default, LinearInit::pytorch_default}, options.seed);
  return model;
}

}  // namespace tessera::engine
