#include "engine/models/init.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <numbers>
#include <string>

#include "core/error.h"
#include "core/random.h"

namespace tessera::engine {
namespace {

// Below this many elements a parallel region costs more than the loop it would split.
constexpr std::int64_t parallel_min_elements = 65536;

// splitmix64 (core/random.h) as a hash: a bijective 64-bit mix with good avalanche, enough for initial weights.
using core::splitmix64;

// FNV-1a of the parameter name: each parameter draws from its own stream.
std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::uint64_t stream_key(const Param& param, std::uint64_t seed) {
  return splitmix64(seed ^ splitmix64(name_hash(param.name)));
}

// Two uniforms in (0, 1) from the element's 64 random bits (the +0.5 keeps log() of the first finite).
void uniforms(std::uint64_t key, std::int64_t i, double& u1, double& u2) {
  const std::uint64_t bits = splitmix64(key ^ splitmix64(static_cast<std::uint64_t>(i)));
  constexpr double scale = 1.0 / 4294967296.0;
  u1 = (static_cast<double>(bits >> 32) + 0.5) * scale;
  u2 = (static_cast<double>(bits & 0xffffffffULL) + 0.5) * scale;
}

void check_size(const Param& param) {
  if (static_cast<std::int64_t>(param.value.size()) != param.numel()) {
    throw core::InternalError("initialise '" + param.name + "': holds " + std::to_string(param.value.size()) +
                              " values for " + std::to_string(param.numel()) + " elements");
  }
}

// fan_in and fan_out of a conv (O×I×kH×kW) or linear ([O, I]) weight.
std::int64_t receptive(const Param& weight) {
  std::int64_t r = 1;
  for (std::size_t i = 2; i < weight.shape.size(); ++i) r *= weight.shape[i];
  return r;
}
std::int64_t fan_in(const Param& weight) { return weight.shape.size() < 2 ? 1 : weight.shape[1] * receptive(weight); }
std::int64_t fan_out(const Param& weight) { return weight.shape.empty() ? 1 : weight.shape[0] * receptive(weight); }

// The weight a bias belongs to: "x.bias" → "x.weight".
const Param& weight_of(const Param& bias, const std::map<std::string, const Param*>& by_name) {
  const std::string suffix = "bias";
  const bool named = bias.name.size() >= suffix.size() &&
                     bias.name.compare(bias.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (named) {
    const auto it = by_name.find(bias.name.substr(0, bias.name.size() - suffix.size()) + "weight");
    if (it != by_name.end()) return *it->second;
  }
  throw core::InternalError("initialise '" + bias.name + "': no weight of the same module to take the fan-in from");
}

}  // namespace

void fill_uniform(Param& param, double bound, std::uint64_t seed) {
  check_size(param);
  const std::uint64_t key = stream_key(param, seed);
  const auto n = static_cast<std::int64_t>(param.value.size());
  float* v = param.value.data();
#pragma omp parallel for schedule(static) if (n >= parallel_min_elements)
  for (std::int64_t i = 0; i < n; ++i) {
    double u1 = 0.0, u2 = 0.0;
    uniforms(key, i, u1, u2);
    v[i] = static_cast<float>((2.0 * u1 - 1.0) * bound);
  }
}

void fill_normal(Param& param, double stddev, std::uint64_t seed) {
  check_size(param);
  const std::uint64_t key = stream_key(param, seed);
  const auto n = static_cast<std::int64_t>(param.value.size());
  const std::int64_t pairs = (n + 1) / 2;
  float* v = param.value.data();
  const auto scale = static_cast<float>(stddev);
  constexpr auto two_pi = static_cast<float>(2.0 * std::numbers::pi);
#pragma omp parallel for schedule(static) if (n >= parallel_min_elements)
  for (std::int64_t k = 0; k < pairs; ++k) {
    double u1 = 0.0, u2 = 0.0;
    uniforms(key, k, u1, u2);
    // Box-Muller: two independent normals per pair of uniforms, for elements 2k and 2k + 1. Single precision
    // is plenty for initial weights and twice as fast.
    const float r = scale * std::sqrt(-2.0f * std::log(static_cast<float>(u1)));
    const float theta = two_pi * static_cast<float>(u2);
    v[2 * k] = r * std::cos(theta);
    if (2 * k + 1 < n) v[2 * k + 1] = r * std::sin(theta);
  }
}

void fill_constant(Param& param, float value) {
  check_size(param);
  std::fill(param.value.begin(), param.value.end(), value);
}

void initialize(const std::vector<Param*>& params, const InitScheme& scheme, std::uint64_t seed) {
  std::map<std::string, const Param*> by_name;
  for (const Param* p : params) by_name[p->name] = p;
  for (Param* p : params) {
    switch (p->kind) {
      case ParamKind::conv_weight:
        if (scheme.conv == ConvInit::kaiming_normal_fan_out) {
          fill_normal(*p, std::sqrt(2.0 / static_cast<double>(fan_out(*p))), seed);
        } else {
          fill_uniform(*p, 1.0 / std::sqrt(static_cast<double>(fan_in(*p))), seed);
        }
        break;
      case ParamKind::linear_weight:
        if (scheme.linear == LinearInit::normal_0_01) {
          fill_normal(*p, 0.01, seed);
        } else {
          fill_uniform(*p, 1.0 / std::sqrt(static_cast<double>(fan_in(*p))), seed);
        }
        break;
      case ParamKind::bias: {
        const Param& weight = weight_of(*p, by_name);
        const bool zero = weight.kind == ParamKind::conv_weight ? scheme.conv == ConvInit::kaiming_normal_fan_out
                                                                : scheme.linear == LinearInit::normal_0_01;
        if (zero) {
          fill_constant(*p, 0.0f);
        } else {
          fill_uniform(*p, 1.0 / std::sqrt(static_cast<double>(fan_in(weight))), seed);
        }
        break;
      }
      case ParamKind::norm_weight:
        fill_constant(*p, 1.0f);
        break;
      case ParamKind::norm_bias:
        fill_constant(*p, 0.0f);
        break;
    }
  }
}

}  // namespace tessera::engine
