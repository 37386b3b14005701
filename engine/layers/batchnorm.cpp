#include "engine/layers/batchnorm.h"

#include <cstddef>
#include <utility>

#include "engine/context.h"

namespace tessera::engine {

using dnnl::memory;
using flag = dnnl::normalization_flags;

namespace {

// A [C] parameter filled with `value`, gradient zero.
Param channel_param(std::string name, ParamKind kind, int channels, float value) {
  Param p;
  p.name = std::move(name);
  p.kind = kind;
  p.shape = {channels};
  p.value.assign(static_cast<std::size_t>(channels), value);
  p.grad.assign(p.value.size(), 0.0f);
  return p;
}

}  // namespace

BatchNorm2d::BatchNorm2d(std::string name, int channels, const BatchNorm2dOptions& options)
    : Module(std::move(name)), channels_(channels), options_(options) {
  if (channels_ <= 0) fail("channels must be positive, got " + std::to_string(channels_));
  if (!(options_.eps > 0.0f) || options_.momentum < 0.0f || options_.momentum > 1.0f) {
    fail("eps must be positive and momentum in [0, 1]");
  }
  weight_ = channel_param(child_name("weight"), ParamKind::norm_weight, channels_, 1.0f);
  bias_ = channel_param(child_name("bias"), ParamKind::norm_bias, channels_, 0.0f);
  running_mean_ = Buffer{child_name("running_mean"), {channels_}, std::vector<float>(channels_, 0.0f)};
  running_var_ = Buffer{child_name("running_var"), {channels_}, std::vector<float>(channels_, 1.0f)};
}

void BatchNorm2d::set_momentum(float momentum) {
  if (!(momentum >= 0.0f && momentum <= 1.0f)) fail("momentum must be in [0, 1], got " + std::to_string(momentum));
  options_.momentum = momentum;
}

void BatchNorm2d::collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) {
  params.push_back(&weight_);
  params.push_back(&bias_);
  buffers.push_back(&running_mean_);
  buffers.push_back(&running_var_);
}

void BatchNorm2d::set_folded() {
  folded_ = true;
  invalidate_setup();
}

dnnl::normalization_flags BatchNorm2d::flags(Mode mode) const {
  flag f = flag::use_scale | flag::use_shift;
  if (mode == Mode::eval) f = f | flag::use_global_stats;
  if (options_.relu) f = f | flag::fuse_norm_relu;
  return f;
}

BatchNorm2d::Primitives& BatchNorm2d::primitives(Mode mode) {
  Primitives& p = mode == Mode::train ? train_ : eval_;
  if (p.built) return p;
  try {
    // forward_training in eval too: with use_global_stats it normalizes by the running statistics all the same,
    // and it keeps the fused ReLU's workspace, so a frozen-statistics backward (fine-tuning) is possible.
    p.fwd_pd = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, src_md_, options_.eps, flags(mode)),
        Context::default_attr(), Context::get().engine());
    p.fwd = dnnl::batch_normalization_forward(p.fwd_pd);
  } catch (const dnnl::error& e) {
    fail(std::string("oneDNN cannot create the batch normalization: ") + e.what());
  }
  p.built = true;
  return p;
}

void BatchNorm2d::build_backward(Primitives& p, Mode mode) {
  try {
    p.bwd_pd = dnnl::batch_normalization_backward::primitive_desc(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, p.fwd_pd.dst_desc(), src_md_, options_.eps,
                                                 flags(mode)),
        Context::default_attr(), Context::get().engine(), p.fwd_pd);
    p.bwd = dnnl::batch_normalization_backward(p.bwd_pd);
  } catch (const dnnl::error& e) {
    fail(std::string("oneDNN cannot create the batch normalization backward: ") + e.what());
  }
  if (diff_src_.empty() || diff_src_.desc() != p.bwd_pd.diff_src_desc()) diff_src_ = Tensor(p.bwd_pd.diff_src_desc());
  p.backward_built = true;
}

memory::desc BatchNorm2d::do_setup(const memory::desc& src) {
  const dims_t dims = src.dims();
  if (dims.size() != 4) fail("input must be N×C×H×W, got " + std::to_string(dims.size()) + " dimensions");
  if (dims[1] != channels_) {
    fail("input has " + std::to_string(dims[1]) + " channels, expected " + std::to_string(channels_));
  }
  train_ = Primitives();
  eval_ = Primitives();
  src_md_ = src;
  src_saved_ = Tensor();
  diff_src_ = Tensor();
  workspace_ = Tensor();
  if (folded_) return src;
  const Primitives& p = primitives(mode());
  dst_ = Tensor(p.fwd_pd.dst_desc());
  mean_ = Tensor(p.fwd_pd.mean_desc());
  variance_ = Tensor(p.fwd_pd.variance_desc());
  return p.fwd_pd.dst_desc();
}

