// Tests of the direct TIFF path of Slide (TiffTileReader) against OpenSlide: pixel for pixel on the pattern
// slides of test_slide.cpp (both flavours, JPEG and deflate, level factors 2 and 3, odd sizes) on every level,
// regions across tile borders and past the slide's edges; on tiled TIFFs written here with other encodings
// (LZW, uncompressed, RGB JPEG); the fallback to OpenSlide for layouts it does not decode; blank Aperio tiles;
// concurrent reads; the tile cache under eviction, and a thread waiting for the decode another thread is doing.
#include "io/tiff_reader.h"

#include <tiffio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "io/slide.h"
#include "io/tiff_writer.h"
#include "io/tile_cache.h"
#include "tests/testing/testing.h"

namespace tessera::io {
namespace {

using testing::pattern_pixel;
using testing::TempDir;

// How far past the level's right and bottom edges the whole-level reads go (white there).
constexpr int kMargin = 37;

// Channel values in which two images of the same size differ.
int differing_values(const cv::Mat& a, const cv::Mat& b) {
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(a.type(), b.type());
  if (a.size() != b.size() || a.type() != b.type()) return -1;
  return cv::countNonZero(cv::Mat(a != b).reshape(1));
}

// The level pixels [lx, lx+w) × [ly, ly+h) cut from `full` (the level read from its origin), white elsewhere.
cv::Mat crop_or_white(const cv::Mat& full, std::int64_t lx, std::int64_t ly, int w, int h) {
  cv::Mat out(h, w, CV_8UC3, cv::Scalar::all(255));
  const cv::Rect inside =
      cv::Rect(static_cast<int>(lx), static_cast<int>(ly), w, h) & cv::Rect(0, 0, full.cols, full.rows);
  if (!inside.empty()) {
    full(inside).copyTo(
        out(cv::Rect(inside.x - static_cast<int>(lx), inside.y - static_cast<int>(ly), inside.width, inside.height)));
  }
  return out;
}

bool integral(double downsample) { return downsample == std::round(downsample); }

Slide open_with_openslide(const std::string& path) {
  SlideOpenOptions options;
  options.direct_tiff = false;
  return Slide::open(path, options);
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

// Each format's slide is written once and shared by the suite's tests.
class DirectTiff : public ::testing::TestWithParam<Format> {
 protected:
  static void SetUpTestSuite() { dir_ = new TempDir(); }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    const Format& f = GetParam();
    path_ = dir_->file(std::string(f.name) + (f.flavor == TiffFlavor::aperio ? ".svs" : ".tif"));
    if (std::filesystem::exists(path_)) return;
    TiffWriterOptions options;
    options.flavor = f.flavor;
    options.compression = f.compression;
    options.level_factor = f.factor;
    options.min_level_size = 200;
    testing::write_pattern_slide(path_, f.width, f.height, options);
  }

  static TempDir* dir_;
  std::string path_;
};

TempDir* DirectTiff::dir_ = nullptr;

TEST_P(DirectTiff, SamePixelsAsOpenSlideOnEveryLevel) {
  const Format& f = GetParam();
  const Slide direct = Slide::open(path_);
  const Slide reference = open_with_openslide(path_);
  ASSERT_TRUE(direct.reads_tiff_directly()) << direct.reader();
  EXPECT_EQ(direct.reader(),
            f.compression == TiffCompression::jpeg ? "direct TIFF (JPEG tiles)" : "direct TIFF (deflate tiles)");
  EXPECT_FALSE(reference.reads_tiff_directly());
  EXPECT_EQ(reference.reader(), "OpenSlide (direct TIFF disabled)");
  ASSERT_EQ(direct.level_count(), reference.level_count());
  ASSERT_GE(direct.level_count(), 3);

  for (int i = 0; i < direct.level_count(); ++i) {
    SCOPED_TRACE("level " + std::to_string(i));
    const SlideLevel& level = direct.level(i);
    const int lw = static_cast<int>(level.width);
    const int lh = static_cast<int>(level.height);
    const int tw = static_cast<int>(level.tile_width);
    const int th = static_cast<int>(level.tile_height);
    ASSERT_GT(tw, 0);
    // From the origin OpenSlide places level pixels exactly on every level, whatever its downsample; the
    // margin takes in the partial edge tiles and the white past them.
    const cv::Mat full = reference.read_region(0, 0, i, lw + kMargin, lh + kMargin);
    EXPECT_EQ(differing_values(direct.read_region(0, 0, i, lw + kMargin, lh + kMargin), full), 0);

    struct Region {
      const char* what;
      std::int64_t lx, ly;
      int w, h;
    };
    const Region regions[] = {
        {"across a tile corner", tw - 5, th - 7, 13, 11},
        {"a column across every tile row", tw - 1, 0, 2, lh},
        {"a row across every tile column", 0, th + 1, lw, 3},
        {"past the right and bottom edges", lw - 9, lh - 4, 20, 12},
        {"before the top-left corner", -6, -3, 17, 9},
        {"outside the level", lw + 5, 2, 4, 4},
        {"one pixel", lw / 2, lh / 3, 1, 1},
        {"nearly the whole level", 3, 5, lw - 3, lh - 2},
    };
    for (const Region& r : regions) {
      SCOPED_TRACE(r.what);
      // Level-0 coordinates as read_level_window() makes them.
      const std::int64_t x = std::llround(static_cast<double>(r.lx) * level.downsample);
      const std::int64_t y = std::llround(static_cast<double>(r.ly) * level.downsample);
      const cv::Mat pixels = direct.read_region(x, y, i, r.w, r.h);
      EXPECT_EQ(differing_values(pixels, crop_or_white(full, r.lx, r.ly, r.w, r.h)), 0);
      // Where OpenSlide itself lands on the level's pixel grid, compare with its own read of the region too.
      if (integral(level.downsample)) {
        EXPECT_EQ(differing_values(pixels, reference.read_region(x, y, i, r.w, r.h)), 0);
      }
    }
  }
}

TEST_P(DirectTiff, AReopenedSlideReadsWhatTheOpenedOneRead) {
  const Slide opened = Slide::open(path_);
  const auto layout = opened.layout();
  ASSERT_TRUE(layout.has_value());
  const Slide reopened = Slide::reopen(*layout);
  EXPECT_EQ(reopened.reader(), opened.reader());
  EXPECT_EQ(reopened.vendor(), opened.vendor());
  EXPECT_EQ(reopened.mpp(), opened.mpp());
  EXPECT_EQ(reopened.mpp_y(), opened.mpp_y());
  ASSERT_EQ(reopened.level_count(), opened.level_count());
  // Levels from the finest to the coarsest and back: each level's directory is read when first needed.
  for (const int i : {reopened.level_count() - 1, 0, 1}) {
    SCOPED_TRACE("level " + std::to_string(i));
    const SlideLevel& level = opened.level(i);
    EXPECT_EQ(reopened.level(i).downsample, level.downsample);
    EXPECT_EQ(reopened.level(i).tile_width, level.tile_width);
    const auto w = level.width + kMargin;
    const auto h = level.height + kMargin;
    EXPECT_EQ(differing_values(reopened.read_region(0, 0, i, w, h), opened.read_region(0, 0, i, w, h)), 0);
  }
  EXPECT_EQ(differing_values(reopened.read_at_mpp(301, 207, 37, 29, 0.75), opened.read_at_mpp(301, 207, 37, 29, 0.75)),
            0);
  EXPECT_TRUE(reopened.properties().empty());  // reads alone: no OpenSlide
}

TEST_P(DirectTiff, ReadsAtMppMatchOpenSlideAndWindows) {
  const Slide direct = Slide::open(path_);
  const Slide reference = open_with_openslide(path_);
  ASSERT_TRUE(direct.reads_tiff_directly());
  constexpr int kSide = 29;
  int compared = 0;
  for (double mpp : {0.25, 0.5, 0.6, 0.75, 1.0, 1.5, 2.25}) {
    SCOPED_TRACE("mpp " + std::to_string(mpp));
    const bool exact = integral(direct.level(direct.best_level_for_mpp(mpp)).downsample);
    const auto side0 = static_cast<std::int64_t>(std::ceil(kSide * mpp / direct.mpp()));
    // A row of tiles from inside the slide to past its right edge, as `tessera tile` reads them.
    const std::int64_t y = direct.height() / 3 + 1;
    const std::int64_t x_first = direct.width() - 5 * side0 + 7;
    const SlideWindow window(direct, x_first, y, 6 * side0, side0, mpp);
    for (int k = 0; k < 6; ++k) {
      const std::int64_t x = x_first + k * side0;
      const cv::Mat tile = direct.read_at_mpp(x, y, kSide, kSide, mpp);
      ASSERT_EQ(tile.size(), cv::Size(kSide, kSide));
      if (window.contains(x, y, kSide, kSide, mpp)) {
        EXPECT_EQ(differing_values(window.read_at_mpp(x, y, kSide, kSide, mpp), tile), 0) << "tile " << k;
      }
      if (exact) {
        EXPECT_EQ(differing_values(reference.read_at_mpp(x, y, kSide, kSide, mpp), tile), 0) << "tile " << k;
        ++compared;
      }
    }
  }
  EXPECT_GE(compared, 6);  // at least level 0; more where a coarser level's downsample is an integer
}

INSTANTIATE_TEST_SUITE_P(
    PatternSlides, DirectTiff,
    ::testing::Values(Format{"aperio_jpeg_x2", TiffFlavor::aperio, TiffCompression::jpeg, 2, 2000, 1500},
                      Format{"aperio_deflate_x3", TiffFlavor::aperio, TiffCompression::deflate, 3, 2000, 1500},
                      Format{"generic_jpeg_x3", TiffFlavor::generic, TiffCompression::jpeg, 3, 2000, 1500},
                      Format{"generic_deflate_x2", TiffFlavor::generic, TiffCompression::deflate, 2, 2000, 1500},
                      Format{"generic_jpeg_odd_x2", TiffFlavor::generic, TiffCompression::jpeg, 2, 1000, 777},
                      Format{"aperio_jpeg_odd_x3", TiffFlavor::aperio, TiffCompression::jpeg, 3, 1000, 777}),
    [](const ::testing::TestParamInfo<Format>& param) { return std::string(param.param.name); });

// A two-level tiled TIFF written here with libtiff: level 0 is 300×200 pattern pixels, level 1 is 150×100
// holding pattern_pixel(2x, 2y), both in 64×48 tiles (partial tiles on the right and at the bottom). The tile size
// is the same on both levels because OpenSlide 3.4.1 (through TIFFRGBAImage) fails on uncompressed levels whose
// tile sizes differ.
struct Layout {
  const char* name;
  std::uint16_t compression;
  std::uint16_t photometric;
  std::uint16_t planar;
  std::uint16_t predictor;  // 1 = none
  const char* reader;       // the expected Slide::reader()
};

std::ostream& operator<<(std::ostream& os, const Layout& l) { return os << l.name; }

constexpr int kPlainWidth = 300;
constexpr int kPlainHeight = 200;
constexpr double kPlainPixelsPerCentimetre = 40000.0;  // 0.25 µm/px

constexpr int kPlainTileWidth = 64;
constexpr int kPlainTileHeight = 48;

void write_level(TIFF* tif, const Layout& layout, int width, int height, int step, bool reduced) {
  const int tile_width = kPlainTileWidth;
  const int tile_height = kPlainTileHeight;
  TIFFSetField(tif, TIFFTAG_SUBFILETYPE, reduced ? FILETYPE_REDUCEDIMAGE : 0);
  TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, width);
  TIFFSetField(tif, TIFFTAG_IMAGELENGTH, height);
  TIFFSetField(tif, TIFFTAG_TILEWIDTH, tile_width);
  TIFFSetField(tif, TIFFTAG_TILELENGTH, tile_height);
  TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, 3);
  TIFFSetField(tif, TIFFTAG_PLANARCONFIG, layout.planar);
  TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, layout.photometric);
  TIFFSetField(tif, TIFFTAG_COMPRESSION, layout.compression);
  if (layout.predictor != PREDICTOR_NONE) TIFFSetField(tif, TIFFTAG_PREDICTOR, layout.predictor);
  if (layout.compression == COMPRESSION_JPEG) TIFFSetField(tif, TIFFTAG_JPEGQUALITY, 90);
  TIFFSetField(tif, TIFFTAG_XRESOLUTION, kPlainPixelsPerCentimetre / step);
  TIFFSetField(tif, TIFFTAG_YRESOLUTION, kPlainPixelsPerCentimetre / step);
  TIFFSetField(tif, TIFFTAG_RESOLUTIONUNIT, RESUNIT_CENTIMETER);
  const int planes = layout.planar == PLANARCONFIG_SEPARATE ? 3 : 1;
  const int channels = 3 / planes;
  std::vector<unsigned char> tile(static_cast<std::size_t>(tile_width) * tile_height * channels);
  for (int plane = 0; plane < planes; ++plane) {
    for (int y0 = 0; y0 < height; y0 += tile_height) {
      for (int x0 = 0; x0 < width; x0 += tile_width) {
        std::fill(tile.begin(), tile.end(), 0);
        for (int r = 0; r < tile_height && y0 + r < height; ++r) {
          for (int c = 0; c < tile_width && x0 + c < width; ++c) {
            const cv::Vec3b p =
                pattern_pixel(static_cast<std::int64_t>(x0 + c) * step, static_cast<std::int64_t>(y0 + r) * step);
            for (int k = 0; k < channels; ++k) {
              tile[(static_cast<std::size_t>(r) * tile_width + c) * channels + k] = p[planes == 1 ? k : plane];
            }
          }
        }
        const auto index = TIFFComputeTile(tif, static_cast<std::uint32_t>(x0), static_cast<std::uint32_t>(y0), 0,
                                           static_cast<std::uint16_t>(plane));
        ASSERT_GT(TIFFWriteEncodedTile(tif, index, tile.data(), static_cast<tmsize_t>(tile.size())), 0);
      }
    }
  }
  ASSERT_EQ(TIFFWriteDirectory(tif), 1);
}

