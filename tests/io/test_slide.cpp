// Tests of the OpenSlide-based reader on slides made by TiffWriter (both flavours, both compressions,
// power-of-two and other pyramids), on TIFFs written directly with libtiff (resolution variants) and on the
// data-driven broken files under tests/data/slides/<case>/ (input file + expected.txt with the error text).
#include "io/slide.h"

#include <tiffio.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "io/provenance.h"
#include "io/tiff_writer.h"
#include "tests/testing/testing.h"

namespace tessera::io {
namespace {

using testing::pattern_pixel;
using testing::TempDir;

constexpr double kMpp = 0.25;
// The pattern's blue channel wraps from 210 to 40 along the lines x + 2y = k·1500; JPEG rings there and
// averaging mixes both sides, so samples keep away from it.
constexpr double kPatternWrap = 1500.0;

// Largest channel error of JPEG at quality 85 (4:2:0) on the smooth part of the pattern, after averaging.
constexpr double kJpegTolerance = 16.0;

const cv::Vec3b kWhite(255, 255, 255);
const cv::Vec3b kLabelColour(10, 200, 30);

// Writes the pattern slide like testing::write_pattern_slide, plus a label and a macro image.
void write_slide(const std::string& path, std::int64_t width, std::int64_t height, const TiffWriterOptions& options) {
  TiffWriter writer(path, width, height, options);
  writer.add_associated_image("label", cv::Mat(100, 200, CV_8UC3, cv::Scalar(kLabelColour)));
  writer.add_associated_image("macro", cv::Mat(150, 400, CV_8UC3, cv::Scalar(200, 20, 30)));
  for (std::int64_t y0 = 0; y0 < height; y0 += options.tile_size) {
    const int rows = static_cast<int>(std::min<std::int64_t>(options.tile_size, height - y0));
    cv::Mat strip(rows, static_cast<int>(width), CV_8UC3);
    for (int r = 0; r < rows; ++r) {
      for (int x = 0; x < strip.cols; ++x) strip.at<cv::Vec3b>(r, x) = pattern_pixel(x, y0 + r);
    }
    writer.write_strip(strip);
  }
  writer.finish();
}

// The pattern averaged over the level-0 square [x0, x0+size)², clamped to the slide as the writer's edge
// replication does.
cv::Vec3d pattern_mean(double x0, double y0, double size_x, double size_y, std::int64_t width, std::int64_t height) {
  cv::Vec3d sum(0, 0, 0);
  int n = 0;
  const auto first_x = static_cast<std::int64_t>(std::floor(x0));
  const auto first_y = static_cast<std::int64_t>(std::floor(y0));
  const auto last_x = static_cast<std::int64_t>(std::ceil(x0 + size_x));
  const auto last_y = static_cast<std::int64_t>(std::ceil(y0 + size_y));
  for (std::int64_t y = first_y; y < last_y; ++y) {
    for (std::int64_t x = first_x; x < last_x; ++x) {
      const cv::Vec3b p = pattern_pixel(std::min(x, width - 1), std::min(y, height - 1));
      sum += cv::Vec3d(p[0], p[1], p[2]);
      ++n;
    }
  }
  return sum / n;
}

// True when the level-0 square [x, x+size)², widened by `margin` on every side, crosses the pattern's wrap line.
bool near_wrap(double x, double y, double size, double margin) {
  const double low = (x - margin) + 2.0 * (y - margin);
  const double high = (x + size + margin) + 2.0 * (y + size + margin);
  return std::floor(low / kPatternWrap) != std::floor(high / kPatternWrap);
}

// The largest channel difference; blue is left out where it is unreliable (next to the wrap line).
double max_channel_diff(const cv::Vec3b& actual, const cv::Vec3d& expected, bool with_blue = true) {
  double d = 0.0;
  for (int c = 0; c < (with_blue ? 3 : 2); ++c) d = std::max(d, std::abs(actual[c] - expected[c]));
  return d;
}

struct Format {
  const char* name;
  TiffFlavor flavor;
  TiffCompression compression;
  int factor;
  std::int64_t width;
  std::int64_t height;
};

std::ostream& operator<<(std::ostream& os, const Format& f) { return os << f.name; }

class SlidePyramid : public ::testing::TestWithParam<Format> {
 protected:
  void SetUp() override {
    const Format& f = GetParam();
    options_.flavor = f.flavor;
    options_.compression = f.compression;
    options_.level_factor = f.factor;
    options_.min_level_size = 200;
    options_.mpp = kMpp;
    path_ = dir_.file(f.flavor == TiffFlavor::aperio ? "slide.svs" : "slide.tif");
    write_slide(path_, f.width, f.height, options_);
  }

