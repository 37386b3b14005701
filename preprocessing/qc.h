// Slide quality control: where a slide's pixels cannot be trusted (`tessera qc`, and the QC stage of tile and infer).
//
// Per slide, at a coarse level (about `mask_mpp` µm/px, the tissue mask's resolution), one mask per artefact class:
//   blur          out-of-focus tissue: its sharpness (|Laplacian| over local contrast of the grey image read at
//                 `blur_mpp`, per QC pixel) is below `blur_ratio` times the median over the slide's own tissue
//   pen_green, pen_blue, pen_black, pen_red
//                 marker ink, told from H&E by colour: stained tissue has red ≥ green (hue 240°..40°), green and
//                 blue ink absorb red (hue 60°..236°), black ink is dark and nearly neutral, red ink is far more
//                 saturated than eosin and lies at hue 345°..25° where eosin sits near 300°..340°. Black ink must be
//                 wider than a bubble's rim (an opening 64 µm wide); its mask then takes back the stroke's dark or
//                 neutral pixels within that width of the wide core (the opening shaves a stroke's ends and faded
//                 edges), and a narrower stretch of black pixels joining two wide pieces (a stroke crossing tissue,
//                 whose colour takes its faded edges below the tests); the other classes' rules and the sharpness
//                 reference use the core
//   fold          doubled tissue: BOTH haematoxylin and eosin at least `fold_ratio` times their local median over the
//                 tissue around it (a lymphoid area raises only H, stroma only E); inside an over-exposed field or a
//                 bubble, against that field's or bubble's own tissue. Fainter pixels join a fold's core:
//                 both stains raised by 60 % of the ratio's excess, or E at least twice its local median with H not
//                 below half of its own (a fold over stroma among lymphoid tissue, or across a washed-out field).
//                 Looked for 2 px clear of ink (a stroke's blurred edge raises both stains); a fold found on both
//                 sides of a stroke (its core or its fainter pixels, before they are kept for joining a core) continues
//                 under it along a row, column or diagonal that crosses the stroke (at most 3 times as long as the
//                 stroke is wide where it passes: about 20° or steeper, not along the stroke nor grazing a curve),
//                 and its mask covers the ink there. A thin fold crossing a bubble, an exposure field or a hole is
//                 found in pieces: pieces in line beyond an end of a stretch of fold (a piece at least 3 times as
//                 long as wide and 160 µm long; seen from that end within 20° of its axis, ends at most 320 µm apart)
//                 count together against `min_artefact_um2`; round specks never chain
//   bubble        air bubbles and coverslip edges: thin grey lines (a strong neutral component of the optical density,
//                 narrower than an ink stroke); the nearly convex area a closed line encloses is the bubble
//   overexposed   washed-out tissue: a clipped channel, or both stains at most 1/1.2 of their local median; not where
//                 a bubble is (the tissue seen through it is paler too: that is the bubble's)
//   underexposed  glass far darker than the slide's own glass (below `underexposure_ratio` of its median
//                 brightness), with the tissue darkened by a neutral grey that joins it; or a wide area of tissue
//                 darkened by a neutral grey (at least `min_artefact_um2`) whose median grey is below
//                 `underexposure_ratio` of the tissue's within 96 µm around it (a ring of at least a quarter of
//                 `min_artefact_um2` of tissue) and that lies less than half on a fold (folds are found for this
//                 even when their class is off); each field as its convex hull; only on slides with glass
// and slide-level checks: too little tissue (< `min_tissue_mm2`), not a brightfield slide (a dark background:
// fluorescence; its artefact masks are then left empty, the classes being brightfield H&E's), and, over a cohort
// (add_cohort_flags), stain far from the cohort's.
//
// Masks are CV_8U, 255 = artefact, the size of the tissue mask (pixel (r, c) covers level-0
// [c·downsample, (c+1)·downsample) × [r·downsample, ...)). Fractions are of the tissue area (tissue found with pen
// marks kept, so that ink over tissue counts as tissue under ink). The masks are independent: a pixel may be in
// several (ink under a fold counts in its pen class's fraction and in the fold's), and the excluded and flagged
// unions take each class's action, so ink under a fold is excluded when folds are, whatever pen ink's action.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "core/config.h"
#include "io/qc_masks.h"
#include "io/slide.h"
#include "preprocessing/tissue.h"

