// ReLU on oneDNN against its naive twin; the gradient checker itself.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/layers/relu.h"
#include "engine/reference/relu.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using tag = dnnl::memory::format_tag;
using testing::make_tensor;

TEST(ReLU, MatchesTheReferenceInEveryLayout) {
  const dims_t dims = {3, 7, 7, 13};
  const auto src = gradcheck::random_vector(static_cast<std::size_t>(product(dims)), 1);
  const auto diff_dst = gradcheck::random_vector(src.size(), 2);
  const auto dst = reference::relu_forward(src);
  const auto diff_src = reference::relu_backward(dst, diff_dst);
  for (auto layout : {tag::nchw, tag::nChw8c, tag::nhwc}) {
    ReLU relu("relu");
    const Tensor x = make_tensor(dims, src, layout);
    const Tensor& y = relu.forward(x);
    EXPECT_EQ(y.desc(), x.desc()) << "in the input's layout";
    EXPECT_EQ(y.to_plain(), dst);
    EXPECT_EQ(relu.backward(make_tensor(dims, diff_dst)).to_plain(), diff_src) << "diff_dst in another layout";
  }
  ReLU flat("relu");
  EXPECT_EQ(flat.forward(make_tensor({21, 91}, src)).to_plain(), dst) << "2-D";
}

TEST(ReLUReference, BackwardMatchesCentralDifferencesAwayFromZero) {
  auto src = gradcheck::random_vector(500, 3);
  const auto r = gradcheck::random_vector(500, 4);
  src[0] = 0.0f;  // a kink: must be skipped, not failed
  auto loss = [&] { return gradcheck::weighted_sum(reference::relu_forward(src), r); };
  const auto report =
      gradcheck::check(src, reference::relu_backward(reference::relu_forward(src), r), loss, {.max_points = 500});
  EXPECT_TRUE(report.ok()) << report.summary();
  EXPECT_GE(report.skipped, 1u) << "the point at 0";
}

TEST(GradCheck, CatchesAWrongGradient) {
  auto x = gradcheck::random_vector(50, 5);
  auto loss = [&] {
    double s = 0.0;
    for (float v : x) s += std::sin(v);
    return s;
  };
  std::vector<float> right(x.size()), wrong(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    right[i] = std::cos(x[i]);
    wrong[i] = right[i] * (i == 17 ? 1.1f : 1.0f);
  }
  EXPECT_TRUE(gradcheck::check(x, right, loss).ok());
  const auto report = gradcheck::check(x, wrong, loss);
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.failed, 1u) << report.summary();
  EXPECT_FALSE(gradcheck::check(x, std::vector<float>(3), loss).ok()) << "size mismatch";
}

}  // namespace
}  // namespace tessera::engine
