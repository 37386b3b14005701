#include "preprocessing/tiling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "preprocessing/overlay.h"

namespace tessera::prep {
namespace {

constexpr double kEpsilon = 1e-9;
constexpr std::uint8_t kTumourBit = 1;
constexpr std::uint8_t kExclusionBit = 2;

// Rasterizes areas into a pixels×pixels grid by pixel-centre sampling: pixel (i, j) is inside when its centre
// (i + ½, j + ½) is, with half-open spans, so a shape that covers exactly k pixel areas of an axis-aligned
// boundary gives exactly k pixels and adjacent shapes never share a pixel. (cv::fillPoly draws both span ends
// inclusive — a span of 2 px fills 3 — so it over-counts every boundary by about half a pixel.)
class TileRaster {
 public:
  // The grid covers level-0 [x, x + footprint)² with `pixels` pixels per side.
  TileRaster(double x, double y, double footprint, int pixels)
      : x_(x), y_(y), footprint_(footprint), n_(pixels), grid_(static_cast<std::size_t>(pixels) * pixels, 0) {}

  // Sets `bit` on the pixels inside the annotation's area (outer ring minus holes, even-odd rule).
  void add(const io::Annotation& a, std::uint8_t bit) {
    crossings_.clear();
    add_ring(a.outer);
    for (const auto& hole : a.holes) add_ring(hole);
    std::sort(crossings_.begin(), crossings_.end());
    for (std::size_t k = 0; k + 1 < crossings_.size(); k += 2) {
      const auto& [row, left] = crossings_[k];
      const auto& [row_right, right] = crossings_[k + 1];
      if (row != row_right) continue;  // cannot happen for closed rings; keeps a malformed input harmless
      const int i0 = std::max(0, static_cast<int>(std::ceil(left - 0.5)));
      const int i1 = std::min(n_, static_cast<int>(std::ceil(right - 0.5)));
      std::uint8_t* line = grid_.data() + static_cast<std::size_t>(row) * static_cast<std::size_t>(n_);
      for (int i = i0; i < i1; ++i) line[i] |= bit;
    }
  }

  std::int64_t count(std::uint8_t value) const { return std::count(grid_.begin(), grid_.end(), value); }

 private:
  // Level-0 to grid coordinates; one division so exact inputs stay exact where they can.
  double gx(double x) const { return (x - x_) * n_ / footprint_; }
  double gy(double y) const { return (y - y_) * n_ / footprint_; }

  void add_ring(const io::Ring& ring) {
    if (ring.size() < 3) return;
    for (std::size_t k = 0; k < ring.size(); ++k) {
      const cv::Point2d& p = ring[k];
      const cv::Point2d& q = ring[(k + 1) % ring.size()];
      const double py = gy(p.y);
      const double qy = gy(q.y);
      if (py == qy) continue;  // horizontal edges never cross a row centre in half-open sampling
      const double lo = std::min(py, qy);
      const double hi = std::max(py, qy);
      // Rows j whose centre j + ½ lies in [lo, hi).
      const double j_first = std::max(0.0, std::ceil(lo - 0.5));
      const double j_end = std::min(static_cast<double>(n_), std::ceil(hi - 0.5));
      if (j_first >= j_end) continue;
      const double px = gx(p.x);
      const double qx = gx(q.x);
      const double slope = (qx - px) / (qy - py);
      for (int j = static_cast<int>(j_first); j < static_cast<int>(j_end); ++j) {
        crossings_.emplace_back(j, px + (j + 0.5 - py) * slope);
      }
    }
  }

