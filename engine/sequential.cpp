#include "engine/sequential.h"

namespace tessera::engine {

Module& Sequential::add(std::unique_ptr<Module> child) {
  if (!child) fail("add of a null child");
  child->set_mode(mode());
  children_.push_back(std::move(child));
  // The first child alone may skip diff_src; a child that used to be first must now pass gradients on.
  for (std::size_t i = 0; i < children_.size(); ++i) children_[i]->set_propagate_down(i > 0 || propagate_down());
  invalidate_setup();
  return *children_.back();
}

void Sequential::set_mode(Mode mode) {
  Module::set_mode(mode);
  for (auto& child : children_) child->set_mode(mode);
}

void Sequential::set_propagate_down(bool propagate) {
  Module::set_propagate_down(propagate);
  if (!children_.empty()) children_.front()->set_propagate_down(propagate);
}

void Sequential::collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) {
  for (auto& child : children_) child->collect(params, buffers);
}

dnnl::memory::desc Sequential::do_setup(const dnnl::memory::desc& src) {
  dnnl::memory::desc desc = src;
  for (auto& child : children_) desc = child->setup(desc);
  return desc;
}

const Tensor& Sequential::do_forward(const Tensor& src) {
  const Tensor* x = &src;
  if (observer_ == nullptr) {
    for (auto& child : children_) x = &child->forward(*x);
    return *x;
  }
  for (auto& child : children_) {
    observer_->begin(*child, ModuleObserver::Pass::forward);
    x = &child->forward(*x);
    observer_->end(*child, ModuleObserver::Pass::forward);
  }
  return *x;
}

const Tensor& Sequential::do_backward(const Tensor& diff_dst) {
  const Tensor* g = &diff_dst;
  if (observer_ == nullptr) {
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) g = &(*it)->backward(*g);
    return *g;
  }
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    observer_->begin(**it, ModuleObserver::Pass::backward);
    g = &(*it)->backward(*g);
    observer_->end(**it, ModuleObserver::Pass::backward);
  }
  return *g;
}

}  // namespace tessera::engine
