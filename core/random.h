// Deterministic random numbers: splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014), the one generator and integer hash behind every seed, stream and draw in Tessera.
//
// It is pure 64-bit integer arithmetic, so it gives the same bits on every platform, compiler and standard
// library, unlike the std:: distributions (std::uniform_real_distribution, std::shuffle ...), whose output the
// standard leaves to each library: synthetic slides, augmentation, data order, dropout masks and initial weights
// must be the same for the same seed on every build.
//
// Three ways to use it, all the same arithmetic:
//   splitmix64_mix(z)   the output function alone: a bijective 64-bit mix in which every input bit changes every
//                       output bit with probability about 1/2 (counter-based draws: mix(key + gamma * i));
//   splitmix64(x)       one generator step from state x: splitmix64_mix(x + golden_gamma); a hash of a seed;
//   SplitMix64 g(seed)  the generator itself: g.next() adds golden_gamma to the state and mixes it, so the k-th
//                       output (k = 1, 2, ...) is splitmix64_mix(seed + k * golden_gamma).
//
// Known values: splitmix64(0) = 0xE220A8397B1DCDAF, and SplitMix64(1234567) starts 0x599ED017FB08FC85,
// 0x2C73F08458540FA5, 0x883EBCE5A3F27C77 (tests/core/test_random.cpp).
#pragma once

#include <cstdint>

namespace tessera::core {

// 2^64 / φ rounded to an odd number: splitmix64's step ("gamma"). Odd, so the state visits all 2^64 values; its
// bits are well spread, so multiples of it also separate the streams of nearby keys (salt * golden_gamma).
inline constexpr std::uint64_t golden_gamma = 0x9E3779B97F4A7C15ull;

// splitmix64's output function (a variant of MurmurHash3's 64-bit finalizer, Stafford's "Mix13" constants).
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The output of one splitmix64 step from state `x`; also the usual way to turn a seed into a well-mixed key.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept { return splitmix64_mix(x + golden_gamma); }

// The splitmix64 generator: a 64-bit state, advanced by golden_gamma, each output the mix of the new state.
class SplitMix64 {
 public:
  constexpr explicit SplitMix64(std::uint64_t seed) noexcept : state_(seed) {}

  constexpr std::uint64_t next() noexcept { return splitmix64_mix(state_ += golden_gamma); }
  constexpr std::uint64_t state() const noexcept { return state_; }

 private:
  std::uint64_t state_;
};

}  // namespace tessera::core
