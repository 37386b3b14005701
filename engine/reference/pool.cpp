#include "engine/reference/pool.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>

#include "core/error.h"

namespace tessera::engine::reference {
namespace {

void check_size(const std::vector<float>& v, int expected, const char* what) {
  if (v.size() != static_cast<std::size_t>(expected)) {
    throw core::InternalError(std::string("reference pooling: ") + what + " has " + std::to_string(v.size()) +
                              " values, expected " + std::to_string(expected));
  }
}

void check_window(const PoolInput& s, const PoolWindow& p) {
  // Padding at most half the kernel (PyTorch's rule) keeps at least one image cell in every window.
  if (p.kernel_h < 1 || p.kernel_w < 1 || p.stride_h < 1 || p.stride_w < 1 || p.pad_h < 0 || p.pad_w < 0 ||
      2 * p.pad_h > p.kernel_h || 2 * p.pad_w > p.kernel_w || p.out_h(s.h) < 1 || p.out_w(s.w) < 1) {
    throw core::InternalError("reference pooling: window does not fit the " + std::to_string(s.h) + "x" +
                              std::to_string(s.w) + " input");
  }
}

// Index of (n, c, y, x) in an N×C×H×W array.
int at(int c_count, int h_count, int w_count, int n, int c, int y, int x) {
  return ((n * c_count + c) * h_count + y) * w_count + x;
}

// Cells of an output's window that lie inside the image: [y0, y1) × [x0, x1), and the avg divisor.
struct Cells {
  int y0, y1, x0, x1;
  int divisor;
};

Cells window_cells(const PoolInput& s, const PoolWindow& p, int oy, int ox, bool count_include_pad) {
  const int ys = oy * p.stride_h - p.pad_h, xs = ox * p.stride_w - p.pad_w;
  Cells c{std::max(ys, 0), std::min(ys + p.kernel_h, s.h), std::max(xs, 0), std::min(xs + p.kernel_w, s.w), 0};
  c.divisor = count_include_pad ? p.kernel_h * p.kernel_w : (c.y1 - c.y0) * (c.x1 - c.x0);
  return c;
}

// Argmax (flat index into the image plane) of a window; first maximum in row-major order.
int window_argmax(const float* plane, int w, const Cells& cells) {
  int best = -1;
  float best_value = -std::numeric_limits<float>::infinity();
  for (int y = cells.y0; y < cells.y1; ++y) {
    for (int x = cells.x0; x < cells.x1; ++x) {
      if (best < 0 || plane[y * w + x] > best_value) {
        best = y * w + x;
        best_value = plane[best];
      }
    }
  }
  return best;
}

}  // namespace

std::vector<float> max_pool_forward(const std::vector<float>& src, const PoolInput& s, const PoolWindow& p) {
  check_window(s, p);
  check_size(src, s.size(), "src");
  const int oh = p.out_h(s.h), ow = p.out_w(s.w);
  std::vector<float> dst(static_cast<std::size_t>(s.n) * s.c * oh * ow);
  for (int n = 0; n < s.n; ++n) {
    for (int c = 0; c < s.c; ++c) {
      const float* plane = &src[at(s.c, s.h, s.w, n, c, 0, 0)];
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          const int best = window_argmax(plane, s.w, window_cells(s, p, oy, ox, true));
          dst[at(s.c, oh, ow, n, c, oy, ox)] = plane[best];
        }
      }
    }
  }
  return dst;
}

std::vector<float> max_pool_backward(const std::vector<float>& src, const std::vector<float>& diff_dst,
                                     const PoolInput& s, const PoolWindow& p) {
  check_window(s, p);
  check_size(src, s.size(), "src");
  const int oh = p.out_h(s.h), ow = p.out_w(s.w);
  check_size(diff_dst, s.n * s.c * oh * ow, "diff_dst");
  std::vector<float> diff_src(src.size(), 0.0f);
  for (int n = 0; n < s.n; ++n) {
    for (int c = 0; c < s.c; ++c) {
      const int base = at(s.c, s.h, s.w, n, c, 0, 0);
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          const int best = window_argmax(&src[base], s.w, window_cells(s, p, oy, ox, true));
          diff_src[base + best] += diff_dst[at(s.c, oh, ow, n, c, oy, ox)];
        }
      }
    }
  }
  return diff_src;
}

