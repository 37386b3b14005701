// The module contract: every layer and every block of layers is a Module.
//
//   Conv2d conv("layer1.0.conv1", {.in = 64, .out = 64, .kernel = 3, .padding = 1});
//   conv.setup(src_desc);                       // optional: forward() sets up on its own when needed
//   const Tensor& y = conv.forward(x);          // y owned by conv, valid until conv.forward() runs again
//   const Tensor& dx = conv.backward(dy);       // dx owned by conv; conv.weight.grad += dL/dW
//
// Life cycle (as in Caffe's SetUp / Forward / Backward):
// - setup(src desc) prepares the module for one input desc — shape AND layout — and returns the output desc.
//   Primitives are created here (or lazily, once, on the first forward/backward that needs them) and reused by
//   every later call. forward() calls setup() itself whenever the input desc differs from the last one, so a
//   new batch size or a new input layout just works; a repeated desc costs a comparison.
// - forward(src) computes dst from src. The returned tensor belongs to the module and stays unchanged until the
//   module's next forward(); the module may keep a handle to `src` for its backward, so the producer of src must
//   not overwrite it before then (no module does: outputs change only on their owner's next forward).
// - backward(diff_dst) takes dL/d(dst) — in any layout with dst's dims; the module reorders when its
//   primitive wants another — and returns dL/d(src) (owned by the module, like forward's result) and ADDS the
//   gradients of its parameters to Param::grad (the optimizer zeroes them). It uses the state of the last
//   forward(), which must have run in the same mode. With propagate_down false, diff_src is not computed and
//   an empty tensor is returned (the network's first layer: nobody needs dL/d(image)).
// - set_mode(train / eval) switches what changes between training and inference: batch-norm uses batch
//   statistics and updates its running averages in train, uses the running averages in eval; dropout is the
//   identity in eval.
// - collect() appends the module's own parameters and buffers, then its children's, in PyTorch's state_dict
//   order, with full PyTorch names: each module is built with its full name prefix ("layer1.0.conv1"), so its
//   parameters are "layer1.0.conv1.weight" etc.
//
// Implementations override do_setup / do_forward / do_backward; the public entry points add the set-up check.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/parameters.h"
#include "engine/tensor.h"

namespace tessera::engine {

enum class Mode { train, eval };

// Whether a layer's weights change between its forwards, for layers that compute in reduced precision from float32
// master weights: inference's are fixed (converted once after a setup), training's change at every optimizer step
// (converted on every forward).
enum class Weights { fixed, trained };

class Module {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Full PyTorch name prefix, e.g. "layer1.0.conv1" ("" for a top-level model).
  const std::string& name() const { return name_; }
  // Layer kind for messages and summaries, e.g. "Conv2d".
  virtual std::string type() const = 0;

  // Prepares for inputs with desc `src` and returns the output desc; a no-op when `src` equals the desc of the
  // last setup. Throws InternalError (naming the module) when the input does not fit the module.
  dnnl::memory::desc setup(const dnnl::memory::desc& src);
  const Tensor& forward(const Tensor& src);
  const Tensor& backward(const Tensor& diff_dst);

  virtual void set_mode(Mode mode) { mode_ = mode; }
  Mode mode() const { return mode_; }
  // false: backward() skips dL/d(src) and returns an empty tensor (parameter gradients are still computed).
  virtual void set_propagate_down(bool propagate) { propagate_down_ = propagate; }
  bool propagate_down() const { return propagate_down_; }

  // Appends own parameters and buffers, then the children's (PyTorch state_dict order).
  virtual void collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers);

  // Descs of the last setup (empty descs before the first).
  const dnnl::memory::desc& src_desc() const { return src_desc_; }
  const dnnl::memory::desc& dst_desc() const { return dst_desc_; }
  bool is_set_up() const { return set_up_; }
  // How many times do_setup has run: lets tests (and benchmarks) see that a repeated input desc reuses the
  // primitives and a new one rebuilds them.
  int setup_count() const { return setup_count_; }

 protected:
  virtual dnnl::memory::desc do_setup(const dnnl::memory::desc& src) = 0;
  virtual const Tensor& do_forward(const Tensor& src) = 0;
  virtual const Tensor& do_backward(const Tensor& diff_dst) = 0;

  // Forces the next forward() to run setup again even for the same input desc (after a structural change such
  // as folding a batch norm into a convolution).
  void invalidate_setup() { set_up_ = false; }
  // "<name>.<leaf>", or just `leaf` for an unnamed module: the PyTorch name of a parameter or child.
  std::string child_name(const std::string& leaf) const { return name_.empty() ? leaf : name_ + "." + leaf; }
  // The empty tensor backward() returns when propagate_down is false.
  static const Tensor& no_tensor();
  // Throws InternalError "<type> '<name>': <message>".
  [[noreturn]] void fail(const std::string& message) const;

 private:
  std::string name_;
  Mode mode_ = Mode::train;
  bool propagate_down_ = true;
  bool set_up_ = false;
  bool forwarded_ = false;
  int setup_count_ = 0;
  dnnl::memory::desc src_desc_;
  dnnl::memory::desc dst_desc_;
};

}  // namespace tessera::engine
