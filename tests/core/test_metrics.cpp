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

}  // namespace
}  // namespace tessera::core
