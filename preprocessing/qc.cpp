#include "preprocessing/qc.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <malloc.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "core/measure.h"
#include "preprocessing/overlay.h"
#include "preprocessing/stain.h"

namespace tessera::prep {

namespace {

constexpr std::array<Artefact, kArtefactCount> kAll = {
    Artefact::blur, Artefact::pen_green, Artefact::pen_blue,    Artefact::pen_black,   Artefact::pen_red,
    Artefact::fold, Artefact::bubble,    Artefact::overexposed, Artefact::underexposed};
constexpr std::array<const char*, kArtefactCount> kNames = {
    "blur", "pen_green", "pen_blue", "pen_black", "pen_red", "fold", "bubble", "overexposed", "underexposed"};
// Each class's documented default action (qc.<class>.action).
constexpr std::array<const char*, kArtefactCount> kDefaultActions = {
    "flag", "exclude", "exclude", "exclude", "exclude", "exclude", "exclude", "exclude", "exclude"};

// A slide too small for QC: fewer QC pixels a side than this.
constexpr int kMinQcSide = 8;

// Ink colours (see qc.h). Degrees and 0..1 shares of the maximum channel.
constexpr double kGreenHueMin = 60.0;
constexpr double kBlueHueMin = 170.0;
constexpr double kInkHueMax = 236.0;  // haematoxylin sits at ≥ 240°
constexpr double kInkMinSaturation = 0.20;
constexpr double kBlackMaxValue = 0.30;
constexpr double kBlackMaxSaturation = 0.45;
constexpr double kRedHueLow = 325.0;  // red ink: hue ≥ this or < kRedHueHigh
constexpr double kRedHueHigh = 25.0;
constexpr double kRedMinSaturation = 0.60;

// Bubble rims, coverslip edges and black ink are neutral: their OD has a large component along the residual
// direction of colour deconvolution (H × E), which stained tissue lacks. Rims are thin lines; ink strokes are wide.
constexpr double kNeutralMinResidual = 0.12;
constexpr double kRimMinResidual = 0.3;     // a bubble's rim is a dark grey line; dense tissue stays below
constexpr double kBlackMinResidual = 0.45;  // black ink over tissue; an under-exposed field adds about 0.3
constexpr double kRimMaxWidthUm = 64.0;     // wider neutral areas are ink (or a dark field), not a rim
// Glass darkened this far below the slide's glass, neutral, is under-exposed.
constexpr double kUnderMaxSaturation = 0.12;

// An under-exposed field over tissue that holds little glass: its darkened tissue is judged against the tissue in a
// ring this wide around it.
constexpr double kUnderRingUm = 96.0;

// A clipped channel: an over-exposed pixel.
constexpr int kClippedLevel = 253;

// Over-exposed tissue: both stains at most 1/this of their local median.
constexpr float kOverexposureRatio = 1.2f;

// Sharpness: |Laplacian| over the local contrast |grey − Gaussian(grey, kContrastSigma px)| (grey levels).
constexpr double kContrastSigma = 3.0;
constexpr double kMinContrast = 2.0;

// Local medians of the stain concentrations for folds are taken over a window of about this many µm.
constexpr double kFoldWindowUm = 800.0;
// A fold's fainter pixels, joined to its core: raised by this share of the full ratio's excess (qc.fold_ratio).
constexpr double kFoldWeakShare = 0.6;
// A fold's stretch over eosin-rich tissue (stroma among lymphoid tissue) or across a washed-out field raises eosin far
// more than haematoxylin against the tissue around: such pixels (eosin at least kFoldEosinRatio times its local
// median, haematoxylin at least kFoldMinHaematoxylinShare of its own) count where they join a fold's core.
constexpr double kFoldEosinRatio = 2.0;
constexpr double kFoldMinHaematoxylinShare = 0.5;
// Pieces of one fold in line with each other, at most this far apart, are one fold for the size test
// (qc.min_artefact_um2): about the width of a bubble or an exposure field, where a thin fold may be lost.
constexpr double kFoldMaxGapUm = 320.0;
// Concentrations are quantized for the median filter: this many levels per OD unit (OD up to 255/levels).
constexpr double kConcentrationLevels = 100.0;

cv::Mat elliptic(int size) { return cv::getStructuringElement(cv::MORPH_ELLIPSE, cv::Size(size, size)); }

struct Hsv {
  double hue;  // degrees, 0 for neutral pixels
  double saturation;
  double value;  // 0..1
};

Hsv hsv(const cv::Vec3b& rgb) {
  const double red = rgb[0], green = rgb[1], blue = rgb[2];
  const double mx = std::max({red, green, blue});
  const double mn = std::min({red, green, blue});
  Hsv out{0.0, mx > 0.0 ? (mx - mn) / mx : 0.0, mx / 255.0};
  if (mx == mn) return out;
  if (mx == red) {
    out.hue = 60.0 * (green - blue) / (mx - mn);
  } else if (mx == green) {
    out.hue = 60.0 * (blue - red) / (mx - mn) + 120.0;
  } else {
    out.hue = 60.0 * (red - green) / (mx - mn) + 240.0;
  }
  if (out.hue < 0.0) out.hue += 360.0;
  return out;
}

double white_distance(const cv::Vec3b& rgb) {
  const double dr = 255.0 - rgb[0], dg = 255.0 - rgb[1], db = 255.0 - rgb[2];
  return std::sqrt(dr * dr + dg * dg + db * db);
}

// What QC derives from the QC-level image again where it needs it, instead of keeping a plane of it as large as the
// level (a CAMELYON-size slide's QC level has 21 Mpx): grey level, glass that is nearly neutral, stain concentrations.
float grey_of(const cv::Vec3b& p) { return static_cast<float>(0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2]); }

cv::Mat1f grey_image(const cv::Mat& rgb) {
  cv::Mat1f out(rgb.size());
  for (int r = 0; r < rgb.rows; ++r) {
    const auto* in = rgb.ptr<cv::Vec3b>(r);
    auto* o = out.ptr<float>(r);
    for (int c = 0; c < rgb.cols; ++c) o[c] = grey_of(in[c]);
  }
  return out;
}

// Far from white and nearly neutral: glass (outside tissue) that a darkened field may have turned grey.
bool grey_glass_colour(const cv::Vec3b& p) {
  return white_distance(p) >= 30.0 && hsv(p).saturation < kUnderMaxSaturation;
}

// The H and E concentrations (Ruifrok vectors, OD units, negative ones 0) of a pixel.
class StainConcentrations {
 public:
  explicit StainConcentrations(const cv::Matx33d& unmix) : unmix_(unmix) {
    for (int i = 0; i < 256; ++i) {
      const auto v = static_cast<std::uint8_t>(i);
      od_[static_cast<std::size_t>(i)] = rgb_to_od(cv::Vec3b(v, v, v))[0];
    }
  }
  cv::Vec2f operator()(const cv::Vec3b& p) const {
    const cv::Vec3d c = unmix_ * cv::Vec3d(od_[p[0]], od_[p[1]], od_[p[2]]);
    return {static_cast<float>(std::max(0.0, c[0])), static_cast<float>(std::max(0.0, c[1]))};
  }
  double residual(const cv::Vec3b& p) const { return (unmix_ * cv::Vec3d(od_[p[0]], od_[p[1]], od_[p[2]]))[2]; }

 private:
  cv::Matx33d unmix_;
  std::array<double, 256> od_{};  // rgb_to_od of each channel value
};

// The stains smoothed over a few QC pixels (a Gaussian of σ 1 px), computed a band of rows at a time instead of as two
// float planes as large as the QC level: each band is computed from the image rows around it, beyond the kernel's
// reach (OpenCV's float kernel for σ 1 reaches 4 px), so that every value is the one smoothing the whole plane gives.
class SmoothedStains {
 public:
  static constexpr int kBandRows = 128;
  SmoothedStains(const cv::Mat& rgb, const StainConcentrations& stains) : rgb_(rgb), stains_(stains) {}
  // Rows [r0, r1) of the smoothed H and E planes (r1 - r0 rows).
  void rows(int r0, int r1, cv::Mat1f& h, cv::Mat1f& e) {
    constexpr int kMargin = 8;
    const int a = std::max(0, r0 - kMargin), b = std::min(rgb_.rows, r1 + kMargin);
    h_.create(b - a, rgb_.cols);
    e_.create(b - a, rgb_.cols);
    for (int r = a; r < b; ++r) {
      const auto* in = rgb_.ptr<cv::Vec3b>(r);
      auto* hr = h_.ptr<float>(r - a);
      auto* er = e_.ptr<float>(r - a);
      for (int c = 0; c < rgb_.cols; ++c) {
        const cv::Vec2f he = stains_(in[c]);
        hr[c] = he[0];
        er[c] = he[1];
      }
    }
    cv::GaussianBlur(h_, h_smooth_, cv::Size(0, 0), 1.0);
    cv::GaussianBlur(e_, e_smooth_, cv::Size(0, 0), 1.0);
    h = h_smooth_.rowRange(r0 - a, r1 - a);
    e = e_smooth_.rowRange(r0 - a, r1 - a);
  }
  // Calls `visit(r0, r1, h, e)` for each band of rows, top to bottom.
  template <typename Visit>
  void each_band(const Visit& visit) {
    cv::Mat1f h, e;
    for (int r0 = 0; r0 < rgb_.rows; r0 += kBandRows) {
      const int r1 = std::min(rgb_.rows, r0 + kBandRows);
      rows(r0, r1, h, e);
      visit(r0, r1, h, e);
    }
  }

