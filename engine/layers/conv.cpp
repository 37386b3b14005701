#include "engine/layers/conv.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

Conv2d::Conv2d(std::string name, const Conv2dOptions& options) : Module(std::move(name)), options_(options) {
  if (options_.in <= 0 || options_.out <= 0 || options_.kernel <= 0 || options_.stride <= 0 || options_.padding < 0 ||
      options_.dilation <= 0) {
    fail("invalid options (in " + std::to_string(options_.in) + ", out " + std::to_string(options_.out) + ", kernel " +
         std::to_string(options_.kernel) + ", stride " + std::to_string(options_.stride) + ", padding " +
         std::to_string(options_.padding) + ", dilation " + std::to_string(options_.dilation) + ")");
  }
  weight_.name = child_name("weight");
  weight_.kind = ParamKind::conv_weight;
  weight_.shape = {options_.out, options_.in, options_.kernel, options_.kernel};
  weight_.value.assign(static_cast<std::size_t>(weight_.numel()), 0.0f);
  weight_.grad.assign(weight_.value.size(), 0.0f);
  bias_.name = child_name("bias");
  bias_.kind = ParamKind::bias;
  bias_.shape = {options_.out};
  if (options_.bias) {
    bias_.value.assign(static_cast<std::size_t>(options_.out), 0.0f);
    bias_.grad.assign(bias_.value.size(), 0.0f);
  }
}

void Conv2d::collect(std::vector<Param*>& params, std::vector<Buffer*>&) {
  params.push_back(&weight_);
  if (options_.bias) params.push_back(&bias_);
}

void Conv2d::enable_bias() {
  if (options_.bias) return;
  options_.bias = true;
  bias_.value.assign(static_cast<std::size_t>(options_.out), 0.0f);
  bias_.grad.assign(bias_.value.size(), 0.0f);
  invalidate_setup();
}

void Conv2d::set_relu(bool relu) {
  if (options_.relu == relu) return;
  options_.relu = relu;
  invalidate_setup();
}

void Conv2d::set_compute_type(memory::data_type type, Weights weights) {
  if (type != dt::f32 && type != dt::bf16) fail("compute type must be f32 or bf16 (int8: set_int8)");
  weights_ = weights;
  weights_low_ = memory();
  if (compute_ == type) return;
  compute_ = type;
  invalidate_setup();
}

void Conv2d::set_int8(float src_scale, bool src_signed, float dst_scale) {
  if (mode() == Mode::train) fail("int8 is for inference: switch to eval mode first");
  if (!(src_scale > 0.0f) || !std::isfinite(src_scale) || !(dst_scale > 0.0f) || !std::isfinite(dst_scale)) {
    fail("int8 scales must be positive finite numbers");
  }
  if (compute_ == dt::s8 && src_scale_ == src_scale && src_signed_ == src_signed && dst_scale_ == dst_scale) return;
  compute_ = dt::s8;
  src_scale_ = src_scale;
  src_signed_ = src_signed;
  dst_scale_ = dst_scale;
  invalidate_setup();
}

int Conv2d::output_size(int input) const {
  const int extent = options_.dilation * (options_.kernel - 1) + 1;
  const int span = input + 2 * options_.padding - extent;
  return span < 0 ? 0 : span / options_.stride + 1;
}

