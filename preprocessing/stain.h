// The H&E optical-density stain model shared by the synthetic-slide generator, stain normalization and stain
// augmentation.
//
// Beer–Lambert: a pixel of white-balanced transmitted light is I_c = I0 · exp(−OD_c) per channel c (R, G, B),
// with I0 = 255 (bright glass) and natural-log optical density. A stained section adds the OD of each stain
// s in proportion to its concentration: OD = Σ_s c_s · v_s, where v_s is the stain's unit OD vector.
// Colour deconvolution (Ruifrok & Johnston, Anal. Quant. Cytol. Histol. 2001) inverts this for H and E with a
// third, residual vector orthogonal to both.
//
// Stain vectors are unit (R, G, B) OD directions; concentrations are in OD units along them.
#pragma once

#include <array>
#include <cstdint>

#include <opencv2/core.hpp>

namespace tessera::prep {

// Intensity of bright, empty glass: OD 0.
inline constexpr double kWhiteIntensity = 255.0;

struct StainVectors {
  cv::Vec3d h;  // haematoxylin: nuclei, blue-purple
  cv::Vec3d e;  // eosin: cytoplasm and stroma, pink
};

// Ruifrok & Johnston's H and E vectors (the `rgb_from_hed` rows of scikit-image), normalized.
StainVectors ruifrok_he();

cv::Vec3d normalized(const cv::Vec3d& v);

// --- Optical density ----------------------------------------------------------------------------------------

// OD of one 8-bit intensity; intensities below 1 are taken as 1 so that black stays finite.
double od_from_intensity(double intensity);
double intensity_from_od(double od);  // unclamped, 255·exp(−od)

cv::Vec3d rgb_to_od(const cv::Vec3b& rgb);
cv::Vec3b od_to_rgb(const cv::Vec3d& od);  // rounded and clamped to 0..255

cv::Mat rgb_to_od(const cv::Mat& rgb);  // CV_8UC3 → CV_32FC3
cv::Mat od_to_rgb(const cv::Mat& od);   // CV_32FC3 → CV_8UC3

// Fast OD → 8-bit intensity for inner loops: a table over [0, kMaxOd) in steps of 1/kStepsPerOd (error below
// half a grey level). Negative OD gives 255, OD at or beyond the end gives the darkest entry.
class OdToIntensityTable {
 public:
  static constexpr int kStepsPerOd = 512;
  static constexpr int kMaxOd = 8;
  OdToIntensityTable();
  std::uint8_t operator()(float od) const {
    const int i = static_cast<int>(od * static_cast<float>(kStepsPerOd));
    return table_[static_cast<std::size_t>(i < 0 ? 0 : (i >= kSize ? kSize - 1 : i))];
  }

 private:
  static constexpr int kSize = kStepsPerOd * kMaxOd;
  std::array<std::uint8_t, kSize> table_;
};

// --- Colour deconvolution -----------------------------------------------------------------------------------

// The 3×3 matrix that maps an OD vector to (H, E, residual) concentrations for these vectors; the residual
// direction is h × e, normalized.
cv::Matx33d unmixing_matrix(const StainVectors& stains);

// H and E concentrations of one pixel.
cv::Vec2d he_concentrations(const cv::Vec3b& rgb, const StainVectors& stains);
// Per-pixel H and E concentrations of an RGB image: CV_8UC3 → CV_32FC2.
cv::Mat he_concentrations(const cv::Mat& rgb, const StainVectors& stains);

// --- Per-slide variation ------------------------------------------------------------------------------------

// How much stains vary between slides (different labs, batches, staining times, scanners).
struct StainVariation {
  double max_angle = 0.10;    // radians: each vector is tilted by up to this much, in a random direction
  double h_scale_min = 0.80;  // haematoxylin intensity multiplier range
  double h_scale_max = 1.20;
  double e_scale_min = 0.75;  // eosin intensity multiplier range
  double e_scale_max = 1.25;
};

struct SlideStain {
  StainVectors vectors;
  double h_scale = 1.0;  // multiplies every haematoxylin concentration
  double e_scale = 1.0;  // multiplies every eosin concentration
};

// A deterministic per-slide perturbation of `base`: the same seed always gives the same stain (integer hashing
// only, identical on every platform). Vectors stay unit length with non-negative components.
SlideStain perturb_stain(const StainVectors& base, std::uint64_t seed, const StainVariation& variation = {});

// Tilts a unit vector by `angle` radians towards the direction `towards` (projected orthogonal to it).
cv::Vec3d tilt(const cv::Vec3d& v, const cv::Vec3d& towards, double angle);

}  // namespace tessera::prep