  // JPEG at quality 85 with 4:2:0 chroma; deflate is lossless (the pyramid's rounding and OpenSlide's
  // sub-pixel placement on non-integer downsamples remain).
  bool lossless() const { return GetParam().compression == TiffCompression::deflate; }
  // On coarse levels the pattern's red changes by up to F·100/97 per pixel (F = level-0 pixels per level
  // pixel), and JPEG halves the chroma resolution, so its error grows with F.
  double tolerance(double factor_power = 1.0) const { return lossless() ? 3.0 : kJpegTolerance + factor_power / 3.0; }

  TempDir dir_;
  TiffWriterOptions options_;
  std::string path_;
};

TEST_P(SlidePyramid, ReportsVendorLevelsAndResolution) {
  const Format& f = GetParam();
  const Slide slide = Slide::open(path_);
  const bool aperio = f.flavor == TiffFlavor::aperio;
  EXPECT_EQ(slide.vendor(), aperio ? "aperio" : "generic-tiff");
  EXPECT_EQ(slide.width(), f.width);
  EXPECT_EQ(slide.height(), f.height);

  std::int64_t w = f.width;
  std::int64_t h = f.height;
  int expected_levels = 1;
  while (w > options_.min_level_size || h > options_.min_level_size) {
    w = (w + f.factor - 1) / f.factor;
    h = (h + f.factor - 1) / f.factor;
    ++expected_levels;
  }
  ASSERT_EQ(slide.level_count(), expected_levels);
  w = f.width;
  h = f.height;
  double factor_power = 1.0;
  for (int i = 0; i < slide.level_count(); ++i) {
    SCOPED_TRACE("level " + std::to_string(i));
    const SlideLevel& level = slide.level(i);
    EXPECT_EQ(level.width, w);
    EXPECT_EQ(level.height, h);
    // OpenSlide's downsample is the mean of the two axes' ratios; ceil division keeps it near factor^i.
    const double ratio = 0.5 * (static_cast<double>(f.width) / w + static_cast<double>(f.height) / h);
    EXPECT_DOUBLE_EQ(level.downsample, ratio);
    EXPECT_NEAR(level.downsample, factor_power, factor_power * 0.02);
    // A level smaller than a tile has smaller tiles (a workaround for OpenSlide 3.4.1 with libtiff 4.5).
    EXPECT_EQ(level.tile_width, w >= 256 ? 256 : w / 16 * 16);
    EXPECT_EQ(level.tile_height, h >= 256 ? 256 : h / 16 * 16);
    w = (w + f.factor - 1) / f.factor;
    h = (h + f.factor - 1) / f.factor;
    factor_power *= f.factor;
  }
  EXPECT_THROW(slide.level(slide.level_count()), core::Error);

  EXPECT_DOUBLE_EQ(slide.mpp(), kMpp);
  EXPECT_DOUBLE_EQ(slide.mpp_y(), kMpp);
  EXPECT_EQ(slide.mpp_source(), aperio ? MppSource::openslide_property : MppSource::tiff_resolution);
  if (aperio) {
    ASSERT_TRUE(slide.objective_power().has_value());
    EXPECT_DOUBLE_EQ(*slide.objective_power(), 40.0);
    EXPECT_EQ(slide.property("aperio.MPP").value_or(""), "0.25");
  } else {
    EXPECT_FALSE(slide.objective_power().has_value());
    EXPECT_EQ(slide.property("tiff.ResolutionUnit").value_or(""), "centimeter");
  }
  EXPECT_EQ(slide.property("openslide.vendor").value_or(""), slide.vendor());
  EXPECT_FALSE(slide.property("no.such.property").has_value());
}

TEST_P(SlidePyramid, PixelsMatchThePatternOnEveryLevel) {
  const Format& f = GetParam();
  const Slide slide = Slide::open(path_);
  constexpr int kBlock = 4;
  const double fractions[] = {0.1, 0.3, 0.5, 0.7, 0.9};
  double factor_power = 1.0;
  for (int i = 0; i < slide.level_count(); ++i, factor_power *= f.factor) {
    SCOPED_TRACE("level " + std::to_string(i));
    const SlideLevel& level = slide.level(i);
    double worst = 0.0;
    int checked = 0;
    for (double fy : fractions) {
      for (double fx : fractions) {
        const auto lx = static_cast<std::int64_t>(fx * static_cast<double>(level.width - kBlock));
        const auto ly = static_cast<std::int64_t>(fy * static_cast<double>(level.height - kBlock));
        // Level pixel lx holds the average of level-0 pixels [lx·F, (lx+1)·F) (F = factor^i); OpenSlide
        // places it at level-0 x = lx·downsample, its downsample being the mean of both axes' ratios.
        const double x0 = static_cast<double>(lx) * factor_power;
        const double y0 = static_cast<double>(ly) * factor_power;
        // JPEG rings up to a 16-pixel MCU away from the wrap; lossless levels are only blurred across it by
        // OpenSlide's sub-pixel placement.
        const double margin = (lossless() ? 2 : 16) * factor_power;
        const bool with_blue = !near_wrap(x0, y0, kBlock * factor_power, margin);
        const cv::Mat block =
            slide.read_region(std::llround(static_cast<double>(lx) * level.downsample),
                              std::llround(static_cast<double>(ly) * level.downsample), i, kBlock, kBlock);
        ASSERT_EQ(block.type(), CV_8UC3);
        ASSERT_EQ(block.size(), cv::Size(kBlock, kBlock));
        for (int r = 0; r < kBlock; ++r) {
          for (int c = 0; c < kBlock; ++c) {
            const cv::Vec3d expected = pattern_mean(x0 + c * factor_power, y0 + r * factor_power, factor_power,
                                                    factor_power, f.width, f.height);
            worst = std::max(worst, max_channel_diff(block.at<cv::Vec3b>(r, c), expected, with_blue));
          }
        }
        checked += with_blue ? 1 : 0;
      }
    }
    if (lossless() || factor_power <= 4) {
      EXPECT_GE(checked, 3);  // deeper JPEG levels are all near a wrap line
    }
    EXPECT_LE(worst, tolerance(factor_power));
    RecordProperty("max_diff_level_" + std::to_string(i), std::to_string(worst));
  }
}

TEST_P(SlidePyramid, RegionPastTheEdgeIsWhite) {
  const Format& f = GetParam();
  const Slide slide = Slide::open(path_);
  const cv::Mat region = slide.read_region(f.width - 10, f.height - 6, 0, 20, 12);
  ASSERT_EQ(region.size(), cv::Size(20, 12));
  for (int r = 0; r < region.rows; ++r) {
    for (int c = 0; c < region.cols; ++c) {
      const bool inside = c < 10 && r < 6;
      const cv::Vec3b actual = region.at<cv::Vec3b>(r, c);
      if (inside) {
        const cv::Vec3b p = pattern_pixel(f.width - 10 + c, f.height - 6 + r);
        EXPECT_LE(max_channel_diff(actual, cv::Vec3d(p[0], p[1], p[2])), 2 * tolerance()) << r << "," << c;
      } else {
        EXPECT_EQ(actual, kWhite) << r << "," << c;
      }
    }
  }
  const int last = slide.level_count() - 1;
  const cv::Mat outside = slide.read_region(-500, f.height + 100, last, 30, 30);
  EXPECT_EQ(cv::countNonZero(outside.reshape(1) != 255), 0);
}

TEST_P(SlidePyramid, AssociatedImages) {
  const Format& f = GetParam();
  const Slide slide = Slide::open(path_);
  if (f.flavor == TiffFlavor::generic) {
    EXPECT_TRUE(slide.associated_images().empty());  // OpenSlide's generic-tiff driver has none
    EXPECT_THROW(slide.read_associated_image("label"), core::InputError);
    return;
  }
  std::vector<std::string> names;
  for (const auto& image : slide.associated_images()) names.push_back(image.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"label", "macro", "thumbnail"}));

