// Test-time augmentation views of engine/slide_inference.h against OpenCV's flips and rotations, on an odd tile
// size; the names of the modes. (The whole-slide path runs end to end in tests/app/test_infer.cpp.)
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/core.hpp>

#include "core/error.h"
#include "engine/slide_inference.h"

namespace tessera::engine {
namespace {

constexpr int kSize = 7;  // odd: the centre row and column stay, every mirror is visible
constexpr int kTiles = 3;

std::vector<std::uint8_t> random_tiles(int count, int size, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(count) * size * size * 3);
  for (auto& p : pixels) p = static_cast<std::uint8_t>(rng() & 0xffu);
  return pixels;
}

cv::Mat tile_at(std::vector<std::uint8_t>& pixels, int n, int size) {
  return cv::Mat(size, size, CV_8UC3, pixels.data() + static_cast<std::size_t>(n) * size * size * 3);
}

// The eight symmetries as OpenCV writes them, in tta_view's order: views 0-3 are the identity, mirror left-right,
// mirror top-bottom and both; views 4-7 are the same after a transpose.
cv::Mat opencv_view(const cv::Mat& tile, int view) {
  cv::Mat out = tile.clone();
  if (view >= 4) cv::transpose(tile, out);
  const bool x = (view & 1) != 0, y = (view & 2) != 0;
  if (x && y) {
    cv::flip(out.clone(), out, -1);
  } else if (x) {
    cv::flip(out.clone(), out, 1);
  } else if (y) {
    cv::flip(out.clone(), out, 0);
  }
  return out;
}

bool equal(const cv::Mat& a, const cv::Mat& b) { return a.size() == b.size() && cv::norm(a, b, cv::NORM_INF) == 0; }

TEST(TtaView, EveryViewIsTheOpenCvSymmetryOfEachTile) {
  auto src = random_tiles(kTiles, kSize, 11);
  std::vector<std::uint8_t> dst(src.size());
  for (int view = 0; view < tta_views(Tta::d8); ++view) {
    tta_view(src.data(), dst.data(), kTiles, kSize, Tta::d8, view);
    for (int n = 0; n < kTiles; ++n) {
      EXPECT_TRUE(equal(tile_at(dst, n, kSize), opencv_view(tile_at(src, n, kSize), view))) << "view " << view;
    }
  }
}

TEST(TtaView, FlipsAreTheMirrorsAndD8AddsTheRotations) {
  auto src = random_tiles(1, kSize, 12);
  const cv::Mat tile = tile_at(src, 0, kSize);
  std::vector<std::uint8_t> dst(src.size());
  auto view_of = [&](Tta tta, int view) {
    tta_view(src.data(), dst.data(), 1, kSize, tta, view);
    return tile_at(dst, 0, kSize).clone();
  };
  EXPECT_EQ(tta_views(Tta::none), 1);
  EXPECT_EQ(tta_views(Tta::flips), 4);
  EXPECT_EQ(tta_views(Tta::d8), 8);
  EXPECT_TRUE(equal(view_of(Tta::none, 0), tile));

  // flips: the identity, both mirrors and the 180° rotation.
  cv::Mat rotated;
  cv::rotate(tile, rotated, cv::ROTATE_180);
  EXPECT_TRUE(equal(view_of(Tta::flips, 3), rotated));
  // d8 holds the 90° rotations too, and its eight views are all different for a random tile.
  std::vector<cv::Mat> views;
  for (int v = 0; v < 8; ++v) views.push_back(view_of(Tta::d8, v));
  for (const auto code : {cv::ROTATE_90_CLOCKWISE, cv::ROTATE_90_COUNTERCLOCKWISE}) {
    cv::rotate(tile, rotated, code);
    int found = 0;
    for (const auto& v : views) found += equal(v, rotated);
    EXPECT_EQ(found, 1) << "rotation code " << code;
  }
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) EXPECT_FALSE(equal(views[a], views[b])) << a << " and " << b;
  }

  EXPECT_THROW(tta_view(src.data(), dst.data(), 1, kSize, Tta::flips, 4), core::InternalError);
}

TEST(TtaView, NamesRoundTripAndAnUnknownNameListsTheKnownOnes) {
  for (const Tta tta : {Tta::none, Tta::flips, Tta::d8}) EXPECT_EQ(parse_tta(to_string(tta)), tta);
  try {
    parse_tta("rotations");
    FAIL() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("none, flips, d8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::engine
