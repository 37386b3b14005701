#include "preprocessing/augment.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/imgproc.hpp>

#include "core/config.h"
#include "core/error.h"
#include "preprocessing/stain.h"

namespace tessera::prep {
namespace {

using Step = TileAugmentation::Step;

// --- Tiles -----------------------------------------------------------------------------------------------------

// An H&E-like tile: per-pixel random haematoxylin and eosin concentrations through Beer–Lambert with the
// Ruifrok–Johnston vectors, plus a strip of glass on the right. Random per pixel, so no symmetry maps it to
// itself.
cv::Mat he_tile(int rows, int cols, std::uint32_t seed = 3) {
  std::mt19937 rng(seed);
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * (rng() / 4294967296.0); };
  const StainVectors stains = ruifrok_he();
  cv::Mat rgb(rows, cols, CV_8UC3);
  for (int y = 0; y < rows; ++y) {
    for (int x = 0; x < cols; ++x) {
      const bool glass = x >= cols - cols / 5;
      const double h = glass ? 0.0 : uniform(0.05, 1.0), e = glass ? 0.0 : uniform(0.05, 0.7);
      rgb.at<cv::Vec3b>(y, x) = od_to_rgb(stains.h * h + stains.e * e);
    }
  }
  return rgb;
}

// 16×16 of tissue only, dimmed to at most 0.75 × 246 (the brightest tissue level of he_tile): jitter by up to
// 20% then stays inside 0..255, so no clipping gets in the way of exact expectations.
cv::Mat dim_tissue() {
  cv::Mat tissue = he_tile(16, 20)(cv::Rect(0, 0, 16, 16)) * 0.75;
  return tissue;
}

cv::Mat random_tile(int rows, int cols, std::uint32_t seed) {
  cv::Mat rgb(rows, cols, CV_8UC3);
  cv::RNG rng(seed);
  rng.fill(rgb, cv::RNG::UNIFORM, 0, 256);
  return rgb;
}

bool same(const cv::Mat& a, const cv::Mat& b) {
  return a.size() == b.size() && a.type() == b.type() && cv::norm(a, b, cv::NORM_INF) == 0.0;
}

std::vector<std::uint32_t> sorted_pixels(const cv::Mat& rgb) {
  std::vector<std::uint32_t> pixels;
  for (int y = 0; y < rgb.rows; ++y) {
    for (int x = 0; x < rgb.cols; ++x) {
      const cv::Vec3b p = rgb.at<cv::Vec3b>(y, x);
      pixels.push_back(static_cast<std::uint32_t>(p[0]) << 16 | static_cast<std::uint32_t>(p[1]) << 8 | p[2]);
    }
  }
  std::sort(pixels.begin(), pixels.end());
  return pixels;
}

// Options with every transform off; tests switch on what they look at.
AugmentOptions nothing() {
  AugmentOptions o;
  o.flip_horizontal = o.flip_vertical = o.rotate90 = 0.0;
  o.brightness = o.contrast = o.saturation = o.hue = 0.0;
  o.hed_scale = o.hed_shift = 0.0;
  return o;
}

// A normalisation that leaves values on the 0..255 scale, to read the chain's unrounded floats.
const ChannelNormalization kRaw = {{0.0f, 0.0f, 0.0f}, {1.0f / 255.0f, 1.0f / 255.0f, 1.0f / 255.0f}};

// The chain's float output as an H'×W' CV_32FC3 image on the 0..255 scale.
cv::Mat raw_output(Augmenter& augmenter, const TileAugmentation& a, const cv::Mat& src) {
  const cv::Size size = a.dihedral.output_size(src.size());
  std::vector<float> chw(3 * static_cast<std::size_t>(size.area()));
  augmenter.apply(a, src, chw.data(), kRaw);
  std::vector<cv::Mat> planes;
  for (int c = 0; c < 3; ++c) planes.emplace_back(size, CV_32F, chw.data() + c * size.area());
  cv::Mat out;
  cv::merge(planes, out);
  return out;
}

double gray_of(const cv::Vec3f& p) { return 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2]; }

