#include "preprocessing/tiling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "io/image.h"
#include "io/slide.h"
#include "io/tiff_writer.h"
#include "preprocessing/tissue.h"
#include "synth/synth.h"
#include "tests/testing/testing.h"

namespace tessera::prep {
namespace {

const cv::Scalar kGlass(244, 243, 246);
const cv::Scalar kEosin(236, 170, 210);
const cv::Scalar kNucleus(98, 64, 150);

io::Annotation polygon(const std::string& group, double x0, double y0, double x1, double y1) {
  io::Annotation a;
  a.group = group;
  a.outer = {{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}};
  return a;
}

io::Ring rectangle_ring(double x0, double y0, double x1, double y1) { return {{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}}; }

// Area of the axis-aligned rectangles' intersection.
double overlap(double ax0, double ay0, double ax1, double ay1, double bx0, double by0, double bx1, double by1) {
  return std::max(0.0, std::min(ax1, bx1) - std::max(ax0, bx0)) *
         std::max(0.0, std::min(ay1, by1) - std::max(ay0, by0));
}

// A uniformly coloured slide, for tests that need only its geometry.
void write_flat_slide(const std::string& path, int width, int height, double mpp) {
  io::TiffWriterOptions options;
  options.mpp = mpp;
  io::TiffWriter writer(path, width, height, options);
  for (int y0 = 0; y0 < height; y0 += options.tile_size) {
    writer.write_strip(cv::Mat(std::min(options.tile_size, height - y0), width, CV_8UC3, kEosin));
  }
  writer.finish();
}

void write_slide(const std::string& path, const cv::Mat& rgb, double mpp) {
  io::TiffWriterOptions options;
  options.mpp = mpp;
  options.jpeg_quality = 90;
  io::TiffWriter writer(path, rgb.cols, rgb.rows, options);
  for (int y0 = 0; y0 < rgb.rows; y0 += options.tile_size) {
    writer.write_strip(rgb.rowRange(y0, std::min(rgb.rows, y0 + options.tile_size)).clone());
  }
  writer.finish();
}

// A tissue mask that is all tissue (or all of `value`), `downsample` level-0 pixels per mask pixel.
TissueMask uniform_mask(const io::Slide& slide, double downsample, std::uint8_t value = 255) {
  TissueMask mask;
  mask.downsample = downsample;
  mask.mpp = slide.mpp() * downsample;
  mask.mask = cv::Mat1b(static_cast<int>(std::ceil(slide.height() / downsample)),
                        static_cast<int>(std::ceil(slide.width() / downsample)), value);
  return mask;
}

bool row_major(const SlidePlan& plan) {
  return std::is_sorted(plan.tiles.begin(), plan.tiles.end(), [](const PlannedTile& a, const PlannedTile& b) {
    return std::make_pair(a.y, a.x) < std::make_pair(b.y, b.x);
  });
}

// ---- tumour_fraction on constructed cases ---------------------------------------------------------------

constexpr double kX = 1000.0;
constexpr double kY = 2000.0;
constexpr double kSide = 512.0;
constexpr int kPixels = 256;

TEST(Labels, SquareCoveringHalfATileGivesExactlyHalf) {
  // The polygon extends far past the tile on three sides; its right edge halves the tile.
  const std::vector<io::Annotation> tumour = {polygon("_0", kX - 300, kY - 300, kX + kSide / 2, kY + kSide + 300)};
  EXPECT_DOUBLE_EQ(tumour_fraction(tumour, {}, kX, kY, kSide, kPixels), 0.5);
  // Also with a footprint that is not a whole number of level-0 pixels (256 px at 0.6 µm/px from 0.25).
  const double side = 614.4;
  const std::vector<io::Annotation> half = {polygon("_0", kX - 10, kY - 10, kX + side / 2, kY + side + 10)};
  EXPECT_DOUBLE_EQ(tumour_fraction(half, {}, kX, kY, side, 256), 0.5);
  // A horizontal half, and a quarter.
  const std::vector<io::Annotation> top = {polygon("_0", kX - 5, kY - 5, kX + kSide + 5, kY + kSide / 2)};
  EXPECT_DOUBLE_EQ(tumour_fraction(top, {}, kX, kY, kSide, kPixels), 0.5);
  const std::vector<io::Annotation> quarter = {polygon("_0", kX + kSide / 2, kY + kSide / 2, kX + 2000, kY + 2000)};
  EXPECT_DOUBLE_EQ(tumour_fraction(quarter, {}, kX, kY, kSide, kPixels), 0.25);
}

TEST(Labels, TileInsideIsOneAndOutsideIsZero) {
  const std::vector<io::Annotation> tumour = {polygon("_0", 0, 0, 10000, 10000)};
  EXPECT_DOUBLE_EQ(tumour_fraction(tumour, {}, kX, kY, kSide, kPixels), 1.0);
  // Exactly touching the tile's right edge from outside: nothing inside.
  const std::vector<io::Annotation> beside = {polygon("_0", kX + kSide, kY, kX + 2 * kSide, kY + kSide)};
  EXPECT_DOUBLE_EQ(tumour_fraction(beside, {}, kX, kY, kSide, kPixels), 0.0);
  EXPECT_DOUBLE_EQ(tumour_fraction({}, {}, kX, kY, kSide, kPixels), 0.0);
}

TEST(Labels, HolesAreNotTumour) {
  io::Annotation a = polygon("Tumor", kX - 100, kY - 100, kX + kSide + 100, kY + kSide + 100);
  a.holes.push_back(rectangle_ring(kX - 50, kY - 50, kX + kSide / 2, kY + kSide / 2));  // the top-left quarter
  EXPECT_DOUBLE_EQ(tumour_fraction({a}, {}, kX, kY, kSide, kPixels), 0.75);
  // A second tumour polygon over the hole makes it tumour again: areas are a union.
  const io::Annotation patch = polygon("Tumor", kX, kY, kX + kSide / 4, kY + kSide / 4);
  EXPECT_DOUBLE_EQ(tumour_fraction({a, patch}, {}, kX, kY, kSide, kPixels), 0.75 + 1.0 / 16.0);
}

TEST(Labels, OverlappingTumourPolygonsAreAUnion) {
  const std::vector<io::Annotation> tumour = {
      polygon("_0", kX - 10, kY - 10, kX + 0.75 * kSide, kY + kSide + 10),
      polygon("_1", kX + 0.25 * kSide, kY - 10, kX + kSide + 10, kY + kSide + 10)};
  EXPECT_DOUBLE_EQ(tumour_fraction(tumour, {}, kX, kY, kSide, kPixels), 1.0);
}

TEST(Labels, ExclusionInsideTumourIsSubtracted) {
  const std::vector<io::Annotation> tumour = {polygon("_0", 0, 0, 10000, 10000)};
  // An eighth of the tile: the left half of the top quarter.
  const std::vector<io::Annotation> exclusion = {polygon("_2", kX - 20, kY - 20, kX + kSide / 2, kY + kSide / 4)};
  EXPECT_DOUBLE_EQ(tumour_fraction(tumour, exclusion, kX, kY, kSide, kPixels), 0.875);
  // A tile wholly inside an exclusion polygon has no tumour.
  const std::vector<io::Annotation> all = {polygon("_2", kX - 1, kY - 1, kX + kSide + 1, kY + kSide + 1)};
  EXPECT_DOUBLE_EQ(tumour_fraction(tumour, all, kX, kY, kSide, kPixels), 0.0);
  // An exclusion without tumour changes nothing.
  EXPECT_DOUBLE_EQ(tumour_fraction({}, exclusion, kX, kY, kSide, kPixels), 0.0);
}

TEST(Labels, SlantedEdgeIsWithinOnePixelRow) {
  // A triangle whose hypotenuse is the tile's diagonal: area exactly half; pixel-centre sampling errs by at
  // most one pixel per row.
  io::Annotation triangle;
  triangle.group = "_0";
  triangle.outer = {{kX, kY}, {kX + kSide, kY}, {kX, kY + kSide}};
  const double f = tumour_fraction({triangle}, {}, kX, kY, kSide, kPixels);
  EXPECT_NEAR(f, 0.5, 1.0 / kPixels);
  // A thin sliver under a pixel row centre line covers nothing; over it covers the whole row.
  const std::vector<io::Annotation> sliver = {polygon("_0", kX - 5, kY + 0.2, kX + kSide + 5, kY + 0.8)};
  EXPECT_DOUBLE_EQ(tumour_fraction(sliver, {}, kX, kY, kSide, kPixels), 0.0);
  const std::vector<io::Annotation> row = {polygon("_0", kX - 5, kY + 0.2, kX + kSide + 5, kY + 2.2)};
  EXPECT_DOUBLE_EQ(tumour_fraction(row, {}, kX, kY, kSide, kPixels), 1.0 / kPixels);
}

// ---- class mapping --------------------------------------------------------------------------------------

TEST(Labels, AnnotationClassesMapAsapAndQuPathNames) {
  const AnnotationClasses classes;
  for (const char* group : {"_0", "_1", "Tumor", "Tumour", "metastases"})
    EXPECT_TRUE(classes.is_tumour(group)) << group;
  for (const char* group : {"_2", "Exclusion", "Ignore", "Ignore*", "Ignore tissue"}) {
    EXPECT_TRUE(classes.is_exclusion(group)) << group;
    EXPECT_FALSE(classes.is_tumour(group)) << group;
  }
  for (const char* group : {"", "_3", "Stroma", "normal", "Tumor2", "tumour", "Ignor", "xIgnore"}) {
    EXPECT_FALSE(classes.is_tumour(group)) << group;
    EXPECT_FALSE(classes.is_exclusion(group)) << group;
  }
  AnnotationClasses custom;
  custom.tumour = {"Tumour*"};
  custom.exclusion = {};
  EXPECT_TRUE(custom.is_tumour("Tumour"));
  EXPECT_TRUE(custom.is_tumour("Tumour (ductal)"));
  EXPECT_FALSE(custom.is_tumour("Tumor"));
  EXPECT_FALSE(custom.is_exclusion("_2"));
}

TEST(Labels, SplitKeepsAreasOfKnownClassesOnly) {
  std::vector<io::Annotation> annotations = {polygon("_0", 0, 0, 10, 10),      polygon("_1", 0, 0, 10, 10),
                                             polygon("_2", 0, 0, 10, 10),      polygon("Tumor", 0, 0, 10, 10),
                                             polygon("Ignore*", 0, 0, 10, 10), polygon("Ignore fold", 0, 0, 10, 10),
                                             polygon("Stroma", 0, 0, 10, 10),  polygon("metastases", 0, 0, 10, 10)};
  io::Annotation dot = polygon("_0", 5, 5, 6, 6);
  dot.type = "Dot";
  io::Annotation points = polygon("Tumor", 1, 1, 9, 9);
  points.type = "PointSet";
  annotations.push_back(dot);
  annotations.push_back(points);

  std::vector<io::Annotation> tumour, exclusion;
  split_annotations(annotations, AnnotationClasses{}, tumour, exclusion);
  std::vector<std::string> tumour_groups, exclusion_groups;
  for (const auto& a : tumour) tumour_groups.push_back(a.group);
  for (const auto& a : exclusion) exclusion_groups.push_back(a.group);
  EXPECT_EQ(tumour_groups, (std::vector<std::string>{"_0", "_1", "Tumor", "metastases"}));
  EXPECT_EQ(exclusion_groups, (std::vector<std::string>{"_2", "Ignore*", "Ignore fold"}));
  for (const auto& a : tumour) EXPECT_NE(a.type, "Dot");
}

// ---- the grid ---------------------------------------------------------------------------------------------

TEST(Tiling, OriginsAreRoundedMultiplesOfTheFootprint) {
  testing::TempDir dir;
  write_flat_slide(dir.file("flat.tif"), 5000, 4000, 0.25);
  const io::Slide slide = io::Slide::open(dir.file("flat.tif"));
  const TissueMask all = uniform_mask(slide, 32.0);

  GridOptions options;
  options.tile_size = 256;
  options.mpp = 0.6;  // 2.4 level-0 pixels per tile pixel: the footprint is not an integer
  options.min_tissue = 0.0;
  const SlidePlan plan = plan_slide(slide, all, {}, AnnotationClasses{}, options);
  EXPECT_DOUBLE_EQ(plan.footprint, 614.4);
  EXPECT_DOUBLE_EQ(plan.slide_mpp, 0.25);
  EXPECT_EQ(plan.slide_id, "flat");
  EXPECT_EQ(plan.slide_path, dir.file("flat.tif"));
  // x: round(i·614.4) + 614.4 ≤ 5000 for i = 0..7; y: ≤ 4000 for i = 0..5.
  ASSERT_EQ(plan.tiles.size(), 8u * 6u);
  EXPECT_TRUE(row_major(plan));
  for (std::size_t k = 0; k < plan.tiles.size(); ++k) {
    const auto i = static_cast<double>(k % 8);
    const auto j = static_cast<double>(k / 8);
    EXPECT_EQ(plan.tiles[k].x, std::llround(i * 614.4));
    EXPECT_EQ(plan.tiles[k].y, std::llround(j * 614.4));
    EXPECT_LE(static_cast<double>(plan.tiles[k].x) + plan.footprint, 5000.0);
    EXPECT_LE(static_cast<double>(plan.tiles[k].y) + plan.footprint, 4000.0);
    EXPECT_FLOAT_EQ(plan.tiles[k].tissue_fraction, 1.0f);
    EXPECT_EQ(plan.tiles[k].label, 0);
  }
  EXPECT_EQ(plan.tiles[1].x, 614);
  EXPECT_EQ(plan.tiles[2].x, 1229);
  EXPECT_EQ(plan.tiles[3].x, 1843);

  // A stride of half a tile steps by 307.2 level-0 pixels.
  options.stride = 128;
  const SlidePlan overlapping = plan_slide(slide, all, {}, AnnotationClasses{}, options);
  std::set<std::int64_t> xs;
  for (const auto& t : overlapping.tiles) xs.insert(t.x);
  std::set<std::int64_t> expected;
  for (int i = 0; std::llround(i * 307.2) + 614.4 <= 5000.0; ++i) expected.insert(std::llround(i * 307.2));
  EXPECT_EQ(xs, expected);
  EXPECT_EQ(expected.size(), 15u);
}

TEST(Tiling, TargetResolutionBetweenPyramidLevelsHasTheRightFootprint) {
  testing::TempDir dir;
  io::TiffWriterOptions tiff;
  tiff.mpp = 0.25;
  tiff.compression = io::TiffCompression::deflate;
  testing::write_pattern_slide(dir.file("pattern.tif"), 3000, 2400, tiff);
  const io::Slide slide = io::Slide::open(dir.file("pattern.tif"));

  GridOptions options;
  options.tile_size = 64;
  options.mpp = 0.75;  // not a level: levels are 0.25, 0.5, 1.0, ...
  options.min_tissue = 0.0;
  const SlidePlan plan = plan_slide(slide, uniform_mask(slide, 16.0), {}, AnnotationClasses{}, options);
  EXPECT_DOUBLE_EQ(plan.footprint, 192.0);
  ASSERT_EQ(plan.tiles.size(), 15u * 12u);  // floor(3000 / 192) × floor(2400 / 192)
  EXPECT_EQ(plan.tiles.back().x, 14 * 192);
  EXPECT_EQ(plan.tiles.back().y, 11 * 192);
  // Reading a planned tile at the target resolution covers exactly the footprint: tile pixel (i, j) is the
  // average of level-0 pixels [x + 3i, x + 3i + 3) × [y + 3j, y + 3j + 3). (Red and green of the pattern
  // are smooth; blue has a sawtooth.)
  const PlannedTile& t = plan.tiles[40];
  const cv::Mat tile = slide.read_at_mpp(t.x, t.y, options.tile_size, options.tile_size, options.mpp);
  ASSERT_EQ(tile.size(), cv::Size(64, 64));
  for (int j = 0; j < 64; j += 9) {
    for (int i = 0; i < 64; i += 7) {
      const cv::Vec3b expected = testing::pattern_pixel(t.x + 3 * i + 1, t.y + 3 * j + 1);
      const cv::Vec3b got = tile.at<cv::Vec3b>(j, i);
      for (int c = 0; c < 2; ++c) EXPECT_NEAR(got[c], expected[c], 6) << "pixel " << i << "," << j;
    }
  }
}

TEST(Tiling, TissueFractionIsTheMaskAreaUnderTheFootprint) {
  testing::TempDir dir;
  write_flat_slide(dir.file("flat.tif"), 2048, 1024, 0.5);
  const io::Slide slide = io::Slide::open(dir.file("flat.tif"));
  // Mask pixels are 16 level-0 pixels; tissue only in mask columns 0..39 (level-0 x < 640).
  TissueMask half = uniform_mask(slide, 16.0, 0);
  half.mask.colRange(0, 40).setTo(255);

  GridOptions options;
  options.tile_size = 100;
  options.mpp = 1.0;  // footprint 200
  options.min_tissue = 0.0;
  const SlidePlan plan = plan_slide(slide, half, {}, AnnotationClasses{}, options);
  ASSERT_EQ(plan.tiles.size(), 10u * 5u);
  for (const auto& t : plan.tiles) {
    const double expected = overlap(static_cast<double>(t.x), 0, static_cast<double>(t.x) + 200, 1, 0, 0, 640, 1) / 200;
    EXPECT_NEAR(t.tissue_fraction, expected, 1e-6) << "x " << t.x;  // x=600 covers 40 of 200
  }
  options.min_tissue = 0.15;
  const SlidePlan kept = plan_slide(slide, half, {}, AnnotationClasses{}, options);
  EXPECT_EQ(kept.tiles.size(), 4u * 5u);  // x = 0, 200, 400, 600 (0.2)
}

// Any grid's tissue fractions (inference's cells) by the rule plan_slide keeps tiles with: the mask area under the
// square, row-major; on plan_slide's own grid the same numbers as its tiles.
TEST(Tiling, TissueFractionsOfAnyGridFollowThePlanRule) {
  testing::TempDir dir;
  write_flat_slide(dir.file("flat.tif"), 2048, 1024, 0.5);
  const io::Slide slide = io::Slide::open(dir.file("flat.tif"));
  TissueMask half = uniform_mask(slide, 16.0, 0);
  half.mask.colRange(0, 40).setTo(255);  // tissue at level-0 x < 640

  const std::vector<std::int64_t> xs = {0, 550, 600, 640, 1800}, ys = {0, 300};
  const auto fractions = tissue_fractions(half, xs, ys, 100.0);
  ASSERT_EQ(fractions.size(), xs.size() * ys.size());
  for (std::size_t i = 0; i < ys.size(); ++i) {
    for (std::size_t j = 0; j < xs.size(); ++j) {
      const auto x = static_cast<double>(xs[j]);
      const double expected = overlap(x, 0, x + 100, 1, 0, 0, 640, 1) / 100;  // 1, 0.9, 0.4, 0, 0
      EXPECT_NEAR(fractions[i * xs.size() + j], expected, 1e-9) << "x " << x;
    }
  }

  GridOptions options;
  options.tile_size = 100;
  options.mpp = 1.0;  // footprint 200, step 200
  options.min_tissue = 0.0;
  const SlidePlan plan = plan_slide(slide, half, {}, AnnotationClasses{}, options);
  std::vector<std::int64_t> plan_xs, plan_ys;
  for (const auto& t : plan.tiles) {
    if (t.y == 0) plan_xs.push_back(t.x);
    if (t.x == 0) plan_ys.push_back(t.y);
  }
  const auto same = tissue_fractions(half, plan_xs, plan_ys, plan.footprint);
  ASSERT_EQ(same.size(), plan.tiles.size());
  for (std::size_t k = 0; k < same.size(); ++k) {
    EXPECT_FLOAT_EQ(static_cast<float>(same[k]), plan.tiles[k].tissue_fraction) << "tile " << k;
  }
}

// A slide whose tissue fills the middle and whose tumour is a rectangle placed so that tiles get many
// different fractions; every edge is on the tile-pixel grid, so the exact oracle is rectangle overlap.
struct LabelCase {
  static constexpr double kSlideMpp = 0.5;
  static constexpr double kFoot = 128.0;                 // 64 px at 1 µm/px
  static constexpr double kT[4] = {288, 160, 700, 530};  // tumour x0, y0, x1, y1
  static constexpr double kE[4] = {400, 260, 480, 400};  // exclusion inside the tumour
  static double expected(const PlannedTile& t) {
    const auto x = static_cast<double>(t.x);
    const auto y = static_cast<double>(t.y);
    const double tumour = overlap(x, y, x + kFoot, y + kFoot, kT[0], kT[1], kT[2], kT[3]) -
                          overlap(x, y, x + kFoot, y + kFoot, kE[0], kE[1], kE[2], kE[3]);
    return tumour / (kFoot * kFoot);
  }
};

TEST(Labels, LabelsFollowTheThresholdRule) {
  testing::TempDir dir;
  write_flat_slide(dir.file("flat.tif"), 1024, 768, LabelCase::kSlideMpp);
  const io::Slide slide = io::Slide::open(dir.file("flat.tif"));
  const TissueMask all = uniform_mask(slide, 16.0);
  const std::vector<io::Annotation> annotations = {
      polygon("_0", LabelCase::kT[0], LabelCase::kT[1], LabelCase::kT[2], LabelCase::kT[3]),
      polygon("_2", LabelCase::kE[0], LabelCase::kE[1], LabelCase::kE[2], LabelCase::kE[3]),
      polygon("Stroma", 0, 0, 1024, 768)};  // an unknown class is ignored

  for (const bool keep : {false, true}) {
    for (const double threshold : {0.5, 0.8}) {
      SCOPED_TRACE("keep_ambiguous " + std::to_string(keep) + ", threshold " + std::to_string(threshold));
      GridOptions options;
      options.tile_size = 64;
      options.mpp = 1.0;
      options.min_tissue = 0.5;
      options.tumour_threshold = threshold;
      options.keep_ambiguous = keep;
      const SlidePlan plan = plan_slide(slide, all, annotations, AnnotationClasses{}, options);
      EXPECT_TRUE(row_major(plan));
      // Every grid position, with its expected fate.
      std::size_t k = 0;
      int tumour = 0, ambiguous = 0;
      for (int y = 0; y + 128 <= 768; y += 128) {
        for (int x = 0; x + 128 <= 1024; x += 128) {
          PlannedTile probe;
          probe.x = x;
          probe.y = y;
          const double f = LabelCase::expected(probe);
          const bool is_tumour = f >= threshold;
          const bool is_ambiguous = f > 0 && f < threshold;
          ambiguous += is_ambiguous;
          if (is_ambiguous && !keep) continue;
          ASSERT_LT(k, plan.tiles.size());
          const PlannedTile& t = plan.tiles[k++];
          EXPECT_EQ(t.x, x);
          EXPECT_EQ(t.y, y);
          EXPECT_FLOAT_EQ(t.tumour_fraction, static_cast<float>(f)) << "tile " << x << "," << y;
          EXPECT_EQ(t.label, is_tumour ? 1 : 0) << "tile " << x << "," << y << " fraction " << f;
          tumour += is_tumour;
        }
      }
      EXPECT_EQ(k, plan.tiles.size());
      EXPECT_EQ(plan.count(1), tumour);
      EXPECT_GT(tumour, 0);
      EXPECT_GT(ambiguous, 0);  // the case does exercise the band
    }
  }
}

// ---- hand-made slide with tissue and tumour: tiles on tissue, preview -------------------------------------

constexpr int kHandWidth = 4096;
constexpr int kHandHeight = 3072;
constexpr double kHandMpp = 0.5;

class TilingHandSlide : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    shape_ = new cv::Mat1b(cv::Mat1b::zeros(kHandHeight, kHandWidth));
    cv::ellipse(*shape_, cv::Point(2000, 1500), cv::Size(1600, 1100), 15.0, 0, 360, cv::Scalar(255), cv::FILLED);
    cv::Mat rgb(kHandHeight, kHandWidth, CV_8UC3, kGlass);
    cv::Mat tissue(rgb.size(), CV_8UC3, kEosin);
    cv::RNG rng(17);
    for (int k = 0; k < kHandWidth * kHandHeight / 300; ++k) {
      cv::circle(tissue, cv::Point(rng.uniform(0, kHandWidth), rng.uniform(0, kHandHeight)), rng.uniform(2, 6),
                 kNucleus, cv::FILLED);
    }
    tissue.copyTo(rgb, *shape_);
    write_slide(dir_->file("hand.tif"), rgb, kHandMpp);
  }
  static void TearDownTestSuite() {
    delete shape_;
    delete dir_;
  }
  static std::string path() { return dir_->file("hand.tif"); }
  // Tumour: a slanted quadrilateral inside the section.
  static std::vector<io::Annotation> annotations() {
    io::Annotation a;
    a.group = "Tumor";
    a.outer = {{1500.3, 900.7}, {2600.5, 1100.25}, {2500.0, 2000.0}, {1400.9, 1800.4}};
    return {a};
  }
  static testing::TempDir* dir_;
  static cv::Mat1b* shape_;
};
testing::TempDir* TilingHandSlide::dir_ = nullptr;
cv::Mat1b* TilingHandSlide::shape_ = nullptr;