namespace tessera::prep {

enum class Artefact : int {
  blur = 0,
  pen_green,
  pen_blue,
  pen_black,
  pen_red,
  fold,
  bubble,
  overexposed,
  underexposed,
};
inline constexpr int kArtefactCount = 9;
const std::array<Artefact, kArtefactCount>& all_artefacts();
const char* to_string(Artefact artefact);  // "blur", "pen_green", ...
inline int index(Artefact artefact) { return static_cast<int>(artefact); }

// What infer and tile do with cells/tiles of a class: not scored/dropped (exclude) or kept and marked (flag).
enum class QcAction { exclude, flag };
QcAction parse_qc_action(const std::string& name, const std::string& key);  // ConfigError naming `key`
const char* to_string(QcAction action);

struct QcOptions {
  double mask_mpp = 8.0;  // the QC level, µm/px
  double blur_mpp = 1.0;  // where sharpness is measured, µm/px
  // Out of focus below this share of the slide's median tissue sharpness. Tissue half blended with its defocused self
  // (σ 1.5 µm, where tessera synth's truth puts a blur patch's edge) keeps 0.70–0.73 of its sharpness (README).
  double blur_ratio = 0.7;
  double fold_ratio = 1.3;
  double underexposure_ratio = 0.8;
  double min_tissue_mm2 = 1.0;        // less tissue: the slide-level flag "too little tissue"
  double min_artefact_um2 = 20000.0;  // smaller specks of a class are dropped (≈ 140 µm square; a fold's pieces in line
                                      // count together, and pen ink with the ink of other colours it crosses)
  std::array<bool, kArtefactCount> enabled{true, true, true, true, true, true, true, true, true};
  std::array<QcAction, kArtefactCount> action{QcAction::flag,    QcAction::exclude, QcAction::exclude,
                                              QcAction::exclude, QcAction::exclude, QcAction::exclude,
                                              QcAction::exclude, QcAction::exclude, QcAction::exclude};
  // Blur excludes (instead of its action) where sharpness is below this share of the median: severe defocus.
  double severe_blur_ratio = 0.3;
  // A tile/cell with more of its area in excluded artefacts is excluded. Low, because a cell half on ink or a fold
  // still scores like tumour (measured on twins, README "Slide quality control").
  double max_fraction = 0.1;
  // Excluded areas (QcResult::excluded) reach this far beyond the artefacts' masks: their edges fade.
  double margin_um = 48.0;
  bool refuse_flagged = false;  // a slide-level flag is a per-slide error (InputError) instead of a warning
};

// The qc.* keys (tile, infer and qc declare them alike) and their values.
core::Schema& declare_qc_keys(core::Schema& schema);
bool qc_enabled(const core::Config& config);
QcOptions qc_options(const core::Config& config);

struct QcResult {
  TissueMask tissue;  // tissue at the QC level (pen marks kept)
  // 255 = artefact; zeros for a disabled class. run_qc gives the classes it found nowhere (and severe_blur when empty)
  // one shared plane of zeros: read them, never write into one.
  std::array<cv::Mat1b, kArtefactCount> masks;
  cv::Mat1b severe_blur;                          // blur below severe_blur_ratio (a subset of masks[blur])
  std::array<double, kArtefactCount> fraction{};  // of the tissue area
  std::array<double, kArtefactCount> area_mm2{};  // of the whole mask (ink and exposure may lie on glass)
  double tissue_area_mm2 = 0.0;
  double sharpness = 0.0;               // median over tissue of measure_sharpness's values
  double brightness = 0.0;              // mean grey level of the tissue, 0..255
  double background_brightness = 0.0;   // median grey level of the slide outside tissue, 0..255
  double stain_h = 0.0, stain_e = 0.0;  // median H and E concentrations of the tissue (Ruifrok vectors, OD units)
  double stain_angle = 0.0;             // degrees: the median tissue OD's hue angle in the H–E plane
  std::vector<std::string> flags;       // slide-level: "too little tissue", "not brightfield", ...
  // The union of the classes whose action is exclude (and severe blur) with a margin of options.margin_um around it,
  // and the union of those that flag.
  cv::Mat1b excluded() const;
  cv::Mat1b flagged() const;
  QcOptions options;
};

// Reads the slide at the QC level, finds its tissue, reads the windows of it that hold tissue at blur_mpp
// (measure_sharpness: memory stays bounded) and finds artefacts; `rgb_out`, when given, gets the QC-level image.
// InputError naming the slide when it is too small for QC (fewer than 8 QC pixels a side).
QcResult run_qc(const io::Slide& slide, const QcOptions& options, cv::Mat* rgb_out = nullptr);
// The same on images already read: `rgb` at the QC level (`downsample` level-0 px per pixel, `mpp` µm/px) and the
// per-QC-pixel sharpness (CV_32F, same size; empty = blur not measured).
QcResult run_qc(const cv::Mat& rgb, const cv::Mat1f& sharpness, double downsample, double mpp,
                const QcOptions& options);

// Per QC pixel, the sharpness run_qc uses: the mean |Laplacian| over the mean local contrast (|grey − its Gaussian
// blur|, plus 2 grey levels) of the grey image read at options.blur_mpp. Read window by window (about 512 px a side
// at blur_mpp, with a margin for the filters): memory does not grow with the slide. With `where` (a QC-level mask),
// only windows holding some of it are read, and the QC pixels of the others stay 0.
cv::Mat1f measure_sharpness(const io::Slide& slide, cv::Size qc_size, const QcOptions& options,
                            const cv::Mat1b& where = cv::Mat1b());

// Cohort check: for each slide, "stain far from cohort" when its stain (H, E, angle) lies more than `z` robust
// standard deviations (1.4826 · median absolute deviation) from the cohort's median; needs at least 3 slides.
// Appends the flag to the results' flags.
void add_cohort_flags(std::vector<QcResult*>& results, double z = 3.5);

// Masks of one slide as one 16-bit PNG's pixels (io/qc_masks.h): bit k set = class k (all_artefacts() order), bit 13
// the flagged union, bit 14 the excluded one (excluded()), bit 15 = tissue.
cv::Mat1w encode_qc_masks(const QcResult& result);
// Intersection over union of two masks (255 = in); 1 when both are empty.
double mask_iou(const cv::Mat1b& a, const cv::Mat1b& b);

// A picture a person reads at a glance: the thumbnail with each class's area tinted and outlined in its colour, and
// a legend. `rgb` is the QC-level image (or any image of the slide: the masks are scaled to it).
cv::Mat render_qc_preview(const cv::Mat& rgb, const QcResult& result);
cv::Scalar artefact_colour(Artefact artefact);  // RGB

}  // namespace tessera::prep
