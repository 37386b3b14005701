#include "analysis/evaluation.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <opencv2/imgproc.hpp>

#include "core/error.h"

namespace tessera::analysis {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Background rings kept around the dilated tumour, so that the window's border is background connected to the
// outside of the tumour exactly as the whole slide's border is (see fill_holes).
constexpr int kWindowMargin = 2;

// ---- evaluation mask ------------------------------------------------------------------------------------------

// Sets `value` on the window pixels whose centre lies inside the annotation's area (outer ring minus holes, by
// the even-odd rule), with half-open spans: a pixel centre exactly on a left or top edge is inside, on a right or
// bottom edge outside. `scale` maps level-0 pixels to mask pixels; `origin` is the window's top-left mask pixel.
void fill_area(cv::Mat1b& window, cv::Point origin, double scale, const io::Annotation& a, std::uint8_t value) {
  std::vector<std::pair<int, double>> crossings;  // (row, x) in window pixels
  auto add_ring = [&](const io::Ring& ring) {
    if (ring.size() < 3) return;
    for (std::size_t k = 0; k < ring.size(); ++k) {
      const cv::Point2d& p = ring[k];
      const cv::Point2d& q = ring[(k + 1) % ring.size()];
      const double py = p.y * scale - origin.y;
      const double qy = q.y * scale - origin.y;
      if (py == qy) continue;  // horizontal edges never cross a row centre in half-open sampling
      const double lo = std::min(py, qy);
      const double hi = std::max(py, qy);
      // Rows j whose centre j + ½ lies in [lo, hi).
      const double j_first = std::max(0.0, std::ceil(lo - 0.5));
      const double j_end = std::min(static_cast<double>(window.rows), std::ceil(hi - 0.5));
      if (j_first >= j_end) continue;
      const double px = p.x * scale - origin.x;
      const double qx = q.x * scale - origin.x;
      const double slope = (qx - px) / (qy - py);
      for (int j = static_cast<int>(j_first); j < static_cast<int>(j_end); ++j) {
        crossings.emplace_back(j, px + (j + 0.5 - py) * slope);
      }
    }
  };
  add_ring(a.outer);
  for (const auto& hole : a.holes) add_ring(hole);
  std::sort(crossings.begin(), crossings.end());
  for (std::size_t k = 0; k + 1 < crossings.size(); k += 2) {
    const auto& [row, left] = crossings[k];
    const auto& [row_right, right] = crossings[k + 1];
    if (row != row_right) continue;  // cannot happen for closed rings; keeps a malformed input harmless
    const double i0 = std::max(0.0, std::ceil(left - 0.5));
    const double i1 = std::min(static_cast<double>(window.cols), std::ceil(right - 0.5));
    for (int i = static_cast<int>(i0); i < static_cast<int>(i1); ++i) window(row, i) = value;
  }
}

// scipy.ndimage.binary_fill_holes: background regions (4-connected, its default structure) that do not reach the
// border become foreground.
void fill_holes(cv::Mat1b& binary) {
  cv::Mat1b background = binary == 0;
  cv::Mat1i regions;
  const int count = cv::connectedComponents(background, regions, 4, CV_32S);
  std::vector<std::uint8_t> outside(static_cast<std::size_t>(count), 0);
  const int last_row = binary.rows - 1;
  const int last_col = binary.cols - 1;
  for (int i = 0; i < binary.cols; ++i) {
    outside[static_cast<std::size_t>(regions(0, i))] = 1;
    outside[static_cast<std::size_t>(regions(last_row, i))] = 1;
  }
  for (int j = 0; j < binary.rows; ++j) {
    outside[static_cast<std::size_t>(regions(j, 0))] = 1;
    outside[static_cast<std::size_t>(regions(j, last_col))] = 1;
  }
  for (int j = 0; j < binary.rows; ++j) {
    for (int i = 0; i < binary.cols; ++i) {
      if (binary(j, i) == 0 && outside[static_cast<std::size_t>(regions(j, i))] == 0) binary(j, i) = 1;
    }
  }
}

// skimage's major_axis_length: 4·√λ₁ of the covariance of the pixel coordinates (population moments).
double major_axis(double n, double sx, double sy, double sxx, double syy, double sxy) {
  const double mx = sx / n;
  const double my = sy / n;
  const double a = sxx / n - mx * mx;
  const double c = syy / n - my * my;
  const double b = sxy / n - mx * my;
  const double lambda = (a + c) / 2.0 + std::sqrt((a - c) * (a - c) / 4.0 + b * b);
  return 4.0 * std::sqrt(std::max(lambda, 0.0));
}

void check_options(double mpp, const FrocOptions& options) {
  if (!(mpp > 0.0) || !std::isfinite(mpp)) {
    throw core::ConfigError(fmt::format("the slide's µm/px must be positive, got {:g}", mpp), "", 0, "mpp");
  }
  if (options.mask_level < 0 || options.mask_level > 16) {
    throw core::ConfigError(fmt::format("mask level must be in 0..16, got {}", options.mask_level), "", 0,
                            "mask_level");
  }
  if (!(options.dilation_um > 0.0)) {
    throw core::ConfigError(fmt::format("dilation must be positive, got {:g} µm", options.dilation_um), "", 0,
                            "dilation_um");
  }
  if (!(options.itc_diameter_um >= 0.0)) {
    throw core::ConfigError(fmt::format("ITC diameter must not be negative, got {:g} µm", options.itc_diameter_um), "",
                            0, "itc_diameter_um");
  }
}

}  // namespace

