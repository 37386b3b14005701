// A whole classifier: a Module from an image batch N×C×H×W to logits N×K, with PyTorch state_dict names.
//
//   auto model = make_model({.architecture = "resnet18", .input_size = 96, .num_classes = 2});  // registry.h
//   const Tensor& logits = model->forward(batch);     // batch: N×C×H×W, any layout (plain nchw is usual)
//   model->backward(diff_logits);                     // Param::grad += dL/dθ for every parameter
//
// A Model owns one Sequential, its body, whose children are named exactly as torchvision's modules ("conv1",
// "layer1", "features", "classifier", ...), so collect() yields torchvision's state_dict names and shapes
// (`layer1.0.conv1.weight`, `bn1.running_mean`, `features.0.weight`, `fc.bias`). BatchNorm's
// `num_batches_tracked` buffer is not kept: it only matters for momentum=None, which Tessera does not use
// (scripts/torch_checkpoint.py drops it on export and recreates it on import).
//
// Edges: the input may come in any layout (the first convolution reorders it into its own); the logits leave
// in plain nc order (dst_desc() is plain), and every layer in between keeps the layout its producer chose.
// The gradient of the image is not computed (propagate_down is false) unless asked for with
// set_propagate_down(true).
//
// Accounting, from the module objects and an input size alone (no primitives are built):
//   flops(S)  multiply-adds of convolutions and linear layers counted as 2 FLOPs, per image, forward, for an
//             S×S input. Batch norm, ReLU, pooling and residual additions are not counted (under 1 % for every
//             model here). A training step costs about 3× (forward, backward data, backward weights).
//   layers(S) one row per top-level module, with Sequentials (`features`, `layer1`) opened one level: name,
//             type, per-image output shape, parameters, FLOPs; summary() prints them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/module.h"
#include "engine/parameters.h"
#include "engine/sequential.h"
#include "engine/tensor.h"

namespace tessera::engine {

class BatchNorm2d;

// The largest model sizes Tessera builds: the train keys, make_model and a checkpoint's /meta (through load_model) are
// bounded by these, so a corrupt size is refused instead of allocating a model of terabytes.
inline constexpr int kMaxModelWidth = 1024;        // model.width; the compact CNN's last stages have 8 times as many
inline constexpr int kMaxClassifierWidth = 65536;  // model.classifier_width

// What a model is built from. make_model (registry.h) reports a bad value as a ConfigError on "model.<field>".
struct ModelOptions {
  std::string architecture = "resnet18";  // a name of the registry (registry.h)
  int input_size = 224;                   // tile edge in px: checked against the smallest input the model takes;
                                          // LeNet-5 sizes its first linear layer from it (the others take any size)
  int num_classes = 2;                    // K
  int channels = 3;                       // C of the input images
  float dropout = 0.5f;                   // drop probability of the classifier's dropout layers, in [0, 1)
  int width = 32;                         // compact CNN: channels of the first stage (the others are multiples)
  int classifier_width = 4096;            // AlexNet and VGG: hidden units of the classifier (torchvision: 4096)
  std::uint64_t seed = 0;                 // initialisation and dropout masks
};

// Per-image activation shape: C×H×W, or a flat vector of C features (h = w = 0) after pooling or flattening.
struct FeatureShape {
  std::int64_t c = 0, h = 0, w = 0;

