// The model zoo: registry, torchvision state-dict names and shapes, forward at odd sizes, a whole ResNet-18
// against the naive reference kernels, batch-norm folding, a checkpoint written by PyTorch, gradient checks of
// small residual networks end to end, initialisation, adaptive pooling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "engine/inference.h"
#include "engine/models/adaptive_pool.h"
#include "engine/models/init.h"
#include "engine/models/model.h"
#include "engine/models/registry.h"
#include "engine/models/resnet.h"
#include "engine/reference/batchnorm.h"
#include "engine/reference/conv.h"
#include "engine/reference/elementwise.h"
#include "engine/reference/linear.h"
#include "engine/reference/pool.h"
#include "engine/reference/relu.h"
#include "io/checkpoint.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"
#include "tests/engine/model_checkpoints.h"
#include "tests/testing/testing.h"

namespace tessera::engine {
namespace {

using testing::all_near;
using testing::fixture_input;
using testing::load_model;
using testing::make_tensor;

using Shape = std::vector<std::int64_t>;
struct Entry {
  std::string name;
  Shape shape;
};

bool is_buffer(const std::string& name) {
  const auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".running_mean") || ends(".running_var");
}

// A torchvision BatchNorm2d's state_dict entries (without num_batches_tracked).
void bn(std::vector<Entry>& list, const std::string& prefix, std::int64_t c) {
  for (const char* leaf : {"weight", "bias", "running_mean", "running_var"}) list.push_back({prefix + "." + leaf, {c}});
}

// Compares the model's collect() with a torchvision state_dict listing in its order: parameters and buffers
// each keep the relative order of the listing.
void expect_state_dict(Model& model, const std::vector<Entry>& expected) {
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  model.collect(params, buffers);
  std::vector<std::string> want_params, want_buffers, got_params, got_buffers;
  std::map<std::string, Shape> shapes;
  for (const auto& e : expected) {
    (is_buffer(e.name) ? want_buffers : want_params).push_back(e.name);
    shapes[e.name] = e.shape;
  }
  for (const Param* p : params) {
    got_params.push_back(p->name);
    EXPECT_EQ(p->shape, shapes[p->name]) << p->name;
    EXPECT_EQ(static_cast<std::int64_t>(p->value.size()), p->numel()) << p->name;
  }
  for (const Buffer* b : buffers) {
    got_buffers.push_back(b->name);
    EXPECT_EQ(b->shape, shapes[b->name]) << b->name;
  }
  EXPECT_EQ(got_params, want_params);
  EXPECT_EQ(got_buffers, want_buffers);
}

std::int64_t counted(Model& model) {
  std::int64_t n = 0;
  for (const Param* p : model.parameters()) n += p->numel();
  return n;
}

ModelOptions options_for(const std::string& architecture, int input_size, int classes) {
  ModelOptions o;
  o.architecture = architecture;
  o.input_size = input_size;
  o.num_classes = classes;
  o.classifier_width = 32;  // small AlexNet / VGG classifiers keep the tests light
  o.seed = 42;
  return o;
}

// Non-trivial batch-norm affine parameters and running statistics, so that eval-mode batch norm is not an
// identity (a fresh model has mean 0, var 1, weight 1, bias 0).
void randomize_batchnorm(Model& model, std::uint32_t seed) {
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  model.collect(params, buffers);
  for (Param* p : params) {
    const auto n = p->value.size();
    if (p->kind == ParamKind::norm_weight) p->value = gradcheck::random_vector(n, seed++, 0.5f, 1.5f);
    if (p->kind == ParamKind::norm_bias) p->value = gradcheck::random_vector(n, seed++, -0.2f, 0.2f);
  }
  for (Buffer* b : buffers) {
    const bool mean = b->name.ends_with("running_mean");
    b->value = gradcheck::random_vector(b->value.size(), seed++, mean ? -0.2f : 0.5f, mean ? 0.2f : 2.0f);
  }
}

std::vector<float> input_batch(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, std::uint32_t seed) {
  return gradcheck::random_vector(static_cast<std::size_t>(n * c * h * w), seed);
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// ---------------------------------------------------------------------------------------------------------------
// Registry.

TEST(ModelRegistry, ListsEveryArchitectureOnce) {
  const std::vector<std::string> names = model_names();
  for (const char* name : {"lenet5", "alexnet", "vgg11", "vgg11_bn", "vgg16", "vgg16_bn", "resnet18", "resnet34",
                           "resnet50", "compact", "tiny_cnn"}) {
    EXPECT_EQ(std::count(names.begin(), names.end(), name), 1) << name;
  }
  for (const auto& entry : model_registry()) EXPECT_NE(std::string(entry.doc), "") << entry.name;
}

TEST(ModelRegistry, UnknownNameIsAConfigErrorListingTheKnownOnes) {
  ModelOptions o;
  o.architecture = "resnet81";
  try {
    make_model(o);
    FAIL() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "model.architecture");
    const std::string what = e.what();
    for (const auto& name : model_names()) EXPECT_NE(what.find(name), std::string::npos) << name << " in " << what;
    EXPECT_NE(what.find("did you mean 'resnet18'"), std::string::npos) << what;
  }
}

TEST(ModelRegistry, BadOptionsNameTheirKey) {
  const auto key_of = [](const ModelOptions& o) {
    try {
      make_model(o);
    } catch (const core::ConfigError& e) {
      return e.key();
    }
    return std::string("no error");
  };
  ModelOptions o = options_for("tiny_cnn", 8, 2);
  o.num_classes = 0;
  EXPECT_EQ(key_of(o), "model.num_classes");
  o = options_for("tiny_cnn", 8, 2);
  o.dropout = 1.0f;
  EXPECT_EQ(key_of(o), "model.dropout");
  o = options_for("compact", 8, 2);
  o.width = 0;
  EXPECT_EQ(key_of(o), "model.width");
  o = options_for("lenet5", 15, 2);
  EXPECT_EQ(key_of(o), "model.input_size");
  EXPECT_EQ(key_of(options_for("lenet5", 16, 2)), "no error");
}

TEST(ModelRegistry, TooSmallInputNamesTheLayerAndTheSmallestSize) {
  try {
    make_model(options_for("alexnet", 62, 2));
    FAIL() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "model.input_size");
    const std::string what = e.what();
    EXPECT_NE(what.find("features.12"), std::string::npos) << what;  // the third max-pool
    EXPECT_NE(what.find("smallest input it takes is 63 px"), std::string::npos) << what;
  }
  auto vgg = make_model(options_for("vgg11", 32, 2));
  EXPECT_EQ(vgg->minimum_input_size(), 32);
  EXPECT_THROW(vgg->flops(31), core::ConfigError);
  EXPECT_EQ(make_model(options_for("compact", 96, 2))->minimum_input_size(), 16);
}