  const cv::Mat label = slide.read_associated_image("label");
  ASSERT_EQ(label.size(), cv::Size(200, 100));
  const cv::Scalar mean = cv::mean(label);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(mean[c], kLabelColour[c], 3.0);

  const cv::Mat macro = slide.read_associated_image("macro");
  EXPECT_EQ(macro.size(), cv::Size(400, 150));

  const cv::Mat thumbnail = slide.read_associated_image("thumbnail");
  EXPECT_LE(std::max(thumbnail.cols, thumbnail.rows), 1024);
  EXPECT_NEAR(static_cast<double>(thumbnail.cols) / thumbnail.rows, static_cast<double>(f.width) / f.height, 0.01);
  // Its pixels are the slide's, scaled down.
  const double scale = static_cast<double>(f.width) / thumbnail.cols;
  const int tx = thumbnail.cols / 3;
  const int ty = thumbnail.rows / 2;
  if (!near_wrap(tx * scale, ty * scale, scale, 16 * scale)) {
    const cv::Vec3d expected = pattern_mean(tx * scale, ty * scale, scale, scale, f.width, f.height);
    EXPECT_LE(max_channel_diff(thumbnail.at<cv::Vec3b>(ty, tx), expected), tolerance() + 4);
  }
  EXPECT_THROW(slide.read_associated_image("overview"), core::InputError);
}