EvaluationMask::EvaluationMask(const std::vector<io::Annotation>& annotations, const io::AnnotationClasses& classes,
                               double mpp, std::int64_t width, std::int64_t height, const FrocOptions& options) {
  check_options(mpp, options);
  downsample_ = std::ldexp(1.0, options.mask_level);
  pixel_um_ = mpp * downsample_;
  threshold_px_ = options.dilation_um / (pixel_um_ * 2.0);

  std::vector<io::Annotation> tumour, exclusion;
  io::split_annotations(annotations, classes, tumour, exclusion);
  if (tumour.empty()) return;

  // The window: the tumour's bounding box in mask pixels, grown by the dilation and a background margin, clipped
  // to the slide's mask when the slide's size is known.
  const double scale = 1.0 / downsample_;
  double x0 = kInfinity, y0 = kInfinity, x1 = -kInfinity, y1 = -kInfinity;
  for (const auto& a : tumour) {
    const cv::Rect2d box = io::bounding_box(a.outer);
    x0 = std::min(x0, box.x);
    y0 = std::min(y0, box.y);
    x1 = std::max(x1, box.x + box.width);
    y1 = std::max(y1, box.y + box.height);
  }
  if (!std::isfinite(x0) || !std::isfinite(x1)) return;
  const double grow = std::ceil(threshold_px_) + kWindowMargin;
  double left = std::floor(x0 * scale) - grow;
  double top = std::floor(y0 * scale) - grow;
  double right = std::floor(x1 * scale) + 1 + grow;
  double bottom = std::floor(y1 * scale) + 1 + grow;
  if (width > 0 && height > 0) {
    left = std::max(left, 0.0);
    top = std::max(top, 0.0);
    right = std::min(right, std::ceil(static_cast<double>(width) * scale));
    bottom = std::min(bottom, std::ceil(static_cast<double>(height) * scale));
  }
  constexpr double kMaxSide = 1 << 20;
  if (right - left > kMaxSide || bottom - top > kMaxSide) {
    throw core::InternalError(
        fmt::format("evaluation mask of {} × {} pixels: the annotations span too far", right - left, bottom - top));
  }
  if (right <= left || bottom <= top) return;  // tumour entirely outside the slide
  origin_ = cv::Point(static_cast<int>(left), static_cast<int>(top));
  const cv::Size size(static_cast<int>(right - left), static_cast<int>(bottom - top));

  // 1. Tumour minus exclusion.
  cv::Mat1b tumour_mask(size, std::uint8_t{0});
  for (const auto& a : tumour) fill_area(tumour_mask, origin_, scale, a, 1);
  if (!exclusion.empty()) {
    cv::Mat1b excluded(size, std::uint8_t{0});
    for (const auto& a : exclusion) fill_area(excluded, origin_, scale, a, 1);
    tumour_mask.setTo(0, excluded);
  }
  if (cv::countNonZero(tumour_mask) == 0) return;

  // 2. Dilation: exact Euclidean distance of every pixel to the nearest tumour pixel.
  cv::Mat1b not_tumour = tumour_mask == 0;
  cv::Mat1f distance;
  cv::distanceTransform(not_tumour, distance, cv::DIST_L2, cv::DIST_MASK_PRECISE, CV_32F);
  cv::Mat1b lesion_mask(size);
  for (int j = 0; j < size.height; ++j) {
    for (int i = 0; i < size.width; ++i) {
      lesion_mask(j, i) = static_cast<double>(distance(j, i)) < threshold_px_ ? 1 : 0;
    }
  }

  // 3. Holes filled, 8-connected lesions numbered in raster order of their first pixel.
  fill_holes(lesion_mask);
  cv::Mat1i components;
  const int count = cv::connectedComponents(lesion_mask, components, 8, CV_32S);
  std::vector<int> renumber(static_cast<std::size_t>(count), 0);
  int next = 0;
  labels_.create(size);
  struct Sums {
    double n = 0, sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // bounding box, window pixels (x0, y0 first seen)
    int left = 0;
  };
  std::vector<Sums> sums;
  for (int j = 0; j < size.height; ++j) {
    for (int i = 0; i < size.width; ++i) {
      const int c = components(j, i);
      if (c == 0) {
        labels_(j, i) = 0;
        continue;
      }
      int& label = renumber[static_cast<std::size_t>(c)];
      if (label == 0) {
        label = ++next;
        sums.push_back({.x0 = i, .y0 = j, .x1 = i, .y1 = j, .left = i});
      }
      labels_(j, i) = label;
      Sums& s = sums[static_cast<std::size_t>(label - 1)];
      // Coordinates relative to the lesion's first pixel keep the sums small (no cancellation in the variance).
      const double x = i - s.x0;
      const double y = j - s.y0;
      s.n += 1;
      s.sx += x;
      s.sy += y;
      s.sxx += x * x;
      s.syy += y * y;
      s.sxy += x * y;
      s.left = std::min(s.left, i);
      s.x1 = std::max(s.x1, i);
      s.y1 = std::max(s.y1, j);
    }
  }
  // 4. Isolated tumour cells.
  const double itc_px = (options.itc_diameter_um + options.dilation_um) / pixel_um_;
  for (std::size_t k = 0; k < sums.size(); ++k) {
    const Sums& s = sums[k];
    Lesion lesion;
    lesion.label = static_cast<int>(k) + 1;
    lesion.pixels = static_cast<std::int64_t>(s.n);
    const double axis_px = major_axis(s.n, s.sx, s.sy, s.sxx, s.syy, s.sxy);
    lesion.major_axis_um = axis_px * pixel_um_;
    lesion.itc = !options.include_itc && axis_px < itc_px;
    lesion.box = cv::Rect(origin_.x + s.left, origin_.y + s.y0, s.x1 - s.left + 1, s.y1 - s.y0 + 1);
    lesions_.push_back(lesion);
  }
}

