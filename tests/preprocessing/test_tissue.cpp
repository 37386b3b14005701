#include "preprocessing/tissue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "io/slide.h"
#include "io/tiff_writer.h"
#include "synth/synth.h"
#include "tests/testing/testing.h"

namespace tessera::prep {
namespace {

// Hand-made slides: near-white glass with H&E-coloured tissue drawn where we want it, so the drawn shapes are
// the exact oracle for the mask.
const cv::Scalar kGlass(244, 243, 246);
const cv::Scalar kEosin(236, 170, 210);
const cv::Scalar kNucleus(98, 64, 150);
// Marker inks as they look on glass (RGB).
const cv::Scalar kGreenInk(20, 125, 60);
const cv::Scalar kBlueInk(30, 55, 165);
const cv::Scalar kBlackInk(35, 35, 40);

constexpr double kSlideMpp = 1.0;
constexpr int kWidth = 4096;
constexpr int kHeight = 3072;

cv::Mat glass(int width, int height, const cv::Scalar& colour, std::uint64_t seed) {
  cv::Mat image(height, width, CV_32FC3, colour);
  cv::Mat noise(height, width, CV_32FC3);
  cv::RNG rng(seed);
  rng.fill(noise, cv::RNG::NORMAL, 0.0, 2.0);
  image += noise;
  cv::Mat out;
  image.convertTo(out, CV_8UC3);
  return out;
}

// Eosin-pink tissue with dark-purple nuclei inside `shape` (255 = tissue).
void paint_tissue(cv::Mat& rgb, const cv::Mat1b& shape, std::uint64_t seed) {
  cv::Mat tissue(rgb.size(), CV_8UC3, kEosin);
  cv::RNG rng(seed);
  const int nuclei = rgb.cols * rgb.rows / 300;
  for (int k = 0; k < nuclei; ++k) {
    cv::circle(tissue, cv::Point(rng.uniform(0, rgb.cols), rng.uniform(0, rgb.rows)), rng.uniform(2, 5), kNucleus,
               cv::FILLED);
  }
  tissue.copyTo(rgb, shape);
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

// The drawn shape at mask resolution (area-averaged, then half-covered pixels count).
cv::Mat1b at_mask_resolution(const cv::Mat1b& shape, const TissueMask& tissue) {
  cv::Mat1b small;
  cv::resize(shape, small, tissue.mask.size(), 0, 0, cv::INTER_AREA);
  return small >= 128;
}

double iou(const cv::Mat1b& a, const cv::Mat1b& b) {
  const double inter = cv::countNonZero(a & b);
  const double uni = cv::countNonZero(a | b);
  return uni == 0 ? 1.0 : inter / uni;
}

// Share of `region` (255 = inside) covered by the mask.
double coverage(const cv::Mat1b& mask, const cv::Mat1b& region) {
  const int n = cv::countNonZero(region);
  return n == 0 ? 0.0 : static_cast<double>(cv::countNonZero(mask & region)) / n;
}

// Two tissue sections: an ellipse and a pentagon.
cv::Mat1b two_sections() {
  cv::Mat1b shape = cv::Mat1b::zeros(kHeight, kWidth);
  cv::ellipse(shape, cv::Point(1300, 1400), cv::Size(900, 650), 20.0, 0, 360, cv::Scalar(255), cv::FILLED);
  const std::vector<cv::Point> pentagon = {{2900, 600}, {3700, 900}, {3600, 1900}, {2800, 2200}, {2500, 1300}};
  cv::fillPoly(shape, std::vector<std::vector<cv::Point>>{pentagon}, cv::Scalar(255));
  return shape;
}

// The mask's area average from a level an integer factor finer: OpenCV's INTER_AREA pixels exactly (its naive twin),
// on odd sizes, random pixels (fixed seed), blocks of one value and blocks exactly halfway between two values,
// written whole, into a view, or over its own source.
TEST(Tissue, AreaAverageGivesOpenCvsPixels) {
  cv::RNG rng(19);
  for (const int factor : {3, 4, 5, 6, 8}) {
    for (const cv::Size size : {cv::Size(1, 1), cv::Size(7, 13), cv::Size(31, 5)}) {
      cv::Mat src(size.height * factor, size.width * factor, CV_8UC3);
      rng.fill(src, cv::RNG::UNIFORM, 0, 256);
      // The first row of blocks: half of each block's rows v, half v + 1, so that for an even factor each block's
      // average is exactly v + ½ (rounded to even, as OpenCV does); the second row of blocks: one value each.
      for (int r = 0; r < std::min(src.rows, factor); ++r) {
        src.row(r).setTo(r < factor / 2 ? cv::Scalar(126, 127, 254) : cv::Scalar(127, 128, 255));
      }
      for (int r = factor; r < std::min(src.rows, 2 * factor); ++r) src.row(r).setTo(cv::Scalar(127, 128, 255));
      cv::Mat expected;
      cv::resize(src, expected, size, 0, 0, cv::INTER_AREA);
      cv::Mat got;
      area_average(src, got, factor);
      ASSERT_EQ(got.size(), size);
      EXPECT_EQ(cv::norm(got, expected, cv::NORM_INF), 0.0) << "factor " << factor << ", " << size;
      cv::Mat canvas(size.height + 2, size.width, CV_8UC3, cv::Scalar::all(7));
      cv::Mat view = canvas.rowRange(1, size.height + 1);
      area_average(src, view, factor);
      EXPECT_EQ(view.data, canvas.ptr(1)) << "written into the view";
      EXPECT_EQ(cv::norm(view, expected, cv::NORM_INF), 0.0) << "factor " << factor << ", " << size;
      cv::Mat same = src.clone();
      area_average(same, same, factor);
      EXPECT_EQ(cv::norm(same, expected, cv::NORM_INF), 0.0) << "over its source, factor " << factor << ", " << size;
    }
  }
  cv::Mat out;
  EXPECT_THROW(area_average(cv::Mat(9, 8, CV_8UC3), out, 4), core::InternalError) << "9 rows: not a multiple of 4";
  EXPECT_THROW(area_average(cv::Mat(8, 8, CV_8UC3), out, 2), core::InternalError) << "a factor of 2 is OpenCV's";
}

TEST(Tissue, MaskCoversDrawnTissueAndNotGlass) {
  testing::TempDir dir;
  const cv::Mat1b shape = two_sections();
  cv::Mat rgb = glass(kWidth, kHeight, kGlass, 1);
  paint_tissue(rgb, shape, 2);
  write_slide(dir.file("sections.tif"), rgb, kSlideMpp);
  const io::Slide slide = io::Slide::open(dir.file("sections.tif"));

  const TissueMask tissue = detect_tissue(slide, TissueOptions{});
  ASSERT_EQ(tissue.mask.type(), CV_8U);
  EXPECT_EQ(tissue.mask.cols, kWidth / 8);
  EXPECT_EQ(tissue.mask.rows, kHeight / 8);
  EXPECT_DOUBLE_EQ(tissue.downsample, 8.0);
  EXPECT_DOUBLE_EQ(tissue.mpp, 8.0);

  const cv::Mat1b truth = at_mask_resolution(shape, tissue);
  EXPECT_GT(iou(tissue.mask, truth), 0.9);
  // Glass a few mask pixels away from the sections is never tissue.
  cv::Mat1b near_tissue;
  cv::dilate(truth, near_tissue, cv::getStructuringElement(cv::MORPH_ELLIPSE, cv::Size(7, 7)));
  EXPECT_EQ(cv::countNonZero(tissue.mask & ~near_tissue), 0);
  // Both sections are found, each as one piece.
  cv::Mat labels;
  EXPECT_EQ(cv::connectedComponents(tissue.mask, labels, 8), 3);
  EXPECT_NEAR(tissue.tissue_fraction(), cv::countNonZero(truth) / static_cast<double>(truth.total()), 0.02);
  const double truth_mm2 = cv::countNonZero(shape) * 1e-6;  // 1 µm² per level-0 pixel
  EXPECT_NEAR(tissue.tissue_area_mm2(), truth_mm2, 0.05 * truth_mm2);
}

TEST(Tissue, MaskSizeAndDownsampleFollowTheChosenSize) {
  testing::TempDir dir;
  // Not a multiple of the mask pixel: 1030 µm / 8 = 128.75 → 129 columns.
  cv::Mat rgb = glass(1030, 777, kGlass, 3);
  cv::Mat1b shape = cv::Mat1b::zeros(rgb.size());
  cv::circle(shape, cv::Point(500, 400), 250, cv::Scalar(255), cv::FILLED);
  paint_tissue(rgb, shape, 4);
  write_slide(dir.file("odd.tif"), rgb, kSlideMpp);
  const io::Slide slide = io::Slide::open(dir.file("odd.tif"));

  const TissueMask tissue = detect_tissue(slide, TissueOptions{});
  EXPECT_EQ(tissue.mask.cols, 129);
  EXPECT_EQ(tissue.mask.rows, 98);  // ceil(777 / 8)
  EXPECT_DOUBLE_EQ(tissue.downsample, 1030.0 / 129.0);
  EXPECT_DOUBLE_EQ(tissue.mpp, kSlideMpp * 1030.0 / 129.0);
  EXPECT_GT(iou(tissue.mask, at_mask_resolution(shape, tissue)), 0.9);

  // A mask finer than the slide is made at the slide's own resolution.
  TissueOptions fine;
  fine.mask_mpp = 0.5;
  const TissueMask full = detect_tissue(slide, fine);
  EXPECT_EQ(full.mask.cols, 1030);
  EXPECT_EQ(full.mask.rows, 777);
  EXPECT_DOUBLE_EQ(full.downsample, 1.0);
  EXPECT_DOUBLE_EQ(full.mpp, kSlideMpp);
}

// Glass with a scanner's colour cast that darkens towards the corners (vignetting), as on the synthetic
// slides: saturation 0.06 in the centre to about 0.1 in the corners, 35..55 RGB units from white. Otsu alone
// would split this smooth ramp in two.
cv::Mat vignetted_glass(int width, int height) {
  cv::Mat image(height, width, CV_32FC3);
  for (int r = 0; r < height; ++r) {
    for (int c = 0; c < width; ++c) {
      const double d = std::hypot(r - height / 2.0, c - width / 2.0) / std::hypot(height / 2.0, width / 2.0);
      image.at<cv::Vec3f>(r, c) = cv::Vec3f(static_cast<float>(226 - 14 * d), static_cast<float>(236 - 10 * d),
                                            static_cast<float>(241 - 6 * d));
    }
  }
  cv::Mat out;
  image.convertTo(out, CV_8UC3);
  return out;
}

TEST(Tissue, BlankSlideGivesAnEmptyMask) {
  testing::TempDir dir;
  const std::vector<cv::Mat> glasses = {glass(2048, 1536, kGlass, 5), vignetted_glass(2048, 1536)};
  for (std::size_t i = 0; i < glasses.size(); ++i) {
    SCOPED_TRACE("glass " + std::to_string(i));
    const std::string path = dir.file("blank" + std::to_string(i) + ".tif");
    write_slide(path, glasses[i], kSlideMpp);
    const io::Slide slide = io::Slide::open(path);
    TissueMask tissue;
    ASSERT_NO_THROW(tissue = detect_tissue(slide, TissueOptions{}));
    EXPECT_EQ(tissue.mask.cols, 256);
    EXPECT_EQ(tissue.mask.rows, 192);
    EXPECT_EQ(cv::countNonZero(tissue.mask), 0);
    EXPECT_EQ(tissue.tissue_fraction(), 0.0);
    EXPECT_EQ(tissue.tissue_area_mm2(), 0.0);
  }
  // The same cast glass with a tissue section on it still gives the section.
  cv::Mat rgb = vignetted_glass(2048, 1536);
  cv::Mat1b shape = cv::Mat1b::zeros(rgb.size());
  cv::circle(shape, cv::Point(900, 700), 450, cv::Scalar(255), cv::FILLED);
  paint_tissue(rgb, shape, 9);
  cv::Mat small;
  cv::resize(rgb, small, cv::Size(256, 192), 0, 0, cv::INTER_AREA);
  const TissueMask tissue = detect_tissue(small, 8.0, 8.0 * kSlideMpp, TissueOptions{});
  EXPECT_GT(iou(tissue.mask, at_mask_resolution(shape, tissue)), 0.9);
}

TEST(Tissue, SlideWithoutPyramidIsReadInBands) {
  // One level only, larger than one read band (2^24 pixels): the mask must come out as from a pyramid.
  testing::TempDir dir;
  constexpr int kW = 4608;
  constexpr int kH = 4096;
  cv::Mat rgb = glass(kW, kH, kGlass, 10);
  cv::Mat1b shape = cv::Mat1b::zeros(kH, kW);
  // A section in the top half and one across the lower rows, where the second band starts (mask row 455).
  cv::ellipse(shape, cv::Point(1500, 1300), cv::Size(1000, 800), -30.0, 0, 360, cv::Scalar(255), cv::FILLED);
  cv::ellipse(shape, cv::Point(2900, 3500), cv::Size(1400, 450), 0.0, 0, 360, cv::Scalar(255), cv::FILLED);
  paint_tissue(rgb, shape, 11);
  io::TiffWriterOptions flat;
  flat.mpp = kSlideMpp;
  flat.min_level_size = 8192;
  io::TiffWriter writer(dir.file("flat.tif"), kW, kH, flat);
  for (int y0 = 0; y0 < kH; y0 += flat.tile_size) writer.write_strip(rgb.rowRange(y0, y0 + flat.tile_size).clone());
  writer.finish();
  const io::Slide slide = io::Slide::open(dir.file("flat.tif"));
  ASSERT_EQ(slide.level_count(), 1);

  const TissueMask tissue = detect_tissue(slide, TissueOptions{});
  EXPECT_EQ(tissue.mask.cols, kW / 8);
  EXPECT_EQ(tissue.mask.rows, kH / 8);
  const cv::Mat1b truth = at_mask_resolution(shape, tissue);
  EXPECT_GT(iou(tissue.mask, truth), 0.95);
  const cv::Range bottom(440, tissue.mask.rows);
  ASSERT_GT(cv::countNonZero(truth.rowRange(bottom)), 1000);
  EXPECT_GT(iou(tissue.mask.rowRange(bottom), truth.rowRange(bottom)), 0.9);
}

// A pyramid whose levels coarser than `kept_mpp` are blank (white): the extreme of low levels that another program made
// with a filter of its own.
class BlankCoarseLevels : public io::TileSource {
 public:
  BlankCoarseLevels(const cv::Mat& image, const io::TiffWriter& writer, double mpp, double kept_mpp) {
    cv::Mat level = image;
    for (int k = 0; k < writer.level_count(); ++k) {
      if (k > 0) level = io::downsample_for_pyramid(level, writer.level_factor());
      EXPECT_EQ(level.cols, writer.level_width(k));
      EXPECT_EQ(level.rows, writer.level_height(k));
      const bool kept = mpp * std::pow(writer.level_factor(), k) <= kept_mpp;
      levels_.push_back(kept ? level : cv::Mat(level.size(), CV_8UC3, cv::Scalar(255, 255, 255)));
    }
  }
  void describe_tile(int level, std::int64_t x0, std::int64_t y0, int width, int height, std::string& key) override {
    key = std::to_string(level) + " " + std::to_string(x0) + " " + std::to_string(y0) + " " + std::to_string(width) +
          " " + std::to_string(height);
  }
  void render_tile(int level, std::int64_t x0, std::int64_t y0, int width, int height, cv::Mat& tile) override {
    const cv::Mat& pixels = levels_[static_cast<std::size_t>(level)];
    const cv::Rect inside =
        cv::Rect(static_cast<int>(x0), static_cast<int>(y0), width, height) & cv::Rect(0, 0, pixels.cols, pixels.rows);
    cv::copyMakeBorder(pixels(inside), tile, 0, height - inside.height, 0, width - inside.width, cv::BORDER_REPLICATE);
  }

 private:
  std::vector<cv::Mat> levels_;
};

// The mask at 8 µm/px is area-averaged from a level at least 4x finer (here 2 µm/px), never read from the
// pyramid's own coarser levels, whatever filter made them: a slide whose levels coarser than 2 µm/px are blank gets
// the mask of the same image without a pyramid.
TEST(Tissue, MaskIsAveragedFromALevelFourTimesFinerThanIt) {
  testing::TempDir dir;
  cv::Mat rgb = glass(2048, 1536, kGlass, 12);
  cv::Mat1b shape = cv::Mat1b::zeros(rgb.size());
  cv::ellipse(shape, cv::Point(1000, 700), cv::Size(600, 450), 20.0, 0, 360, cv::Scalar(255), cv::FILLED);
  paint_tissue(rgb, shape, 13);
  io::TiffWriterOptions options;
  options.mpp = kSlideMpp;
  options.compression = io::TiffCompression::deflate;  // write_tiles() writes deflate tiles
  io::TiffWriter writer(dir.file("pyramid.tif"), rgb.cols, rgb.rows, options);
  ASSERT_EQ(writer.level_count(), 3);  // 1, 2 and 4 µm/px
  BlankCoarseLevels source(rgb, writer, kSlideMpp, 2.0);
  writer.write_tiles(source);
  writer.finish();
  options.min_level_size = 4096;  // one level
  io::TiffWriter flat_writer(dir.file("flat.tif"), rgb.cols, rgb.rows, options);
  for (int y0 = 0; y0 < rgb.rows; y0 += options.tile_size) {
    flat_writer.write_strip(rgb.rowRange(y0, std::min(rgb.rows, y0 + options.tile_size)).clone());
  }
  flat_writer.finish();
  const io::Slide pyramid = io::Slide::open(dir.file("pyramid.tif"));
  const io::Slide flat = io::Slide::open(dir.file("flat.tif"));
  ASSERT_EQ(pyramid.level_count(), 3);
  ASSERT_EQ(flat.level_count(), 1);
  const TissueMask a = detect_tissue(pyramid, TissueOptions{});
  const TissueMask b = detect_tissue(flat, TissueOptions{});
  ASSERT_EQ(a.mask.size(), b.mask.size());
  EXPECT_GT(iou(a.mask, at_mask_resolution(shape, a)), 0.9);
  EXPECT_GT(iou(a.mask, b.mask), 0.98);
}

TEST(Tissue, PenMarksAreRejectedOnlyWhenAsked) {
  testing::TempDir dir;
  cv::Mat rgb = glass(kWidth, kHeight, kGlass, 6);
  cv::Mat1b section = cv::Mat1b::zeros(kHeight, kWidth);
  cv::ellipse(section, cv::Point(1500, 1500), cv::Size(800, 600), 0.0, 0, 360, cv::Scalar(255), cv::FILLED);
  paint_tissue(rgb, section, 7);
  // Marker strokes on the glass, about 60 µm wide, as pathologists circle regions.
  struct Stroke {
    std::vector<cv::Point> points;
    cv::Scalar ink;
  };
  const std::vector<Stroke> strokes = {{{{2700, 300}, {3300, 700}, {3900, 500}}, kGreenInk},
                                       {{{2700, 1500}, {3200, 2300}, {3900, 2600}}, kBlueInk},
                                       {{{300, 2650}, {1200, 2900}, {2200, 2700}}, kBlackInk}};
  std::vector<cv::Mat1b> stroke_shapes;
  for (const auto& s : strokes) {
    cv::Mat1b shape = cv::Mat1b::zeros(kHeight, kWidth);
    cv::polylines(shape, std::vector<std::vector<cv::Point>>{s.points}, false, cv::Scalar(255), 60);
    rgb.setTo(s.ink, shape);
    stroke_shapes.push_back(shape);
  }
  write_slide(dir.file("pen.tif"), rgb, kSlideMpp);
  const io::Slide slide = io::Slide::open(dir.file("pen.tif"));

  TissueOptions keep;
  keep.reject_pen_marks = false;
  TissueOptions reject;
  reject.reject_pen_marks = true;
  const TissueMask kept = detect_tissue(slide, keep);
  const TissueMask rejected = detect_tissue(slide, reject);

  const cv::Mat1b truth = at_mask_resolution(section, rejected);
  EXPECT_GT(iou(rejected.mask, truth), 0.9) << "H&E must survive pen rejection";
  for (std::size_t i = 0; i < strokes.size(); ++i) {
    SCOPED_TRACE("stroke " + std::to_string(i));
    const cv::Mat1b ink = at_mask_resolution(stroke_shapes[i], rejected);
    EXPECT_LT(coverage(rejected.mask, ink), 0.01);
    if (i < 2) {
      // Coloured ink is saturated and far from white: without rejection it passes as tissue.
      EXPECT_GT(coverage(kept.mask, ink), 0.5);
    }
  }
}

TEST(Tissue, SpecksAreRemovedAndSmallHolesFilled) {
  // Directly at 8 µm/px: 1 mask pixel = 64 µm².
  constexpr double kMpp = 8.0;
  cv::Mat rgb = glass(400, 300, kGlass, 8);
  cv::circle(rgb, cv::Point(150, 150), 110, kEosin, cv::FILLED);
  cv::circle(rgb, cv::Point(110, 150), 6, kGlass, cv::FILLED);   // ≈ 113 px ≈ 7200 µm²: filled
  cv::circle(rgb, cv::Point(190, 150), 22, kGlass, cv::FILLED);  // ≈ 1520 px ≈ 97000 µm²: stays a hole
  cv::circle(rgb, cv::Point(330, 50), 5, kEosin, cv::FILLED);    // ≈ 80 px ≈ 5000 µm²: a speck, removed
  cv::circle(rgb, cv::Point(330, 220), 25, kEosin, cv::FILLED);  // ≈ 1960 px ≈ 125000 µm²: kept

  const TissueMask tissue = detect_tissue(rgb, 32.0, kMpp, TissueOptions{});
  EXPECT_DOUBLE_EQ(tissue.downsample, 32.0);
  EXPECT_DOUBLE_EQ(tissue.mpp, kMpp);
  EXPECT_EQ(tissue.mask.at<std::uint8_t>(150, 110), 255) << "small hole filled";
  EXPECT_EQ(tissue.mask.at<std::uint8_t>(150, 190), 0) << "large hole kept";
  EXPECT_EQ(tissue.mask.at<std::uint8_t>(50, 330), 0) << "speck removed";
  EXPECT_EQ(tissue.mask.at<std::uint8_t>(220, 330), 255) << "object above the minimum kept";
  EXPECT_EQ(tissue.mask.at<std::uint8_t>(150, 60), 255);
  EXPECT_EQ(tissue.mask.at<std::uint8_t>(10, 10), 0);

  // With the limits lowered, the speck stays and the small hole stays open.
  TissueOptions lenient;
  lenient.min_object_um2 = 1000.0;
  lenient.max_hole_um2 = 1000.0;
  const TissueMask raw = detect_tissue(rgb, 32.0, kMpp, lenient);
  EXPECT_EQ(raw.mask.at<std::uint8_t>(50, 330), 255);
  EXPECT_EQ(raw.mask.at<std::uint8_t>(150, 110), 0);
}

TEST(Tissue, SyntheticSlideMatchesItsGroundTruth) {
  testing::TempDir dir;
  synth::SynthSlideOptions options;
  options.width = 4096;
  options.height = 4096;
  options.mpp = 1.0;
  options.seed = 21;
  options.folds = true;
  const synth::SynthGroundTruth truth = synth::write_synthetic_slide(dir.file("synth.tif"), options);
  const io::Slide slide = io::Slide::open(dir.file("synth.tif"));
  const TissueMask tissue = detect_tissue(slide, TissueOptions{});

  EXPECT_NEAR(tissue.tissue_area_mm2(), truth.tissue_area_mm2, 0.05 * truth.tissue_area_mm2);
  // The annotated tumour lies on detected tissue.
  ASSERT_FALSE(truth.tumour.empty());
  cv::Mat1b tumour = cv::Mat1b::zeros(tissue.mask.size());
  for (const auto& a : truth.tumour) {
    std::vector<cv::Point> ring;
    for (const auto& p : a.outer) {
      ring.emplace_back(static_cast<int>(p.x / tissue.downsample), static_cast<int>(p.y / tissue.downsample));
    }
    cv::fillPoly(tumour, std::vector<std::vector<cv::Point>>{ring}, cv::Scalar(255));
  }
  EXPECT_GT(coverage(tissue.mask, tumour), 0.97);
}

}  // namespace
}  // namespace tessera::prep
