// Reduced-precision inference (engine/precision.h): names, refusals, and bf16 and int8 forward passes of every
// model of the registry against their fp32 results; int8 calibration (what it records, what int8 refuses without
// it). The int8 comparisons run only where oneDNN's ISA has VNNI. The bf16 comparisons run only where oneDNN's ISA on
// this CPU has AVX-512 BF16 (they skip with a message elsewhere); the fp32 fallback on such CPUs is tested end to end
// by the app tests (test_precision in tests/app), which start the program with ONEDNN_MAX_CPU_ISA=AVX2.
// bf16 training (use_training_precision): the gradients of one step of the compact model against fp32's, a short
// training run that lowers the loss, and bf16 weights that follow the Param in training; these run only where
// oneDNN's ISA has AMX (skipped saying so elsewhere; the app tests check the fallback).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/layers/add.h"
#include "engine/layers/conv.h"
#include "engine/layers/dropout.h"
#include "engine/layers/linear.h"
#include "engine/layers/loss.h"
#include "engine/models/model.h"
#include "engine/models/registry.h"
#include "engine/optim/optimizer.h"
#include "engine/precision.h"

namespace tessera::engine {
namespace {

using dt = dnnl::memory::data_type;

// The first Conv2d / Linear found depth-first below `module`.
template <class T>
T* find_first(Module& module) {
  if (auto* m = dynamic_cast<T*>(&module)) return m;
  for (Module* child : children_of(module)) {
    if (T* found = find_first<T>(*child)) return found;
  }
  return nullptr;
}

// The test models: 2 classes, a 64-wide classifier, seed 7; as trained, or with batch norm folded for inference.
std::unique_ptr<Model> training_model(const std::string& architecture, int size) {
  ModelOptions o;
  o.architecture = architecture;
  o.input_size = size;
  o.num_classes = 2;
  o.classifier_width = 64;
  o.seed = 7;
  return make_model(o);
}

std::unique_ptr<Model> folded_model(const std::string& architecture, int size) {
  auto model = training_model(architecture, size);
  model->fold_batchnorm();
  return model;
}

// A batch with the spread of normalised tiles (about unit variance per channel).
Tensor image_batch(int n, int size) {
  Tensor x = Tensor::plain({n, 3, size, size});
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = normal(rng);
  return x;
}

std::vector<float> softmax2(const std::vector<float>& logits) {
  std::vector<float> p(logits.size() / 2);
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = 1.0f / (1.0f + std::exp(logits[2 * i] - logits[2 * i + 1]));
  }
  return p;
}

TEST(Precision, NamesRoundTripAndUnknownNamesAreConfigErrors) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::int8}) {
    EXPECT_EQ(parse_precision(to_string(p), "k"), p);
  }
  try {
    parse_precision("fp16", "infer.precision");
    FAIL() << "fp16 was accepted";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "infer.precision");
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(cpu_supports(Precision::fp32));
  EXPECT_FALSE(cpu_isa_name().empty());
}

TEST(Precision, InferenceAndTrainingRefuseEachOthersModels) {
  ModelOptions o;
  o.architecture = "tiny_cnn";
  o.input_size = 16;
  auto model = make_model(o);  // train mode, not folded
  EXPECT_THROW(use_precision(*model, Precision::bf16), core::InternalError);
  EXPECT_THROW(use_training_precision(*model, Precision::int8, core::Comm::alone()), core::InternalError);
  model->fold_batchnorm();
  EXPECT_THROW(use_training_precision(*model, Precision::bf16, core::Comm::alone()), core::InternalError);
  Conv2d conv("c", {.in = 3, .out = 4, .kernel = 3, .padding = 1});
  EXPECT_THROW(conv.set_int8(1.0f, false, 1.0f), core::InternalError);  // train mode
}

TEST(Precision, Fp32LeavesTheModelExactlyAsItWas) {
  auto model = folded_model("compact", 32);
  const Tensor x = image_batch(4, 32);
  const std::vector<float> before = model->forward(x).to_plain();
  EXPECT_EQ(use_precision(*model, Precision::fp32), Precision::fp32);
  EXPECT_EQ(model->forward(x).to_plain(), before);
}

