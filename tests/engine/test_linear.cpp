// Linear on oneDNN's inner product against its naive twin, including PyTorch's flatten(1) of a 4-D input that
// arrives in a blocked layout.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "engine/layers/conv.h"
#include "engine/layers/linear.h"
#include "engine/reference/conv.h"
#include "engine/reference/linear.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using tag = dnnl::memory::format_tag;
using reference::LinearShape;
using testing::all_near;
using testing::make_tensor;

constexpr double tol = 1e-5;

void randomize(Linear& fc, std::uint32_t seed) {
  fc.weight().value = gradcheck::random_vector(fc.weight().value.size(), seed, -0.5f, 0.5f);
  if (fc.bias() != nullptr) fc.bias()->value = gradcheck::random_vector(fc.bias()->value.size(), seed + 1);
}

std::vector<float> bias_or_empty(const Linear& fc) { return fc.bias() ? fc.bias()->value : std::vector<float>{}; }

TEST(LinearReference, HandWorked) {
  // x = [1 2], W = [[1 0], [2 3], [0 -1]], b = [0.5 0 1]
  const std::vector<float> x = {1, 2}, w = {1, 0, 2, 3, 0, -1}, b = {0.5f, 0, 1};
  EXPECT_EQ(reference::linear_forward(x, w, b, {1, 2, 3}), (std::vector<float>{1.5f, 8, -1}));
  const auto g = reference::linear_backward(x, w, {1, 1, 1}, {1, 2, 3});
  EXPECT_EQ(g.diff_x, (std::vector<float>{3, 2}));
  EXPECT_EQ(g.diff_weight, (std::vector<float>{1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(g.diff_bias, (std::vector<float>{1, 1, 1}));
  EXPECT_THROW(reference::linear_forward(x, w, b, {1, 3, 3}), core::InternalError);
}

TEST(LinearReference, BackwardMatchesCentralDifferences) {
  const LinearShape s{3, 13, 7};
  auto x = gradcheck::random_vector(static_cast<std::size_t>(s.batch * s.inputs), 1);
  auto w = gradcheck::random_vector(static_cast<std::size_t>(s.outputs * s.inputs), 2);
  auto b = gradcheck::random_vector(static_cast<std::size_t>(s.outputs), 3);
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(s.batch * s.outputs), 4);
  auto loss = [&] { return gradcheck::weighted_sum(reference::linear_forward(x, w, b, s), r); };
  const auto g = reference::linear_backward(x, w, r, s);
  for (auto [values, grad, what] : {std::tuple{&x, &g.diff_x, "x"}, std::tuple{&w, &g.diff_weight, "weight"},
                                    std::tuple{&b, &g.diff_bias, "bias"}}) {
    const auto report = gradcheck::check(*values, *grad, loss);
    EXPECT_TRUE(report.ok()) << what << ": " << report.summary();
  }
}

TEST(Linear, MatchesTheReferenceOn2DInputs) {
  for (bool bias : {true, false}) {
    const LinearShape s{3, 127, 7};
    Linear fc("fc", {.in = s.inputs, .out = s.outputs, .bias = bias});
    randomize(fc, 10);
    const auto x = gradcheck::random_vector(static_cast<std::size_t>(s.batch * s.inputs), 12);
    const auto dy = gradcheck::random_vector(static_cast<std::size_t>(s.batch * s.outputs), 13);
    const Tensor& y = fc.forward(make_tensor({s.batch, s.inputs}, x));
    EXPECT_EQ(y.dims(), (dims_t{s.batch, s.outputs}));
    EXPECT_TRUE(all_near(y.to_plain(), reference::linear_forward(x, fc.weight().value, bias_or_empty(fc), s), tol));
    const auto expected = reference::linear_backward(x, fc.weight().value, dy, s);
    const Tensor& dx = fc.backward(make_tensor({s.batch, s.outputs}, dy, tag::ba));
    EXPECT_TRUE(all_near(dx.to_plain(), expected.diff_x, tol));
    EXPECT_TRUE(all_near(fc.weight().grad, expected.diff_weight, tol));
    if (bias) {
      EXPECT_TRUE(all_near(fc.bias()->grad, expected.diff_bias, tol));
    }

    // Gradients accumulate over backward calls; the optimizer, not the layer, zeroes them.
    fc.backward(make_tensor({s.batch, s.outputs}, dy));
    std::vector<float> twice = expected.diff_weight;
    for (auto& v : twice) v *= 2.0f;
    EXPECT_TRUE(all_near(fc.weight().grad, twice, tol));
  }
}

TEST(Linear, FollowsWeightUpdatesBetweenForwards) {
  Linear fc("fc", {.in = 13, .out = 7});
  randomize(fc, 20);
  const auto x = gradcheck::random_vector(3 * 13, 22);
  const Tensor input = make_tensor({3, 13}, x);
  fc.forward(input);
  for (auto& v : fc.weight().value) v *= -2.0f;        // in place, as an optimizer step
  fc.bias()->value = gradcheck::random_vector(7, 23);  // reassigned: a new buffer
  EXPECT_TRUE(all_near(fc.forward(input).to_plain(),
                       reference::linear_forward(x, fc.weight().value, fc.bias()->value, {3, 13, 7}), tol));
}

// PyTorch's flatten(1) of an NCHW tensor, whatever layout the producer used.
TEST(Linear, Flattens4DInputsInPyTorchOrderInEveryLayout) {
  for (int channels : {7, 16}) {
    const dims_t dims = {3, channels, 7, 13};
    const int inputs = channels * 7 * 13;
    const LinearShape s{3, inputs, 5};
    const auto x = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 30);
    const auto dy = gradcheck::random_vector(static_cast<std::size_t>(s.batch * s.outputs), 31);
    for (auto layout : {tag::nchw, tag::nChw8c, tag::nhwc, tag::nChw16c}) {
      SCOPED_TRACE(::testing::Message() << "C " << channels << ", layout " << static_cast<int>(layout));
      Linear fc("classifier.0", {.in = inputs, .out = s.outputs});
      randomize(fc, 32);
      const Tensor input = make_tensor(dims, x, layout);
      const Tensor& y = fc.forward(input);
      EXPECT_TRUE(all_near(y.to_plain(), reference::linear_forward(x, fc.weight().value, fc.bias()->value, s), tol));
      const auto expected = reference::linear_backward(x, fc.weight().value, dy, s);
      const Tensor& dx = fc.backward(make_tensor(y.dims(), dy));
      EXPECT_EQ(dx.desc(), input.desc()) << "the gradient comes back in the producer's layout";
      EXPECT_TRUE(all_near(dx.to_plain(), expected.diff_x, tol));
      EXPECT_TRUE(all_near(fc.weight().grad, expected.diff_weight, tol)) << "grad in [out, in] = OIHW order";
      EXPECT_TRUE(all_near(fc.bias()->grad, expected.diff_bias, tol));
    }
  }
}

// A real blocked producer: a convolution that picked its own layout, then the classifier.
TEST(Linear, AfterAConvolutionMatchesConvThenFlattenThenLinear) {
  reference::ConvShape cs;
  cs.n = 3, cs.c = 3, cs.h = 7, cs.w = 13, cs.o = 7, cs.kernel_h = cs.kernel_w = 3, cs.pad_h = cs.pad_w = 1;
  Conv2d conv("features.0", {.in = 3, .out = 7, .kernel = 3, .padding = 1});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 40, -0.5f, 0.5f);
  conv.bias()->value = gradcheck::random_vector(7, 41);
  const int inputs = 7 * 7 * 13;
  Linear fc("classifier", {.in = inputs, .out = 4});
  randomize(fc, 42);
  const auto x = gradcheck::random_vector(static_cast<std::size_t>(cs.src_size()), 43);

  const Tensor& features = conv.forward(make_tensor({3, 3, 7, 13}, x));
  const Tensor& y = fc.forward(features);
  const auto conv_out = reference::conv_forward(x, conv.weight().value, conv.bias()->value, cs);
  EXPECT_TRUE(all_near(y.to_plain(),
                       reference::linear_forward(conv_out, fc.weight().value, fc.bias()->value, {3, inputs, 4}), tol))
      << "conv output layout: " << (is_plain(features.desc()) ? "plain" : "blocked");
}