// The same slide for the preview tests.
class PreviewHandSlide : public TilingHandSlide {};

TEST_F(TilingHandSlide, TilesLieOnTissueOnly) {
  const io::Slide slide = io::Slide::open(path());
  const TissueMask tissue = detect_tissue(slide, TissueOptions{});
  GridOptions options;
  options.tile_size = 128;
  options.mpp = 1.0;  // footprint 256
  options.min_tissue = 0.5;
  const SlidePlan plan = plan_slide(slide, tissue, {}, AnnotationClasses{}, options);
  ASSERT_FALSE(plan.tiles.empty());
  std::set<std::pair<std::int64_t, std::int64_t>> planned;
  for (const auto& t : plan.tiles) {
    const cv::Rect r(static_cast<int>(t.x), static_cast<int>(t.y), 256, 256);
    const double drawn = cv::countNonZero((*shape_)(r)) / (256.0 * 256.0);
    EXPECT_GE(drawn, 0.35) << "tile " << t.x << "," << t.y;
    EXPECT_NEAR(t.tissue_fraction, drawn, 0.12) << "tile " << t.x << "," << t.y;
    EXPECT_EQ(t.label, 0);
    planned.emplace(t.x, t.y);
  }
  // Every tile wholly inside the drawn section is planned.
  int inside = 0;
  for (int y = 0; y + 256 <= kHandHeight; y += 256) {
    for (int x = 0; x + 256 <= kHandWidth; x += 256) {
      if (cv::countNonZero((*shape_)(cv::Rect(x, y, 256, 256))) == 256 * 256) {
        ++inside;
        EXPECT_TRUE(planned.count({x, y})) << "tile " << x << "," << y;
      }
    }
  }
  EXPECT_GT(inside, 50);
}

