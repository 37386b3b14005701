#include "preprocessing/stain_norm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "preprocessing/stain.h"

namespace tessera::prep {
namespace {

// --- Synthetic H&E tiles ---------------------------------------------------------------------------------
// Two concentration fields (OD units): haematoxylin in round nuclei with soft edges, eosin as a smooth field
// that nuclei displace; a strip of empty glass on the right. Composed through Beer–Lambert with given stain
// vectors, plus a little per-pixel OD noise.

struct Fields {
  cv::Mat1f h, e;
  cv::Mat1b glass;  // 255 where there is no tissue
};

Fields make_fields(int size, std::uint32_t seed, double glass_fraction = 0.25) {
  std::mt19937 rng(seed);
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * (rng() / 4294967296.0); };
  Fields f{cv::Mat1f(size, size, 0.0f), cv::Mat1f(size, size, 0.0f), cv::Mat1b(size, size, std::uint8_t{0})};

  struct Nucleus {
    double x, y, r, c;
  };
  std::vector<Nucleus> nuclei(static_cast<std::size_t>(size * size / 150));
  for (auto& n : nuclei) n = {uniform(0, size), uniform(0, size), uniform(2.5, 5.5), uniform(0.7, 1.3)};
  const double px = uniform(0, 6.28), py = uniform(0, 6.28);
  const int tissue_end = static_cast<int>(std::lround(size * (1.0 - glass_fraction)));

  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      if (x >= tissue_end) {
        f.glass(y, x) = 255;
        continue;
      }
      float nucleus = 0.0f, h = 0.0f;
      for (const auto& n : nuclei) {
        const double d = std::hypot(x - n.x, y - n.y) - n.r;
        if (d >= 1.5) continue;
        const float w = static_cast<float>(std::clamp((1.5 - d) / 3.0, 0.0, 1.0));
        nucleus = std::max(nucleus, w);
        h = std::max(h, w * static_cast<float>(n.c));
      }
      const double stroma =
          0.32 + 0.16 * std::sin(0.11 * x + px) * std::cos(0.07 * y + py) + 0.08 * std::sin(0.31 * (x + y) + py);
      f.h(y, x) = 0.01f + h;
      f.e(y, x) = static_cast<float>(stroma) * (1.0f - 0.9f * nucleus);
    }
  }
  return f;
}

cv::Mat compose(const Fields& f, const StainVectors& stains, double h_scale = 1.0, double e_scale = 1.0,
                std::uint32_t noise_seed = 7) {
  std::mt19937 rng(noise_seed);
  cv::Mat rgb(f.h.size(), CV_8UC3);
  for (int y = 0; y < rgb.rows; ++y) {
    for (int x = 0; x < rgb.cols; ++x) {
      cv::Vec3d od = stains.h * (f.h(y, x) * h_scale) + stains.e * (f.e(y, x) * e_scale);
      for (int c = 0; c < 3; ++c) od[c] += 0.01 * (rng() / 4294967296.0 - 0.5);
      rgb.at<cv::Vec3b>(y, x) = od_to_rgb(od);
    }
  }
  return rgb;
}

// A clearly different lab: each vector tilted by ~8° and the intensities changed.
SlideStain other_lab() {
  const StainVectors ref = ruifrok_he();
  SlideStain s;
  s.vectors.h = tilt(ref.h, {0.2, 0.1, 1.0}, 0.14);
  s.vectors.e = tilt(ref.e, {1.0, 0.0, 0.3}, 0.14);
  s.h_scale = 1.3;
  s.e_scale = 0.8;
  return s;
}

double angle_deg(const cv::Vec3d& a, const cv::Vec3d& b) {
  const double c = a.dot(b) / (cv::norm(a) * cv::norm(b));
  return std::acos(std::clamp(c, -1.0, 1.0)) * 180.0 / M_PI;
}

// The fitted target as printed by describe(): "h=(r,g,b) e=(r,g,b) max_concentration=(h,e)".
struct DescribedMacenko {
  cv::Vec3d h, e;
  cv::Vec2d max_c;
};