// ---------------------------------------------------------------------------------------------------------------
// torchvision state dicts.

TEST(ModelStateDict, ResNet18IsTorchvisions) {
  std::vector<Entry> want = {{"conv1.weight", {64, 3, 7, 7}}};
  bn(want, "bn1", 64);
  const auto block = [&](const std::string& p, std::int64_t in, std::int64_t c, bool down) {
    want.push_back({p + ".conv1.weight", {c, in, 3, 3}});
    bn(want, p + ".bn1", c);
    want.push_back({p + ".conv2.weight", {c, c, 3, 3}});
    bn(want, p + ".bn2", c);
    if (down) {
      want.push_back({p + ".downsample.0.weight", {c, in, 1, 1}});
      bn(want, p + ".downsample.1", c);
    }
  };
  block("layer1.0", 64, 64, false);
  block("layer1.1", 64, 64, false);
  block("layer2.0", 64, 128, true);
  block("layer2.1", 128, 128, false);
  block("layer3.0", 128, 256, true);
  block("layer3.1", 256, 256, false);
  block("layer4.0", 256, 512, true);
  block("layer4.1", 512, 512, false);
  want.push_back({"fc.weight", {1000, 512}});
  want.push_back({"fc.bias", {1000}});
  ASSERT_EQ(want.size(), 62u + 40u);  // torchvision: 102 entries besides the 20 num_batches_tracked

  auto model = make_model(options_for("resnet18", 224, 1000));
  expect_state_dict(*model, want);
  EXPECT_EQ(counted(*model), 11689512);
  EXPECT_EQ(model->parameter_count(), 11689512);
}

TEST(ModelStateDict, ResNet50IsTorchvisions) {
  // torchvision's resnet50: Bottleneck blocks (1×1, 3×3 with the stride, 1×1 to 4·planes), [3, 4, 6, 3].
  std::vector<Entry> want = {{"conv1.weight", {64, 3, 7, 7}}};
  bn(want, "bn1", 64);
  std::int64_t in = 64;
  const std::int64_t blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t planes = 64 << stage, out = planes * 4;
    for (std::int64_t b = 0; b < blocks[stage]; ++b) {
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      want.push_back({p + ".conv1.weight", {planes, in, 1, 1}});
      bn(want, p + ".bn1", planes);
      want.push_back({p + ".conv2.weight", {planes, planes, 3, 3}});
      bn(want, p + ".bn2", planes);
      want.push_back({p + ".conv3.weight", {out, planes, 1, 1}});
      bn(want, p + ".bn3", out);
      if (b == 0) {
        want.push_back({p + ".downsample.0.weight", {out, in, 1, 1}});
        bn(want, p + ".downsample.1", out);
      }
      in = out;
    }
  }
  want.push_back({"fc.weight", {1000, 2048}});
  want.push_back({"fc.bias", {1000}});
  ASSERT_EQ(want.size(), 161u + 106u);

  auto model = make_model(options_for("resnet50", 224, 1000));
  expect_state_dict(*model, want);
  EXPECT_EQ(counted(*model), 25557032);
}

