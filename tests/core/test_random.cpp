// splitmix64 (core/random.h): fixed values, so a change to the arithmetic (and with it to every synthetic slide,
// augmentation, data order, dropout mask and initial weight) cannot pass unnoticed. The values were taken from the
// copies of splitmix64 that core/random.h replaced.
#include <cstdint>

#include <gtest/gtest.h>

#include "core/random.h"

namespace tessera::core {
namespace {

TEST(SplitMix64, GeneratorGivesTheKnownSequence) {
  SplitMix64 zero(0);
  EXPECT_EQ(zero.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(zero.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(zero.next(), 0x06C45D188009454Full);

  SplitMix64 seeded(1234567);
  EXPECT_EQ(seeded.next(), 0x599ED017FB08FC85ull);
  EXPECT_EQ(seeded.next(), 0x2C73F08458540FA5ull);
  EXPECT_EQ(seeded.next(), 0x883EBCE5A3F27C77ull);
}

TEST(SplitMix64, StateAdvancesByTheGoldenGamma) {
  SplitMix64 g(1234567);
  EXPECT_EQ(g.state(), 1234567u);
  g.next();
  g.next();
  EXPECT_EQ(g.state(), 1234567u + 2 * golden_gamma);
  EXPECT_EQ(golden_gamma % 2, 1u) << "an odd step visits every state";
}

TEST(SplitMix64, HashIsOneGeneratorStep) {
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64(1234567), 0x599ED017FB08FC85ull);
  for (const std::uint64_t seed : {0ull, 1ull, 42ull, 1234567ull, ~0ull}) {
    EXPECT_EQ(splitmix64(seed), SplitMix64(seed).next()) << seed;
    EXPECT_EQ(splitmix64(seed), splitmix64_mix(seed + golden_gamma)) << seed;
  }
}

TEST(SplitMix64, MixAloneIsTheOutputFunction) {
  EXPECT_EQ(splitmix64_mix(0), 0u) << "zero is a fixed point of the mix (never of a generator step)";
  EXPECT_EQ(splitmix64_mix(1), 0x5692161D100B05E5ull);
  EXPECT_EQ(splitmix64_mix(1234567), 0xD7CDDB79D5642718ull);
}

TEST(SplitMix64, UsableAtCompileTime) {
  static_assert(splitmix64(0) == 0xE220A8397B1DCDAFull);
  constexpr std::uint64_t second = [] {
    SplitMix64 g(0);
    g.next();
    return g.next();
  }();
  static_assert(second == 0x6E789E6AA1B965F4ull);
  SUCCEED();
}

}  // namespace
}  // namespace tessera::core
