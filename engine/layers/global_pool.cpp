#include "engine/layers/global_pool.h"

#include <string>
#include <unordered_map>

#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;

memory::desc AdaptiveAvgPool2d::do_setup(const memory::desc& src) {
  const dims_t d = src.dims();
  if (d.size() != 4) fail("needs a 4-D N×C×H×W input, got " + std::to_string(d.size()) + " dimensions");
  const auto& engine = Context::get().engine();
  const memory::desc pooled_any({d[0], d[1], 1, 1}, src.data_type(), memory::format_tag::any);
  // No padding, so include/exclude padding agree; the window is the whole image.
  const dnnl::pooling_forward::desc desc(dnnl::prop_kind::forward_training,
                                         dnnl::algorithm::pooling_avg_exclude_padding, src, pooled_any, {1, 1},
                                         {d[2], d[3]}, {0, 0}, {0, 0});
  forward_pd_ = dnnl::pooling_forward::primitive_desc(desc, Context::default_attr(), engine);
  forward_ = dnnl::pooling_forward(forward_pd_);
  pooled_ = Tensor(forward_pd_.dst_desc());
  dst_ = Tensor::plain({d[0], d[1]});
  dst_4d_ = memory(plain_desc({d[0], d[1], 1, 1}), engine, dst_.data());
  to_dst_ = dnnl::reorder(pooled_.memory(), dst_4d_);
  to_dst_scale_ = 1.0f;
  backward_pd_ = {};
  backward_ = {};
  diff_src_ = Tensor();
  diff_dst_4d_ = Tensor();
  return dst_.desc();
}

const Tensor& AdaptiveAvgPool2d::do_forward(const Tensor& src) {
  auto& context = Context::get();
  context.execute(forward_, forward_pd_, {{DNNL_ARG_SRC, src.memory()}, {DNNL_ARG_DST, pooled_.memory()}});
  if (src.scale() != to_dst_scale_) {
    // A quantized src (int8 inference): the averages come out in its steps and are dequantized on the way out.
    dnnl::primitive_attr attr;
    attr.set_output_scales(0, {src.scale()});
    const auto& engine = context.engine();
    to_dst_ = dnnl::reorder(dnnl::reorder::primitive_desc(engine, pooled_.desc(), engine, dst_4d_.get_desc(), attr));
    to_dst_scale_ = src.scale();
  }
  to_dst_.execute(context.stream(), {{DNNL_ARG_FROM, pooled_.memory()}, {DNNL_ARG_TO, dst_4d_}});
  return dst_;
}

void AdaptiveAvgPool2d::setup_backward() {
  const dims_t d = src_desc().dims();
  const dnnl::pooling_backward::desc desc(dnnl::algorithm::pooling_avg_exclude_padding, src_desc(),
                                          forward_pd_.dst_desc(), {1, 1}, {d[2], d[3]}, {0, 0}, {0, 0});
  const auto& engine = Context::get().engine();
  backward_pd_ = dnnl::pooling_backward::primitive_desc(desc, Context::default_attr(), engine, forward_pd_);
  backward_ = dnnl::pooling_backward(backward_pd_);
  diff_dst_4d_ = Tensor(backward_pd_.diff_dst_desc());
  from_diff_dst_ = dnnl::reorder(
      dnnl::reorder::primitive_desc(engine, plain_desc({d[0], d[1], 1, 1}), engine, backward_pd_.diff_dst_desc()));
  diff_src_ = Tensor(backward_pd_.diff_src_desc());
}

const Tensor& AdaptiveAvgPool2d::do_backward(const Tensor& diff_dst) {
  if (!propagate_down()) return no_tensor();
  if (!backward_) setup_backward();
  auto& context = Context::get();
  const Tensor& plain = diff_dst_reorder_(diff_dst, dst_.desc());
  // The plain N×C gradient is, byte for byte, an N×C×1×1 nchw tensor; only its header changes.
  const dims_t d = src_desc().dims();
  const memory diff_dst_view(plain_desc({d[0], d[1], 1, 1}), context.engine(), plain.data());
  from_diff_dst_.execute(context.stream(), {{DNNL_ARG_FROM, diff_dst_view}, {DNNL_ARG_TO, diff_dst_4d_.memory()}});
  context.execute(backward_, backward_pd_,
                  {{DNNL_ARG_DIFF_DST, diff_dst_4d_.memory()}, {DNNL_ARG_DIFF_SRC, diff_src_.memory()}});
  return diff_src_;
}

}  // namespace tessera::engine
