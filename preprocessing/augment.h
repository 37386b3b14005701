// Training-time augmentation of RGB tiles (uint8 H×W×3), drawn per tile and applied in one call that can also
// produce the network input (float 3×H×W, normalised per channel).
//
// Chain, in this fixed order (geometry first because it only moves pixels; stain before colour because the
// stain models the slide and the colour jitter the scanner):
//  1. Dihedral: optional 90° counter-clockwise rotation, then optional horizontal flip, then optional vertical
//     flip. With each of the three at probability ½ the eight symmetries of the square are equally likely.
//     Exact pixel moves; a rotation swaps H and W.
//  2. H&E stain jitter in optical density (Beer–Lambert model of preprocessing/stain.h, Ruifrok–Johnston
//     vectors): c = M⁻¹·OD gives the haematoxylin and eosin concentrations h, e (residual untouched), then
//     h' = α_h·h + β_h, e' = α_e·e + β_e with α ~ U[1−σ1, 1+σ1], β ~ U[−σ2, σ2], and OD' = OD + (h'−h)·v_h +
//     (e'−e)·v_e back to 8-bit intensity. With α = 1, β = 0 this is the identity up to the 8-bit round trip.
//  3. Colour jitter with ColorJitter semantics on values in [0, 255], clamped after every step:
//       brightness b ~ U[max(0, 1−B), 1+B]:  x ← b·x
//       contrast   c ~ U[max(0, 1−C), 1+C]:  x ← c·x + (1−c)·mean(gray)   (mean over the whole tile, as it is
//                                            when this step runs)
//       saturation s ~ U[max(0, 1−S), 1+S]:  x ← s·x + (1−s)·gray(pixel)
//       hue        h ~ U[−Hu, Hu] turns:     HSV hue ← (hue + h) mod 1   (V and the max/min channel kept)
//     with gray = 0.299·R + 0.587·G + 0.114·B. The four steps run in a random order per tile (order "random",
//     the ColorJitter behaviour) or always in the order brightness, contrast, saturation, hue ("fixed").
//     Unlike ColorJitter on 8-bit tensors, intermediate results are not rounded to 8 bits.
//
// Determinism: each tile's generator is seeded from (seed, epoch, global tile index) alone, so a tile gets the
// same augmentation whatever rank or thread handles it and in whatever order. Every draw is made whether or not
// its transform is enabled, so changing one transform's setting never changes another transform's draws.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include <opencv2/core.hpp>

#include "core/config.h"

namespace tessera::prep {

enum class ColourOrder { random, fixed };

// Settings of the `augment:` section; these defaults are the schema's defaults.
struct AugmentOptions {
  bool enabled = true;
  // Probabilities of the three dihedral steps.
  double flip_horizontal = 0.5;
  double flip_vertical = 0.5;
  double rotate90 = 0.5;
  // Colour jitter: applied to a tile with `colour_probability`, then each step with its own magnitude.
  double colour_probability = 1.0;
  double brightness = 0.2;  // B
  double contrast = 0.2;    // C
  double saturation = 0.2;  // S
  double hue = 0.04;        // Hu, in turns (at most 0.5)
  ColourOrder colour_order = ColourOrder::random;
  // H&E stain jitter: applied with `hed_probability`; σ1 = hed_scale, σ2 = hed_shift (OD units).
  double hed_probability = 1.0;
  double hed_scale = 0.05;
  double hed_shift = 0.05;
};

// Throws core::InternalError naming the field when a value is outside the range the schema allows.
void validate(const AugmentOptions& options);

// Declares the `augment.*` keys (type, default from AugmentOptions, range, doc) in a verb's schema.
core::Schema& declare_augment_schema(core::Schema& schema);
// AugmentOptions from a config loaded with a schema that declare_augment_schema() extended.
AugmentOptions augment_options_from_config(const core::Config& config);

// One of the eight symmetries of the square, as the steps applied in order: rotate, then flip H, then flip V.
struct Dihedral {
  bool rotate90 = false;  // 90° counter-clockwise
  bool flip_horizontal = false;
  bool flip_vertical = false;

