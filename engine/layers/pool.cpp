#include "engine/layers/pool.h"

#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;

Pool2d::Pool2d(std::string name, const Pool2dOptions& options, bool max)
    : Module(std::move(name)), options_(options), max_(max) {
  if (options_.stride == 0) options_.stride = options_.kernel;
  if (options_.kernel < 1 || options_.stride < 1 || options_.padding < 0 || 2 * options_.padding > options_.kernel) {
    // Padding beyond half the kernel would make windows of padding only (PyTorch refuses it too).
    // Not fail(): type() is not callable while the base is being constructed.
    throw core::InternalError(std::string(max ? "MaxPool2d" : "AvgPool2d") + " '" + this->name() + "': kernel " +
                              std::to_string(options_.kernel) + ", stride " + std::to_string(options_.stride) +
                              ", padding " + std::to_string(options_.padding) + " is not a valid pooling window");
  }
}

void Pool2d::set_mode(Mode mode) {
  // Max pooling's training primitive differs (it writes the workspace); average pooling's does not.
  if (max_ && mode != this->mode()) invalidate_setup();
  Module::set_mode(mode);
}

dnnl::algorithm Pool2d::algorithm() const {
  if (max_) return dnnl::algorithm::pooling_max;
  return options_.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                    : dnnl::algorithm::pooling_avg_exclude_padding;
}

memory::desc Pool2d::do_setup(const memory::desc& src) {
  const dims_t d = src.dims();
  if (d.size() != 4) fail("needs a 4-D N×C×H×W input, got " + std::to_string(d.size()) + " dimensions");
  const auto k = static_cast<memory::dim>(options_.kernel), s = static_cast<memory::dim>(options_.stride),
             p = static_cast<memory::dim>(options_.padding);
  const memory::dim oh = (d[2] + 2 * p - k) / s + 1, ow = (d[3] + 2 * p - k) / s + 1;
  if (d[2] + 2 * p < k || d[3] + 2 * p < k) {
    fail("input " + std::to_string(d[2]) + "x" + std::to_string(d[3]) + " is smaller than the kernel");
  }
  const memory::desc dst_any({d[0], d[1], oh, ow}, src.data_type(), memory::format_tag::any);
  const auto prop =
      max_ && mode() == Mode::eval ? dnnl::prop_kind::forward_inference : dnnl::prop_kind::forward_training;
  const dnnl::pooling_forward::desc desc(prop, algorithm(), src, dst_any, {s, s}, {k, k}, {p, p}, {p, p});
  const auto& engine = Context::get().engine();
  forward_pd_ = dnnl::pooling_forward::primitive_desc(desc, Context::default_attr(), engine);
  forward_ = dnnl::pooling_forward(forward_pd_);
  workspace_ = forward_pd_.workspace_desc().get_size() > 0 ? memory(forward_pd_.workspace_desc(), engine) : memory();
  dst_ = Tensor(forward_pd_.dst_desc());
  backward_pd_ = {};
  backward_ = {};
  diff_src_ = Tensor();
  return forward_pd_.dst_desc();
}

const Tensor& Pool2d::do_forward(const Tensor& src) {
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src.memory()}, {DNNL_ARG_DST, dst_.memory()}};
  if (workspace_) args.emplace(DNNL_ARG_WORKSPACE, workspace_);
  Context::get().execute(forward_, forward_pd_, std::move(args));
  dst_.set_scale(src.scale());  // a quantized src stays quantized, in the same steps
  return dst_;
}

void Pool2d::setup_backward() {
  const auto k = static_cast<memory::dim>(options_.kernel), s = static_cast<memory::dim>(options_.stride),
             p = static_cast<memory::dim>(options_.padding);
  // diff_src in src's layout, so the producer of src gets its gradient in the layout it works in.
  const dnnl::pooling_backward::desc desc(algorithm(), src_desc(), forward_pd_.dst_desc(), {s, s}, {k, k}, {p, p},
                                          {p, p});
  backward_pd_ =
      dnnl::pooling_backward::primitive_desc(desc, Context::default_attr(), Context::get().engine(), forward_pd_);
  backward_ = dnnl::pooling_backward(backward_pd_);
  diff_src_ = Tensor(backward_pd_.diff_src_desc());
}

const Tensor& Pool2d::do_backward(const Tensor& diff_dst) {
  if (!propagate_down()) return no_tensor();  // no parameters: nothing else to compute
  if (max_ && !workspace_) fail("backward after an eval-mode forward (max pooling keeps no argmax in eval)");
  if (!backward_) setup_backward();
  const Tensor& dd = diff_dst_reorder_(diff_dst, backward_pd_.diff_dst_desc());
  std::unordered_map<int, memory> args{{DNNL_ARG_DIFF_DST, dd.memory()}, {DNNL_ARG_DIFF_SRC, diff_src_.memory()}};
  if (workspace_) args.emplace(DNNL_ARG_WORKSPACE, workspace_);
  Context::get().execute(backward_, backward_pd_, std::move(args));
  return diff_src_;
}

}  // namespace tessera::engine
