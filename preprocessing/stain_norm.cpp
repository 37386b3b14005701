#include "preprocessing/stain_norm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "preprocessing/stain.h"

namespace tessera::prep {

namespace {

// --- Shared ----------------------------------------------------------------------------------------------

// A tile or reference needs this much tissue before its statistics mean anything: at least a 16×16 patch and
// at least 1% of the image. Below that, apply() leaves the tile as it is and fitting a reference fails.
constexpr std::size_t kMinTissuePixels = 256;
constexpr double kMinTissueFraction = 0.01;

bool enough_tissue(std::size_t tissue, std::size_t total) {
  return tissue >= kMinTissuePixels && static_cast<double>(tissue) >= kMinTissueFraction * static_cast<double>(total);
}

std::string too_little_tissue(std::size_t tissue, std::size_t total, const std::string& criterion) {
  return "too little tissue: " + std::to_string(tissue) + " of " + std::to_string(total) + " pixels " + criterion +
         " (needs at least " + std::to_string(kMinTissuePixels) + " and 1% of the image)";
}

// An empty image is accepted whatever its type (there is nothing in it to normalize or to fit).
void check_rgb(const cv::Mat& rgb, const char* what) {
  if (!rgb.empty() && rgb.type() != CV_8UC3) {
    throw core::InternalError(std::string("stain normalization: ") + what + " must be an RGB CV_8UC3 image, got type " +
                              std::to_string(rgb.type()));
  }
}

// The OD of every 8-bit intensity, with stain.h's convention (−ln(max(I, 1)/255)), so that normalization and
// the synthetic-slide generator agree on what a pixel's OD is.
const std::array<float, 256>& od_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<std::size_t>(i)] = static_cast<float>(od_from_intensity(i));
    return t;
  }();
  return table;
}

const OdToIntensityTable& intensity_table() {
  static const OdToIntensityTable table;
  return table;
}

// The value at fraction p (0..1) of `values` by nearest rank; reorders `values`.
float percentile(std::vector<float>& values, double p) {
  const auto k = static_cast<std::ptrdiff_t>(std::lround(p * static_cast<double>(values.size() - 1)));
  std::nth_element(values.begin(), values.begin() + k, values.end());
  return values[static_cast<std::size_t>(k)];
}

std::string format_vec(const double* v, int n) {
  std::string out = "(";
  char buf[32];
  for (int i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%s%.4f", i ? "," : "", v[i]);
    out += buf;
  }
  return out + ")";
}

// The images as one row of pixels (their sizes may differ), so that a fit sees their tissue as one image's.
cv::Mat pooled(const std::vector<cv::Mat>& images) {
  std::vector<cv::Mat> rows;
  for (const auto& image : images) {
    if (image.empty()) continue;
    check_rgb(image, "a source image");
    rows.push_back((image.isContinuous() ? image : image.clone()).reshape(3, 1));
  }
  cv::Mat all(0, 0, CV_8UC3);
  if (!rows.empty()) cv::hconcat(rows, all);
  return all;
}

// Where a target came from, for describe().
constexpr const char* kBuiltinSource = "target=builtin";
std::string reference_source(const std::string& reference_name) { return "reference='" + reference_name + "'"; }

// --- Reinhard ----------------------------------------------------------------------------------------------

// Pixels darker than this L* are tissue: they make the statistics and get the full mapping.
constexpr float kReinhardTissueMaxL = 90.0f;
// Pixels at or above this L* are background and stay unchanged; between the two the mapping fades out, so that
// there is no visible step at the tissue edge.
constexpr float kReinhardBackgroundL = 96.0f;
// A source channel's standard deviation is taken as at least this (Lab units), so a nearly uniform tile gets
// its mean moved but its noise not amplified without bound.
constexpr double kReinhardMinStd = 1.0;

// Tessera's built-in Reinhard target (L* 0..100, a*, b* in OpenCV float Lab): the tissue statistics of a typical
// H&E tile as Tessera renders it — the Ruifrok–Johnston stains of stain.h at the concentrations of its synthetic
// slides, averaged over 256×256 tissue tiles (rounded): purple-pink (a* > 0, b* < 0), mid luminosity. Tessera's
// own choice, so that the built-in targets and `tessera synth` agree; not a published standard.
constexpr std::array<double, 3> kReinhardTargetMean = {53.0, 28.0, -34.0};
constexpr std::array<double, 3> kReinhardTargetStd = {8.0, 7.0, 4.0};