TEST(Linear, GradientsMatchCentralDifferences) {
  const dims_t dims = {2, 5, 3, 4};
  Linear fc("fc", {.in = 60, .out = 3});
  randomize(fc, 50);
  auto x = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 51);
  const Tensor& y0 = fc.forward(make_tensor(dims, x, tag::nChw8c));
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(y0.numel()), 52);
  const auto diff_src = fc.backward(make_tensor(y0.dims(), r)).to_plain();
  const auto weight_grad = fc.weight().grad;
  const auto bias_grad = fc.bias()->grad;
  auto loss = [&] { return gradcheck::weighted_sum(fc.forward(make_tensor(dims, x, tag::nChw8c)).to_plain(), r); };
  const gradcheck::Options options{.step = 1e-2};
  auto report = gradcheck::check(x, diff_src, loss, options);
  EXPECT_TRUE(report.ok()) << "src: " << report.summary();
  report = gradcheck::check(fc.weight().value, weight_grad, loss, options);
  EXPECT_TRUE(report.ok()) << "weight: " << report.summary();
  report = gradcheck::check(fc.bias()->value, bias_grad, loss, options);
  EXPECT_TRUE(report.ok()) << "bias: " << report.summary();
}

TEST(Linear, NamesShapesAndErrors) {
  Linear fc("fc", {.in = 512, .out = 2});
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  fc.collect(params, buffers);
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0]->name, "fc.weight");
  EXPECT_EQ(params[0]->kind, ParamKind::linear_weight);
  EXPECT_EQ(params[0]->shape, (std::vector<std::int64_t>{2, 512}));
  EXPECT_EQ(params[1]->name, "fc.bias");
  EXPECT_EQ(params[1]->kind, ParamKind::bias);
  EXPECT_TRUE(buffers.empty());

  Linear no_bias("head", {.in = 4, .out = 2, .bias = false});
  params.clear();
  no_bias.collect(params, buffers);
  EXPECT_EQ(params.size(), 1u);
  EXPECT_EQ(no_bias.bias(), nullptr);

  EXPECT_THROW(Linear("bad", {.in = 0, .out = 2}), core::InternalError);
  EXPECT_THROW(fc.forward(Tensor::plain({2, 511})), core::InternalError);
  EXPECT_THROW(fc.forward(Tensor::plain({2, 8, 8, 7})), core::InternalError) << "448 features, not 512";
  fc.weight().grad.clear();
  EXPECT_THROW(fc.forward(Tensor::plain({2, 512})), core::InternalError) << "a Param resized behind the layer's back";
}

TEST(Linear, WithoutPropagateDownStillComputesParameterGradients) {
  Linear fc("fc", {.in = 6, .out = 2});
  randomize(fc, 60);
  fc.set_propagate_down(false);
  const auto x = gradcheck::random_vector(18, 61);
  const Tensor& y = fc.forward(make_tensor({3, 6}, x));
  const auto dy = gradcheck::random_vector(6, 62);
  EXPECT_TRUE(fc.backward(make_tensor(y.dims(), dy)).empty());
  EXPECT_TRUE(
      all_near(fc.weight().grad, reference::linear_backward(x, fc.weight().value, dy, {3, 6, 2}).diff_weight, tol));
}

}  // namespace
}  // namespace tessera::engine
