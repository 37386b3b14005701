// The slide reader and the annotation reader on real files nobody on the project made (../shared/data/real-slides,
// described in ../shared/data/README.md): an Aperio scan, a Hamamatsu NDPI, a generic pyramidal TIFF whose
// downsamples are not powers of two and whose resolution tags are a screen default, the corrupt files of
// OpenSlide's and histolab's test suites, and a CAMELYON16 ground truth. Every test skips, naming the missing file,
// when the shared data is not beside the repository.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <tiffio.h>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "io/annotations.h"
#include "io/slide.h"
#include "tests/testing/testing.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

fs::path real_file(const std::string& name) { return testing::shared_data_dir() / "real-slides" / name; }

SlideOpenOptions direct(bool direct_tiff, double assume_mpp = 0.0) {
  SlideOpenOptions options;
  options.direct_tiff = direct_tiff;
  options.assume_mpp = assume_mpp;
  return options;
}

// Whether every pixel of an RGB image is `colour`.
bool all_of_colour(const cv::Mat& rgb, const cv::Vec3b& colour) {
  for (int r = 0; r < rgb.rows; ++r) {
    for (int c = 0; c < rgb.cols; ++c) {
      if (rgb.at<cv::Vec3b>(r, c) != colour) return false;
    }
  }
  return true;
}

// TIFF directory `directory` of a tiled, 8-bit, 3-sample, contiguous TIFF, decoded tile by tile with libtiff
// (TIFFReadTile): the reference for what the file holds.
cv::Mat libtiff_directory(const std::string& path, int directory) {
  TIFF* tif = TIFFOpen(path.c_str(), "r");
  EXPECT_NE(tif, nullptr) << path;
  if (tif == nullptr) return {};
  std::uint32_t width = 0, height = 0, tile_width = 0, tile_height = 0;
  std::uint16_t samples = 0;
  EXPECT_EQ(TIFFSetDirectory(tif, static_cast<tdir_t>(directory)), 1);
  TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &width);
  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &height);
  TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tile_width);
  TIFFGetField(tif, TIFFTAG_TILELENGTH, &tile_height);
  TIFFGetField(tif, TIFFTAG_SAMPLESPERPIXEL, &samples);
  EXPECT_EQ(samples, 3);
  cv::Mat out(static_cast<int>(height), static_cast<int>(width), CV_8UC3);
  std::vector<std::uint8_t> tile(static_cast<std::size_t>(TIFFTileSize(tif)));
  for (std::uint32_t y = 0; y < height; y += tile_height) {
    for (std::uint32_t x = 0; x < width; x += tile_width) {
      EXPECT_GT(TIFFReadTile(tif, tile.data(), x, y, 0, 0), 0);
      for (std::uint32_t r = y; r < std::min(height, y + tile_height); ++r) {
        for (std::uint32_t c = x; c < std::min(width, x + tile_width); ++c) {
          const std::uint8_t* p = tile.data() + (static_cast<std::size_t>(r - y) * tile_width + (c - x)) * 3;
          out.at<cv::Vec3b>(static_cast<int>(r), static_cast<int>(c)) = {p[0], p[1], p[2]};
        }
      }
    }
  }
  TIFFClose(tif);
  return out;
}

// How many pixels of two RGB images differ, and the first that does (for the failure message).
struct Difference {
  std::int64_t pixels = 0;
  cv::Point first{-1, -1};
};
Difference compare(const cv::Mat& a, const cv::Mat& b) {
  Difference d;
  for (int r = 0; r < a.rows; ++r) {
    for (int c = 0; c < a.cols; ++c) {
      if (a.at<cv::Vec3b>(r, c) != b.at<cv::Vec3b>(r, c)) {
        if (d.pixels++ == 0) d.first = {c, r};
      }
    }
  }
  return d;
}