 private:
  const cv::Mat& rgb_;
  const StainConcentrations& stains_;
  cv::Mat1f h_, e_, h_smooth_, e_smooth_;
};

// The interiors of closed outlines in `lines` (holes of its foreground), with the outlines.
cv::Mat1b fill_enclosed(const cv::Mat1b& lines) {
  cv::Mat1b filled = lines.clone();
  cv::Mat1b background = 255 - lines;
  cv::Mat labels, stats, centroids;
  const int n = cv::connectedComponentsWithStats(background, labels, stats, centroids, 4, CV_32S);
  std::vector<std::uint8_t> inside(static_cast<std::size_t>(n), 0);
  for (int i = 1; i < n; ++i) {
    const int x = stats.at<int>(i, cv::CC_STAT_LEFT), y = stats.at<int>(i, cv::CC_STAT_TOP);
    const int w = stats.at<int>(i, cv::CC_STAT_WIDTH), h = stats.at<int>(i, cv::CC_STAT_HEIGHT);
    inside[static_cast<std::size_t>(i)] = !(x == 0 || y == 0 || x + w == lines.cols || y + h == lines.rows);
  }
  for (int r = 0; r < lines.rows; ++r) {
    const auto* l = labels.ptr<int>(r);
    auto* f = filled.ptr<std::uint8_t>(r);
    for (int c = 0; c < lines.cols; ++c) {
      if (inside[static_cast<std::size_t>(l[c])] != 0) f[c] = 255;
    }
  }
  return filled;
}

// Keeps the (8-connected) components of `mask` (0 or 255) that overlap `region`: each is flooded with a mark from a
// pixel it has in `region`, then the marked ones are kept (no label plane as large as the mask). The flood goes run by
// run (a run: a row's stretch of unmarked 255s; the rows above and below are looked at one column beyond its ends).
void keep_touching(cv::Mat1b& mask, const cv::Mat1b& region) {
  constexpr std::uint8_t kTouching = 128;
  struct Run {
    int row, left, right;  // inclusive
  };
  std::vector<Run> pending;
  // Marks the run of 255s through (r, c) and queues it.
  const auto mark_run = [&](int r, int c) {
    auto* m = mask.ptr<std::uint8_t>(r);
    int left = c, right = c;
    while (left > 0 && m[left - 1] == 255) --left;
    while (right + 1 < mask.cols && m[right + 1] == 255) ++right;
    std::fill(m + left, m + right + 1, kTouching);
    pending.push_back({r, left, right});
    return right;
  };
  for (int r = 0; r < mask.rows; ++r) {
    const auto* g = region.ptr<std::uint8_t>(r);
    for (int c = 0; c < mask.cols; ++c) {
      if (g[c] == 0 || mask(r, c) != 255) continue;
      mark_run(r, c);
      while (!pending.empty()) {
        const Run run = pending.back();
        pending.pop_back();
        for (const int nr : {run.row - 1, run.row + 1}) {
          if (nr < 0 || nr >= mask.rows) continue;
          const auto* m = mask.ptr<std::uint8_t>(nr);
          for (int nc = std::max(0, run.left - 1); nc <= std::min(mask.cols - 1, run.right + 1); ++nc) {
            if (m[nc] == 255) nc = mark_run(nr, nc);
          }
        }
      }
    }
  }
  for (int r = 0; r < mask.rows; ++r) {
    auto* m = mask.ptr<std::uint8_t>(r);
    for (int c = 0; c < mask.cols; ++c) m[c] = m[c] == kTouching ? 255 : 0;
  }
}

// The folds' and exposure's local-median window (kFoldWindowUm) in QC pixels at `mpp`, at most the 255 px OpenCV's
// 8-bit median filter takes (qc.mask_mpp is at least 3.2, but a narrow slide's QC level, rounded up to whole pixels,
// or an image given at a finer mpp can be finer than that).
int fold_window(double mpp) { return std::clamp(static_cast<int>(std::lround(kFoldWindowUm / mpp)), 3, 255); }

// Frees QC-level planes no longer needed (memory grows with the slide's area), and when they were large gives the
// heap's free pages back to the system: tessera keeps blocks up to 32 MB on the heap (app/main.cpp), where a freed
// plane between live ones would otherwise stay resident. Small planes are not worth it: trimming after each made QC of
// 64 slides of 8192² px (QC planes of 64 KB) spend 0.7 s more in the kernel, faulting the given-back pages in again.
constexpr std::size_t kTrimBytes = std::size_t{4} << 20;

template <typename... Mats>
void release(Mats&... mats) {
  const std::size_t bytes = (std::size_t{0} + ... + (mats.total() * mats.elemSize()));
  (mats.release(), ...);
  if (bytes >= kTrimBytes) malloc_trim(0);
}

// Where a stroke narrower than the width test crosses tissue (the tissue's colour takes its faded edges below the
// ink's tests), the test cuts it into wide pieces on either side. The stretches of `raw` (black pixels) outside `wide`
// (the pieces), 2 px clear of them, that come within 2 px of two different pieces. `raw` is made into the result.
cv::Mat1b narrow_stretches(cv::Mat1b raw, const cv::Mat1b& wide) {
  cv::Mat1b clear_of_wide;
  cv::dilate(wide, clear_of_wide, elliptic(5));
  cv::bitwise_not(clear_of_wide, clear_of_wide);
  cv::Mat1b& out = raw;
  out &= clear_of_wide;
  release(clear_of_wide);
  cv::Mat pieces, stretches;
  const int n = cv::connectedComponents(out, stretches, 8, CV_32S);
  cv::connectedComponents(wide, pieces, 8, CV_32S);
  std::vector<int> first(static_cast<std::size_t>(n), 0);
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
  constexpr int kReach = 2;
  for (int r = 0; r < out.rows; ++r) {
    for (int c = 0; c < out.cols; ++c) {
      const int l = stretches.at<int>(r, c);
      if (l == 0 || keep[static_cast<std::size_t>(l)] != 0) continue;
      for (int dr = -kReach; dr <= kReach; ++dr) {
        for (int dc = -kReach; dc <= kReach; ++dc) {
          const int rr = r + dr, cc = c + dc;
          if (rr < 0 || cc < 0 || rr >= out.rows || cc >= out.cols) continue;
          const int k = pieces.at<int>(rr, cc);
          if (k == 0) continue;
          int& f = first[static_cast<std::size_t>(l)];
          if (f == 0) f = k;
          if (f != k) keep[static_cast<std::size_t>(l)] = 1;
        }
      }
    }
  }
  keep_labelled(out, stretches, keep);
  return out;
}

// Keeps the components of `mask` that are nearly convex (area at least kMinBubbleSolidity of their convex hull's):
// bubbles are round, while loops of grey specks in dense tissue enclose ragged areas.
constexpr double kMinBubbleSolidity = 0.85;
void keep_round(cv::Mat1b& mask) {
  std::vector<std::vector<cv::Point>> contours;
  cv::findContours(mask.clone(), contours, cv::RETR_EXTERNAL, cv::CHAIN_APPROX_NONE);
  cv::Mat1b out = cv::Mat1b::zeros(mask.size());
  for (const auto& contour : contours) {
    std::vector<cv::Point> hull;
    cv::convexHull(contour, hull);
    const double hull_area = cv::contourArea(hull);
    if (hull_area > 0.0 && cv::contourArea(contour) >= kMinBubbleSolidity * hull_area) {
      cv::drawContours(out, std::vector<std::vector<cv::Point>>{contour}, -1, cv::Scalar(255), cv::FILLED);
    }
  }
  mask &= out;
}

// Bubbles whose rim is not a closed line (broken where ink, a fold or an exposure field crosses it): circles that
// the rim fragments in `lines` support. Candidates come from the Hough transform; a candidate is kept when rim
// pixels lie along at least kMinRimSupport of its circumference and form a line there (at most `max_width` px wide,
// with a gap on both sides), which grey specks in tissue do not. Returns the discs (rim included), radius
// min_radius..max_radius pixels.
constexpr double kMinRimSupport = 0.55;
constexpr double kRimTolerancePx = 1.5;  // a rim pixel this close to the circle supports it
// A rim is a line: past its edges, inside and outside, there is a gap of this many pixels where it supports the
// circle, at all but kMaxBesideRim of those places (a speckled grey blob, such as dark tissue in an under-exposed
// field, supports every circle drawn in it).
constexpr double kRimClearancePx = 3.0;
constexpr double kMaxBesideRim = 0.1;
constexpr double kMinRimArc = 0.2;  // the longest unbroken supporting arc, a share of the circumference
cv::Mat1b circles_on_rims(const cv::Mat1b& lines, double min_radius, double max_radius, double max_width) {
  cv::Mat1b out = cv::Mat1b::zeros(lines.size());
  if (cv::countNonZero(lines) == 0 || max_radius <= min_radius) return out;
  cv::Mat1b smooth;
  cv::GaussianBlur(lines, smooth, cv::Size(0, 0), 1.0);
  // Candidates from both of OpenCV's Hough variants: the gradient one finds circles with wide gaps, the "ALT" one
  // places circles more exactly; both are loose (few votes, little perfectness), as the support test decides.
  const int r0 = static_cast<int>(std::floor(min_radius)), r1 = static_cast<int>(std::ceil(max_radius));
  constexpr double kMinCentreDistance = 2.0;  // near-duplicates are resolved below, by support
  std::vector<cv::Vec3f> candidates, more;
  constexpr double kAltScale = 1.5;  // accumulator at 2/3 of the mask's resolution (OpenCV's advice for ALT)
  constexpr double kAltCanny = 300.0, kAltMinPerfectness = 0.3;
  cv::HoughCircles(smooth, candidates, cv::HOUGH_GRADIENT_ALT, kAltScale, kMinCentreDistance, kAltCanny,
                   kAltMinPerfectness, r0, r1);
  constexpr double kCanny = 100.0, kMinVotes = 12.0;
  cv::HoughCircles(smooth, more, cv::HOUGH_GRADIENT, 1.0, kMinCentreDistance, kCanny, kMinVotes, r0, r1);
  candidates.insert(candidates.end(), more.begin(), more.end());
  if (candidates.empty()) return out;
  cv::Mat1f distance;  // to the nearest rim pixel
  cv::distanceTransform(255 - lines, distance, cv::DIST_L2, cv::DIST_MASK_PRECISE);
  // Each candidate's support; the best supported of near-concentric candidates (one bubble seen at several radii
  // and centres) is the bubble.
  struct Supported {
    cv::Vec3f circle;
    double support;
  };
  std::vector<Supported> kept;
  for (const cv::Vec3f& circle : candidates) {
    const double cx = circle[0], cy = circle[1], radius = circle[2];
    const int samples = std::max(32, static_cast<int>(std::lround(2.0 * M_PI * radius)));
    int supported = 0, beside = 0;
    std::vector<std::uint8_t> on_rim(static_cast<std::size_t>(samples), 0);
    for (int k = 0; k < samples; ++k) {
      const double t = 2.0 * M_PI * k / samples;
      const auto near_line = [&](double r, double tolerance) {
        const int x = static_cast<int>(std::lround(cx + r * std::cos(t)));
        const int y = static_cast<int>(std::lround(cy + r * std::sin(t)));
        return x >= 0 && y >= 0 && x < lines.cols && y < lines.rows && distance(y, x) <= tolerance;
      };
      if (!near_line(radius, kRimTolerancePx)) continue;
      ++supported;
      on_rim[static_cast<std::size_t>(k)] = 1;
      // The line's extent across the circle here, then a gap on either side.
      double outer = radius + kRimTolerancePx, inner = radius - kRimTolerancePx;
      while (outer < radius + max_width && near_line(outer + 1.0, 0.0)) outer += 1.0;
      while (inner > radius - max_width && near_line(inner - 1.0, 0.0)) inner -= 1.0;
      if (near_line(outer + kRimClearancePx, 0.0) || near_line(inner - kRimClearancePx, 0.0)) ++beside;
    }
    const double support = static_cast<double>(supported) / samples;
    if (beside > kMaxBesideRim * supported) continue;
    // The longest unbroken arc (around the circle): a rim broken in a few places keeps long arcs, dark specks in
    // tissue that happen to lie near a circle do not.
    int longest = 0, run = 0;
    for (int k = 0; k < 2 * samples && longest < samples; ++k) {
      run = on_rim[static_cast<std::size_t>(k % samples)] != 0 ? run + 1 : 0;
      longest = std::max(longest, run);
    }
    if (longest < kMinRimArc * samples) continue;
    if (support >= kMinRimSupport) kept.push_back({circle, support});
  }
  std::sort(kept.begin(), kept.end(), [](const Supported& a, const Supported& b) { return a.support > b.support; });
  std::vector<cv::Vec3f> bubbles;
  for (const Supported& s : kept) {
    const bool duplicate = std::any_of(bubbles.begin(), bubbles.end(), [&](const cv::Vec3f& b) {
      return std::hypot(s.circle[0] - b[0], s.circle[1] - b[1]) < 0.5 * std::min(s.circle[2], b[2]);
    });
    if (duplicate) continue;
    bubbles.push_back(s.circle);
    // The rim itself is part of the bubble: the disc reaches its outer edge.
    cv::circle(out, cv::Point(static_cast<int>(std::lround(s.circle[0])), static_cast<int>(std::lround(s.circle[1]))),
               static_cast<int>(std::lround(s.circle[2] + 1.0)), cv::Scalar(255), cv::FILLED);
  }
  return out;
}

// What `found` continues under: the runs of `hidden` pixels not in `found` (along rows, columns and both diagonals)
// with a pixel of `found` just before and just after them, that cross `hidden` rather than run along it: at most
// kMaxCrossingLength times as long as `hidden` is wide where the run passes (twice the largest distance from the run
// to the outside of `hidden`), so a straight band crossed at about 20° or more. A fold crossing an ink stroke is seen
// on both sides of it; a line that grazes a curved stroke, or runs along a stroke between two folds, crosses nothing.
constexpr double kMaxCrossingLength = 3.0;
cv::Mat1b continued_under(const cv::Mat1b& found, const cv::Mat1b& hidden) {
  cv::Mat1f depth;  // to the nearest pixel outside `hidden`
  cv::distanceTransform(hidden, depth, cv::DIST_L2, cv::DIST_MASK_PRECISE);
  cv::Mat1b out = cv::Mat1b::zeros(found.size());
  const int rows = found.rows, cols = found.cols;
  // One line of pixels from (r, c) in steps of (dr, dc).
  const auto walk = [&](int r, int c, int dr, int dc) {
    const double step = dr != 0 && dc != 0 ? std::sqrt(2.0) : 1.0;
    int start_r = -1, start_c = -1;  // the first hidden pixel of the current run, when it follows a found pixel
    int length = 0;
    float deepest = 0.0f;
    bool after_found = false;
    for (; r >= 0 && c >= 0 && r < rows && c < cols; r += dr, c += dc) {
      if (hidden(r, c) != 0 && found(r, c) == 0) {
        if (after_found && start_r < 0) {
          start_r = r;
          start_c = c;
          length = 0;
          deepest = 0.0f;
        }
        ++length;
        deepest = std::max(deepest, depth(r, c));
        continue;
      }
      if (start_r >= 0 && found(r, c) != 0 && length * step <= kMaxCrossingLength * 2.0 * deepest) {
        for (int fr = start_r, fc = start_c; fr != r || fc != c; fr += dr, fc += dc) out(fr, fc) = 255;
      }
      start_r = -1;
      after_found = found(r, c) != 0;
    }
  };
  for (int r = 0; r < rows; ++r) walk(r, 0, 0, 1);
  for (int c = 0; c < cols; ++c) walk(0, c, 1, 0);
  for (int r = 0; r < rows; ++r) {
    walk(r, 0, 1, 1);
    walk(r, cols - 1, 1, -1);
  }
  for (int c = 1; c < cols; ++c) {
    walk(0, c, 1, 1);
    walk(0, cols - 1 - c, 1, -1);
  }
  return out;
}

// Drops the pieces of pen ink (`pens`, one mask a colour) below `min_pixels` unless joined, through ink of any colour
// or `dark` pixels within `reach` (an odd kernel size) of two colours' ink (where strokes cross), to ink of another
// colour with which they are at least `min_pixels` in all. An empty mask (a class not looked for) holds no ink.
void remove_small_ink(const std::array<cv::Mat1b*, 4>& pens, const cv::Mat1b& dark, int reach, double min_pixels) {
  if (min_pixels <= 1.0) return;
  const cv::Size size = dark.size();
  cv::Mat joined_labels, joined_stats, centroids;
  int n = 0;
  {
    cv::Mat1b joined = cv::Mat1b::zeros(size), crossing = cv::Mat1b::zeros(size), near;
    cv::Mat1b once = cv::Mat1b::zeros(size);  // within reach of one colour at least
    for (const cv::Mat1b* pen : pens) {
      if (pen->empty()) continue;
      joined |= *pen;
      cv::dilate(*pen, near, elliptic(reach));
      crossing |= once & near;
      once |= near;
    }
    joined |= crossing & dark;
    release(crossing, near, once);
    n = cv::connectedComponentsWithStats(joined, joined_labels, joined_stats, centroids, 8, CV_32S);
  }
  std::vector<std::uint8_t> colours(static_cast<std::size_t>(n), 0);  // one bit a colour
  for (std::size_t i = 0; i < pens.size(); ++i) {
    if (pens[i]->empty()) continue;
    for (int r = 0; r < size.height; ++r) {
      const auto* p = pens[i]->ptr<std::uint8_t>(r);
      const auto* l = joined_labels.ptr<int>(r);
      for (int c = 0; c < size.width; ++c) {
        if (p[c] != 0) colours[static_cast<std::size_t>(l[c])] |= static_cast<std::uint8_t>(1U << i);
      }
    }
  }
  for (std::size_t i = 0; i < pens.size(); ++i) {
    cv::Mat1b& pen = *pens[i];
    if (pen.empty() || cv::countNonZero(pen) == 0) continue;
    cv::Mat labels, stats;
    const int pieces = cv::connectedComponentsWithStats(pen, labels, stats, centroids, 8, CV_32S);
    std::vector<std::uint8_t> keep(static_cast<std::size_t>(pieces), 0);
    for (int r = 0; r < size.height; ++r) {
      const auto* l = labels.ptr<int>(r);
      const auto* j = joined_labels.ptr<int>(r);
      for (int c = 0; c < size.width; ++c) {
        const auto k = static_cast<std::size_t>(l[c]), g = static_cast<std::size_t>(j[c]);
        if (k == 0 || keep[k] != 0) continue;
        const bool joined_to_other =
            (colours[g] & ~(1U << i)) != 0 && joined_stats.at<int>(j[c], cv::CC_STAT_AREA) >= min_pixels;
        keep[k] = stats.at<int>(l[c], cv::CC_STAT_AREA) >= min_pixels || joined_to_other;
      }
    }
    keep_labelled(pen, labels, keep);
  }
}

// A thin fold is found in pieces where something breaks it (it crosses a bubble's rim, an exposure field's edge or a
// hole in the tissue): each piece alone may be smaller than the smallest artefact kept, while the fold is not. Drops
// the 8-connected components of `mask` whose chain is below `min_pixels` in all. Pieces chain when one of them is a
// stretch of fold, elongated (at least kChainMinElongation times as long as wide, from its second moments) and at
// least kChainMinLengthShare of `max_gap` long, and the other lies in line with it beyond one of its ends: seen from
// that end, the other's centre (a round piece) or its facing end (an elongated one, whose axis is then within
// kChainMaxAngle of the first's and which sees the first's end likewise) lies within kChainMaxAngle of the axis, and
// the facing ends are at most `max_gap` pixels apart. Pieces chain only through stretches of fold, so round specks
// never chain, directly or through a speck or sliver between them. `max_gap` is in pixels of the slide's x mpp and
// angles are taken on the pixel grid, the QC level's pixels being taken as square: on a slide whose y mpp differs,
// gaps and angles along y are off by the ratio of the two.
constexpr double kChainMinElongation = 3.0;
constexpr double kChainMinLengthShare = 0.5;
constexpr double kChainMaxAngle = 20.0 * M_PI / 180.0;
void remove_small_chains(cv::Mat1b& mask, double min_pixels, double max_gap) {
  if (min_pixels <= 1.0 || cv::countNonZero(mask) == 0) return;
  const auto started = std::chrono::steady_clock::now();
  cv::Mat labels, stats, centroids;
  const int n = cv::connectedComponentsWithStats(mask, labels, stats, centroids, 8, CV_32S);
  const auto at = [](int i) { return static_cast<std::size_t>(i); };
  // Second moments about each piece's centre.
  std::vector<cv::Vec3d> moments(at(n), cv::Vec3d(0.0, 0.0, 0.0));
  for (int r = 0; r < mask.rows; ++r) {
    const auto* l = labels.ptr<int>(r);
    for (int c = 0; c < mask.cols; ++c) {
      if (l[c] == 0) continue;
      const double dx = c - centroids.at<double>(l[c], 0), dy = r - centroids.at<double>(l[c], 1);
      moments[at(l[c])] += cv::Vec3d(dx * dx, dy * dy, dx * dy);
    }
  }
  struct Piece {
    cv::Point2d centre, axis;  // axis: a unit vector along the piece
    double length = 0.0;
    bool elongated = false;
  };
  std::vector<Piece> pieces(at(n));
  for (int i = 1; i < n; ++i) {
    const double area = stats.at<int>(i, cv::CC_STAT_AREA);
    const double xx = moments[at(i)][0] / area, yy = moments[at(i)][1] / area, xy = moments[at(i)][2] / area;
    const double spread = std::hypot(0.5 * (xx - yy), xy);
    const double angle = 0.5 * std::atan2(2.0 * xy, xx - yy);
    Piece& p = pieces[at(i)];
    p.centre = {centroids.at<double>(i, 0), centroids.at<double>(i, 1)};
    p.axis = {std::cos(angle), std::sin(angle)};
    // A uniform bar of length L has a variance of L²/12 along it; a line one pixel wide is one pixel wide.
    p.length = std::sqrt(12.0 * (0.5 * (xx + yy) + spread));
    const double width = std::max(1.0, std::sqrt(12.0 * std::max(0.0, 0.5 * (xx + yy) - spread)));
    p.elongated = p.length >= kChainMinElongation * width && p.length >= kChainMinLengthShare * max_gap;
  }
  // Pieces by the cells of a grid of max_gap squares their bounding boxes cover: what lies within max_gap of a point
  // is in the 3 x 3 cells around it at most.
  const double cell = std::max(1.0, max_gap);
  const int grid_cols = static_cast<int>(mask.cols / cell) + 1, grid_rows = static_cast<int>(mask.rows / cell) + 1;
  const auto cell_of = [&](double v, int cells) { return std::clamp(static_cast<int>(v / cell), 0, cells - 1); };
  std::vector<std::vector<int>> grid(at(grid_cols) * at(grid_rows));
  for (int i = 1; i < n; ++i) {
    const int x = stats.at<int>(i, cv::CC_STAT_LEFT), y = stats.at<int>(i, cv::CC_STAT_TOP);
    const int x1 = cell_of(x + stats.at<int>(i, cv::CC_STAT_WIDTH) - 1, grid_cols);
    const int y1 = cell_of(y + stats.at<int>(i, cv::CC_STAT_HEIGHT) - 1, grid_rows);
    for (int gy = cell_of(y, grid_rows); gy <= y1; ++gy) {
      for (int gx = cell_of(x, grid_cols); gx <= x1; ++gx) grid[at(gy) * at(grid_cols) + at(gx)].push_back(i);
    }
  }
  std::vector<int> chain(at(n)), seen(at(n), 0);
  for (int i = 0; i < n; ++i) chain[at(i)] = i;
  const auto root = [&](int i) {
    while (chain[at(i)] != i) i = chain[at(i)] = chain[at(chain[at(i)])];
    return i;
  };
  const double cos_max = std::cos(kChainMaxAngle);
  // Whether `v` (from an end) points within kChainMaxAngle of `direction` (a unit vector), or the two touch.
  const auto ahead = [&](const cv::Point2d& v, const cv::Point2d& direction) {
    const double distance = std::hypot(v.x, v.y);
    return distance <= 1.0 || v.dot(direction) >= cos_max * distance;
  };
  int stamp = 0;
  for (int i = 1; i < n; ++i) {
    const Piece& p = pieces[at(i)];
    if (!p.elongated) continue;
    for (const double side : {-1.0, 1.0}) {
      const cv::Point2d out = side * p.axis, tip = p.centre + 0.5 * p.length * out;
      ++stamp;
      const int gx1 = cell_of(tip.x + max_gap, grid_cols), gy1 = cell_of(tip.y + max_gap, grid_rows);
      for (int gy = cell_of(tip.y - max_gap, grid_rows); gy <= gy1; ++gy) {
        for (int gx = cell_of(tip.x - max_gap, grid_cols); gx <= gx1; ++gx) {
          for (const int j : grid[at(gy) * at(grid_cols) + at(gx)]) {
            if (j == i || seen[at(j)] == stamp) continue;
            seen[at(j)] = stamp;
            const Piece& q = pieces[at(j)];
            bool joins = false;
            if (!q.elongated) {
              const cv::Point2d v = q.centre - tip;
              joins = std::hypot(v.x, v.y) - 0.5 * q.length <= max_gap && ahead(v, out);
            } else if (std::abs(p.axis.dot(q.axis)) >= cos_max) {
              // q's end nearer p's.
              const cv::Point2d back = (q.axis.dot(tip - q.centre) >= 0.0 ? 1.0 : -1.0) * q.axis;
              const cv::Point2d v = q.centre + 0.5 * q.length * back - tip;
              joins = std::hypot(v.x, v.y) <= max_gap && ahead(v, out) && ahead(-v, back);
            }
            if (joins) chain[at(root(j))] = root(i);
          }
        }
      }
    }
  }
  std::vector<double> chain_area(at(n), 0.0);
  for (int i = 1; i < n; ++i) chain_area[at(root(i))] += stats.at<int>(i, cv::CC_STAT_AREA);
  std::vector<std::uint8_t> keep(at(n), 0);
  for (int i = 1; i < n; ++i) keep[at(i)] = chain_area[at(root(i))] >= min_pixels;
  keep_labelled(mask, labels, keep);
  spdlog::debug("QC fold pieces: {} in {:.3f} s", n - 1, core::seconds_since(started));
}

// Each 8-connected component of `mask` filled to its convex hull.
cv::Mat1b convex_hulls(const cv::Mat1b& mask) {
  std::vector<std::vector<cv::Point>> contours;
  cv::findContours(mask.clone(), contours, cv::RETR_EXTERNAL, cv::CHAIN_APPROX_SIMPLE);
  cv::Mat1b out = cv::Mat1b::zeros(mask.size());
  for (const auto& contour : contours) {
    std::vector<cv::Point> hull;
    cv::convexHull(contour, hull);
    cv::fillConvexPoly(out, hull, cv::Scalar(255));
  }
  return out;
}

double median_of(std::vector<float> values) {
  if (values.empty()) return 0.0;
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), mid, values.end());
  return *mid;
}