DescribedMacenko parse_macenko(const std::string& text) {
  // sscanf rather than std::regex: GCC 12's <regex> trips -Wmaybe-uninitialized under ASan with -Werror.
  DescribedMacenko d;
  const auto at = text.find("h=(");
  const int fields = at == std::string::npos
                         ? 0
                         : std::sscanf(text.c_str() + at, "h=(%lf,%lf,%lf) e=(%lf,%lf,%lf) max_concentration=(%lf,%lf)",
                                       &d.h[0], &d.h[1], &d.h[2], &d.e[0], &d.e[1], &d.e[2], &d.max_c[0], &d.max_c[1]);
  if (fields != 8) {
    ADD_FAILURE() << "cannot parse: " << text;
    return {};
  }
  return d;
}

DescribedMacenko fit_macenko(const cv::Mat& rgb) {
  return parse_macenko(make_stain_normalizer(StainMethod::macenko, rgb, "fit")->describe());
}

// Float Lab (L 0..100) of an 8-bit RGB image.
cv::Mat lab_of(const cv::Mat& rgb) {
  cv::Mat lab;
  rgb.convertTo(lab, CV_32FC3, 1.0 / 255.0);
  cv::cvtColor(lab, lab, cv::COLOR_RGB2Lab);
  return lab;
}

// Mean and standard deviation of Lab over the pixels where `mask` is set.
void lab_stats(const cv::Mat& rgb, const cv::Mat1b& mask, cv::Scalar& mean, cv::Scalar& stddev) {
  cv::meanStdDev(lab_of(rgb), mean, stddev, mask);
}

// Mean per-pixel CIE76 colour difference over `mask`.
double mean_delta_e(const cv::Mat& a, const cv::Mat& b, const cv::Mat1b& mask) {
  const cv::Mat la = lab_of(a), lb = lab_of(b);
  double sum = 0.0;
  int n = 0;
  for (int y = 0; y < a.rows; ++y) {
    for (int x = 0; x < a.cols; ++x) {
      if (!mask(y, x)) continue;
      sum += cv::norm(la.at<cv::Vec3f>(y, x) - lb.at<cv::Vec3f>(y, x));
      ++n;
    }
  }
  return sum / n;
}

double mean_colour_distance(const cv::Scalar& a, const cv::Scalar& b) {
  return std::sqrt(std::pow(a[0] - b[0], 2) + std::pow(a[1] - b[1], 2) + std::pow(a[2] - b[2], 2));
}

cv::Mat1b tissue_mask(const Fields& f) { return 255 - f.glass; }

// --- Names ----------------------------------------------------------------------------------------------

TEST(StainNormNames, RoundTrip) {
  for (const auto m : {StainMethod::none, StainMethod::reinhard, StainMethod::macenko}) {
    EXPECT_EQ(parse_stain_method(to_string(m)), m);
  }
  EXPECT_STREQ(to_string(StainMethod::macenko), "macenko");
}

TEST(StainNormNames, UnknownNameListsKnownOnes) {
  try {
    parse_stain_method("vahadane");
    FAIL() << "expected an error";
  } catch (const core::InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("vahadane"), std::string::npos) << what;
    EXPECT_NE(what.find("none, reinhard, macenko"), std::string::npos) << what;
  }
  EXPECT_THROW(parse_stain_method("Macenko"), core::InternalError);
  EXPECT_THROW(parse_stain_method(""), core::InternalError);
}

TEST(StainNormFactory, NoneGivesNullptr) {
  EXPECT_EQ(make_stain_normalizer(StainMethod::none), nullptr);
  const cv::Mat tile = compose(make_fields(64, 1), ruifrok_he());
  EXPECT_EQ(make_stain_normalizer(StainMethod::none, tile, "ref.png"), nullptr);
}

TEST(StainNormFactory, BuiltinTargetsDescribeThemselves) {
  for (const auto m : {StainMethod::reinhard, StainMethod::macenko}) {
    const auto n = make_stain_normalizer(m);
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->method(), m);
    const std::string text = n->describe();
    EXPECT_EQ(text.rfind(to_string(m), 0), 0u) << text;
    EXPECT_NE(text.find("builtin"), std::string::npos) << text;
    EXPECT_EQ(text.find('\n'), std::string::npos) << text;
  }
  // The built-in Macenko target is Ruifrok & Johnston's H and E.
  const auto target = parse_macenko(make_stain_normalizer(StainMethod::macenko)->describe());
  EXPECT_LT(angle_deg(target.h, ruifrok_he().h), 0.1);
  EXPECT_LT(angle_deg(target.e, ruifrok_he().e), 0.1);
  EXPECT_GT(target.max_c[0], target.max_c[1]);
  // A fitted target names its reference.
  const cv::Mat tile = compose(make_fields(96, 2), ruifrok_he());
  EXPECT_NE(make_stain_normalizer(StainMethod::reinhard, tile, "ref.png")->describe().find("ref.png"),
            std::string::npos);
}

