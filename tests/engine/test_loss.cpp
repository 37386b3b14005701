// Softmax cross-entropy on oneDNN's log-softmax against its naive twin, hand-worked PyTorch values, and
// central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "core/error.h"
#include "engine/layers/loss.h"
#include "engine/reference/loss.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"

namespace tessera::engine {
namespace {

using tag = dnnl::memory::format_tag;
using testing::all_near;
using testing::make_tensor;

constexpr double tol = 1e-5;

std::vector<int> labels_for(int n, int classes) {
  std::vector<int> labels(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) labels[i] = (i * 5 + 3) % classes;
  return labels;
}

TEST(CrossEntropyReference, HandWorkedWeightedMean) {
  // Two samples with logits (0, ln 3): p = (1/4, 3/4). Labels 0 and 1, class weights (1, 3):
  // loss = (1 · ln 4 + 3 · ln(4/3)) / (1 + 3), as torch.nn.CrossEntropyLoss(weight=[1, 3]).
  const float l3 = std::log(3.0f);
  const auto r = reference::softmax_cross_entropy({0, l3, 0, l3}, {0, 1}, 2, {1, 3});
  EXPECT_NEAR(r.loss, (std::log(4.0) + 3.0 * std::log(4.0 / 3.0)) / 4.0, 1e-6);
  EXPECT_NEAR(r.probabilities[1], 0.75f, 1e-6);
  // Sample 0 (weight 1/4): (p − onehot(0)) / 4 = (−3/16, 3/16); sample 1 (weight 3/4): (3/16, −3/16).
  EXPECT_TRUE(all_near(r.diff_logits, {-3 / 16.f, 3 / 16.f, 3 / 16.f, -3 / 16.f}, 1e-6));
  // Uniform logits: log K whatever the labels.
  EXPECT_NEAR(reference::softmax_cross_entropy(std::vector<float>(3 * 7, 0.5f), {0, 3, 6}, 7).loss, std::log(7.0),
              1e-6);
  EXPECT_THROW(reference::softmax_cross_entropy({0, 0}, {2}, 2), core::InternalError);
}

TEST(CrossEntropyReference, BackwardMatchesCentralDifferences) {
  const int n = 5, classes = 7;
  for (const auto& weights : {std::vector<float>{}, gradcheck::random_vector(classes, 2, 0.1f, 3.0f)}) {
    auto z = gradcheck::random_vector(n * classes, 1, -3.0f, 3.0f);
    const auto labels = labels_for(n, classes);
    auto loss = [&] { return reference::softmax_cross_entropy(z, labels, classes, weights).loss; };
    const auto report =
        gradcheck::check(z, reference::softmax_cross_entropy(z, labels, classes, weights).diff_logits, loss);
    EXPECT_TRUE(report.ok()) << (weights.empty() ? "unweighted: " : "weighted: ") << report.summary();
  }
}

TEST(SoftmaxCrossEntropy, MatchesTheReference) {
  const int n = 13, classes = 7;
  const auto z = gradcheck::random_vector(n * classes, 10, -5.0f, 5.0f);
  const auto labels = labels_for(n, classes);
  for (const auto& weights : {std::vector<float>{}, gradcheck::random_vector(classes, 11, 0.0f, 2.0f)}) {
    const auto expected = reference::softmax_cross_entropy(z, labels, classes, weights);
    SoftmaxCrossEntropy loss(weights);
    for (auto layout : {tag::ab, tag::ba}) {
      const double value = loss.forward(make_tensor({n, classes}, z, layout), labels);
      EXPECT_NEAR(value, expected.loss, 1e-5 * (1.0 + expected.loss));
      EXPECT_TRUE(all_near(loss.probabilities(), expected.probabilities, tol));
      EXPECT_EQ(loss.backward().desc(), plain_desc({n, classes}));
      EXPECT_TRUE(all_near(loss.backward().to_plain(), expected.diff_logits, tol));
    }
  }
}

TEST(SoftmaxCrossEntropy, TwoClassTumourBatch) {
  // The shape Tessera trains most: N×2 logits, labels 0 normal / 1 tumour, tumour weighted up.
  const int n = 64;
  const auto z = gradcheck::random_vector(n * 2, 20, -4.0f, 4.0f);
  std::vector<int> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = i % 5 == 0 ? 1 : 0;
  SoftmaxCrossEntropy loss({1.0f, 4.0f});
  const auto expected = reference::softmax_cross_entropy(z, labels, 2, {1.0f, 4.0f});
  EXPECT_NEAR(loss.forward(make_tensor({n, 2}, z), labels), expected.loss, 1e-5);
  EXPECT_TRUE(all_near(loss.backward().to_plain(), expected.diff_logits, tol));
}

TEST(SoftmaxCrossEntropy, GradientMatchesCentralDifferences) {
  const int n = 3, classes = 7;
  auto z = gradcheck::random_vector(n * classes, 30, -2.0f, 2.0f);
  const auto labels = labels_for(n, classes);
  SoftmaxCrossEntropy loss({0.5f, 1, 2, 1, 1, 3, 1});
  loss.forward(make_tensor({n, classes}, z), labels);
  const auto analytic = loss.backward().to_plain();
  auto value = [&] { return loss.forward(make_tensor({n, classes}, z), labels); };
  const auto report = gradcheck::check(z, analytic, value, {.step = 1e-2});
  EXPECT_TRUE(report.ok()) << report.summary();
}

TEST(SoftmaxCrossEntropy, StaysFiniteForHugeLogits) {
  SoftmaxCrossEntropy loss;
  const double value = loss.forward(make_tensor({2, 3}, {1000, -1000, 0, -500, 500, 0}), std::vector<int>{1, 1});
  // Sample 0 misses by 2000 (loss 2000), sample 1 is certain (loss 0).
  EXPECT_NEAR(value, 1000.0, 1e-3);
  for (float g : loss.backward().to_plain()) EXPECT_TRUE(std::isfinite(g));
}

TEST(SoftmaxCrossEntropy, AZeroWeightBatchCarriesNoSignal) {
  SoftmaxCrossEntropy loss({0.0f, 1.0f});
  EXPECT_EQ(loss.forward(make_tensor({2, 2}, {1, 2, 3, 4}), std::vector<int>{0, 0}), 0.0);
  for (float g : loss.backward().to_plain()) EXPECT_EQ(g, 0.0f);
}

TEST(SoftmaxCrossEntropy, PredictGivesProbabilities) {
  SoftmaxCrossEntropy loss;
  const auto z = gradcheck::random_vector(5 * 3, 40, -3.0f, 3.0f);
  const auto& p = loss.predict(make_tensor({5, 3}, z, tag::ba));
  ASSERT_EQ(p.size(), 15u);
  EXPECT_TRUE(all_near(p, reference::softmax_cross_entropy(z, {0, 0, 0, 0, 0}, 3).probabilities, tol));
  EXPECT_THROW(loss.backward(), core::InternalError) << "predict computes no gradient";
}

// exp(log-softmax) of the winning class can round to just above 1 (oneDNN's log-softmax is a few ulp off 0 there);
// the probabilities are clamped into [0, 1] where they are made, for every gap between the logits, both classes
// and both orders, with and without labels. (A NaN stays NaN: the clamp does not turn it into a certain 1.)
TEST(SoftmaxCrossEntropy, ProbabilitiesNeverLeaveZeroOne) {
  std::vector<float> z;
  for (int k = 0; k <= 4000; ++k) {
    const float gap = static_cast<float>(k) * 0.01f;  // 0 .. 40 in steps of 0.01
    const float base = static_cast<float>(k % 7) - 3.0f;
    z.insert(z.end(), {base + gap, base, base, base + gap});
  }
  const auto n = static_cast<long>(z.size() / 2);
  SoftmaxCrossEntropy loss;
  const auto check = [&](const std::vector<float>& p) {
    ASSERT_EQ(p.size(), z.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      ASSERT_TRUE(p[i] >= 0.0f && p[i] <= 1.0f)
          << "p[" << i << "] = " << p[i] << " for logits " << z[i & ~1u] << ", " << z[i | 1u];
    }
  };
  check(loss.predict(make_tensor({n, 2}, z)));
  std::vector<int> labels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int>(i % 2);
  (void)loss.forward(make_tensor({n, 2}, z), labels);
  check(loss.probabilities());
}

TEST(SoftmaxCrossEntropy, RejectsBadLabelsShapesAndWeights) {
  SoftmaxCrossEntropy loss;
  const Tensor z = make_tensor({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_THROW(loss.forward(z, std::vector<int>{0, 3}), core::InternalError);
  EXPECT_THROW(loss.forward(z, std::vector<int>{0, -1}), core::InternalError);
  EXPECT_THROW(loss.forward(z, std::vector<int>{0}), core::InternalError);
  EXPECT_THROW(loss.forward(Tensor::plain({2, 3, 1, 1}), std::vector<int>{0, 1}), core::InternalError);
  EXPECT_THROW(loss.backward(), core::InternalError);
  SoftmaxCrossEntropy two({1.0f, 2.0f});
  EXPECT_THROW(two.forward(z, std::vector<int>{0, 1}), core::InternalError) << "3 classes, 2 weights";
  EXPECT_THROW(SoftmaxCrossEntropy({1.0f, -1.0f}), core::InternalError);
  EXPECT_THROW(SoftmaxCrossEntropy({1.0f, NAN}), core::InternalError);
}

}  // namespace
}  // namespace tessera::engine
