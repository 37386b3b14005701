// Conv2d on oneDNN against its naive twin, gradients by central differences, primitive reuse.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/layers/conv.h"
#include "engine/reference/conv.h"
#include "engine/reference/relu.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using testing::all_near;
using testing::make_tensor;

struct ConvCase {
  std::string label;
  int n, c, h, w, o, kernel, stride, padding, dilation;
  bool bias, relu;
};

reference::ConvShape shape_of(const ConvCase& k) {
  reference::ConvShape s;
  s.n = k.n;
  s.c = k.c;
  s.h = k.h;
  s.w = k.w;
  s.o = k.o;
  s.kernel_h = s.kernel_w = k.kernel;
  s.stride_h = s.stride_w = k.stride;
  s.pad_h = s.pad_w = k.padding;
  s.dilation_h = s.dilation_w = k.dilation;
  return s;
}

Conv2dOptions options_of(const ConvCase& k) {
  return Conv2dOptions{.in = k.c,
                       .out = k.o,
                       .kernel = k.kernel,
                       .stride = k.stride,
                       .padding = k.padding,
                       .dilation = k.dilation,
                       .bias = k.bias,
                       .relu = k.relu};
}

// Odd shapes on purpose: channel counts that do not fill a SIMD block (7, 127), non-square 7×13 images.
const ConvCase conv_cases[] = {
    {"c7_o5_k3_pad1_bias", 3, 7, 7, 13, 5, 3, 1, 1, 1, true, false},
    {"c7_o127_stride2", 3, 7, 7, 13, 127, 3, 2, 1, 1, false, false},
    {"c127_o7_dilation2_relu", 3, 127, 7, 13, 7, 3, 1, 2, 2, true, true},
    {"rgb_k5_stride2_relu", 3, 3, 13, 7, 16, 5, 2, 2, 1, true, true},
    {"pointwise_c16_o32", 2, 16, 9, 9, 32, 1, 1, 0, 1, false, false},
    {"c8_o8_relu_nobias", 3, 8, 7, 13, 8, 3, 1, 1, 1, false, true},
};

class ConvCases : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvCases, ForwardAndBackwardMatchTheReference) {
  const ConvCase& k = GetParam();
  const reference::ConvShape s = shape_of(k);
  Conv2d conv("features.0", options_of(k));
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 11, -0.5f, 0.5f);
  std::vector<float> bias;
  if (k.bias) bias = conv.bias()->value = gradcheck::random_vector(static_cast<std::size_t>(k.o), 12);
  const auto src = gradcheck::random_vector(static_cast<std::size_t>(s.src_size()), 13);
  const auto diff_dst = gradcheck::random_vector(static_cast<std::size_t>(s.dst_size()), 14);

  const Tensor x = make_tensor({k.n, k.c, k.h, k.w}, src);
  const Tensor& y = conv.forward(x);
  ASSERT_EQ(y.dims(), (dims_t{k.n, k.o, s.out_h(), s.out_w()}));
  auto expected = reference::conv_forward(src, conv.weight().value, bias, s);
  if (k.relu) expected = reference::relu_forward(expected);
  const std::vector<float> dst = y.to_plain();
  EXPECT_TRUE(all_near(dst, expected, 1e-5)) << "forward";

  const Tensor& dx = conv.backward(make_tensor(y.dims(), diff_dst));
  // The ReLU mask comes from oneDNN's own dst so that a pre-activation within rounding of 0 cannot flip it.
  const auto diff_pre = k.relu ? reference::relu_backward(dst, diff_dst) : diff_dst;
  EXPECT_TRUE(all_near(dx.to_plain(), reference::conv_backward_data(diff_pre, conv.weight().value, s), 1e-5))
      << "diff_src";
  EXPECT_TRUE(all_near(conv.weight().grad, reference::conv_backward_weights(src, diff_pre, s), 1e-5)) << "weight grad";
  if (k.bias) {
    EXPECT_TRUE(all_near(conv.bias()->grad, reference::conv_backward_bias(diff_pre, s), 1e-5)) << "bias grad";
  }
}

INSTANTIATE_TEST_SUITE_P(Conv2d, ConvCases, ::testing::ValuesIn(conv_cases),
                         [](const auto& test) { return test.param.label; });