  double x_, y_, footprint_;
  int n_;
  std::vector<std::uint8_t> grid_;
  std::vector<std::pair<int, double>> crossings_;
};

bool intersects(const cv::Rect2d& box, double x, double y, double side) {
  return box.x < x + side && box.x + box.width > x && box.y < y + side && box.y + box.height > y;
}

// The tumour fraction from annotations already known to be near the tile.
double fraction_of(const std::vector<const io::Annotation*>& tumour,
                   const std::vector<const io::Annotation*>& exclusion, double x, double y, double footprint,
                   int pixels) {
  if (tumour.empty()) return 0.0;
  TileRaster raster(x, y, footprint, pixels);
  for (const auto* a : tumour) raster.add(*a, kTumourBit);
  for (const auto* a : exclusion) raster.add(*a, kExclusionBit);
  return static_cast<double>(raster.count(kTumourBit)) / (static_cast<double>(pixels) * pixels);
}

std::vector<cv::Rect2d> boxes_of(const std::vector<io::Annotation>& annotations) {
  std::vector<cv::Rect2d> boxes;
  boxes.reserve(annotations.size());
  for (const auto& a : annotations) boxes.push_back(io::bounding_box(a.outer));
  return boxes;
}

std::vector<const io::Annotation*> near(const std::vector<io::Annotation>& annotations,
                                        const std::vector<cv::Rect2d>& boxes, double x, double y, double side) {
  std::vector<const io::Annotation*> out;
  for (std::size_t i = 0; i < annotations.size(); ++i) {
    if (intersects(boxes[i], x, y, side)) out.push_back(&annotations[i]);
  }
  return out;
}

// The mask's integral image, read as a continuous function: the tissue area of mask-pixel coordinates
// [0, u)×[0, v) is exactly the bilinear interpolation of the integral image at (u, v), because the mask is
// constant over each pixel.
class TissueIntegral {
 public:
  explicit TissueIntegral(const TissueMask& tissue) : downsample_(tissue.downsample) {
    if (tissue.mask.empty() || !(tissue.downsample > 0.0)) return;
    cv::Mat1b binary = tissue.mask > 0;
    binary /= 255;
    // 32-bit sums whenever the pixel count fits (half the memory of 64-bit on a large slide's mask).
    cv::integral(binary, sum_, binary.total() < static_cast<std::size_t>(INT32_MAX) ? CV_32S : CV_64F);
  }

  // Tissue share of the level-0 square [x, x + side)².
  double fraction(double x, double y, double side) const {
    if (sum_.empty()) return 0.0;
    const double u0 = x / downsample_;
    const double v0 = y / downsample_;
    const double u1 = (x + side) / downsample_;
    const double v1 = (y + side) / downsample_;
    const double area = at(u1, v1) - at(u0, v1) - at(u1, v0) + at(u0, v0);
    return std::clamp(area / ((u1 - u0) * (v1 - v0)), 0.0, 1.0);
  }

 private:
  double at(double u, double v) const {
    const int cols = sum_.cols - 1;
    const int rows = sum_.rows - 1;
    u = std::clamp(u, 0.0, static_cast<double>(cols));
    v = std::clamp(v, 0.0, static_cast<double>(rows));
    const int i = std::min(static_cast<int>(u), cols - 1);
    const int j = std::min(static_cast<int>(v), rows - 1);
    const double fx = u - i;
    const double fy = v - j;
    const double s00 = sum(j, i), s01 = sum(j, i + 1), s10 = sum(j + 1, i), s11 = sum(j + 1, i + 1);
    return s00 * (1 - fx) * (1 - fy) + s01 * fx * (1 - fy) + s10 * (1 - fx) * fy + s11 * fx * fy;
  }

  double sum(int row, int col) const {
    return sum_.depth() == CV_32S ? sum_.at<std::int32_t>(row, col) : sum_.at<double>(row, col);
  }

  double downsample_;
  cv::Mat sum_;  // CV_32S or CV_64F
};

void check_options(const GridOptions& options) {
  if (options.tile_size <= 0) throw core::ConfigError("tile_size must be positive", "", 0, "tile_size");
  if (!(options.mpp > 0.0)) throw core::ConfigError("mpp must be positive", "", 0, "mpp");
  if (options.stride < 0) throw core::ConfigError("stride must be 0 (= tile_size) or positive", "", 0, "stride");
}

// A seeded random subset of `indices` of size k (partial Fisher–Yates with mt19937_64, whose output is fixed
// by the standard, unlike std::shuffle and the distributions).
void choose(std::vector<std::size_t>& indices, std::size_t k, std::mt19937_64& rng) {
  if (k >= indices.size()) return;
  const std::size_t n = indices.size();
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t j = i + static_cast<std::size_t>(rng() % (n - i));
    std::swap(indices[i], indices[j]);
  }
  indices.resize(k);
}

}  // namespace

