#include "engine/models/adaptive_pool.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;

namespace {

// PyTorch's window of output index i when `in` cells pool onto `out`: [floor(i·in/out), ceil((i+1)·in/out)).
std::int64_t window_start(std::int64_t i, std::int64_t in, std::int64_t out) { return i * in / out; }
std::int64_t window_end(std::int64_t i, std::int64_t in, std::int64_t out) { return ((i + 1) * in + out - 1) / out; }

}  // namespace

AdaptiveAvgPool2dTo::AdaptiveAvgPool2dTo(std::string name, int out_h, int out_w)
    : Module(std::move(name)), out_h_(out_h), out_w_(out_w) {
  if (out_h < 1 || out_w < 1) {
    // Not fail(): type() is not callable while the base is being constructed.
    throw core::InternalError("AdaptiveAvgPool2d '" + this->name() + "': output size " + std::to_string(out_h) + "x" +
                              std::to_string(out_w) + " is not positive");
  }
}

memory::desc AdaptiveAvgPool2dTo::do_setup(const memory::desc& src) {
  const dims_t d = src.dims();
  if (d.size() != 4) fail("needs a 4-D N×C×H×W input, got " + std::to_string(d.size()) + " dimensions");
  if (d[2] < 1 || d[3] < 1) fail("input has an empty image");
  forward_pd_ = {};
  forward_ = {};
  backward_pd_ = {};
  backward_ = {};
  dst_ = Tensor();
  diff_src_ = Tensor();
  if (d[2] == out_h_ && d[3] == out_w_) {
    path_ = Path::identity;
    return src;
  }
  if (d[2] % out_h_ == 0 && d[3] % out_w_ == 0) {
    path_ = Path::uniform;
    const memory::dim kh = d[2] / out_h_, kw = d[3] / out_w_;
    const memory::desc dst_any({d[0], d[1], out_h_, out_w_}, src.data_type(), memory::format_tag::any);
    // No padding, so including or excluding it is the same; training propagation so it can hint the backward.
    const dnnl::pooling_forward::desc desc(dnnl::prop_kind::forward_training,
                                           dnnl::algorithm::pooling_avg_exclude_padding, src, dst_any, {kh, kw},
                                           {kh, kw}, {0, 0}, {0, 0});
    forward_pd_ = dnnl::pooling_forward::primitive_desc(desc, Context::default_attr(), Context::get().engine());
    forward_ = dnnl::pooling_forward(forward_pd_);
    dst_ = Tensor(forward_pd_.dst_desc());
    return dst_.desc();
  }
  path_ = Path::general;
  dst_ = Tensor::plain({d[0], d[1], out_h_, out_w_});
  return dst_.desc();
}

const Tensor& AdaptiveAvgPool2dTo::do_forward(const Tensor& src) {
  if (path_ == Path::identity) {
    dst_ = src;  // shared handle: no copy
    return dst_;
  }
  if (path_ == Path::uniform) {
    Context::get().execute(forward_, forward_pd_, {{DNNL_ARG_SRC, src.memory()}, {DNNL_ARG_DST, dst_.memory()}});
    dst_.set_scale(src.scale());  // a quantized src stays quantized, in the same steps
    return dst_;
  }
  const Tensor& in = src_reorder_(src, plain_desc(src.dims()));
  const dims_t d = src.dims();
  const std::int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = out_h_, ow = out_w_;
  const float* x = in.data();
  float* y = dst_.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* plane = x + p * h * w;
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      const std::int64_t y0 = window_start(oy, h, oh), y1 = window_end(oy, h, oh);
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        const std::int64_t x0 = window_start(ox, w, ow), x1 = window_end(ox, w, ow);
        double sum = 0.0;
        for (std::int64_t i = y0; i < y1; ++i) {
          for (std::int64_t j = x0; j < x1; ++j) sum += plane[i * w + j];
        }
        y[(p * oh + oy) * ow + ox] = static_cast<float>(sum / static_cast<double>((y1 - y0) * (x1 - x0)));
      }
    }
  }
  return dst_;
}

const Tensor& AdaptiveAvgPool2dTo::do_backward(const Tensor& diff_dst) {
  if (!propagate_down()) return no_tensor();  // no parameters: nothing else to compute
  if (path_ == Path::identity) {
    diff_src_ = diff_dst;
    return diff_src_;
  }
  auto& context = Context::get();
  if (path_ == Path::uniform) {
    if (!backward_) {
      const dims_t d = src_desc().dims();
      const memory::dim kh = d[2] / out_h_, kw = d[3] / out_w_;
      // diff_src in src's layout, so the producer gets its gradient in the layout it works in.
      const dnnl::pooling_backward::desc desc(dnnl::algorithm::pooling_avg_exclude_padding, src_desc(),
                                              forward_pd_.dst_desc(), {kh, kw}, {kh, kw}, {0, 0}, {0, 0});
      backward_pd_ =
          dnnl::pooling_backward::primitive_desc(desc, Context::default_attr(), context.engine(), forward_pd_);
      backward_ = dnnl::pooling_backward(backward_pd_);
      diff_src_ = Tensor(backward_pd_.diff_src_desc());
    }
    const Tensor& dd = diff_dst_reorder_(diff_dst, backward_pd_.diff_dst_desc());
    context.execute(backward_, backward_pd_,
                    {{DNNL_ARG_DIFF_DST, dd.memory()}, {DNNL_ARG_DIFF_SRC, diff_src_.memory()}});
    return diff_src_;
  }
  const dims_t d = src_desc().dims();
  if (diff_src_.empty()) diff_src_ = Tensor::plain(d);
  const Tensor& dd = diff_dst_reorder_(diff_dst, dst_.desc());
  const std::int64_t planes = d[0] * d[1], h = d[2], w = d[3], oh = out_h_, ow = out_w_;
  const float* g = dd.data();
  float* dx = diff_src_.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t p = 0; p < planes; ++p) {
    float* plane = dx + p * h * w;
    std::fill(plane, plane + h * w, 0.0f);
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      const std::int64_t y0 = window_start(oy, h, oh), y1 = window_end(oy, h, oh);
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        const std::int64_t x0 = window_start(ox, w, ow), x1 = window_end(ox, w, ow);
        const float share = g[(p * oh + oy) * ow + ox] / static_cast<float>((y1 - y0) * (x1 - x0));
        for (std::int64_t i = y0; i < y1; ++i) {
          for (std::int64_t j = x0; j < x1; ++j) plane[i * w + j] += share;
        }
      }
    }
  }
  return diff_src_;
}

}  // namespace tessera::engine