// --- Dihedral ----------------------------------------------------------------------------------------------------

TEST(AugmentDihedral, CodesRoundTrip) {
  for (int code = 0; code < 8; ++code) EXPECT_EQ(Dihedral::from_code(code).code(), code);
  EXPECT_THROW(Dihedral::from_code(8), core::InternalError);
  EXPECT_THROW(Dihedral::from_code(-1), core::InternalError);
}

TEST(AugmentDihedral, RotationIsCounterClockwise) {
  // 2×3 tile with distinct values: after a counter-clockwise quarter turn the top-right pixel is top-left.
  cv::Mat src(2, 3, CV_8UC3);
  for (int i = 0; i < 6; ++i) src.at<cv::Vec3b>(i / 3, i % 3) = cv::Vec3b(static_cast<std::uint8_t>(i), 0, 0);
  cv::Mat out;
  apply_dihedral(src, out, {true, false, false});
  ASSERT_EQ(out.size(), cv::Size(2, 3));
  EXPECT_EQ(out.at<cv::Vec3b>(0, 0)[0], 2);
  EXPECT_EQ(out.at<cv::Vec3b>(0, 1)[0], 5);
  EXPECT_EQ(out.at<cv::Vec3b>(2, 0)[0], 0);
  EXPECT_EQ(out.at<cv::Vec3b>(2, 1)[0], 3);
}

TEST(AugmentDihedral, ExactPermutationsEightDistinctAndInverses) {
  const cv::Mat square = random_tile(9, 9, 11);
  const cv::Mat wide = random_tile(5, 13, 12);  // odd, non-square: H and W swap under rotation
  Augmenter augmenter(nothing());
  std::vector<cv::Mat> results;
  for (int code = 0; code < 8; ++code) {
    const Dihedral d = Dihedral::from_code(code);
    TileAugmentation a;
    a.dihedral = d;
    for (const cv::Mat* src : {&square, &wide}) {
      cv::Mat reference, fast;
      apply_dihedral(*src, reference, d);
      augmenter.apply(a, *src, fast);
      EXPECT_TRUE(same(fast, reference)) << "code " << code;  // the one-pass gather agrees with cv::rotate/flip
      EXPECT_EQ(fast.size(), d.output_size(src->size()));
      EXPECT_EQ(sorted_pixels(fast), sorted_pixels(*src)) << "code " << code;

      cv::Mat back;
      TileAugmentation undo;
      undo.dihedral = d.inverse();
      augmenter.apply(undo, fast, back);
      EXPECT_TRUE(same(back, *src)) << "code " << code;
      apply_dihedral(reference, back, d.inverse());
      EXPECT_TRUE(same(back, *src)) << "code " << code;
    }
    apply_dihedral(square, results.emplace_back(), d);
  }
  for (int i = 0; i < 8; ++i) {
    for (int j = i + 1; j < 8; ++j) EXPECT_FALSE(same(results[i], results[j])) << i << " vs " << j;
  }
}

TEST(AugmentDihedral, DefaultsMakeAllEightEquallyLikely) {
  const AugmentOptions options;
  std::vector<int> counts(8, 0);
  constexpr int kDraws = 8000;
  for (int i = 0; i < kDraws; ++i) ++counts[draw_augmentation(options, 5, 0, i).dihedral.code()];
  for (int code = 0; code < 8; ++code) {
    EXPECT_NEAR(counts[code], kDraws / 8, 150) << "code " << code;  // ±4.5 standard deviations
  }
}

// --- Identity and determinism -----------------------------------------------------------------------------------

TEST(Augment, IdentityWhenDisabled) {
  AugmentOptions options;
  options.enabled = false;
  options.brightness = 0.9;
  options.hed_scale = 0.5;
  Augmenter augmenter(options);
  const cv::Mat src = he_tile(12, 10);
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(augmenter.draw(1, 2, i).is_identity());
    cv::Mat out;
    augmenter.augment(src, out, 1, 2, i);
    EXPECT_TRUE(same(out, src));
  }
}