TEST(ModelStateDict, Vgg11IsTorchvisions) {
  const std::vector<Entry> want = {
      {"features.0.weight", {64, 3, 3, 3}},     {"features.0.bias", {64}},
      {"features.3.weight", {128, 64, 3, 3}},   {"features.3.bias", {128}},
      {"features.6.weight", {256, 128, 3, 3}},  {"features.6.bias", {256}},
      {"features.8.weight", {256, 256, 3, 3}},  {"features.8.bias", {256}},
      {"features.11.weight", {512, 256, 3, 3}}, {"features.11.bias", {512}},
      {"features.13.weight", {512, 512, 3, 3}}, {"features.13.bias", {512}},
      {"features.16.weight", {512, 512, 3, 3}}, {"features.16.bias", {512}},
      {"features.18.weight", {512, 512, 3, 3}}, {"features.18.bias", {512}},
      {"classifier.0.weight", {4096, 25088}},   {"classifier.0.bias", {4096}},
      {"classifier.3.weight", {4096, 4096}},    {"classifier.3.bias", {4096}},
      {"classifier.6.weight", {1000, 4096}},    {"classifier.6.bias", {1000}},
  };
  ModelOptions o = options_for("vgg11", 224, 1000);
  o.classifier_width = 4096;
  auto model = make_model(o);
  expect_state_dict(*model, want);
  EXPECT_EQ(counted(*model), 132863336);
}

TEST(ModelStateDict, AlexNetIsTorchvisions) {
  const std::vector<Entry> want = {
      {"features.0.weight", {64, 3, 11, 11}},   {"features.0.bias", {64}},
      {"features.3.weight", {192, 64, 5, 5}},   {"features.3.bias", {192}},
      {"features.6.weight", {384, 192, 3, 3}},  {"features.6.bias", {384}},
      {"features.8.weight", {256, 384, 3, 3}},  {"features.8.bias", {256}},
      {"features.10.weight", {256, 256, 3, 3}}, {"features.10.bias", {256}},
      {"classifier.1.weight", {4096, 9216}},    {"classifier.1.bias", {4096}},
      {"classifier.4.weight", {4096, 4096}},    {"classifier.4.bias", {4096}},
      {"classifier.6.weight", {1000, 4096}},    {"classifier.6.bias", {1000}},
  };
  ModelOptions o = options_for("alexnet", 224, 1000);
  o.classifier_width = 4096;
  auto model = make_model(o);
  expect_state_dict(*model, want);
  EXPECT_EQ(counted(*model), 61100840);
}

TEST(ModelStateDict, Vgg11BnKeepsTorchvisionsIndices) {
  // vgg11_bn: conv, BN, ReLU per entry, so the convs sit at 0, 4, 8, 11, 15, 18, 22, 25 and their BNs one after.
  std::vector<Entry> want;
  const std::int64_t channels[] = {64, 128, 256, 256, 512, 512, 512, 512};
  const int conv_index[] = {0, 4, 8, 11, 15, 18, 22, 25};
  std::int64_t in = 3;
  for (int i = 0; i < 8; ++i) {
    const std::string conv = "features." + std::to_string(conv_index[i]);
    want.push_back({conv + ".weight", {channels[i], in, 3, 3}});
    want.push_back({conv + ".bias", {channels[i]}});
    bn(want, "features." + std::to_string(conv_index[i] + 1), channels[i]);
    in = channels[i];
  }
  for (const auto& [name, shape] : std::vector<Entry>{{"classifier.0.weight", {32, 25088}},
                                                      {"classifier.0.bias", {32}},
                                                      {"classifier.3.weight", {32, 32}},
                                                      {"classifier.3.bias", {32}},
                                                      {"classifier.6.weight", {5, 32}},
                                                      {"classifier.6.bias", {5}}}) {
    want.push_back({name, shape});
  }
  auto model = make_model(options_for("vgg11_bn", 32, 5));
  expect_state_dict(*model, want);
}

TEST(ModelStateDict, CompactAndLeNetNames) {
  auto compact = make_model(options_for("compact", 96, 2));
  std::vector<std::string> names;
  for (const Param* p : compact->parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "features.0.weight", "features.1.weight", "features.1.bias", "features.4.weight",
                       "features.5.weight", "features.5.bias", "features.8.weight", "features.9.weight",
                       "features.9.bias", "features.12.weight", "features.13.weight", "features.13.bias",
                       "features.16.weight", "features.17.weight", "features.17.bias", "fc.weight", "fc.bias"}));
  EXPECT_EQ(compact->parameter_count(), 979746);

  ModelOptions o = options_for("lenet5", 32, 10);
  o.channels = 1;
  auto lenet = make_model(o);
  names.clear();
  for (const Param* p : lenet->parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                             "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(lenet->parameter_count(), 61706);
}

// ---------------------------------------------------------------------------------------------------------------
// FLOPs and summary.

TEST(ModelAccounting, FlopsCountConvolutionsAndLinearLayers) {
  // LeNet-5 at 32 px, RGB, 10 classes, by hand: 2·(6·3·25·28² + 16·6·25·10² + 400·120 + 120·84 + 84·10).
  auto lenet = make_model(options_for("lenet5", 32, 10));
  EXPECT_EQ(lenet->flops(32), 2 * (6 * 3 * 25 * 784 + 16 * 6 * 25 * 100 + 400 * 120 + 120 * 84 + 84 * 10));
  // ResNet-18 at 224: torchvision's 1.814 G multiply-adds (convolutions 1.8136 G, fc 0.5 M).
  auto resnet = make_model(options_for("resnet18", 224, 1000));
  EXPECT_NEAR(static_cast<double>(resnet->flops(224)), 2 * 1.8142e9, 2 * 0.002e9);
  // A larger input costs more, in proportion to the maps (fc excepted).
  EXPECT_NEAR(static_cast<double>(resnet->flops(448)) / static_cast<double>(resnet->flops(224)), 4.0, 0.01);
  // The compact CNN's documented cost at 96 px.
  EXPECT_NEAR(static_cast<double>(make_model(options_for("compact", 96, 2))->flops(96)), 313.2e6, 0.1e6);
}