// OpenSlide's CMU-1-Small-Region: one level of 2220×2967 px in 240×240 JPEG tiles, 0.499 µm/px, 20×.
TEST(RealSlides, AperioScanGeometry) {
  const fs::path path = real_file("cmu-1-small-region.svs");
  if (!fs::exists(path)) GTEST_SKIP() << "no real data at " << path << " (../shared/data is absent)";
  const Slide slide = Slide::open(path.string());
  EXPECT_EQ(slide.vendor(), "aperio");
  EXPECT_EQ(slide.reader(), "direct TIFF (JPEG tiles)");
  ASSERT_EQ(slide.level_count(), 1);
  EXPECT_EQ(slide.width(), 2220);
  EXPECT_EQ(slide.height(), 2967);
  EXPECT_EQ(slide.level(0).tile_width, 240);
  EXPECT_EQ(slide.level(0).tile_height, 240);
  EXPECT_DOUBLE_EQ(slide.mpp(), 0.499);
  EXPECT_DOUBLE_EQ(slide.mpp_y(), 0.499);
  EXPECT_EQ(slide.mpp_source(), MppSource::openslide_property);
  EXPECT_EQ(slide.objective_power().value_or(0.0), 20.0);
  std::vector<std::string> associated;
  for (const auto& a : slide.associated_images()) associated.push_back(a.name);
  std::sort(associated.begin(), associated.end());
  EXPECT_EQ(associated, (std::vector<std::string>{"label", "macro", "thumbnail"}));
  const cv::Mat label = slide.read_associated_image("label");
  EXPECT_EQ(label.cols, 387);
  EXPECT_EQ(label.rows, 463);
  // A scanner's slide: not made by tessera synth (io/provenance.h).
  EXPECT_FALSE(slide.synthetic());
}

// Every real slide that opens is "real" to the synthetic-slide marker (io/provenance.h), whatever its vendor.
TEST(RealSlides, NoScanCarriesTheSyntheticSlideMarker) {
  const fs::path dir = testing::shared_data_dir() / "real-slides";
  if (!fs::exists(dir / "fluorescence-dapi.ndpi"))
    GTEST_SKIP() << "no real data at " << dir << " (../shared/data is absent)";
  for (const std::string name : {"cmu-1-small-region.svs", "fluorescence-dapi.ndpi", "small.svs", "boxes.tiff"}) {
    SCOPED_TRACE(name);
    const Slide slide = Slide::open((dir / name).string(), direct(true, 0.25));
    EXPECT_FALSE(slide.synthetic());
  }
}

// The direct TIFF path decodes the scanner's own JPEG tiles to exactly OpenSlide's pixels: the whole level, and
// regions that start inside a tile, span tile borders, cover the partial last column and row of tiles (2220 = 9·240
// + 60, 2967 = 12·240 + 87) and reach past the slide (white on both paths).
TEST(RealSlides, DirectTiffMatchesOpenSlidePixelForPixelOnTheAperioScan) {
  const fs::path path = real_file("cmu-1-small-region.svs");
  if (!fs::exists(path)) GTEST_SKIP() << "no real data at " << path << " (../shared/data is absent)";
  const Slide fast = Slide::open(path.string(), direct(true));
  const Slide reference = Slide::open(path.string(), direct(false));
  ASSERT_TRUE(fast.reads_tiff_directly());
  ASSERT_FALSE(reference.reads_tiff_directly());
  struct Region {
    std::int64_t x, y, w, h;
  };
  const std::vector<Region> regions = {{0, 0, 2220, 2967},     {1, 1, 479, 481},   {239, 479, 3, 2},
                                       {2100, 2800, 200, 300}, {-17, -5, 300, 64}, {1000, 1300, 1, 700}};
  for (const auto& r : regions) {
    SCOPED_TRACE(::testing::Message() << "region (" << r.x << ", " << r.y << ", " << r.w << "x" << r.h << ")");
    const cv::Mat a = fast.read_region(r.x, r.y, 0, r.w, r.h);
    const cv::Mat b = reference.read_region(r.x, r.y, 0, r.w, r.h);
    ASSERT_EQ(a.size(), b.size());
    const Difference d = compare(a, b);
    EXPECT_EQ(d.pixels, 0) << "first difference at (" << d.first.x << ", " << d.first.y << ")";
  }
  // Not a blank image that would agree trivially: the scan has tissue and glass.
  const cv::Mat whole = fast.read_region(0, 0, 0, 2220, 2967);
  cv::Scalar mean, stddev;
  cv::meanStdDev(whole, mean, stddev);
  EXPECT_GT(stddev[0], 20.0);
  // Past the right and bottom edges both paths give white.
  const cv::Mat outside = fast.read_region(2210, 2960, 0, 20, 20);
  EXPECT_EQ(outside.at<cv::Vec3b>(19, 19), cv::Vec3b(255, 255, 255));
  // And at a target resolution (area-resampled from the one level) they agree too.
  for (const double target : {0.75, 1.0, 2.0}) {
    SCOPED_TRACE(::testing::Message() << target << " um/px");
    const Difference d =
        compare(fast.read_at_mpp(480, 960, 128, 128, target), reference.read_at_mpp(480, 960, 128, 128, target));
    EXPECT_EQ(d.pixels, 0) << "first difference at (" << d.first.x << ", " << d.first.y << ")";
  }
}

