// CAMELYON16 scoring: lesion-level FROC from detections, and the ROC curves behind slide- and patch-level AUC.
//
// The rules are those of the challenge's evaluation code (Evaluation_FROC.py of 2016 and the evaluate.py that
// ships with the CAMELYON16 data set), step by step:
//
//  1. Evaluation mask. One mask pixel is 2^mask_level level-0 pixels ("level 5": 32 × 32, i.e. level-0 µm/px
//     × 32, whatever the slide's own pyramid). Mask pixel (i, j) is tumour when its centre, level-0
//     ((i + ½)·32, (j + ½)·32), lies inside a tumour polygon (outer ring minus its holes) and outside every
//     exclusion polygon (ASAP `_2`, QuPath "Exclusion"/"Ignore*": io::AnnotationClasses) — the mask the
//     CAMELYON16 ground-truth TIFFs hold, with exclusion drawn over tumour.
//  2. Dilation. A mask pixel joins the tumour when its Euclidean distance (pixel centres) to the nearest tumour
//     pixel is < dilation_um / (2 · mask µm/px): the scripts' `distance_transform_edt(...) < 75 / (spacing · 2)`.
//     CAMELYON16's "75 µm" is thus the growth of a lesion's diameter; each border moves out by 37.5 µm.
//  3. Holes filled (background regions not 4-connected to the image border become lesion, as
//     scipy.ndimage.binary_fill_holes does: an exclusion hole enclosed by tumour ends up inside the lesion), then
//     lesions are the 8-connected components, numbered in raster order of their first pixel (skimage.label).
//  4. Isolated tumour cells: a lesion whose major axis is < itc_diameter_um + dilation_um (200 + 75 = 275 µm)
//     is an ITC. The major axis is skimage's regionprops major_axis_length: 4·√λ₁, λ₁ the larger eigenvalue
//     of the covariance of the lesion's pixel coordinates, in mask pixels, times the mask µm/px.
//  5. Matching. Detection (p, x, y) in level-0 pixels falls on mask pixel (⌊x/32⌋, ⌊y/32⌋) (the 2016 script's
//     integer division). On a lesion: the lesion's probability becomes max(its probability, p) — one true
//     positive per lesion, at its highest probability, further hits ignored; on an ITC lesion: ignored, neither
//     true nor false positive; elsewhere (or on a normal slide, anywhere): a false positive with probability p.
//  6. FROC curve. Thresholds t = the distinct non-zero probabilities of all slides' false positives and
//     lesions (a missed lesion has probability 0), ascending; at each, average FPs per slide = #FP with p ≥ t
//     / #slides and sensitivity = #lesions with p ≥ t / #lesions (ITC lesions excluded); then the end point
//     (0, 0). A detection with probability 0 never counts.
//  7. Score. For each rate r of 1/4, 1/2, 1, 2, 4, 8 FPs per slide, with the points ordered by ascending FPs
//     (the curve reversed), the sensitivity of the first point whose FPs ≥ r, or of the last point when none
//     reaches r (evaluate.py's bisect_left, no interpolation); the score is their mean. Also given:
//     score_interpolated, the same rates read off the reversed curve by linear interpolation exactly as
//     numpy.interp does (MONAI's compute_froc_score, behind published figures such as MONAI's 0.72).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "analysis/detections.h"
#include "io/annotations.h"

namespace tessera::analysis {

struct FrocOptions {
  int mask_level = 5;              // mask pixel = 2^mask_level level-0 pixels
  double dilation_um = 75.0;       // CAMELYON16's 75 µm: borders move out by dilation_um / 2
  double itc_diameter_um = 200.0;  // ITC: major axis < itc_diameter_um + dilation_um
  bool include_itc = false;        // true: ITC lesions count like the others (evaluate.py --itc)
};

struct Lesion {
  int label = 0;            // 1-based, in raster order of the lesion's first mask pixel
  std::int64_t pixels = 0;  // area in mask pixels (dilated, holes filled)
  double major_axis_um = 0.0;
  bool itc = false;  // isolated tumour cells (never set when FrocOptions::include_itc)
  cv::Rect box;      // bounding box in mask pixels
};

// The labelled evaluation mask of one tumour slide (steps 1–4 above). Only the window around the tumour is
// held (tumour bounding box plus the dilation, clipped to the slide when its size is known); results are those
// of the whole-slide mask.
class EvaluationMask {
 public:
  // `annotations` in level-0 pixels; `mpp` the slide's level-0 µm/px; width and height its level-0 size
  // (0 = unknown: the mask is not clipped to the slide). ConfigError when mpp or the options are not positive.
  EvaluationMask(const std::vector<io::Annotation>& annotations, const io::AnnotationClasses& classes, double mpp,
                 std::int64_t width, std::int64_t height, const FrocOptions& options = {});