INSTANTIATE_TEST_SUITE_P(
    SlideFormats, SlidePyramid,
    ::testing::Values(Format{"aperio_jpeg_x2", TiffFlavor::aperio, TiffCompression::jpeg, 2, 2000, 1500},
                      Format{"aperio_deflate_x3", TiffFlavor::aperio, TiffCompression::deflate, 3, 2000, 1500},
                      Format{"generic_jpeg_x3", TiffFlavor::generic, TiffCompression::jpeg, 3, 2000, 1500},
                      Format{"generic_deflate_x2", TiffFlavor::generic, TiffCompression::deflate, 2, 2000, 1500},
                      Format{"generic_jpeg_odd_x2", TiffFlavor::generic, TiffCompression::jpeg, 2, 1000, 777},
                      Format{"aperio_jpeg_odd_x3", TiffFlavor::aperio, TiffCompression::jpeg, 3, 1000, 777}),
    [](const ::testing::TestParamInfo<Format>& param) { return std::string(param.param.name); });

// One 2000×1500 Aperio slide at 0.25 µm/px with levels at 0.5 and 1.0 µm/px, shared by the resolution tests.
class SlideResolution : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    TiffWriterOptions options;
    options.flavor = TiffFlavor::aperio;
    options.mpp = kMpp;
    options.min_level_size = 500;
    write_slide(dir_->file("slide.svs"), kWidth, kHeight, options);
    options.flavor = TiffFlavor::generic;
    options.level_factor = 3;
    write_slide(dir_->file("x3.tif"), kWidth, kHeight, options);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // Compares a read at `mpp` with the pattern averaged over each output pixel's level-0 footprint.
  static void expect_matches_pattern(const cv::Mat& image, std::int64_t x, std::int64_t y, double mpp,
                                     double tolerance) {
    const double step = mpp / kMpp;
    double worst = 0.0;
    int with_blue_count = 0;
    for (int r = 0; r < image.rows; ++r) {
      for (int c = 0; c < image.cols; ++c) {
        const double x0 = static_cast<double>(x) + c * step;
        const double y0 = static_cast<double>(y) + r * step;
        const bool with_blue = !near_wrap(x0, y0, step, 16 * step);
        const cv::Vec3d expected = pattern_mean(x0, y0, step, step, kWidth, kHeight);
        const double diff = max_channel_diff(image.at<cv::Vec3b>(r, c), expected, with_blue);
        EXPECT_LE(diff, tolerance) << "pixel (" << c << ", " << r << ") of " << image.cols << "x" << image.rows;
        worst = std::max(worst, diff);
        with_blue_count += with_blue ? 1 : 0;
      }
    }
    EXPECT_GE(with_blue_count, image.rows * image.cols / 2);
    EXPECT_LE(worst, tolerance);
  }

  static constexpr std::int64_t kWidth = 2000;
  static constexpr std::int64_t kHeight = 1500;
  static TempDir* dir_;
};

TempDir* SlideResolution::dir_ = nullptr;

