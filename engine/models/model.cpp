#include "engine/models/model.h"

#include <cstdio>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/measure.h"
#include "core/random.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/conv.h"
#include "engine/layers/dropout.h"
#include "engine/layers/fold.h"
#include "engine/layers/global_pool.h"
#include "engine/layers/linear.h"
#include "engine/layers/pool.h"
#include "engine/layers/relu.h"
#include "engine/models/adaptive_pool.h"

namespace tessera::engine {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

std::string type_label(const Module& m) {
  if (const auto* conv = dynamic_cast<const Conv2d*>(&m); conv && conv->options().relu) return "Conv2d+ReLU";
  if (const auto* bn = dynamic_cast<const BatchNorm2d*>(&m); bn && bn->options().relu && !bn->folded()) {
    return "BatchNorm2d+ReLU";
  }
  return m.type();
}

void collect_dropouts(Module& m, std::vector<Dropout*>& out) {
  if (auto* d = dynamic_cast<Dropout*>(&m)) out.push_back(d);
  for (Module* child : children_of(m)) collect_dropouts(*child, out);
}

void collect_batch_norms(Module& m, std::vector<BatchNorm2d*>& out) {
  if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) out.push_back(bn);
  for (Module* child : children_of(m)) collect_batch_norms(*child, out);
}

}  // namespace

std::string FeatureShape::text() const { return flat() ? str(c) : str(c) + "x" + str(h) + "x" + str(w); }

bool trace_module(const Module& m, FeatureShape& s, LayerCost& cost, std::string& why) {
  const auto refuse = [&](const std::string& what) {
    why = "'" + m.name() + "' (" + m.type() + ") gets " + s.text() + ": " + what;
    return false;
  };
  if (const auto* conv = dynamic_cast<const Conv2d*>(&m)) {
    const Conv2dOptions& o = conv->options();
    if (s.flat() || s.c != o.in) return refuse("it needs " + str(o.in) + " input channels");
    const int oh = conv->output_size(static_cast<int>(s.h)), ow = conv->output_size(static_cast<int>(s.w));
    if (oh < 1 || ow < 1) return refuse("too small for its " + str(o.kernel) + "x" + str(o.kernel) + " kernel");
    cost.params += conv->weight().numel() + (conv->bias() ? conv->bias()->numel() : 0);
    cost.flops += 2LL * o.out * o.in * o.kernel * o.kernel * oh * ow;
    s = {o.out, oh, ow};
    return true;
  }
  if (const auto* bn = dynamic_cast<const BatchNorm2d*>(&m)) {
    if (s.flat() || s.c != bn->channels()) return refuse("it needs " + str(bn->channels()) + " channels");
    cost.params += bn->weight().numel() + bn->bias().numel();
    return true;
  }
  if (const auto* pool = dynamic_cast<const Pool2d*>(&m)) {
    const Pool2dOptions& o = pool->options();
    if (s.flat()) return refuse("it needs an image");
    if (s.h + 2 * o.padding < o.kernel || s.w + 2 * o.padding < o.kernel) {
      return refuse("smaller than its " + str(o.kernel) + "x" + str(o.kernel) + " window");
    }
    s = {s.c, (s.h + 2 * o.padding - o.kernel) / o.stride + 1, (s.w + 2 * o.padding - o.kernel) / o.stride + 1};
    return true;
  }
  if (dynamic_cast<const AdaptiveAvgPool2d*>(&m)) {
    if (s.flat()) return refuse("it needs an image");
    s = {s.c, 0, 0};
    return true;
  }
  if (const auto* pool = dynamic_cast<const AdaptiveAvgPool2dTo*>(&m)) {
    if (s.flat()) return refuse("it needs an image");
    s = {s.c, pool->out_h(), pool->out_w()};
    return true;
  }
  if (const auto* linear = dynamic_cast<const Linear*>(&m)) {
    const LinearOptions& o = linear->options();
    if (s.numel() != o.in) return refuse("it needs " + str(o.in) + " features");
    cost.params += linear->weight().numel() + (linear->bias() ? linear->bias()->numel() : 0);
    cost.flops += 2LL * o.in * o.out;
    s = {o.out, 0, 0};
    return true;
  }
  if (dynamic_cast<const ReLU*>(&m) || dynamic_cast<const Dropout*>(&m)) return true;
  if (const auto* seq = dynamic_cast<const Sequential*>(&m)) {
    for (std::size_t i = 0; i < seq->size(); ++i) {
      if (!trace_module((*seq)[i], s, cost, why)) return false;
    }
    return true;
  }
  if (const auto* block = dynamic_cast<const Block*>(&m)) return block->trace(s, cost, why);
  throw core::InternalError("model trace: module '" + m.name() + "' of type " + m.type() + " is not known");
}