TEST(Augment, IdentityWhenAllMagnitudesAreZero) {
  AugmentOptions options = nothing();
  options.colour_probability = options.hed_probability = 1.0;
  Augmenter augmenter(options);
  const cv::Mat src = he_tile(12, 10);
  for (int i = 0; i < 20; ++i) {
    const TileAugmentation a = augmenter.draw(1, 0, i);
    EXPECT_TRUE(a.is_identity());
    cv::Mat out;
    augmenter.apply(a, src, out);
    EXPECT_TRUE(same(out, src));
    cv::Mat src_f;
    src.convertTo(src_f, CV_32F);
    EXPECT_TRUE(same(raw_output(augmenter, a, src), src_f));
  }
}

TEST(Augment, SameSeedEpochAndIndexGiveTheSameTileInAnyOrder) {
  const cv::Mat src = he_tile(16, 16);
  constexpr int kTiles = 12;
  Augmenter forward, backward;  // two "ranks" visiting the tiles in opposite orders
  std::vector<cv::Mat> a(kTiles), b(kTiles);
  for (int i = 0; i < kTiles; ++i) forward.augment(src, a[i], 42, 3, 1000 + i);
  for (int i = kTiles - 1; i >= 0; --i) backward.augment(src, b[i], 42, 3, 1000 + i);
  for (int i = 0; i < kTiles; ++i) EXPECT_TRUE(same(a[i], b[i])) << i;
  for (int i = 0; i < kTiles; ++i) {
    for (int j = i + 1; j < kTiles; ++j) EXPECT_FALSE(same(a[i], a[j])) << i << " vs " << j;
  }
  cv::Mat other_epoch, other_seed;
  forward.augment(src, other_epoch, 42, 4, 1000);
  forward.augment(src, other_seed, 43, 3, 1000);
  EXPECT_FALSE(same(other_epoch, a[0]));
  EXPECT_FALSE(same(other_seed, a[0]));
}

TEST(Augment, ChangingOneTransformLeavesTheOthersDrawsAlone) {
  AugmentOptions with_hue, without_hue;
  without_hue.hue = 0.0;
  for (int i = 0; i < 50; ++i) {
    const TileAugmentation a = draw_augmentation(with_hue, 9, 1, i), b = draw_augmentation(without_hue, 9, 1, i);
    EXPECT_EQ(a.dihedral.code(), b.dihedral.code());
    EXPECT_EQ(a.h_scale, b.h_scale);
    EXPECT_EQ(a.brightness, b.brightness);
    EXPECT_EQ(a.saturation, b.saturation);
    EXPECT_EQ(b.hue, 0.0);
  }
}

// --- Drawn values ------------------------------------------------------------------------------------------------

TEST(AugmentDraw, FactorsStayInTheirRangesAndFillThem) {
  AugmentOptions o;
  o.brightness = 0.3, o.contrast = 1.5, o.saturation = 0.1, o.hue = 0.2, o.hed_scale = 0.25, o.hed_shift = 0.1;
  struct Range {
    double lo, hi, seen_lo = 1e9, seen_hi = -1e9;
  };
  Range brightness{0.7, 1.3}, contrast{0.0, 2.5}, saturation{0.9, 1.1}, hue{-0.2, 0.2}, scale{0.75, 1.25},
      shift{-0.1, 0.1};
  auto see = [](Range& r, double v) {
    EXPECT_GE(v, r.lo);
    EXPECT_LE(v, r.hi);
    r.seen_lo = std::min(r.seen_lo, v), r.seen_hi = std::max(r.seen_hi, v);
  };
  std::set<std::vector<int>> orders;
  for (int i = 0; i < 2000; ++i) {
    const TileAugmentation a = draw_augmentation(o, 17, 0, i);
    see(brightness, a.brightness), see(contrast, a.contrast), see(saturation, a.saturation), see(hue, a.hue);
    see(scale, a.h_scale), see(scale, a.e_scale), see(shift, a.h_shift), see(shift, a.e_shift);
    std::vector<int> order;
    for (Step s : a.order) order.push_back(static_cast<int>(s));
    EXPECT_TRUE(std::is_permutation(order.begin(), order.end(), std::vector<int>{0, 1, 2, 3}.begin()));
    orders.insert(order);
  }
  for (const Range* r : {&brightness, &contrast, &saturation, &hue, &scale, &shift}) {
    EXPECT_LT(r->seen_lo, r->lo + 0.02 * (r->hi - r->lo));
    EXPECT_GT(r->seen_hi, r->hi - 0.02 * (r->hi - r->lo));
  }
  EXPECT_EQ(orders.size(), 24u);  // every order of the four colour steps occurs

  o.colour_order = ColourOrder::fixed;
  for (int i = 0; i < 50; ++i) {
    const auto order = draw_augmentation(o, 17, 0, i).order;
    EXPECT_EQ(order, (std::array<Step, 4>{Step::brightness, Step::contrast, Step::saturation, Step::hue}));
  }
}