TEST_F(TilingHandSlide, TumourTilesMatchTheExactFraction) {
  const io::Slide slide = io::Slide::open(path());
  const TissueMask tissue = detect_tissue(slide, TissueOptions{});
  GridOptions options;
  options.tile_size = 96;
  options.mpp = 1.5;  // footprint 288
  options.keep_ambiguous = true;
  const auto annotations = TilingHandSlide::annotations();
  const SlidePlan plan = plan_slide(slide, tissue, annotations, AnnotationClasses{}, options);
  EXPECT_DOUBLE_EQ(plan.footprint, 288.0);
  int tumour = 0, partial = 0;
  for (const auto& t : plan.tiles) {
    const double f = tumour_fraction(annotations, {}, static_cast<double>(t.x), static_cast<double>(t.y), 288.0, 96);
    EXPECT_FLOAT_EQ(t.tumour_fraction, static_cast<float>(f));
    EXPECT_EQ(t.label, f >= 0.5 ? 1 : 0);
    tumour += t.label;
    partial += f > 0 && f < 1;
  }
  EXPECT_GT(tumour, 5);
  EXPECT_GT(partial, 5);
  // The labelled tumour area agrees with the polygon's area (1 level-0 px² per 0.25 µm²).
  double area = 0;
  for (const auto& t : plan.tiles) area += t.tumour_fraction * 288.0 * 288.0;
  EXPECT_NEAR(area, io::annotation_area(annotations[0]), 0.01 * io::annotation_area(annotations[0]));
}