// A class's mask that holds nothing is freed (find_artefacts gives it zeros at the end).
void drop_if_empty(cv::Mat1b& mask) {
  if (!mask.empty() && cv::countNonZero(mask) == 0) mask.release();
}

// The value median_of picks (the one at sorted position n/2) among `value(r, c)` for the pixels where `mask` is set
// (`inside`) or not, without a copy of them: a histogram of the values' top 16 bits, then the values of the bin that
// holds it. 0 when there are none. The values are floats that are not negative (their bits then sort as they do).
template <typename Value>
double median_where(const cv::Mat1b& mask, bool inside, const Value& value) {
  constexpr int kShift = 16;
  std::vector<std::uint32_t> histogram(std::size_t{1} << (32 - kShift), 0);
  const auto key = [](float v) {  // the float's bits made to sort as the floats do (negative values included)
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits ^= (bits >> 31) != 0 ? 0xFFFFFFFFu : 0x80000000u;
    return bits >> kShift;
  };
  std::uint64_t count = 0;
  for (int r = 0; r < mask.rows; ++r) {
    const auto* m = mask.ptr<std::uint8_t>(r);
    for (int c = 0; c < mask.cols; ++c) {
      if ((m[c] != 0) != inside) continue;
      ++histogram[key(value(r, c))];
      ++count;
    }
  }
  if (count == 0) return 0.0;
  std::uint64_t rank = count / 2, below = 0;
  std::uint32_t bin = 0;
  while (below + histogram[bin] <= rank) below += histogram[bin++];
  std::vector<float> values;
  values.reserve(histogram[bin]);
  for (int r = 0; r < mask.rows; ++r) {
    const auto* m = mask.ptr<std::uint8_t>(r);
    for (int c = 0; c < mask.cols; ++c) {
      if ((m[c] != 0) != inside) continue;
      const float v = value(r, c);
      if (key(v) == bin) values.push_back(v);
    }
  }
  const auto at = values.begin() + static_cast<std::ptrdiff_t>(rank - below);
  std::nth_element(values.begin(), at, values.end());
  return *at;
}

