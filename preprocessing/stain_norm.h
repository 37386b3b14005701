// Stain normalization: make tiles from different labs and scanners look alike before training and
// inference.
//  - Reinhard: match the per-channel mean and standard deviation in CIE L*a*b* (tissue pixels only).
//  - Macenko: estimate the slide's/tile's H and E stain vectors from the optical density of tissue pixels
//    (plane of the two largest singular vectors, robust angle percentiles), express each pixel as H and E
//    concentrations, rescale the concentrations to the target's 99th percentiles and recompose with the
//    target's stain vectors.
// The target is fitted on a reference image, or is the built-in H&E reference (Tessera's own constants).
// A normalizer is fitted once and then applied to many tiles; apply() is const and thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::prep {

enum class StainMethod { none, reinhard, macenko };
StainMethod parse_stain_method(const std::string& name);  // "none", "reinhard", "macenko"; else InternalError
const char* to_string(StainMethod method);

class StainNormalizer {
 public:
  virtual ~StainNormalizer() = default;
  virtual StainMethod method() const = 0;
  // Normalizes an RGB CV_8UC3 image in place. Background (near-white) pixels are left near-white.
  virtual void apply(cv::Mat& rgb) const = 0;
  // A short text of the fitted target (stored with shards and checkpoints so inference matches training).
  virtual std::string describe() const = 0;
  // This target with the source's colours fitted once on `images` taken together (the tissue of all of one
  // patient's patches) instead of on each tile: its apply() maps every tile alike, so the colour differences
  // between the source's tiles stay while the source as a whole moves to the target. nullptr, with `failure`
  // saying why, when the images together hold too little tissue to fit (or, for Macenko, one stain only).
  virtual std::unique_ptr<StainNormalizer> fitted_to(const std::vector<cv::Mat>& images,
                                                     std::string& failure) const = 0;
};

// The built-in H&E target for `method`; nullptr for StainMethod::none.
std::unique_ptr<StainNormalizer> make_stain_normalizer(StainMethod method);
// Fitted on a reference image (RGB CV_8UC3). InputError if it holds too little tissue to fit.
std::unique_ptr<StainNormalizer> make_stain_normalizer(StainMethod method, const cv::Mat& reference,
                                                       const std::string& reference_name);
// Fitted on several reference images taken together (a dataset's training patches); InputError naming
// `reference_name` when together they hold too little tissue.
std::unique_ptr<StainNormalizer> make_stain_normalizer(StainMethod method, const std::vector<cv::Mat>& references,
                                                       const std::string& reference_name);

// What the shards of a job whose normalizers were fitted per group (StainNormalizer::fitted_to) record: the
// target's describe() text and this suffix. stain_normalizer_from_description() takes both forms.
inline constexpr const char* kPerGroupSuffix = " per=group";

// The normalizer a describe() text stands for ("none" → nullptr): how inference rebuilds the target a model's
// tiles were normalized with from the checkpoint's /meta. The built-in targets come back exactly; a target
// fitted on a reference comes back with describe()'s 4 decimals. InputError naming `source` (the checkpoint)
// when the text is not one describe() writes. A text ending in kPerGroupSuffix gives its target's normalizer,
// which fits each tile on its own (a slide's tiles are not one patient's patches).
std::unique_ptr<StainNormalizer> stain_normalizer_from_description(const std::string& description,
                                                                   const std::string& source);

}  // namespace tessera::prep