struct Case {
  const char* architecture;
  int size;
};

class Bf16Models : public ::testing::TestWithParam<Case> {};

// bf16 keeps 8 significant bits: the logits of a random-weight network drift by a few per cent of their scale.
// The probabilities are what inference writes; the tests of trained models (tests/app) bound them tighter.
TEST_P(Bf16Models, ForwardMatchesFp32) {
  if (!cpu_supports(Precision::bf16)) {
    GTEST_SKIP() << "this CPU (oneDNN ISA " << cpu_isa_name() << ") has no AVX-512 BF16: bf16 is not run here";
  }
  const Case c = GetParam();
  auto model = folded_model(c.architecture, c.size);
  const Tensor x = image_batch(8, c.size);
  const std::vector<float> fp32 = model->forward(x).to_plain();

  ASSERT_EQ(use_precision(*model, Precision::bf16), Precision::bf16);
  const Tensor& logits = model->forward(x);
  EXPECT_EQ(logits.desc().data_type(), dt::f32);  // the logits leave in float32
  const std::vector<float> bf16 = logits.to_plain();
  // The convolutions really ran in bf16 (not a silent fp32 run).
  Conv2d* conv = find_first<Conv2d>(model->body());
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->compute_type(), dt::bf16);
  EXPECT_EQ(conv->dst_desc().data_type(), dt::bf16);
  Linear* linear = find_first<Linear>(model->body());
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->dst_desc().data_type(), dt::f32);

  float scale = 0.0f, worst = 0.0f;
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    scale = std::max(scale, std::fabs(fp32[i]));
    worst = std::max(worst, std::fabs(fp32[i] - bf16[i]));
  }
  EXPECT_LE(worst, 0.05f * scale + 1e-3f) << c.architecture << ": largest |Δlogit| " << worst << ", scale " << scale;
  const auto p32 = softmax2(fp32), p16 = softmax2(bf16);
  for (std::size_t i = 0; i < p32.size(); ++i) EXPECT_NEAR(p16[i], p32[i], 0.02) << c.architecture << " image " << i;

  // Back to fp32: the same numbers as before.
  use_precision(*model, Precision::fp32);
  EXPECT_EQ(model->forward(x).to_plain(), fp32);
}

INSTANTIATE_TEST_SUITE_P(Registry, Bf16Models,
                         ::testing::Values(Case{"tiny_cnn", 16}, Case{"compact", 32}, Case{"resnet18", 32},
                                           Case{"vgg11", 32}, Case{"alexnet", 64}, Case{"lenet5", 32},
                                           Case{"vgg11_bn", 32}),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return std::string(param_info.param.architecture);
                         });

// The ranges of one fp32 forward of `x`.
ActivationRanges calibrated(Model& model, const Tensor& x) {
  const Calibrator calibrator(model);
  (void)model.forward(x);
  return calibrator.ranges();
}

TEST(Int8, CalibrationRecordsEveryQuantizedActivationAndInt8IsRefusedWithoutIt) {
  auto model = folded_model("resnet18", 32);
  const Tensor x = image_batch(2, 32);
  const std::vector<float> before = model->forward(x).to_plain();
  const ActivationRanges ranges = calibrated(*model, x);
  const std::vector<std::string> points = calibration_points(*model);
  // 20 convolutions (17 on the main paths, 3 downsamples) with input and output, 8 block sums.
  EXPECT_EQ(points.size(), 2u * 20u + 8u);
  ASSERT_EQ(ranges.size(), points.size());
  for (const std::string& name : points) {
    const ValueRange& r = ranges.at(name);
    EXPECT_TRUE(r.seen) << name;
    EXPECT_LE(r.min, r.max) << name;
  }
  EXPECT_LT(ranges.at("conv1.input").min, 0.0f);   // normalised images are signed
  EXPECT_EQ(ranges.at("conv1.output").min, 0.0f);  // after the fused ReLU
  EXPECT_GT(ranges.at("layer4.1.output").max, 0.0f);
  // Watching changed nothing, and a detached model computes as before.
  EXPECT_EQ(model->forward(x).to_plain(), before);

  EXPECT_THROW(use_precision(*model, Precision::int8), core::InternalError);  // no ranges
  ActivationRanges partial = ranges;
  partial.erase("layer2.0.downsample.0.output");
  EXPECT_THROW(use_precision(*model, Precision::int8, &partial), core::InternalError);
  ModelOptions o;
  o.architecture = "tiny_cnn";
  o.input_size = 16;
  auto unfolded = make_model(o);
  EXPECT_THROW(Calibrator{*unfolded}, core::InternalError);
  Conv2d conv("c", {.in = 3, .out = 4, .kernel = 3, .padding = 1});
  EXPECT_THROW(conv.set_int8(0.1f, true, 0.1f), core::InternalError);  // train mode
}