// --- Macenko --------------------------------------------------------------------------------------------

TEST(StainNormMacenko, RecoversKnownStainVectorsHFirst) {
  const Fields f = make_fields(128, 3);
  std::vector<StainVectors> cases = {ruifrok_he(), other_lab().vectors};
  for (std::uint64_t seed = 1; seed <= 4; ++seed) cases.push_back(perturb_stain(ruifrok_he(), seed).vectors);
  for (const auto& stains : cases) {
    const auto fit = fit_macenko(compose(f, stains, 1.1, 0.9));
    EXPECT_LT(angle_deg(fit.h, stains.h), 3.0) << "h " << fit.h << " vs " << stains.h;
    EXPECT_LT(angle_deg(fit.e, stains.e), 3.0) << "e " << fit.e << " vs " << stains.e;
  }
}

TEST(StainNormMacenko, MapsAnotherLabsTileOntoTheReference) {
  // The same tissue stained in two labs: normalizing the other lab's tile towards a target fitted on the
  // reference lab's tile should give (nearly) the reference tile back.
  const Fields f = make_fields(128, 4);
  const cv::Mat reference = compose(f, ruifrok_he());
  const SlideStain lab = other_lab();
  const cv::Mat source = compose(f, lab.vectors, lab.h_scale, lab.e_scale, 8);
  const auto normalizer = make_stain_normalizer(StainMethod::macenko, reference, "reference.png");
  cv::Mat normalized = source.clone();
  normalizer->apply(normalized);

  const cv::Mat1b tissue = tissue_mask(f);
  const double before = mean_delta_e(source, reference, tissue);
  const double after = mean_delta_e(normalized, reference, tissue);
  EXPECT_GT(before, 8.0);
  EXPECT_LT(after, before / 5.0) << "before " << before << " after " << after;

  // Its stains, re-estimated, are now the target's.
  const auto target = parse_macenko(normalizer->describe());
  const auto now = fit_macenko(normalized);
  EXPECT_GT(angle_deg(lab.vectors.h, target.h), 6.0);
  EXPECT_LT(angle_deg(now.h, target.h), 1.5);
  EXPECT_LT(angle_deg(now.e, target.e), 1.5);
  EXPECT_NEAR(now.max_c[0] / target.max_c[0], 1.0, 0.05);
  EXPECT_NEAR(now.max_c[1] / target.max_c[1], 1.0, 0.05);
}

TEST(StainNormMacenko, BuiltinTargetGivesRuifrokStains) {
  const SlideStain lab = other_lab();
  cv::Mat tile = compose(make_fields(96, 5), lab.vectors, lab.h_scale, lab.e_scale);
  make_stain_normalizer(StainMethod::macenko)->apply(tile);
  const auto now = fit_macenko(tile);
  EXPECT_LT(angle_deg(now.h, ruifrok_he().h), 2.0);
  EXPECT_LT(angle_deg(now.e, ruifrok_he().e), 2.0);
}

TEST(StainNormMacenko, OneColourReferenceCannotBeFitted) {
  const cv::Mat pink(64, 64, CV_8UC3, cv::Scalar(230, 140, 190));
  EXPECT_THROW(make_stain_normalizer(StainMethod::macenko, pink, "pink.png"), core::InputError);
}

TEST(StainNormMacenko, SingleStainTileIsLeftAloneAndCannotBeAReference) {
  // Eosin only (stroma without nuclei): no second stain to estimate.
  Fields f = make_fields(128, 14, 0.1);
  f.h = 0.0f;
  const cv::Mat source = compose(f, ruifrok_he());
  cv::Mat tile = source.clone();
  make_stain_normalizer(StainMethod::macenko)->apply(tile);
  EXPECT_EQ(cv::norm(tile, source, cv::NORM_INF), 0.0);
  EXPECT_THROW(make_stain_normalizer(StainMethod::macenko, source, "stroma.png"), core::InputError);
}

// --- Reinhard -------------------------------------------------------------------------------------------

