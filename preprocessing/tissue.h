// Tissue detection on a low-resolution view of a slide.
//
// The mask is computed at about `mask_mpp` µm/px, area-averaged from the coarsest pyramid level at least 4x finer
// than that (level 0 when none is), so that files of one scan with different pyramids get one mask: a pixel is tissue
// when its HSV saturation is above an Otsu threshold (floored at `min_saturation`) AND it is far enough from
// white (`min_white_distance` in RGB units); then morphological opening/closing, removal of objects
// smaller than `min_object_um2`, and filling of holes smaller than `max_hole_um2`. Optionally pen marks
// (strongly saturated green, blue, black ink) are rejected.
#pragma once

#include <vector>

#include <opencv2/core.hpp>

#include "core/config.h"
#include "io/slide.h"
#include "io/tissue_settings.h"

namespace tessera::prep {

struct TissueOptions {
  double mask_mpp = 8.0;             // resolution of the mask in µm/px
  double min_saturation = 0.05;      // floor for the Otsu threshold on saturation (0..1)
  double min_white_distance = 30.0;  // Euclidean RGB distance from (255,255,255)
  double min_object_um2 = 20000.0;   // smaller tissue specks are removed (≈ 140 µm square)
  double max_hole_um2 = 40000.0;     // smaller holes are filled
  bool reject_pen_marks = true;
};

// The tissue.* keys, declared alike by every verb that finds tissue (tile, infer): tissue.min_fraction,
// tissue.mask_mpp, tissue.reject_pen_marks. `unset` is said after each key's doc (infer: where an unset key's value
// comes from).
core::Schema& declare_tissue_keys(core::Schema& schema, const std::string& unset = "");
// Their values.
io::TissueSettings tissue_settings(const core::Config& config);

struct TissueMask {
  cv::Mat mask;                    // CV_8U, 255 = tissue
  double downsample = 1.0;         // level-0 pixels per mask pixel (same in x and y)
  double mpp = 0.0;                // µm per mask pixel
  double tissue_fraction() const;  // share of mask pixels that are tissue
  double tissue_area_mm2() const;
};

// Removes the 8-connected foreground components of `mask` smaller than `min_area` pixels (tissue masks, QC masks).
void remove_small_objects(cv::Mat1b& mask, double min_area);

// Clears the pixels of `mask` whose component in `labels` (CV_32S, 0 = background) has keep[label] == 0.
void keep_labelled(cv::Mat1b& mask, const cv::Mat& labels, const std::vector<std::uint8_t>& keep);

// How read_slide_image picks the pyramid level it averages from.
enum class SourceLevel {
  // A level at least 4x finer than the image while that level has at most 128 Mpx, else the coarsest level at least
  // as fine as the image: the image is Tessera's own area average whatever software made the pyramid (tissue masks).
  oversampled,
  // The coarsest level at least as fine as the image (QC's thresholds are set on images read this way).
  nearest,
};

// cv::resize(src, dst, src.size() / factor, 0, 0, cv::INTER_AREA) for an RGB CV_8UC3 `src` whose width and height
// are `factor` (≥ 3) times dst's: the same pixels (OpenCV's integer-factor area path: each pixel the sum of its
// factor × factor block times 1/factor², rounded by cv::saturate_cast), at a fraction of the cost (that path gathers
// each block pixel by pixel; only a factor of 2 has a vectorized path, which rounds halves up, and stays OpenCV's).
// `dst` may be a view into a larger image.
void area_average(const cv::Mat& src, cv::Mat& dst, int factor);

// The whole slide as an RGB image at about `mpp` µm/px (never finer than level 0), area-averaged from the level
// `source` picks and read in bands of bounded size; `downsample` gets the level-0 pixels per image pixel (exact
// along x). InputError naming the slide when the image would be too large.
cv::Mat read_slide_image(const io::Slide& slide, double mpp, double* downsample,
                         SourceLevel source = SourceLevel::oversampled);

// Reads the slide at about options.mask_mpp (read_slide_image) and detects tissue.
TissueMask detect_tissue(const io::Slide& slide, const TissueOptions& options);
// The same on an RGB image whose pixels are `downsample` level-0 pixels wide at `mpp` µm/px.
TissueMask detect_tissue(const cv::Mat& rgb, double downsample, double mpp, const TissueOptions& options);

}  // namespace tessera::prep