// The median of `plane` over the pixels where `mask` is set (`inside`) or not; 0 when there are none.
double median_where(const cv::Mat1f& plane, const cv::Mat1b& mask, bool inside) {
  return median_where(mask, inside, [&](int r, int c) { return plane(r, c); });
}

// The components of `candidates` (wide areas of tissue darkened by a neutral grey) that are fields of an exposure
// fault: at least `min_pixels`, less than half on `fold` (empty: no folds), and their median grey level (of `rgb`)
// below `ratio` times the median grey of the tissue around them (tissue outside `candidates` at most `ring` pixels
// away; at least a quarter of `min_pixels` of it). Dense tissue is about as bright as the tissue it lies in; a camera
// field darkened by a neutral grey is far darker, and so is a fold (tissue lying double), which is why folds are left
// out.
cv::Mat1b darkened_fields(const cv::Mat1b& candidates, const cv::Mat& rgb, const cv::Mat1b& tissue,
                          const cv::Mat1b& fold, double ratio, int ring, double min_pixels) {
  cv::Mat labels, stats, centroids;
  const int n = cv::connectedComponentsWithStats(candidates, labels, stats, centroids, 8, CV_32S);
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
  const cv::Rect whole(0, 0, candidates.cols, candidates.rows);
  for (int i = 1; i < n; ++i) {
    if (stats.at<int>(i, cv::CC_STAT_AREA) < min_pixels) continue;
    const cv::Rect box =
        cv::Rect(stats.at<int>(i, cv::CC_STAT_LEFT) - ring, stats.at<int>(i, cv::CC_STAT_TOP) - ring,
                 stats.at<int>(i, cv::CC_STAT_WIDTH) + 2 * ring, stats.at<int>(i, cv::CC_STAT_HEIGHT) + 2 * ring) &
        whole;
    const cv::Mat1b field = labels(box) == i;
    if (!fold.empty() && 2 * cv::countNonZero(field & fold(box)) >= stats.at<int>(i, cv::CC_STAT_AREA)) continue;
    cv::Mat1b around;
    cv::dilate(field, around, elliptic(2 * ring + 1));
    around &= tissue(box) & ~candidates(box);
    if (cv::countNonZero(around) < min_pixels / 4.0) continue;
    const cv::Mat1f g = grey_image(rgb(box));
    if (median_where(g, field, true) < ratio * median_where(g, around, true)) keep[static_cast<std::size_t>(i)] = 1;
  }
  cv::Mat1b out = candidates.clone();
  keep_labelled(out, labels, keep);
  return out;
}

// `value` quantized to kConcentrationLevels per unit (Concentrations gives it in OD units) into `out` (same size),
// where `tissue` is set; elsewhere `global` (the tissue's global median) quantized.
void quantize_tissue(const cv::Mat1f& value, const cv::Mat1b& tissue, double global, cv::Mat1b& out) {
  for (int r = 0; r < value.rows; ++r) {
    const auto* v = value.ptr<float>(r);
    const auto* t = tissue.ptr<std::uint8_t>(r);
    auto* o = out.ptr<std::uint8_t>(r);
    for (int c = 0; c < value.cols; ++c) {
      const double x = t[c] != 0 ? v[c] : global;
      o[c] = cv::saturate_cast<std::uint8_t>(x * kConcentrationLevels);
    }
  }
}

// The local median of `value` over tissue (`tissue` 255) in a `window`-pixel square, quantized (quantize_tissue);
// pixels off tissue count as the tissue's global median.
cv::Mat1b local_tissue_median(const cv::Mat1f& value, const cv::Mat1b& tissue, int window, double global) {
  cv::Mat1b q(value.size());
  quantize_tissue(value, tissue, global, q);
  cv::Mat1b median;
  cv::medianBlur(q, median, window | 1);
  return median;
}

// A quantized concentration (local_tissue_median) in OD units, as converting the whole plane to float gives it.
class Concentrations {
 public:
  Concentrations() {
    cv::Mat1b levels(1, 256);
    for (int i = 0; i < 256; ++i) levels(0, i) = static_cast<std::uint8_t>(i);
    cv::Mat1f values;
    levels.convertTo(values, CV_32F, 1.0 / kConcentrationLevels);
    for (int i = 0; i < 256; ++i) table_[static_cast<std::size_t>(i)] = values(0, i);
  }
  float operator()(std::uint8_t level) const { return table_[level]; }

 private:
  std::array<float, 256> table_{};
};

}  // namespace

const std::array<Artefact, kArtefactCount>& all_artefacts() { return kAll; }

const char* to_string(Artefact artefact) { return kNames[static_cast<std::size_t>(index(artefact))]; }

QcAction parse_qc_action(const std::string& name, const std::string& key) {
  if (name == "exclude") return QcAction::exclude;
  if (name == "flag") return QcAction::flag;
  throw core::ConfigError("unknown QC action '" + name + "' (known: exclude, flag)", "", 0, key);
}

const char* to_string(QcAction action) { return action == QcAction::exclude ? "exclude" : "flag"; }

