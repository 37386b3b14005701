// The parameter contract shared by layers, optimizers, strategies and checkpoints.
#include <gtest/gtest.h>

#include "engine/parameters.h"

namespace tessera::engine {
namespace {

TEST(Parameters, SizeIsTheProductOfTheShape) {
  Param p;
  p.shape = {64, 3, 7, 7};
  EXPECT_EQ(p.numel(), 64 * 3 * 7 * 7);
  p.shape = {};
  EXPECT_EQ(p.numel(), 1) << "a scalar";
}

TEST(Parameters, OnlyConvolutionAndLinearWeightsAreDecayed) {
  Param p;
  for (auto [kind, decayed] : {std::pair{ParamKind::conv_weight, true}, std::pair{ParamKind::linear_weight, true},
                               std::pair{ParamKind::bias, false}, std::pair{ParamKind::norm_weight, false},
                               std::pair{ParamKind::norm_bias, false}}) {
    p.kind = kind;
    EXPECT_EQ(p.decayed(), decayed) << static_cast<int>(kind);
  }
}

}  // namespace
}  // namespace tessera::engine