TEST_F(PreviewHandSlide, TumourTilesAreRed) {
  const io::Slide slide = io::Slide::open(path());
  const TissueMask tissue = detect_tissue(slide, TissueOptions{});
  GridOptions options;
  options.tile_size = 128;
  options.mpp = 1.0;
  options.keep_ambiguous = true;
  const auto annotations = TilingHandSlide::annotations();
  const SlidePlan plan = plan_slide(slide, tissue, annotations, AnnotationClasses{}, options);
  ASSERT_GT(plan.count(1), 0);

  const cv::Mat thumb = slide.thumbnail(1024);
  const cv::Mat preview = render_plan_preview(slide, tissue, plan, annotations, 1024);
  ASSERT_EQ(preview.type(), CV_8UC3);
  ASSERT_EQ(preview.size(), thumb.size());
  const double scale = static_cast<double>(slide.width()) / preview.cols;
  int tumour_checked = 0, normal_checked = 0;
  for (const auto& t : plan.tiles) {
    const cv::Point centre(static_cast<int>((static_cast<double>(t.x) + 128) / scale),
                           static_cast<int>((static_cast<double>(t.y) + 128) / scale));
    const cv::Vec3b p = preview.at<cv::Vec3b>(centre);
    const cv::Vec3b under = thumb.at<cv::Vec3b>(centre);
    if (t.label == 1 && t.tumour_fraction == 1.0f) {
      EXPECT_GT(p[0], p[1] + 80) << "tumour tile at " << t.x << "," << t.y;
      EXPECT_GT(p[0], p[2] + 60) << "tumour tile at " << t.x << "," << t.y;
      ++tumour_checked;
    } else if (t.label == 0 && t.tumour_fraction == 0.0f) {
      EXPECT_GT(p[1] - p[0], under[1] - under[0] + 40) << "normal tile at " << t.x << "," << t.y;
      ++normal_checked;
    }
  }
  EXPECT_GT(tumour_checked, 3);
  EXPECT_GT(normal_checked, 20);
  // Glass outside every tile is left as it was.
  EXPECT_EQ(preview.at<cv::Vec3b>(preview.rows / 2, preview.cols - 3),
            thumb.at<cv::Vec3b>(preview.rows / 2, preview.cols - 3));
}