core::Schema& declare_qc_keys(core::Schema& schema) {
  schema
      .boolean("qc.enabled", true, "Run slide quality control (artefact masks, slide-level checks) first")
      // At least 3.2: the folds' and exposure's 800 um local medians must fit the 255 px window of OpenCV's 8-bit
      // median filter (finer masks failed inside it).
      .number("qc.mask_mpp", 8.0, "Resolution of the QC masks in um/px", 3.2, 64)
      .number("qc.blur_mpp", 1.0, "Resolution at which sharpness is measured, um/px", 0.25, 16)
      .number("qc.blur_ratio", 0.7,
              "Tissue is out of focus where its sharpness is below this share of the slide's median", 0, 1)
      .number("qc.severe_blur_ratio", 0.3,
              "Blur below this share of the median sharpness is excluded whatever qc.blur.action says", 0, 1)
      .number("qc.fold_ratio", 1.3, "A fold: both H and E at least this many times their local median over the tissue",
              1, 10)
      .number("qc.underexposure_ratio", 0.8,
              "Under-exposed: glass darker than this share of the slide's median glass brightness, or a field of "
              "tissue darkened by a neutral grey below this share of the tissue around it",
              0, 1)
      .number("qc.min_tissue_mm2", 1.0, "Less tissue than this flags the slide (too little tissue)", 0, 1e6)
      .number("qc.min_artefact_um2", 20000.0,
              "Artefact specks smaller than this are ignored (a fold's pieces in line count together)", 0, 1e9)
      .number("qc.margin_um", 48.0, "Excluded areas reach this many um beyond the artefacts found (their faded edges)",
              0, 1000)
      .number("qc.max_fraction", 0.1,
              "A tile (tile) or cell (infer) with more of its area in excluded artefacts is excluded", 0, 1)
      .boolean("qc.refuse_flagged", false,
               "A slide-level flag (too little tissue, not brightfield, stain far from cohort) fails the slide "
               "instead of a warning");
  for (const Artefact a : kAll) {
    const std::string name = to_string(a);
    schema.boolean("qc." + name + ".enabled", true, "Detect " + name)
        .string("qc." + name + ".action", kDefaultActions[static_cast<std::size_t>(index(a))],
                "What infer and tile do with " + name + ": exclude (not scored, tiles dropped) or flag (kept, marked)",
                {"exclude", "flag"});
  }
  return schema;
}

bool qc_enabled(const core::Config& config) { return config.get_bool("qc.enabled"); }

QcOptions qc_options(const core::Config& config) {
  QcOptions o;
  o.mask_mpp = config.get_number("qc.mask_mpp");
  o.blur_mpp = config.get_number("qc.blur_mpp");
  o.blur_ratio = config.get_number("qc.blur_ratio");
  o.severe_blur_ratio = config.get_number("qc.severe_blur_ratio");
  o.fold_ratio = config.get_number("qc.fold_ratio");
  o.underexposure_ratio = config.get_number("qc.underexposure_ratio");
  o.min_tissue_mm2 = config.get_number("qc.min_tissue_mm2");
  o.min_artefact_um2 = config.get_number("qc.min_artefact_um2");
  o.max_fraction = config.get_number("qc.max_fraction");
  o.margin_um = config.get_number("qc.margin_um");
  o.refuse_flagged = config.get_bool("qc.refuse_flagged");
  for (const Artefact a : kAll) {
    const std::string name = to_string(a);
    const auto i = static_cast<std::size_t>(index(a));
    o.enabled[i] = config.get_bool("qc." + name + ".enabled");
    o.action[i] = parse_qc_action(config.get_string("qc." + name + ".action"), "qc." + name + ".action");
  }
  return o;
}

cv::Mat1b QcResult::excluded() const {
  cv::Mat1b out = cv::Mat1b::zeros(tissue.mask.size());
  for (const Artefact a : kAll) {
    const auto i = static_cast<std::size_t>(index(a));
    if (options.action[i] == QcAction::exclude && !masks[i].empty()) out |= masks[i];
  }
  if (!severe_blur.empty()) out |= severe_blur;
  // A margin: a mask's edge is where its artefact fades, and tissue just beside ink, a fold or a bubble still scores
  // like tumour (measured on twins, README "Slide quality control").
  const int margin = tissue.mpp > 0.0 ? static_cast<int>(std::lround(options.margin_um / tissue.mpp)) : 0;
  if (margin > 0 && cv::countNonZero(out) > 0) cv::dilate(out, out, elliptic(2 * margin + 1));
  return out;
}

cv::Mat1b QcResult::flagged() const {
  cv::Mat1b out = cv::Mat1b::zeros(tissue.mask.size());
  for (const Artefact a : kAll) {
    const auto i = static_cast<std::size_t>(index(a));
    if (options.action[i] == QcAction::flag && !masks[i].empty()) out |= masks[i];
  }
  return out;
}

cv::Mat1f measure_sharpness(const io::Slide& slide, cv::Size qc_size, const QcOptions& options,
                            const cv::Mat1b& where) {
  if (!where.empty() && where.size() != qc_size) {
    throw core::InternalError("measure_sharpness: `where` must have the QC level's size");
  }
  // Windows of QC pixels; each is read at blur_mpp with a margin (the filters' reach), turned grey, and its
  // |Laplacian| and contrast averaged into the window's QC pixels. Windows without a pixel of `where` are not read.
  const double blur_mpp = std::max(options.blur_mpp, slide.mpp());
  const double qc_downsample = static_cast<double>(slide.width()) / qc_size.width;  // level-0 px per QC pixel
  const double fine_per_qc = qc_downsample * slide.mpp() / blur_mpp;                // blur pixels per QC pixel
  const int level = slide.best_level_for_mpp(blur_mpp);
  const io::SlideLevel& l = slide.level(level);
  // About kWindowFine blur pixels a side per window; the margin covers the contrast Gaussian's kernel (OpenCV's
  // float kernel reaches 4 sigma) and the Laplacian's pixel. Windows go down strips kStripWindows wide, so that the
  // tiles a window's margin shares with the window above are still in the slide's tile cache.
  constexpr double kWindowFine = 512.0;
  constexpr int kStripWindows = 4;
  const int window = std::max(4, static_cast<int>(std::lround(kWindowFine / std::max(1e-9, fine_per_qc))));
  const int margin = std::max(1, static_cast<int>(std::ceil((4.0 * kContrastSigma + 2.0) / fine_per_qc)));
  const cv::Rect whole(0, 0, qc_size.width, qc_size.height);
  cv::Mat1f out = cv::Mat1f::zeros(qc_size);
  cv::Mat resized, grey8;
  cv::Mat1f grey, laplacian, smooth, contrast, fine_qc, contrast_qc, ratio;
  for (int s0 = 0; s0 < qc_size.width; s0 += kStripWindows * window) {
    for (int r0 = 0; r0 < qc_size.height; r0 += window) {
      for (int c0 = s0; c0 < std::min(qc_size.width, s0 + kStripWindows * window); c0 += window) {
        const cv::Rect cell = cv::Rect(c0, r0, window, window) & whole;
        if (!where.empty() && cv::countNonZero(where(cell)) == 0) continue;
        const cv::Rect outer =
            cv::Rect(cell.x - margin, cell.y - margin, cell.width + 2 * margin, cell.height + 2 * margin) & whole;
        // The outer window in level pixels, then resampled to blur_mpp.
        const auto x0 = static_cast<std::int64_t>(std::floor(outer.x * qc_downsample / l.downsample));
        const auto y0 = static_cast<std::int64_t>(std::floor(outer.y * qc_downsample / l.downsample));
        const auto x1 = std::min<std::int64_t>(
            l.width, static_cast<std::int64_t>(std::ceil(outer.br().x * qc_downsample / l.downsample)));
        const auto y1 = std::min<std::int64_t>(
            l.height, static_cast<std::int64_t>(std::ceil(outer.br().y * qc_downsample / l.downsample)));
        const cv::Mat region = slide.read_region(
            std::llround(static_cast<double>(x0) * l.downsample), std::llround(static_cast<double>(y0) * l.downsample),
            level, std::max<std::int64_t>(1, x1 - x0), std::max<std::int64_t>(1, y1 - y0));
        const cv::Size fine(std::max(1, static_cast<int>(std::lround(outer.width * fine_per_qc))),
                            std::max(1, static_cast<int>(std::lround(outer.height * fine_per_qc))));
        if (region.size() == fine) {
          resized = region;
        } else {
          cv::resize(region, resized, fine, 0, 0, cv::INTER_AREA);
        }
        cv::cvtColor(resized, grey8, cv::COLOR_RGB2GRAY);
        grey8.convertTo(grey, CV_32F);
        cv::Laplacian(grey, laplacian, CV_32F, 1, 1.0, 0.0, cv::BORDER_REPLICATE);
        // Fine detail against the local contrast at a few pixels' scale: defocus removes the first and keeps much
        // of the second, while dense and sparse tissue differ in both alike.
        cv::GaussianBlur(grey, smooth, cv::Size(0, 0), kContrastSigma, kContrastSigma, cv::BORDER_REPLICATE);
        cv::absdiff(grey, smooth, contrast);
        cv::absdiff(laplacian, cv::Scalar::all(0.0), laplacian);
        cv::resize(laplacian, fine_qc, outer.size(), 0, 0, cv::INTER_AREA);
        cv::resize(contrast, contrast_qc, outer.size(), 0, 0, cv::INTER_AREA);
        cv::add(contrast_qc, cv::Scalar::all(kMinContrast), contrast_qc);
        cv::divide(fine_qc, contrast_qc, ratio);
        ratio(cv::Rect(cell.tl() - outer.tl(), cell.size())).copyTo(out(cell));
      }
    }
  }
  return out;
}