  // The lesion label (1-based) under level-0 point (x, y), 0 outside every lesion.
  int label_at(double x, double y) const;
  const std::vector<Lesion>& lesions() const { return lesions_; }
  const Lesion& lesion(int label) const { return lesions_.at(static_cast<std::size_t>(label - 1)); }
  double pixel_um() const { return pixel_um_; }                   // mask µm/px: mpp × 2^mask_level
  double downsample() const { return downsample_; }               // level-0 pixels per mask pixel
  double distance_threshold_px() const { return threshold_px_; }  // step 2's threshold in mask pixels
  // The labels of the window, and the window's top-left in whole-slide mask pixels.
  const cv::Mat1i& labels() const { return labels_; }
  cv::Point origin() const { return origin_; }

 private:
  double downsample_ = 32.0;
  double pixel_um_ = 0.0;
  double threshold_px_ = 0.0;
  cv::Point origin_;
  cv::Mat1i labels_;
  std::vector<Lesion> lesions_;
};

// What one slide contributes to the FROC (step 5).
struct SlideFroc {
  std::string slide_id;
  bool tumour = false;
  std::vector<double> lesion_p;   // per countable lesion, in label order: its highest hit probability (0 = missed)
  std::vector<int> lesion_label;  // the mask label of each entry of lesion_p
  std::vector<double> fp_p;       // the false positives' probabilities, in file order
  int itc_lesions = 0;
  std::int64_t detections = 0;
  std::int64_t itc_hits = 0;     // detections on ITC lesions (ignored)
  std::int64_t repeat_hits = 0;  // hits on a lesion beyond its first (only the highest probability counts)

  int lesions() const { return static_cast<int>(lesion_p.size()); }
  int true_positives() const;  // lesions hit with probability > 0
  std::int64_t false_positives() const { return static_cast<std::int64_t>(fp_p.size()); }
};

// Matches a slide's detections: against `mask` for a tumour slide, or, with mask == nullptr, a normal slide
// (every detection a false positive).
SlideFroc match_detections(const std::string& slide_id, std::span<const Detection> detections,
                           const EvaluationMask* mask);

struct FrocPoint {
  double threshold = 0.0;  // +infinity for the end point (0, 0)
  double fps_per_slide = 0.0;
  double sensitivity = 0.0;
};

inline constexpr std::array<double, 6> kFrocRates = {0.25, 0.5, 1.0, 2.0, 4.0, 8.0};

struct FrocResult {
  std::vector<FrocPoint> curve;                      // ascending threshold, then the end point (steps 6)
  std::array<double, 6> sensitivity{};               // at kFrocRates, evaluate.py's rule (step 7)
  std::array<double, 6> sensitivity_interpolated{};  // at kFrocRates, numpy.interp
  double score = 0.0;                                // mean of `sensitivity`; NaN without lesions
  double score_interpolated = 0.0;
  int slides = 0;
  int lesions = 0;
  int itc_lesions = 0;
  int detected_lesions = 0;  // lesions hit with probability > 0 (sensitivity at the lowest threshold)
  std::int64_t false_positives = 0;
};

// The FROC over slides (steps 6–7). At least one slide (InternalError otherwise); with no lesion at all the
// sensitivities and scores are NaN.
FrocResult compute_froc(std::span<const SlideFroc> slides);

struct RocPoint {
  double threshold = 0.0;  // score ≥ threshold is called positive; +infinity for (0, 0)
  double fpr = 0.0;
  double tpr = 0.0;
};

// The ROC curve of scores for binary labels (1 positive): one point per distinct score, descending, after
// (0, 0); ties move both rates at once, so the trapezoidal area under the points is core::roc_auc. Empty
// when a class is absent.
std::vector<RocPoint> roc_curve(std::span<const float> scores, std::span<const std::uint8_t> labels);

}  // namespace tessera::analysis
