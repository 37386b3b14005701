#include "engine/module.h"

#include "core/error.h"

namespace tessera::engine {

dnnl::memory::desc Module::setup(const dnnl::memory::desc& src) {
  if (set_up_ && src == src_desc_) return dst_desc_;
  // Marked not set up while do_setup runs, so a throwing setup leaves no half-prepared state looking ready.
  set_up_ = false;
  forwarded_ = false;
  ++setup_count_;
  dst_desc_ = do_setup(src);
  src_desc_ = src;
  set_up_ = true;
  return dst_desc_;
}

const Tensor& Module::forward(const Tensor& src) {
  if (src.empty()) fail("forward of an empty tensor");
  setup(src.desc());
  const Tensor& dst = do_forward(src);
  forwarded_ = true;
  return dst;
}

const Tensor& Module::backward(const Tensor& diff_dst) {
  if (!forwarded_) fail("backward without a forward for the current setup");
  if (diff_dst.empty() || diff_dst.dims() != dst_desc_.dims()) fail("backward: diff_dst does not match dst's dims");
  return do_backward(diff_dst);
}

void Module::collect(std::vector<Param*>&, std::vector<Buffer*>&) {}

const Tensor& Module::no_tensor() {
  static const Tensor empty;
  return empty;
}

void Module::fail(const std::string& message) const {
  throw core::InternalError(type() + " '" + name_ + "': " + message);
}

}  // namespace tessera::engine
