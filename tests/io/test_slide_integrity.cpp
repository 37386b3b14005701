// Damaged pixels are an error, never data: a JPEG tile whose entropy-coded bytes are scrambled decodes in libjpeg
// with only a "Corrupt JPEG data" warning, and both read paths of Slide must fail it (core::CorruptTileError naming the
// file, level, tile and the decoder's message) while the slide's intact tiles still read, also from other threads
// at the same time and, on the OpenSlide path (whose errors are sticky), after the failure. Opening a slide says
// why a file cannot be read: a symlink loop, a dangling link. A real file whose every tile is damaged
// (../shared/data/real-slides/unreadable.svs) fails the same way.
#include <tiffio.h>

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "io/slide.h"
#include "io/tiff_writer.h"
#include "tests/testing/testing.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;
using testing::damage_tiles;
using testing::TempDir;
using testing::TileDamage;

// What libtiff alone makes of one tile when its warnings are only collected (as the direct reader did before it
// failed them): whether the decode "succeeded", and the first warning.
struct PlainDecode {
  bool decoded = false;
  std::string warning;
};

int collect_warning(TIFF*, void* user_data, const char* module, const char* fmt, va_list ap) {
  auto* warning = static_cast<std::string*>(user_data);
  std::array<char, 512> buffer{};
  std::vsnprintf(buffer.data(), buffer.size(), fmt, ap);
  if (warning->empty()) *warning = std::string(module != nullptr ? module : "") + ": " + buffer.data();
  return 1;
}

int ignore(TIFF*, void*, const char*, const char*, va_list) { return 1; }

PlainDecode decode_with_libtiff(const std::string& path, int directory, std::uint32_t tile) {
  PlainDecode result;
  TIFFOpenOptions* options = TIFFOpenOptionsAlloc();
  TIFFOpenOptionsSetWarningHandlerExtR(options, collect_warning, &result.warning);
  TIFFOpenOptionsSetErrorHandlerExtR(options, ignore, nullptr);
  TIFF* tif = TIFFOpenExt(path.c_str(), "r", options);
  TIFFOpenOptionsFree(options);
  if (tif == nullptr) return result;
  TIFFSetDirectory(tif, static_cast<tdir_t>(directory));
  TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
  result.warning.clear();  // directory warnings are not the tile's
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(TIFFTileSize(tif)));
  result.decoded = TIFFReadEncodedTile(tif, tile, pixels.data(), static_cast<tmsize_t>(pixels.size())) ==
                   static_cast<tmsize_t>(pixels.size());
  TIFFClose(tif);
  return result;
}

// A 768×512 JPEG pattern slide with levels 768×512 and 384×256 (256-px tiles: 3×2 and 2×1), intact and with level
// 1's second tile (column 1, row 0) scrambled.
class DamagedSlide : public ::testing::Test {
 protected:
  void SetUp() override {
    TiffWriterOptions options;
    options.min_level_size = 400;
    testing::write_pattern_slide(intact_, 768, 512, options);
    fs::copy_file(intact_, damaged_);
    ASSERT_EQ(damage_tiles(
                  damaged_, 1, [](std::uint32_t column, std::uint32_t row) { return column == 1 && row == 0; },
                  TileDamage::scramble),
              1);
  }

  static Slide open(const std::string& path, bool direct) {
    SlideOpenOptions options;
    options.direct_tiff = direct;
    Slide slide = Slide::open(path, options);
    EXPECT_EQ(slide.reads_tiff_directly(), direct);
    return slide;
  }

  TempDir dir_;
  const std::string intact_ = dir_.file("intact.tif");
  const std::string damaged_ = dir_.file("damaged.tif");
};

TEST_F(DamagedSlide, TheDamageIsOneLibjpegOnlyWarnsAbout) {
  // The class of damage this file is about: libtiff "decodes" the tile, libjpeg warns and makes up pixels.
  const PlainDecode plain = decode_with_libtiff(damaged_, 1, 1);
  EXPECT_TRUE(plain.decoded);
  EXPECT_NE(plain.warning.find("Corrupt JPEG data"), std::string::npos) << plain.warning;
  const PlainDecode intact = decode_with_libtiff(intact_, 1, 1);
  EXPECT_TRUE(intact.decoded);
  EXPECT_EQ(intact.warning, "");
}

TEST_F(DamagedSlide, DirectReaderFailsTheTileNamingLevelTileAndTheDecoder) {
  const Slide slide = open(damaged_, true);
  const Slide reference = open(intact_, true);
  for (int attempt = 0; attempt < 2; ++attempt) {  // a failed tile is not cached: it fails again
    try {
      slide.read_region(600, 40, 1, 20, 20);  // level 1 pixels (300, 20): its tile (1, 0)
      FAIL() << "expected a core::CorruptTileError";
    } catch (const core::CorruptTileError& e) {
      EXPECT_EQ(e.file(), damaged_);
      EXPECT_EQ(e.context("level"), "1");
      EXPECT_EQ(e.context("region"), "(600, 40, 20x20)");
      const std::string what = e.what();
      EXPECT_NE(what.find("cannot decode tile 1 (column 1, row 0) of level 1 (TIFF directory 1): JPEGLib: Corrupt "
                          "JPEG data"),
                std::string::npos)
          << what;
    }
  }
  // The intact tiles of the level and the other level read as from the intact file.
  const cv::Mat good = slide.read_region(0, 0, 1, 256, 256);
  EXPECT_EQ(cv::countNonZero(cv::Mat(good != reference.read_region(0, 0, 1, 256, 256)).reshape(1)), 0);
  const cv::Mat level0 = slide.read_region(0, 0, 0, 768, 512);
  EXPECT_EQ(cv::countNonZero(cv::Mat(level0 != reference.read_region(0, 0, 0, 768, 512)).reshape(1)), 0);
}