std::vector<float> avg_pool_forward(const std::vector<float>& src, const PoolInput& s, const PoolWindow& p,
                                    bool count_include_pad) {
  check_window(s, p);
  check_size(src, s.size(), "src");
  const int oh = p.out_h(s.h), ow = p.out_w(s.w);
  std::vector<float> dst(static_cast<std::size_t>(s.n) * s.c * oh * ow);
  for (int n = 0; n < s.n; ++n) {
    for (int c = 0; c < s.c; ++c) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          const Cells cells = window_cells(s, p, oy, ox, count_include_pad);
          double sum = 0.0;
          for (int y = cells.y0; y < cells.y1; ++y) {
            for (int x = cells.x0; x < cells.x1; ++x) sum += src[at(s.c, s.h, s.w, n, c, y, x)];
          }
          dst[at(s.c, oh, ow, n, c, oy, ox)] = static_cast<float>(sum / cells.divisor);
        }
      }
    }
  }
  return dst;
}

std::vector<float> avg_pool_backward(const std::vector<float>& diff_dst, const PoolInput& s, const PoolWindow& p,
                                     bool count_include_pad) {
  check_window(s, p);
  const int oh = p.out_h(s.h), ow = p.out_w(s.w);
  check_size(diff_dst, s.n * s.c * oh * ow, "diff_dst");
  std::vector<float> diff_src(static_cast<std::size_t>(s.size()), 0.0f);
  for (int n = 0; n < s.n; ++n) {
    for (int c = 0; c < s.c; ++c) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          const Cells cells = window_cells(s, p, oy, ox, count_include_pad);
          const float share = diff_dst[at(s.c, oh, ow, n, c, oy, ox)] / static_cast<float>(cells.divisor);
          for (int y = cells.y0; y < cells.y1; ++y) {
            for (int x = cells.x0; x < cells.x1; ++x) diff_src[at(s.c, s.h, s.w, n, c, y, x)] += share;
          }
        }
      }
    }
  }
  return diff_src;
}

namespace {

// Input rows (or columns) [begin, end) averaged into adaptive output o of out_count.
int adaptive_begin(int o, int in_count, int out_count) { return o * in_count / out_count; }
int adaptive_end(int o, int in_count, int out_count) { return ((o + 1) * in_count + out_count - 1) / out_count; }

void check_adaptive(const PoolInput& s, int out_h, int out_w) {
  if (out_h < 1 || out_w < 1 || s.n < 1 || s.c < 1 || s.h < 1 || s.w < 1) {
    throw core::InternalError("reference adaptive pooling: bad output size " + std::to_string(out_h) + "x" +
                              std::to_string(out_w));
  }
}

}  // namespace

std::vector<float> adaptive_avg_pool_forward(const std::vector<float>& src, const PoolInput& s, int out_h, int out_w) {
  check_adaptive(s, out_h, out_w);
  check_size(src, s.size(), "src");
  std::vector<float> dst(static_cast<std::size_t>(s.n) * s.c * out_h * out_w);
  for (int n = 0; n < s.n; ++n) {
    for (int c = 0; c < s.c; ++c) {
      for (int oy = 0; oy < out_h; ++oy) {
        for (int ox = 0; ox < out_w; ++ox) {
          const int y0 = adaptive_begin(oy, s.h, out_h), y1 = adaptive_end(oy, s.h, out_h);
          const int x0 = adaptive_begin(ox, s.w, out_w), x1 = adaptive_end(ox, s.w, out_w);
          double sum = 0.0;
          for (int y = y0; y < y1; ++y) {
            for (int x = x0; x < x1; ++x) sum += src[at(s.c, s.h, s.w, n, c, y, x)];
          }
          dst[at(s.c, out_h, out_w, n, c, oy, ox)] = static_cast<float>(sum / ((y1 - y0) * (x1 - x0)));
        }
      }
    }
  }
  return dst;
}

std::vector<float> adaptive_avg_pool_backward(const std::vector<float>& diff_dst, const PoolInput& s, int out_h,
                                              int out_w) {
  check_adaptive(s, out_h, out_w);
  check_size(diff_dst, s.n * s.c * out_h * out_w, "diff_dst");
  std::vector<float> diff_src(static_cast<std::size_t>(s.size()), 0.0f);
  for (int n = 0; n < s.n; ++n) {
    for (int c = 0; c < s.c; ++c) {
      for (int oy = 0; oy < out_h; ++oy) {
        for (int ox = 0; ox < out_w; ++ox) {
          const int y0 = adaptive_begin(oy, s.h, out_h), y1 = adaptive_end(oy, s.h, out_h);
          const int x0 = adaptive_begin(ox, s.w, out_w), x1 = adaptive_end(ox, s.w, out_w);
          const float share = diff_dst[at(s.c, out_h, out_w, n, c, oy, ox)] / static_cast<float>((y1 - y0) * (x1 - x0));
          for (int y = y0; y < y1; ++y) {
            for (int x = x0; x < x1; ++x) diff_src[at(s.c, s.h, s.w, n, c, y, x)] += share;
          }
        }
      }
    }
  }
  return diff_src;
}

}  // namespace tessera::engine::reference