struct LabStats {
  std::array<double, 3> mean{};
  std::array<double, 3> std{};
};

// RGB CV_8UC3 → float L*a*b* (L 0..100).
cv::Mat to_lab(const cv::Mat& rgb) {
  cv::Mat lab;
  rgb.convertTo(lab, CV_32FC3, 1.0 / 255.0);
  cv::cvtColor(lab, lab, cv::COLOR_RGB2Lab);
  return lab;
}

// Mean and standard deviation of the tissue pixels; nullopt with `tissue` set when there are too few.
std::optional<LabStats> tissue_lab_stats(const cv::Mat& lab, std::size_t& tissue) {
  std::array<double, 3> sum{}, sum_sq{};
  tissue = 0;
  for (int y = 0; y < lab.rows; ++y) {
    const auto* p = lab.ptr<float>(y);
    for (int x = 0; x < lab.cols; ++x, p += 3) {
      if (p[0] >= kReinhardTissueMaxL) continue;
      ++tissue;
      for (int c = 0; c < 3; ++c) {
        sum[static_cast<std::size_t>(c)] += p[c];
        sum_sq[static_cast<std::size_t>(c)] += static_cast<double>(p[c]) * p[c];
      }
    }
  }
  if (!enough_tissue(tissue, lab.total())) return std::nullopt;
  LabStats stats;
  const double n = static_cast<double>(tissue);
  for (std::size_t c = 0; c < 3; ++c) {
    stats.mean[c] = sum[c] / n;
    stats.std[c] = std::sqrt(std::max(0.0, sum_sq[c] / n - stats.mean[c] * stats.mean[c]));
  }
  return stats;
}

class ReinhardNormalizer final : public StainNormalizer {
 public:
  // `fitted` given: the source's statistics, fitted once (fitted_to); otherwise each tile's own.
  ReinhardNormalizer(const LabStats& target, std::string source, std::optional<LabStats> fitted = std::nullopt)
      : target_(target), source_(std::move(source)), fitted_(fitted) {}

  StainMethod method() const override { return StainMethod::reinhard; }

  void apply(cv::Mat& rgb) const override {
    if (rgb.empty()) return;
    check_rgb(rgb, "a tile");
    cv::Mat lab = to_lab(rgb);
    std::size_t tissue = 0;
    const auto source = fitted_ ? fitted_ : tissue_lab_stats(lab, tissue);
    if (!source) return;  // too little tissue to say what its colours are: leave it alone

    // x' = (x − μ_src)/σ_src · σ_tgt + μ_tgt = gain·x + offset.
    float gain[3], offset[3];
    for (std::size_t c = 0; c < 3; ++c) {
      const double g = target_.std[c] / std::max(source->std[c], kReinhardMinStd);
      gain[c] = static_cast<float>(g);
      offset[c] = static_cast<float>(target_.mean[c] - g * source->mean[c]);
    }
    constexpr float kFade = 1.0f / (kReinhardBackgroundL - kReinhardTissueMaxL);
    for (int y = 0; y < lab.rows; ++y) {
      auto* p = lab.ptr<float>(y);
      for (int x = 0; x < lab.cols; ++x, p += 3) {
        const float w = std::clamp((kReinhardBackgroundL - p[0]) * kFade, 0.0f, 1.0f);
        const float l = p[0] + w * (gain[0] * p[0] + offset[0] - p[0]);
        const float a = p[1] + w * (gain[1] * p[1] + offset[1] - p[1]);
        const float b = p[2] + w * (gain[2] * p[2] + offset[2] - p[2]);
        p[0] = std::clamp(l, 0.0f, 100.0f);
        p[1] = std::clamp(a, -127.0f, 127.0f);
        p[2] = std::clamp(b, -127.0f, 127.0f);
      }
    }
    cv::cvtColor(lab, lab, cv::COLOR_Lab2RGB);
    lab.convertTo(rgb, CV_8UC3, 255.0);  // saturating: out-of-gamut colours clamp to 0..255
  }

  std::string describe() const override {
    return "reinhard " + source_ + " lab_mean=" + format_vec(target_.mean.data(), 3) +
           " lab_std=" + format_vec(target_.std.data(), 3);
  }