TEST_F(SlideResolution, BestLevelIsTheCoarsestAtOrAboveTheTarget) {
  const Slide slide = Slide::open(dir_->file("slide.svs"));
  ASSERT_EQ(slide.level_count(), 3);  // 0.25, 0.5, 1.0 µm/px
  EXPECT_EQ(slide.best_level_for_mpp(0.1), 0);
  EXPECT_EQ(slide.best_level_for_mpp(0.25), 0);
  EXPECT_EQ(slide.best_level_for_mpp(0.45), 0);
  EXPECT_EQ(slide.best_level_for_mpp(0.4960), 1);  // within 1%
  EXPECT_EQ(slide.best_level_for_mpp(0.5), 1);
  EXPECT_EQ(slide.best_level_for_mpp(0.75), 1);
  EXPECT_EQ(slide.best_level_for_mpp(0.98), 1);
  EXPECT_EQ(slide.best_level_for_mpp(1.0), 2);
  EXPECT_EQ(slide.best_level_for_mpp(8.0), 2);
}

TEST_F(SlideResolution, ReadAtAPyramidLevelResolution) {
  const Slide slide = Slide::open(dir_->file("slide.svs"));
  const cv::Mat image = slide.read_at_mpp(200, 100, 64, 48, 0.5);
  ASSERT_EQ(image.size(), cv::Size(64, 48));
  ASSERT_EQ(image.type(), CV_8UC3);
  expect_matches_pattern(image, 200, 100, 0.5, kJpegTolerance);
  // Exactly the level's pixels.
  const cv::Mat level = slide.read_region(200, 100, 1, 64, 48);
  EXPECT_EQ(cv::countNonZero(cv::Mat(image != level).reshape(1)), 0);
}

TEST_F(SlideResolution, ReadBetweenPyramidLevels) {
  const Slide slide = Slide::open(dir_->file("slide.svs"));
  const cv::Mat image = slide.read_at_mpp(200, 100, 64, 48, 0.75);  // not a level: from 0.5 by area average
  ASSERT_EQ(image.size(), cv::Size(64, 48));
  expect_matches_pattern(image, 200, 100, 0.75, kJpegTolerance);
  const cv::Mat odd = slide.read_at_mpp(201, 99, 37, 23, 0.6);
  EXPECT_EQ(odd.size(), cv::Size(37, 23));
  expect_matches_pattern(odd, 201, 99, 0.6, kJpegTolerance);
}

TEST_F(SlideResolution, ReadAtAThreeTimesLevel) {
  const Slide slide = Slide::open(dir_->file("x3.tif"));
  ASSERT_EQ(slide.level_count(), 3);  // 2000×1500, 667×500, 223×167
  EXPECT_EQ(slide.best_level_for_mpp(0.75), 1);
  EXPECT_EQ(slide.best_level_for_mpp(2.25), 2);
  const cv::Mat image = slide.read_at_mpp(201, 99, 50, 40, 0.75);  // on the 3× level's pixel grid
  ASSERT_EQ(image.size(), cv::Size(50, 40));
  expect_matches_pattern(image, 201, 99, 0.75, kJpegTolerance);
  const cv::Mat coarse = slide.read_at_mpp(201, 99, 40, 30, 1.5);  // between the 3× and 9× levels
  ASSERT_EQ(coarse.size(), cv::Size(40, 30));
  expect_matches_pattern(coarse, 201, 99, 1.5, kJpegTolerance);
}

TEST_F(SlideResolution, WindowServesTheSamePixelsAsSingleReads) {
  for (const char* name : {"slide.svs", "x3.tif"}) {
    const Slide slide = Slide::open(dir_->file(name));
    for (double mpp : {0.25, 0.5, 0.6, 0.75, 1.5}) {
      const int side = 37;
      const auto side0 = static_cast<std::int64_t>(std::ceil(side * mpp / slide.mpp()));
      const SlideWindow window(slide, 101, 57, side0 * 6, side0, mpp);
      int served = 0;
      for (int i = 0; i < 6; ++i) {
        const std::int64_t x = 101 + i * side0;
        if (!window.contains(x, 57, side, side, mpp)) continue;
        ++served;
        const cv::Mat a = window.read_at_mpp(x, 57, side, side, mpp);
        const cv::Mat b = slide.read_at_mpp(x, 57, side, side, mpp);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(cv::countNonZero(cv::Mat(a != b).reshape(1)), 0) << name << " at " << mpp << " um/px, tile " << i;
      }
      EXPECT_GE(served, 5) << name << " at " << mpp << " um/px: the window covers its row of tiles";
      EXPECT_FALSE(window.contains(101, 57 + side0, side, side, mpp)) << "the next row is outside";
      EXPECT_THROW(window.read_at_mpp(101, 57 + side0, side, side, mpp), core::InternalError);
    }
  }
}