// One convolution, quantized by hand's rules: its int8 output is within the rounding the scales allow.
TEST(Int8, ConvolutionWithBiasMatchesFp32WithinItsQuantizationSteps) {
  if (!cpu_supports(Precision::int8)) {
    GTEST_SKIP() << "this CPU (oneDNN ISA " << cpu_isa_name() << ") has no VNNI: int8 is not run here";
  }
  for (const bool relu : {true, false}) {
    Conv2d conv("c", {.in = 8, .out = 16, .kernel = 3, .padding = 1, .bias = true, .relu = relu});
    conv.set_mode(Mode::eval);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (float& w : conv.weight().value) w = normal(rng);
    for (float& b : conv.bias()->value) b = normal(rng);
    Tensor x = Tensor::plain({2, 8, 12, 12});
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data()[i] = normal(rng) * 3.0f;
    ValueRange in, out;
    conv.observe(&in, &out);
    const std::vector<float> fp32 = conv.forward(x).to_plain();
    conv.observe(nullptr, nullptr);
    const float src_scale = in.abs_max() / 127.0f;
    const float dst_scale = relu ? out.max / 255.0f : out.abs_max() / 127.0f;
    conv.set_int8(src_scale, true, dst_scale);
    const Tensor& y = conv.forward(x);
    EXPECT_EQ(y.data_type(), relu ? dt::u8 : dt::s8);
    EXPECT_FLOAT_EQ(y.scale(), dst_scale);
    const std::vector<float> int8 = y.to_plain();  // dequantized
    ASSERT_EQ(int8.size(), fp32.size());
    // Each product errs by at most half a step of src times |w| plus half a weight step times |x|; summed over
    // the 72 taps that is about 4 dst steps here at worst (errors of random sign stay far below).
    float worst = 0.0f;
    for (std::size_t i = 0; i < fp32.size(); ++i) worst = std::max(worst, std::fabs(int8[i] - fp32[i]));
    EXPECT_LE(worst, 4.0f * dst_scale) << (relu ? "relu" : "no relu") << ": dst step " << dst_scale;
    EXPECT_GT(worst, 0.0f);  // really quantized
  }
}

class Int8Models : public ::testing::TestWithParam<Case> {};

