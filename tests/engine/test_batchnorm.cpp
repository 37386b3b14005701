// BatchNorm2d on oneDNN against its naive twin (train, eval, running statistics, fused ReLU), gradients by
// central differences, and folding into a convolution.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/conv.h"
#include "engine/layers/fold.h"
#include "engine/reference/batchnorm.h"
#include "engine/reference/relu.h"
#include "engine/sequential.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using testing::all_near;
using testing::make_tensor;
using tag = dnnl::memory::format_tag;

// Random affine parameters and running statistics, as after some training.
void randomize(BatchNorm2d& bn, std::uint32_t seed) {
  const auto c = static_cast<std::size_t>(bn.channels());
  bn.weight().value = gradcheck::random_vector(c, seed, 0.5f, 1.5f);
  bn.bias().value = gradcheck::random_vector(c, seed + 1, -0.5f, 0.5f);
  bn.running_mean().value = gradcheck::random_vector(c, seed + 2, -0.3f, 0.3f);
  bn.running_var().value = gradcheck::random_vector(c, seed + 3, 0.5f, 1.5f);
}

struct NormCase {
  std::string label;
  int c;
  tag layout;
  bool relu;
};

class NormCases : public ::testing::TestWithParam<NormCase> {};

TEST_P(NormCases, TrainingMatchesTheReference) {
  const NormCase& k = GetParam();
  const reference::NormShape s{3, k.c, 7, 13};
  BatchNorm2d bn("bn1", k.c, {.relu = k.relu});
  randomize(bn, 100);
  const std::vector<float> rm0 = bn.running_mean().value, rv0 = bn.running_var().value;
  // An offset and a scale per element so the batch statistics are far from 0 and 1.
  auto src = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 101, 0.5f, 3.0f);
  const auto diff_dst = gradcheck::random_vector(src.size(), 102);
  const dims_t dims = {s.n, s.c, s.h, s.w};

  const Tensor& y = bn.forward(make_tensor(dims, src, k.layout));
  EXPECT_EQ(y.desc(), make_tensor(dims, src, k.layout).desc()) << "dst keeps the input's layout";
  const auto stats = reference::batchnorm_statistics(src, s);
  auto expected = reference::batchnorm_forward(src, stats, bn.weight().value, bn.bias().value, 1e-5f, s);
  if (k.relu) expected = reference::relu_forward(expected);
  const std::vector<float> dst = y.to_plain();
  EXPECT_TRUE(all_near(dst, expected, 1e-5)) << "forward";

  std::vector<float> rm = rm0, rv = rv0;
  reference::batchnorm_update_running(stats, 0.1f, s, rm, rv);
  EXPECT_TRUE(all_near(bn.running_mean().value, rm, 1e-6)) << "running_mean";
  EXPECT_TRUE(all_near(bn.running_var().value, rv, 1e-6)) << "running_var (unbiased)";

  const Tensor& dx = bn.backward(make_tensor(dims, diff_dst));
  const auto dy = k.relu ? reference::relu_backward(dst, diff_dst) : diff_dst;
  const auto g = reference::batchnorm_backward(src, dy, stats, bn.weight().value, 1e-5f, true, s);
  EXPECT_TRUE(all_near(dx.to_plain(), g.diff_src, 1e-4)) << "diff_src";
  EXPECT_TRUE(all_near(bn.weight().grad, g.diff_gamma, 1e-4)) << "weight grad";
  EXPECT_TRUE(all_near(bn.bias().grad, g.diff_beta, 1e-4)) << "bias grad";

  // A second step moves the running averages again, from where the first left them.
  const auto src2 = gradcheck::random_vector(src.size(), 103, -2.0f, 1.0f);
  bn.forward(make_tensor(dims, src2, k.layout));
  reference::batchnorm_update_running(reference::batchnorm_statistics(src2, s), 0.1f, s, rm, rv);
  EXPECT_TRUE(all_near(bn.running_mean().value, rm, 1e-6)) << "running_mean after two steps";
  EXPECT_TRUE(all_near(bn.running_var().value, rv, 1e-6)) << "running_var after two steps";
}

