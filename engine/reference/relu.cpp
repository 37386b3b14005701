#include "engine/reference/relu.h"

#include <cstddef>

namespace tessera::engine::reference {

std::vector<float> relu_forward(const std::vector<float>& src) {
  std::vector<float> dst(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
  return dst;
}

std::vector<float> relu_backward(const std::vector<float>& dst, const std::vector<float>& diff_dst) {
  std::vector<float> diff_src(dst.size());
  for (std::size_t i = 0; i < dst.size(); ++i) diff_src[i] = dst[i] > 0.0f ? diff_dst[i] : 0.0f;
  return diff_src;
}

}  // namespace tessera::engine::reference