TEST_F(SlideResolution, ThumbnailFitsTheRequestedSide) {
  const Slide slide = Slide::open(dir_->file("slide.svs"));
  const cv::Mat thumbnail = slide.thumbnail(300);
  ASSERT_EQ(thumbnail.size(), cv::Size(300, 225));
  expect_matches_pattern(thumbnail, 0, 0, kMpp * kWidth / 300.0, kJpegTolerance);
  EXPECT_EQ(slide.thumbnail(500).size(), cv::Size(500, 375));
  EXPECT_THROW(slide.thumbnail(0), core::Error);
}

// A tiled RGB TIFF written directly with libtiff, with or without resolution tags.
void write_plain_tiff(const std::string& path, int unit, double resolution) {
  constexpr int kSize = 256;
  TIFF* tif = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(tif, nullptr);
  TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, kSize);
  TIFFSetField(tif, TIFFTAG_IMAGELENGTH, kSize);
  TIFFSetField(tif, TIFFTAG_TILEWIDTH, kSize);
  TIFFSetField(tif, TIFFTAG_TILELENGTH, kSize);
  TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, 3);
  TIFFSetField(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
  TIFFSetField(tif, TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
  if (unit != 0) {
    TIFFSetField(tif, TIFFTAG_XRESOLUTION, resolution);
    TIFFSetField(tif, TIFFTAG_YRESOLUTION, resolution);
    TIFFSetField(tif, TIFFTAG_RESOLUTIONUNIT, unit);
  }
  cv::Mat pixels(kSize, kSize, CV_8UC3);
  for (int y = 0; y < kSize; ++y) {
    for (int x = 0; x < kSize; ++x) pixels.at<cv::Vec3b>(y, x) = pattern_pixel(x, y);
  }
  ASSERT_GT(TIFFWriteEncodedTile(tif, 0, pixels.data, static_cast<tmsize_t>(pixels.total() * 3)), 0);
  TIFFClose(tif);
}

TEST(SlideResolutionChain, AssumedWhenTheTiffHasNoResolution) {
  TempDir dir;
  const std::string path = dir.file("bare.tif");
  write_plain_tiff(path, 0, 0.0);
  try {
    Slide::open(path);
    FAIL() << "expected a core::InputError";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("assume_mpp"), std::string::npos) << e.what();
    EXPECT_EQ(e.file(), path);
  }
  SlideOpenOptions options;
  options.assume_mpp = 0.5;
  const Slide slide = Slide::open(path, options);
  EXPECT_EQ(slide.vendor(), "generic-tiff");
  EXPECT_DOUBLE_EQ(slide.mpp(), 0.5);
  EXPECT_EQ(slide.mpp_source(), MppSource::assumed);
  EXPECT_STREQ(to_string(slide.mpp_source()), "assumed");
  const cv::Mat region = slide.read_region(10, 20, 0, 1, 1);
  EXPECT_EQ(region.at<cv::Vec3b>(0, 0), pattern_pixel(10, 20));  // lossless
}

TEST(SlideResolutionChain, InchesAreConverted) {
  TempDir dir;
  const std::string path = dir.file("inch.tif");
  write_plain_tiff(path, RESUNIT_INCH, 25400.0 / 0.5);
  SlideOpenOptions options;
  options.assume_mpp = 0.9;  // not used: the slide has a resolution
  const Slide slide = Slide::open(path, options);
  EXPECT_EQ(slide.property("tiff.ResolutionUnit").value_or(""), "inch");
  EXPECT_NEAR(slide.mpp(), 0.5, 1e-6);
  EXPECT_EQ(slide.mpp_source(), MppSource::tiff_resolution);
}

TEST(SlideResolutionChain, UnitNoneIsNotAResolution) {
  TempDir dir;
  const std::string path = dir.file("none.tif");
  write_plain_tiff(path, RESUNIT_NONE, 300.0);
  EXPECT_THROW(Slide::open(path), core::InputError);
  SlideOpenOptions options;
  options.assume_mpp = 0.3;
  const Slide slide = Slide::open(path, options);
  EXPECT_EQ(slide.property("tiff.ResolutionUnit").value_or(""), "none");
  EXPECT_EQ(slide.mpp_source(), MppSource::assumed);
}