TEST_P(NormCases, EvalUsesTheRunningStatisticsAndLeavesThemAlone) {
  const NormCase& k = GetParam();
  const reference::NormShape s{3, k.c, 7, 13};
  BatchNorm2d bn("bn1", k.c, {.relu = k.relu});
  randomize(bn, 200);
  bn.set_mode(Mode::eval);
  const std::vector<float> rm = bn.running_mean().value, rv = bn.running_var().value;
  const auto src = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 201);
  const auto diff_dst = gradcheck::random_vector(src.size(), 202);
  const dims_t dims = {s.n, s.c, s.h, s.w};

  const reference::NormStats running{rm, rv};
  auto expected = reference::batchnorm_forward(src, running, bn.weight().value, bn.bias().value, 1e-5f, s);
  if (k.relu) expected = reference::relu_forward(expected);
  const std::vector<float> dst = bn.forward(make_tensor(dims, src, k.layout)).to_plain();
  EXPECT_TRUE(all_near(dst, expected, 1e-5));
  EXPECT_EQ(bn.running_mean().value, rm);
  EXPECT_EQ(bn.running_var().value, rv);

  // Frozen statistics backward (fine-tuning with eval-mode batch norm).
  const Tensor& dx = bn.backward(make_tensor(dims, diff_dst));
  const auto dy = k.relu ? reference::relu_backward(dst, diff_dst) : diff_dst;
  const auto g = reference::batchnorm_backward(src, dy, running, bn.weight().value, 1e-5f, false, s);
  EXPECT_TRUE(all_near(dx.to_plain(), g.diff_src, 1e-5)) << "diff_src";
  EXPECT_TRUE(all_near(bn.weight().grad, g.diff_gamma, 1e-4)) << "weight grad";
  EXPECT_TRUE(all_near(bn.bias().grad, g.diff_beta, 1e-4)) << "bias grad";
}

const NormCase norm_cases[] = {
    {"c7_plain", 7, tag::nchw, false},         {"c7_blocked_relu", 7, tag::nChw8c, true},
    {"c127_plain_relu", 127, tag::nchw, true}, {"c127_blocked", 127, tag::nChw8c, false},
    {"c16_nhwc", 16, tag::nhwc, false},
};

INSTANTIATE_TEST_SUITE_P(BatchNorm2d, NormCases, ::testing::ValuesIn(norm_cases),
                         [](const auto& test) { return test.param.label; });

TEST(BatchNormReference, BackwardMatchesCentralDifferences) {
  const reference::NormShape s{3, 4, 3, 5};
  auto src = gradcheck::random_vector(static_cast<std::size_t>(s.size()), 1, -1.0f, 2.0f);
  auto gamma = gradcheck::random_vector(4, 2, 0.5f, 1.5f);
  auto beta = gradcheck::random_vector(4, 3);
  const auto r = gradcheck::random_vector(src.size(), 4);
  const reference::NormStats running{gradcheck::random_vector(4, 5), gradcheck::random_vector(4, 6, 0.5f, 1.5f)};
  for (const bool training : {true, false}) {
    SCOPED_TRACE(training ? "train" : "eval");
    auto loss = [&] {
      const auto stats = training ? reference::batchnorm_statistics(src, s) : running;
      return gradcheck::weighted_sum(reference::batchnorm_forward(src, stats, gamma, beta, 1e-5f, s), r);
    };
    const auto stats = training ? reference::batchnorm_statistics(src, s) : running;
    const auto g = reference::batchnorm_backward(src, r, stats, gamma, 1e-5f, training, s);
    const auto data = gradcheck::check(src, g.diff_src, loss);
    EXPECT_TRUE(data.ok()) << data.summary();
    const auto w = gradcheck::check(gamma, g.diff_gamma, loss);
    EXPECT_TRUE(w.ok()) << w.summary();
    const auto b = gradcheck::check(beta, g.diff_beta, loss);
    EXPECT_TRUE(b.ok()) << b.summary();
  }
}

TEST(BatchNorm2d, GradientsMatchCentralDifferences) {
  BatchNorm2d bn("bn", 5, {.relu = true});
  randomize(bn, 300);
  const dims_t dims = {2, 5, 3, 4};
  auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 301, -1.0f, 2.0f);
  const auto r = gradcheck::random_vector(src.size(), 302);
  bn.forward(make_tensor(dims, src, tag::nChw8c));
  const std::vector<float> diff_src = bn.backward(make_tensor(dims, r)).to_plain();
  const std::vector<float> weight_grad = bn.weight().grad, bias_grad = bn.bias().grad;
  auto loss = [&] { return gradcheck::weighted_sum(bn.forward(make_tensor(dims, src, tag::nChw8c)).to_plain(), r); };
  gradcheck::Options options;
  options.step = 1e-2;
  options.max_points = 80;  // each point costs two forwards; 80 spread over the tensor cover every channel
  const auto data = gradcheck::check(src, diff_src, loss, options);
  EXPECT_TRUE(data.ok()) << data.summary();
  const auto w = gradcheck::check(bn.weight().value, weight_grad, loss, options);
  EXPECT_TRUE(w.ok()) << w.summary();
  const auto b = gradcheck::check(bn.bias().value, bias_grad, loss, options);
  EXPECT_TRUE(b.ok()) << b.summary();
}