TEST(ModelAccounting, SummaryFitsOnOneScreen) {
  auto model = make_model(options_for("resnet50", 96, 2));
  const std::string text = model->summary();
  std::istringstream lines(text);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    EXPECT_LE(line.size(), 100u) << line;
  }
  EXPECT_LE(count, 30);
  EXPECT_NE(text.find("layer3.5"), std::string::npos) << text;
  EXPECT_NE(text.find("Bottleneck"), std::string::npos) << text;
  EXPECT_NE(text.find("2048x3x3"), std::string::npos) << text;  // layer4's output at 96 px
  const std::vector<LayerSummary> rows = model->layers(96);
  std::int64_t params = 0;
  for (const auto& row : rows) params += row.params;
  EXPECT_EQ(params, counted(*model));
  EXPECT_EQ(rows.back().output, (FeatureShape{2, 0, 0}));
}

// ---------------------------------------------------------------------------------------------------------------
// Forward and backward of every model.

TEST(Models, EveryModelGivesFiniteLogitsAtOddSizesAndTrains) {
  // Two odd sizes per model (LeNet-5: two that give the same 5×5 map before fc1); built for the first.
  const std::map<std::string, std::pair<int, int>> sizes = {
      {"lenet5", {33, 35}},   {"alexnet", {63, 71}},  {"vgg11", {33, 45}},    {"vgg11_bn", {35, 33}},
      {"vgg16", {33, 39}},    {"vgg16_bn", {37, 33}}, {"resnet18", {33, 47}}, {"resnet34", {29, 35}},
      {"resnet50", {31, 41}}, {"compact", {33, 49}},  {"tiny_cnn", {9, 13}},
  };
  constexpr int batch = 2, classes = 3;
  for (const auto& name : model_names()) {
    ASSERT_TRUE(sizes.contains(name)) << "no test sizes for " << name;
    const auto [first, second] = sizes.at(name);
    SCOPED_TRACE(name);
    auto model = make_model(options_for(name, first, classes));
    model->set_mode(Mode::eval);
    for (const int size : {first, second}) {
      const Tensor& logits = model->forward(input_batch(batch, 3, size, size, 1), batch, size, size);
      EXPECT_EQ(logits.dims(), (dims_t{batch, classes})) << size << " px";
      EXPECT_TRUE(is_plain(logits.desc())) << size << " px";
      EXPECT_TRUE(all_finite(logits.to_plain())) << size << " px";
    }
    model->set_mode(Mode::train);
    const Tensor& logits = model->forward(input_batch(batch, 3, first, first, 2), batch, first, first);
    EXPECT_TRUE(all_finite(logits.to_plain()));
    EXPECT_TRUE(model->backward(make_tensor(logits.dims(), std::vector<float>(batch * classes, 0.5f))).empty())
        << "no image gradient by default";
    const Param& front = *model->parameters().front();
    double norm = 0.0;
    for (float g : front.grad) norm += std::abs(g);
    EXPECT_TRUE(std::isfinite(norm) && norm > 0.0) << front.name << " gets no gradient";
  }
}

TEST(Models, OneModelTakesChangingInputSizes) {
  auto model = make_model(options_for("resnet18", 32, 4));
  model->set_mode(Mode::eval);
  const std::vector<float> a = input_batch(2, 3, 32, 32, 1), b = input_batch(3, 3, 40, 40, 2);
  const std::vector<float> first = model->forward(a, 2, 32, 32).to_plain();
  EXPECT_EQ(model->forward(b, 3, 40, 40).dims(), (dims_t{3, 4}));
  EXPECT_EQ(model->forward(a, 2, 32, 32).to_plain(), first);
  EXPECT_THROW(model->forward(a, 2, 31, 31), core::InternalError);  // the values do not fill the stated shape
}

TEST(Models, DropoutMasksFollowTheSeed) {
  ModelOptions o = options_for("vgg11", 32, 3);
  auto model = make_model(o);
  const std::vector<float> x = input_batch(2, 3, 32, 32, 3);
  model->reseed(7);
  const std::vector<float> a = model->forward(x, 2, 32, 32).to_plain();
  model->reseed(7);
  EXPECT_EQ(model->forward(x, 2, 32, 32).to_plain(), a);
  model->reseed(8);
  EXPECT_NE(model->forward(x, 2, 32, 32).to_plain(), a);
  model->set_mode(Mode::eval);
  const std::vector<float> e = model->forward(x, 2, 32, 32).to_plain();
  model->reseed(9);
  EXPECT_EQ(model->forward(x, 2, 32, 32).to_plain(), e) << "eval mode does not drop";
}

// ---------------------------------------------------------------------------------------------------------------
// ResNet-18 against a forward composed of the naive reference kernels.

struct RefMap {
  std::vector<float> v;
  int n = 0, c = 0, h = 0, w = 0;
};