// A real Hamamatsu NDPI (fluorescence): 7 levels that OpenSlide makes from the file's JPEGs, read through OpenSlide
// (the direct TIFF path is only for tiled-TIFF vendors). Every level shows the same place: a level read agrees with
// level 0 area-averaged to it, and a read at a target µm/px agrees with level 0 resampled to that µm/px.
TEST(RealSlides, NdpiLevelsThroughOpenSlide) {
  const fs::path path = real_file("fluorescence-dapi.ndpi");
  if (!fs::exists(path)) GTEST_SKIP() << "no real data at " << path << " (../shared/data is absent)";
  const Slide slide = Slide::open(path.string());
  EXPECT_EQ(slide.vendor(), "hamamatsu");
  EXPECT_FALSE(slide.reads_tiff_directly());
  EXPECT_EQ(slide.reader(), "OpenSlide");
  ASSERT_EQ(slide.level_count(), 7);
  for (int i = 0; i < slide.level_count(); ++i) {
    SCOPED_TRACE("level " + std::to_string(i));
    EXPECT_DOUBLE_EQ(slide.level(i).downsample, std::ldexp(1.0, i));
    EXPECT_EQ(slide.level(i).width, 3968 >> i);
    EXPECT_EQ(slide.level(i).height, 4864 >> i);
  }
  EXPECT_NEAR(slide.mpp(), 0.2282, 1e-4);
  EXPECT_EQ(slide.mpp_source(), MppSource::openslide_property);
  EXPECT_EQ(slide.objective_power().value_or(0.0), 40.0);
  ASSERT_EQ(slide.associated_images().size(), 1u);
  EXPECT_EQ(slide.associated_images()[0].name, "macro");

  // A 1024² level-0 window with nuclei in it (the middle of the section).
  constexpr std::int64_t kX = 1536, kY = 2048, kSide = 1024;
  const cv::Mat level0 = slide.read_region(kX, kY, 0, kSide, kSide);
  cv::Scalar mean, stddev;
  cv::meanStdDev(level0, mean, stddev);
  ASSERT_GT(stddev[2], 10.0) << "the window should hold DAPI-stained nuclei (blue)";
  for (int i = 1; i <= 4; ++i) {
    SCOPED_TRACE("level " + std::to_string(i));
    const int side = static_cast<int>(kSide >> i);
    const cv::Mat level = slide.read_region(kX, kY, i, side, side);
    cv::Mat averaged;
    cv::resize(level0, averaged, cv::Size(side, side), 0, 0, cv::INTER_AREA);
    cv::Mat diff;
    cv::absdiff(level, averaged, diff);
    // Same place, same pixels up to JPEG and the scaled decode: a shift of one level pixel would differ by far more.
    EXPECT_LT(cv::mean(diff)[2], 6.0) << "mean blue difference";
  }
  // At 1 µm/px: level 2 (0.913 µm/px) resampled by 0.913.
  EXPECT_EQ(slide.best_level_for_mpp(1.0), 2);
  const int side = static_cast<int>(std::floor(static_cast<double>(kSide) * slide.mpp() / 1.0));
  const cv::Mat at_target = slide.read_at_mpp(kX, kY, side, side, 1.0);
  ASSERT_EQ(at_target.cols, side);
  ASSERT_EQ(at_target.rows, side);
  cv::Mat expected, diff;
  cv::resize(level0(cv::Rect(0, 0, static_cast<int>(std::lround(side / slide.mpp())),
                             static_cast<int>(std::lround(side / slide.mpp())))),
             expected, cv::Size(side, side), 0, 0, cv::INTER_AREA);
  cv::absdiff(at_target, expected, diff);
  EXPECT_LT(cv::mean(diff)[2], 6.0) << "mean blue difference at 1 um/px";
}