TEST(StainNormReinhard, MatchesTheTargetLabStatistics) {
  const Fields ref_fields = make_fields(128, 6);
  const Fields src_fields = make_fields(128, 7);
  const cv::Mat reference = compose(ref_fields, ruifrok_he());
  const SlideStain lab = other_lab();
  const cv::Mat source = compose(src_fields, lab.vectors, lab.h_scale, lab.e_scale, 9);
  const auto normalizer = make_stain_normalizer(StainMethod::reinhard, reference, "reference.png");
  cv::Mat normalized = source.clone();
  normalizer->apply(normalized);

  cv::Scalar ref_mean, ref_std, src_mean, src_std, out_mean, out_std;
  lab_stats(reference, tissue_mask(ref_fields), ref_mean, ref_std);
  lab_stats(source, tissue_mask(src_fields), src_mean, src_std);
  lab_stats(normalized, tissue_mask(src_fields), out_mean, out_std);
  const double before = mean_colour_distance(src_mean, ref_mean);
  const double after = mean_colour_distance(out_mean, ref_mean);
  EXPECT_GT(before, 8.0);
  EXPECT_LT(after, before / 8.0) << "before " << before << " after " << after;
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(out_std[c] / ref_std[c], 1.0, 0.1) << "channel " << c << ": " << out_std[c] << " vs " << ref_std[c];
  }
}

TEST(StainNormReinhard, MapsAnotherLabsTileCloserToTheReference) {
  const Fields f = make_fields(128, 10);
  const cv::Mat reference = compose(f, ruifrok_he());
  const SlideStain lab = other_lab();
  const cv::Mat source = compose(f, lab.vectors, lab.h_scale, lab.e_scale, 11);
  cv::Mat normalized = source.clone();
  make_stain_normalizer(StainMethod::reinhard, reference, "reference.png")->apply(normalized);
  const double before = mean_delta_e(source, reference, tissue_mask(f));
  const double after = mean_delta_e(normalized, reference, tissue_mask(f));
  EXPECT_LT(after, before / 2.5) << "before " << before << " after " << after;
}

// --- Both methods ---------------------------------------------------------------------------------------

class StainNormBoth : public ::testing::TestWithParam<StainMethod> {};

TEST_P(StainNormBoth, BackgroundStaysNearWhite) {
  const Fields f = make_fields(96, 12, 0.4);
  const SlideStain lab = other_lab();
  const cv::Mat source = compose(f, lab.vectors, lab.h_scale, lab.e_scale);
  cv::Mat tile = source.clone();
  make_stain_normalizer(GetParam())->apply(tile);
  int glass = 0;
  for (int y = 0; y < tile.rows; ++y) {
    for (int x = 0; x < tile.cols; ++x) {
      if (!f.glass(y, x)) continue;
      ++glass;
      const auto p = tile.at<cv::Vec3b>(y, x);
      for (int c = 0; c < 3; ++c) ASSERT_GE(p[c], 245) << "(" << x << ", " << y << ") " << p;
    }
  }
  EXPECT_GT(glass, 0);
  EXPECT_NE(cv::norm(tile, source, cv::NORM_L1), 0.0) << "tissue was not normalized at all";
}

TEST_P(StainNormBoth, BlankTileIsLeftAlone) {
  const auto normalizer = make_stain_normalizer(GetParam());
  for (const int size : {0, 1, 7, 96}) {
    cv::Mat white(size, size, CV_8UC3, cv::Scalar::all(255));
    normalizer->apply(white);
    EXPECT_EQ(white.size(), cv::Size(size, size));
    if (size > 0) {
      EXPECT_EQ(cv::countNonZero(white.reshape(1) != 255), 0) << size;
    }
  }
  // Glass with a little noise, and almost no tissue.
  cv::Mat glass(96, 96, CV_8UC3);
  cv::randu(glass, cv::Scalar::all(246), cv::Scalar::all(256));
  cv::circle(glass, {50, 50}, 7, cv::Scalar(120, 60, 160), cv::FILLED);
  const cv::Mat before = glass.clone();
  normalizer->apply(glass);
  EXPECT_EQ(cv::norm(glass, before, cv::NORM_INF), 0.0);
}

TEST_P(StainNormBoth, UniformTilesGiveFiniteUniformColours) {
  const auto normalizer = make_stain_normalizer(GetParam());
  for (const auto& colour : {cv::Scalar(230, 140, 190), cv::Scalar(0, 0, 0), cv::Scalar(120, 60, 160)}) {
    cv::Mat tile(64, 64, CV_8UC3, colour);
    normalizer->apply(tile);
    cv::Mat mean, stddev;
    cv::meanStdDev(tile, mean, stddev);
    EXPECT_EQ(cv::countNonZero(stddev != 0), 0) << colour;  // still one colour
    if (GetParam() == StainMethod::macenko) {
      // One colour holds no stain separation: Macenko leaves it as it is.
      EXPECT_EQ(tile.at<cv::Vec3b>(0, 0), cv::Vec3b(colour[0], colour[1], colour[2]));
    }
  }
}

