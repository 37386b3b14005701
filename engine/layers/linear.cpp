#include "engine/layers/linear.h"

#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;

Linear::Linear(std::string name, const LinearOptions& options) : Module(std::move(name)), options_(options) {
  if (options_.in < 1 || options_.out < 1) {
    // Not fail(): type() is not callable while the base is being constructed.
    throw core::InternalError("Linear '" + this->name() + "': needs positive in and out features, got " +
                              std::to_string(options_.in) + " and " + std::to_string(options_.out));
  }
  const auto size = static_cast<std::size_t>(options_.out) * static_cast<std::size_t>(options_.in);
  weight_ = Param{child_name("weight"),
                  ParamKind::linear_weight,
                  {options_.out, options_.in},
                  std::vector<float>(size),
                  std::vector<float>(size)};
  if (options_.bias) {
    const auto n = static_cast<std::size_t>(options_.out);
    bias_ = Param{child_name("bias"), ParamKind::bias, {options_.out}, std::vector<float>(n), std::vector<float>(n)};
  }
}

void Linear::collect(std::vector<Param*>& params, std::vector<Buffer*>&) {
  params.push_back(&weight_);
  if (options_.bias) params.push_back(&bias_);
}

void Linear::check_params() const {
  const auto check = [&](const Param& p) {
    const auto n = static_cast<std::size_t>(p.numel());
    if (p.value.size() != n || p.grad.size() != n) {
      fail("parameter '" + p.name + "' holds " + std::to_string(p.value.size()) + " values and " +
           std::to_string(p.grad.size()) + " gradients for " + std::to_string(n) + " elements");
    }
  };
  check(weight_);
  if (options_.bias) check(bias_);
}

void Linear::set_compute_type(memory::data_type type, Weights weights) {
  if (type != memory::data_type::f32 && type != memory::data_type::bf16) fail("compute type must be f32 or bf16");
  weights_ = weights;
  weights_converted_ = false;
  if (compute_ == type) return;
  compute_ = type;
  invalidate_setup();
}

memory::desc Linear::do_setup(const memory::desc& src) {
  const dims_t d = src.dims();
  if (d.size() == 2 && d[1] == options_.in) {
    weight_dims_ = {options_.out, options_.in};
  } else if (d.size() == 4 && d[1] * d[2] * d[3] == options_.in) {
    weight_dims_ = {options_.out, d[1], d[2], d[3]};
  } else {
    std::string shape;
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (i > 0) shape += 'x';
      shape += std::to_string(d[i]);
    }
    fail("input " + shape + " does not have " + std::to_string(options_.in) + " features per sample");
  }
  const auto& engine = Context::get().engine();
  const memory::desc weights_any(weight_dims_, memory::data_type::f32, memory::format_tag::any);
  const memory::desc bias_desc({options_.out}, memory::data_type::f32, memory::format_tag::a);
  const memory::desc dst_any({d[0], options_.out}, memory::data_type::f32, memory::format_tag::any);
  // Training propagation kind in both modes: the inner product computes the same either way, and one forward
  // primitive then serves as the backward primitives' hint.
  const auto prop = dnnl::prop_kind::forward_training;
  // An input of another data type than the layer computes in (fp32 features into a bf16 layer) is converted by
  // a reorder into the layout the primitive picks.
  const memory::desc src_md = src.data_type() == compute_ ? src : memory::desc(d, compute_, memory::format_tag::any);
  const memory::desc weights_md =
      compute_ == memory::data_type::f32 ? weights_any : memory::desc(weight_dims_, compute_, memory::format_tag::any);
  const auto desc = options_.bias ? dnnl::inner_product_forward::desc(prop, src_md, weights_md, bias_desc, dst_any)
                                  : dnnl::inner_product_forward::desc(prop, src_md, weights_md, dst_any);
  forward_pd_ = dnnl::inner_product_forward::primitive_desc(desc, Context::default_attr(), engine);
  forward_ = dnnl::inner_product_forward(forward_pd_);

  weights_plain_ = forward_pd_.weights_desc() == plain_desc(weight_dims_);
  if (weights_plain_) {
    weights_mem_ = memory(forward_pd_.weights_desc(), engine, weight_.value.data());
    to_weights_ = {};
  } else {
    weights_mem_ = memory(forward_pd_.weights_desc(), engine);
    to_weights_ = dnnl::reorder(
        dnnl::reorder::primitive_desc(engine, plain_desc(weight_dims_), engine, forward_pd_.weights_desc()));
  }
  bias_mem_ = options_.bias ? memory(bias_desc, engine, bias_.value.data()) : memory();
  weights_converted_ = false;
  dst_ = Tensor(forward_pd_.dst_desc());
  src_ = Tensor();
  backward_data_pd_ = {};
  backward_data_ = {};
  backward_weights_pd_ = {};
  backward_weights_ = {};
  diff_src_ = Tensor();
  return forward_pd_.dst_desc();
}