void write_two_level_tiff(const std::string& path, const Layout& layout) {
  TIFF* tif = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(tif, nullptr);
  write_level(tif, layout, kPlainWidth, kPlainHeight, 1, false);
  write_level(tif, layout, kPlainWidth / 2, kPlainHeight / 2, 2, true);
  TIFFClose(tif);
}

class OtherLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(OtherLayouts, DirectWhereItCanAndTheSamePixels) {
  const Layout& layout = GetParam();
  TempDir dir;
  const std::string path = dir.file("plain.tif");
  write_two_level_tiff(path, layout);
  const Slide slide = Slide::open(path);
  const Slide reference = open_with_openslide(path);
  EXPECT_EQ(slide.vendor(), "generic-tiff");
  EXPECT_EQ(slide.reader(), layout.reader);
  ASSERT_EQ(slide.level_count(), 2);
  const bool lossless = layout.compression != COMPRESSION_JPEG;
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("level " + std::to_string(i));
    const SlideLevel& level = slide.level(i);
    const int lw = static_cast<int>(level.width);
    const int lh = static_cast<int>(level.height);
    const cv::Mat pixels = slide.read_region(0, 0, i, lw + kMargin, lh + kMargin);
    EXPECT_EQ(differing_values(pixels, reference.read_region(0, 0, i, lw + kMargin, lh + kMargin)), 0);
    // Level pixels (61, 29) to (130, 68): across tile borders on both levels.
    const cv::Mat inner =
        slide.read_region(std::llround(61 * level.downsample), std::llround(29 * level.downsample), i, 70, 40);
    EXPECT_EQ(differing_values(inner, crop_or_white(pixels, 61, 29, 70, 40)), 0);
    // The pixels are the pattern's (exactly when lossless), white past the edges.
    double worst = 0.0;
    for (int r = 0; r < lh + kMargin; ++r) {
      for (int c = 0; c < lw + kMargin; ++c) {
        const cv::Vec3b actual = pixels.at<cv::Vec3b>(r, c);
        const cv::Vec3b expected =
            r < lh && c < lw ? pattern_pixel(c * (i + 1), r * (i + 1)) : cv::Vec3b(255, 255, 255);
        for (int k = 0; k < 3; ++k) worst = std::max(worst, std::abs(static_cast<double>(actual[k]) - expected[k]));
      }
    }
    EXPECT_LE(worst, lossless ? 0.0 : 40.0);  // JPEG: the pattern's blue wraps sharply
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plain, OtherLayouts,
    ::testing::Values(
        Layout{"lzw", COMPRESSION_LZW, PHOTOMETRIC_RGB, PLANARCONFIG_CONTIG, PREDICTOR_NONE, "direct TIFF (LZW tiles)"},
        Layout{"lzw_predictor", COMPRESSION_LZW, PHOTOMETRIC_RGB, PLANARCONFIG_CONTIG, PREDICTOR_HORIZONTAL,
               "direct TIFF (LZW tiles)"},
        Layout{"uncompressed", COMPRESSION_NONE, PHOTOMETRIC_RGB, PLANARCONFIG_CONTIG, PREDICTOR_NONE,
               "direct TIFF (uncompressed tiles)"},
        Layout{"jpeg_rgb", COMPRESSION_JPEG, PHOTOMETRIC_RGB, PLANARCONFIG_CONTIG, PREDICTOR_NONE,
               "direct TIFF (JPEG tiles)"},
        Layout{"planar_separate", COMPRESSION_ADOBE_DEFLATE, PHOTOMETRIC_RGB, PLANARCONFIG_SEPARATE, PREDICTOR_NONE,
               "OpenSlide (direct TIFF not used: level 0: 8 bits, 3 samples, planar configuration 2, sample format 1 "
               "(not 8-bit contiguous RGB))"}),
    [](const ::testing::TestParamInfo<Layout>& param) { return std::string(param.param.name); });