  std::unique_ptr<StainNormalizer> fitted_to(const std::vector<cv::Mat>& images, std::string& failure) const override {
    const cv::Mat all = pooled(images);
    std::size_t tissue = 0;
    const auto stats = tissue_lab_stats(all.empty() ? cv::Mat(0, 0, CV_32FC3) : to_lab(all), tissue);
    if (!stats) {
      failure = too_little_tissue(tissue, all.total(), "are darker than L* 90");
      return nullptr;
    }
    return std::make_unique<ReinhardNormalizer>(target_, source_, stats);
  }

 private:
  LabStats target_;
  std::string source_;  // kBuiltinSource or reference_source(name)
  std::optional<LabStats> fitted_;
};

// --- Macenko -----------------------------------------------------------------------------------------------

// Pixels whose OD vector is longer than this are tissue (Macenko et al. 2009, β = 0.15).
constexpr float kMacenkoBeta = 0.15f;
// Robust extremes of the stain angles and of the concentrations (Macenko's α = 1%).
constexpr double kMacenkoAngleLow = 0.01;
constexpr double kMacenkoAngleHigh = 0.99;
constexpr double kMacenkoMaxConcentration = 0.99;
// The two estimated stains must be at least this far apart (radians, ~6°) to be told apart. Ruifrok's H and E
// are ~40° apart and Macenko estimates on H&E tiles 15–25°; a tile holding one stain only (stroma without
// nuclei) spreads a few degrees from noise alone, and unmixing it with two near-parallel vectors would turn
// that noise into colour.
constexpr double kMacenkoMinStainAngle = 0.10;
// A stain whose 99th-percentile concentration is below this (OD) is absent; rescaling it would amplify noise.
constexpr double kMacenkoMinMaxConcentration = 0.02;

// Tessera's built-in Macenko target: Ruifrok & Johnston's H and E vectors (stain.h) and 99th-percentile H and
// E concentrations (OD units) in the range Macenko fits give on Tessera's synthetic H&E tiles (about 1.3–2.0 and
// 0.8–1.1). Tessera's own choice; not a published standard.
constexpr double kMacenkoTargetMaxH = 1.8;
constexpr double kMacenkoTargetMaxE = 0.95;

struct MacenkoTarget {
  StainVectors stains;
  cv::Vec2d max_concentration;  // 99th percentile of H and of E
};

struct MacenkoFit {
  std::optional<MacenkoTarget> target;
  std::string failure;  // why there is no target
};

// 2×3 least-squares unmixing (V⁺ = (VᵀV)⁻¹Vᵀ) for the 3×2 stain matrix V = [h e]; concentrations = V⁺ · OD.
cv::Matx23d pseudo_inverse(const StainVectors& s) {
  const cv::Matx32d v(s.h[0], s.e[0], s.h[1], s.e[1], s.h[2], s.e[2]);
  return (v.t() * v).inv() * v.t();
}

