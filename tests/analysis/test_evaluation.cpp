// CAMELYON16 scoring on small constructed slides whose answers are worked out by hand: the evaluation mask
// (37.5 µm border growth, exclusion regions, filled holes, 8-connected lesions), ITC lesions, matching (one true
// positive per lesion, normal slides all false positives), the FROC curve and both score rules, and ROC curves.
//
// Geometry used throughout: level-0 0.25 µm/px, so a level-5-equivalent mask pixel is 32 level-0 pixels = 8 µm,
// and a mask pixel joins a lesion when its centre is closer than 75 / (8 · 2) = 4.6875 mask pixels to a tumour
// pixel centre: 4 pixels straight out from an edge join (32 µm), the 5th (40 µm) does not; diagonally, offsets
// with dx² + dy² ≤ 21 join.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "analysis/evaluation.h"
#include "core/error.h"
#include "core/metrics.h"
#include "tests/testing/testing.h"

namespace tessera::analysis {
namespace {

constexpr double kMpp = 0.25;
constexpr double kPx = 32.0;  // level-0 pixels per mask pixel
const io::AnnotationClasses kClasses;

// A rectangle annotation covering mask pixels [c0, c1) × [r0, r1) exactly (level-0 pixel corners).
io::Annotation cells(int c0, int r0, int c1, int r1, const std::string& group = "_0") {
  io::Annotation a;
  a.group = group;
  a.outer = {{c0 * kPx, r0 * kPx}, {c1 * kPx, r0 * kPx}, {c1 * kPx, r1 * kPx}, {c0 * kPx, r1 * kPx}};
  return a;
}

// The level-0 centre of mask pixel (c, r).
double centre(int c) { return (c + 0.5) * kPx; }

EvaluationMask mask_of(const std::vector<io::Annotation>& annotations, const FrocOptions& options = {}) {
  return EvaluationMask(annotations, kClasses, kMpp, 100000, 100000, options);
}

TEST(EvaluationMask, ResolutionIsLevelZeroTimes32AndThresholdIsHalfOf75Microns) {
  const auto mask = mask_of({cells(20, 20, 40, 40)});
  EXPECT_DOUBLE_EQ(mask.downsample(), 32.0);
  EXPECT_DOUBLE_EQ(mask.pixel_um(), 8.0);
  EXPECT_DOUBLE_EQ(mask.distance_threshold_px(), 4.6875);
}

TEST(EvaluationMask, BordersGrowBy37point5MicronsQuantizedToMaskPixels) {
  // Tumour: level-0 x in [640, 1280). Pixels 40..43 to the right (up to level-0 1408, 32 µm) join the lesion.
  const auto mask = mask_of({cells(20, 20, 40, 40)});
  ASSERT_EQ(mask.lesions().size(), 1u);
  const double y = centre(30);
  EXPECT_EQ(mask.label_at(1279, y), 1);
  EXPECT_EQ(mask.label_at(1280 + 30 / kMpp, y), 1) << "30 µm outside: inside the dilated lesion";
  EXPECT_EQ(mask.label_at(1407, y), 1);
  EXPECT_EQ(mask.label_at(1408, y), 0) << "mask pixel 44: its centre is 5 px = 40 µm from the tumour";
  EXPECT_EQ(mask.label_at(1280 + 45 / kMpp, y), 0) << "45 µm outside";
  // The CAMELYON scripts grow each border by 75/2 µm, not 75 µm: 60 µm outside is not part of the lesion.
  EXPECT_EQ(mask.label_at(1280 + 60 / kMpp, y), 0);
  // Left and top borders alike: pixels 16..19 join, 15 does not.
  EXPECT_EQ(mask.label_at(centre(16), y), 1);
  EXPECT_EQ(mask.label_at(centre(15), y), 0);
  EXPECT_EQ(mask.label_at(centre(30), centre(16)), 1);
  EXPECT_EQ(mask.label_at(centre(30), centre(15)), 0);
  // Around the corner (39, 39): offset (4, 2) has d² = 20 < 4.6875² and joins, (4, 3) has d² = 25 and does not.
  EXPECT_EQ(mask.label_at(centre(43), centre(41)), 1);
  EXPECT_EQ(mask.label_at(centre(43), centre(42)), 0);
  // The dilated square: 20 + 2·4 = 28 px per side minus the corners beyond the disk.
  EXPECT_EQ(mask.lesion(1).box, cv::Rect(16, 16, 28, 28));
}

TEST(EvaluationMask, LesionsCloserThanTheGrowthMerge) {
  // Gap of 8 pixels: each side grows by 4, the grown borders touch → one lesion; a gap of 9 leaves a column.
  const auto merged = mask_of({cells(20, 20, 30, 40), cells(38, 20, 48, 40)});
  EXPECT_EQ(merged.lesions().size(), 1u);
  const auto apart = mask_of({cells(20, 20, 30, 40), cells(39, 20, 49, 40)});
  ASSERT_EQ(apart.lesions().size(), 2u);
  EXPECT_EQ(apart.label_at(centre(25), centre(30)), 1);
  EXPECT_EQ(apart.label_at(centre(44), centre(30)), 2);
  EXPECT_EQ(apart.label_at(centre(34), centre(30)), 0);
}

TEST(EvaluationMask, EightConnectedAndMajorAxisAsSkimage) {
  // A threshold of half a pixel: no growth. Two 2×2 squares touching at one corner are one 8-connected lesion.
  // Pixel coordinates relative to the first: x, y ∈ {0,0,1,1,2,2,3,3}, var 1.25 each, covariance 1.0, so
  // λ₁ = 2.25 and the major axis is 4·√2.25 = 6 px = 48 µm.
  FrocOptions no_growth;
  no_growth.dilation_um = 8.0;  // threshold 8 / (8 · 2) = 0.5 px
  const auto mask = mask_of({cells(10, 10, 12, 12), cells(12, 12, 14, 14)}, no_growth);
  ASSERT_EQ(mask.lesions().size(), 1u);
  EXPECT_EQ(mask.lesion(1).pixels, 8);
  EXPECT_NEAR(mask.lesion(1).major_axis_um, 48.0, 1e-9);
  EXPECT_EQ(mask.lesion(1).box, cv::Rect(10, 10, 4, 4));

  // A 13×4 rectangle: var along x (13² − 1)/12 = 14, so 4·√14 px.
  const auto bar = mask_of({cells(10, 10, 23, 14)}, no_growth);
  ASSERT_EQ(bar.lesions().size(), 1u);
  EXPECT_EQ(bar.lesion(1).pixels, 52);
  EXPECT_NEAR(bar.lesion(1).major_axis_um, 4.0 * std::sqrt(14.0) * 8.0, 1e-9);
}

TEST(EvaluationMask, ItcThresholdIsTheMajorAxisAgainst200Plus75Microns) {
  // Without growth the threshold is (200 + 8) / 8 = 26 px. A 1-pixel line of n pixels has major axis
  // 4·√((n² − 1)/12): 22 px → 25.4 (ITC), 23 px → 26.5 (counted).
  FrocOptions no_growth;
  no_growth.dilation_um = 8.0;
  const auto mask = mask_of({cells(10, 10, 32, 11), cells(10, 20, 33, 21)}, no_growth);
  ASSERT_EQ(mask.lesions().size(), 2u);
  EXPECT_NEAR(mask.lesion(1).major_axis_um, 4.0 * std::sqrt((22.0 * 22.0 - 1.0) / 12.0) * 8.0, 1e-9);
  EXPECT_TRUE(mask.lesion(1).itc);
  EXPECT_FALSE(mask.lesion(2).itc);

  // With the CAMELYON growth: a 96 µm square grows to a lesion of major axis about 180 µm (ITC), a 256 µm square to
  // about 367 µm (counted). The 160 µm square's value, 255.13 µm over 772 pixels, is from a brute-force
  // reference (every pixel's distance to every tumour pixel, numpy).
  const auto grown = mask_of({cells(10, 10, 22, 22), cells(60, 10, 92, 42), cells(10, 60, 30, 80)});
  ASSERT_EQ(grown.lesions().size(), 3u);
  EXPECT_TRUE(grown.lesion(1).itc);
  EXPECT_FALSE(grown.lesion(2).itc);
  EXPECT_TRUE(grown.lesion(3).itc);
  EXPECT_NEAR(grown.lesion(1).major_axis_um, 180.091, 1e-3);
  EXPECT_NEAR(grown.lesion(2).major_axis_um, 366.926, 1e-3);
  EXPECT_NEAR(grown.lesion(3).major_axis_um, 255.131, 1e-3);
  EXPECT_EQ(grown.lesion(3).pixels, 772);

  FrocOptions with_itc;
  with_itc.include_itc = true;
  const auto all = mask_of({cells(10, 10, 22, 22)}, with_itc);
  ASSERT_EQ(all.lesions().size(), 1u);
  EXPECT_FALSE(all.lesion(1).itc);
}

TEST(EvaluationMask, ExclusionRegionsAreNotTumourButEnclosedOnesAreFilled) {
  // Exclusion over the right half of a tumour (reaching its border): the excluded part, beyond the growth of the
  // remaining half, is outside the lesion.
  const auto cut = mask_of({cells(20, 20, 60, 40), cells(40, 20, 60, 40, "_2")});
  ASSERT_EQ(cut.lesions().size(), 1u);
  EXPECT_EQ(cut.label_at(centre(30), centre(30)), 1);
  EXPECT_EQ(cut.label_at(centre(43), centre(30)), 1);
  EXPECT_EQ(cut.label_at(centre(44), centre(30)), 0);
  EXPECT_EQ(cut.label_at(centre(55), centre(30)), 0);
  // A band of exclusion wider than twice the growth splits a tumour in two lesions.
  const auto split = mask_of({cells(20, 20, 70, 40), cells(40, 20, 50, 40, "Exclusion")});
  EXPECT_EQ(split.lesions().size(), 2u);
  // An exclusion region enclosed by tumour leaves a hole, which is filled (binary_fill_holes): still the lesion.
  const auto hole = mask_of({cells(20, 20, 60, 60), cells(30, 30, 50, 50, "_2")});
  ASSERT_EQ(hole.lesions().size(), 1u);
  EXPECT_EQ(hole.label_at(centre(40), centre(40)), 1);
  // A GeoJSON-style hole in the polygon itself behaves the same.
  io::Annotation ring = cells(20, 20, 60, 60, "Tumor");
  ring.holes.push_back(cells(30, 30, 50, 50).outer);
  const auto holed = mask_of({ring});
  EXPECT_EQ(holed.label_at(centre(40), centre(40)), 1);
  // The grown 48×48 square, less at each corner the offsets (3, 4), (4, 3), (4, 4), whose dx² + dy² > 21.
  EXPECT_EQ(holed.lesion(1).pixels, 48 * 48 - 4 * 3);
}

TEST(EvaluationMask, ClippedToTheSlideAndPointsOrOtherClassesIgnored) {
  // A tumour at the slide's corner: the mask starts at pixel 0 (nothing outside the slide).
  const EvaluationMask corner({cells(0, 0, 10, 10)}, kClasses, kMpp, 640, 640);
  EXPECT_EQ(corner.origin(), cv::Point(0, 0));
  EXPECT_EQ(corner.lesion(1).box, cv::Rect(0, 0, 14, 14));
  EXPECT_EQ(corner.label_at(-5, 10), 0);
  io::Annotation dot = cells(50, 50, 51, 51);
  dot.type = "Dot";
  const auto none = mask_of({dot, cells(20, 20, 40, 40, "Other")});
  EXPECT_TRUE(none.lesions().empty());
  EXPECT_EQ(none.label_at(centre(30), centre(30)), 0);
  EXPECT_THROW(EvaluationMask({cells(0, 0, 10, 10)}, kClasses, 0.0, 640, 640), core::ConfigError);
}

TEST(MatchDetections, OneTruePositivePerLesionItcIgnoredNormalSlidesAllFalse) {
  // Lesion 1: a 256 µm square; lesion 2: far to the right; lesion 3: a 96 µm square (ITC).
  const auto mask = mask_of({cells(20, 20, 52, 52), cells(100, 20, 132, 52), cells(200, 20, 212, 32)});
  ASSERT_EQ(mask.lesions().size(), 3u);
  ASSERT_TRUE(mask.lesion(3).itc);
  const std::vector<Detection> detections = {
      {0.6, centre(30), centre(30)},            // lesion 1
      {0.9, centre(40), centre(40)},            // lesion 1 again, higher: the lesion's probability
      {0.7, centre(50), centre(50)},            // lesion 1 again, lower: ignored
      {0.95, centre(205), centre(25)},          // ITC: neither true nor false positive
      {0.8, 52 * kPx + 45 / kMpp, centre(30)},  // 45 µm right of lesion 1: false positive
      {0.3, centre(300), centre(300)},          // nowhere near: false positive
  };
  const auto tumour = match_detections("t", detections, &mask);
  EXPECT_TRUE(tumour.tumour);
  EXPECT_EQ(tumour.lesions(), 2);
  EXPECT_EQ(tumour.itc_lesions, 1);
  EXPECT_EQ(tumour.lesion_p, (std::vector<double>{0.9, 0.0}));
  EXPECT_EQ(tumour.lesion_label, (std::vector<int>{1, 2}));
  EXPECT_EQ(tumour.fp_p, (std::vector<double>{0.8, 0.3}));
  EXPECT_EQ(tumour.true_positives(), 1);
  EXPECT_EQ(tumour.false_positives(), 2);
  EXPECT_EQ(tumour.itc_hits, 1);
  EXPECT_EQ(tumour.repeat_hits, 2);
  EXPECT_EQ(tumour.detections, 6);

  const auto normal = match_detections("n", detections, nullptr);
  EXPECT_FALSE(normal.tumour);
  EXPECT_EQ(normal.lesions(), 0);
  EXPECT_EQ(normal.false_positives(), 6);
  EXPECT_EQ(normal.fp_p.front(), 0.6);
}

// Three slides worked by hand:
//   S1 (tumour): lesions at 0.9 and missed (0); false positives 0.8, 0.3
//   S2 (tumour): lesion at 0.6; false positive 0.6
//   S3 (normal): false positives 0.5, 0.4
// Thresholds 0.3 0.4 0.5 0.6 0.8 0.9 give FPs/slide 5/3 4/3 1 2/3 1/3 0 and sensitivity 2/3 2/3 2/3 2/3 1/3 1/3,
// then the end point (0, 0). By ascending FPs: (0,0) (0,1/3) (1/3,1/3) (2/3,2/3) (1,2/3) (4/3,2/3) (5/3,2/3).
// evaluate.py (first point with FPs ≥ rate, else the last): 1/4 → 1/3; 1/2 → 2/3; 1, 2, 4, 8 → 2/3: mean 11/18.
// numpy.interp: 1/4 → 1/3; 1/2 → halfway from (1/3,1/3) to (2/3,2/3) = 1/2; the rest 2/3: mean 7/12.
SlideFroc slide(const std::string& id, std::vector<double> lesion_p, std::vector<double> fp_p) {
  SlideFroc s;
  s.slide_id = id;
  s.tumour = !lesion_p.empty();
  for (std::size_t i = 0; i < lesion_p.size(); ++i) s.lesion_label.push_back(static_cast<int>(i) + 1);
  s.lesion_p = std::move(lesion_p);
  s.fp_p = std::move(fp_p);
  return s;
}

std::vector<SlideFroc> hand_slides() {
  return {slide("s1", {0.9, 0.0}, {0.8, 0.3}), slide("s2", {0.6}, {0.6}), slide("s3", {}, {0.5, 0.4})};
}

TEST(Froc, CurveAndBothScoreRulesMatchHandComputation) {
  const auto slides = hand_slides();
  const auto froc = compute_froc(slides);
  EXPECT_EQ(froc.slides, 3);
  EXPECT_EQ(froc.lesions, 3);
  EXPECT_EQ(froc.detected_lesions, 2);
  EXPECT_EQ(froc.false_positives, 5);
  const std::vector<double> thresholds = {0.3, 0.4, 0.5, 0.6, 0.8, 0.9};
  const std::vector<double> fps = {5.0 / 3, 4.0 / 3, 1.0, 2.0 / 3, 1.0 / 3, 0.0};
  const std::vector<double> sens = {2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 1.0 / 3, 1.0 / 3};
  ASSERT_EQ(froc.curve.size(), thresholds.size() + 1);
  for (std::size_t i = 0; i < thresholds.size(); ++i) {
    EXPECT_EQ(froc.curve[i].threshold, thresholds[i]) << i;
    EXPECT_DOUBLE_EQ(froc.curve[i].fps_per_slide, fps[i]) << i;
    EXPECT_DOUBLE_EQ(froc.curve[i].sensitivity, sens[i]) << i;
  }
  EXPECT_TRUE(std::isinf(froc.curve.back().threshold));
  EXPECT_EQ(froc.curve.back().fps_per_slide, 0.0);
  EXPECT_EQ(froc.curve.back().sensitivity, 0.0);

  const std::array<double, 6> bisect = {1.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3};
  const std::array<double, 6> interpolated = {1.0 / 3, 0.5, 2.0 / 3, 2.0 / 3, 2.0 / 3, 2.0 / 3};
  for (std::size_t k = 0; k < 6; ++k) {
    EXPECT_DOUBLE_EQ(froc.sensitivity[k], bisect[k]) << kFrocRates[k];
    EXPECT_DOUBLE_EQ(froc.sensitivity_interpolated[k], interpolated[k]) << kFrocRates[k];
  }
  EXPECT_DOUBLE_EQ(froc.score, 11.0 / 18.0);
  EXPECT_DOUBLE_EQ(froc.score_interpolated, 7.0 / 12.0);
}

TEST(Froc, PerfectDetectorScoresOneAndZeroProbabilitiesNeverCount) {
  // Every lesion found above every false positive: sensitivity 1 from 0 FPs on. A detection of probability 0
  // (a false positive here) is below every threshold.
  const std::vector<SlideFroc> slides = {slide("a", {0.9, 0.8}, {0.0, 0.2}), slide("b", {}, {0.1})};
  const auto froc = compute_froc(slides);
  EXPECT_DOUBLE_EQ(froc.score, 1.0);
  EXPECT_DOUBLE_EQ(froc.score_interpolated, 1.0);
  ASSERT_EQ(froc.curve.size(), 5u) << "thresholds 0.1 0.2 0.8 0.9 and the end point";
  EXPECT_DOUBLE_EQ(froc.curve.front().fps_per_slide, 1.0) << "two false positives over two slides";

  // No lesion anywhere: the sensitivity is undefined.
  const std::vector<SlideFroc> normal_only = {slide("n", {}, {0.5})};
  EXPECT_TRUE(std::isnan(compute_froc(normal_only).score));
  EXPECT_THROW(compute_froc({}), core::InternalError);
}

TEST(Froc, FromAnnotationsToScoreOnThreeSlides) {
  // The hand case above, produced from geometry: S1 has lesions A (cells 20..52) and B (cells 100..132) and an ITC
  // (cells 200..212); S2 one lesion (cells 20..52); S3 is normal.
  const auto s1_mask = mask_of({cells(20, 20, 52, 52), cells(100, 20, 132, 52), cells(200, 20, 212, 32)});
  const auto s2_mask = mask_of({cells(20, 20, 52, 52)});
  const std::vector<Detection> s1 = {
      {0.9, centre(30), centre(30)},            // A
      {0.7, centre(35), centre(35)},            // A again
      {0.95, centre(206), centre(26)},          // ITC: ignored
      {0.8, 52 * kPx + 45 / kMpp, centre(40)},  // 45 µm right of A: false positive
      {0.3, centre(300), centre(300)},          // false positive
  };
  const std::vector<Detection> s2 = {
      {0.6, 52 * kPx + 30 / kMpp, centre(40)},  // 30 µm right of the lesion: a hit
      {0.6, centre(100), centre(100)},          // false positive
  };
  const std::vector<Detection> s3 = {{0.5, centre(30), centre(30)}, {0.4, centre(300), centre(300)}};
  const std::vector<SlideFroc> slides = {match_detections("s1", s1, &s1_mask), match_detections("s2", s2, &s2_mask),
                                         match_detections("s3", s3, nullptr)};
  const auto expected = hand_slides();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(slides[i].lesion_p, expected[i].lesion_p) << i;
    EXPECT_EQ(slides[i].fp_p, expected[i].fp_p) << i;
  }
  const auto froc = compute_froc(slides);
  EXPECT_DOUBLE_EQ(froc.score, 11.0 / 18.0);
  EXPECT_DOUBLE_EQ(froc.score_interpolated, 7.0 / 12.0);
  EXPECT_EQ(froc.itc_lesions, 1);
}

TEST(RocCurve, PointsPerDistinctScoreAndAreaIsTheAuc) {
  const std::vector<float> scores = {0.1f, 0.4f, 0.35f, 0.8f};
  const std::vector<std::uint8_t> labels = {0, 0, 1, 1};
  const auto curve = roc_curve(scores, labels);
  ASSERT_EQ(curve.size(), 5u);
  const std::vector<std::pair<double, double>> expected = {{0, 0}, {0, 0.5}, {0.5, 0.5}, {0.5, 1}, {1, 1}};
  for (std::size_t i = 0; i < curve.size(); ++i) {
    EXPECT_DOUBLE_EQ(curve[i].fpr, expected[i].first) << i;
    EXPECT_DOUBLE_EQ(curve[i].tpr, expected[i].second) << i;
  }
  EXPECT_FLOAT_EQ(static_cast<float>(curve[1].threshold), 0.8f);
  // Ties move both rates: one diagonal step.
  const std::vector<float> tied = {0.5f, 0.5f, 0.2f, 0.9f};
  const std::vector<std::uint8_t> tied_labels = {0, 1, 0, 1};
  const auto diagonal = roc_curve(tied, tied_labels);
  ASSERT_EQ(diagonal.size(), 4u);
  EXPECT_DOUBLE_EQ(diagonal[2].fpr, 0.5);
  EXPECT_DOUBLE_EQ(diagonal[2].tpr, 1.0);
  for (const auto& [s, l] : {std::pair{scores, labels}, std::pair{tied, tied_labels}}) {
    const auto c = roc_curve(s, l);
    double area = 0.0;
    for (std::size_t i = 1; i < c.size(); ++i) area += (c[i].fpr - c[i - 1].fpr) * (c[i].tpr + c[i - 1].tpr) / 2;
    EXPECT_DOUBLE_EQ(area, core::roc_auc(s, l));
  }
  EXPECT_TRUE(roc_curve(std::vector<float>{0.2f}, std::vector<std::uint8_t>{1}).empty());
}

}  // namespace
}  // namespace tessera::analysis