TEST(AugmentDraw, ProbabilitiesSwitchTransformsOnAndOff) {
  AugmentOptions o;
  o.colour_probability = 0.25;
  o.hed_probability = 0.75;
  int colour = 0, hed = 0;
  constexpr int kDraws = 4000;
  for (int i = 0; i < kDraws; ++i) {
    const TileAugmentation a = draw_augmentation(o, 2, 0, i);
    colour += a.has_colour() ? 1 : 0;
    hed += a.hed ? 1 : 0;
  }
  EXPECT_NEAR(colour, kDraws / 4, 150);
  EXPECT_NEAR(hed, 3 * kDraws / 4, 150);
}

// --- Colour ---------------------------------------------------------------------------------------------------------

TEST(AugmentColour, BrightnessMovesMeanColourByItsFactor) {
  AugmentOptions o = nothing();
  o.brightness = 0.2;
  Augmenter augmenter(o);
  const cv::Mat tissue = dim_tissue();
  const cv::Scalar before = cv::mean(tissue);
  for (int i = 0; i < 30; ++i) {
    const TileAugmentation a = augmenter.draw(4, 0, i);
    cv::Mat out;
    augmenter.apply(a, tissue, out);
    const cv::Scalar after = cv::mean(out);
    for (int c = 0; c < 3; ++c) {
      EXPECT_GE(after[c], 0.8 * before[c] - 0.5);
      EXPECT_LE(after[c], 1.2 * before[c] + 0.5);
      EXPECT_NEAR(after[c], a.brightness * before[c], 0.5);  // rounding only
    }
  }
}

TEST(AugmentColour, ContrastAndSaturationKeepTheMeanGrey) {
  const cv::Mat src = dim_tissue();
  cv::Mat src_f;
  src.convertTo(src_f, CV_32F);
  double gray_before = 0.0;
  for (int y = 0; y < src.rows; ++y)
    for (int x = 0; x < src.cols; ++x) gray_before += gray_of(src_f.at<cv::Vec3f>(y, x));
  gray_before /= src.total();

  for (bool contrast : {true, false}) {
    AugmentOptions o = nothing();
    (contrast ? o.contrast : o.saturation) = 0.2;
    Augmenter augmenter(o);
    for (int i = 0; i < 20; ++i) {
      const TileAugmentation a = augmenter.draw(6, 0, i);
      ASSERT_TRUE(a.has_colour());
      const cv::Mat out = raw_output(augmenter, a, src);
      double gray_after = 0.0, max_pixel_gray_change = 0.0;
      for (int y = 0; y < src.rows; ++y) {
        for (int x = 0; x < src.cols; ++x) {
          const double g = gray_of(out.at<cv::Vec3f>(y, x));
          gray_after += g;
          max_pixel_gray_change = std::max(max_pixel_gray_change, std::abs(g - gray_of(src_f.at<cv::Vec3f>(y, x))));
        }
      }
      EXPECT_NEAR(gray_after / src.total(), gray_before, 1e-2) << (contrast ? "contrast" : "saturation");
      if (!contrast) {
        EXPECT_LT(max_pixel_gray_change, 1e-3);  // saturation keeps every pixel's grey
      }
      const double change = std::abs((contrast ? a.contrast : a.saturation) - 1.0);
      EXPECT_GT(cv::norm(out, src_f, cv::NORM_INF), 10.0 * change);  // and yet the tile changed
    }
  }
}

