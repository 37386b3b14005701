#include "engine/layers/add.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;

ResidualAdd::ResidualAdd(std::string name, bool relu) : name_(std::move(name)), relu_(relu) {}

void ResidualAdd::fail(const std::string& message) const {
  throw core::InternalError("ResidualAdd '" + name_ + "': " + message);
}

memory::desc ResidualAdd::setup(const memory::desc& a, const memory::desc& b) {
  if (set_up_ && a == a_desc_ && b == b_desc_) return a_desc_;
  set_up_ = false;
  forwarded_ = false;
  if (a.dims() != b.dims()) fail("inputs have different dims");
  const auto& engine = Context::get().engine();
  dnnl::primitive_attr attr = Context::default_attr();
  // oneDNN 2.6's binary kernel with an eltwise post-op corrupts the heap when the layout pads channels (e.g. 7
  // channels in nChw8c); there the ReLU runs as its own in-place primitive after the sum.
  const bool padded = !std::equal(a.data.dims, a.data.dims + a.data.ndims, a.data.padded_dims);
  relu_forward_pd_ = {};
  relu_forward_ = {};
  if (relu_ && padded) {
    relu_forward_pd_ = dnnl::eltwise_forward::primitive_desc(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu, a, 0.0f, 0.0f),
        Context::default_attr(), engine);
    relu_forward_ = dnnl::eltwise_forward(relu_forward_pd_);
  }
  if (relu_ && !padded) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  // b enters in a's layout (reordered when it differs), so the primitive runs on one layout throughout.
  forward_pd_ = dnnl::binary::primitive_desc(dnnl::binary::desc(dnnl::algorithm::binary_add, a, a, a), attr, engine);
  forward_ = dnnl::binary(forward_pd_);
  relu_backward_pd_ = {};
  relu_backward_ = {};
  dst_ = Tensor(a);
  diff_ = relu_ ? Tensor(a) : Tensor();
  a_desc_ = a;
  b_desc_ = b;
  set_up_ = true;
  return a_desc_;
}

const Tensor& ResidualAdd::forward(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty()) fail("forward of an empty tensor");
  setup(a.desc(), b.desc());
  const Tensor& b_in_a = b_reorder_(b, a_desc_);
  Context::get().execute(
      forward_, forward_pd_,
      {{DNNL_ARG_SRC_0, a.memory()}, {DNNL_ARG_SRC_1, b_in_a.memory()}, {DNNL_ARG_DST, dst_.memory()}});
  if (relu_forward_) {
    Context::get().execute(relu_forward_, relu_forward_pd_,
                           {{DNNL_ARG_SRC, dst_.memory()}, {DNNL_ARG_DST, dst_.memory()}});
  }
  forwarded_ = true;
  return dst_;
}

const Tensor& ResidualAdd::backward(const Tensor& diff_dst) {
  if (!forwarded_) fail("backward without a forward for the current setup");
  if (diff_dst.empty() || diff_dst.dims() != a_desc_.dims()) fail("backward: diff_dst does not match dst's dims");
  if (!relu_) {
    diff_ = diff_dst;  // the sum passes its gradient through unchanged: share, do not copy
    return diff_;
  }
  const auto& engine = Context::get().engine();
  if (!relu_backward_) {
    // The hint only describes the forward ReLU that the binary primitive's post-op performed.
    const dnnl::eltwise_forward::primitive_desc hint(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu_use_dst_for_bwd,
                                    a_desc_, 0.0f, 0.0f),
        engine);
    relu_backward_pd_ = dnnl::eltwise_backward::primitive_desc(
        dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, a_desc_, a_desc_, 0.0f, 0.0f),
        Context::default_attr(), engine, hint);
    relu_backward_ = dnnl::eltwise_backward(relu_backward_pd_);
  }
  const Tensor& dd = diff_dst_reorder_(diff_dst, a_desc_);
  Context::get().execute(
      relu_backward_, relu_backward_pd_,
      {{DNNL_ARG_DST, dst_.memory()}, {DNNL_ARG_DIFF_DST, dd.memory()}, {DNNL_ARG_DIFF_SRC, diff_.memory()}});
  return diff_;
}

}  // namespace tessera::engine
