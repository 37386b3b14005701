#include "engine/reference/batchnorm.h"

#include <cmath>
#include <cstddef>

namespace tessera::engine::reference {
namespace {

std::size_t at(const NormShape& s, int n, int c, int p) {
  return (static_cast<std::size_t>(n) * s.c + c) * (static_cast<std::size_t>(s.h) * s.w) + p;
}

}  // namespace

NormStats batchnorm_statistics(const std::vector<float>& src, const NormShape& s) {
  const int plane = s.h * s.w;
  const double count = static_cast<double>(s.n) * plane;
  NormStats stats{std::vector<float>(s.c), std::vector<float>(s.c)};
  for (int c = 0; c < s.c; ++c) {
    double sum = 0.0;
    for (int n = 0; n < s.n; ++n) {
      for (int p = 0; p < plane; ++p) sum += src[at(s, n, c, p)];
    }
    const double mean = sum / count;
    double sq = 0.0;
    for (int n = 0; n < s.n; ++n) {
      for (int p = 0; p < plane; ++p) sq += (src[at(s, n, c, p)] - mean) * (src[at(s, n, c, p)] - mean);
    }
    stats.mean[c] = static_cast<float>(mean);
    stats.var[c] = static_cast<float>(sq / count);
  }
  return stats;
}

std::vector<float> batchnorm_forward(const std::vector<float>& src, const NormStats& stats,
                                     const std::vector<float>& gamma, const std::vector<float>& beta, float eps,
                                     const NormShape& s) {
  const int plane = s.h * s.w;
  std::vector<float> dst(src.size());
  for (int c = 0; c < s.c; ++c) {
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(stats.var[c]) + eps);
    for (int n = 0; n < s.n; ++n) {
      for (int p = 0; p < plane; ++p) {
        const std::size_t i = at(s, n, c, p);
        dst[i] = static_cast<float>(gamma[c] * (src[i] - stats.mean[c]) * inv_std + beta[c]);
      }
    }
  }
  return dst;
}

void batchnorm_update_running(const NormStats& batch, float momentum, const NormShape& s,
                              std::vector<float>& running_mean, std::vector<float>& running_var) {
  const double count = static_cast<double>(s.n) * s.h * s.w;
  const double unbias = count > 1 ? count / (count - 1) : 1.0;
  for (int c = 0; c < s.c; ++c) {
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * batch.mean[c]);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * batch.var[c] * unbias);
  }
}

NormGradients batchnorm_backward(const std::vector<float>& src, const std::vector<float>& diff_dst,
                                 const NormStats& stats, const std::vector<float>& gamma, float eps, bool training,
                                 const NormShape& s) {
  const int plane = s.h * s.w;
  const double count = static_cast<double>(s.n) * plane;
  NormGradients g{std::vector<float>(src.size()), std::vector<float>(s.c), std::vector<float>(s.c)};
  for (int c = 0; c < s.c; ++c) {
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(stats.var[c]) + eps);
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int n = 0; n < s.n; ++n) {
      for (int p = 0; p < plane; ++p) {
        const std::size_t i = at(s, n, c, p);
        sum_dy += diff_dst[i];
        sum_dy_xhat += diff_dst[i] * (src[i] - stats.mean[c]) * inv_std;
      }
    }
    g.diff_beta[c] = static_cast<float>(sum_dy);
    g.diff_gamma[c] = static_cast<float>(sum_dy_xhat);
    for (int n = 0; n < s.n; ++n) {
      for (int p = 0; p < plane; ++p) {
        const std::size_t i = at(s, n, c, p);
        double dx = diff_dst[i];
        if (training) dx -= sum_dy / count + (src[i] - stats.mean[c]) * inv_std * sum_dy_xhat / count;
        g.diff_src[i] = static_cast<float>(gamma[c] * inv_std * dx);
      }
    }
  }
  return g;
}

}  // namespace tessera::engine::reference