TEST(AugmentColour, HueAndSaturationLeaveAGreyTileGrey) {
  cv::Mat grey(8, 8, CV_8UC3);
  for (int i = 0; i < 64; ++i) {
    const auto v = static_cast<std::uint8_t>(i * 4);
    grey.at<cv::Vec3b>(i / 8, i % 8) = cv::Vec3b(v, v, v);
  }
  AugmentOptions o = nothing();
  o.hue = 0.5;
  o.saturation = 2.0;
  Augmenter augmenter(o);
  for (int i = 0; i < 20; ++i) {
    const TileAugmentation a = augmenter.draw(8, 0, i);
    ASSERT_NE(a.hue, 0.0);
    cv::Mat out;
    augmenter.apply(a, grey, out);
    EXPECT_TRUE(same(out, grey)) << "hue " << a.hue << ", saturation " << a.saturation;
  }
}

TEST(AugmentColour, HueShiftAgreesWithOpenCvHsv) {
  const cv::Mat src = random_tile(7, 9, 21);
  AugmentOptions o = nothing();
  o.hue = 0.5;
  Augmenter augmenter(o);
  cv::Mat src_f;
  src.convertTo(src_f, CV_32F, 1.0 / 255.0);
  for (int i = 0; i < 10; ++i) {
    const TileAugmentation a = augmenter.draw(12, 0, i);
    cv::Mat hsv;
    cv::cvtColor(src_f, hsv, cv::COLOR_RGB2HSV);  // float: H in degrees [0, 360)
    for (auto it = hsv.begin<cv::Vec3f>(); it != hsv.end<cv::Vec3f>(); ++it) {
      float& h = (*it)[0];
      h = static_cast<float>(std::fmod(h + 360.0 * a.hue + 720.0, 360.0));
    }
    cv::Mat expected;
    cv::cvtColor(hsv, expected, cv::COLOR_HSV2RGB);
    const cv::Mat out = raw_output(augmenter, a, src) / 255.0;
    EXPECT_LT(cv::norm(out, expected, cv::NORM_INF), 1e-3) << "hue " << a.hue;
  }
  // A third of a turn takes red to green.
  TileAugmentation third;
  third.hue = 1.0 / 3.0;
  cv::Mat red(1, 1, CV_8UC3, cv::Scalar(255, 0, 0)), out;
  augmenter.apply(third, red, out);
  EXPECT_EQ(out.at<cv::Vec3b>(0, 0), cv::Vec3b(0, 255, 0));
}

TEST(AugmentColour, StepOrderMatters) {
  // Brightness ×2 then contrast ×0 gives the mean grey of the clipped tile (255, 200, 200); the other order
  // gives twice the mean grey of the input, clipped.
  cv::Mat src(1, 3, CV_8UC3, cv::Scalar(100, 100, 100));
  src.at<cv::Vec3b>(0, 0) = cv::Vec3b(200, 200, 200);
  TileAugmentation a;
  a.brightness = 2.0;
  a.contrast = 0.0;
  Augmenter augmenter(nothing());
  cv::Mat out;
  a.order = {Step::brightness, Step::contrast, Step::saturation, Step::hue};
  augmenter.apply(a, src, out);
  EXPECT_EQ(out.at<cv::Vec3b>(0, 0), cv::Vec3b(218, 218, 218));
  a.order = {Step::contrast, Step::brightness, Step::saturation, Step::hue};
  augmenter.apply(a, src, out);
  EXPECT_EQ(out.at<cv::Vec3b>(0, 0), cv::Vec3b(255, 255, 255));
}