TEST(Tiling, BlankSlidePlansNoTiles) {
  testing::TempDir dir;
  write_slide(dir.file("blank.tif"), cv::Mat(1536, 2048, CV_8UC3, kGlass), 0.5);
  const io::Slide slide = io::Slide::open(dir.file("blank.tif"));
  const TissueMask tissue = detect_tissue(slide, TissueOptions{});
  EXPECT_EQ(cv::countNonZero(tissue.mask), 0);
  const std::vector<io::Annotation> annotations = {polygon("_0", 100, 100, 900, 900)};
  SlidePlan plan = plan_slide(slide, tissue, annotations, AnnotationClasses{}, GridOptions{});
  EXPECT_TRUE(plan.tiles.empty());
  cap_tiles(plan, 10, 2.0, 1);
  EXPECT_TRUE(plan.tiles.empty());
  const cv::Mat preview = render_plan_preview(slide, tissue, plan, annotations, 512);
  EXPECT_EQ(preview.cols, 512);
  EXPECT_EQ(preview.rows, 384);
  // An empty mask object (never computed) plans nothing either.
  EXPECT_TRUE(plan_slide(slide, TissueMask{}, annotations, AnnotationClasses{}, GridOptions{}).tiles.empty());
}

TEST(Tiling, BadGridOptionsAreConfigErrors) {
  testing::TempDir dir;
  write_flat_slide(dir.file("flat.tif"), 512, 512, 0.5);
  const io::Slide slide = io::Slide::open(dir.file("flat.tif"));
  const TissueMask all = uniform_mask(slide, 16.0);
  GridOptions bad;
  bad.tile_size = 0;
  try {
    plan_slide(slide, all, {}, AnnotationClasses{}, bad);
    FAIL() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "tile_size");
  }
  bad = GridOptions{};
  bad.mpp = 0.0;
  EXPECT_THROW(plan_slide(slide, all, {}, AnnotationClasses{}, bad), core::ConfigError);
  bad = GridOptions{};
  bad.stride = -1;
  EXPECT_THROW(plan_slide(slide, all, {}, AnnotationClasses{}, bad), core::ConfigError);
}