// The corrupt and odd files of OpenSlide's and histolab's test suites give the errors ../shared/data/README.md
// documents, on both read paths, naming the file: small.svs is a valid 16×16 Aperio crop; unreadable.svs opens and
// every pixel read fails ("Bogus marker length"); unopenable.tiff (compression 52479) and broken.svs (text) do not
// open.
TEST(RealSlides, CorruptFilesGiveTheirDocumentedErrors) {
  if (!fs::exists(real_file("small.svs")))
    GTEST_SKIP() << "no real data at " << real_file("small.svs") << " (../shared/data is absent)";
  struct Case {
    std::string file;
    std::string open_error;  // "" = opens
    std::string read_error;  // "" = reads
  };
  const std::vector<Case> cases = {
      {"small.svs", "", ""},
      {"unreadable.svs", "", "Bogus marker length"},
      {"unopenable.tiff", "corrupt slide: Unsupported TIFF compression: 52479", ""},
      {"broken.svs", "unsupported slide format", ""},
  };
  for (const auto& c : cases) {
    const std::string path = real_file(c.file).string();
    for (const bool fast : {true, false}) {
      SCOPED_TRACE(c.file + (fast ? ", direct TIFF allowed" : ", OpenSlide only"));
      std::optional<Slide> slide;
      try {
        slide.emplace(Slide::open(path, direct(fast)));
        EXPECT_TRUE(c.open_error.empty()) << "opened; expected: " << c.open_error;
      } catch (const core::InputError& e) {
        EXPECT_FALSE(c.open_error.empty()) << e.what();
        EXPECT_EQ(std::string(e.what()), "file '" + path + "': " + c.open_error);
        EXPECT_EQ(e.file(), path);
      }
      if (!slide) continue;
      try {
        const cv::Mat pixels = slide->read_region(0, 0, 0, slide->width(), slide->height());
        EXPECT_TRUE(c.read_error.empty()) << "read; expected: " << c.read_error;
        EXPECT_EQ(pixels.cols, slide->width());
      } catch (const core::CorruptTileError& e) {
        EXPECT_FALSE(c.read_error.empty()) << e.what();
        EXPECT_NE(std::string(e.what()).find(c.read_error), std::string::npos) << e.what();
        EXPECT_EQ(e.file(), path);
      }
    }
  }
  // The valid crop: 16×16 at 0.499 µm/px, the same pixels on both paths.
  const Slide small = Slide::open(real_file("small.svs").string(), direct(true));
  EXPECT_EQ(small.width(), 16);
  EXPECT_EQ(small.height(), 16);
  EXPECT_DOUBLE_EQ(small.mpp(), 0.499);
  const Slide small_reference = Slide::open(real_file("small.svs").string(), direct(false));
  EXPECT_EQ(compare(small.read_region(0, 0, 0, 16, 16), small_reference.read_region(0, 0, 0, 16, 16)).pixels, 0);
}