TEST_P(StainNormBoth, ReferenceWithoutTissueThrowsInputErrorNamingIt) {
  const cv::Mat white(128, 128, CV_8UC3, cv::Scalar::all(250));
  try {
    make_stain_normalizer(GetParam(), white, "blank-reference.png");
    FAIL() << "expected an InputError";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), "blank-reference.png");
    EXPECT_NE(std::string(e.what()).find("blank-reference.png"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("too little tissue"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_stain_normalizer(GetParam(), cv::Mat(), "empty.png"), core::InputError);
}

TEST_P(StainNormBoth, RegionOfInterestIsNormalizedInPlace) {
  const SlideStain lab = other_lab();
  cv::Mat big = compose(make_fields(160, 13, 0.0), lab.vectors, lab.h_scale, lab.e_scale);
  const cv::Rect roi(20, 30, 96, 96);
  cv::Mat expected = big(roi).clone();
  const auto normalizer = make_stain_normalizer(GetParam());
  normalizer->apply(expected);
  const cv::Mat outside = big.clone();
  cv::Mat view = big(roi);
  normalizer->apply(view);
  EXPECT_EQ(cv::norm(big(roi), expected, cv::NORM_INF), 0.0);
  outside(roi).copyTo(big(roi));
  EXPECT_EQ(cv::norm(big, outside, cv::NORM_INF), 0.0);  // nothing outside the view changed
}

TEST_P(StainNormBoth, ConcurrentApplyMatchesSequential) {
  const auto normalizer = make_stain_normalizer(GetParam());
  std::vector<cv::Mat> tiles, expected;
  for (std::uint32_t i = 0; i < 4; ++i) {
    const SlideStain lab = perturb_stain(ruifrok_he(), i);
    tiles.push_back(compose(make_fields(96, 20 + i), lab.vectors, lab.h_scale, lab.e_scale));
    expected.push_back(tiles.back().clone());
    normalizer->apply(expected.back());
  }
  std::vector<std::thread> threads;
  for (auto& t : tiles) threads.emplace_back([&normalizer, &t] { normalizer->apply(t); });
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < tiles.size(); ++i) EXPECT_EQ(cv::norm(tiles[i], expected[i], cv::NORM_INF), 0.0);
}

TEST_P(StainNormBoth, RejectsImagesThatAreNotRgb8) {
  const auto normalizer = make_stain_normalizer(GetParam());
  cv::Mat grey(8, 8, CV_8UC1, cv::Scalar(100));
  EXPECT_THROW(normalizer->apply(grey), core::InternalError);
}

// Inference rebuilds the training tiles' target from the checkpoint's text: the same description, and on a tile
// the same pixels up to describe()'s 4 decimals (exactly for the built-in targets).
TEST_P(StainNormBoth, ADescriptionGivesBackItsNormalizer) {
  const Fields f = make_fields(96, 6);
  const cv::Mat reference = compose(f, ruifrok_he());
  const SlideStain lab = other_lab();
  const cv::Mat tile = compose(f, lab.vectors, lab.h_scale, lab.e_scale, 9);
  for (const auto& original :
       {make_stain_normalizer(GetParam()), make_stain_normalizer(GetParam(), reference, "ref, with=(odd) name.png")}) {
    const auto rebuilt = stain_normalizer_from_description(original->describe(), "model.h5");
    ASSERT_NE(rebuilt, nullptr);
    EXPECT_EQ(rebuilt->method(), GetParam());
    EXPECT_EQ(rebuilt->describe(), original->describe());
    cv::Mat a = tile.clone(), b = tile.clone();
    original->apply(a);
    rebuilt->apply(b);
    EXPECT_LE(cv::norm(a, b, cv::NORM_INF), 1.0) << original->describe();
  }
  const auto builtin = make_stain_normalizer(GetParam());
  cv::Mat a = tile.clone(), b = tile.clone();
  builtin->apply(a);
  stain_normalizer_from_description(builtin->describe(), "model.h5")->apply(b);
  EXPECT_EQ(cv::norm(a, b, cv::NORM_INF), 0.0);
}