TEST(BatchNorm2d, NamesFollowPyTorch) {
  BatchNorm2d bn("layer1.0.bn1", 64);
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  bn.collect(params, buffers);
  ASSERT_EQ(params.size(), 2u);
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(params[0]->name, "layer1.0.bn1.weight");
  EXPECT_EQ(params[0]->kind, ParamKind::norm_weight);
  EXPECT_EQ(params[0]->value, std::vector<float>(64, 1.0f));
  EXPECT_EQ(params[1]->name, "layer1.0.bn1.bias");
  EXPECT_EQ(params[1]->kind, ParamKind::norm_bias);
  EXPECT_EQ(buffers[0]->name, "layer1.0.bn1.running_mean");
  EXPECT_EQ(buffers[1]->name, "layer1.0.bn1.running_var");
  EXPECT_EQ(buffers[1]->value, std::vector<float>(64, 1.0f));
}

TEST(BatchNorm2d, RejectsASingleValuePerChannelInTraining) {
  BatchNorm2d bn("bn", 3);
  EXPECT_THROW(bn.forward(Tensor::plain({1, 3, 1, 1})), core::InternalError);
  bn.set_mode(Mode::eval);
  EXPECT_NO_THROW(bn.forward(Tensor::plain({1, 3, 1, 1})));
}

struct FoldCase {
  std::string label;
  bool conv_bias;
  bool bn_relu;
};

class FoldCases : public ::testing::TestWithParam<FoldCase> {};

TEST_P(FoldCases, FoldingLeavesEvalOutputsUnchanged) {
  const FoldCase& k = GetParam();
  Sequential block("layer1.0");
  auto& conv = block.emplace<Conv2d>(Conv2dOptions{.in = 7, .out = 13, .kernel = 3, .padding = 1, .bias = k.conv_bias});
  auto& bn = block.emplace<BatchNorm2d>(13, BatchNorm2dOptions{.relu = k.bn_relu});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 400, -0.3f, 0.3f);
  if (k.conv_bias) conv.bias()->value = gradcheck::random_vector(13, 401);
  randomize(bn, 402);
  block.set_mode(Mode::eval);
  const dims_t dims = {3, 7, 7, 13};
  const Tensor x = make_tensor(dims, gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 403));
  const std::vector<float> before = block.forward(x).to_plain();

  fold_batchnorm(conv, bn);
  EXPECT_TRUE(bn.folded());
  ASSERT_NE(conv.bias(), nullptr);
  EXPECT_EQ(conv.options().relu, k.bn_relu);
  const std::vector<float> after = block.forward(x).to_plain();
  EXPECT_TRUE(all_near(after, before, 1e-5));
  EXPECT_EQ(after.size(), before.size());

  EXPECT_THROW(fold_batchnorm(conv, bn), core::InternalError) << "folding twice";
  block.set_mode(Mode::train);
  EXPECT_THROW(block.forward(x), core::InternalError) << "a folded batch norm cannot train";
}

INSTANTIATE_TEST_SUITE_P(FoldBatchnorm, FoldCases,
                         ::testing::Values(FoldCase{"conv_bias", true, false}, FoldCase{"no_bias_relu", false, true},
                                           FoldCase{"no_bias", false, false}),
                         [](const auto& test) { return test.param.label; });

TEST(FoldBatchnorm, RefusesPairsThatDoNotFit) {
  Conv2d conv("conv", {.in = 3, .out = 8, .kernel = 3});
  BatchNorm2d wrong("bn", 7);
  EXPECT_THROW(fold_batchnorm(conv, wrong), core::InternalError);
  Conv2d with_relu("conv", {.in = 3, .out = 8, .kernel = 3, .relu = true});
  BatchNorm2d bn("bn", 8);
  EXPECT_THROW(fold_batchnorm(with_relu, bn), core::InternalError);
}

}  // namespace
}  // namespace tessera::engine