std::vector<Module*> children_of(Module& module) {
  std::vector<Module*> children;
  if (auto* seq = dynamic_cast<Sequential*>(&module)) {
    for (std::size_t i = 0; i < seq->size(); ++i) children.push_back(&(*seq)[i]);
  } else if (auto* block = dynamic_cast<Block*>(&module)) {
    children = block->children();
  }
  return children;
}

void fold_batchnorm_in(Module& module) {
  const std::vector<Module*> children = children_of(module);
  for (std::size_t i = 0; i < children.size(); ++i) {
    auto* conv = dynamic_cast<Conv2d*>(children[i]);
    auto* bn = i + 1 < children.size() ? dynamic_cast<BatchNorm2d*>(children[i + 1]) : nullptr;
    if (conv && bn) {
      fold_batchnorm(*conv, *bn);
      ++i;
    } else {
      fold_batchnorm_in(*children[i]);
    }
  }
}

Model::Model(std::string type, const ModelOptions& options)
    : Module(""), type_(std::move(type)), options_(options), body_("") {}

void Model::refuse(const std::string& message) const {
  throw core::InternalError(options_.architecture + " (" + type_ + "): " + message);
}

const Tensor& Model::forward(const std::vector<float>& batch, int n, int h, int w) {
  const dims_t dims = {n, options_.channels, h, w};
  if (n < 1 || h < 1 || w < 1 || static_cast<std::int64_t>(batch.size()) != product(dims)) {
    refuse("forward: " + std::to_string(batch.size()) + " values are not a batch of " + std::to_string(n) + "x" +
           std::to_string(options_.channels) + "x" + std::to_string(h) + "x" + std::to_string(w));
  }
  if (input_.empty() || input_.dims() != dims) input_ = Tensor::plain(dims);
  std::memcpy(input_.data(), batch.data(), batch.size() * sizeof(float));
  return forward(input_);
}

void Model::set_mode(Mode mode) {
  if (folded_ && mode == Mode::train) refuse("the model is folded for inference and cannot train");
  Module::set_mode(mode);
  body_.set_mode(mode);
}

void Model::set_propagate_down(bool propagate) {
  Module::set_propagate_down(propagate);
  body_.set_propagate_down(propagate);
}

void Model::collect(std::vector<Param*>& params, std::vector<Buffer*>& buffers) { body_.collect(params, buffers); }

std::vector<Param*> Model::parameters() {
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  collect(params, buffers);
  return params;
}

std::vector<Buffer*> Model::buffers() {
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  collect(params, buffers);
  return buffers;
}

bool Model::trace(int input_size, std::vector<LayerSummary>* rows, std::string& why) const {
  FeatureShape shape{options_.channels, input_size, input_size};
  if (input_size < 1) {
    why = "the input size must be positive";
    return false;
  }
  const auto row = [&](const Module& m) {
    LayerCost cost;
    if (!trace_module(m, shape, cost, why)) return false;
    if (rows) rows->push_back({m.name(), type_label(m), shape, cost.params, cost.flops});
    return true;
  };
  for (std::size_t i = 0; i < body_.size(); ++i) {
    const Module& m = body_[i];
    if (const auto* seq = dynamic_cast<const Sequential*>(&m)) {
      for (std::size_t j = 0; j < seq->size(); ++j) {
        if (!row((*seq)[j])) return false;
      }
    } else if (!row(m)) {
      return false;
    }
  }
  if (!shape.flat() || shape.c != options_.num_classes) {
    why = "the last layer gives " + shape.text() + ", not " + std::to_string(options_.num_classes) + " logits";
    return false;
  }
  return true;
}