// Calibrated on the batch itself (no clipping), int8 keeps the probabilities of a random-weight network within a
// few hundredths; the trained-model tests (tests/app) bound AUC and heatmaps.
TEST_P(Int8Models, ForwardMatchesFp32) {
  if (!cpu_supports(Precision::int8)) {
    GTEST_SKIP() << "this CPU (oneDNN ISA " << cpu_isa_name() << ") has no VNNI: int8 is not run here";
  }
  const Case c = GetParam();
  auto model = folded_model(c.architecture, c.size);
  const Tensor x = image_batch(8, c.size);
  const std::vector<float> fp32 = model->forward(x).to_plain();
  const ActivationRanges ranges = calibrated(*model, x);

  ASSERT_EQ(use_precision(*model, Precision::int8, &ranges), Precision::int8);
  const Tensor& logits = model->forward(x);
  EXPECT_EQ(logits.desc().data_type(), dt::f32);
  const std::vector<float> int8 = logits.to_plain();
  // The first convolution (on the signed image) stays fp32; the others, where there are any, ran in int8.
  Conv2d* first = find_first<Conv2d>(model->body());
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->compute_type(), dt::f32);
  int int8_convs = 0;
  std::vector<Module*> pending{&model->body()};
  while (!pending.empty()) {
    Module* m = pending.back();
    pending.pop_back();
    if (auto* conv = dynamic_cast<Conv2d*>(m); conv != nullptr && conv->compute_type() == dt::s8) {
      ++int8_convs;
      EXPECT_TRUE(is_integer(conv->dst_desc().data_type())) << conv->name();
    }
    for (Module* child : children_of(*m)) pending.push_back(child);
  }
  if (std::string(c.architecture) != "tiny_cnn") {
    EXPECT_GT(int8_convs, 0);
  }

  float scale = 0.0f, worst = 0.0f;
  for (std::size_t i = 0; i < fp32.size(); ++i) {
    scale = std::max(scale, std::fabs(fp32[i]));
    worst = std::max(worst, std::fabs(fp32[i] - int8[i]));
  }
  RecordProperty("worst_logit_delta_over_scale", std::to_string(worst / scale));
  EXPECT_LE(worst, 0.08f * scale + 1e-3f) << c.architecture << ": largest |Δlogit| " << worst << ", scale " << scale;
  const auto p32 = softmax2(fp32), p8 = softmax2(int8);
  for (std::size_t i = 0; i < p32.size(); ++i) EXPECT_NEAR(p8[i], p32[i], 0.03) << c.architecture << " image " << i;

  use_precision(*model, Precision::fp32);
  EXPECT_EQ(model->forward(x).to_plain(), fp32);
}

// The VGGs are left out to save the suite's time: their layers (convolutions with ReLU, max pooling, the adaptive
// pooling, dropout, linear layers on a 4-D input) are those of the compact CNN and AlexNet.
INSTANTIATE_TEST_SUITE_P(Registry, Int8Models,
                         ::testing::Values(Case{"tiny_cnn", 16}, Case{"compact", 32}, Case{"resnet18", 32},
                                           Case{"alexnet", 64}, Case{"lenet5", 32}),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return std::string(param_info.param.architecture);
                         });

// ---------------------------------------------------------------------------------------------------------------
// bf16 training.

bool amx_available() { return cpu_trains(Precision::bf16); }
std::string no_amx() {
  return "this CPU (oneDNN ISA " + cpu_isa_name() + ") has no AMX: bf16 training is not run here";
}

// One forward and backward of `x` (dropout masks from a fixed seed); every parameter's gradient, in order.
std::vector<std::vector<float>> gradients(Model& model, const Tensor& x, const std::vector<int>& labels) {
  const std::vector<Param*> params = model.parameters();
  Optimizer::zero_grad(params);
  model.reseed(5);
  SoftmaxCrossEntropy loss;
  (void)loss.forward(model.forward(x), labels);
  model.backward(loss.backward());
  std::vector<std::vector<float>> grads;
  for (const Param* p : params) grads.push_back(p->grad);
  return grads;
}