// The reference backward is itself checked against central differences of the reference forward.
TEST(ConvReference, BackwardMatchesCentralDifferences) {
  reference::ConvShape s;
  s.n = 2, s.c = 3, s.h = 7, s.w = 6, s.o = 4;
  s.kernel_h = 3, s.kernel_w = 2, s.stride_h = 2, s.stride_w = 1, s.pad_h = 1, s.pad_w = 1;
  s.dilation_h = 2, s.dilation_w = 1;
  auto src = gradcheck::random_vector(static_cast<std::size_t>(s.src_size()), 1);
  auto weights = gradcheck::random_vector(static_cast<std::size_t>(s.weights_size()), 2);
  auto bias = gradcheck::random_vector(static_cast<std::size_t>(s.o), 3);
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(s.dst_size()), 4);
  auto loss = [&] { return gradcheck::weighted_sum(reference::conv_forward(src, weights, bias, s), r); };

  const auto data = gradcheck::check(src, reference::conv_backward_data(r, weights, s), loss);
  EXPECT_TRUE(data.ok()) << data.summary();
  const auto w = gradcheck::check(weights, reference::conv_backward_weights(src, r, s), loss);
  EXPECT_TRUE(w.ok()) << w.summary();
  const auto b = gradcheck::check(bias, reference::conv_backward_bias(r, s), loss);
  EXPECT_TRUE(b.ok()) << b.summary();
}

// End to end through oneDNN (float32, blocked layouts, fused ReLU): the gradients are those of the forward.
TEST(Conv2d, GradientsMatchCentralDifferences) {
  Conv2d conv("conv1", {.in = 3, .out = 5, .kernel = 3, .stride = 2, .padding = 1, .bias = true, .relu = true});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 21, -0.5f, 0.5f);
  conv.bias()->value = gradcheck::random_vector(5, 22, -0.2f, 0.2f);
  const dims_t dims = {2, 3, 7, 6};
  auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 23);
  const Tensor& y0 = conv.forward(make_tensor(dims, src));
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(y0.numel()), 24);
  const Tensor dy = make_tensor(y0.dims(), r);
  const std::vector<float> diff_src = conv.backward(dy).to_plain();
  const std::vector<float> weight_grad = conv.weight().grad;
  const std::vector<float> bias_grad = conv.bias()->grad;

  auto loss = [&] { return gradcheck::weighted_sum(conv.forward(make_tensor(dims, src)).to_plain(), r); };
  gradcheck::Options options;
  options.step = 1e-2;
  options.max_points = 80;  // each point costs two forwards; 80 spread over the tensor cover every channel
  const auto data = gradcheck::check(src, diff_src, loss, options);
  EXPECT_TRUE(data.ok()) << data.summary();
  const auto w = gradcheck::check(conv.weight().value, weight_grad, loss, options);
  EXPECT_TRUE(w.ok()) << w.summary();
  const auto b = gradcheck::check(conv.bias()->value, bias_grad, loss, options);
  EXPECT_TRUE(b.ok()) << b.summary();
}

TEST(Conv2d, BackwardAccumulatesParameterGradients) {
  Conv2d conv("conv", {.in = 7, .out = 9, .kernel = 3, .padding = 1});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 31);
  const dims_t dims = {3, 7, 7, 13};
  const Tensor& y = conv.forward(make_tensor(dims, gradcheck::random_vector(product(dims), 32)));
  const Tensor dy = make_tensor(y.dims(), gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 33));
  conv.backward(dy);
  const std::vector<float> once_w = conv.weight().grad;
  const std::vector<float> once_b = conv.bias()->grad;
  conv.backward(dy);
  std::vector<float> twice_w(once_w.size()), twice_b(once_b.size());
  for (std::size_t i = 0; i < once_w.size(); ++i) twice_w[i] = 2.0f * once_w[i];
  for (std::size_t i = 0; i < once_b.size(); ++i) twice_b[i] = 2.0f * once_b[i];
  EXPECT_TRUE(all_near(conv.weight().grad, twice_w, 1e-6));
  EXPECT_TRUE(all_near(conv.bias()->grad, twice_b, 1e-6));
}