TEST_F(DamagedSlide, OpenSlideFailsTheTileAndTheNextReadOfAnIntactTileWorks) {
  const Slide slide = open(damaged_, false);
  const Slide reference = open(intact_, false);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      slide.read_region(600, 40, 1, 20, 20);
      FAIL() << "expected a core::CorruptTileError";
    } catch (const core::CorruptTileError& e) {
      EXPECT_EQ(e.file(), damaged_);
      EXPECT_EQ(e.context("level"), "1");
      EXPECT_EQ(e.context("region"), "(600, 40, 20x20)");
      EXPECT_NE(std::string(e.what()).find("cannot read the region: openslide: "), std::string::npos) << e.what();
    }
    // OpenSlide's error is sticky on a handle; the slide's next read is on a fresh one.
    const cv::Mat good = slide.read_region(0, 0, 1, 256, 256);
    EXPECT_EQ(cv::countNonZero(cv::Mat(good != reference.read_region(0, 0, 1, 256, 256)).reshape(1)), 0);
  }
}

// Threads reading intact and damaged tiles of one slide at once: every damaged read fails, every intact read gives
// the intact pixels, whatever the interleaving (on the OpenSlide path a failure poisons the shared handle, and the
// reads that saw it are retried alone).
TEST_F(DamagedSlide, ConcurrentReadsFailOnlyTheDamagedTile) {
  for (const bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct TIFF" : "OpenSlide");
    const Slide slide = open(damaged_, direct);
    const cv::Mat expected = open(intact_, direct).read_region(0, 0, 1, 256, 256);
    constexpr int kThreads = 6;
    constexpr int kReads = 12;
    std::atomic<int> good_reads{0};
    std::atomic<int> wrong_pixels{0};
    std::atomic<int> failed_good{0};
    std::atomic<int> failed_damaged{0};
    std::atomic<int> passed_damaged{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kReads; ++i) {
          if ((t + i) % 3 == 0) {
            try {
              slide.read_region(600, 40, 1, 20, 20);
              ++passed_damaged;
            } catch (const core::CorruptTileError&) {
              ++failed_damaged;
            }
          } else {
            try {
              const cv::Mat pixels = slide.read_region(0, 0, 1, 256, 256);
              ++good_reads;
              if (cv::countNonZero(cv::Mat(pixels != expected).reshape(1)) != 0) ++wrong_pixels;
            } catch (const core::Error&) {
              ++failed_good;
            }
          }
        }
      });
    }
    for (auto& thread : threads) thread.join();
    EXPECT_EQ(failed_good.load(), 0);
    EXPECT_EQ(wrong_pixels.load(), 0);
    EXPECT_EQ(good_reads.load(), kThreads * kReads - failed_damaged.load());
    EXPECT_EQ(passed_damaged.load(), 0);
    EXPECT_EQ(failed_damaged.load(), kThreads * kReads / 3);
  }
}

TEST(SlideOpenMessages, SymlinkLoopSaysSo) {
  TempDir dir;
  const std::string a = dir.file("a.svs");
  const std::string b = dir.file("b.svs");
  fs::create_symlink(b, a);
  fs::create_symlink(a, b);
  try {
    Slide::open(a);
    FAIL() << "expected a core::InputError";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), a);
    EXPECT_NE(std::string(e.what()).find("too many levels of symbolic links (a symlink loop)"), std::string::npos)
        << e.what();
  }
}

TEST(SlideOpenMessages, DanglingSymlinkIsNotFound) {
  TempDir dir;
  const std::string link = dir.file("link.svs");
  fs::create_symlink(dir.file("gone.svs"), link);
  EXPECT_THROW(Slide::open(link), core::FileNotFoundError);
}

TEST(SlideOpenMessages, UnreadableFileSaysPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file; tests/app/test_integrity.cpp drops privileges instead";
  TempDir dir;
  const std::string path = dir.file("locked.tif");
  testing::write_pattern_slide(path, 300, 300, TiffWriterOptions{});
  fs::permissions(path, fs::perms::none);
  try {
    Slide::open(path);
    FAIL() << "expected a core::InputError";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("permission denied"), std::string::npos) << e.what();
  }
}

// A real slide whose tiles are all damaged: it opens with its metadata, and every read fails naming the file.
TEST(RealSlides, UnreadableSvsFailsEveryRead) {
  const fs::path path = testing::shared_data_dir() / "real-slides" / "unreadable.svs";
  if (!fs::exists(path)) GTEST_SKIP() << "no real data at " << path << " (../shared/data is absent)";
  for (const bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct TIFF" : "OpenSlide");
    SlideOpenOptions options;
    options.direct_tiff = direct;
    const Slide slide = Slide::open(path.string(), options);
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        slide.read_region(0, 0, slide.level_count() - 1, 16, 16);
        FAIL() << "expected a core::CorruptTileError";
      } catch (const core::CorruptTileError& e) {
        EXPECT_EQ(e.file(), path.string());
        EXPECT_NE(std::string(e.what()).find("Bogus marker length"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace tessera::io
