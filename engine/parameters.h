// Learnable parameters and persistent buffers of a model, in PyTorch names and layouts.
//
// This is the contract between the layers (which read `value` and write `grad`), the optimizers (which read
// `grad` and update `value`), the distributed strategies (which average `value` or `grad` across ranks) and the
// checkpoints (which store `value` under `/params/<name>` and `/buffers/<name>`). Values are plain float32
// arrays in PyTorch's layout — convolution weights O×I×H×W, linear weights [out, in], biases and batch-norm
// vectors [C] — so a checkpoint maps one-to-one onto a torchvision `state_dict`. Layers that run in oneDNN's
// blocked layouts reorder weights at their edges; the master copy is always this plain one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::engine {

// What a parameter is, for the rules that treat kinds differently: weight decay and LARS skip biases and
// batch-norm affine parameters (the usual large-batch practice), and initialisation differs per kind.
enum class ParamKind {
  conv_weight,    // O×I×kH×kW
  linear_weight,  // [out, in]
  bias,           // [C] of a convolution or linear layer
  norm_weight,    // batch-norm gamma [C]
  norm_bias,      // batch-norm beta [C]
};

struct Param {
  std::string name;  // full PyTorch name, e.g. "layer1.0.conv1.weight"
  ParamKind kind = ParamKind::conv_weight;
  std::vector<std::int64_t> shape;  // PyTorch shape
  std::vector<float> value;         // size = product of shape
  std::vector<float> grad;          // same size; layers accumulate into it, the optimizer step reads it

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  // Weight decay and LARS apply to convolution and linear weights only.
  bool decayed() const { return kind == ParamKind::conv_weight || kind == ParamKind::linear_weight; }
};

// Persistent non-learnable state: batch-norm running_mean / running_var (float32 [C]).
struct Buffer {
  std::string name;  // e.g. "bn1.running_mean"
  std::vector<std::int64_t> shape;
  std::vector<float> value;
};

}  // namespace tessera::engine