class ReferenceResNet18 {
 public:
  ReferenceResNet18(Model& model, bool training) : training_(training) {
    std::vector<Param*> params;
    std::vector<Buffer*> buffers;
    model.collect(params, buffers);
    for (Param* p : params) values_[p->name] = &p->value;
    for (Buffer* b : buffers) values_[b->name] = &b->value;
  }

  std::vector<float> forward(const RefMap& x) {
    RefMap y = bn(conv(x, "conv1", 7, 2, 3), "bn1", true);
    y = maxpool(y);
    for (int stage = 1; stage <= 4; ++stage) {
      for (int b = 0; b < 2; ++b) {
        const std::string p = "layer" + std::to_string(stage) + "." + std::to_string(b);
        const int stride = stage > 1 && b == 0 ? 2 : 1;
        RefMap main = bn(conv(y, p + ".conv1", 3, stride, 1), p + ".bn1", true);
        main = bn(conv(main, p + ".conv2", 3, 1, 1), p + ".bn2", false);
        const RefMap shortcut = values_.contains(p + ".downsample.0.weight")
                                    ? bn(conv(y, p + ".downsample.0", 1, stride, 0), p + ".downsample.1", false)
                                    : y;
        main.v = reference::add_forward(main.v, shortcut.v, true);
        y = main;
      }
    }
    const std::vector<float> pooled = reference::adaptive_avg_pool_forward(y.v, {y.n, y.c, y.h, y.w}, 1, 1);
    const auto& fc = *values_.at("fc.weight");
    const int classes = static_cast<int>(values_.at("fc.bias")->size());
    return reference::linear_forward(pooled, fc, *values_.at("fc.bias"), {y.n, y.c, classes});
  }

 private:
  RefMap conv(const RefMap& x, const std::string& name, int kernel, int stride, int pad) {
    const auto& weight = *values_.at(name + ".weight");
    reference::ConvShape s;
    s.n = x.n, s.c = x.c, s.h = x.h, s.w = x.w;
    s.o = static_cast<int>(weight.size()) / (x.c * kernel * kernel);
    s.kernel_h = s.kernel_w = kernel;
    s.stride_h = s.stride_w = stride;
    s.pad_h = s.pad_w = pad;
    return {reference::conv_forward(x.v, weight, {}, s), x.n, s.o, s.out_h(), s.out_w()};
  }
  RefMap bn(const RefMap& x, const std::string& name, bool relu) {
    const reference::NormShape s{x.n, x.c, x.h, x.w};
    const reference::NormStats stats =
        training_ ? reference::batchnorm_statistics(x.v, s)
                  : reference::NormStats{*values_.at(name + ".running_mean"), *values_.at(name + ".running_var")};
    RefMap y = x;
    y.v =
        reference::batchnorm_forward(x.v, stats, *values_.at(name + ".weight"), *values_.at(name + ".bias"), 1e-5f, s);
    if (relu) y.v = reference::relu_forward(y.v);
    return y;
  }
  RefMap maxpool(const RefMap& x) {
    reference::PoolWindow window;
    window.kernel_h = window.kernel_w = 3;
    window.stride_h = window.stride_w = 2;
    window.pad_h = window.pad_w = 1;
    return {reference::max_pool_forward(x.v, {x.n, x.c, x.h, x.w}, window), x.n, x.c, window.out_h(x.h),
            window.out_w(x.w)};
  }

  bool training_;
  std::map<std::string, const std::vector<float>*> values_;
};

