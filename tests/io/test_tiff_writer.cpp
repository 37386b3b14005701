// Tests of the streaming pyramidal TIFF writer, read back with libtiff (structure, tags, exact pixels of the
// lossless flavour); reading through OpenSlide is covered by test_slide.cpp.
#include "io/tiff_writer.h"

#include <tiffio.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/testing.h"

namespace tessera::io {
namespace {

using testing::pattern_pixel;
using testing::TempDir;
using testing::write_pattern_slide;

struct TiffCloser {
  void operator()(TIFF* tif) const { TIFFClose(tif); }
};
using TiffPtr = std::unique_ptr<TIFF, TiffCloser>;

TiffPtr open_tiff(const std::string& path) {
  TiffPtr tif(TIFFOpen(path.c_str(), "r"));
  EXPECT_NE(tif, nullptr) << path;
  return tif;
}

std::set<std::string> files_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

cv::Mat pattern_strip(std::int64_t width, std::int64_t y0, int rows) {
  cv::Mat strip(rows, static_cast<int>(width), CV_8UC3);
  for (int r = 0; r < rows; ++r) {
    for (int x = 0; x < strip.cols; ++x) strip.at<cv::Vec3b>(r, x) = pattern_pixel(x, y0 + r);
  }
  return strip;
}

// Reads one directory of a TIFF as RGB (libtiff's RGBA interface decodes any compression).
cv::Mat read_directory(TIFF* tif, int dir) {
  EXPECT_EQ(TIFFSetDirectory(tif, static_cast<tdir_t>(dir)), 1);
  std::uint32_t w = 0;
  std::uint32_t h = 0;
  TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &h);
  std::vector<std::uint32_t> raster(static_cast<std::size_t>(w) * h);
  EXPECT_EQ(TIFFReadRGBAImageOriented(tif, w, h, raster.data(), ORIENTATION_TOPLEFT, 0), 1);
  cv::Mat rgb(static_cast<int>(h), static_cast<int>(w), CV_8UC3);
  for (int y = 0; y < rgb.rows; ++y) {
    for (int x = 0; x < rgb.cols; ++x) {
      const std::uint32_t p = raster[static_cast<std::size_t>(y) * w + static_cast<std::size_t>(x)];
      rgb.at<cv::Vec3b>(y, x) = cv::Vec3b(TIFFGetR(p), TIFFGetG(p), TIFFGetB(p));
    }
  }
  return rgb;
}

// The writer's pyramid in plain loops: box average by `factor` with edge replication, rounded, level by level.
cv::Mat naive_downsample(const cv::Mat& src, int factor) {
  const int w = (src.cols + factor - 1) / factor;
  const int h = (src.rows + factor - 1) / factor;
  cv::Mat dst(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        double sum = 0.0;
        for (int dy = 0; dy < factor; ++dy) {
          for (int dx = 0; dx < factor; ++dx) {
            const int sy = std::min(src.rows - 1, y * factor + dy);
            const int sx = std::min(src.cols - 1, x * factor + dx);
            sum += src.at<cv::Vec3b>(sy, sx)[c];
          }
        }
        dst.at<cv::Vec3b>(y, x)[c] = static_cast<unsigned char>(std::lround(sum / (factor * factor)));
      }
    }
  }
  return dst;
}

int max_abs_diff(const cv::Mat& a, const cv::Mat& b) {
  double max_diff = 0.0;
  cv::Mat diff;
  cv::absdiff(a, b, diff);
  cv::minMaxLoc(diff.reshape(1), nullptr, &max_diff);
  return static_cast<int>(max_diff);
}