memory::desc Conv2d::do_setup(const memory::desc& src) {
  const dims_t in = src.dims();
  if (in.size() != 4) fail("input must be N×C×H×W, got " + std::to_string(in.size()) + " dimensions");
  if (in[1] != options_.in) {
    fail("input has " + std::to_string(in[1]) + " channels, expected " + std::to_string(options_.in));
  }
  const int oh = output_size(static_cast<int>(in[2]));
  const int ow = output_size(static_cast<int>(in[3]));
  if (oh <= 0 || ow <= 0) {
    fail("input " + std::to_string(in[2]) + "×" + std::to_string(in[3]) + " is smaller than the kernel");
  }
  const dims_t strides = {options_.stride, options_.stride};
  const dims_t dilates = {options_.dilation - 1, options_.dilation - 1};  // oneDNN counts the gaps
  const dims_t padding = {options_.padding, options_.padding};
  const bool int8 = compute_ == dt::s8;
  const dt src_type = int8 ? (src_signed_ ? dt::s8 : dt::u8) : compute_;
  const dt dst_type = int8 ? (options_.relu ? dt::u8 : dt::s8) : compute_;
  const memory::desc src_any(in, src_type, tag::any);
  const memory::desc weights_any(weight_.shape, compute_, tag::any);
  const memory::desc bias_md = options_.bias ? memory::desc({options_.out}, dt::f32, tag::a) : memory::desc();
  const memory::desc dst_any({in[0], options_.out, oh, ow}, dst_type, tag::any);

  dnnl::primitive_attr attr = Context::default_attr();
  if (int8) {
    // Per output channel: the weights' scale from their own range; the primitive's output scale turns the s32
    // accumulator (src steps × weight steps) into dst steps.
    const std::size_t per_channel = weight_.value.size() / static_cast<std::size_t>(options_.out);
    weight_scales_.assign(static_cast<std::size_t>(options_.out), 1.0f);
    std::vector<float> output_scales(weight_scales_.size());
    bias_int8_.assign(weight_scales_.size(), 0.0f);
    for (std::size_t o = 0; o < weight_scales_.size(); ++o) {
      const auto first = weight_.value.begin() + static_cast<std::ptrdiff_t>(o * per_channel);
      float largest = 0.0f;
      for (auto w = first; w != first + static_cast<std::ptrdiff_t>(per_channel); ++w) {
        largest = std::max(largest, std::abs(*w));
      }
      if (largest > 0.0f) weight_scales_[o] = largest / 127.0f;
      output_scales[o] = src_scale_ * weight_scales_[o] / dst_scale_;
      if (options_.bias) bias_int8_[o] = bias_.value[o] / (src_scale_ * weight_scales_[o]);
    }
    attr.set_output_scales(1 << 1, output_scales);
  }
  if (options_.relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  try {
    // forward_training also serves inference: convolutions keep no workspace, so the two kinds run the same
    // kernels, and one primitive (and one dst layout) serves both modes.
    const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                               src_any, weights_any, bias_md, dst_any, strides, dilates, padding,
                                               padding);
    fwd_pd_ = dnnl::convolution_forward::primitive_desc(desc, attr, Context::get().engine());
    fwd_ = dnnl::convolution_forward(fwd_pd_);
  } catch (const dnnl::error& e) {
    fail(std::string("oneDNN cannot create the forward convolution: ") + e.what());
  }
  dst_ = Tensor(fwd_pd_.dst_desc());
  if (int8) dst_.set_scale(dst_scale_);
  src_saved_ = Tensor();
  weights_saved_ = memory();
  weights_low_ = memory();
  backward_built_ = false;
  return fwd_pd_.dst_desc();
}

memory Conv2d::weights_memory() {
  const Tensor plain(wrap_plain(weight_.value, weight_.shape));
  // Trained weights change between forwards (optimizer steps, and an EASGD centre swapped in for validation).
  if (compute_ == dt::f32 || weights_ == Weights::trained) {
    return weights_reorder_(plain, fwd_pd_.weights_desc()).memory();
  }
  // Fixed weights (inference) are converted once per setup (a copy of their own, not the Reorderer's buffer).
  if (weights_low_) return weights_low_;
  if (compute_ == dt::bf16) {
    weights_low_ = plain.reordered_to(fwd_pd_.weights_desc()).memory();
    return weights_low_;
  }
  // int8: w / weight scale[o], rounded and saturated by the reorder (which also fills in the compensation that
  // oneDNN's s8-src kernels keep beside the weights).
  std::vector<float> inverse(weight_scales_.size());
  for (std::size_t o = 0; o < inverse.size(); ++o) inverse[o] = 1.0f / weight_scales_[o];
  dnnl::primitive_attr attr;
  attr.set_output_scales(1 << 0, inverse);
  const auto& engine = Context::get().engine();
  weights_low_ = memory(fwd_pd_.weights_desc(), engine);
  dnnl::reorder(dnnl::reorder::primitive_desc(engine, plain.desc(), engine, fwd_pd_.weights_desc(), attr))
      .execute(Context::get().stream(), {{DNNL_ARG_FROM, plain.memory()}, {DNNL_ARG_TO, weights_low_}});
  return weights_low_;
}