int EvaluationMask::label_at(double x, double y) const {
  if (labels_.empty()) return 0;
  const double i = std::floor(x / downsample_) - origin_.x;
  const double j = std::floor(y / downsample_) - origin_.y;
  if (!(i >= 0 && j >= 0 && i < labels_.cols && j < labels_.rows)) return 0;
  return labels_(static_cast<int>(j), static_cast<int>(i));
}

int SlideFroc::true_positives() const {
  return static_cast<int>(std::count_if(lesion_p.begin(), lesion_p.end(), [](double p) { return p > 0.0; }));
}

SlideFroc match_detections(const std::string& slide_id, std::span<const Detection> detections,
                           const EvaluationMask* mask) {
  SlideFroc slide;
  slide.slide_id = slide_id;
  slide.tumour = mask != nullptr;
  slide.detections = static_cast<std::int64_t>(detections.size());
  std::vector<int> entry_of_label;  // label → index in lesion_p, -1 for ITC
  std::vector<int> hits;
  if (mask != nullptr) {
    for (const auto& lesion : mask->lesions()) {
      if (lesion.itc) {
        entry_of_label.push_back(-1);
        ++slide.itc_lesions;
      } else {
        entry_of_label.push_back(slide.lesions());
        slide.lesion_p.push_back(0.0);
        slide.lesion_label.push_back(lesion.label);
      }
    }
    hits.assign(slide.lesion_p.size(), 0);
  }
  for (const auto& d : detections) {
    const int label = mask != nullptr ? mask->label_at(d.x, d.y) : 0;
    if (label == 0) {
      slide.fp_p.push_back(d.p);
      continue;
    }
    const int entry = entry_of_label[static_cast<std::size_t>(label - 1)];
    if (entry < 0) {
      ++slide.itc_hits;
      continue;
    }
    const auto e = static_cast<std::size_t>(entry);
    if (hits[e]++ > 0) ++slide.repeat_hits;
    slide.lesion_p[e] = std::max(slide.lesion_p[e], d.p);
  }
  return slide;
}