// ‖a − b‖ / ‖b‖ (0 for two zero vectors).
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    norm += double(b[i]) * double(b[i]);
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// A batch of n images whose label is the sign of their mean brightness (alternating 0, 1): a consistent signal, so
// the gradients are not the near-cancelling sums a random-label batch gives at initialisation.
std::pair<Tensor, std::vector<int>> labelled_batch(int n, int size) {
  Tensor x = image_batch(n, size);
  std::vector<int> labels(static_cast<std::size_t>(n));
  const std::int64_t per_image = x.numel() / n;
  for (int i = 0; i < n; ++i) {
    labels[i] = i % 2;
    for (std::int64_t j = 0; j < per_image; ++j) x.data()[i * per_image + j] += labels[i] == 1 ? 0.5f : -0.5f;
  }
  return {x, labels};
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

class Bf16Training : public ::testing::TestWithParam<Case> {};

// The float32 gradients of one bf16 step against fp32's, tensor by tensor (relative error ‖g₁₆ − g₃₂‖ / ‖g₃₂‖). At
// initialisation, with batch norm over a small batch and max pooling, a network's gradients are sensitive: fp32's
// own gradients move by 5–25% per tensor (median) when the input is perturbed by ±2⁻⁸ relatively (bf16's rounding). So
// the bound is relative to that: the median error over the tensors at most 3× fp32's under such a perturbation
// (measured: 0.8–1.8×), and no tensor's error above 0.6 (a gradient unrelated to fp32's would be near √2).
TEST_P(Bf16Training, GradientsMatchFp32AsCloselyAsTheirOwnSensitivityAllows) {
  if (!amx_available()) GTEST_SKIP() << no_amx();
  const Case c = GetParam();
  auto model = training_model(c.architecture, c.size);
  const auto [x, labels] = labelled_batch(16, c.size);
  Tensor nudged = Tensor::plain(x.dims());
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < x.numel(); ++i) nudged.data()[i] = x.data()[i] * (1.0f + unit(rng) / 256.0f);
  const auto fp32 = gradients(*model, x, labels);
  const auto fp32_nudged = gradients(*model, nudged, labels);

  ASSERT_EQ(use_training_precision(*model, Precision::bf16, core::Comm::alone()), Precision::bf16);
  const auto bf16 = gradients(*model, x, labels);
  Conv2d* conv = find_first<Conv2d>(model->body());
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->dst_desc().data_type(), dt::bf16);  // really bf16, not a silent fp32 run
  Linear* linear = find_first<Linear>(model->body());
  ASSERT_NE(linear, nullptr);
  EXPECT_EQ(linear->compute_type(), dt::bf16);
  EXPECT_EQ(linear->dst_desc().data_type(), dt::f32);  // the logits, and so the loss, in float32

  const std::vector<Param*> params = model->parameters();
  std::vector<double> errors, sensitivity;
  for (std::size_t i = 0; i < params.size(); ++i) {
    errors.push_back(relative_error(bf16[i], fp32[i]));
    sensitivity.push_back(relative_error(fp32_nudged[i], fp32[i]));
    EXPECT_LE(errors.back(), 0.6) << c.architecture << " " << params[i]->name;
  }
  RecordProperty("median_relative_error", std::to_string(median(errors)));
  RecordProperty("median_fp32_sensitivity", std::to_string(median(sensitivity)));
  EXPECT_LE(median(errors), 3.0 * median(sensitivity)) << c.architecture;
  EXPECT_GT(median(errors), 0.0);

  // Back to fp32: fp32's gradients again, bit for bit.
  use_training_precision(*model, Precision::fp32, core::Comm::alone());
  EXPECT_EQ(gradients(*model, x, labels), fp32);
}

// compact at 16 px: batch norm with ReLU, max pooling, dropout, and convolution outputs of 16², 8², 4², 2² and 1²:
// backward weights in bf16 and, on the last three, in f32 from the bf16 values (engine/layers/conv.h). One model for
// the suite's time; the layers' own bf16 gradients are checked tightly below.
INSTANTIATE_TEST_SUITE_P(Registry, Bf16Training, ::testing::Values(Case{"compact", 16}),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return std::string(param_info.param.architecture);
                         });

// The nearest bfloat16 (ties to even), as a float: a value bf16 holds exactly.
float bf16_rounded(float v) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// A plain tensor of normal values that bfloat16 holds exactly.
Tensor bf16_exact(const dims_t& dims, std::uint32_t seed) {
  Tensor t = Tensor::plain(dims);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = bf16_rounded(normal(rng));
  return t;
}

struct LayerGradients {
  std::vector<float> diff_src, weight, bias;
};

// `times` forwards of x, each followed by a backward of dy, from zeroed gradients: the last diff_src and the
// gradients the layer accumulated.
template <class Layer>
LayerGradients layer_gradients(Layer& layer, const Tensor& x, const Tensor& dy, int times) {
  std::fill(layer.weight().grad.begin(), layer.weight().grad.end(), 0.0f);
  std::fill(layer.bias()->grad.begin(), layer.bias()->grad.end(), 0.0f);
  LayerGradients g;
  for (int i = 0; i < times; ++i) {
    (void)layer.forward(x);
    g.diff_src = layer.backward(dy).to_plain();
  }
  g.weight = layer.weight().grad;
  g.bias = layer.bias()->grad;
  return g;
}