// --- H&E stain jitter -------------------------------------------------------------------------------------------

TEST(AugmentStain, UnitScaleAndZeroShiftIsIdentityWithinRounding) {
  cv::Mat src = he_tile(16, 16);
  src.at<cv::Vec3b>(0, 0) = cv::Vec3b(0, 0, 0);  // the OD clamp at black
  src.at<cv::Vec3b>(0, 1) = cv::Vec3b(255, 255, 255);
  TileAugmentation a;
  a.hed = true;
  Augmenter augmenter(nothing());
  cv::Mat out;
  augmenter.apply(a, src, out);
  EXPECT_LE(cv::norm(out, src, cv::NORM_INF), 1.0);
}

TEST(AugmentStain, ScalesAndShiftsTheDeconvolvedConcentrations) {
  const cv::Mat src = he_tile(24, 24);
  const StainVectors stains = ruifrok_he();
  const cv::Mat before = he_concentrations(src, stains);
  TileAugmentation a;
  a.hed = true;
  a.h_scale = 1.3;
  a.e_shift = 0.1;
  Augmenter augmenter(nothing());
  cv::Mat out;
  augmenter.apply(a, src, out);
  const cv::Mat after = he_concentrations(out, stains);
  // Compare where no channel is near 0 or 255 before or after, so 8-bit rounding stays small in OD.
  double h_ratio = 0.0, e_shift = 0.0;
  int n = 0;
  for (int y = 0; y < src.rows; ++y) {
    for (int x = 0; x < src.cols - src.cols / 5; ++x) {
      const cv::Vec3b p = src.at<cv::Vec3b>(y, x), q = out.at<cv::Vec3b>(y, x);
      bool usable = true;
      for (int c = 0; c < 3; ++c) usable = usable && p[c] > 20 && q[c] > 20 && p[c] < 240 && q[c] < 240;
      if (!usable) continue;
      const cv::Vec2f b = before.at<cv::Vec2f>(y, x), c = after.at<cv::Vec2f>(y, x);
      h_ratio += c[0] / b[0];
      e_shift += c[1] - b[1];
      ++n;
    }
  }
  ASSERT_GT(n, 50);
  EXPECT_NEAR(h_ratio / n, 1.3, 0.03);
  EXPECT_NEAR(e_shift / n, 0.1, 0.01);
}

// --- Network input -------------------------------------------------------------------------------------------------

TEST(AugmentOutput, NormalisedChwMatchesAHandComputation) {
  // 2×3 tile, horizontal flip, brightness 1.5 then contrast 0.5, normalised with made-up statistics.
  const std::uint8_t pixels[2][3][3] = {{{10, 20, 30}, {200, 100, 50}, {0, 255, 128}},
                                        {{90, 90, 90}, {40, 160, 220}, {250, 5, 60}}};
  cv::Mat src(2, 3, CV_8UC3);
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x) src.at<cv::Vec3b>(y, x) = cv::Vec3b(pixels[y][x][0], pixels[y][x][1], pixels[y][x][2]);
  TileAugmentation a;
  a.dihedral.flip_horizontal = true;
  a.brightness = 1.5;
  a.contrast = 0.5;
  a.order = {Step::brightness, Step::contrast, Step::saturation, Step::hue};
  const ChannelNormalization norm = {{0.5f, 0.4f, 0.3f}, {0.2f, 0.25f, 0.3f}};

  double bright[2][3][3], mean = 0.0;
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 3; ++x) {
      for (int c = 0; c < 3; ++c) bright[y][x][c] = std::min(255.0, 1.5 * pixels[y][2 - x][c]);
      mean += 0.299 * bright[y][x][0] + 0.587 * bright[y][x][1] + 0.114 * bright[y][x][2];
    }
  }
  mean /= 6.0;

  Augmenter augmenter(nothing());
  std::vector<float> chw(18);
  augmenter.apply(a, src, chw.data(), norm);
  cv::Mat rgb;
  augmenter.apply(a, src, rgb);
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 2; ++y) {
      for (int x = 0; x < 3; ++x) {
        const double v = std::clamp(0.5 * bright[y][x][c] + 0.5 * mean, 0.0, 255.0);
        EXPECT_NEAR(chw[static_cast<std::size_t>(c * 6 + y * 3 + x)], (v / 255.0 - norm.mean[c]) / norm.std[c], 1e-4)
            << "c " << c << " y " << y << " x " << x;
        EXPECT_NEAR(rgb.at<cv::Vec3b>(y, x)[c], v, 0.5 + 1e-3);
      }
    }
  }
  // Without augmentation the input is just the normalised tile, planar.
  augmenter.apply(TileAugmentation{}, src, chw.data(), norm);
  EXPECT_NEAR(chw[0], (10 / 255.0 - 0.5) / 0.2, 1e-5);
  EXPECT_NEAR(chw[6 + 2], (255 / 255.0 - 0.4) / 0.25, 1e-5);
  EXPECT_NEAR(chw[12 + 5], (60 / 255.0 - 0.3) / 0.3, 1e-5);
}

