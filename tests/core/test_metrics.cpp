// ROC AUC against hand-counted pairs.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/metrics.h"

namespace tessera::core {
namespace {

TEST(RocAuc, PerfectReversedAndRandom) {
  const std::vector<std::uint8_t> labels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f}, labels), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.9f, 0.8f, 0.2f, 0.1f}, labels), 0.0);
  // Pairs (pos, neg): 0.35 beats 0.1 but not 0.4; 0.8 beats both -> 3 of 4.
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, labels), 0.75);
}

TEST(RocAuc, TiesCountOneHalf) {
  const std::vector<std::uint8_t> labels = {0, 1, 0, 1};
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, labels), 0.5);
  // pos 0.5 vs neg 0.5 (tie, 1/2) and neg 0.2 (win); pos 0.9 wins both: (1.5 + 2) / 4.
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>{0.5f, 0.5f, 0.2f, 0.9f}, labels), 0.875);
}

TEST(RocAuc, OneClassIsNaNAndSizesMustMatch) {
  EXPECT_TRUE(std::isnan(roc_auc(std::vector<float>{0.1f, 0.2f}, std::vector<std::uint8_t>{1, 1})));
  EXPECT_THROW(roc_auc(std::vector<float>{0.1f}, std::vector<std::uint8_t>{1, 0}), core::InternalError);
}

TEST(BinaryEvaluation, MeansOverTiles) {
  BinaryEvaluation e;
  e.loss_sum = 3.0;
  e.count = 4;
  e.correct = 3;
  EXPECT_DOUBLE_EQ(e.loss(), 0.75);
  EXPECT_DOUBLE_EQ(e.accuracy(), 0.75);
}

// Confusion counts and rates counted by hand: scores 0.9 0.7 0.6 0.4 0.2 with labels 1 0 1 1 0 at 0.5 call the first
// three positive: tp 2 (0.9, 0.6), fp 1 (0.7), fn 1 (0.4), tn 1 (0.2).
TEST(OperatingPoint, CountsAndRatesAtAThreshold) {
  const std::vector<float> scores = {0.9f, 0.7f, 0.6f, 0.4f, 0.2f};
  const std::vector<std::uint8_t> labels = {1, 0, 1, 1, 0};
  const OperatingPoint p = operating_point(scores, labels, 0.5);
  EXPECT_EQ(p.tp, 2);
  EXPECT_EQ(p.fp, 1);
  EXPECT_EQ(p.fn, 1);
  EXPECT_EQ(p.tn, 1);
  EXPECT_DOUBLE_EQ(p.sensitivity(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(p.specificity(), 0.5);
  EXPECT_DOUBLE_EQ(p.precision(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(p.f1(), 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(p.balanced_accuracy(), (2.0 / 3.0 + 0.5) / 2.0);
  EXPECT_DOUBLE_EQ(p.accuracy(), 0.6);
  // A score equal to the threshold is called positive.
  EXPECT_EQ(operating_point(scores, labels, 0.6).tp, 2);
  EXPECT_EQ(operating_point(scores, labels, 0.6).fp, 1);
  // No positive call: precision and F1 are undefined only when there is nothing to count.
  const OperatingPoint none = operating_point(scores, labels, 2.0);
  EXPECT_TRUE(std::isnan(none.precision()));
  EXPECT_DOUBLE_EQ(none.f1(), 0.0);
  EXPECT_THROW(operating_point(scores, std::vector<std::uint8_t>{1}, 0.5), InternalError);
}

TEST(BalancedThreshold, PicksTheBestRuleAndSplitsTheGap) {
  // Labels 1 0 1 1 0 by descending score. Rules "≥ s": s=0.9 → J = 1/3; 0.7 → 1/3 − 1/2 < 0; 0.6 → 2/3 − 1/2;
  // 0.4 → 1 − 1/2 = 1/2 (best); 0.2 → 0. The threshold lies halfway between 0.4 and 0.2.
  const std::vector<float> scores = {0.9f, 0.7f, 0.6f, 0.4f, 0.2f};
  const std::vector<std::uint8_t> labels = {1, 0, 1, 1, 0};
  const double t = balanced_threshold(scores, labels);
  EXPECT_NEAR(t, 0.3, 1e-7);
  EXPECT_DOUBLE_EQ(operating_point(scores, labels, t).balanced_accuracy(), 0.75);
  // Separable scores: the threshold falls between the classes.
  EXPECT_NEAR(balanced_threshold(std::vector<float>{0.1f, 0.2f, 0.8f, 0.9f}, std::vector<std::uint8_t>{0, 0, 1, 1}),
              0.5, 1e-7);
  // Equal J: the higher threshold wins. 0.8 (J = 1/2 − 0) and 0.2 (J = 1 − 1/2) tie; 0.8 is kept.
  EXPECT_NEAR(balanced_threshold(std::vector<float>{0.8f, 0.5f, 0.2f, 0.1f}, std::vector<std::uint8_t>{1, 0, 1, 0}),
              0.65, 1e-7);
  // Ties in score move together; one class: NaN; reversed scores: nothing beats chance.
  EXPECT_TRUE(std::isnan(balanced_threshold(std::vector<float>{0.1f, 0.2f}, std::vector<std::uint8_t>{1, 1})));
  EXPECT_TRUE(std::isinf(balanced_threshold(std::vector<float>{0.1f, 0.9f}, std::vector<std::uint8_t>{1, 0})));
}

}  // namespace
}  // namespace tessera::core
