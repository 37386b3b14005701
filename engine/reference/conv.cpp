#include "engine/reference/conv.h"

#include <cstddef>

namespace tessera::engine::reference {
namespace {

// Index helpers for the plain layouts.
std::size_t at4(int a, int b, int c, int d, int nb, int nc, int nd) {
  return ((static_cast<std::size_t>(a) * nb + b) * nc + c) * nd + d;
}

}  // namespace

std::vector<float> conv_forward(const std::vector<float>& src, const std::vector<float>& weights,
                                const std::vector<float>& bias, const ConvShape& s) {
  const int oh = s.out_h(), ow = s.out_w();
  std::vector<float> dst(static_cast<std::size_t>(s.dst_size()));
  for (int n = 0; n < s.n; ++n) {
    for (int o = 0; o < s.o; ++o) {
      for (int y = 0; y < oh; ++y) {
        for (int x = 0; x < ow; ++x) {
          double acc = bias.empty() ? 0.0 : bias[o];
          for (int c = 0; c < s.c; ++c) {
            for (int i = 0; i < s.kernel_h; ++i) {
              const int sy = y * s.stride_h - s.pad_h + i * s.dilation_h;
              if (sy < 0 || sy >= s.h) continue;
              for (int j = 0; j < s.kernel_w; ++j) {
                const int sx = x * s.stride_w - s.pad_w + j * s.dilation_w;
                if (sx < 0 || sx >= s.w) continue;
                acc += static_cast<double>(src[at4(n, c, sy, sx, s.c, s.h, s.w)]) *
                       weights[at4(o, c, i, j, s.c, s.kernel_h, s.kernel_w)];
              }
            }
          }
          dst[at4(n, o, y, x, s.o, oh, ow)] = static_cast<float>(acc);
        }
      }
    }
  }
  return dst;
}

std::vector<float> conv_backward_data(const std::vector<float>& diff_dst, const std::vector<float>& weights,
                                      const ConvShape& s) {
  const int oh = s.out_h(), ow = s.out_w();
  std::vector<double> acc(static_cast<std::size_t>(s.src_size()), 0.0);
  for (int n = 0; n < s.n; ++n) {
    for (int o = 0; o < s.o; ++o) {
      for (int y = 0; y < oh; ++y) {
        for (int x = 0; x < ow; ++x) {
          const double g = diff_dst[at4(n, o, y, x, s.o, oh, ow)];
          for (int c = 0; c < s.c; ++c) {
            for (int i = 0; i < s.kernel_h; ++i) {
              const int sy = y * s.stride_h - s.pad_h + i * s.dilation_h;
              if (sy < 0 || sy >= s.h) continue;
              for (int j = 0; j < s.kernel_w; ++j) {
                const int sx = x * s.stride_w - s.pad_w + j * s.dilation_w;
                if (sx < 0 || sx >= s.w) continue;
                acc[at4(n, c, sy, sx, s.c, s.h, s.w)] += g * weights[at4(o, c, i, j, s.c, s.kernel_h, s.kernel_w)];
              }
            }
          }
        }
      }
    }
  }
  return std::vector<float>(acc.begin(), acc.end());
}

std::vector<float> conv_backward_weights(const std::vector<float>& src, const std::vector<float>& diff_dst,
                                         const ConvShape& s) {
  const int oh = s.out_h(), ow = s.out_w();
  std::vector<double> acc(static_cast<std::size_t>(s.weights_size()), 0.0);
  for (int n = 0; n < s.n; ++n) {
    for (int o = 0; o < s.o; ++o) {
      for (int y = 0; y < oh; ++y) {
        for (int x = 0; x < ow; ++x) {
          const double g = diff_dst[at4(n, o, y, x, s.o, oh, ow)];
          for (int c = 0; c < s.c; ++c) {
            for (int i = 0; i < s.kernel_h; ++i) {
              const int sy = y * s.stride_h - s.pad_h + i * s.dilation_h;
              if (sy < 0 || sy >= s.h) continue;
              for (int j = 0; j < s.kernel_w; ++j) {
                const int sx = x * s.stride_w - s.pad_w + j * s.dilation_w;
                if (sx < 0 || sx >= s.w) continue;
                acc[at4(o, c, i, j, s.c, s.kernel_h, s.kernel_w)] += g * src[at4(n, c, sy, sx, s.c, s.h, s.w)];
              }
            }
          }
        }
      }
    }
  }
  return std::vector<float>(acc.begin(), acc.end());
}

std::vector<float> conv_backward_bias(const std::vector<float>& diff_dst, const ConvShape& s) {
  const int plane = s.out_h() * s.out_w();
  std::vector<float> diff_bias(static_cast<std::size_t>(s.o));
  for (int o = 0; o < s.o; ++o) {
    double acc = 0.0;
    for (int n = 0; n < s.n; ++n) {
      for (int p = 0; p < plane; ++p) acc += diff_dst[(static_cast<std::size_t>(n) * s.o + o) * plane + p];
    }
    diff_bias[o] = static_cast<float>(acc);
  }
  return diff_bias;
}

}  // namespace tessera::engine::reference