std::int64_t SlidePlan::count(std::uint8_t label) const {
  return std::count_if(tiles.begin(), tiles.end(), [&](const PlannedTile& t) { return t.label == label; });
}

double tumour_fraction(const std::vector<io::Annotation>& tumour, const std::vector<io::Annotation>& exclusion,
                       double x, double y, double footprint, int pixels) {
  if (pixels <= 0 || !(footprint > 0.0)) {
    throw core::InternalError("tumour_fraction needs a positive footprint and pixel count");
  }
  return fraction_of(near(tumour, boxes_of(tumour), x, y, footprint),
                     near(exclusion, boxes_of(exclusion), x, y, footprint), x, y, footprint, pixels);
}

SlidePlan plan_slide(const io::Slide& slide, const TissueMask& tissue, const std::vector<io::Annotation>& annotations,
                     const AnnotationClasses& classes, const GridOptions& options) {
  check_options(options);
  SlidePlan plan;
  plan.slide_path = slide.path();
  plan.slide_id = slide.id();
  plan.slide_mpp = slide.mpp();
  // Level-0 lengths as n·mpp / slide_mpp: one rounding, so 256 px at 0.6 from 0.25 µm/px is 614.4 exactly.
  plan.footprint = options.tile_size * options.mpp / plan.slide_mpp;
  const double step = (options.stride > 0 ? options.stride : options.tile_size) * options.mpp / plan.slide_mpp;

  std::vector<io::Annotation> tumour, exclusion;
  io::split_annotations(annotations, classes, tumour, exclusion);
  const std::vector<cv::Rect2d> tumour_boxes = boxes_of(tumour);
  const std::vector<cv::Rect2d> exclusion_boxes = boxes_of(exclusion);

  // Origins round(i·step); only tiles wholly inside the slide.
  const auto origins = [&](std::int64_t extent) {
    std::vector<std::int64_t> out;
    for (std::int64_t i = 0;; ++i) {
      const std::int64_t o = std::llround(static_cast<double>(i) * step);
      if (static_cast<double>(o) + plan.footprint > static_cast<double>(extent) + kEpsilon) break;
      out.push_back(o);
    }
    return out;
  };
  const std::vector<std::int64_t> xs = origins(slide.width());
  const std::vector<std::int64_t> ys = origins(slide.height());

  const TissueIntegral integral(tissue);
  for (const std::int64_t y : ys) {
    for (const std::int64_t x : xs) {
      const auto fx = static_cast<double>(x);
      const auto fy = static_cast<double>(y);
      const double tissue_fraction = integral.fraction(fx, fy, plan.footprint);
      if (tissue_fraction < options.min_tissue) continue;
      double fraction = 0.0;
      const auto near_tumour = near(tumour, tumour_boxes, fx, fy, plan.footprint);
      if (!near_tumour.empty()) {
        fraction = fraction_of(near_tumour, near(exclusion, exclusion_boxes, fx, fy, plan.footprint), fx, fy,
                               plan.footprint, options.tile_size);
      }
      PlannedTile tile;
      tile.x = x;
      tile.y = y;
      tile.tissue_fraction = static_cast<float>(tissue_fraction);
      tile.tumour_fraction = static_cast<float>(fraction);
      if (fraction > 0.0 && fraction >= options.tumour_threshold) {
        tile.label = 1;
      } else if (fraction == 0.0 || options.keep_ambiguous) {
        tile.label = 0;
      } else {
        continue;  // the ambiguous band
      }
      plan.tiles.push_back(tile);
    }
  }
  return plan;
}

std::vector<double> tissue_fractions(const TissueMask& tissue, const std::vector<std::int64_t>& xs,
                                     const std::vector<std::int64_t>& ys, double side) {
  const TissueIntegral integral(tissue);
  std::vector<double> out;
  out.reserve(xs.size() * ys.size());
  for (const std::int64_t y : ys) {
    for (const std::int64_t x : xs) {
      out.push_back(integral.fraction(static_cast<double>(x), static_cast<double>(y), side));
    }
  }
  return out;
}