TEST(ResNet18, MatchesTheNaiveReferenceForward) {
  // Batch 4: at 32 px layer4's maps are 1×1, and training-mode batch norm over only N values is
  // ill-conditioned for N = 2 (x̂ = ±1 whatever the inputs), which would test rounding, not the model.
  constexpr int n = 4, size = 32, classes = 5;
  auto model = make_model(options_for("resnet18", size, classes));
  randomize_batchnorm(*model, 100);
  const RefMap x{input_batch(n, 3, size, size, 11), n, 3, size, size};
  for (const Mode mode : {Mode::eval, Mode::train}) {
    SCOPED_TRACE(mode == Mode::eval ? "eval" : "train");
    model->set_mode(mode);
    const std::vector<float> got = model->forward(x.v, n, size, size).to_plain();
    const std::vector<float> want = ReferenceResNet18(*model, mode == Mode::train).forward(x);
    EXPECT_TRUE(all_near(got, want, 1e-4));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Batch-norm folding.

TEST(Models, FoldingBatchNormKeepsEvalOutputs) {
  for (const auto& [name, size] : std::vector<std::pair<std::string, int>>{
           {"resnet18", 32}, {"bottleneck", 35}, {"vgg11_bn", 32}, {"compact", 33}, {"tiny_cnn", 8}}) {
    SCOPED_TRACE(name);
    // "bottleneck": a small ResNet of Bottleneck blocks (resnet50's structure at a fraction of its size).
    auto model = name == "bottleneck"
                     ? build_resnet(options_for(name, size, 5), {.bottleneck = true, .blocks = {2, 1, 1}, .width = 8})
                     : make_model(options_for(name, size, 5));
    randomize_batchnorm(*model, 200);
    model->set_mode(Mode::eval);
    const std::vector<float> x = input_batch(2, 3, size, size, 12);
    const std::vector<float> before = model->forward(x, 2, size, size).to_plain();
    const std::int64_t params_before = model->parameter_count();
    model->fold_batchnorm();
    EXPECT_TRUE(model->folded());
    const std::vector<float> after = model->forward(x, 2, size, size).to_plain();
    EXPECT_TRUE(all_near(after, before, 1e-4));
    EXPECT_NE(after, before) << "the folded model really runs another computation";
    if (name != "vgg11_bn") {  // VGG's convolutions have biases already
      EXPECT_GT(model->parameter_count(), params_before) << "folded convolutions gain a bias";
    }
    EXPECT_THROW(model->set_mode(Mode::train), core::InternalError);
  }
  auto resnet = make_model(options_for("resnet18", 32, 5));
  resnet->fold_batchnorm();
  std::vector<std::string> names;
  for (const Param* p : resnet->parameters()) names.push_back(p->name);
  for (const char* conv : {"conv1.bias", "layer1.0.conv2.bias", "layer2.0.downsample.0.bias"}) {
    EXPECT_EQ(std::count(names.begin(), names.end(), conv), 1) << conv;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoints: a model written by PyTorch, and Tessera's own round trip.

TEST(ModelCheckpoint, AModelWrittenByPyTorchGivesPyTorchsOutputs) {
  const auto folder = tessera::testing::test_data_dir() / "checkpoints";
  std::ifstream file(folder / "tiny_torch.expected.json");
  ASSERT_TRUE(file) << "missing " << (folder / "tiny_torch.expected.json");
  const nlohmann::json expected = nlohmann::json::parse(file);
  auto model = load_model((folder / "tiny_torch.h5").string());
  EXPECT_EQ(model->options().architecture, "tiny_cnn");

  const std::vector<int> shape = expected.at("input_shape").get<std::vector<int>>();
  ASSERT_EQ(shape.size(), 4u);
  const std::vector<float> x = fixture_input(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
  EXPECT_EQ(x, expected.at("input").get<std::vector<float>>()) << "the input formula is the script's";
  const std::vector<float> want = expected.at("logits").get<std::vector<float>>();

  model->set_mode(Mode::eval);
  const Tensor& logits = model->forward(x, shape[0], shape[2], shape[3]);
  EXPECT_EQ(logits.dims(), (dims_t{shape[0], model->options().num_classes}));
  EXPECT_TRUE(all_near(logits.to_plain(), want, 1e-4));
  model->fold_batchnorm();
  EXPECT_TRUE(all_near(model->forward(x, shape[0], shape[2], shape[3]).to_plain(), want, 1e-4)) << "folded";
}

TEST(ModelCheckpoint, RoundTripGivesTheSameOutputs) {
  tessera::testing::TempDir dir;
  const std::string path = dir.file("compact.h5");
  auto model = make_model(options_for("compact", 40, 3));
  randomize_batchnorm(*model, 400);
  io::Checkpoint checkpoint;
  checkpoint.meta.architecture = "compact";
  checkpoint.meta.input_size = 40;
  checkpoint.meta.num_classes = 3;
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  model->collect(params, buffers);
  store_checkpoint_tensors(params, buffers, checkpoint);
  io::write_checkpoint(path, checkpoint);

  auto loaded = load_model(path);  // default seed: other initial weights, until the checkpoint replaces them
  const std::vector<float> x = input_batch(2, 3, 40, 40, 15);
  model->set_mode(Mode::eval);
  loaded->set_mode(Mode::eval);
  EXPECT_EQ(loaded->forward(x, 2, 40, 40).to_plain(), model->forward(x, 2, 40, 40).to_plain());
}

// The model's size travels in /meta (describe_model): inference's load_model rebuilds a compact of width 8 with the
// saved model's outputs (batch norm folded); a file without the attribute (written before it was recorded) is the
// default size. AlexNet and VGG record their classifier width instead, and the others neither.
TEST(ModelCheckpoint, TheModelsSizeTravelsWithIt) {
  tessera::testing::TempDir dir;
  ModelOptions o = options_for("compact", 16, 2);
  o.width = 8;
  auto model = make_model(o);
  randomize_batchnorm(*model, 500);
  io::Checkpoint checkpoint;
  describe_model(o, checkpoint.meta);
  EXPECT_EQ(checkpoint.meta.width, std::optional<std::int64_t>(8));
  EXPECT_FALSE(checkpoint.meta.classifier_width.has_value());
  store_checkpoint_tensors(model->parameters(), model->buffers(), checkpoint);
  io::write_checkpoint(dir.file("narrow.h5"), checkpoint);
  LoadedModel loaded = engine::load_model(dir.file("narrow.h5"));
  EXPECT_EQ(loaded.model->options().width, 8);
  const std::vector<float> x = input_batch(2, 3, 16, 16, 16);
  model->set_mode(Mode::eval);
  EXPECT_TRUE(all_near(loaded.model->forward(x, 2, 16, 16).to_plain(), model->forward(x, 2, 16, 16).to_plain(), 1e-4));

  // Written before /meta recorded the width: 32, the default.
  o.width = 32;
  model = make_model(o);
  describe_model(o, checkpoint.meta);
  checkpoint.meta.width.reset();
  store_checkpoint_tensors(model->parameters(), model->buffers(), checkpoint);
  io::write_checkpoint(dir.file("old.h5"), checkpoint);
  EXPECT_EQ(engine::load_model(dir.file("old.h5")).model->options().width, 32);  // a checked read of its tensors

  o = options_for("vgg11_bn", 32, 2);
  o.classifier_width = 48;
  describe_model(o, checkpoint.meta);
  EXPECT_FALSE(checkpoint.meta.width.has_value());
  EXPECT_EQ(checkpoint.meta.classifier_width, std::optional<std::int64_t>(48));
  EXPECT_EQ(checkpoint_model_options(checkpoint.meta).classifier_width, 48);
  describe_model(options_for("resnet18", 32, 2), checkpoint.meta);
  EXPECT_FALSE(checkpoint.meta.width.has_value() || checkpoint.meta.classifier_width.has_value());
}

// A corrupt size in /meta (here a width-8 compact's file that says otherwise) is refused by load_model naming the
// file and the attribute, with the bounds of the train keys, before the model is built: 4096 would be a 39 GB
// convolution, and 2^28 overflows the stages' channel counts.
TEST(ModelCheckpoint, ASizeBeyondTheLimitsIsRefusedNamingTheFile) {
  tessera::testing::TempDir dir;
  ModelOptions o = options_for("compact", 16, 2);
  o.width = 8;
  auto model = make_model(o);
  io::Checkpoint checkpoint;
  describe_model(o, checkpoint.meta);
  store_checkpoint_tensors(model->parameters(), model->buffers(), checkpoint);
  const std::string path = dir.file("corrupt.h5");
  auto refusal = [&](std::int64_t width, std::optional<std::int64_t> classifier_width) {
    checkpoint.meta.width = width;
    checkpoint.meta.classifier_width = classifier_width;
    io::write_checkpoint(path, checkpoint);
    try {
      engine::load_model(path);
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(refusal(kMaxModelWidth + 1, {}).find("cannot build: width must be in [1, 1024], got 1025"),
            std::string::npos);
  EXPECT_NE(refusal(4096, {}).find("cannot build: width must be in [1, 1024], got 4096"), std::string::npos);
  EXPECT_NE(refusal(std::int64_t{1} << 28, {}).find("cannot build: width must be in [1, 1024], got 268435456"),
            std::string::npos);
  EXPECT_NE(refusal(8, kMaxClassifierWidth + 1).find("cannot build: classifier_width must be in [1, 65536], got 65537"),
            std::string::npos);
  EXPECT_EQ(refusal(8, {}), "no error");
}

// ---------------------------------------------------------------------------------------------------------------
// Gradient check of small residual networks, end to end (central differences through the whole model).

void gradient_check_resnet(const ResNetSpec& spec, int size) {
  constexpr int n = 3, classes = 3;
  ModelOptions o = options_for("resnet", size, classes);
  o.seed = 5;
  auto model = build_resnet(o, spec);
  model->set_propagate_down(true);
  model->set_mode(Mode::train);
  randomize_batchnorm(*model, 300);
  std::vector<float> x = input_batch(n, 3, size, size, 21);
  const std::vector<float> r = gradcheck::random_vector(n * classes, 14);
  const auto loss = [&] { return gradcheck::weighted_sum(model->forward(x, n, size, size).to_plain(), r); };

  std::vector<Param*> params = model->parameters();
  for (Param* p : params) std::fill(p->grad.begin(), p->grad.end(), 0.0f);
  model->forward(x, n, size, size);
  const std::vector<float> dx = model->backward(make_tensor({n, classes}, r)).to_plain();

  gradcheck::Options options;
  // A small step: training-mode batch norm scales every perturbation up to unit variance, so a step of 1e-2
  // would cross ReLU kinks at most points; double-accumulated logits keep 1e-3 well above float noise.
  options.step = 1e-3;
  options.rel_tol = 2e-2;
  options.abs_tol = 2e-3;
  options.max_points = 7;  // an odd stride, so the points fall on different input channels
  std::map<std::string, Param*> by_name;
  for (Param* p : params) by_name[p->name] = p;
  for (const std::string name :
       {"conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer1.0.bn2.bias", "layer2.0.conv2.weight",
        "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight", "fc.weight", "fc.bias"}) {
    ASSERT_TRUE(by_name.contains(name)) << name;
    Param& p = *by_name[name];
    const std::vector<float> analytic = p.grad;
    const auto report = gradcheck::check(p.value, analytic, loss, options);
    EXPECT_TRUE(report.ok()) << name << ": " << report.summary();
  }
  options.max_points = 24;
  const auto report = gradcheck::check(x, dx, loss, options);
  EXPECT_TRUE(report.ok()) << "image gradient: " << report.summary();
}

TEST(ResNetGradient, BasicBlocksEndToEnd) {
  gradient_check_resnet({.bottleneck = false, .blocks = {1, 1}, .width = 4}, 16);
}

TEST(ResNetGradient, BottleneckBlocksEndToEnd) {
  gradient_check_resnet({.bottleneck = true, .blocks = {1, 1}, .width = 2}, 16);
}

// ---------------------------------------------------------------------------------------------------------------
// Initialisation.

double mean_of(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev_of(const std::vector<float>& v) {
  const double m = mean_of(v);
  double s = 0.0;
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

std::map<std::string, const Param*> by_name(Model& model) {
  std::map<std::string, const Param*> out;
  for (const Param* p : model.parameters()) out[p->name] = p;
  return out;
}

TEST(ModelInit, FollowsTorchvisionsDistributions) {
  auto resnet = make_model(options_for("resnet18", 32, 10));
  auto r = by_name(*resnet);
  const auto& conv = r.at("layer4.0.conv2.weight")->value;  // 512·512·9 draws, fan_out 512·9
  EXPECT_NEAR(stddev_of(conv), std::sqrt(2.0 / (512 * 9)), 0.01 * std::sqrt(2.0 / (512 * 9)));
  EXPECT_NEAR(mean_of(conv), 0.0, 1e-4);
  const double fc_bound = 1.0 / std::sqrt(512.0);
  for (const char* name : {"fc.weight", "fc.bias"}) {
    const auto& v = r.at(name)->value;
    EXPECT_LE(max_abs(v), fc_bound) << name;
    EXPECT_GT(max_abs(v), 0.5 * fc_bound) << name;
  }
  EXPECT_NEAR(stddev_of(r.at("fc.weight")->value), fc_bound / std::sqrt(3.0), 0.05 * fc_bound);
  EXPECT_EQ(r.at("bn1.weight")->value, std::vector<float>(64, 1.0f));
  EXPECT_EQ(r.at("layer1.0.bn1.bias")->value, std::vector<float>(64, 0.0f));

  ModelOptions o = options_for("vgg11", 32, 3);
  o.classifier_width = 64;
  auto vgg = make_model(o);
  auto v = by_name(*vgg);
  EXPECT_NEAR(stddev_of(v.at("classifier.0.weight")->value), 0.01, 2e-4);
  EXPECT_EQ(max_abs(v.at("classifier.0.bias")->value), 0.0);
  EXPECT_EQ(max_abs(v.at("features.3.bias")->value), 0.0);
  EXPECT_NEAR(stddev_of(v.at("features.18.weight")->value), std::sqrt(2.0 / (512 * 9)),
              0.01 * std::sqrt(2.0 / (512 * 9)));

  auto alexnet = make_model(options_for("alexnet", 63, 3));
  auto a = by_name(*alexnet);
  const double conv_bound = 1.0 / std::sqrt(192.0 * 9);  // features.6: fan_in 192·3·3
  EXPECT_LE(max_abs(a.at("features.6.weight")->value), conv_bound);
  EXPECT_GT(max_abs(a.at("features.6.weight")->value), 0.99 * conv_bound);
  EXPECT_LE(max_abs(a.at("features.6.bias")->value), conv_bound);
  EXPECT_GT(max_abs(a.at("features.6.bias")->value), 0.5 * conv_bound);
}

TEST(ModelInit, IsDeterministicPerSeed) {
  ModelOptions o = options_for("compact", 32, 2);
  auto a = make_model(o), b = make_model(o);
  o.seed += 1;
  auto c = make_model(o);
  const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i]->value, pb[i]->value) << pa[i]->name;
    if (pa[i]->kind == ParamKind::conv_weight) {
      EXPECT_NE(pa[i]->value, pc[i]->value) << pa[i]->name;
    }
  }
  // Parameters of the same shape draw from their own streams.
  EXPECT_NE(by_name(*a).at("features.12.weight")->value.front(), by_name(*a).at("features.16.weight")->value.front());
}

// ---------------------------------------------------------------------------------------------------------------
// Adaptive average pooling to a fixed grid.

TEST(AdaptiveAvgPool2dTo, MatchesTheReferenceOnEveryPath) {
  struct Case {
    int h, w, out;
    AdaptiveAvgPool2dTo::Path path;
  };
  for (const Case& k :
       {Case{7, 7, 7, AdaptiveAvgPool2dTo::Path::identity}, Case{14, 21, 7, AdaptiveAvgPool2dTo::Path::uniform},
        Case{3, 3, 7, AdaptiveAvgPool2dTo::Path::general}, Case{13, 10, 6, AdaptiveAvgPool2dTo::Path::general}}) {
    SCOPED_TRACE(std::to_string(k.h) + "x" + std::to_string(k.w) + " -> " + std::to_string(k.out));
    constexpr int n = 2, c = 19;  // 19 channels: a blocked layout pads them
    const reference::PoolInput shape{n, c, k.h, k.w};
    std::vector<float> x = gradcheck::random_vector(shape.size(), 21);
    // The input in a blocked layout, as a convolution would give it.
    const Tensor src = make_tensor({n, c, k.h, k.w}, x, dnnl::memory::format_tag::nChw8c);
    AdaptiveAvgPool2dTo pool("avgpool", k.out, k.out);
    const Tensor& y = pool.forward(src);
    EXPECT_EQ(pool.path(), k.path);
    EXPECT_EQ(y.dims(), (dims_t{n, c, k.out, k.out}));
    EXPECT_TRUE(all_near(y.to_plain(), reference::adaptive_avg_pool_forward(x, shape, k.out, k.out), 1e-6));

    const std::vector<float> dy = gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 22);
    const std::vector<float> dx = pool.backward(make_tensor(y.dims(), dy)).to_plain();
    EXPECT_TRUE(all_near(dx, reference::adaptive_avg_pool_backward(dy, shape, k.out, k.out), 1e-6));
  }
}

}  // namespace
}  // namespace tessera::engine