// An Aperio-style slide of one 512×256 level in 256×256 tiles with the given compression, whose raw tiles are
// `tiles` (an empty one is left unwritten: byte count 0, as some Aperio scanners leave tiles).
void write_aperio_raw(const std::string& path, std::uint16_t compression, const std::vector<std::string>& tiles) {
  TIFF* tif = TIFFOpen(path.c_str(), "w");
  ASSERT_NE(tif, nullptr);
  TIFFSetField(tif, TIFFTAG_IMAGEWIDTH, 512);
  TIFFSetField(tif, TIFFTAG_IMAGELENGTH, 256);
  TIFFSetField(tif, TIFFTAG_TILEWIDTH, 256);
  TIFFSetField(tif, TIFFTAG_TILELENGTH, 256);
  TIFFSetField(tif, TIFFTAG_BITSPERSAMPLE, 8);
  TIFFSetField(tif, TIFFTAG_SAMPLESPERPIXEL, 3);
  TIFFSetField(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(tif, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
  TIFFSetField(tif, TIFFTAG_COMPRESSION, compression);
  TIFFSetField(tif, TIFFTAG_IMAGEDESCRIPTION,
               "Aperio Image Library Tessera test\r\n512x256 [0,0 512x256] (256x256)|AppMag = 20|MPP = 0.5");
  for (std::uint32_t t = 0; t < tiles.size(); ++t) {
    if (tiles[t].empty()) continue;
    std::string bytes = tiles[t];
    ASSERT_EQ(TIFFWriteRawTile(tif, t, bytes.data(), static_cast<tmsize_t>(bytes.size())),
              static_cast<tmsize_t>(bytes.size()));
  }
  ASSERT_EQ(TIFFWriteDirectory(tif), 1);
  TIFFClose(tif);
}

TEST(DirectTiffReopen, ASlideRewrittenWithOtherPixelsSinceItsLayoutWasTakenIsRefusedNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("rewritten.tif");
  TiffWriterOptions options;
  options.compression = TiffCompression::deflate;
  testing::write_pattern_slide(path, 600, 400, options);
  const auto layout = Slide::open(path).layout();
  ASSERT_TRUE(layout.has_value());
  const auto planned_time = std::filesystem::last_write_time(path);
  // Other pixels in the same file: the same size, the same directories, only the modification time tells. (The
  // time is set explicitly, a day before the planned one, as a copy restored with its own older time would have it:
  // a rewrite's own time could fall within the same tick of the file system's clock as the planned one.)
  ASSERT_EQ(testing::damage_tiles(
                path, 0, [](std::uint32_t, std::uint32_t) { return true; }, testing::TileDamage::zeros),
            6);
  ASSERT_EQ(static_cast<std::int64_t>(std::filesystem::file_size(path)), layout->file_size);
  std::filesystem::last_write_time(path, planned_time - std::chrono::hours(24));
  try {
    (void)Slide::reopen(*layout);
    FAIL() << "a changed file was reopened";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("changed since it was planned (size/mtime)"), std::string::npos) << e.what();
  }
}

TEST(DirectTiffReopen, ASlideChangedSinceItsLayoutWasTakenFailsItsReadsNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("changing.tif");
  TiffWriterOptions options;
  options.compression = TiffCompression::jpeg;
  testing::write_pattern_slide(path, 600, 400, options);
  const auto layout = Slide::open(path).layout();
  ASSERT_TRUE(layout.has_value());
  options.tile_size = 128;  // the same levels in other tiles
  testing::write_pattern_slide(path, 600, 400, options);
  EXPECT_THROW((void)Slide::reopen(*layout), core::InputError);  // its size and time
  // A change the size and time do not show (or one made after reopen()): the directory read is checked too.
  auto stale = *layout;
  const auto now = Slide::open(path).layout();
  ASSERT_TRUE(now.has_value());
  stale.file_size = now->file_size;
  stale.file_mtime_ns = now->file_mtime_ns;
  const Slide reopened = Slide::reopen(stale);
  try {
    reopened.read_region(0, 0, 0, 50, 50);
    FAIL() << "a changed file was read";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("the file changed since it was planned"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(Slide::reopen(*layout), core::FileNotFoundError);
}

TEST(DirectTiffAperio, Jpeg2000TilesAreDeclined) {
  TempDir dir;
  const std::string path = dir.file("j2k.svs");
  // The tiles' content does not matter: only the compression tag is looked at when opening. (OpenSlide itself
  // decodes tiles while opening, so the Slide-level fallback is shown by the planar_separate layout instead.)
  write_aperio_raw(path, 33003, {std::string(100, '\x11'), std::string(100, '\x22')});
  std::string why_not;
  EXPECT_EQ(TiffTileReader::open(path, {{512, 256}}, true, why_not), nullptr);
  EXPECT_EQ(why_not, "level 0: JPEG 2000 tiles (compression 33003)");
}

TEST(DirectTiffAperio, EmptyTilesAreWhiteAsWithOpenSlide) {
  TempDir dir;
  const std::string path = dir.file("holes.svs");
  std::string tile(256 * 256 * 3, '\0');
  for (std::size_t i = 0; i < tile.size(); ++i) tile[i] = static_cast<char>(i * 7 % 251);
  write_aperio_raw(path, COMPRESSION_NONE, {tile, ""});  // the second tile is never written
  const Slide slide = Slide::open(path);
  const Slide reference = open_with_openslide(path);
  ASSERT_TRUE(slide.reads_tiff_directly()) << slide.reader();
  const cv::Mat pixels = slide.read_region(0, 0, 0, 512, 256);
  EXPECT_EQ(differing_values(pixels, reference.read_region(0, 0, 0, 512, 256)), 0);
  EXPECT_EQ(cv::countNonZero(pixels(cv::Rect(256, 0, 256, 256)).reshape(1) != 255), 0);
  EXPECT_EQ(std::memcmp(pixels.ptr(0), tile.data(), 256 * 3), 0);
}

TEST(DirectTiffRead, DamagedTileNamesTheTileLevelAndRegion) {
  TempDir dir;
  const std::string path = dir.file("damaged.tif");
  TiffWriterOptions options;
  options.min_level_size = 200;
  testing::write_pattern_slide(path, 600, 600, options);
  std::uint64_t offset = 0;
  {
    TIFF* tif = TIFFOpen(path.c_str(), "r");
    ASSERT_NE(tif, nullptr);
    ASSERT_EQ(TIFFSetDirectory(tif, 1), 1);
    offset = TIFFGetStrileOffset(tif, 1);  // level 1, second tile
    TIFFClose(tif);
  }
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offset));
    const std::string garbage(64, '\x5a');
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  const Slide slide = Slide::open(path);
  ASSERT_TRUE(slide.reads_tiff_directly());
  EXPECT_EQ(slide.read_region(0, 0, 1, 256, 256).size(), cv::Size(256, 256));  // the first tile is intact
  for (int attempt = 0; attempt < 2; ++attempt) {  // a failed tile is not cached: it fails again
    try {
      slide.read_region(500, 20, 1, 30, 40);
      FAIL() << "expected a core::InputError";
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_EQ(e.context("level"), "1");
      EXPECT_EQ(e.context("region"), "(500, 20, 30x40)");
      EXPECT_NE(std::string(e.what()).find("cannot decode tile 1 (column 1, row 0) of level 1 (TIFF directory 1)"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(slide.read_region(0, 0, 0, 600, 600).size(), cv::Size(600, 600));  // other levels still read
}

TEST(DirectTiffRead, ConcurrentReadsGiveTheSamePixels) {
  TempDir dir;
  const std::string path = dir.file("shared.tif");
  TiffWriterOptions options;
  options.level_factor = 3;
  options.min_level_size = 200;
  testing::write_pattern_slide(path, 1000, 777, options);
  const Slide slide = Slide::open(path);
  ASSERT_TRUE(slide.reads_tiff_directly());

  struct Read {
    std::int64_t x, y;
    int level, w, h;
  };
  constexpr int kThreads = 4;
  constexpr int kReads = 30;
  std::vector<std::vector<Read>> reads(kThreads);
  std::mt19937 rng(20240611);
  for (auto& list : reads) {
    for (int k = 0; k < kReads; ++k) {
      const int level = static_cast<int>(rng() % static_cast<unsigned>(slide.level_count()));
      list.push_back({static_cast<std::int64_t>(rng() % 1000), static_cast<std::int64_t>(rng() % 777), level,
                      static_cast<int>(1 + rng() % 300), static_cast<int>(1 + rng() % 300)});
    }
  }
  // The expected pixels, from a slide no other thread touches.
  std::vector<std::vector<cv::Mat>> expected(kThreads);
  {
    const Slide alone = Slide::open(path);
    for (int t = 0; t < kThreads; ++t) {
      for (const Read& r : reads[static_cast<std::size_t>(t)]) {
        expected[static_cast<std::size_t>(t)].push_back(alone.read_region(r.x, r.y, r.level, r.w, r.h));
      }
    }
  }
  std::vector<std::vector<cv::Mat>> actual(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (const Read& r : reads[static_cast<std::size_t>(t)]) {
        actual[static_cast<std::size_t>(t)].push_back(slide.read_region(r.x, r.y, r.level, r.w, r.h));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (std::size_t t = 0; t < kThreads; ++t) {
    ASSERT_EQ(actual[t].size(), expected[t].size());
    for (std::size_t k = 0; k < actual[t].size(); ++k) {
      EXPECT_EQ(differing_values(actual[t][k], expected[t][k]), 0) << "thread " << t << ", read " << k;
    }
  }
}

TEST(TiffTileReader, MapsLevelsToTiledDirectoriesAndEvictsOldTiles) {
  TempDir dir;
  const std::string path = dir.file("slide.svs");
  TiffWriterOptions options;
  options.flavor = TiffFlavor::aperio;
  options.min_level_size = 200;
  testing::write_pattern_slide(path, 1000, 777, options);
  const Slide slide = open_with_openslide(path);
  std::vector<TiffLevelSize> sizes;
  for (const SlideLevel& level : slide.levels()) sizes.push_back({level.width, level.height});
  ASSERT_EQ(sizes.size(), 4U);  // 1000x777, 500x389, 250x195, 125x98

  constexpr std::size_t kTileBytes = 256 * 256 * 3;
  std::string why_not;
  const auto small = TiffTileReader::open(path, sizes, true, why_not, 3 * kTileBytes);
  ASSERT_NE(small, nullptr) << why_not;
  EXPECT_TRUE(why_not.empty());
  EXPECT_EQ(small->description(), "JPEG tiles");
  // The Aperio thumbnail is directory 1, between level 0 and level 1.
  EXPECT_EQ(small->directory(0), 0);
  EXPECT_EQ(small->directory(1), 2);
  EXPECT_EQ(small->directory(2), 3);
  EXPECT_EQ(small->directory(3), 4);

  // Level 0 has 4×4 tiles: reading it twice with room for three tiles evicts and decodes them again.
  const cv::Mat first = small->read(0, 0, 0, 1000, 777);
  EXPECT_LE(small->cached_bytes(), 3 * kTileBytes);
  EXPECT_GT(small->cached_bytes(), 0U);
  const cv::Mat second = small->read(0, -3, -2, 1003, 779);
  EXPECT_EQ(differing_values(second(cv::Rect(3, 2, 1000, 777)), first), 0);
  EXPECT_EQ(cv::countNonZero(second.rowRange(0, 2).reshape(1) != 255), 0);
  EXPECT_EQ(differing_values(first, slide.read_region(0, 0, 0, 1000, 777)), 0);

  // A level size with no tiled directory: declined with the reason.
  sizes.push_back({60, 40});
  EXPECT_EQ(TiffTileReader::open(path, sizes, true, why_not), nullptr);
  EXPECT_EQ(why_not, "level 4: no tiled directory of 60x40");
  EXPECT_THROW(small->read(4, 0, 0, 1, 1), core::InternalError);
}

TEST(TiffTileReader, DeclinesFilesLibtiffCannotOpen) {
  TempDir dir;
  const std::string path = dir.file("text.tif");
  { std::ofstream(path) << "not a TIFF"; }
  std::string why_not;
  EXPECT_EQ(TiffTileReader::open(path, {{10, 10}}, false, why_not), nullptr);
  EXPECT_NE(why_not.find("libtiff cannot open the file"), std::string::npos) << why_not;
}

}  // namespace
}  // namespace tessera::io

namespace tessera::io {
namespace {

// A tile of `shade`, as a decode would return it.
cv::Mat shaded_tile(int shade) { return cv::Mat(4, 4, CV_8UC3, cv::Scalar(shade, shade, shade)); }

// From within a decode of `key`: starts another thread that needs the same tile (its own decode, if it makes one,
// counted in `decodes` and giving `shade`), and returns once that thread waits for this decode.
std::future<cv::Mat> start_waiter(TileCache& cache, std::uint64_t key, std::atomic<int>& decodes, int shade) {
  auto waiter = std::async(std::launch::async, [&cache, key, &decodes, shade] {
    return cache.get(key, [&decodes, shade] {
      ++decodes;
      return shaded_tile(shade);
    });
  });
  while (cache.waiting(key) == 0) std::this_thread::yield();
  return waiter;
}

TEST(TileCache, AThreadWaitsForTheDecodeAnotherThreadIsDoingInsteadOfDecodingAgain) {
  TileCache cache(std::size_t{1} << 20);
  const auto key = TileCache::key(1, 7);
  std::atomic<int> decodes{0};
  std::future<cv::Mat> second;
  const cv::Mat first = cache.get(key, [&] {
    ++decodes;
    second = start_waiter(cache, key, decodes, 2);  // another thread needs the same tile while this one decodes it
    return shaded_tile(1);
  });
  const cv::Mat waited = second.get();
  EXPECT_EQ(decodes, 1);
  EXPECT_EQ(waited.data, first.data);  // the one decode's pixels
  EXPECT_EQ(cache.bytes(), first.total() * first.elemSize());
  EXPECT_EQ(cache.get(key, [] { return shaded_tile(3); }).data, first.data);  // cached now
}

TEST(TileCache, AThreadWhoseAwaitedDecodeFailedDecodesTheTileItself) {
  TileCache cache(std::size_t{1} << 20);
  const auto key = TileCache::key(0, 3);
  std::atomic<int> decodes{0};
  std::future<cv::Mat> second;
  EXPECT_THROW(cache.get(key,
                         [&]() -> cv::Mat {
                           ++decodes;
                           second = start_waiter(cache, key, decodes, 5);
                           throw core::CorruptTileError("cannot decode tile 3", "slide.tif");
                         }),
               core::CorruptTileError);
  const cv::Mat own = second.get();
  EXPECT_EQ(decodes, 2);
  EXPECT_EQ(own.at<cv::Vec3b>(0, 0), cv::Vec3b(5, 5, 5));  // its own decode's pixels, not kept: a failed
  EXPECT_EQ(cache.bytes(), 0u);                            // decode's waiter does not fill the cache
  EXPECT_EQ(cache.waiting(key), 0u);
}

}  // namespace
}  // namespace tessera::io