// Estimates the stains and maximum concentrations of one image (Macenko et al., ISBI 2009).
MacenkoFit fit_macenko(const cv::Mat& rgb) {
  const auto& od = od_table();
  const std::size_t total = rgb.total();

  // Tissue OD vectors and their first and second moments, in one pass.
  std::vector<cv::Vec3f> tissue;
  tissue.reserve(total);
  double s[3] = {}, ss[6] = {};  // Σx; Σ xxᵀ upper triangle: rr rg rb gg gb bb
  constexpr float kBeta2 = kMacenkoBeta * kMacenkoBeta;
  for (int y = 0; y < rgb.rows; ++y) {
    const auto* p = rgb.ptr<std::uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x, p += 3) {
      const float r = od[p[0]], g = od[p[1]], b = od[p[2]];
      if (r * r + g * g + b * b <= kBeta2) continue;
      tissue.emplace_back(r, g, b);
      s[0] += r, s[1] += g, s[2] += b;
      ss[0] += r * r, ss[1] += r * g, ss[2] += r * b, ss[3] += g * g, ss[4] += g * b, ss[5] += b * b;
    }
  }
  const std::size_t n = tissue.size();
  if (!enough_tissue(n, total)) {
    return {std::nullopt, too_little_tissue(n, total, "have an optical density above 0.15")};
  }

  // The stain plane: spanned by the two principal eigenvectors of the OD covariance, i.e. orthogonal to the
  // smallest one.
  const double inv_n = 1.0 / static_cast<double>(n);
  const cv::Vec3d mean(s[0] * inv_n, s[1] * inv_n, s[2] * inv_n);
  cv::Matx33d cov(ss[0] * inv_n, ss[1] * inv_n, ss[2] * inv_n,  //
                  ss[1] * inv_n, ss[3] * inv_n, ss[4] * inv_n,  //
                  ss[2] * inv_n, ss[4] * inv_n, ss[5] * inv_n);
  cov -= mean * mean.t();
  cv::Matx31d eigenvalues;
  cv::Matx33d eigenvectors;  // rows, by decreasing eigenvalue
  cv::eigen(cov, eigenvalues, eigenvectors);
  const cv::Vec3d normal(eigenvectors(2, 0), eigenvectors(2, 1), eigenvectors(2, 2));

  // An in-plane basis with b1 along the mean OD, so every (non-negative) OD vector has an angle well inside
  // (−90°, 90°): no wrap-around, and angles increase with tan = t2/t1.
  cv::Vec3d b1 = mean - normal * mean.dot(normal);
  if (cv::norm(b1) < 1e-6) return {std::nullopt, "the stains cannot be separated (degenerate optical density)"};
  b1 = normalized(b1);
  const cv::Vec3d b2 = normalized(normal.cross(b1));

  // Robust extreme angles. tan is monotone on (−90°, 90°), so the percentiles of t2/t1 are the tangents of the
  // angle percentiles; the rare vector at or beyond ±90° sorts beyond every other on its side.
  std::vector<float> values(n);
  const cv::Vec3f b1f(b1), b2f(b2);
  for (std::size_t i = 0; i < n; ++i) {
    const float t1 = tissue[i].dot(b1f), t2 = tissue[i].dot(b2f);
    values[i] = t1 > 0.0f ? t2 / t1 : std::copysign(HUGE_VALF, t2);
  }
  const double low = std::atan(percentile(values, kMacenkoAngleLow));
  const double high = std::atan(percentile(values, kMacenkoAngleHigh));
  if (!(high - low >= kMacenkoMinStainAngle)) {
    return {std::nullopt, "the stains cannot be separated (the tissue holds a single colour)"};
  }
  const cv::Vec3d v_low = b1 * std::cos(low) + b2 * std::sin(low);
  const cv::Vec3d v_high = b1 * std::cos(high) + b2 * std::sin(high);

  // Haematoxylin absorbs more red than eosin does: the larger R component is H.
  MacenkoTarget target;
  target.stains = v_low[0] >= v_high[0] ? StainVectors{v_low, v_high} : StainVectors{v_high, v_low};

  // Concentrations of the tissue pixels by least squares, and their robust maxima.
  const cv::Matx23f unmix(pseudo_inverse(target.stains));
  const cv::Vec3f row_h(unmix(0, 0), unmix(0, 1), unmix(0, 2)), row_e(unmix(1, 0), unmix(1, 1), unmix(1, 2));
  for (std::size_t i = 0; i < n; ++i) values[i] = tissue[i].dot(row_h);
  target.max_concentration[0] = percentile(values, kMacenkoMaxConcentration);
  for (std::size_t i = 0; i < n; ++i) values[i] = tissue[i].dot(row_e);
  target.max_concentration[1] = percentile(values, kMacenkoMaxConcentration);
  if (!(std::min(target.max_concentration[0], target.max_concentration[1]) >= kMacenkoMinMaxConcentration)) {
    return {std::nullopt, "the stains cannot be separated (one stain is absent)"};
  }
  return {target, {}};
}

class MacenkoNormalizer final : public StainNormalizer {
 public:
  // `fitted` given: the source's stains and concentrations, fitted once (fitted_to); otherwise each tile's own.
  MacenkoNormalizer(const MacenkoTarget& target, std::string source, std::optional<MacenkoTarget> fitted = std::nullopt)
      : target_(target), source_(std::move(source)), fitted_(fitted) {}

  StainMethod method() const override { return StainMethod::macenko; }