namespace {

// The tissue QC works on: pen marks kept, so that ink over tissue counts as tissue under ink.
TissueMask qc_tissue(const cv::Mat& rgb, double downsample, double mpp) {
  TissueOptions tissue_options;
  tissue_options.mask_mpp = mpp;
  tissue_options.reject_pen_marks = false;
  return detect_tissue(rgb, downsample, mpp, tissue_options);
}

// run_qc on the QC-level image and its tissue (qc_tissue); `sharpness_of` gives measure_sharpness's map for a tissue
// mask (or an empty map, or is empty: blur not measured). It is asked for only when blur is looked for, after the
// planes the other classes need are freed.
QcResult find_artefacts(const cv::Mat& rgb, const std::function<cv::Mat1f(const cv::Mat1b&)>& sharpness_of,
                        TissueMask qc_tissue_mask, double mpp, const QcOptions& options) {
  if (rgb.type() != CV_8UC3) throw core::InternalError("run_qc needs an RGB CV_8UC3 image");
  QcResult result;
  result.options = options;
  result.tissue = std::move(qc_tissue_mask);
  const cv::Mat1b& tissue = result.tissue.mask;
  const cv::Size size = rgb.size();
  // Each class's mask is made where it is found (zeros for the others at the end): a mask not found yet takes no
  // memory.
  const double um2_per_pixel = mpp * mpp;
  const double min_pixels = options.min_artefact_um2 / um2_per_pixel;
  const auto on = [&](Artefact a) { return options.enabled[static_cast<std::size_t>(index(a))]; };
  auto mask = [&](Artefact a) -> cv::Mat1b& { return result.masks[static_cast<std::size_t>(index(a))]; };

  // Per pixel colour measures. (Brightness and stain concentrations are derived from the image below, where needed.)
  const StainVectors stains = ruifrok_he();
  const cv::Matx33d unmix = unmixing_matrix(stains);
  const StainConcentrations concentrations(unmix);
  cv::Mat1b ink_green = cv::Mat1b::zeros(size), ink_blue = cv::Mat1b::zeros(size), ink_black = cv::Mat1b::zeros(size),
            ink_red = cv::Mat1b::zeros(size), neutral = cv::Mat1b::zeros(size),
            strongly_neutral = cv::Mat1b::zeros(size), rim = cv::Mat1b::zeros(size), dark = cv::Mat1b::zeros(size);
  for (int r = 0; r < size.height; ++r) {
    const auto* in = rgb.ptr<cv::Vec3b>(r);
    for (int c = 0; c < size.width; ++c) {
      const cv::Vec3b& p = in[c];
      const Hsv v = hsv(p);
      const double distance = white_distance(p);
      const double residual = concentrations.residual(p);
      const bool far_from_white = distance >= 30.0;
      bool coloured_ink = false;
      if (far_from_white) {
        if (v.value < kBlackMaxValue) dark(r, c) = 255;
        if (v.value < kBlackMaxValue && v.saturation < kBlackMaxSaturation) {
          ink_black(r, c) = 255;
        } else if (v.saturation >= kRedMinSaturation && (v.hue >= kRedHueLow || v.hue < kRedHueHigh)) {
          ink_red(r, c) = 255;
          coloured_ink = true;
        } else if (v.saturation >= kInkMinSaturation && v.hue >= kGreenHueMin && v.hue < kInkHueMax) {
          (v.hue < kBlueHueMin ? ink_green : ink_blue)(r, c) = 255;
          coloured_ink = true;
        }
        if (!coloured_ink && residual >= kNeutralMinResidual) neutral(r, c) = 255;
        if (!coloured_ink && residual >= kRimMinResidual) rim(r, c) = 255;
        if (!coloured_ink && residual >= kBlackMinResidual) strongly_neutral(r, c) = 255;
      }
    }
  }

  // Neutral areas split by width: thin lines are bubble rims and coverslip edges, wide ones ink (black ink must be
  // wide and neutral too).
  const int rim_kernel = std::max(3, static_cast<int>(std::lround(kRimMaxWidthUm / mpp)) | 1);
  cv::Mat1b wide;
  cv::morphologyEx(neutral, wide, cv::MORPH_OPEN, elliptic(rim_kernel));
  cv::dilate(wide, wide, elliptic(3));
  // Black ink: dark and neutral, or (over tissue, where H&E adds colour) strongly neutral; wide either way. Its stroke
  // (what the mask may take back below): the black ink and the neutral pixels.
  ink_black |= strongly_neutral;
  cv::Mat1b black_stroke = ink_black | neutral;
  release(neutral, strongly_neutral);
  // Rims by their own width (the faint fringe of a blurred rim passes the weaker neutral test and would widen it).
  cv::Mat1b wide_rim;
  cv::morphologyEx(rim, wide_rim, cv::MORPH_OPEN, elliptic(rim_kernel));
  cv::dilate(wide_rim, wide_rim, elliptic(5));  // and the fringe of a wide grey area is no rim either
  // The blurred edge of a coloured ink stroke is paler and less saturated than its core: neutral enough for a rim,
  // and it outlines the stroke as a closed grey loop. Nothing next to coloured ink is a rim.
  cv::Mat1b ink_fringe = ink_green | ink_blue | ink_red;
  cv::dilate(ink_fringe, ink_fringe, elliptic(5));
  cv::Mat1b thin = rim & ~wide_rim & ~ink_fringe;
  release(rim, wide_rim, ink_fringe);
  cv::Mat1b narrow = ink_black.clone();
  cv::morphologyEx(ink_black, ink_black, cv::MORPH_OPEN, elliptic(rim_kernel));
  // The width test shaves a stroke's rounded ends and faded edges: a short stroke about as wide as a rim passes it and
  // may yet fall below the smallest artefact once shaved. The black ink mask takes back the stroke's dark or neutral
  // pixels within the test's reach of the wide core (hysteresis), and of the narrower stretches joining two wide pieces
  // (narrow_stretches); the other rules keep to the core.
  {
    narrow = narrow_stretches(std::move(narrow), ink_black);
    cv::Mat1b reach;
    cv::dilate(ink_black | narrow, reach, elliptic(rim_kernel));
    black_stroke &= reach;
    black_stroke |= narrow;
    narrow.release();
  }
  // Green and blue ink over purple tissue shifts towards blue: each stroke takes the colour most of it has.
  {
    cv::Mat1b coloured = ink_green | ink_blue;
    cv::Mat labels;
    const int n = cv::connectedComponents(coloured, labels, 8, CV_32S);
    std::vector<int> green(static_cast<std::size_t>(n), 0), blue(static_cast<std::size_t>(n), 0);
    for (int r = 0; r < size.height; ++r) {
      for (int c = 0; c < size.width; ++c) {
        const int l = labels.at<int>(r, c);
        if (l == 0) continue;
        (ink_green(r, c) != 0 ? green : blue)[static_cast<std::size_t>(l)]++;
      }
    }
    for (int r = 0; r < size.height; ++r) {
      for (int c = 0; c < size.width; ++c) {
        const int l = labels.at<int>(r, c);
        if (l == 0) continue;
        const bool is_green = green[static_cast<std::size_t>(l)] >= blue[static_cast<std::size_t>(l)];
        ink_green(r, c) = is_green ? 255 : 0;
        ink_blue(r, c) = is_green ? 0 : 255;
      }
    }
  }

  // Pen ink: closing joins a stroke's mottled pixels; the blurred rim of a stroke is paler than its core.
  const std::array<std::pair<Artefact, cv::Mat1b*>, 4> inks = {{{Artefact::pen_green, &ink_green},
                                                                {Artefact::pen_blue, &ink_blue},
                                                                {Artefact::pen_black, &ink_black},
                                                                {Artefact::pen_red, &ink_red}}};
  for (const auto& [a, ink] : inks) {
    if (on(a)) cv::morphologyEx(a == Artefact::pen_black ? black_stroke : *ink, mask(a), cv::MORPH_CLOSE, elliptic(3));
  }
  release(black_stroke);
  // The raw ink pixels, also of a class that is off (its ink still hides the tissue) and the specks the pen masks
  // drop: folds and exposure faults are not looked for under them (the pen masks instead take 0.784 -> 0.541 of one
  // fold on seed 9111 and 0.676 -> 0.576 of one on 9161). Black ink's core stays for blur's reference (below).
  cv::Mat1b ink = ink_green | ink_blue | ink_black | ink_red;
  release(ink_green, ink_blue, ink_red);
  // Where strokes of two colours cross, the crossing is darker than either and of neither colour: it cuts a short
  // stroke into pieces that may each be below the smallest artefact while the stroke is not. Ink is sized with all its
  // colours together (crossings: dark pixels within the width test's reach of two colours' ink); a piece of one colour
  // is kept when it is large enough alone, or when its joined ink is and holds ink of another colour. Each pixel keeps
  // its colour.
  remove_small_ink(
      {&mask(Artefact::pen_green), &mask(Artefact::pen_blue), &mask(Artefact::pen_black), &mask(Artefact::pen_red)},
      dark, rim_kernel, min_pixels);
  release(dark);
  for (const auto& entry : inks) drop_if_empty(mask(entry.first));
  // Of black ink, blur's sharpness reference leaves out only the wide core under its mask: the faded edge the mask
  // takes back stays in, as the tissue beside a stroke (a blur patch running up to it) is weighed through it (left out,
  // blur on seed 9161 fell from 0.613 to 0.592).
  cv::Mat1b black_core;
  if (on(Artefact::blur) && sharpness_of && !mask(Artefact::pen_black).empty()) {
    cv::morphologyEx(ink_black, black_core, cv::MORPH_CLOSE, elliptic(3));
    black_core &= mask(Artefact::pen_black);
    drop_if_empty(black_core);
  }
  release(ink_black);

  // Bubbles and coverslip edges: grey lines, and what closed lines enclose.
  cv::Mat1b rims = cv::Mat1b::zeros(size);  // the grey lines, kept out of the sharpness reference
  if (on(Artefact::bubble)) {
    cv::Mat1b& lines = rims;
    cv::morphologyEx(thin, lines, cv::MORPH_CLOSE, elliptic(3));
    remove_small_objects(lines, min_pixels / 4.0);
    mask(Artefact::bubble) = fill_enclosed(lines);
    remove_small_objects(mask(Artefact::bubble), min_pixels);
    keep_round(mask(Artefact::bubble));
    const double min_radius = std::max(3.0, std::sqrt(min_pixels / M_PI));
    mask(Artefact::bubble) |= circles_on_rims(lines, min_radius, 0.5 * std::min(size.width, size.height), rim_kernel);
    drop_if_empty(mask(Artefact::bubble));
  }

  // The section's outline: tissue with its gaps closed and holes filled (for exposure; made before the stain planes,
  // as filling takes a label plane).
  cv::Mat1b section;
  if (on(Artefact::overexposed)) {
    cv::morphologyEx(tissue, section, cv::MORPH_CLOSE, elliptic(9));
    section = fill_enclosed(section);
  }

  // The slide's measures, one plane at a time (a QC-level plane is large on a large slide).
  const int tissue_count = cv::countNonZero(tissue);
  const bool has_tissue = tissue_count > 0, has_background = tissue_count < size.area();
  result.tissue_area_mm2 = result.tissue.tissue_area_mm2();
  double overall_brightness = 0.0;
  {
    const cv::Mat1f grey = grey_image(rgb);
    result.background_brightness = median_where(grey, tissue, false);
    result.brightness = has_tissue ? cv::mean(grey, tissue)[0] : 0.0;
    overall_brightness = cv::mean(grey)[0];
  }
  // The stains' medians over the tissue, and their local medians over the tissue around each pixel (folds and
  // over-exposure compare the smoothed stains against them).
  const auto stain_at = [&](int k) {
    return [&, k](int r, int c) { return concentrations(rgb.ptr<cv::Vec3b>(r)[c])[k]; };
  };
  result.stain_h = median_where(tissue, true, stain_at(0));
  result.stain_e = median_where(tissue, true, stain_at(1));
  result.stain_angle = std::atan2(result.stain_e, result.stain_h) * 180.0 / M_PI;
  SmoothedStains smoothed(rgb, concentrations);
  cv::Mat1b h_local, e_local;  // quantized (Concentrations gives the OD)
  if (has_tissue) {
    const int window = fold_window(mpp);
    cv::Mat1b h_levels(size), e_levels(size);
    smoothed.each_band([&](int r0, int r1, const cv::Mat1f& h, const cv::Mat1f& e) {
      const cv::Mat1b t = tissue.rowRange(r0, r1);
      cv::Mat1b hq = h_levels.rowRange(r0, r1), eq = e_levels.rowRange(r0, r1);
      quantize_tissue(h, t, result.stain_h, hq);
      quantize_tissue(e, t, result.stain_e, eq);
    });
    cv::medianBlur(h_levels, h_local, window | 1);
    release(h_levels);
    cv::medianBlur(e_levels, e_local, window | 1);
  }
  const Concentrations concentration;
  constexpr float kMinConcentration = 0.02f;  // against ratios of nearly nothing

  if (on(Artefact::overexposed)) {
    // Tissue with a clipped channel, and tissue whose stains are both far paler than the tissue around it: washed
    // out. (Bright glass beside the section is harmless, and some scanners clip their glass anyway.)
    cv::Mat1b over = cv::Mat1b::zeros(size);
    for (int r = 0; r < size.height; ++r) {
      const auto* in = rgb.ptr<cv::Vec3b>(r);
      for (int c = 0; c < size.width; ++c) {
        const cv::Vec3b& p = in[c];
        if (tissue(r, c) != 0 && std::max({p[0], p[1], p[2]}) >= kClippedLevel) over(r, c) = 255;
      }
    }
    if (!h_local.empty()) {
      smoothed.each_band([&](int r0, int r1, const cv::Mat1f& h_smooth, const cv::Mat1f& e_smooth) {
        for (int r = r0; r < r1; ++r) {
          for (int c = 0; c < size.width; ++c) {
            if (tissue(r, c) == 0) continue;
            const float hl = std::max(concentration(h_local(r, c)), kMinConcentration);
            const float el = std::max(concentration(e_local(r, c)), kMinConcentration);
            if (h_smooth(r - r0, c) * kOverexposureRatio <= hl && e_smooth(r - r0, c) * kOverexposureRatio <= el) {
              over(r, c) = 255;
            }
          }
        }
      });
    }
    // Clipping is patchy inside a washed-out field: join first, then drop specks.
    cv::morphologyEx(over, over, cv::MORPH_CLOSE, elliptic(5));
    cv::morphologyEx(over, over, cv::MORPH_OPEN, elliptic(3));
    cv::morphologyEx(over, over, cv::MORPH_CLOSE, elliptic(7));
    keep_touching(over, section);
    release(section);
    // Tissue seen through a bubble is paler too: that is the bubble (its own class), not the exposure.
    if (!mask(Artefact::bubble).empty()) over &= ~mask(Artefact::bubble);
    mask(Artefact::overexposed) = over;
    remove_small_objects(mask(Artefact::overexposed), min_pixels);
    drop_if_empty(mask(Artefact::overexposed));
  }
  // Folds: both stains raised against the tissue around. Inside an over-exposed field or a bubble every stain is
  // paler: there "around" is the tissue of that field or bubble (a fold crossing it stays raised against it). Found for
  // under-exposure too, which leaves folds out of its fields, and kept as a class only when folds are on.
  if ((on(Artefact::fold) || on(Artefact::underexposed)) && has_tissue) {
    // The reference is the local median, replaced inside each field and bubble (h_local and e_local are not needed
    // after this).
    cv::Mat1b &h_ref = h_local, &e_ref = e_local;
    const int window = fold_window(mpp);
    for (const Artefact a : {Artefact::overexposed, Artefact::bubble}) {
      if (mask(a).empty()) continue;
      // Each field or bubble on its own: fields differ in how much they wash out, and a false field at a section's
      // pale edge must not set the reference of a real one.
      const cv::Mat1b domains = mask(a) & tissue;
      cv::Mat labels, stats, centroids;
      const int n = cv::connectedComponentsWithStats(domains, labels, stats, centroids, 8, CV_32S);
      for (int i = 1; i < n; ++i) {
        if (stats.at<int>(i, cv::CC_STAT_AREA) < min_pixels) continue;
        // The component's box and the median window around it: the local medians inside need nothing further out.
        const cv::Rect box =
            cv::Rect(stats.at<int>(i, cv::CC_STAT_LEFT) - window / 2, stats.at<int>(i, cv::CC_STAT_TOP) - window / 2,
                     stats.at<int>(i, cv::CC_STAT_WIDTH) + window, stats.at<int>(i, cv::CC_STAT_HEIGHT) + window) &
            cv::Rect(0, 0, size.width, size.height);
        const cv::Mat1b domain = labels(box) == i;
        cv::Mat1f h_rows, e_rows;
        smoothed.rows(box.y, box.y + box.height, h_rows, e_rows);
        const cv::Rect columns(box.x, 0, box.width, box.height);
        const cv::Mat1f h_smooth = h_rows(columns), e_smooth = e_rows(columns);
        std::vector<float> hs, es;
        for (int r = 0; r < box.height; ++r) {
          for (int c = 0; c < box.width; ++c) {
            if (domain(r, c) == 0) continue;
            hs.push_back(h_smooth(r, c));
            es.push_back(e_smooth(r, c));
          }
        }
        cv::Mat1b h_box = h_ref(box), e_box = e_ref(box);
        local_tissue_median(h_smooth, domain, window, median_of(hs)).copyTo(h_box, domain);
        local_tissue_median(e_smooth, domain, window, median_of(es)).copyTo(e_box, domain);
      }
    }
    // Hysteresis: where a fold thins out or fades (its ends, a crossing), its pixels are raised less; they count
    // when they join pixels raised by the full ratio.
    const double weak_ratio = 1.0 + kFoldWeakShare * (options.fold_ratio - 1.0);
    cv::Mat1b fold = cv::Mat1b::zeros(size), weak = cv::Mat1b::zeros(size);
    smoothed.each_band([&](int r0, int r1, const cv::Mat1f& h_smooth, const cv::Mat1f& e_smooth) {
      for (int r = r0; r < r1; ++r) {
        for (int c = 0; c < size.width; ++c) {
          if (tissue(r, c) == 0) continue;
          const float hl = std::max(concentration(h_ref(r, c)), kMinConcentration);
          const float el = std::max(concentration(e_ref(r, c)), kMinConcentration);
          const float hs = h_smooth(r - r0, c), es = e_smooth(r - r0, c);
          if (hs >= options.fold_ratio * hl && es >= options.fold_ratio * el) fold(r, c) = 255;
          if (hs >= weak_ratio * hl && es >= weak_ratio * el) weak(r, c) = 255;
          // A fold over eosin-rich tissue in a haematoxylin-rich neighbourhood, or across a washed-out field: eosin
          // far above the tissue around, haematoxylin not far below it.
          if (es >= kFoldEosinRatio * el && hs >= kFoldMinHaematoxylinShare * hl) weak(r, c) = 255;
        }
      }
    });
    release(h_ref, e_ref);
    // Ink strokes hide the tissue under them, and their blurred edges (a QC pixel partly on the stroke, and the
    // stains' smoothing) add the ink's colour, which raises both stains as doubled tissue does: folds are found beside
    // a stroke, 2 px clear of it, and continue under it where found on both sides (the fold's mask then covers the
    // ink it runs under, as the fold lies there).
    cv::Mat1b hidden;
    cv::dilate(ink, hidden, elliptic(5));
    fold &= ~hidden;
    weak &= ~hidden;
    cv::morphologyEx(fold, fold, cv::MORPH_OPEN, elliptic(3));
    cv::morphologyEx(weak, weak, cv::MORPH_OPEN, elliptic(3));
    // The opening may take a pixel or two more beside them: a fold is continued across both.
    cv::dilate(hidden, hidden, elliptic(5));
    weak |= continued_under(weak | fold, hidden);
    release(hidden);
    keep_touching(weak, fold);
    fold |= weak;
    release(weak);
    cv::morphologyEx(fold, mask(Artefact::fold), cv::MORPH_CLOSE, elliptic(5));
    release(fold);
    mask(Artefact::fold) &= tissue;
    // A thin fold crossing a bubble, an exposure field or a hole is found in pieces, each maybe smaller than a speck:
    // they are judged together.
    remove_small_chains(mask(Artefact::fold), min_pixels, kFoldMaxGapUm / mpp);
    drop_if_empty(mask(Artefact::fold));
  }
  release(h_local, e_local);

  if (on(Artefact::underexposed) && has_background) {
    // Neutral glass far darker than the slide's glass, and tissue darkened by a neutral grey over wide areas (not
    // black ink); each such field's convex hull takes in what lies between.
    const double limit = options.underexposure_ratio * result.background_brightness;
    cv::Mat1b dark_glass(size);
    constexpr int kBandRows = 64;  // the grey level a band of rows at a time
    for (int r0 = 0; r0 < size.height; r0 += kBandRows) {
      const int r1 = std::min(size.height, r0 + kBandRows);
      const cv::Mat1b darker = grey_image(rgb.rowRange(r0, r1)) < limit;
      for (int r = r0; r < r1; ++r) {
        const auto* in = rgb.ptr<cv::Vec3b>(r);
        for (int c = 0; c < size.width; ++c) {
          const bool darkened = darker(r - r0, c) != 0 && tissue(r, c) == 0 && grey_glass_colour(in[c]) &&
                                thin(r, c) == 0 && ink(r, c) == 0;
          dark_glass(r, c) = darkened ? 255 : 0;
        }
      }
    }
    cv::morphologyEx(dark_glass, dark_glass, cv::MORPH_OPEN, elliptic(5));
    remove_small_objects(dark_glass, min_pixels / 4.0);
    // Darkened tissue counts only where it joins darkened glass, or where it is a field far darker than the tissue
    // around it (a field over tissue that holds little glass): dense tissue alone is no exposure fault, and a fold
    // (found above) is darker than the tissue around it too.
    cv::Mat1b darkened = wide & tissue & ~ink;
    const int ring = std::max(1, static_cast<int>(std::lround(kUnderRingUm / mpp)));
    cv::Mat1b fields =
        darkened_fields(darkened, rgb, tissue, mask(Artefact::fold), options.underexposure_ratio, ring, min_pixels);
    fields |= dark_glass;
    cv::Mat1b under = dark_glass | darkened;
    release(dark_glass, darkened);
    keep_touching(under, fields);
    release(fields);
    cv::morphologyEx(under, under, cv::MORPH_OPEN, elliptic(5));
    remove_small_objects(under, min_pixels / 4.0);
    mask(Artefact::underexposed) = convex_hulls(under);
    remove_small_objects(mask(Artefact::underexposed), min_pixels);
    drop_if_empty(mask(Artefact::underexposed));
  }
  if (!on(Artefact::fold)) mask(Artefact::fold).release();  // found above for under-exposure only
  // Blur needs none of the planes above but the rims.
  release(wide, ink, thin);

  // Out of focus: sharpness relative to the slide's own tissue, smoothed over a few QC pixels.
  if (on(Artefact::blur) && sharpness_of) {
    cv::Mat1f sharpness = sharpness_of(tissue);
    if (!sharpness.empty() && sharpness.size() != size) {
      throw core::InternalError("run_qc: the sharpness map must have the image's size");
    }
    if (!sharpness.empty()) {
      cv::Mat1b inner;
      {
        cv::Mat1b sharp_tissue = tissue.clone();
        // Ink, folds and bubble rims have sharpness of their own; they are not the tissue's reference. (The tissue
        // inside a bubble is still tissue, and may be out of focus as any other.) Of black ink only its wide core
        // (black_core above).
        for (const Artefact a : {Artefact::pen_green, Artefact::pen_blue, Artefact::pen_red, Artefact::fold}) {
          if (!mask(a).empty()) sharp_tissue &= ~mask(a);
        }
        if (!black_core.empty()) sharp_tissue &= ~black_core;
        release(black_core);
        sharp_tissue &= ~rims;
        cv::erode(sharp_tissue, inner, elliptic(5));  // a section's rim is sharp against glass
      }
      result.sharpness = median_where(sharpness, inner, true);
      if (result.sharpness > 0.0) {
        // Mean over tissue in a small window: normalized convolution (the weighted sharpness and its sum in place).
        cv::Mat1f weight;
        inner.convertTo(weight, CV_32F, 1.0 / 255.0);
        release(inner);
        cv::multiply(sharpness, weight, sharpness);
        const cv::Size window(7, 7);
        cv::blur(sharpness, sharpness, window);
        cv::blur(weight, weight, window);
        const cv::Mat1f& sum = sharpness;
        cv::Mat1b blur = cv::Mat1b::zeros(size), severe = cv::Mat1b::zeros(size);
        for (int r = 0; r < size.height; ++r) {
          for (int c = 0; c < size.width; ++c) {
            if (tissue(r, c) == 0 || weight(r, c) < 0.2f) continue;
            const double ratio = sum(r, c) / weight(r, c) / result.sharpness;
            if (ratio < options.blur_ratio) blur(r, c) = 255;
            if (ratio < options.severe_blur_ratio) severe(r, c) = 255;
          }
        }
        release(sharpness, weight);
        cv::morphologyEx(blur, blur, cv::MORPH_CLOSE, elliptic(5));
        blur &= tissue;
        remove_small_objects(blur, min_pixels);
        result.severe_blur = severe & blur;
        mask(Artefact::blur) = blur;
        drop_if_empty(mask(Artefact::blur));
        drop_if_empty(result.severe_blur);
      }
    }
  }
  release(rims);
  // Classes found nowhere, or not looked for, share one plane of zeros.
  const cv::Mat1b zeros = cv::Mat1b::zeros(size);
  for (auto& m : result.masks) {
    if (m.empty()) m = zeros;
  }
  if (result.severe_blur.empty()) result.severe_blur = zeros;

  const double tissue_pixels = std::max(1, cv::countNonZero(tissue));
  for (const Artefact a : kAll) {
    const auto i = static_cast<std::size_t>(index(a));
    const cv::Mat1b& m = result.masks[i];
    result.area_mm2[i] = cv::countNonZero(m) * um2_per_pixel * 1e-6;
    result.fraction[i] = cv::countNonZero(m & tissue) / tissue_pixels;
  }

  // Slide-level checks.
  // Brightfield glass is bright; a fluorescence slide's background is dark.
  constexpr double kMinBrightfieldBackground = 128.0;
  if ((has_background ? result.background_brightness : overall_brightness) < kMinBrightfieldBackground) {
    result.flags.push_back(
        fmt::format("not brightfield (background grey level {:.0f} of 255: a fluorescence or dark-field slide?)",
                    has_background ? result.background_brightness : overall_brightness));
    // The artefact classes are defined on brightfield H&E: on another kind of slide their masks mean nothing.
    for (auto& m : result.masks) m.setTo(0);
    result.severe_blur.setTo(0);
    result.fraction.fill(0.0);
    result.area_mm2.fill(0.0);
  } else if (result.tissue_area_mm2 < options.min_tissue_mm2) {
    result.flags.push_back(fmt::format("too little tissue ({:.3f} mm2, qc.min_tissue_mm2 {:g})", result.tissue_area_mm2,
                                       options.min_tissue_mm2));
  }
  return result;
}

}  // namespace