void cap_tiles(SlidePlan& plan, std::int64_t max_tiles, double max_normal_per_tumour, std::uint64_t seed) {
  if (max_tiles < 0) throw core::ConfigError("max_tiles must be 0 (no cap) or positive", "", 0, "max_tiles");
  std::vector<std::size_t> tumour, normal;
  for (std::size_t i = 0; i < plan.tiles.size(); ++i) (plan.tiles[i].label == 1 ? tumour : normal).push_back(i);
  const auto t_all = static_cast<std::int64_t>(tumour.size());
  const auto n_all = static_cast<std::int64_t>(normal.size());
  const bool ratio_cap = max_normal_per_tumour > 0.0 && t_all > 0;
  const auto normal_for = [&](std::int64_t t) {
    return static_cast<std::int64_t>(std::floor(static_cast<double>(t) * max_normal_per_tumour + kEpsilon));
  };
  std::int64_t t_keep = t_all;
  std::int64_t n_keep = ratio_cap ? std::min(n_all, normal_for(t_all)) : n_all;
  if (max_tiles > 0 && t_keep + n_keep > max_tiles) {
    // Shrink both classes in proportion, so the cap keeps the class balance the ratio set.
    const double total = static_cast<double>(t_keep + n_keep);
    std::int64_t t = std::llround(static_cast<double>(max_tiles) * static_cast<double>(t_keep) / total);
    if (t_keep > 0) t = std::max<std::int64_t>(1, t);
    t_keep = std::min({t, t_keep, max_tiles});
    n_keep = std::min(n_keep, max_tiles - t_keep);
    if (ratio_cap) n_keep = std::min(n_keep, normal_for(t_keep));
  }
  if (t_keep == t_all && n_keep == n_all) return;

  std::mt19937_64 rng(seed);
  choose(tumour, static_cast<std::size_t>(t_keep), rng);
  choose(normal, static_cast<std::size_t>(n_keep), rng);
  std::vector<std::size_t> kept = std::move(tumour);
  kept.insert(kept.end(), normal.begin(), normal.end());
  std::sort(kept.begin(), kept.end());
  std::vector<PlannedTile> tiles;
  tiles.reserve(kept.size());
  for (std::size_t i : kept) tiles.push_back(plan.tiles[i]);
  plan.tiles = std::move(tiles);
}