TEST(AugmentOutput, InPlaceChwAndEightBitAgree) {
  Augmenter augmenter;  // defaults: every transform on
  for (const cv::Size size : {cv::Size(16, 16), cv::Size(11, 7)}) {
    const cv::Mat src = he_tile(size.height, size.width, 5);
    for (int i = 0; i < 16; ++i) {
      const TileAugmentation a = augmenter.draw(77, 2, i);
      cv::Mat out, in_place = src.clone();
      augmenter.apply(a, src, out);
      augmenter.apply(a, in_place, in_place);
      EXPECT_TRUE(same(in_place, out)) << i;
      cv::Mat raw, rounded;
      raw_output(augmenter, a, src).convertTo(raw, CV_32F);
      out.convertTo(rounded, CV_32F);
      EXPECT_LE(cv::norm(raw, rounded, cv::NORM_INF), 0.5 + 1e-3) << i;
    }
  }
  // A view into a larger buffer (how a batch of tiles is laid out) is written in place, not reallocated.
  cv::Mat batch = he_tile(32, 16, 6);
  cv::Mat second = batch(cv::Rect(0, 16, 16, 16));
  const cv::Mat expected_src = second.clone();
  const TileAugmentation a = augmenter.draw(77, 2, 3);
  cv::Mat expected;
  augmenter.apply(a, expected_src, expected);
  const std::uint8_t* data = second.data;
  augmenter.apply(a, second, second);
  EXPECT_EQ(second.data, data);
  EXPECT_TRUE(same(batch(cv::Rect(0, 16, 16, 16)), expected));
}

TEST(AugmentOutput, RejectsWhatIsNotAnRgbTile) {
  Augmenter augmenter;
  cv::Mat gray(4, 4, CV_8UC1, cv::Scalar(1)), out;
  EXPECT_THROW(augmenter.apply(TileAugmentation{}, gray, out), core::InternalError);
  EXPECT_THROW(augmenter.apply(TileAugmentation{}, cv::Mat(), out), core::InternalError);
  std::vector<float> chw(48);
  ChannelNormalization zero_std;
  zero_std.std[1] = 0.0f;
  EXPECT_THROW(augmenter.apply(TileAugmentation{}, he_tile(4, 4), chw.data(), zero_std), core::InternalError);
}

// --- Configuration -------------------------------------------------------------------------------------------------

const core::Schema& augment_schema() {
  static const core::Schema schema = [] {
    core::Schema s;
    s.integer("train.epochs", 10, "Epochs");
    declare_augment_schema(s);
    return s;
  }();
  return schema;
}