const Tensor& Linear::do_forward(const Tensor& src) {
  check_params();
  auto& context = Context::get();
  // The optimizer updates Param::value between forwards: bring the current values into the primitive's layout
  // (or point at them, which also follows a vector that was reassigned).
  // In bf16 with fixed weights (inference) the conversion runs once per setup.
  const bool fixed = compute_ != memory::data_type::f32 && weights_ == Weights::fixed;
  if (weights_plain_) {
    weights_mem_.set_data_handle(weight_.value.data());
  } else if (!fixed || !weights_converted_) {
    memory plain = wrap_plain(weight_.value, weight_dims_);
    to_weights_.execute(context.stream(), plain, weights_mem_);
  }
  weights_converted_ = fixed;
  const Tensor& in = src_reorder_(src, forward_pd_.src_desc());
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, in.memory()}, {DNNL_ARG_WEIGHTS, weights_mem_}, {DNNL_ARG_DST, dst_.memory()}};
  if (options_.bias) {
    bias_mem_.set_data_handle(bias_.value.data());
    args.emplace(DNNL_ARG_BIAS, bias_mem_);
  }
  context.execute(forward_, forward_pd_, std::move(args));
  src_ = in;  // what the primitive read: backward weights reads it again
  return dst_;
}

void Linear::setup_backward() {
  const auto& engine = Context::get().engine();
  // bf16: src, weights and both diffs of the data in bfloat16 (dst itself is float32); the weight and bias
  // gradients in float32.
  const memory::desc any(weight_dims_, memory::data_type::f32, memory::format_tag::any);
  const memory::desc weights_any(weight_dims_, compute_, memory::format_tag::any);
  const memory::desc bias_desc({options_.out}, memory::data_type::f32, memory::format_tag::a);
  const memory::desc src_md = forward_pd_.src_desc();
  const memory::desc diff_dst_md = with_data_type(forward_pd_.dst_desc(), compute_);
  const auto weights_desc = options_.bias
                                ? dnnl::inner_product_backward_weights::desc(src_md, any, bias_desc, diff_dst_md)
                                : dnnl::inner_product_backward_weights::desc(src_md, any, diff_dst_md);
  backward_weights_pd_ =
      dnnl::inner_product_backward_weights::primitive_desc(weights_desc, Context::default_attr(), engine, forward_pd_);
  backward_weights_ = dnnl::inner_product_backward_weights(backward_weights_pd_);
  diff_weights_ = Tensor(backward_weights_pd_.diff_weights_desc());
  diff_bias_ = options_.bias ? Tensor(backward_weights_pd_.diff_bias_desc()) : Tensor();

  // diff_src in the layout src came in (in bf16, with the type the primitive read), so the producer gets its
  // gradient in the layout it works in.
  const dnnl::inner_product_backward_data::desc data_desc(src_md, weights_any, diff_dst_md);
  backward_data_pd_ =
      dnnl::inner_product_backward_data::primitive_desc(data_desc, Context::default_attr(), engine, forward_pd_);
  backward_data_ = dnnl::inner_product_backward_data(backward_data_pd_);
  diff_src_ = Tensor(backward_data_pd_.diff_src_desc());
  // Backward data often wants the weights untransposed ([out, in] itself for a plain src), while the forward
  // gemm prefers them transposed: then the Param's own buffer serves without a copy.
  backward_weights_plain_ = backward_data_pd_.weights_desc() == plain_desc(weight_dims_);
  if (backward_weights_plain_ || backward_data_pd_.weights_desc() == forward_pd_.weights_desc()) {
    backward_weights_mem_ = memory();
    to_backward_weights_ = {};
  } else {
    backward_weights_mem_ = memory(backward_data_pd_.weights_desc(), engine);
    to_backward_weights_ = dnnl::reorder(
        dnnl::reorder::primitive_desc(engine, plain_desc(weight_dims_), engine, backward_data_pd_.weights_desc()));
  }
}

const Tensor& Linear::do_backward(const Tensor& diff_dst) {
  if (compute_ == memory::data_type::bf16 && weights_ == Weights::fixed) {
    fail("bf16 backward with fixed weights (converted once per setup): training sets Weights::trained");
  }
  check_params();
  if (!backward_weights_) setup_backward();
  auto& context = Context::get();
  const Tensor& dd = diff_dst_reorder_(diff_dst, backward_weights_pd_.diff_dst_desc());

  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src_.memory()}, {DNNL_ARG_DIFF_DST, dd.memory()}, {DNNL_ARG_DIFF_WEIGHTS, diff_weights_.memory()}};
  if (options_.bias) args.emplace(DNNL_ARG_DIFF_BIAS, diff_bias_.memory());
  context.execute(backward_weights_, backward_weights_pd_, std::move(args));
  accumulate_weight_grad_(diff_weights_.memory(), wrap_plain(weight_.grad, weight_dims_));
  if (options_.bias) accumulate_bias_grad_(diff_bias_.memory(), wrap_plain(bias_.grad, {options_.out}));

  if (!propagate_down()) return no_tensor();
  // The weights of the last forward: the Param's values (an optimizer step comes after backward).
  memory weights = weights_mem_;
  if (backward_weights_plain_) {
    weights = wrap_plain(weight_.value, weight_dims_);
  } else if (to_backward_weights_) {
    memory plain = wrap_plain(weight_.value, weight_dims_);
    to_backward_weights_.execute(context.stream(), plain, backward_weights_mem_);
    weights = backward_weights_mem_;
  }
  context.execute(
      backward_data_, backward_data_pd_,
      {{DNNL_ARG_DIFF_DST, dd.memory()}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DIFF_SRC, diff_src_.memory()}});
  return diff_src_;
}

}  // namespace tessera::engine