// ---- capping ------------------------------------------------------------------------------------------------

// A 40×25 grid; tumour tiles where (x + 3y) % 10 == 0 (100 of 1000).
SlidePlan grid_plan(bool with_tumour) {
  SlidePlan plan;
  plan.footprint = 512;
  for (int y = 0; y < 25; ++y) {
    for (int x = 0; x < 40; ++x) {
      PlannedTile t;
      t.x = x * 512;
      t.y = y * 512;
      t.label = with_tumour && (x + 3 * y) % 10 == 0 ? 1 : 0;
      t.tumour_fraction = t.label;
      plan.tiles.push_back(t);
    }
  }
  return plan;
}

bool is_subset(const SlidePlan& small, const SlidePlan& big) {
  std::set<std::pair<std::int64_t, std::int64_t>> all;
  for (const auto& t : big.tiles) all.emplace(t.x, t.y);
  return std::all_of(small.tiles.begin(), small.tiles.end(), [&](const PlannedTile& t) {
    return all.count({t.x, t.y}) > 0;
  });
}

TEST(Tiling, CapKeepsTheRatioAndTheMaximum) {
  const SlidePlan full = grid_plan(true);
  ASSERT_EQ(full.count(1), 100);

  SlidePlan ratio = full;
  cap_tiles(ratio, 0, 2.0, 7);
  EXPECT_EQ(ratio.count(1), 100);
  EXPECT_EQ(ratio.count(0), 200);
  EXPECT_TRUE(row_major(ratio));
  EXPECT_TRUE(is_subset(ratio, full));

  SlidePlan both = full;
  cap_tiles(both, 150, 2.0, 7);
  EXPECT_EQ(both.tiles.size(), 150u);
  EXPECT_EQ(both.count(1), 50);  // the 1:2 balance survives the cap
  EXPECT_EQ(both.count(0), 100);
  EXPECT_TRUE(row_major(both));
  EXPECT_TRUE(is_subset(both, full));

  SlidePlan max_only = full;
  cap_tiles(max_only, 200, 0.0, 7);
  EXPECT_EQ(max_only.tiles.size(), 200u);
  EXPECT_EQ(max_only.count(1), 20);  // proportional to 100 : 900
  EXPECT_TRUE(row_major(max_only));

  SlidePlan none = full;
  cap_tiles(none, 0, 0.0, 7);
  EXPECT_EQ(none.tiles.size(), full.tiles.size());
  SlidePlan loose = full;
  cap_tiles(loose, 5000, 20.0, 7);
  EXPECT_EQ(loose.tiles.size(), full.tiles.size());
}