void expect_equal(const AugmentOptions& a, const AugmentOptions& b) {
  EXPECT_EQ(a.enabled, b.enabled);
  EXPECT_EQ(a.flip_horizontal, b.flip_horizontal);
  EXPECT_EQ(a.flip_vertical, b.flip_vertical);
  EXPECT_EQ(a.rotate90, b.rotate90);
  EXPECT_EQ(a.colour_probability, b.colour_probability);
  EXPECT_EQ(a.brightness, b.brightness);
  EXPECT_EQ(a.contrast, b.contrast);
  EXPECT_EQ(a.saturation, b.saturation);
  EXPECT_EQ(a.hue, b.hue);
  EXPECT_EQ(a.colour_order, b.colour_order);
  EXPECT_EQ(a.hed_probability, b.hed_probability);
  EXPECT_EQ(a.hed_scale, b.hed_scale);
  EXPECT_EQ(a.hed_shift, b.hed_shift);
}

TEST(AugmentConfig, DefaultsComeFromTheOptionsStruct) {
  expect_equal(augment_options_from_config(core::Config(augment_schema())), AugmentOptions{});
}

TEST(AugmentConfig, ReadsEveryKey) {
  const std::string yaml =
      "augment:\n"
      "  enabled: false\n"
      "  flip_horizontal: 0.1\n"
      "  flip_vertical: 0.2\n"
      "  rotate90: 0.3\n"
      "  colour:\n"
      "    probability: 0.4\n"
      "    brightness: 0.5\n"
      "    contrast: 0.6\n"
      "    saturation: 0.7\n"
      "    hue: 0.08\n"
      "    order: fixed\n"
      "  hed:\n"
      "    probability: 0.9\n"
      "    scale: 0.2\n"
      "    shift: 0.03\n";
  const core::Config config = core::Config::parse(augment_schema(), yaml, "job.yaml");
  AugmentOptions expected;
  expected.enabled = false;
  expected.flip_horizontal = 0.1, expected.flip_vertical = 0.2, expected.rotate90 = 0.3;
  expected.colour_probability = 0.4, expected.brightness = 0.5, expected.contrast = 0.6, expected.saturation = 0.7;
  expected.hue = 0.08, expected.colour_order = ColourOrder::fixed;
  expected.hed_probability = 0.9, expected.hed_scale = 0.2, expected.hed_shift = 0.03;
  expect_equal(augment_options_from_config(config), expected);
}

TEST(AugmentConfig, OutOfRangeValuesAreConfigErrorsNamingKeyAndLine) {
  const std::string yaml =
      "augment:\n"
      "  colour:\n"
      "    hue: 0.7\n";
  try {
    core::Config::parse(augment_schema(), yaml, "job.yaml");
    FAIL() << "no error for hue 0.7";
  } catch (const core::ConfigError& e) {
    EXPECT_EQ(e.key(), "augment.colour.hue");
    EXPECT_EQ(e.file(), "job.yaml");
    EXPECT_EQ(e.line(), 3);
  }
  EXPECT_THROW(core::Config::parse(augment_schema(), "augment:\n  rotate90: 1.5\n", "job.yaml"), core::ConfigError);
  EXPECT_THROW(core::Config::parse(augment_schema(), "augment:\n  hed:\n    scale: -0.1\n", "job.yaml"),
               core::ConfigError);
  EXPECT_THROW(core::Config::parse(augment_schema(), "augment:\n  colour:\n    order: shuffled\n", "job.yaml"),
               core::ConfigError);
  EXPECT_THROW(core::Config::parse(augment_schema(), "augment:\n  colour:\n    brightnes: 0.1\n", "job.yaml"),
               core::ConfigError);
}

TEST(AugmentConfig, HandMadeOptionsAreValidated) {
  AugmentOptions o;
  o.hue = 0.6;
  EXPECT_THROW(Augmenter{o}, core::InternalError);
  o = AugmentOptions{};
  o.flip_vertical = -0.1;
  EXPECT_THROW(validate(o), core::InternalError);
  EXPECT_NO_THROW(validate(AugmentOptions{}));
}

}  // namespace
}  // namespace tessera::prep