const Tensor& BatchNorm2d::do_forward(const Tensor& src) {
  if (folded_) {
    if (mode() == Mode::train) fail("a folded batch norm cannot train");
    return src;
  }
  const Mode m = mode();
  Primitives& p = primitives(m);
  const dims_t dims = src.dims();
  if (m == Mode::train && dims[0] * dims[2] * dims[3] <= 1) {
    fail("training needs more than one value per channel (N·H·W = 1)");
  }
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, src.memory()},
                                          {DNNL_ARG_DST, dst_.memory()},
                                          {DNNL_ARG_SCALE, wrap_plain(weight_.value, weight_.shape)},
                                          {DNNL_ARG_SHIFT, wrap_plain(bias_.value, bias_.shape)}};
  if (m == Mode::train) {
    args.emplace(DNNL_ARG_MEAN, mean_.memory());
    args.emplace(DNNL_ARG_VARIANCE, variance_.memory());
  } else {
    args.emplace(DNNL_ARG_MEAN, wrap_plain(running_mean_.value, running_mean_.shape));
    args.emplace(DNNL_ARG_VARIANCE, wrap_plain(running_var_.value, running_var_.shape));
  }
  if (options_.relu) {
    if (workspace_.empty() || workspace_.desc() != p.fwd_pd.workspace_desc()) {
      workspace_ = Tensor(p.fwd_pd.workspace_desc());
    }
    args.emplace(DNNL_ARG_WORKSPACE, workspace_.memory());
  }
  Context::get().execute(p.fwd, p.fwd_pd, std::move(args));
  if (m == Mode::train) update_running_stats();
  src_saved_ = src;
  forward_mode_ = m;
  return dst_;
}

void BatchNorm2d::update_running_stats() {
  const dims_t dims = src_md_.dims();
  const double count = static_cast<double>(dims[0] * dims[2] * dims[3]);
  const double unbias = count / (count - 1.0);
  const float* mean = mean_.data();
  const float* var = variance_.data();
  const float m = options_.momentum;
  for (int c = 0; c < channels_; ++c) {
    running_mean_.value[c] = (1.0f - m) * running_mean_.value[c] + m * mean[c];
    running_var_.value[c] = static_cast<float>((1.0f - m) * running_var_.value[c] + m * var[c] * unbias);
  }
}

const Tensor& BatchNorm2d::do_backward(const Tensor& diff_dst) {
  if (folded_) fail("a folded batch norm has no backward");
  Primitives& p = primitives(forward_mode_);
  if (!p.backward_built) build_backward(p, forward_mode_);
  const auto c = static_cast<std::size_t>(channels_);
  diff_scale_.assign(c, 0.0f);
  diff_shift_.assign(c, 0.0f);
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, src_saved_.memory()},
      {DNNL_ARG_DIFF_DST, diff_dst_reorder_(diff_dst, p.bwd_pd.diff_dst_desc()).memory()},
      {DNNL_ARG_SCALE, wrap_plain(weight_.value, weight_.shape)},
      {DNNL_ARG_SHIFT, wrap_plain(bias_.value, bias_.shape)},  // not used, but oneDNN 2.6 insists on it
      {DNNL_ARG_DIFF_SRC, diff_src_.memory()},
      {DNNL_ARG_DIFF_SCALE, wrap_plain(diff_scale_, weight_.shape)},
      {DNNL_ARG_DIFF_SHIFT, wrap_plain(diff_shift_, bias_.shape)}};
  if (forward_mode_ == Mode::train) {
    args.emplace(DNNL_ARG_MEAN, mean_.memory());
    args.emplace(DNNL_ARG_VARIANCE, variance_.memory());
  } else {
    args.emplace(DNNL_ARG_MEAN, wrap_plain(running_mean_.value, running_mean_.shape));
    args.emplace(DNNL_ARG_VARIANCE, wrap_plain(running_var_.value, running_var_.shape));
  }
  if (options_.relu) args.emplace(DNNL_ARG_WORKSPACE, workspace_.memory());
  Context::get().execute(p.bwd, p.bwd_pd, std::move(args));
  for (std::size_t i = 0; i < c; ++i) {
    weight_.grad[i] += diff_scale_[i];
    bias_.grad[i] += diff_shift_[i];
  }
  // oneDNN's batch-norm backward always produces diff_src; it is simply not returned when not wanted.
  return propagate_down() ? diff_src_ : no_tensor();
}

}  // namespace tessera::engine