TEST(Conv2d, WithoutPropagateDownSkipsDiffSrcButKeepsWeightGradients) {
  Conv2d conv("conv1", {.in = 3, .out = 8, .kernel = 3, .padding = 1, .bias = false});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 41);
  conv.set_propagate_down(false);
  const dims_t dims = {2, 3, 7, 13};
  const auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 42);
  const Tensor& y = conv.forward(make_tensor(dims, src));
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 43);
  EXPECT_TRUE(conv.backward(make_tensor(y.dims(), r)).empty());
  reference::ConvShape s;
  s.n = 2, s.c = 3, s.h = 7, s.w = 13, s.o = 8, s.kernel_h = s.kernel_w = 3, s.pad_h = s.pad_w = 1;
  EXPECT_TRUE(all_near(conv.weight().grad, reference::conv_backward_weights(src, r, s), 1e-5));
}

TEST(Conv2d, PrimitivesAreReusedForARepeatedShapeAndRebuiltForANewOne) {
  Conv2d conv("conv", {.in = 7, .out = 8, .kernel = 3, .stride = 2, .padding = 1});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 51);
  const dims_t big = {3, 7, 7, 13}, small = {2, 7, 7, 13};
  const Tensor x_big = make_tensor(big, gradcheck::random_vector(product(big), 52));
  const Tensor x_small = make_tensor(small, gradcheck::random_vector(product(small), 53));

  const Tensor& y1 = conv.forward(x_big);
  const float* dst_buffer = y1.data();
  const Tensor dy = make_tensor(y1.dims(), gradcheck::random_vector(static_cast<std::size_t>(y1.numel()), 54));
  const float* diff_src_buffer = conv.backward(dy).data();
  const std::vector<float> first = y1.to_plain();
  EXPECT_EQ(conv.setup_count(), 1);

  const Tensor& y2 = conv.forward(x_big);
  EXPECT_EQ(conv.backward(dy).data(), diff_src_buffer) << "backward buffers are kept";
  EXPECT_EQ(conv.setup_count(), 1) << "same desc: no new primitives";
  EXPECT_EQ(y2.data(), dst_buffer) << "same desc: the output buffer is reused";
  EXPECT_EQ(y2.to_plain(), first) << "and the result is the same, bit for bit";

  EXPECT_EQ(conv.forward(x_small).dims()[0], 2);
  EXPECT_EQ(conv.setup_count(), 2) << "a new batch size rebuilds";
  conv.forward(x_big);
  EXPECT_EQ(conv.setup_count(), 3);
  EXPECT_EQ(conv.forward(x_big).to_plain(), first);
  EXPECT_EQ(conv.setup_count(), 3);
}

TEST(Conv2d, AcceptsAnyInputLayout) {
  Conv2d conv("conv", {.in = 7, .out = 5, .kernel = 3, .padding = 1});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 61);
  const dims_t dims = {3, 7, 7, 13};
  const auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 62);
  const std::vector<float> from_plain = conv.forward(make_tensor(dims, src)).to_plain();
  for (auto tag :
       {dnnl::memory::format_tag::nhwc, dnnl::memory::format_tag::nChw8c, dnnl::memory::format_tag::nChw16c}) {
    EXPECT_TRUE(all_near(conv.forward(make_tensor(dims, src, tag)).to_plain(), from_plain, 1e-6))
        << static_cast<int>(tag);
  }
}

TEST(Conv2d, RejectsAMismatchedInput) {
  Conv2d conv("layer1.0.conv1", {.in = 7, .out = 5, .kernel = 3});
  EXPECT_THROW(conv.forward(Tensor::plain({2, 6, 7, 7})), core::InternalError) << "wrong channel count";
  EXPECT_THROW(conv.forward(Tensor::plain({2, 7, 2, 7})), core::InternalError) << "image smaller than the kernel";
  try {
    conv.forward(Tensor::plain({2, 6, 7, 7}));
  } catch (const core::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("layer1.0.conv1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Conv2d("c", {.in = 0, .out = 5}), core::InternalError);
}

TEST(Conv2d, ParametersCarryPyTorchNamesAndShapes) {
  Conv2d conv("layer1.0.conv1", {.in = 64, .out = 128, .kernel = 3, .bias = false});
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  conv.collect(params, buffers);
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0]->name, "layer1.0.conv1.weight");
  EXPECT_EQ(params[0]->shape, (std::vector<std::int64_t>{128, 64, 3, 3}));
  EXPECT_EQ(params[0]->kind, ParamKind::conv_weight);
  EXPECT_TRUE(buffers.empty());
  conv.enable_bias();
  params.clear();
  conv.collect(params, buffers);
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[1]->name, "layer1.0.conv1.bias");
  EXPECT_EQ(params[1]->kind, ParamKind::bias);
}

}  // namespace
}  // namespace tessera::engine