memory Conv2d::bias_memory() {
  const Tensor plain(compute_ == dt::s8 ? wrap_plain(bias_int8_, bias_.shape) : wrap_plain(bias_.value, bias_.shape));
  return bias_reorder_(plain, fwd_pd_.bias_desc()).memory();
}

const Tensor& Conv2d::do_forward(const Tensor& src) {
  if (observe_src_ != nullptr) observe_src_->include(src);
  src_saved_ = src_reorder_(src, fwd_pd_.src_desc(), compute_ == dt::s8 ? src_scale_ : 1.0f);
  weights_saved_ = weights_memory();
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, src_saved_.memory()}, {DNNL_ARG_WEIGHTS, weights_saved_}, {DNNL_ARG_DST, dst_.memory()}};
  if (options_.bias) args.emplace(DNNL_ARG_BIAS, bias_memory());
  Context::get().execute(fwd_, fwd_pd_, std::move(args));
  if (observe_dst_ != nullptr) observe_dst_->include(dst_);
  return dst_;
}

void Conv2d::build_backward() {
  const auto& engine = Context::get().engine();
  const dims_t strides = {options_.stride, options_.stride};
  const dims_t dilates = {options_.dilation - 1, options_.dilation - 1};
  const dims_t padding = {options_.padding, options_.padding};
  // bf16: src, weights and both diffs of the data in bfloat16; the weight and bias gradients in float32. On a
  // small output (at most kSmallOutput pixels per image), and for a 1×1 kernel with a stride, backward weights reads
  // src and diff_dst converted to float32 (exactly: they are bfloat16 values) and runs oneDNN's f32 kernel, which is
  // several times faster there than its AMX bf16 one (oneDNN 2.6; docs/ARCHITECTURE.md, "Reduced precision:
  // training").
  const memory::desc src_any(src_desc().dims(), compute_, tag::any);
  const memory::desc weights_any(weight_.shape, compute_, tag::any);
  const memory::desc diff_weights_any(weight_.shape, dt::f32, tag::any);
  const memory::desc bias_md = options_.bias ? memory::desc({options_.out}, dt::f32, tag::a) : memory::desc();
  const memory::desc dst_any(dst_.dims(), compute_, tag::any);
  const dims_t out = dst_.dims();
  const bool f32_weights_kernel = out[2] * out[3] <= kSmallOutput || (options_.kernel == 1 && options_.stride > 1);
  const dt grad_type = compute_ == dt::bf16 && f32_weights_kernel ? dt::f32 : compute_;
  const memory::desc grad_src_any(src_desc().dims(), grad_type, tag::any);
  const memory::desc grad_dst_any(out, grad_type, tag::any);
  const dnnl::primitive_attr attr = Context::default_attr();
  try {
    if (options_.relu) {
      // ReLU backward from dst: dst > 0 exactly where the pre-activation was > 0, so the pre-activation
      // need not be kept.
      const dnnl::eltwise_forward::primitive_desc hint(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu_use_dst_for_bwd,
                                      dst_.desc(), 0.0f, 0.0f),
          engine);
      relu_bwd_pd_ = dnnl::eltwise_backward::primitive_desc(
          dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, dst_.desc(), dst_.desc(), 0.0f,
                                       0.0f),
          attr, engine, hint);
      relu_bwd_ = dnnl::eltwise_backward(relu_bwd_pd_);
      diff_pre_ = Tensor(relu_bwd_pd_.diff_src_desc());
    }
    if (propagate_down()) {
      bwd_data_pd_ = dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_any, weights_any, dst_any,
                                                strides, dilates, padding, padding),
          attr, engine, fwd_pd_);
      bwd_data_ = dnnl::convolution_backward_data(bwd_data_pd_);
      diff_src_ = Tensor(bwd_data_pd_.diff_src_desc());
    }
    bwd_weights_pd_ = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, grad_src_any, diff_weights_any,
                                                 bias_md, grad_dst_any, strides, dilates, padding, padding),
        attr, engine, fwd_pd_);
    bwd_weights_ = dnnl::convolution_backward_weights(bwd_weights_pd_);
    diff_weights_ = Tensor(bwd_weights_pd_.diff_weights_desc());
    diff_bias_ = options_.bias ? Tensor(bwd_weights_pd_.diff_bias_desc()) : Tensor();
  } catch (const dnnl::error& e) {
    fail(std::string("oneDNN cannot create the backward convolution: ") + e.what());
  }
  backward_built_ = true;
  built_propagate_down_ = propagate_down();
}