TEST(Tiling, CapWithoutTumourKeepsUpToTheMaximum) {
  SlidePlan normal = grid_plan(false);
  cap_tiles(normal, 0, 3.0, 1);
  EXPECT_EQ(normal.tiles.size(), 1000u);  // no tumour: the ratio does not apply
  cap_tiles(normal, 120, 3.0, 1);
  EXPECT_EQ(normal.tiles.size(), 120u);
  EXPECT_EQ(normal.count(0), 120);
  EXPECT_TRUE(row_major(normal));
}

TEST(Tiling, CapIsDeterministicForTheSeed) {
  const auto capped = [](std::uint64_t seed) {
    SlidePlan plan = grid_plan(true);
    cap_tiles(plan, 90, 2.0, seed);
    std::vector<std::pair<std::int64_t, std::int64_t>> xy;
    for (const auto& t : plan.tiles) xy.emplace_back(t.x, t.y);
    return xy;
  };
  const auto a = capped(42);
  EXPECT_EQ(a.size(), 90u);
  EXPECT_EQ(a, capped(42));
  EXPECT_NE(a, capped(43));
  // The subset is spread over the slide, not the first rows.
  std::set<std::int64_t> rows;
  for (const auto& [x, y] : a) rows.insert(y);
  EXPECT_GT(rows.size(), 15u);
}