cv::Mat render_plan_preview(const io::Slide& slide, const TissueMask& tissue, const SlidePlan& plan,
                            const std::vector<io::Annotation>& tumour, int max_side, const QcResult* qc) {
  // RGB colours.
  const cv::Scalar kNormal(0, 170, 0);
  const cv::Scalar kTumour(230, 0, 0);
  const cv::Scalar kAmbiguous(255, 140, 0);
  const cv::Scalar kTissueContour(0, 80, 255);
  const cv::Scalar kTumourOutline(120, 0, 0);
  constexpr double kFillAlpha = 0.35;

  cv::Mat thumb = slide.thumbnail(max_side);
  const double scale = static_cast<double>(slide.width()) / thumb.cols;  // level-0 px per thumbnail px

  // Tissue contour: the mask resampled onto the thumbnail grid (pixel centres aligned), then traced.
  if (!tissue.mask.empty() && tissue.downsample > 0.0 && cv::countNonZero(tissue.mask) > 0) {
    const double a = tissue.downsample / scale;
    const cv::Matx23d to_thumb(a, 0, 0.5 * a - 0.5, 0, a, 0.5 * a - 0.5);
    cv::Mat1b resampled;
    cv::warpAffine(tissue.mask, resampled, to_thumb, thumb.size(), cv::INTER_LINEAR, cv::BORDER_CONSTANT, 0);
    cv::Mat1b binary = resampled >= 128;
    std::vector<std::vector<cv::Point>> contours;
    cv::findContours(binary, contours, cv::RETR_LIST, cv::CHAIN_APPROX_SIMPLE);
    cv::drawContours(thumb, contours, -1, kTissueContour, 1, cv::LINE_AA);
  }

  // Tiles: a translucent fill, and an outline when tiles are big enough to show one.
  const double side = plan.footprint / scale;
  cv::Mat fill = thumb.clone();
  std::int64_t ambiguous = 0;
  const auto rect_of = [&](const PlannedTile& t) {
    const int x0 = static_cast<int>(std::lround(static_cast<double>(t.x) / scale));
    const int y0 = static_cast<int>(std::lround(static_cast<double>(t.y) / scale));
    const int x1 = static_cast<int>(std::lround((static_cast<double>(t.x) + plan.footprint) / scale));
    const int y1 = static_cast<int>(std::lround((static_cast<double>(t.y) + plan.footprint) / scale));
    return cv::Rect(x0, y0, std::max(1, x1 - x0), std::max(1, y1 - y0));
  };
  const auto colour_of = [&](const PlannedTile& t) {
    if (t.label == 1) return kTumour;
    return t.tumour_fraction > 0.0f ? kAmbiguous : kNormal;
  };
  for (const auto& t : plan.tiles) {
    if (t.label == 0 && t.tumour_fraction > 0.0f) ++ambiguous;
    cv::rectangle(fill, rect_of(t), colour_of(t), cv::FILLED);
  }
  cv::addWeighted(fill, kFillAlpha, thumb, 1.0 - kFillAlpha, 0.0, thumb);
  if (side >= 6.0) {
    for (const auto& t : plan.tiles) cv::rectangle(thumb, rect_of(t), colour_of(t), 1);
  }

  draw_outlines(thumb, tumour, scale, kTumourOutline, thumb.cols >= 1200 ? 2 : 1);

  // Legend: a swatch and a count per class, on a white box in the top-left corner.
  std::vector<std::pair<cv::Scalar, std::string>> entries = {
      {kTumour, "tumour " + std::to_string(plan.count(1))},
      {kNormal, "normal " + std::to_string(plan.count(0) - ambiguous)},
      {kAmbiguous, "ambiguous " + std::to_string(ambiguous)}};
  if (qc != nullptr) {
    // Quality control's areas over the tiles, as infer's overlay outlines them.
    const double downsample = qc->tissue.downsample;
    draw_mask_outline(thumb, qc->excluded(), downsample, scale, kQcExcludedRgb);
    draw_mask_outline(thumb, qc->flagged(), downsample, scale, kQcFlaggedRgb);
    entries.emplace_back(kQcExcludedRgb, "QC excluded");
    entries.emplace_back(kQcFlaggedRgb, "QC flagged");
  }
  const double font_scale = std::max(0.4, thumb.cols / 1600.0);
  const int margin = std::max(6, thumb.cols / 100);
  int baseline = 0;
  const int text_h = cv::getTextSize("Ag", cv::FONT_HERSHEY_SIMPLEX, font_scale, 1, &baseline).height;
  int width = 0;
  for (const auto& [colour, label] : entries) {
    width += text_h + 4 + cv::getTextSize(label, cv::FONT_HERSHEY_SIMPLEX, font_scale, 1, &baseline).width + 12;
  }
  const cv::Rect box(margin - 4, margin - 4, width + 4, text_h + baseline + 8);
  cv::rectangle(thumb, box & cv::Rect(0, 0, thumb.cols, thumb.rows), cv::Scalar(255, 255, 255), cv::FILLED);
  int x = margin;
  for (const auto& [colour, label] : entries) {
    cv::rectangle(thumb, cv::Rect(x, margin, text_h, text_h), colour, cv::FILLED);
    x += text_h + 4;
    cv::putText(thumb, label, cv::Point(x, margin + text_h), cv::FONT_HERSHEY_SIMPLEX, font_scale, cv::Scalar(0, 0, 0),
                1, cv::LINE_AA);
    x += cv::getTextSize(label, cv::FONT_HERSHEY_SIMPLEX, font_scale, 1, &baseline).width + 12;
  }

  draw_scale_bar(thumb, slide.mpp() * scale);
  return thumb;
}

}  // namespace tessera::prep