// boxes.tiff: a generic pyramidal TIFF whose downsamples are 1, 2, 4.016 and 8.086 and whose resolution tags are a
// screen default (72 dpi). Without assume_mpp it has no resolution (refused, or opened with the resolution unknown
// for `tessera info`); with one it is read at a target µm/px from the declared, non-power-of-two levels.
TEST(RealSlides, BoxesTiffReadAtATargetResolutionWithAssumeMpp) {
  const fs::path file = real_file("boxes.tiff");
  if (!fs::exists(file)) GTEST_SKIP() << "no real data at " << file << " (../shared/data is absent)";
  const std::string path = file.string();
  try {
    Slide::open(path);
    FAIL() << "expected a core::InputError";
  } catch (const core::InputError& e) {
    EXPECT_EQ(std::string(e.what()), "file '" + path +
                                         "': the TIFF resolution tags say 352.8 µm/px, a screen default rather than a "
                                         "scan resolution; set assume_mpp in the job");
  }

  SlideOpenOptions describe;
  describe.require_mpp = false;
  const Slide unknown = Slide::open(path, describe);
  EXPECT_FALSE(unknown.has_mpp());
  EXPECT_EQ(unknown.mpp_source(), MppSource::unknown);
  EXPECT_EQ(unknown.mpp_problem(),
            "the TIFF resolution tags say 352.8 µm/px, a screen default rather than a scan "
            "resolution");
  const std::vector<double> downsamples = {1.0, 2.0, 4.016129, 8.086312};
  const std::vector<cv::Size> sizes = {{300, 250}, {150, 125}, {75, 62}, {37, 31}};
  ASSERT_EQ(unknown.level_count(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(unknown.level(i).downsample, downsamples[static_cast<std::size_t>(i)], 1e-6) << "level " << i;
    EXPECT_EQ(unknown.level(i).width, sizes[static_cast<std::size_t>(i)].width) << "level " << i;
    EXPECT_EQ(unknown.level(i).height, sizes[static_cast<std::size_t>(i)].height) << "level " << i;
  }
  // Pixels by level need no resolution; anything in µm does, and says so naming the file.
  EXPECT_EQ(unknown.read_region(0, 0, 3, 37, 31).cols, 37);
  for (const auto& use :
       std::vector<std::function<void()>>{[&] { (void)unknown.mpp(); }, [&] { (void)unknown.best_level_for_mpp(1.0); },
                                          [&] { (void)unknown.read_at_mpp(0, 0, 16, 16, 1.0); }}) {
    try {
      use();
      ADD_FAILURE() << "expected a core::InputError";
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_NE(std::string(e.what()).find("set assume_mpp"), std::string::npos) << e.what();
    }
  }

  constexpr double kAssumed = 0.25;
  const Slide fast = Slide::open(path, direct(true, kAssumed));
  const Slide reference = Slide::open(path, direct(false, kAssumed));
  ASSERT_TRUE(fast.reads_tiff_directly());
  EXPECT_EQ(fast.mpp_source(), MppSource::assumed);
  EXPECT_DOUBLE_EQ(fast.mpp(), kAssumed);
  // The coarsest level at or finer than the target (1% tolerance): level 2 (1.004 µm/px) serves 1.0 µm/px as is;
  // level 3 (2.0216) is 1.08% coarser than 2.0 and is not used for it.
  EXPECT_EQ(fast.best_level_for_mpp(0.25), 0);
  EXPECT_EQ(fast.best_level_for_mpp(0.4), 0);
  EXPECT_EQ(fast.best_level_for_mpp(0.5), 1);
  EXPECT_EQ(fast.best_level_for_mpp(1.0), 2);
  EXPECT_EQ(fast.best_level_for_mpp(2.0), 2);
  EXPECT_EQ(fast.best_level_for_mpp(2.03), 3);
  // Every level as the direct path reads it is libtiff's own decode of that directory's tiles. OpenSlide 3.4.1
  // agrees on levels 0 and 1, not on 2 and 3, which are smaller than one 64-px tile: with Debian 12's libtiff 4.5
  // (TIFFRGBAImageGet, its path for non-JPEG tiles) it returns level 2 shifted down by 2 rows (the tile's rows beyond
  // the level) and level 3 (31 of 64 rows) empty, the rows it does not fill left as they were in memory. That is a
  // defect of that pairing of libraries, which the direct path does not share; it is not compared here.
  for (int level = 0; level < 4; ++level) {
    SCOPED_TRACE("level " + std::to_string(level));
    const SlideLevel& l = fast.level(level);
    const cv::Mat mine = fast.read_region(0, 0, level, l.width, l.height);
    const Difference truth = compare(mine, libtiff_directory(path, level));
    EXPECT_EQ(truth.pixels, 0) << "first difference at (" << truth.first.x << ", " << truth.first.y << ")";
    if (level <= 1) {
      const Difference d = compare(mine, reference.read_region(0, 0, level, l.width, l.height));
      EXPECT_EQ(d.pixels, 0) << "OpenSlide, first difference at (" << d.first.x << ", " << d.first.y << ")";
    }
  }
  // A read at 1 µm/px is level 2's own pixels, not resampled.
  EXPECT_EQ(compare(fast.read_at_mpp(0, 0, 75, 62, 1.0), fast.read_region(0, 0, 2, 75, 62)).pixels, 0);

  // At every target, an output pixel whose level-0 footprint (widened by the read level's downsample, since a coarse
  // level's edges are its own resampling of level 0) lies inside one box or the background has that box's colour
  // exactly: the boxes are flat colours in a lossless file.
  const cv::Mat level0 = fast.read_region(0, 0, 0, 300, 250);
  for (const double target : {0.25, 0.4, 0.5, 0.75, 1.0, 1.6, 2.0, 2.5}) {
    const int level = fast.best_level_for_mpp(target);
    const double margin = fast.level(level).downsample;
    const double scale = target / kAssumed;  // level-0 pixels per output pixel
    const int w = static_cast<int>(300 / scale);
    const int h = static_cast<int>(250 / scale);
    for (const Slide* slide : {&fast, &reference}) {
      if (slide == &reference && level > 1) continue;  // OpenSlide's misplaced rows, above
      SCOPED_TRACE(::testing::Message() << target << " um/px (level " << level << ") "
                                        << (slide == &fast ? "direct TIFF" : "OpenSlide"));
      const cv::Mat out = slide->read_at_mpp(0, 0, w, h, target);
      ASSERT_EQ(out.cols, w);
      ASSERT_EQ(out.rows, h);
      int checked = 0, wrong = 0;
      for (int r = 0; r < h; ++r) {
        for (int c = 0; c < w; ++c) {
          const int x0 = std::max(0, static_cast<int>(std::floor(c * scale - margin)));
          const int y0 = std::max(0, static_cast<int>(std::floor(r * scale - margin)));
          const int x1 = std::min(300, static_cast<int>(std::ceil((c + 1) * scale + margin)));
          const int y1 = std::min(250, static_cast<int>(std::ceil((r + 1) * scale + margin)));
          const cv::Mat footprint = level0(cv::Rect(x0, y0, x1 - x0, y1 - y0));
          const cv::Vec3b colour = footprint.at<cv::Vec3b>(0, 0);
          if (!all_of_colour(footprint, colour)) continue;  // an edge between colours
          ++checked;
          if (out.at<cv::Vec3b>(r, c) != colour && wrong++ == 0) {
            ADD_FAILURE() << "pixel (" << c << ", " << r << ") is " << out.at<cv::Vec3b>(r, c) << ", expected "
                          << colour;
          }
        }
      }
      EXPECT_EQ(wrong, 0);
      EXPECT_GT(checked, w * h / 3) << "too few flat pixels to check";
    }
  }
}

// Where segments pq and rs cross properly (each passes through the other's interior), or nullopt.
std::optional<cv::Point2d> crossing(const cv::Point2d& p, const cv::Point2d& q, const cv::Point2d& r,
                                    const cv::Point2d& s) {
  const auto side = [](const cv::Point2d& a, const cv::Point2d& b, const cv::Point2d& c) {
    return (b.x - a.x) * (c.y - a.y) - (b.y - a.y) * (c.x - a.x);
  };
  const double d1 = side(p, q, r), d2 = side(p, q, s), d3 = side(r, s, p), d4 = side(r, s, q);
  if (!((d1 > 0 && d2 < 0) || (d1 < 0 && d2 > 0)) || !((d3 > 0 && d4 < 0) || (d3 < 0 && d4 > 0))) return std::nullopt;
  const double t = d3 / (d3 - d4);
  return p + t * (q - p);
}

// Each place where a closed ring crosses itself cuts it into two loops; the area of the smaller one, per crossing.
std::vector<double> self_crossing_loops(const Ring& ring) {
  std::vector<double> loops;
  const std::size_t n = ring.size();
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 2; j < n; ++j) {
      if (i == 0 && j == n - 1) continue;  // adjacent through the closing edge
      const auto x = crossing(ring[i], ring[(i + 1) % n], ring[j], ring[(j + 1) % n]);
      if (!x) continue;
      Ring loop = {*x};
      loop.insert(loop.end(), ring.begin() + static_cast<std::ptrdiff_t>(i + 1),
                  ring.begin() + static_cast<std::ptrdiff_t>(j + 1));
      Ring rest = {*x};
      rest.insert(rest.end(), ring.begin() + static_cast<std::ptrdiff_t>(j + 1), ring.end());
      rest.insert(rest.end(), ring.begin(), ring.begin() + static_cast<std::ptrdiff_t>(i + 1));
      loops.push_back(std::min(ring_area(loop), ring_area(rest)));
    }
  }
  return loops;
}

