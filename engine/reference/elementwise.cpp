#include "engine/reference/elementwise.h"

#include <cstddef>
#include <string>

#include "core/error.h"

namespace tessera::engine::reference {
namespace {

template <typename A, typename B>
void check_same_size(const A& a, const B& b, const char* what) {
  if (a.size() != b.size()) {
    throw core::InternalError(std::string("reference ") + what + ": sizes differ (" + std::to_string(a.size()) +
                              " and " + std::to_string(b.size()) + ")");
  }
}

float keep_scale(float p) {
  if (!(p >= 0.0f && p < 1.0f))
    throw core::InternalError("reference dropout: p must be in [0, 1), got " + std::to_string(p));
  return 1.0f / (1.0f - p);
}

}  // namespace

std::vector<float> dropout_forward(const std::vector<float>& x, const std::vector<std::uint8_t>& keep, float p) {
  check_same_size(x, keep, "dropout");
  const float scale = keep_scale(p);
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = keep[i] ? x[i] * scale : 0.0f;
  return y;
}

std::vector<float> dropout_backward(const std::vector<float>& diff_y, const std::vector<std::uint8_t>& keep, float p) {
  // Dropout is linear in x with the mask fixed, so its backward is the forward applied to diff_y.
  return dropout_forward(diff_y, keep, p);
}

std::vector<float> add_forward(const std::vector<float>& a, const std::vector<float>& b, bool relu) {
  check_same_size(a, b, "add");
  std::vector<float> y(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float sum = a[i] + b[i];
    y[i] = relu && sum < 0.0f ? 0.0f : sum;
  }
  return y;
}

std::vector<float> add_backward(const std::vector<float>& diff_y, const std::vector<float>& y, bool relu) {
  if (!relu) return diff_y;
  check_same_size(diff_y, y, "add");
  std::vector<float> diff(diff_y.size());
  for (std::size_t i = 0; i < diff_y.size(); ++i) diff[i] = y[i] > 0.0f ? diff_y[i] : 0.0f;
  return diff;
}

}  // namespace tessera::engine::reference
