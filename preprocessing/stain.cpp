#include "preprocessing/stain.h"

#include <algorithm>
#include <cmath>

#include "core/random.h"

namespace tessera::prep {

namespace {

// Uniform in [0, 1) from 53 bits.
double unit(std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

}  // namespace

StainVectors ruifrok_he() { return {normalized({0.650, 0.704, 0.286}), normalized({0.072, 0.990, 0.105})}; }

cv::Vec3d normalized(const cv::Vec3d& v) {
  const double n = cv::norm(v);
  return n > 0.0 ? v / n : v;
}

double od_from_intensity(double intensity) { return -std::log(std::max(intensity, 1.0) / kWhiteIntensity); }

double intensity_from_od(double od) { return kWhiteIntensity * std::exp(-od); }

cv::Vec3d rgb_to_od(const cv::Vec3b& rgb) {
  return {od_from_intensity(rgb[0]), od_from_intensity(rgb[1]), od_from_intensity(rgb[2])};
}

cv::Vec3b od_to_rgb(const cv::Vec3d& od) {
  cv::Vec3b out;
  for (int c = 0; c < 3; ++c) out[c] = cv::saturate_cast<std::uint8_t>(intensity_from_od(od[c]));
  return out;
}

cv::Mat rgb_to_od(const cv::Mat& rgb) {
  CV_Assert(rgb.type() == CV_8UC3);
  float table[256];
  for (int i = 0; i < 256; ++i) table[i] = static_cast<float>(od_from_intensity(i));
  cv::Mat od(rgb.size(), CV_32FC3);
  for (int y = 0; y < rgb.rows; ++y) {
    const auto* in = rgb.ptr<std::uint8_t>(y);
    auto* out = od.ptr<float>(y);
    for (int i = 0; i < rgb.cols * 3; ++i) out[i] = table[in[i]];
  }
  return od;
}

cv::Mat od_to_rgb(const cv::Mat& od) {
  CV_Assert(od.type() == CV_32FC3);
  cv::Mat rgb(od.size(), CV_8UC3);
  for (int y = 0; y < od.rows; ++y) {
    const auto* in = od.ptr<float>(y);
    auto* out = rgb.ptr<std::uint8_t>(y);
    for (int i = 0; i < od.cols * 3; ++i) out[i] = cv::saturate_cast<std::uint8_t>(intensity_from_od(in[i]));
  }
  return rgb;
}

OdToIntensityTable::OdToIntensityTable() {
  for (int i = 0; i < kSize; ++i) {
    const double od = (i + 0.5) / kStepsPerOd;
    table_[static_cast<std::size_t>(i)] = cv::saturate_cast<std::uint8_t>(intensity_from_od(od));
  }
}

cv::Matx33d unmixing_matrix(const StainVectors& stains) {
  const cv::Vec3d residual = normalized(stains.h.cross(stains.e));
  // Columns are the stain vectors: OD = M · c, so c = M⁻¹ · OD.
  const cv::Matx33d mixing(stains.h[0], stains.e[0], residual[0],  //
                           stains.h[1], stains.e[1], residual[1],  //
                           stains.h[2], stains.e[2], residual[2]);
  return mixing.inv();
}

cv::Vec2d he_concentrations(const cv::Vec3b& rgb, const StainVectors& stains) {
  const cv::Vec3d c = unmixing_matrix(stains) * rgb_to_od(rgb);
  return {c[0], c[1]};
}

cv::Mat he_concentrations(const cv::Mat& rgb, const StainVectors& stains) {
  CV_Assert(rgb.type() == CV_8UC3);
  const cv::Matx33d m = unmixing_matrix(stains);
  float table[256];
  for (int i = 0; i < 256; ++i) table[i] = static_cast<float>(od_from_intensity(i));
  const float m00 = static_cast<float>(m(0, 0)), m01 = static_cast<float>(m(0, 1)), m02 = static_cast<float>(m(0, 2));
  const float m10 = static_cast<float>(m(1, 0)), m11 = static_cast<float>(m(1, 1)), m12 = static_cast<float>(m(1, 2));
  cv::Mat out(rgb.size(), CV_32FC2);
  for (int y = 0; y < rgb.rows; ++y) {
    const auto* in = rgb.ptr<std::uint8_t>(y);
    auto* o = out.ptr<float>(y);
    for (int x = 0; x < rgb.cols; ++x) {
      const float r = table[in[3 * x]], g = table[in[3 * x + 1]], b = table[in[3 * x + 2]];
      o[2 * x] = m00 * r + m01 * g + m02 * b;
      o[2 * x + 1] = m10 * r + m11 * g + m12 * b;
    }
  }
  return out;
}

cv::Vec3d tilt(const cv::Vec3d& v, const cv::Vec3d& towards, double angle) {
  const cv::Vec3d unit_v = normalized(v);
  cv::Vec3d orthogonal = towards - unit_v * towards.dot(unit_v);
  if (cv::norm(orthogonal) < 1e-12) return unit_v;
  orthogonal = normalized(orthogonal);
  return normalized(unit_v * std::cos(angle) + orthogonal * std::sin(angle));
}

SlideStain perturb_stain(const StainVectors& base, std::uint64_t seed, const StainVariation& variation) {
  // Each draw hashes the previous one with splitmix64 (core/random.h): the same bits on every platform.
  std::uint64_t state = core::splitmix64(seed ^ 0x5EA1ED57A1Bull);
  auto next = [&]() { return unit(state = core::splitmix64(state)); };
  auto perturb = [&](const cv::Vec3d& v) {
    // A random direction (uniform on the sphere via z and azimuth), then a tilt of up to max_angle towards it.
    const double z = 2.0 * next() - 1.0;
    const double phi = 2.0 * M_PI * next();
    const double rho = std::sqrt(std::max(0.0, 1.0 - z * z));
    const double angle = variation.max_angle * std::sqrt(next());  // uniform over the cap's area
    cv::Vec3d out = tilt(v, {rho * std::cos(phi), rho * std::sin(phi), z}, angle);
    for (int c = 0; c < 3; ++c) out[c] = std::max(out[c], 0.0);
    return normalized(out);
  };
  SlideStain stain;
  stain.vectors.h = perturb(base.h);
  stain.vectors.e = perturb(base.e);
  stain.h_scale = variation.h_scale_min + (variation.h_scale_max - variation.h_scale_min) * next();
  stain.e_scale = variation.e_scale_min + (variation.e_scale_max - variation.e_scale_min) * next();
  return stain;
}

}  // namespace tessera::prep