const Tensor& Conv2d::do_backward(const Tensor& diff_dst) {
  if (compute_ == dt::s8) fail("int8 has no backward: training runs in f32 or bf16");
  if (compute_ == dt::bf16 && weights_ == Weights::fixed) {
    fail("bf16 backward with fixed weights (converted once per setup): training sets Weights::trained");
  }
  if (!backward_built_ || built_propagate_down_ != propagate_down()) build_backward();
  auto& context = Context::get();
  const Tensor* g = &diff_dst;
  if (options_.relu) {
    context.execute(relu_bwd_, relu_bwd_pd_,
                    {{DNNL_ARG_DST, dst_.memory()},
                     {DNNL_ARG_DIFF_DST, diff_dst_reorder_(diff_dst, dst_.desc()).memory()},
                     {DNNL_ARG_DIFF_SRC, diff_pre_.memory()}});
    g = &diff_pre_;
  }

  // Weight (and bias) gradients, added into the plain Param::grad while reordering out of the blocked layout.
  const Tensor& g_weights = diff_dst_weights_reorder_(*g, bwd_weights_pd_.diff_dst_desc());
  {
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, src_weights_reorder_(src_saved_, bwd_weights_pd_.src_desc()).memory()},
        {DNNL_ARG_DIFF_DST, g_weights.memory()},
        {DNNL_ARG_DIFF_WEIGHTS, diff_weights_.memory()}};
    if (options_.bias) args.emplace(DNNL_ARG_DIFF_BIAS, diff_bias_.memory());
    context.execute(bwd_weights_, bwd_weights_pd_, std::move(args));
    weights_grad_(diff_weights_.memory(), wrap_plain(weight_.grad, weight_.shape));
    if (options_.bias) bias_grad_(diff_bias_.memory(), wrap_plain(bias_.grad, bias_.shape));
  }

  if (!propagate_down()) return no_tensor();
  // The forward already holds the weights in the forward layout; backward-data usually wants the same one.
  memory weights;
  if (bwd_data_pd_.weights_desc() == fwd_pd_.weights_desc()) {
    weights = weights_saved_;
  } else {
    const Tensor plain(wrap_plain(weight_.value, weight_.shape));
    weights = weights_bwd_reorder_(plain, bwd_data_pd_.weights_desc()).memory();
  }
  // diff_dst is reordered at most once when both backward primitives want the same layout (the usual case).
  const Tensor& g_data = g_weights.desc() == bwd_data_pd_.diff_dst_desc()
                             ? g_weights
                             : diff_dst_data_reorder_(*g, bwd_data_pd_.diff_dst_desc());
  context.execute(
      bwd_data_, bwd_data_pd_,
      {{DNNL_ARG_DIFF_DST, g_data.memory()}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DIFF_SRC, diff_src_.memory()}});
  return diff_src_;
}

}  // namespace tessera::engine