QcResult run_qc(const cv::Mat& rgb, const cv::Mat1f& sharpness, double downsample, double mpp,
                const QcOptions& options) {
  if (rgb.type() != CV_8UC3) throw core::InternalError("run_qc needs an RGB CV_8UC3 image");
  // A copy: the blur stage works on the map in place.
  const auto given = [&](const cv::Mat1b&) { return cv::Mat1f(sharpness.clone()); };
  return find_artefacts(rgb, given, qc_tissue(rgb, downsample, mpp), mpp, options);
}

QcResult run_qc(const io::Slide& slide, const QcOptions& options, cv::Mat* rgb_out) {
  if (!(options.mask_mpp > 0.0)) throw core::ConfigError("mask_mpp must be positive", "", 0, "qc.mask_mpp");
  double downsample = 1.0;
  const double mask_mpp = std::max(options.mask_mpp, slide.mpp());
  const double scale = slide.mpp() / mask_mpp;
  // Read first: a slide that cannot be read says so, whatever its size.
  const cv::Mat rgb = read_slide_image(slide, mask_mpp, &downsample, SourceLevel::nearest);
  const auto cols = static_cast<std::int64_t>(std::ceil(static_cast<double>(slide.width()) * scale - 1e-9));
  const auto rows = static_cast<std::int64_t>(std::ceil(static_cast<double>(slide.height()) * scale - 1e-9));
  if (cols < kMinQcSide || rows < kMinQcSide) {
    throw core::InputError(fmt::format("the slide ({}×{} px at {:g} µm/px) is too small for quality control: it needs "
                                       "at least {}×{} pixels at the QC level of {:g} µm/px",
                                       slide.width(), slide.height(), slide.mpp(), kMinQcSide, kMinQcSide, mask_mpp),
                           slide.path());
  }
  const double mpp = slide.mpp() * downsample;
  // Sharpness is used over tissue only: the rest of the slide is not read at blur_mpp. It is read when blur is looked
  // for, after the other classes' planes are freed.
  const auto measured = [&](const cv::Mat1b& tissue) { return measure_sharpness(slide, rgb.size(), options, tissue); };
  QcResult result = find_artefacts(rgb, measured, qc_tissue(rgb, downsample, mpp), mpp, options);
  if (rgb_out != nullptr) *rgb_out = rgb;
  return result;
}