  void apply(cv::Mat& rgb) const override {
    if (rgb.empty()) return;
    check_rgb(rgb, "a tile");
    const auto fitted = fitted_ ? fitted_ : fit_macenko(rgb).target;
    if (!fitted) return;  // too little tissue, or one colour only: leave the tile alone
    const MacenkoTarget& source = *fitted;

    // OD' = V_tgt · diag(max_tgt / max_src) · V_src⁺ · OD: one 3×3 matrix per tile.
    const cv::Matx32d v_target(target_.stains.h[0], target_.stains.e[0],  //
                               target_.stains.h[1], target_.stains.e[1],  //
                               target_.stains.h[2], target_.stains.e[2]);
    const cv::Matx22d scale(target_.max_concentration[0] / source.max_concentration[0], 0.0,  //
                            0.0, target_.max_concentration[1] / source.max_concentration[1]);
    const cv::Matx33f m(v_target * scale * pseudo_inverse(source.stains));

    const auto& od = od_table();
    const auto& to_intensity = intensity_table();
    for (int y = 0; y < rgb.rows; ++y) {
      auto* p = rgb.ptr<std::uint8_t>(y);
      for (int x = 0; x < rgb.cols; ++x, p += 3) {
        const float r = od[p[0]], g = od[p[1]], b = od[p[2]];
        p[0] = to_intensity(m(0, 0) * r + m(0, 1) * g + m(0, 2) * b);
        p[1] = to_intensity(m(1, 0) * r + m(1, 1) * g + m(1, 2) * b);
        p[2] = to_intensity(m(2, 0) * r + m(2, 1) * g + m(2, 2) * b);
      }
    }
  }

  std::string describe() const override {
    return "macenko " + source_ + " h=" + format_vec(target_.stains.h.val, 3) +
           " e=" + format_vec(target_.stains.e.val, 3) +
           " max_concentration=" + format_vec(target_.max_concentration.val, 2);
  }

  std::unique_ptr<StainNormalizer> fitted_to(const std::vector<cv::Mat>& images, std::string& failure) const override {
    const MacenkoFit fit = fit_macenko(pooled(images));
    if (!fit.target) {
      failure = fit.failure;
      return nullptr;
    }
    return std::make_unique<MacenkoNormalizer>(target_, source_, fit.target);
  }

 private:
  MacenkoTarget target_;
  std::string source_;  // kBuiltinSource or reference_source(name)
  std::optional<MacenkoTarget> fitted_;
};

// --- Registry ----------------------------------------------------------------------------------------------

struct MethodName {
  StainMethod method;
  const char* name;
};
constexpr std::array<MethodName, 3> kMethods = {{
    {StainMethod::none, "none"},
    {StainMethod::reinhard, "reinhard"},
    {StainMethod::macenko, "macenko"},
}};

}  // namespace

StainMethod parse_stain_method(const std::string& name) {
  for (const auto& m : kMethods) {
    if (name == m.name) return m.method;
  }
  std::string known;
  for (const auto& m : kMethods) known += (known.empty() ? "" : ", ") + std::string(m.name);
  throw core::InternalError("unknown stain normalization method '" + name + "' (known: " + known + ")");
}

const char* to_string(StainMethod method) {
  for (const auto& m : kMethods) {
    if (method == m.method) return m.name;
  }
  return "unknown";
}

std::unique_ptr<StainNormalizer> make_stain_normalizer(StainMethod method) {
  switch (method) {
    case StainMethod::none:
      return nullptr;
    case StainMethod::reinhard: {
      LabStats target;
      target.mean = kReinhardTargetMean;
      target.std = kReinhardTargetStd;
      return std::make_unique<ReinhardNormalizer>(target, kBuiltinSource);
    }
    case StainMethod::macenko:
      return std::make_unique<MacenkoNormalizer>(MacenkoTarget{ruifrok_he(), {kMacenkoTargetMaxH, kMacenkoTargetMaxE}},
                                                 kBuiltinSource);
  }
  throw core::InternalError("make_stain_normalizer: unknown stain method");
}

std::unique_ptr<StainNormalizer> make_stain_normalizer(StainMethod method, const cv::Mat& reference,
                                                       const std::string& reference_name) {
  if (method == StainMethod::none) return nullptr;
  check_rgb(reference, "the stain reference");
  const std::string what = std::string("stain reference: cannot fit a ") + to_string(method) + " target: ";
  if (method == StainMethod::reinhard) {
    std::size_t tissue = 0;
    const cv::Mat lab = reference.empty() ? cv::Mat(0, 0, CV_32FC3) : to_lab(reference);
    const auto stats = tissue_lab_stats(lab, tissue);
    if (!stats) {
      throw core::InputError(what + too_little_tissue(tissue, reference.total(), "are darker than L* 90"),
                             reference_name);
    }
    return std::make_unique<ReinhardNormalizer>(*stats, reference_source(reference_name));
  }
  const MacenkoFit fit = fit_macenko(reference);
  if (!fit.target) throw core::InputError(what + fit.failure, reference_name);
  return std::make_unique<MacenkoNormalizer>(*fit.target, reference_source(reference_name));
}