TEST(TiffWriterGeometry, LevelsShrinkByCeilDivisionUntilBothSidesFitMinLevelSize) {
  TempDir dir;
  TiffWriterOptions options;
  options.min_level_size = 512;
  {
    options.level_factor = 2;
    TiffWriter writer(dir.file("a.tif"), 2000, 1500, options);
    EXPECT_EQ(writer.level_count(), 3);  // 2000×1500, 1000×750, 500×375
  }
  {
    options.level_factor = 3;
    TiffWriter writer(dir.file("b.tif"), 2000, 1500, options);
    EXPECT_EQ(writer.level_count(), 3);  // 2000×1500, 667×500, 223×167
  }
  {
    options.level_factor = 2;
    TiffWriter writer(dir.file("c.tif"), 512, 512, options);
    EXPECT_EQ(writer.level_count(), 1);
  }
  {
    TiffWriter writer(dir.file("d.tif"), 513, 10, options);
    EXPECT_EQ(writer.level_count(), 2);  // one side above the minimum is enough for another level
  }
  EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(TiffWriterFiles, FinishLeavesOnlyTheOutput) {
  TempDir dir;
  TiffWriterOptions options;
  options.level_factor = 3;
  write_pattern_slide(dir.file("slide.tif"), 1000, 777, options);
  EXPECT_EQ(files_in(dir.path()), std::set<std::string>{"slide.tif"});
}

TEST(TiffWriterFiles, DestructionWithoutFinishRemovesEverything) {
  TempDir dir;
  TiffWriterOptions options;
  options.flavor = TiffFlavor::aperio;
  {
    TiffWriter writer(dir.file("slide.svs"), 1200, 1000, options);
    writer.write_strip(pattern_strip(1200, 0, 256));
    writer.write_strip(pattern_strip(1200, 256, 256));
    EXPECT_EQ(writer.rows_written(), 512);
    EXPECT_FALSE(files_in(dir.path()).empty());                    // temporaries exist while writing
    EXPECT_FALSE(std::filesystem::exists(dir.file("slide.svs")));  // but not the output name
  }
  EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(TiffWriterFiles, FailedFinishLeavesNothing) {
  TempDir dir;
  {
    TiffWriter writer(dir.file("slide.tif"), 600, 600, TiffWriterOptions{});
    writer.write_strip(pattern_strip(600, 0, 256));
    EXPECT_THROW(writer.finish(), core::Error);  // 344 rows missing
  }
  EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(TiffWriterFiles, LargeSlidesAreBigTiff) {
  TempDir dir;
  TiffWriterOptions options;
  {
    // 40000² RGB is 4.8 GB uncompressed; the header is written when the files are opened.
    TiffWriter big(dir.file("big.tif"), 40000, 40000, options);
    const auto names = files_in(dir.path());
    ASSERT_FALSE(names.empty());
    for (const auto& name : names) {
      std::ifstream in(dir.file(name), std::ios::binary);
      char magic[4] = {};
      in.read(magic, 4);
      EXPECT_EQ(std::string(magic, 4), std::string("II+\0", 4)) << name;
    }
  }
  EXPECT_TRUE(files_in(dir.path()).empty());
  write_pattern_slide(dir.file("small.tif"), 300, 200, options);
  std::ifstream in(dir.file("small.tif"), std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), std::string("II*\0", 4));
}

TEST(TiffWriterInput, RejectsStripsOfTheWrongShape) {
  TempDir dir;
  TiffWriter writer(dir.file("slide.tif"), 600, 300, TiffWriterOptions{});
  EXPECT_THROW(writer.write_strip(pattern_strip(599, 0, 256)), core::Error);                 // narrower than the slide
  EXPECT_THROW(writer.write_strip(pattern_strip(601, 0, 256)), core::Error);                 // wider
  EXPECT_THROW(writer.write_strip(pattern_strip(600, 0, 100)), core::Error);                 // not tile_size rows
  EXPECT_THROW(writer.write_strip(cv::Mat(256, 600, CV_8UC1, cv::Scalar(0))), core::Error);  // not RGB
  EXPECT_EQ(writer.rows_written(), 0);
  writer.write_strip(pattern_strip(600, 0, 256));
  EXPECT_THROW(writer.write_strip(pattern_strip(600, 256, 256)), core::Error);  // the last strip has 44 rows
  writer.write_strip(pattern_strip(600, 256, 44));
  EXPECT_THROW(writer.write_strip(pattern_strip(600, 300, 44)), core::Error);  // past the bottom
  EXPECT_EQ(writer.rows_written(), 300);
  writer.finish();
  EXPECT_THROW(writer.finish(), core::Error);
}

TEST(TiffWriterInput, ErrorNamesTheFile) {
  TempDir dir;
  TiffWriter writer(dir.file("named.tif"), 600, 300, TiffWriterOptions{});
  try {
    writer.write_strip(pattern_strip(500, 0, 256));
    FAIL() << "expected an error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("named.tif"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("600x256"), std::string::npos) << e.what();
  }
}

TEST(TiffWriterInput, RejectsInvalidOptions) {
  TempDir dir;
  const auto make = [&](auto change) {
    TiffWriterOptions options;
    change(options);
    TiffWriter writer(dir.file("slide.tif"), 100, 100, options);
  };
  EXPECT_THROW(make([](TiffWriterOptions& o) { o.tile_size = 100; }), core::Error);
  EXPECT_THROW(make([](TiffWriterOptions& o) { o.level_factor = 1; }), core::Error);
  EXPECT_THROW(make([](TiffWriterOptions& o) { o.level_factor = 9; }), core::Error);
  EXPECT_THROW(make([](TiffWriterOptions& o) { o.mpp = 0.0; }), core::Error);
  EXPECT_THROW(make([](TiffWriterOptions& o) { o.jpeg_quality = 0; }), core::Error);
  EXPECT_THROW(make([](TiffWriterOptions& o) { o.threads = 0; }), core::Error);
  EXPECT_THROW(TiffWriter(dir.file("empty.tif"), 0, 100, TiffWriterOptions{}), core::Error);
  EXPECT_THROW(TiffWriter(dir.file("no/such/folder/slide.tif"), 100, 100, TiffWriterOptions{}), core::Error);
  EXPECT_TRUE(files_in(dir.path()).empty());
}

TEST(TiffWriterInput, RejectsBadAssociatedImages) {
  TempDir dir;
  TiffWriterOptions options;
  options.flavor = TiffFlavor::aperio;
  TiffWriter writer(dir.file("slide.svs"), 100, 100, options);
  const cv::Mat image(10, 10, CV_8UC3, cv::Scalar(1, 2, 3));
  EXPECT_THROW(writer.add_associated_image("", image), core::Error);
  EXPECT_THROW(writer.add_associated_image("two words", image), core::Error);
  EXPECT_THROW(writer.add_associated_image("label", cv::Mat(10, 10, CV_8UC1)), core::Error);
  writer.add_associated_image("label", image);
  EXPECT_THROW(writer.add_associated_image("label", image), core::Error);
}

// Directory layout as OpenSlide's drivers expect it: level 0 first, reduced-resolution levels marked as such,
// the Aperio thumbnail stripped and second, associated images stripped and last.
TEST(TiffWriterLayout, AperioDirectories) {
  TempDir dir;
  TiffWriterOptions options;
  options.flavor = TiffFlavor::aperio;
  options.mpp = 0.5;
  options.objective_power = 20;
  options.description = "case 7 | stain H&E";
  {
    TiffWriter writer(dir.file("slide.svs"), 2000, 1500, options);
    writer.add_associated_image("label", cv::Mat(100, 200, CV_8UC3, cv::Scalar(10, 200, 30)));
    for (int y = 0; y < 1500; y += 256) writer.write_strip(pattern_strip(2000, y, std::min(256, 1500 - y)));
    writer.finish();
  }
  auto tif = open_tiff(dir.file("slide.svs"));
  ASSERT_NE(tif, nullptr);
  ASSERT_EQ(TIFFNumberOfDirectories(tif.get()), 5);  // level 0, thumbnail, 2 levels, label
  struct Expected {
    std::uint32_t width, height;
    bool tiled;
    std::uint32_t subfile_type;
    const char* description_part;
  };
  const Expected expected[] = {
      {2000, 1500, true, 0,
       "Aperio Image Library Tessera\r\n2000x1500 [0,0 2000x1500] (256x256) JPEG/RGB Q=85|"
       "AppMag = 20|MPP = 0.5|Description = case 7   stain H&E"},
      {1000, 750, false, FILETYPE_REDUCEDIMAGE, "Aperio"},
      {1000, 750, true, FILETYPE_REDUCEDIMAGE, "-> 1000x750"},
      {500, 375, true, FILETYPE_REDUCEDIMAGE, "-> 500x375"},
      {200, 100, false, FILETYPE_REDUCEDIMAGE, "\nlabel 200x100"},
  };
  for (int d = 0; d < 5; ++d) {
    SCOPED_TRACE("directory " + std::to_string(d));
    ASSERT_EQ(TIFFSetDirectory(tif.get(), static_cast<tdir_t>(d)), 1);
    std::uint32_t w = 0;
    std::uint32_t h = 0;
    std::uint32_t subfile_type = 99;
    char* description = nullptr;
    TIFFGetField(tif.get(), TIFFTAG_IMAGEWIDTH, &w);
    TIFFGetField(tif.get(), TIFFTAG_IMAGELENGTH, &h);
    TIFFGetFieldDefaulted(tif.get(), TIFFTAG_SUBFILETYPE, &subfile_type);
    ASSERT_EQ(TIFFGetField(tif.get(), TIFFTAG_IMAGEDESCRIPTION, &description), 1);
    EXPECT_EQ(w, expected[d].width);
    EXPECT_EQ(h, expected[d].height);
    EXPECT_EQ(TIFFIsTiled(tif.get()) != 0, expected[d].tiled);
    EXPECT_EQ(subfile_type, expected[d].subfile_type);
    EXPECT_NE(std::string(description).find(expected[d].description_part), std::string::npos) << description;
    std::uint16_t compression = 0;
    TIFFGetField(tif.get(), TIFFTAG_COMPRESSION, &compression);
    EXPECT_EQ(compression, COMPRESSION_JPEG);
    if (expected[d].tiled) {
      std::uint32_t tile_width = 0;
      TIFFGetField(tif.get(), TIFFTAG_TILEWIDTH, &tile_width);
      EXPECT_EQ(tile_width, 256u);
      std::uint32_t table_bytes = 0;
      void* tables = nullptr;
      EXPECT_EQ(TIFFGetField(tif.get(), TIFFTAG_JPEGTABLES, &table_bytes, &tables), 1);
      EXPECT_GT(table_bytes, 0u);
    }
  }
}

TEST(TiffWriterLayout, ResolutionTagsAreInCentimetresPerLevel) {
  TempDir dir;
  TiffWriterOptions options;
  options.mpp = 0.25;
  options.compression = TiffCompression::deflate;
  write_pattern_slide(dir.file("slide.tif"), 1000, 700, options);
  auto tif = open_tiff(dir.file("slide.tif"));
  ASSERT_NE(tif, nullptr);
  ASSERT_EQ(TIFFNumberOfDirectories(tif.get()), 2);  // generic: levels only, no thumbnail
  const double expected_x[] = {40000.0, 40000.0 * 500.0 / 1000.0};
  const double expected_y[] = {40000.0, 40000.0 * 350.0 / 700.0};
  for (int d = 0; d < 2; ++d) {
    ASSERT_EQ(TIFFSetDirectory(tif.get(), static_cast<tdir_t>(d)), 1);
    float x_resolution = 0;
    float y_resolution = 0;
    std::uint16_t unit = 0;
    ASSERT_EQ(TIFFGetField(tif.get(), TIFFTAG_XRESOLUTION, &x_resolution), 1);
    ASSERT_EQ(TIFFGetField(tif.get(), TIFFTAG_YRESOLUTION, &y_resolution), 1);
    ASSERT_EQ(TIFFGetField(tif.get(), TIFFTAG_RESOLUTIONUNIT, &unit), 1);
    EXPECT_EQ(unit, RESUNIT_CENTIMETER);
    EXPECT_NEAR(x_resolution, expected_x[d], 0.01);
    EXPECT_NEAR(y_resolution, expected_y[d], 0.01);
    char* description = nullptr;
    EXPECT_EQ(TIFFGetField(tif.get(), TIFFTAG_IMAGEDESCRIPTION, &description), 0);  // generic: no Aperio text
    std::uint16_t photometric = 0;
    TIFFGetField(tif.get(), TIFFTAG_PHOTOMETRIC, &photometric);
    EXPECT_EQ(photometric, PHOTOMETRIC_RGB);
  }
}

// Deflate is lossless, so every pixel of every level must equal the naive pyramid (within rounding).
class TiffWriterPixels : public ::testing::TestWithParam<int> {};

TEST_P(TiffWriterPixels, LosslessLevelsEqualNaiveAreaAverage) {
  const int factor = GetParam();
  TempDir dir;
  TiffWriterOptions options;
  options.compression = TiffCompression::deflate;
  options.level_factor = factor;
  options.min_level_size = 100;
  const int width = 1000;
  const int height = 777;  // odd, and not a multiple of the tile size or of 3
  write_pattern_slide(dir.file("slide.tif"), width, height, options);

  cv::Mat expected = pattern_strip(width, 0, height);
  auto tif = open_tiff(dir.file("slide.tif"));
  ASSERT_NE(tif, nullptr);
  const int directories = TIFFNumberOfDirectories(tif.get());
  // factor 2: 1000→500→250→125→63; 3: 1000→334→112→38; 4: 1000→250→63.
  ASSERT_EQ(directories, factor == 2 ? 5 : factor == 3 ? 4 : 3);
  for (int d = 0; d < directories; ++d) {
    SCOPED_TRACE("level " + std::to_string(d));
    if (d > 0) expected = naive_downsample(expected, factor);
    const cv::Mat level = read_directory(tif.get(), d);
    ASSERT_EQ(level.size(), expected.size());
    // Rounding at every level of the cascade may differ by one from the naive rounding.
    EXPECT_LE(max_abs_diff(level, expected), d == 0 ? 0 : 1);
  }
}

INSTANTIATE_TEST_SUITE_P(TiffWriterFactors, TiffWriterPixels, ::testing::Values(2, 3, 4));

// A slide shorter than one tile arrives as one short strip; its tiles are made no taller than the image
// (OpenSlide 3.4.1 with libtiff 4.5 misreads non-JPEG tiles larger than the image).
TEST(TiffWriterPixels, SlideSmallerThanATile) {
  TempDir dir;
  TiffWriterOptions options;
  options.compression = TiffCompression::deflate;
  write_pattern_slide(dir.file("slide.tif"), 300, 100, options);
  auto tif = open_tiff(dir.file("slide.tif"));
  ASSERT_NE(tif, nullptr);
  ASSERT_EQ(TIFFNumberOfDirectories(tif.get()), 1);
  std::uint32_t tile_width = 0;
  std::uint32_t tile_height = 0;
  TIFFGetField(tif.get(), TIFFTAG_TILEWIDTH, &tile_width);
  TIFFGetField(tif.get(), TIFFTAG_TILELENGTH, &tile_height);
  EXPECT_EQ(tile_width, 256u);
  EXPECT_EQ(tile_height, 96u);
  EXPECT_EQ(max_abs_diff(read_directory(tif.get(), 0), pattern_strip(300, 0, 100)), 0);
}

TEST(TiffWriterPixels, JpegLevelZeroIsCloseToThePattern) {
  TempDir dir;
  TiffWriterOptions options;
  options.jpeg_quality = 90;
  write_pattern_slide(dir.file("slide.tif"), 700, 600, options);
  auto tif = open_tiff(dir.file("slide.tif"));
  ASSERT_NE(tif, nullptr);
  const cv::Mat level = read_directory(tif.get(), 0);
  cv::Mat diff;
  cv::absdiff(level, pattern_strip(700, 0, 600), diff);
  EXPECT_LT(cv::mean(diff.reshape(1))[0], 3.0);
}

}  // namespace
}  // namespace tessera::io
