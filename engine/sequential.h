// Sequential: children run in order, like torch.nn.Sequential.
//
//   setup:    desc_0 = src;  desc_{i+1} = child_i.setup(desc_i);  returns desc_n
//   forward:  x_{i+1} = child_i.forward(x_i)
//   backward: g_i = child_i.backward(g_{i+1}), from the last child to the first
//
// Children are named by their position under the Sequential's name ("features.0", "features.1", ...):
// construct each child with next_name() so its parameters get PyTorch's names ("features.0.weight").
// set_propagate_down(false) applies to the first child only — the rest must pass gradients on.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/module.h"

namespace tessera::engine {

// Watches a Sequential run its children, e.g. a profiler timing each child's forward and backward
// (`tessera bench train --profile`). Sequentials have none by default, so the hot path pays one pointer test
// per child. The calls come right before and after the child's own forward/backward; oneDNN's CPU stream is
// synchronous (context.h), so the time between them is the child's.
class ModuleObserver {
 public:
  enum class Pass { forward, backward };
  virtual ~ModuleObserver() = default;
  virtual void begin(const Module& child, Pass pass) = 0;
  virtual void end(const Module& child, Pass pass) = 0;
};

class Sequential : public Module {
 public:
  explicit Sequential(std::string name) : Module(std::move(name)) {}

  std::string type() const override { return "Sequential"; }

  // The name the next added child should carry: "<name>.<index>".
  std::string next_name() const { return child_name(std::to_string(children_.size())); }

  // Appends a child; returns it for further configuration.
  Module& add(std::unique_ptr<Module> child);
  // Constructs a child in place with next_name() as its name: seq.emplace<ReLU>() or
  // seq.emplace<Conv2d>(Conv2dOptions{...}).
  template <class M, class... Args>
  M& emplace(Args&&... args) {
    auto child = std::make_unique<M>(next_name(), std::forward<Args>(args)...);
    M& ref = *child;
    add(std::move(child));
    return ref;
  }

  std::size_t size() const { return children_.size(); }
  Module& operator[](std::size_t i) { return *children_.at(i); }
  const Module& operator[](std::size_t i) const { return *children_.at(i); }

  void set_mode(Mode mode) override;
  void set_propagate_down(bool propagate) override;
  void collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) override;

  // Reports this Sequential's children to `observer` (nullptr: to nobody). Nested Sequentials keep their own
  // observer: set it on each level to be seen into. The observer must outlive its use.
  void set_observer(ModuleObserver* observer) { observer_ = observer; }

 protected:
  dnnl::memory::desc do_setup(const dnnl::memory::desc& src) override;
  const Tensor& do_forward(const Tensor& src) override;
  const Tensor& do_backward(const Tensor& diff_dst) override;

 private:
  std::vector<std::unique_ptr<Module>> children_;
  ModuleObserver* observer_ = nullptr;
};

}  // namespace tessera::engine