std::unique_ptr<StainNormalizer> make_stain_normalizer(StainMethod method, const std::vector<cv::Mat>& references,
                                                       const std::string& reference_name) {
  return make_stain_normalizer(method, pooled(references), reference_name);
}

namespace {

// The numbers of "key=(a,b,c)" in a describe() text: exactly `n` finite values; nullopt otherwise. The last
// occurrence of the key counts (a reference's file name comes before the numbers and might contain anything).
std::optional<std::vector<double>> described_values(const std::string& text, const std::string& key, std::size_t n) {
  const std::string opening = " " + key + "=(";
  const std::size_t at = text.rfind(opening);
  if (at == std::string::npos) return std::nullopt;
  const std::size_t first = at + opening.size();
  const std::size_t close = text.find(')', first);
  if (close == std::string::npos) return std::nullopt;
  std::vector<double> values;
  std::size_t pos = first;
  while (pos <= close) {
    const std::size_t end = std::min(text.find(',', pos), close);
    const std::string field = text.substr(pos, end - pos);
    char* stop = nullptr;
    const double v = std::strtod(field.c_str(), &stop);
    if (field.empty() || stop != field.c_str() + field.size() || !std::isfinite(v)) return std::nullopt;
    values.push_back(v);
    pos = end + 1;
  }
  if (values.size() != n) return std::nullopt;
  return values;
}

}  // namespace

std::unique_ptr<StainNormalizer> stain_normalizer_from_description(const std::string& text, const std::string& source) {
  // Shards fitted per group record their target's text with kPerGroupSuffix: the target is the same.
  const std::string_view suffix = kPerGroupSuffix;
  const std::string description =
      text.size() > suffix.size() && text.ends_with(suffix) ? text.substr(0, text.size() - suffix.size()) : text;
  if (description.empty() || description == "none") return nullptr;
  const std::size_t space = description.find(' ');
  const std::string name = description.substr(0, space);
  const auto method =
      std::find_if(kMethods.begin(), kMethods.end(), [&](const MethodName& m) { return name == m.name; });
  const auto refuse = [&](const std::string& why) {
    return core::InputError("stain normalization '" + text + "': " + why, source);
  };
  if (method == kMethods.end() || method->method == StainMethod::none) {
    throw refuse("unknown method '" + name + "' (known: reinhard, macenko, none)");
  }
  // A built-in target comes back exactly (describe() rounds the Ruifrok vectors to 4 decimals).
  auto builtin = make_stain_normalizer(method->method);
  if (builtin->describe() == description) return builtin;

  const std::string first_key = method->method == StainMethod::reinhard ? " lab_mean=(" : " h=(";
  const std::size_t keys = description.rfind(first_key);
  if (space == std::string::npos || keys == std::string::npos || keys <= space) {
    throw refuse("not a fitted target's description");
  }
  const std::string origin = description.substr(space + 1, keys - space - 1);
  if (method->method == StainMethod::reinhard) {
    const auto mean = described_values(description, "lab_mean", 3);
    const auto std_dev = described_values(description, "lab_std", 3);
    if (!mean || !std_dev) throw refuse("expected lab_mean=(L,a,b) and lab_std=(L,a,b)");
    LabStats target;
    for (std::size_t c = 0; c < 3; ++c) {
      target.mean[c] = (*mean)[c];
      target.std[c] = (*std_dev)[c];
      if (!(target.std[c] >= 0.0)) throw refuse("a negative standard deviation");
    }
    return std::make_unique<ReinhardNormalizer>(target, origin);
  }
  const auto h = described_values(description, "h", 3);
  const auto e = described_values(description, "e", 3);
  const auto max_concentration = described_values(description, "max_concentration", 2);
  if (!h || !e || !max_concentration) throw refuse("expected h=(r,g,b), e=(r,g,b) and max_concentration=(h,e)");
  MacenkoTarget target;
  target.stains.h = cv::Vec3d((*h)[0], (*h)[1], (*h)[2]);
  target.stains.e = cv::Vec3d((*e)[0], (*e)[1], (*e)[2]);
  target.max_concentration = cv::Vec2d((*max_concentration)[0], (*max_concentration)[1]);
  if (!(cv::norm(target.stains.h) > 0.0 && cv::norm(target.stains.e) > 0.0 && target.max_concentration[0] > 0.0 &&
        target.max_concentration[1] > 0.0)) {
    throw refuse("zero stain vectors or concentrations");
  }
  return std::make_unique<MacenkoNormalizer>(target, origin);
}

}  // namespace tessera::prep
