// Residual addition (with and without the fused ReLU) against its naive twin, and a whole residual block's
// gradient — conv path plus identity shortcut, the two gradients summed — against central differences.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "core/error.h"
#include "engine/layers/add.h"
#include "engine/layers/conv.h"
#include "engine/reference/elementwise.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using tag = dnnl::memory::format_tag;
using testing::all_near;
using testing::make_tensor;

constexpr double tol = 1e-6;

TEST(AddReference, HandWorkedAndCentralDifferences) {
  EXPECT_EQ(reference::add_forward({1, -2, 3}, {1, 1, -4}), (std::vector<float>{2, -1, -1}));
  EXPECT_EQ(reference::add_forward({1, -2, 3}, {1, 1, -4}, true), (std::vector<float>{2, 0, 0}));
  EXPECT_EQ(reference::add_backward({5, 6, 7}, {2, 0, 0}, true), (std::vector<float>{5, 0, 0}));
  EXPECT_THROW(reference::add_forward({1}, {1, 2}), core::InternalError);

  auto a = gradcheck::random_vector(300, 1);
  const auto b = gradcheck::random_vector(300, 2);
  const auto r = gradcheck::random_vector(300, 3);
  auto loss = [&] { return gradcheck::weighted_sum(reference::add_forward(a, b, true), r); };
  const auto report = gradcheck::check(a, reference::add_backward(r, reference::add_forward(a, b, true), true), loss);
  EXPECT_TRUE(report.ok()) << report.summary();
}

TEST(ResidualAdd, MatchesTheReferenceAcrossLayouts) {
  for (bool relu : {false, true}) {
    for (int channels : {7, 127}) {
      const dims_t dims = {3, channels, 7, 13};
      const auto a = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 10);
      const auto b = gradcheck::random_vector(a.size(), 11);
      const auto dy = gradcheck::random_vector(a.size(), 12);
      const auto y = reference::add_forward(a, b, relu);
      const auto diff = reference::add_backward(dy, y, relu);
      for (auto [a_layout, b_layout] : {std::pair{tag::nChw8c, tag::nChw8c}, std::pair{tag::nChw8c, tag::nchw},
                                        std::pair{tag::nhwc, tag::nChw8c}}) {
        SCOPED_TRACE(::testing::Message() << "relu " << relu << ", C " << channels << ", layouts "
                                          << static_cast<int>(a_layout) << "/" << static_cast<int>(b_layout));
        ResidualAdd join("layer1.0", relu);
        const Tensor ta = make_tensor(dims, a, a_layout);
        const Tensor& out = join.forward(ta, make_tensor(dims, b, b_layout));
        EXPECT_EQ(out.desc(), ta.desc()) << "a's layout";
        EXPECT_TRUE(all_near(out.to_plain(), y, tol));
        const Tensor ddst = make_tensor(dims, dy, tag::nchw);
        const Tensor& g = join.backward(ddst);
        EXPECT_TRUE(all_near(g.to_plain(), diff, tol));
        if (!relu) {
          EXPECT_EQ(g.data(), ddst.data()) << "passed through without a copy";
        }
      }
    }
  }
  const auto v = gradcheck::random_vector(8, 13);
  ResidualAdd flat("sum");
  EXPECT_TRUE(all_near(flat.forward(make_tensor({2, 4}, v), make_tensor({2, 4}, v, tag::ba)).to_plain(),
                       reference::add_forward(v, v), tol))
      << "2-D";
}

TEST(ResidualAdd, RejectsMismatchedInputsAndEarlyBackward) {
  ResidualAdd join("j", true);
  EXPECT_THROW(join.backward(Tensor::plain({1, 2, 3, 3})), core::InternalError) << "no forward yet";
  EXPECT_THROW(join.forward(Tensor::plain({1, 2, 3, 3}), Tensor::plain({1, 2, 3, 4})), core::InternalError);
  join.forward(Tensor::plain({1, 2, 3, 3}), Tensor::plain({1, 2, 3, 3}));
  EXPECT_THROW(join.backward(Tensor::plain({1, 2, 3, 4})), core::InternalError);
}

// y = relu(conv(x) + x): forward through the join, backward through the join, the conv and the shortcut, the
// two gradients that reach x summed by a second ResidualAdd — the pattern add.h documents for ResNet blocks.
TEST(ResidualAdd, ResidualBlockGradientMatchesCentralDifferences) {
  const dims_t dims = {2, 8, 5, 6};
  Conv2d conv("layer1.0.conv1", {.in = 8, .out = 8, .kernel = 3, .padding = 1, .bias = false});
  conv.weight().value = gradcheck::random_vector(conv.weight().value.size(), 20, -0.3f, 0.3f);
  ResidualAdd join("layer1.0", true), grad_sum("layer1.0.grad");
  auto x = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 21);
  auto block = [&](const Tensor& input) -> const Tensor& { return join.forward(conv.forward(input), input); };

  const Tensor input = make_tensor(dims, x);
  const Tensor& y = block(input);
  const auto r = gradcheck::random_vector(static_cast<std::size_t>(y.numel()), 22);
  const Tensor& g = join.backward(make_tensor(dims, r));
  const Tensor& dx = grad_sum.forward(conv.backward(g), g);
  const auto analytic = dx.to_plain();

  auto loss = [&] { return gradcheck::weighted_sum(block(make_tensor(dims, x)).to_plain(), r); };
  const auto report = gradcheck::check(x, analytic, loss, {.step = 1e-2, .max_points = 150});
  EXPECT_TRUE(report.ok()) << report.summary();
}

}  // namespace
}  // namespace tessera::engine