// Fitted on a group of tiles (fitted_to), one mapping serves them all: a pixel's result depends on its colour, not
// on the tile around it. A group of one tile is exactly the per-tile fit.
TEST_P(StainNormBoth, FittedOnAGroupMapsEveryTileAlike) {
  const SlideStain lab = other_lab();
  const cv::Mat a = compose(make_fields(64, 21, 0.1), lab.vectors, lab.h_scale, lab.e_scale, 22);
  const cv::Mat b = compose(make_fields(64, 23, 0.3), lab.vectors, lab.h_scale * 0.8, lab.e_scale, 24);
  const auto target = make_stain_normalizer(GetParam());
  std::string failure;
  const auto group = target->fitted_to({a, b}, failure);
  ASSERT_NE(group, nullptr) << failure;
  EXPECT_EQ(group->describe(), target->describe()) << "the target stays";

  // c: a's left half beside b's right half.
  cv::Mat c = a.clone();
  b(cv::Rect(32, 0, 32, 64)).copyTo(c(cv::Rect(32, 0, 32, 64)));
  cv::Mat na = a.clone(), nb = b.clone(), nc = c.clone();
  for (cv::Mat* t : {&na, &nb, &nc}) group->apply(*t);
  EXPECT_GT(cv::norm(na, a, cv::NORM_L1), 0.0) << "normalized";
  EXPECT_EQ(cv::norm(nc(cv::Rect(0, 0, 32, 64)), na(cv::Rect(0, 0, 32, 64)), cv::NORM_INF), 0.0);
  EXPECT_EQ(cv::norm(nc(cv::Rect(32, 0, 32, 64)), nb(cv::Rect(32, 0, 32, 64)), cv::NORM_INF), 0.0);
  cv::Mat per_tile = c.clone();
  target->apply(per_tile);
  EXPECT_GT(cv::norm(per_tile, nc, cv::NORM_INF), 0.0) << "fitted on c alone, c maps otherwise";

  const auto alone = target->fitted_to({c}, failure);
  ASSERT_NE(alone, nullptr) << failure;
  cv::Mat by_alone = c.clone();
  alone->apply(by_alone);
  EXPECT_EQ(cv::norm(by_alone, per_tile, cv::NORM_INF), 0.0);
}

TEST_P(StainNormBoth, AGroupWithoutTissueCannotBeFitted) {
  std::string failure;
  const cv::Mat white(32, 32, CV_8UC3, cv::Scalar::all(255));
  EXPECT_EQ(make_stain_normalizer(GetParam())->fitted_to({white, white, cv::Mat()}, failure), nullptr);
  EXPECT_NE(failure.find("too little tissue"), std::string::npos) << failure;
  failure.clear();
  EXPECT_EQ(make_stain_normalizer(GetParam())->fitted_to({}, failure), nullptr);
  EXPECT_NE(failure.find("too little tissue"), std::string::npos) << failure;
}

// Shards normalized per group record the target's text with kPerGroupSuffix; inference rebuilds the same target.
TEST_P(StainNormBoth, APerGroupDescriptionGivesBackItsTarget) {
  const auto target = make_stain_normalizer(GetParam());
  const auto rebuilt = stain_normalizer_from_description(target->describe() + kPerGroupSuffix, "model.h5");
  ASSERT_NE(rebuilt, nullptr);
  EXPECT_EQ(rebuilt->describe(), target->describe());
}

TEST(StainNormDescription, NoneGivesNullptrAndGarbageNamesTheFile) {
  EXPECT_EQ(stain_normalizer_from_description("none", "model.h5"), nullptr);
  EXPECT_EQ(stain_normalizer_from_description("", "model.h5"), nullptr);
  for (const std::string bad :
       {"vahadane target=builtin", "reinhard target=builtin lab_mean=(1,2) lab_std=(1,2,3)",
        "macenko target=builtin h=(0.6,0.7,0.3) e=(0.1,x,0.1) max_concentration=(1,1)", "reinhard"}) {
    try {
      stain_normalizer_from_description(bad, "model.h5");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const core::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("model.h5"), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StainNorm, StainNormBoth, ::testing::Values(StainMethod::reinhard, StainMethod::macenko),
                         [](const auto& param_info) { return std::string(to_string(param_info.param)); });

}  // namespace
}  // namespace tessera::prep