FrocResult compute_froc(std::span<const SlideFroc> slides) {
  if (slides.empty()) throw core::InternalError("compute_froc: no slide");
  FrocResult result;
  result.slides = static_cast<int>(slides.size());
  std::vector<double> fp, tp;
  for (const auto& s : slides) {
    fp.insert(fp.end(), s.fp_p.begin(), s.fp_p.end());
    tp.insert(tp.end(), s.lesion_p.begin(), s.lesion_p.end());
    result.itc_lesions += s.itc_lesions;
    result.detected_lesions += s.true_positives();
  }
  result.lesions = static_cast<int>(tp.size());
  result.false_positives = static_cast<std::int64_t>(fp.size());
  std::sort(fp.begin(), fp.end());
  std::sort(tp.begin(), tp.end());
  std::vector<double> thresholds;
  std::merge(fp.begin(), fp.end(), tp.begin(), tp.end(), std::back_inserter(thresholds));
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  std::erase(thresholds, 0.0);

  const auto at_or_above = [](const std::vector<double>& sorted, double t) {
    return static_cast<double>(sorted.end() - std::lower_bound(sorted.begin(), sorted.end(), t));
  };
  const double n_slides = static_cast<double>(slides.size());
  const double n_lesions = static_cast<double>(tp.size());
  const auto sensitivity = [&](double count) { return n_lesions > 0 ? count / n_lesions : kNaN; };
  for (const double t : thresholds) {
    result.curve.push_back({t, at_or_above(fp, t) / n_slides, sensitivity(at_or_above(tp, t))});
  }
  result.curve.push_back({kInfinity, 0.0, sensitivity(0.0)});

  // The curve by ascending FPs, as the scripts read it (reversed).
  std::vector<double> fps, sens;
  for (auto it = result.curve.rbegin(); it != result.curve.rend(); ++it) {
    fps.push_back(it->fps_per_slide);
    sens.push_back(it->sensitivity);
  }
  const std::size_t n = fps.size();
  double sum = 0.0, sum_interpolated = 0.0;
  for (std::size_t k = 0; k < kFrocRates.size(); ++k) {
    const double rate = kFrocRates[k];
    // evaluate.py: sensitivities_r[min(bisect_left(average_fps_r, rate), count - 1)].
    const auto first = static_cast<std::size_t>(std::lower_bound(fps.begin(), fps.end(), rate) - fps.begin());
    result.sensitivity[k] = sens[std::min(first, n - 1)];
    // numpy.interp(rate, fps, sens): the last point at or below the rate, linear to the next.
    double value = 0.0;
    if (rate < fps.front()) {
      value = sens.front();
    } else if (rate > fps.back()) {
      value = sens.back();
    } else {
      const auto j = static_cast<std::size_t>(std::upper_bound(fps.begin(), fps.end(), rate) - fps.begin()) - 1;
      if (j == n - 1 || fps[j] == rate) {
        value = sens[j];
      } else {
        const double slope = (sens[j + 1] - sens[j]) / (fps[j + 1] - fps[j]);
        value = slope * (rate - fps[j]) + sens[j];
      }
    }
    result.sensitivity_interpolated[k] = value;
    sum += result.sensitivity[k];
    sum_interpolated += value;
  }
  result.score = sum / static_cast<double>(kFrocRates.size());
  result.score_interpolated = sum_interpolated / static_cast<double>(kFrocRates.size());
  return result;
}

std::vector<RocPoint> roc_curve(std::span<const float> scores, std::span<const std::uint8_t> labels) {
  if (scores.size() != labels.size()) {
    throw core::InternalError(fmt::format("roc_curve: {} scores for {} labels", scores.size(), labels.size()));
  }
  const auto positives = std::count_if(labels.begin(), labels.end(), [](std::uint8_t l) { return l != 0; });
  const auto negatives = static_cast<std::int64_t>(labels.size()) - positives;
  if (positives == 0 || negatives == 0) return {};
  std::vector<std::size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return scores[a] > scores[b]; });
  std::vector<RocPoint> curve = {{kInfinity, 0.0, 0.0}};
  std::int64_t tp = 0, fp = 0;
  for (std::size_t i = 0; i < order.size();) {
    const float score = scores[order[i]];
    for (; i < order.size() && scores[order[i]] == score; ++i) (labels[order[i]] != 0 ? tp : fp) += 1;
    curve.push_back({static_cast<double>(score), static_cast<double>(fp) / static_cast<double>(negatives),
                     static_cast<double>(tp) / static_cast<double>(positives)});
  }
  return curve;
}

}  // namespace tessera::analysis