TEST(SlideResolutionChain, ScreenDefaultDpiIsNotAScanResolution) {
  TempDir dir;
  const std::string path = dir.file("dpi72.tif");
  write_plain_tiff(path, RESUNIT_INCH, 72.0);  // 352.8 µm/px: what image editors write, not a scanner
  try {
    Slide::open(path);
    FAIL() << "expected a core::InputError";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("screen default"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("assume_mpp"), std::string::npos) << e.what();
  }
  SlideOpenOptions options;
  options.assume_mpp = 0.25;
  const Slide slide = Slide::open(path, options);
  EXPECT_EQ(slide.mpp_source(), MppSource::assumed);
  EXPECT_DOUBLE_EQ(slide.mpp(), 0.25);
}

TEST(SlideOpen, MissingFileIsFileNotFound) {
  TempDir dir;
  const std::string path = dir.file("absent.svs");
  try {
    Slide::open(path);
    FAIL() << "expected core::FileNotFoundError";
  } catch (const core::FileNotFoundError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.kind(), core::ErrorKind::input);
    EXPECT_NE(std::string(e.what()).find("absent.svs"), std::string::npos);
  }
}

TEST(SlideOpen, DirectoryIsNotASlide) {
  TempDir dir;
  EXPECT_THROW(Slide::open(dir.path().string()), core::InputError);
}

// tests/data/slides/<case>/: one input file and expected.txt, a substring of the error Slide::open throws, or,
// for a slide that opens, of the error reading its pixels (every level whole, on both read paths).
TEST(SlideOpen, DataDrivenBrokenFiles) {
  const auto root = testing::test_data_dir() / "slides";
  ASSERT_TRUE(std::filesystem::is_directory(root)) << root;
  int cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    SCOPED_TRACE("case " + entry.path().filename().string());
    std::string input;
    std::string expected;
    for (const auto& file : std::filesystem::directory_iterator(entry.path())) {
      if (file.path().filename() == "expected.txt") {
        std::ifstream in(file.path());
        std::getline(in, expected);
      } else {
        input = file.path().string();
      }
    }
    ASSERT_FALSE(input.empty());
    ASSERT_FALSE(expected.empty());
    for (const bool direct : {true, false}) {
      SCOPED_TRACE(direct ? "direct TIFF allowed" : "OpenSlide only");
      SlideOpenOptions options;
      options.direct_tiff = direct;
      try {
        const Slide slide = Slide::open(input, options);
        for (int level = 0; level < slide.level_count(); ++level) {
          slide.read_region(0, 0, level, slide.level(level).width, slide.level(level).height);
        }
        ADD_FAILURE() << "no error for " << input;
      } catch (const core::InputError& e) {
        EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what() << "\nexpected: " << expected;
        EXPECT_EQ(e.file(), input);
      }
    }
    ++cases;
  }
  EXPECT_GE(cases, 7);
}

TEST(SlideOpen, FreshlyTruncatedSlideIsCorrupt) {
  TempDir dir;
  TiffWriterOptions options;
  options.flavor = TiffFlavor::aperio;
  const std::string path = dir.file("cut.svs");
  testing::write_pattern_slide(path, 1200, 900, options);
  ASSERT_NO_THROW(Slide::open(path));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) * 2 / 3);
  try {
    Slide::open(path);
    FAIL() << "expected a core::InputError";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("corrupt slide"), std::string::npos) << e.what();
  }
}

TEST(SlideRead, DamagedTileFailsWithLevelAndRegion) {
  TempDir dir;
  const std::string path = dir.file("damaged.tif");
  testing::write_pattern_slide(path, 600, 600, TiffWriterOptions{});
  std::uint64_t offset = 0;
  {
    TIFF* tif = TIFFOpen(path.c_str(), "r");
    ASSERT_NE(tif, nullptr);
    offset = TIFFGetStrileOffset(tif, 0);  // level 0, first tile
    TIFFClose(tif);
  }
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offset));
    const std::string garbage(64, '\x5a');  // overwrites the JPEG start-of-image marker
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  // Both read paths: the direct TIFF decoder (the default for this slide) and OpenSlide.
  for (const bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct TIFF" : "OpenSlide");
    SlideOpenOptions options;
    options.direct_tiff = direct;
    const Slide slide = Slide::open(path, options);  // directories are intact
    ASSERT_EQ(slide.reads_tiff_directly(), direct);
    try {
      slide.read_region(10, 20, 0, 30, 40);
      FAIL() << "expected a core::InputError";
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_EQ(e.context("level"), "0");
      EXPECT_EQ(e.context("region"), "(10, 20, 30x40)");
      const std::string cause =
          direct ? "cannot decode tile 0 (column 0, row 0) of level 0 (TIFF directory 0)" : "openslide";
      EXPECT_NE(std::string(e.what()).find(cause), std::string::npos) << e.what();
    }
  }
}