// The CAMELYON16 ground truth of tumor_009 (ASAP, group "metastasis", 6 splines, 10,778 vertices). A spline is read
// as the polygon through its points, as ASAP's AnnotationToMask (which drew the challenge's masks) fills it. Each
// polygon lies on the 97792×221184 px slide it was drawn on and has an area; the hand-drawn outlines of _2 and _5
// cross themselves (8 times: the pen overshooting its start, and small twists), and each crossing cuts off a loop of
// under 1000 px² (723 px² at most, about 43 µm² at 0.243 µm/px, against 8.5·10⁸ px² of lesion), so fill rules
// (Tessera's even-odd labels, ASAP's nonzero winding) and the shoelace area agree on these polygons to a few parts per
// million.
TEST(RealAnnotations, Camelyon16SplinesAreValidPolygons) {
  const fs::path file = real_file("camelyon16-tumor_009.xml");
  if (!fs::exists(file)) GTEST_SKIP() << "no real data at " << file << " (../shared/data is absent)";
  const auto annotations = read_annotations(file.string());
  ASSERT_EQ(annotations.size(), 6u);
  constexpr double kSlideWidth = 97792, kSlideHeight = 221184;
  constexpr double kMaxLoopArea = 1000.0;  // px²
  std::size_t vertices = 0, crossings = 0;
  double area = 0.0;
  for (const auto& a : annotations) {
    SCOPED_TRACE("annotation " + a.name);
    EXPECT_EQ(a.type, "Spline");
    EXPECT_EQ(a.group, "metastasis");
    EXPECT_TRUE(a.holes.empty());
    vertices += a.outer.size();
    ASSERT_GE(a.outer.size(), 3u);
    for (std::size_t k = 0; k < a.outer.size(); ++k) {
      const cv::Point2d& p = a.outer[k];
      ASSERT_TRUE(std::isfinite(p.x) && std::isfinite(p.y)) << "vertex " << k;
      EXPECT_TRUE(p.x >= 0 && p.x <= kSlideWidth && p.y >= 0 && p.y <= kSlideHeight) << "vertex " << k << ": " << p;
      EXPECT_NE(p, a.outer[(k + 1) % a.outer.size()]) << "vertex " << k << " repeated";
    }
    EXPECT_GT(ring_area(a.outer), 0.0);
    area += ring_area(a.outer);
    for (const double loop : self_crossing_loops(a.outer)) {
      ++crossings;
      EXPECT_LT(loop, kMaxLoopArea) << "a self-crossing cuts off a loop of " << loop << " px^2";
    }
  }
  EXPECT_EQ(vertices, 10778u);
  EXPECT_EQ(crossings, 8u);
  // About 50 mm² of lesion at 0.243 µm/px; polygons read wrongly (a vertex order lost, a coordinate misparsed) would
  // not have it.
  EXPECT_NEAR(area, 8.5e8, 0.1e8);
}

}  // namespace
}  // namespace tessera::io