void add_cohort_flags(std::vector<QcResult*>& results, double z) {
  std::vector<QcResult*> with_tissue;
  for (QcResult* r : results) {
    if (r->tissue_area_mm2 > 0.0) with_tissue.push_back(r);
  }
  if (with_tissue.size() < 3) return;
  const std::array<double QcResult::*, 3> measures = {&QcResult::stain_h, &QcResult::stain_e, &QcResult::stain_angle};
  const std::array<const char*, 3> names = {"H", "E", "H-E angle"};
  constexpr double kMadToSigma = 1.4826;
  for (std::size_t m = 0; m < measures.size(); ++m) {
    std::vector<float> values;
    for (const QcResult* r : with_tissue) values.push_back(static_cast<float>(r->*measures[m]));
    const double median = median_of(values);
    std::vector<float> deviations;
    for (const float v : values) deviations.push_back(static_cast<float>(std::abs(v - median)));
    // A floor on the spread: a cohort of near-identical slides must not flag a slide that differs by a hair.
    const double floor = m == 2 ? 2.0 : 0.02;
    const double sigma = std::max(floor, kMadToSigma * median_of(deviations));
    for (QcResult* r : with_tissue) {
      const double score = (r->*measures[m] - median) / sigma;
      if (std::abs(score) > z) {
        r->flags.push_back(fmt::format("stain far from cohort ({} {:.3f}, cohort median {:.3f}, {:+.1f} robust SD)",
                                       names[m], r->*measures[m], median, score));
      }
    }
  }
}

cv::Mat1w encode_qc_masks(const QcResult& result) {
  cv::Mat1w out = cv::Mat1w::zeros(result.tissue.mask.size());
  const cv::Mat1b excluded = result.excluded(), flagged = result.flagged();
  for (int r = 0; r < out.rows; ++r) {
    auto* o = out.ptr<std::uint16_t>(r);
    const auto* t = result.tissue.mask.ptr<std::uint8_t>(r);
    for (int c = 0; c < out.cols; ++c) {
      std::uint16_t bits = t[c] != 0 ? io::kQcTissueBit : std::uint16_t{0};
      if (excluded(r, c) != 0) bits = static_cast<std::uint16_t>(bits | io::kQcExcludedBit);
      if (flagged(r, c) != 0) bits = static_cast<std::uint16_t>(bits | io::kQcFlaggedBit);
      for (int k = 0; k < kArtefactCount; ++k) {
        const cv::Mat1b& m = result.masks[static_cast<std::size_t>(k)];
        if (!m.empty() && m(r, c) != 0) bits = static_cast<std::uint16_t>(bits | (1u << k));
      }
      o[c] = bits;
    }
  }
  return out;
}

double mask_iou(const cv::Mat1b& a, const cv::Mat1b& b) {
  if (a.size() != b.size()) throw core::InternalError("mask_iou: the masks differ in size");
  const int intersection = cv::countNonZero(a & b);
  const int uni = cv::countNonZero(a | b);
  return uni == 0 ? 1.0 : static_cast<double>(intersection) / uni;
}

cv::Scalar artefact_colour(Artefact artefact) {
  switch (artefact) {
    case Artefact::blur:
      return {255, 200, 0};
    case Artefact::pen_green:
      return {0, 200, 0};
    case Artefact::pen_blue:
      return {0, 90, 255};
    case Artefact::pen_black:
      return {40, 40, 40};
    case Artefact::pen_red:
      return {230, 0, 0};
    case Artefact::fold:
      return {160, 0, 200};
    case Artefact::bubble:
      return {0, 200, 200};
    case Artefact::overexposed:
      return {255, 120, 200};
    case Artefact::underexposed:
      return {120, 80, 40};
  }
  return {128, 128, 128};
}

cv::Mat render_qc_preview(const cv::Mat& rgb, const QcResult& result) {
  const int legend_height = 22 * ((kArtefactCount + 2) / 3) + 8;
  const int width = std::max(rgb.cols, 480);
  cv::Mat canvas(rgb.rows + legend_height, width, CV_8UC3, cv::Scalar(255, 255, 255));
  cv::Mat picture = canvas(cv::Rect((width - rgb.cols) / 2, 0, rgb.cols, rgb.rows));
  rgb.copyTo(picture);
  // Tinted a band of rows at a time, each a continuous image as the whole picture would be (bands of a multiple of 256
  // bytes: OpenCV's vector loops then split every band as they split the whole picture), without whole-picture copies.
  constexpr int kBandRows = 256;
  cv::Mat band, tint, blended;
  cv::Mat1b scaled;
  for (const Artefact a : kAll) {
    const cv::Mat1b& m = result.masks[static_cast<std::size_t>(index(a))];
    if (m.empty() || cv::countNonZero(m) == 0) continue;
    if (m.size() != picture.size()) cv::resize(m, scaled, picture.size(), 0, 0, cv::INTER_NEAREST);
    const cv::Mat1b& at_picture = m.size() == picture.size() ? m : scaled;
    for (int r0 = 0; r0 < picture.rows; r0 += kBandRows) {
      const int r1 = std::min(picture.rows, r0 + kBandRows);
      band = picture.rowRange(r0, r1).clone();
      tint.create(band.size(), band.type());
      tint.setTo(artefact_colour(a));
      cv::addWeighted(band, 0.55, tint, 0.45, 0.0, blended);
      cv::Mat target = picture.rowRange(r0, r1);
      blended.copyTo(target, at_picture.rowRange(r0, r1));
    }
    std::vector<std::vector<cv::Point>> contours;
    cv::findContours(at_picture, contours, cv::RETR_EXTERNAL, cv::CHAIN_APPROX_SIMPLE);
    cv::drawContours(picture, contours, -1, artefact_colour(a), std::max(1, picture.cols / 400), cv::LINE_AA);
  }
  for (int k = 0; k < kArtefactCount; ++k) {
    const Artefact a = kAll[static_cast<std::size_t>(k)];
    const int x = 8 + (k % 3) * (width / 3), y = rgb.rows + 8 + (k / 3) * 22;
    cv::rectangle(canvas, cv::Rect(x, y, 14, 14), artefact_colour(a), cv::FILLED);
    const std::string text =
        fmt::format("{} {:.1f}%", to_string(a), 100.0 * result.fraction[static_cast<std::size_t>(k)]);
    cv::putText(canvas, text, {x + 20, y + 12}, cv::FONT_HERSHEY_SIMPLEX, 0.45, cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
  }
  return canvas;
}

}  // namespace tessera::prep