TEST(SlideRead, RejectsBadArguments) {
  TempDir dir;
  const std::string path = dir.file("small.tif");
  testing::write_pattern_slide(path, 300, 300, TiffWriterOptions{});
  const Slide slide = Slide::open(path);
  EXPECT_THROW(slide.read_region(0, 0, 1, 10, 10), core::InputError);  // one level only
  EXPECT_THROW(slide.read_region(0, 0, -1, 10, 10), core::InputError);
  EXPECT_THROW(slide.read_region(0, 0, 0, 0, 10), core::InputError);
  EXPECT_THROW(slide.read_at_mpp(0, 0, 10, 10, 0.0), core::InputError);
}

TEST(SlideHandle, MoveTransfersTheOpenSlide) {
  TempDir dir;
  const std::string path = dir.file("case-12.tif");
  testing::write_pattern_slide(path, 300, 300, TiffWriterOptions{});
  Slide first = Slide::open(path);
  EXPECT_EQ(first.id(), "case-12");
  EXPECT_EQ(first.path(), path);
  Slide second = std::move(first);
  EXPECT_EQ(second.read_region(5, 5, 0, 2, 2).size(), cv::Size(2, 2));
  Slide third = Slide::open(path);
  third = std::move(second);
  EXPECT_EQ(third.read_region(100, 100, 0, 3, 3).size(), cv::Size(3, 3));
  EXPECT_EQ(third.properties().at("openslide.vendor"), "generic-tiff");
}

// The marker of a slide tessera synth made (io/provenance.h), as OpenSlide reports it for both flavours: the Software
// tag "Tessera synth", or an older synth's description. Tessera's other TIFFs (Software "Tessera", e.g. heatmaps) and
// look-alike names are not synthetic slides.
TEST(SlideOrigin, TheSoftwareTagOrAnOlderSynthDescriptionMarksASyntheticSlide) {
  TempDir dir;
  struct Case {
    const char* name;
    TiffFlavor flavor;
    std::string software;
    std::string description;
    bool synthetic;
  };
  const std::vector<Case> cases = {
      {"synth.tif", TiffFlavor::generic, kSyntheticSlideSoftware, "", true},
      {"synth.svs", TiffFlavor::aperio, kSyntheticSlideSoftware, "", true},
      {"synth-versioned.tif", TiffFlavor::generic, std::string(kSyntheticSlideSoftware) + " 1.2", "", true},
      {"old-synth.tif", TiffFlavor::generic, "Tessera", "Tessera synthetic H&E slide; seed 3; normal", true},
      {"old-synth.svs", TiffFlavor::aperio, "Tessera", "Tessera synthetic H&E slide; seed 3; tumour", true},
      {"heatmap.tif", TiffFlavor::generic, "Tessera", "", false},
      {"heatmap.svs", TiffFlavor::aperio, "Tessera", "", false},
      {"synthesis.tif", TiffFlavor::generic, "Tessera synthesis", "", false},
      {"scanner.svs", TiffFlavor::aperio, "ScanScope", "a scan", false},
      {"no-software.tif", TiffFlavor::generic, "", "", false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TiffWriterOptions options;
    options.flavor = c.flavor;
    options.software = c.software;
    options.description = c.description;
    const std::string path = dir.file(c.name);
    testing::write_pattern_slide(path, 600, 400, options);
    const Slide slide = Slide::open(path);
    EXPECT_EQ(slide.vendor(), c.flavor == TiffFlavor::aperio ? "aperio" : "generic-tiff");
    if (!c.software.empty()) {
      EXPECT_EQ(slide.property("tiff.Software"), c.software);
    }
    EXPECT_EQ(slide.synthetic(), c.synthetic);
  }
  EXPECT_FALSE(is_synthetic_slide({}));
  EXPECT_STREQ(slide_origin(true), "synthetic");
  EXPECT_STREQ(slide_origin(false), "real");
}

}  // namespace
}  // namespace tessera::io