// ---- a synthetic tumour slide end to end --------------------------------------------------------------------

TEST(Tiling, SyntheticTumourSlideLabelsFollowTheGroundTruth) {
  testing::TempDir dir;
  synth::SynthSlideOptions synth;
  synth.width = 8192;
  synth.height = 8192;
  synth.mpp = 0.5;
  synth.seed = 7;
  synth.max_tumour_regions = 4;
  const synth::SynthGroundTruth truth = synth::write_synthetic_slide(dir.file("synth.tif"), synth);
  const io::Slide slide = io::Slide::open(dir.file("synth.tif"));
  const TissueMask tissue = detect_tissue(slide, TissueOptions{});

  std::vector<io::Annotation> annotations = truth.tumour;
  annotations.insert(annotations.end(), truth.exclusion.begin(), truth.exclusion.end());
  GridOptions options;
  options.tile_size = 128;
  options.mpp = 1.0;  // footprint 256
  const SlidePlan plan = plan_slide(slide, tissue, annotations, AnnotationClasses{}, options);
  ASSERT_GT(plan.count(1), 0);
  ASSERT_GT(plan.count(0), 0);
  EXPECT_TRUE(row_major(plan));
  for (const auto& t : plan.tiles) {
    EXPECT_GE(t.tissue_fraction, options.min_tissue);
    const double f = tumour_fraction(truth.tumour, truth.exclusion, static_cast<double>(t.x), static_cast<double>(t.y),
                                     plan.footprint, options.tile_size);
    EXPECT_FLOAT_EQ(t.tumour_fraction, static_cast<float>(f));
    EXPECT_EQ(t.label, f >= 0.5 ? 1 : 0);
    if (t.label == 0) {
      EXPECT_EQ(t.tumour_fraction, 0.0f);  // ambiguous tiles are dropped by default
    }
  }
  // Tumour tiles cannot hold more tumour than the ground truth has.
  const double tile_mm2 = std::pow(plan.footprint * slide.mpp() / 1000.0, 2);
  double labelled_mm2 = 0;
  for (const auto& t : plan.tiles) labelled_mm2 += t.tumour_fraction * tile_mm2;
  EXPECT_LE(labelled_mm2, truth.tumour_area_mm2 * 1.01);

  SlidePlan capped = plan;
  cap_tiles(capped, 0, 1.0, 3);
  EXPECT_LE(capped.count(0), capped.count(1));

  const cv::Mat preview = render_plan_preview(slide, tissue, plan, truth.tumour, 1200);
  EXPECT_EQ(preview.cols, 1200);
  // For a person to look at: TESSERA_PLAN_PREVIEW=/some/file.png keeps the preview.
  if (const char* out = std::getenv("TESSERA_PLAN_PREVIEW")) io::write_png(out, preview);
}

}  // namespace
}  // namespace tessera::prep