// A layer with bias, in train mode, whose weights, input and output gradient bfloat16 holds exactly: in bf16 the
// weight and bias gradients are fp32's up to the order of float32 summation (1e-5 relative), diff_src is fp32's
// rounded to bfloat16 (2⁻⁸ relative per element, beside a float32 summation's 1e-6 of the largest), and two backwards
// accumulate twice one backward's gradients.
template <class Layer>
void expect_bf16_gradients_of_fp32(Layer& layer, const Tensor& x, const Tensor& dy) {
  layer.weight().value = bf16_exact({static_cast<dnnl::memory::dim>(layer.weight().value.size())}, 5).to_plain();
  layer.bias()->value = bf16_exact({static_cast<dnnl::memory::dim>(layer.bias()->value.size())}, 6).to_plain();
  const LayerGradients fp32 = layer_gradients(layer, x, dy, 1);
  layer.set_compute_type(dt::bf16, Weights::trained);
  const LayerGradients bf16 = layer_gradients(layer, x, dy, 1);
  EXPECT_LE(relative_error(bf16.weight, fp32.weight), 1e-5);
  EXPECT_LE(relative_error(bf16.bias, fp32.bias), 1e-5);
  ASSERT_EQ(bf16.diff_src.size(), fp32.diff_src.size());
  float largest = 0.0f;
  for (float v : fp32.diff_src) largest = std::max(largest, std::abs(v));
  ASSERT_GT(largest, 0.0f);
  for (std::size_t i = 0; i < fp32.diff_src.size(); ++i) {
    ASSERT_LE(std::abs(bf16.diff_src[i] - fp32.diff_src[i]),
              std::ldexp(std::abs(fp32.diff_src[i]), -8) + 1e-6f * largest)
        << "diff_src[" << i << "]";
  }
  const LayerGradients twice = layer_gradients(layer, x, dy, 2);
  std::vector<float> weight2 = bf16.weight, bias2 = bf16.bias;
  for (float& v : weight2) v *= 2.0f;
  for (float& v : bias2) v *= 2.0f;
  EXPECT_LE(relative_error(twice.weight, weight2), 1e-6);
  EXPECT_LE(relative_error(twice.bias, bias2), 1e-6);
}

// An 8×8 output (backward weights in bf16), a 6×6 one (at most kSmallOutput pixels: in f32 from the bf16 values) and
// a 1×1 stride-2 shortcut to 8×8 (in f32 too).
TEST(Bf16TrainingLayers, Conv2dGradientsAreFp32sOnBf16ExactValues) {
  if (!amx_available()) GTEST_SKIP() << no_amx();
  for (int size : {8, 6}) {
    SCOPED_TRACE("output " + std::to_string(size) + "x" + std::to_string(size));
    Conv2d conv("c", {.in = 8, .out = 16, .kernel = 3, .padding = 1});
    expect_bf16_gradients_of_fp32(conv, bf16_exact({4, 8, size, size}, 1), bf16_exact({4, 16, size, size}, 2));
  }
  SCOPED_TRACE("1x1 stride 2");
  Conv2d shortcut("s", {.in = 8, .out = 16, .kernel = 1, .stride = 2});
  expect_bf16_gradients_of_fp32(shortcut, bf16_exact({4, 8, 16, 16}, 1), bf16_exact({4, 16, 8, 8}, 2));
}

// On a 4-D input, as after a model's last pooling.
TEST(Bf16TrainingLayers, LinearGradientsAreFp32sOnBf16ExactValues) {
  if (!amx_available()) GTEST_SKIP() << no_amx();
  Linear fc("fc", {.in = 8 * 3 * 3, .out = 5});
  expect_bf16_gradients_of_fp32(fc, bf16_exact({4, 8, 3, 3}, 3), bf16_exact({4, 5}, 4));
}