  bool flat() const { return h == 0 && w == 0; }
  std::int64_t numel() const { return flat() ? c : c * h * w; }
  std::string text() const;  // "64x56x56" or "512"
  bool operator==(const FeatureShape&) const = default;
};

struct LayerSummary {
  std::string name;  // module name, e.g. "layer1.0" or "features.3"
  std::string type;  // e.g. "BasicBlock", "Conv2d+ReLU"
  FeatureShape output;
  std::int64_t params = 0;
  std::int64_t flops = 0;
};

// Shape and cost of modules, traced without running them.
struct LayerCost {
  std::int64_t params = 0;
  std::int64_t flops = 0;
};
// Advances `shape` through `module` and adds its parameters and FLOPs to `cost`. Returns false (and leaves
// `why` saying which layer) when the input is too small for the module or does not fit it.
bool trace_module(const Module& module, FeatureShape& shape, LayerCost& cost, std::string& why);

// A composite module with a structure other than a chain (a residual block): it traces its own shape and cost.
// Plain chains are Sequentials.
class Block : public Module {
 public:
  using Module::Module;
  virtual bool trace(FeatureShape& shape, LayerCost& cost, std::string& why) const = 0;
  // The child modules in order, where a Conv2d directly followed by a BatchNorm2d means that the batch norm
  // normalises that convolution's output (so the pair can be folded).
  virtual std::vector<Module*> children() = 0;
};

// The children of a Sequential or a Block (empty for a layer).
std::vector<Module*> children_of(Module& module);
// Folds every Conv2d directly followed by a BatchNorm2d among the children of `module`, recursively (the batch
// norms must be in eval mode); see engine/layers/fold.h.
void fold_batchnorm_in(Module& module);

class Model : public Module {
 public:
  // `type`: the family for messages, e.g. "ResNet". The builder fills body() and initialises the parameters.
  Model(std::string type, const ModelOptions& options);

  std::string type() const override { return type_; }
  const ModelOptions& options() const { return options_; }

  using Module::forward;
  // Forward of a plain NCHW batch (n images of C×h×w, values in NCHW order), copied into an input tensor the
  // model keeps for backward. Returns the N×K logits. InternalError when the values do not fill n×C×h×w.
  const Tensor& forward(const std::vector<float>& batch, int n, int h, int w);

  void set_mode(Mode mode) override;
  void set_propagate_down(bool propagate) override;
  void collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) override;
  // collect() split in two, for callers that want only one list.
  std::vector<Param*> parameters();
  std::vector<Buffer*> buffers();

  // Learnable scalars (torchvision's sum of p.numel() over parameters()).
  std::int64_t parameter_count() const;
  // Forward FLOPs per image for an input_size×input_size input (see the header comment).
  std::int64_t flops(int input_size) const;
  // Rows for an input_size×input_size input. Throws ConfigError (key "model.input_size") naming the layer where
  // the input becomes too small, and the smallest input size the model takes.
  std::vector<LayerSummary> layers(int input_size) const;
  // One screen: a header line (architecture, input, classes, parameters, GFLOP) and one line per layers() row
  // at options().input_size.
  std::string summary() const;
  // The smallest square input the model takes (searching up to `limit` px), or 0 when none up to `limit` fits.
  int minimum_input_size(int limit = 1024) const;

  // Inference only: switches to eval mode and folds every conv→BN pair (engine/layers/fold.h), so batch norm
  // costs nothing at run time; eval outputs stay the same up to float rounding. Afterwards the convolutions
  // carry biases (the state dict gains "<conv>.bias" entries), and set_mode(train) is refused.
  void fold_batchnorm();
  bool folded() const { return folded_; }

  // Restarts the masks of every dropout layer from `seed` (each layer its own stream): the trainer reseeds per
  // step so that a resumed run draws the same masks.
  void reseed(std::uint64_t seed);

  // Every batch-norm layer, in collect() order.
  std::vector<BatchNorm2d*> batch_norms();

  // The chain of named top-level modules, for builders (and tests that look inside).
  Sequential& body() { return body_; }
  const Sequential& body() const { return body_; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  bool trace(int input_size, std::vector<LayerSummary>* rows, std::string& why) const;
  // Throws InternalError "<architecture>: <message>" (Module::fail would name the model by its empty name).
  [[noreturn]] void refuse(const std::string& message) const;

  std::string type_;
  ModelOptions options_;
  Sequential body_;
  bool folded_ = false;
  Tensor input_;              // forward(vector, ...)'s copy of the batch
  Reorderer logits_reorder_;  // the body's output → plain nc
};

}  // namespace tessera::engine
