#include "engine/layers/dropout.h"

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/random.h"

namespace tessera::engine {
namespace {

// splitmix64's mix as a counter-based random generator (core/random.h): mix(key + golden_gamma * counter) is a
// fresh, independent-looking value for each counter, so every element's draw is independent of the thread order.
using core::golden_gamma;
using core::splitmix64_mix;

constexpr double two_to_32 = 4294967296.0;

}  // namespace

Dropout::Dropout(std::string name, float p, std::uint64_t seed) : Module(std::move(name)), p_(p), seed_(seed) {
  if (!(p >= 0.0f && p < 1.0f)) {
    // Not fail(): type() is not callable while the base is being constructed.
    throw core::InternalError("Dropout '" + this->name() + "': p must be in [0, 1), got " + std::to_string(p));
  }
}

void Dropout::seed(std::uint64_t seed) {
  seed_ = seed;
  step_ = 0;
}

dnnl::memory::desc Dropout::do_setup(const dnnl::memory::desc& src) {
  // A bfloat16 src (bf16 training) is masked in float32, in its own layout, and converted back.
  const dnnl::memory::desc values = with_data_type(src, dnnl::memory::data_type::f32);
  values_ = Tensor(values);
  diff_src_ = Tensor(values);
  keep_.assign(values.get_size() / sizeof(float), 0);
  masked_ = false;
  return src;
}

const Tensor& Dropout::do_forward(const Tensor& src) {
  masked_ = mode() == Mode::train && p_ > 0.0f;
  if (!masked_) {
    identity_ = src;  // shares the buffer: no copy
    return identity_;
  }
  const auto count = static_cast<std::int64_t>(keep_.size());
  const std::uint64_t key = splitmix64_mix(splitmix64_mix(seed_) + golden_gamma * ++step_);
  const auto threshold = static_cast<std::uint64_t>(std::ceil(static_cast<double>(p_) * two_to_32));
  const float scale = 1.0f / (1.0f - p_);
  const float* x = src_reorder_(src, values_.desc()).data();
  float* y = values_.data();
  std::uint8_t* keep = keep_.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < count; ++i) {
    const bool kept = (splitmix64_mix(key + golden_gamma * static_cast<std::uint64_t>(i)) >> 32) >= threshold;
    keep[i] = kept ? 1 : 0;
    y[i] = kept ? x[i] * scale : 0.0f;
  }
  return dst_reorder_(values_, src.desc());
}

const Tensor& Dropout::do_backward(const Tensor& diff_dst) {
  if (!propagate_down()) return no_tensor();
  if (!masked_) {
    identity_diff_ = diff_dst;
    return identity_diff_;
  }
  const Tensor& dd = diff_dst_reorder_(diff_dst, values_.desc());
  const auto count = static_cast<std::int64_t>(keep_.size());
  const float scale = 1.0f / (1.0f - p_);
  const float* dy = dd.data();
  float* dx = diff_src_.data();
  const std::uint8_t* keep = keep_.data();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < count; ++i) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
  return diff_src_;
}

}  // namespace tessera::engine