// bf16 weights fixed at the first forward (inference's) cannot train: backward refuses them.
TEST(Bf16TrainingLayers, BackwardRefusesFixedBf16Weights) {
  if (!amx_available()) GTEST_SKIP() << no_amx();
  Conv2d conv("c", {.in = 3, .out = 4, .kernel = 3, .padding = 1});
  conv.set_compute_type(dt::bf16, Weights::fixed);
  const Tensor& y = conv.forward(image_batch(2, 8));
  EXPECT_THROW(conv.backward(y), core::InternalError);
  Linear fc("fc", {.in = 6, .out = 2});
  fc.set_compute_type(dt::bf16, Weights::fixed);
  const Tensor& z = fc.forward(bf16_exact({2, 6}, 7));
  EXPECT_THROW(fc.backward(z), core::InternalError);
}

// Dropout on a bfloat16 input (AlexNet's first, after bf16 pooling): dst bfloat16, the values of the float32 masking
// of that input; diff_src float32.
TEST(Bf16TrainingRun, DropoutMasksABfloat16InputInFloat32) {
  const Tensor x = image_batch(2, 4);
  const Tensor low = x.reordered_to(with_data_type(x.desc(), dt::bf16));
  Dropout a("a", 0.5f, 3), b("b", 0.5f, 3);
  const std::vector<float> expected = a.forward(Tensor(low.reordered_to(x.desc()))).to_plain();
  const Tensor& y = b.forward(low);
  EXPECT_EQ(y.data_type(), dt::bf16);
  EXPECT_EQ(y.to_plain(), expected);  // masked values of bf16 inputs are bf16 values (× 2 or 0): exact
  EXPECT_EQ(b.backward(x).data_type(), dt::f32);
}

// A few SGD steps in bf16 on one batch whose label is the sign of the images' mean brightness: the loss falls.
TEST(Bf16TrainingRun, LowersTheLoss) {
  if (!amx_available()) GTEST_SKIP() << no_amx();
  auto model = training_model("tiny_cnn", 16);
  ASSERT_EQ(use_training_precision(*model, Precision::bf16, core::Comm::alone()), Precision::bf16);
  const auto [x, labels] = labelled_batch(16, 16);
  const std::vector<Param*> params = model->parameters();
  Sgd sgd(OptimizerOptions{.momentum = 0.9});
  SoftmaxCrossEntropy loss;
  std::vector<double> losses;
  for (int step = 0; step < 10; ++step) {
    Optimizer::zero_grad(params);
    model->reseed(static_cast<std::uint64_t>(step));
    losses.push_back(loss.forward(model->forward(x), labels));
    model->backward(loss.backward());
    sgd.step(params, 0.2);
  }
  RecordProperty("first_loss", std::to_string(losses.front()));
  RecordProperty("last_loss", std::to_string(losses.back()));
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "losses " << ::testing::PrintToString(losses);
  for (const Param* p : params) {
    for (float v : p->value) ASSERT_TRUE(std::isfinite(v)) << p->name;
  }
}

// Trained bf16 weights follow the float32 Param on every forward, eval forwards included (a strategy swaps the EASGD
// centre's weights in for validation); fixed ones (inference) are converted once per setup.
TEST(Bf16TrainingRun, TrainedWeightsAreConvertedOnEveryForward) {
  if (!amx_available()) GTEST_SKIP() << no_amx();
  Conv2d conv("c", {.in = 3, .out = 4, .kernel = 3, .padding = 1});
  for (float& w : conv.weight().value) w = 0.25f;
  conv.set_compute_type(dt::bf16, Weights::trained);
  conv.set_mode(Mode::eval);
  const Tensor x = image_batch(2, 8);
  const std::vector<float> before = conv.forward(x).to_plain();
  for (float& w : conv.weight().value) w = 0.5f;
  const std::vector<float> after = conv.forward(x).to_plain();
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_FLOAT_EQ(after[i], 2.0f * before[i]) << i;

  conv.set_compute_type(dt::bf16, Weights::fixed);
  const std::vector<float> fixed = conv.forward(x).to_plain();
  for (float& w : conv.weight().value) w = 0.25f;
  EXPECT_EQ(conv.forward(x).to_plain(), fixed);
}

}  // namespace
}  // namespace tessera::engine
