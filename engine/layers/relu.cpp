#include "engine/layers/relu.h"

#include <utility>

#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;

memory::desc ReLU::do_setup(const memory::desc& src) {
  try {
    fwd_pd_ = dnnl::eltwise_forward::primitive_desc(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu_use_dst_for_bwd,
                                    src, 0.0f, 0.0f),
        Context::default_attr(), Context::get().engine());
    fwd_ = dnnl::eltwise_forward(fwd_pd_);
  } catch (const dnnl::error& e) {
    fail(std::string("oneDNN cannot create the ReLU: ") + e.what());
  }
  dst_ = Tensor(fwd_pd_.dst_desc());
  backward_built_ = false;
  return fwd_pd_.dst_desc();
}

const Tensor& ReLU::do_forward(const Tensor& src) {
  Context::get().execute(fwd_, fwd_pd_, {{DNNL_ARG_SRC, src.memory()}, {DNNL_ARG_DST, dst_.memory()}});
  dst_.set_scale(src.scale());  // a quantized src stays quantized, in the same steps
  return dst_;
}

const Tensor& ReLU::do_backward(const Tensor& diff_dst) {
  if (!propagate_down()) return no_tensor();
  if (!backward_built_) {
    try {
      bwd_pd_ = dnnl::eltwise_backward::primitive_desc(
          dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu_use_dst_for_bwd, dst_.desc(), dst_.desc(), 0.0f,
                                       0.0f),
          Context::default_attr(), Context::get().engine(), fwd_pd_);
      bwd_ = dnnl::eltwise_backward(bwd_pd_);
    } catch (const dnnl::error& e) {
      fail(std::string("oneDNN cannot create the ReLU backward: ") + e.what());
    }
    diff_src_ = Tensor(bwd_pd_.diff_src_desc());
    backward_built_ = true;
  }
  Context::get().execute(bwd_, bwd_pd_,
                         {{DNNL_ARG_DST, dst_.memory()},
                          {DNNL_ARG_DIFF_DST, diff_dst_reorder_(diff_dst, dst_.desc()).memory()},
                          {DNNL_ARG_DIFF_SRC, diff_src_.memory()}});
  return diff_src_;
}

}  // namespace tessera::engine
