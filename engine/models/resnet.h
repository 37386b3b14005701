// ResNet (torchvision's resnet18 / resnet34 / resnet50, "v1.5": the stride of a bottleneck is on its 3×3 conv).
//
//   conv1 7×7/2 (C→64, no bias) · bn1+ReLU · maxpool 3×3/2 pad 1                      S → S/4
//   layer1 … layer4: blocks of `planes` 64, 128, 256, 512; the first block of layer2..4 has stride 2
//   avgpool (global, → N×512·e) · fc (512·e → K)                                       e = block expansion
//
//   BasicBlock (e = 1), input x with `in` channels:
//     y = ReLU( bn2(conv2_3×3(ReLU(bn1(conv1_3×3/s(x))))) + S(x) )
//   Bottleneck (e = 4):
//     y = ReLU( bn3(conv3_1×1(ReLU(bn2(conv2_3×3/s(ReLU(bn1(conv1_1×1(x)))))))) + S(x) )
//   S(x) = x, or downsample = (1×1/s conv, no bias) · BN when s ≠ 1 or in ≠ planes·e.
//
// Names are torchvision's: conv1.weight, bn1.{weight,bias,running_mean,running_var}, layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, layer2.0.downsample.1.running_var, fc.weight, fc.bias. Convolutions have no
// bias (the batch norm after each would cancel it); every ReLU is fused into the batch norm before it, the
// block's last one into the residual addition (engine/layers/add.h).
//
// Backward of a block, with g the gradient at the join: the main path and the shortcut each take g, and their
// two gradients with respect to x are summed (identity shortcut: g itself).
//
// Initialisation as torchvision: convs kaiming_normal_(fan_out, relu), BN weight 1 and bias 0, fc PyTorch's
// default (zero_init_residual off). Parameters at 1000 classes: resnet18 11,689,512; resnet34 21,797,672;
// resnet50 25,557,032. Forward at 224 px: 3.63, 7.33 and 8.18 GFLOP per image (at 96 px: ×0.18).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/layers/add.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/conv.h"
#include "engine/models/model.h"

namespace tessera::engine {

// A residual block: a main path of conv→BN pairs (ReLU fused into every BN but the last), an identity or
// 1×1-conv+BN shortcut, the addition with the final ReLU. BasicBlock and Bottleneck fix the main path.
class ResidualBlock : public Block {
 public:
  void set_mode(Mode mode) override;
  void set_propagate_down(bool propagate) override;
  void collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) override;
  bool trace(FeatureShape& shape, LayerCost& cost, std::string& why) const override;
  std::vector<Module*> children() override;

  int in_channels() const { return in_; }
  int out_channels() const { return convs_.back()->options().out; }
  std::size_t depth() const { return convs_.size(); }
  Conv2d& conv(std::size_t i) { return *convs_.at(i); }
  BatchNorm2d& bn(std::size_t i) { return *bns_.at(i); }
  // nullptr for an identity shortcut.
  Sequential* downsample() { return downsample_.get(); }
  // main + shortcut, then ReLU (int8 inference sets its scale, calibration watches it).
  ResidualAdd& join() { return join_; }

 protected:
  // One main-path convolution: output channels, kernel (padding kernel/2), stride.
  struct PathConv {
    int out = 0;
    int kernel = 3;
    int stride = 1;
  };
  // The shortcut gets a downsample when `stride` ≠ 1 or the path changes the channel count.
  ResidualBlock(std::string name, int in, const std::vector<PathConv>& path, int stride);

  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  int in_;
  std::vector<std::unique_ptr<Conv2d>> convs_;
  std::vector<std::unique_ptr<BatchNorm2d>> bns_;
  std::unique_ptr<Sequential> downsample_;
  ResidualAdd join_;      // main + shortcut, then ReLU
  ResidualAdd grad_sum_;  // backward: the two gradients that reach x
};

class BasicBlock : public ResidualBlock {
 public:
  static constexpr int expansion = 1;
  BasicBlock(std::string name, int in, int planes, int stride);
  std::string type() const override { return "BasicBlock"; }
};

class Bottleneck : public ResidualBlock {
 public:
  static constexpr int expansion = 4;
  Bottleneck(std::string name, int in, int planes, int stride);
  std::string type() const override { return "Bottleneck"; }
};

// A ResNet of any depth: blocks per stage (torchvision: 4 stages) and the planes of the first stage (doubled at
// each later one). Tests use small ones, e.g. {.blocks = {1, 1}, .width = 4}.
struct ResNetSpec {
  bool bottleneck = false;
  std::vector<int> blocks = {2, 2, 2, 2};
  int width = 64;
};

std::unique_ptr<Model> build_resnet(const ModelOptions& options, const ResNetSpec& spec);
std::unique_ptr<Model> build_resnet18(const ModelOptions& options);
std::unique_ptr<Model> build_resnet34(const ModelOptions& options);
std::unique_ptr<Model> build_resnet50(const ModelOptions& options);

}  // namespace tessera::engine
