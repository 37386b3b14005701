#include "engine/models/resnet.h"

#include <utility>

#include "core/error.h"
#include "engine/layers/global_pool.h"
#include "engine/layers/linear.h"
#include "engine/layers/pool.h"
#include "engine/models/init.h"

namespace tessera::engine {

using dnnl::memory;

ResidualBlock::ResidualBlock(std::string name, int in, const std::vector<PathConv>& path, int stride)
    : Block(std::move(name)), in_(in), join_(this->name(), true), grad_sum_(this->name() + " gradient sum") {
  if (path.empty()) throw core::InternalError("residual block '" + this->name() + "': empty main path");
  int channels = in;
  for (std::size_t k = 0; k < path.size(); ++k) {
    const std::string index = std::to_string(k + 1);
    convs_.push_back(std::make_unique<Conv2d>(child_name("conv" + index), Conv2dOptions{.in = channels,
                                                                                        .out = path[k].out,
                                                                                        .kernel = path[k].kernel,
                                                                                        .stride = path[k].stride,
                                                                                        .padding = path[k].kernel / 2,
                                                                                        .bias = false}));
    // Every ReLU of the main path but the last is fused into its batch norm; the last follows the addition.
    bns_.push_back(std::make_unique<BatchNorm2d>(child_name("bn" + index), path[k].out,
                                                 BatchNorm2dOptions{.relu = k + 1 < path.size()}));
    channels = path[k].out;
  }
  if (stride != 1 || in != channels) {
    downsample_ = std::make_unique<Sequential>(child_name("downsample"));
    downsample_->emplace<Conv2d>(
        Conv2dOptions{.in = in, .out = channels, .kernel = 1, .stride = stride, .bias = false});
    downsample_->emplace<BatchNorm2d>(channels);
  }
}

void ResidualBlock::set_mode(Mode mode) {
  Module::set_mode(mode);
  for (auto& c : convs_) c->set_mode(mode);
  for (auto& b : bns_) b->set_mode(mode);
  if (downsample_) downsample_->set_mode(mode);
}

void ResidualBlock::set_propagate_down(bool propagate) {
  Module::set_propagate_down(propagate);
  convs_.front()->set_propagate_down(propagate);
  if (downsample_) downsample_->set_propagate_down(propagate);
}

void ResidualBlock::collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) {
  for (std::size_t k = 0; k < convs_.size(); ++k) {
    convs_[k]->collect(params, buffers);
    bns_[k]->collect(params, buffers);
  }
  if (downsample_) downsample_->collect(params, buffers);
}

std::vector<Module*> ResidualBlock::children() {
  std::vector<Module*> children;
  for (std::size_t k = 0; k < convs_.size(); ++k) {
    children.push_back(convs_[k].get());
    children.push_back(bns_[k].get());
  }
  if (downsample_) children.push_back(downsample_.get());
  return children;
}

bool ResidualBlock::trace(FeatureShape& shape, LayerCost& cost, std::string& why) const {
  FeatureShape main = shape;
  for (std::size_t k = 0; k < convs_.size(); ++k) {
    if (!trace_module(*convs_[k], main, cost, why) || !trace_module(*bns_[k], main, cost, why)) return false;
  }
  FeatureShape shortcut = shape;
  if (downsample_ && !trace_module(*downsample_, shortcut, cost, why)) return false;
  if (main != shortcut) {
    why = "'" + name() + "' (" + type() + "): the main path gives " + main.text() + ", the shortcut " + shortcut.text();
    return false;
  }
  shape = main;
  return true;
}

memory::desc ResidualBlock::do_setup(const memory::desc& src) {
  memory::desc main = src;
  for (std::size_t k = 0; k < convs_.size(); ++k) main = bns_[k]->setup(convs_[k]->setup(main));
  const memory::desc shortcut = downsample_ ? downsample_->setup(src) : src;
  return join_.setup(main, shortcut);
}

