#include "engine/layers/add.h"

#include <algorithm>
#include <cmath>
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
  const bool int8 = dst_scale_ > 0.0f && (is_integer(a.data_type()) || is_integer(b.data_type()));
  const memory::desc int8_dst = with_data_type(a, relu_ ? memory::data_type::u8 : memory::data_type::s8);
  if (set_up_ && a == a_desc_ && b == b_desc_) return int8 ? int8_dst : a_desc_;
  set_up_ = false;
  forwarded_ = false;
  if (a.dims() != b.dims()) fail("inputs have different dims");
  if (int8) {
    // int8: the primitive is built on the first forward, which brings the inputs' scales.
    int8_forward_ = {};
    a_desc_ = a;
    b_desc_ = b;
    set_up_ = true;
    return int8_dst;
  }
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

void ResidualAdd::set_int8(float dst_scale) {
  if (dst_scale != 0.0f && (!(dst_scale > 0.0f) || !std::isfinite(dst_scale))) {
    fail("the int8 scale must be a positive finite number");
  }
  dst_scale_ = dst_scale;
  int8_forward_ = {};
  set_up_ = false;
}

void ResidualAdd::setup_int8(const Tensor& a, const Tensor& b) {
  if (int8_forward_ && a.desc() == int8_a_desc_ && b.desc() == int8_b_desc_ && a.scale() == int8_a_scale_ &&
      b.scale() == int8_b_scale_) {
    return;
  }
  if (a.dims() != b.dims()) fail("inputs have different dims");
  const auto& engine = Context::get().engine();
  const auto dst_type = relu_ ? memory::data_type::u8 : memory::data_type::s8;
  dnnl::primitive_attr attr = Context::default_attr();
  attr.set_scales(DNNL_ARG_SRC_0, 0, {a.scale() / dst_scale_});
  attr.set_scales(DNNL_ARG_SRC_1, 0, {b.scale() / dst_scale_});
  try {
    int8_pd_ = dnnl::binary::primitive_desc(
        dnnl::binary::desc(dnnl::algorithm::binary_add, a.desc(), with_data_type(a.desc(), b.data_type()),
                           with_data_type(a.desc(), dst_type)),
        attr, engine);
  } catch (const dnnl::error& e) {
    fail(std::string("oneDNN cannot create the int8 sum: ") + e.what());
  }
  int8_forward_ = dnnl::binary(int8_pd_);
  int8_dst_ = Tensor(int8_pd_.dst_desc());
  int8_dst_.set_scale(dst_scale_);
  int8_a_desc_ = a.desc();
  int8_b_desc_ = b.desc();
  int8_a_scale_ = a.scale();
  int8_b_scale_ = b.scale();
}

const Tensor& ResidualAdd::forward(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty()) fail("forward of an empty tensor");
  if (dst_scale_ > 0.0f && (is_integer(a.data_type()) || is_integer(b.data_type()))) {
    setup(a.desc(), b.desc());
    setup_int8(a, b);
    const Tensor& b_in_a = b_reorder_(b, with_data_type(a.desc(), b.data_type()), b.scale());
    Context::get().execute(
        int8_forward_, int8_pd_,
        {{DNNL_ARG_SRC_0, a.memory()}, {DNNL_ARG_SRC_1, b_in_a.memory()}, {DNNL_ARG_DST, int8_dst_.memory()}});
    forwarded_ = false;  // no backward in int8
    return int8_dst_;
  }
  setup(a.desc(), b.desc());
  const Tensor& b_in_a = b_reorder_(b, a_desc_);
  Context::get().execute(
      forward_, forward_pd_,
      {{DNNL_ARG_SRC_0, a.memory()}, {DNNL_ARG_SRC_1, b_in_a.memory()}, {DNNL_ARG_DST, dst_.memory()}});
  if (relu_forward_) {
    Context::get().execute(relu_forward_, relu_forward_pd_,
                           {{DNNL_ARG_SRC, dst_.memory()}, {DNNL_ARG_DST, dst_.memory()}});
  }
  if (observe_dst_ != nullptr) observe_dst_->include(dst_);
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