  bool is_identity() const { return !rotate90 && !flip_horizontal && !flip_vertical; }
  int code() const { return (rotate90 ? 1 : 0) | (flip_horizontal ? 2 : 0) | (flip_vertical ? 4 : 0); }
  static Dihedral from_code(int code);  // 0..7, the inverse of code()
  // The symmetry that undoes this one: R⁻¹ = R·H·V (R² is the half turn H·V); R·H and R·V are reflections.
  Dihedral inverse() const;
  // Shape of the result for an input of `size`.
  cv::Size output_size(cv::Size size) const { return rotate90 ? cv::Size(size.height, size.width) : size; }
};

// Moves pixels exactly: any matrix type, `dst` (re)allocated, `dst` may be `src`.
void apply_dihedral(const cv::Mat& src, cv::Mat& dst, Dihedral dihedral);

// The drawn parameters of one tile. Identity values (factor 1, shift 0) mean the step is skipped.
struct TileAugmentation {
  enum class Step : std::uint8_t { brightness, contrast, saturation, hue };

  Dihedral dihedral;
  bool hed = false;  // run the stain step (also with identity values, which round-trip through OD)
  double h_scale = 1.0, h_shift = 0.0, e_scale = 1.0, e_shift = 0.0;
  double brightness = 1.0, contrast = 1.0, saturation = 1.0, hue = 0.0;
  std::array<Step, 4> order = {Step::brightness, Step::contrast, Step::saturation, Step::hue};

  bool has_colour() const { return brightness != 1.0 || contrast != 1.0 || saturation != 1.0 || hue != 0.0; }
  bool is_identity() const { return dihedral.is_identity() && !hed && !has_colour(); }
};

TileAugmentation draw_augmentation(const AugmentOptions& options, std::uint64_t seed, std::int64_t epoch,
                                   std::int64_t index);

// Per-channel normalisation of the network input, on the [0, 1] scale: out = (x/255 − mean[c]) / std[c].
// The defaults are the ImageNet statistics that torchvision's pretrained models expect.
struct ChannelNormalization {
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
};

// Applies TileAugmentations. Keeps scratch buffers so that a tile costs no allocation once warm: use one
// Augmenter per thread.
class Augmenter {
 public:
  explicit Augmenter(const AugmentOptions& options = {});  // validate()s the options

  const AugmentOptions& options() const { return options_; }
  TileAugmentation draw(std::uint64_t seed, std::int64_t epoch, std::int64_t index) const {
    return draw_augmentation(options_, seed, epoch, index);
  }

  // uint8 RGB (CV_8UC3, H×W) → uint8 RGB of augmentation.dihedral.output_size(); `dst` may be `src` (in place)
  // and is reallocated only when its shape or type differ. Rounded to the nearest level.
  void apply(const TileAugmentation& augmentation, const cv::Mat& src, cv::Mat& dst);
  // uint8 RGB (CV_8UC3, H×W) → float planes `chw` [3][H'][W'] (H'×W' = output_size), normalised; values are the
  // unrounded result of the chain, so they equal apply()'s uint8 output up to its final rounding.
  void apply(const TileAugmentation& augmentation, const cv::Mat& src, float* chw,
             const ChannelNormalization& normalization);

  // draw() then apply().
  void augment(const cv::Mat& src, cv::Mat& dst, std::uint64_t seed, std::int64_t epoch, std::int64_t index) {
    apply(draw(seed, epoch, index), src, dst);
  }
  void augment(const cv::Mat& src, float* chw, const ChannelNormalization& normalization, std::uint64_t seed,
               std::int64_t epoch, std::int64_t index) {
    apply(draw(seed, epoch, index), src, chw, normalization);
  }

 private:
  // Where finished rows go: 8-bit HWC or normalised float CHW.
  struct Sink;
  void run(const TileAugmentation& augmentation, const cv::Mat& src, const Sink& sink);

  AugmentOptions options_;
  cv::Mat source_copy_;      // src when the output overwrites it and pixels move
  std::vector<float> rows_;  // rows of three W' planes (one row, or all H' between the two passes)
};

}  // namespace tessera::prep