const Tensor& ResidualBlock::do_forward(const Tensor& src) {
  const Tensor* main = &src;
  for (std::size_t k = 0; k < convs_.size(); ++k) main = &bns_[k]->forward(convs_[k]->forward(*main));
  const Tensor& shortcut = downsample_ ? downsample_->forward(src) : src;
  return join_.forward(*main, shortcut);
}

const Tensor& ResidualBlock::do_backward(const Tensor& diff_dst) {
  // g reaches both branches; it stays valid (owned by join_) until join_'s next backward.
  const Tensor& g = join_.backward(diff_dst);
  const Tensor* main = &g;
  for (std::size_t k = convs_.size(); k-- > 0;) main = &convs_[k]->backward(bns_[k]->backward(*main));
  const Tensor& shortcut = downsample_ ? downsample_->backward(g) : g;
  if (!propagate_down()) return no_tensor();
  return grad_sum_.forward(*main, shortcut);
}

BasicBlock::BasicBlock(std::string name, int in, int planes, int stride)
    : ResidualBlock(std::move(name), in, {{planes, 3, stride}, {planes, 3, 1}}, stride) {}

Bottleneck::Bottleneck(std::string name, int in, int planes, int stride)
    : ResidualBlock(std::move(name), in, {{planes, 1, 1}, {planes, 3, stride}, {planes * expansion, 1, 1}}, stride) {}

std::unique_ptr<Model> build_resnet(const ModelOptions& options, const ResNetSpec& spec) {
  if (spec.blocks.empty() || spec.width < 1) throw core::InternalError("resnet: needs at least one stage and width");
  auto model = std::make_unique<Model>("ResNet", options);
  Sequential& body = model->body();
  const int width = spec.width;
  body.add(std::make_unique<Conv2d>(
      "conv1",
      Conv2dOptions{.in = options.channels, .out = width, .kernel = 7, .stride = 2, .padding = 3, .bias = false}));
  body.add(std::make_unique<BatchNorm2d>("bn1", width, BatchNorm2dOptions{.relu = true}));
  body.add(std::make_unique<MaxPool2d>("maxpool", Pool2dOptions{.kernel = 3, .stride = 2, .padding = 1}));
  int in = width;
  for (std::size_t stage = 0; stage < spec.blocks.size(); ++stage) {
    const int planes = width << stage;
    const int stride = stage == 0 ? 1 : 2;
    auto layer = std::make_unique<Sequential>("layer" + std::to_string(stage + 1));
    for (int b = 0; b < spec.blocks[stage]; ++b) {
      const int s = b == 0 ? stride : 1;
      if (spec.bottleneck) {
        layer->add(std::make_unique<Bottleneck>(layer->next_name(), in, planes, s));
        in = planes * Bottleneck::expansion;
      } else {
        layer->add(std::make_unique<BasicBlock>(layer->next_name(), in, planes, s));
        in = planes * BasicBlock::expansion;
      }
    }
    body.add(std::move(layer));
  }
  body.add(std::make_unique<AdaptiveAvgPool2d>("avgpool"));
  body.add(std::make_unique<Linear>("fc", LinearOptions{.in = in, .out = options.num_classes}));
  initialize(model->parameters(), {ConvInit::kaiming_normal_fan_out, LinearInit::pytorch_default}, options.seed);
  return model;
}

std::unique_ptr<Model> build_resnet18(const ModelOptions& options) {
  return build_resnet(options, {.bottleneck = false, .blocks = {2, 2, 2, 2}});
}

std::unique_ptr<Model> build_resnet34(const ModelOptions& options) {
  return build_resnet(options, {.bottleneck = false, .blocks = {3, 4, 6, 3}});
}

std::unique_ptr<Model> build_resnet50(const ModelOptions& options) {
  return build_resnet(options, {.bottleneck = true, .blocks = {3, 4, 6, 3}});
}

}  // namespace tessera::engine