int Model::minimum_input_size(int limit) const {
  std::string why;
  for (int s = 1; s <= limit; ++s) {
    if (trace(s, nullptr, why)) return s;
  }
  return 0;
}

std::vector<LayerSummary> Model::layers(int input_size) const {
  std::vector<LayerSummary> rows;
  std::string why;
  if (!trace(input_size, &rows, why)) {
    const int minimum = minimum_input_size();
    std::string message = options_.architecture + " cannot take a " + std::to_string(input_size) + " px input: " + why;
    if (minimum > 0) message += " (the smallest input it takes is " + std::to_string(minimum) + " px)";
    throw core::ConfigError(message, "", 0, "model.input_size");
  }
  return rows;
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& row : layers(options_.input_size)) n += row.params;
  return n;
}

std::int64_t Model::flops(int input_size) const {
  std::int64_t n = 0;
  for (const auto& row : layers(input_size)) n += row.flops;
  return n;
}

std::string Model::summary() const {
  const std::vector<LayerSummary> rows = layers(options_.input_size);
  std::int64_t params = 0, flops = 0;
  for (const auto& row : rows) {
    params += row.params;
    flops += row.flops;
  }
  char line[256];
  std::snprintf(line, sizeof line, "%s (%s): input %dx%dx%d, %d classes, %s parameters, %.3f GFLOP/image forward%s\n",
                options_.architecture.c_str(), type_.c_str(), options_.channels, options_.input_size,
                options_.input_size, options_.num_classes, core::grouped(params).c_str(),
                static_cast<double>(flops) * 1e-9, folded_ ? ", batch norm folded" : "");
  std::string out = line;
  std::snprintf(line, sizeof line, "  %-16s %-18s %-14s %13s %10s\n", "layer", "type", "output", "params", "MFLOP");
  out += line;
  for (const auto& row : rows) {
    std::snprintf(line, sizeof line, "  %-16s %-18s %-14s %13s %10.1f\n", row.name.c_str(), row.type.c_str(),
                  row.output.text().c_str(), core::grouped(row.params).c_str(), static_cast<double>(row.flops) * 1e-6);
    out += line;
  }
  return out;
}

void Model::fold_batchnorm() {
  if (folded_) return;
  set_mode(Mode::eval);
  fold_batchnorm_in(body_);
  folded_ = true;
  invalidate_setup();
}

std::vector<BatchNorm2d*> Model::batch_norms() {
  std::vector<BatchNorm2d*> out;
  collect_batch_norms(body_, out);
  return out;
}

void Model::reseed(std::uint64_t seed) {
  std::vector<Dropout*> dropouts;
  collect_dropouts(body_, dropouts);
  // Each dropout layer gets its own stream from the model's seed.
  for (std::size_t i = 0; i < dropouts.size(); ++i) {
    dropouts[i]->seed(core::splitmix64(seed ^ core::splitmix64(i + 1)));
  }
}

dnnl::memory::desc Model::do_setup(const dnnl::memory::desc& src) {
  const dims_t d = src.dims();
  if (d.size() != 4 || d[1] != options_.channels) {
    std::string shape;
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (i > 0) shape += 'x';
      shape += std::to_string(d[i]);
    }
    refuse("expects an N×" + std::to_string(options_.channels) + "×H×W batch, got " + shape);
  }
  return plain_desc(body_.setup(src).dims());
}

const Tensor& Model::do_forward(const Tensor& src) {
  const Tensor& logits = body_.forward(src);
  return logits_reorder_(logits, dst_desc());
}

const Tensor& Model::do_backward(const Tensor& diff_dst) { return body_.backward(diff_dst); }

}  // namespace tessera::engine
