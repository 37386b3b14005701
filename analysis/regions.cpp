#include "analysis/regions.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>
#include <tuple>

#include <fmt/format.h>
#include <opencv2/imgproc.hpp>

#include "core/error.h"

namespace tessera::analysis {
namespace {

constexpr double kUm2PerMm2 = 1e6;

void check_heatmap(const io::Heatmap& h, const char* who) {
  if (const std::string problem = io::heatmap_problem(h); !problem.empty()) {
    core::InternalError error(fmt::format("{}: invalid heatmap: {}", who, problem));
    error.add_context("slide", h.slide_id);
    throw error;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Boundary tracing along cell corners.
//
// Every side of an in-cell that faces an out-cell is a directed edge on the corner lattice, oriented so that the
// region lies on its right (on screen, y down): tops run east, right sides south, bottoms west, left sides north.
// Each lattice vertex then has as many outgoing as incoming edges; chaining them gives closed rings, outer
// boundaries clockwise on screen (positive shoelace area with y down) and holes counter-clockwise. Where two
// in-cells touch only at a corner (a pinch vertex has two outgoing edges) the ring turns left, around the
// out-cells, which keeps diagonal neighbours in one outline: 8-connectivity, matching the components.

enum Direction : int { east = 0, south = 1, west = 2, north = 3 };
constexpr std::array<int, 4> kDx = {1, 0, -1, 0};
constexpr std::array<int, 4> kDy = {0, 1, 0, -1};

// Rings of lattice points (corners of `mask`'s cells, (column, row)); `mask` is CV_8U whose border cells are 0.
std::vector<std::vector<cv::Point>> trace_boundaries(const cv::Mat& mask) {
  const int width = mask.cols + 1;  // lattice vertices per row
  const int height = mask.rows + 1;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(width) * height, 0);  // bit d: an edge leaves in direction d
  auto vertex = [&](int x, int y) -> std::uint8_t& { return out[static_cast<std::size_t>(y) * width + x]; };
  auto in = [&](int r, int c) { return mask.at<std::uint8_t>(r, c) != 0; };
  for (int r = 1; r + 1 < mask.rows; ++r) {
    for (int c = 1; c + 1 < mask.cols; ++c) {
      if (!in(r, c)) continue;
      if (!in(r - 1, c)) vertex(c, r) |= 1u << east;
      if (!in(r, c + 1)) vertex(c + 1, r) |= 1u << south;
      if (!in(r + 1, c)) vertex(c + 1, r + 1) |= 1u << west;
      if (!in(r, c - 1)) vertex(c, r + 1) |= 1u << north;
    }
  }

  std::vector<std::vector<cv::Point>> rings;
  // In raster order the first vertex met of every ring is the top-left corner of a cell: a convex corner with
  // one outgoing edge, never a pinch, so a ring traced from there closes where it started.
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      while (vertex(x, y) != 0) {
        std::vector<cv::Point> ring;
        int cx = x, cy = y;
        int dir = std::countr_zero(static_cast<unsigned>(vertex(x, y)));
        const int first_dir = dir;
        int previous = -1;
        for (;;) {
          vertex(cx, cy) &= static_cast<std::uint8_t>(~(1u << dir));
          if (dir != previous) ring.emplace_back(cx, cy);  // a corner: the direction changes here
          cx += kDx[static_cast<std::size_t>(dir)];
          cy += kDy[static_cast<std::size_t>(dir)];
          previous = dir;
          if (cx == x && cy == y) break;
          const unsigned bits = vertex(cx, cy);
          if (bits == 0) throw core::InternalError("region outline: open boundary while tracing");
          if (std::popcount(bits) == 1) {
            dir = std::countr_zero(bits);
          } else {
            const int left = (previous + 3) % 4;
            dir = (bits >> left) & 1u ? left : (previous + 1) % 4;
          }
        }
        if (ring.size() > 1 && previous == first_dir) ring.erase(ring.begin());  // start was mid-edge
        rings.push_back(std::move(ring));
      }
    }
  }
  return rings;
}

double signed_area(const std::vector<cv::Point2d>& ring) {
  double twice = 0.0;
  for (std::size_t i = 0; i < ring.size(); ++i) {
    const cv::Point2d& p = ring[i];
    const cv::Point2d& q = ring[(i + 1) % ring.size()];
    twice += p.x * q.y - q.x * p.y;
  }
  return 0.5 * twice;
}

// Drops repeated points and points on a straight line between their neighbours (including the tips of the
// zero-width spikes that clipping can leave), until none is left.
io::Ring simplify(io::Ring ring) {
  bool changed = true;
  while (changed && ring.size() >= 3) {
    changed = false;
    io::Ring kept;
    kept.reserve(ring.size());
    for (std::size_t i = 0; i < ring.size(); ++i) {
      const cv::Point2d& prev = kept.empty() ? ring[(i + ring.size() - 1) % ring.size()] : kept.back();
      const cv::Point2d& p = ring[i];
      const cv::Point2d& next = ring[(i + 1) % ring.size()];
      const cv::Point2d a = p - prev;
      const cv::Point2d b = next - p;
      if (a.x * b.y - a.y * b.x == 0.0) {
        changed = true;
        continue;
      }
      kept.push_back(p);
    }
    ring = std::move(kept);
  }
  if (ring.size() < 3) ring.clear();
  return ring;
}

double longest_diameter(const io::Ring& ring) {
  if (ring.size() < 2) return 0.0;
  // Hull in coordinates relative to the first point: float keeps them exact for any slide size.
  std::vector<cv::Point2f> points;
  points.reserve(ring.size());
  for (const auto& p : ring)
    points.emplace_back(static_cast<float>(p.x - ring[0].x), static_cast<float>(p.y - ring[0].y));
  std::vector<cv::Point2f> hull;
  cv::convexHull(points, hull);
  double best = 0.0;
  for (std::size_t i = 0; i < hull.size(); ++i) {
    for (std::size_t j = i + 1; j < hull.size(); ++j) {
      const double dx = static_cast<double>(hull[i].x) - hull[j].x;
      const double dy = static_cast<double>(hull[i].y) - hull[j].y;
      best = std::max(best, dx * dx + dy * dy);
    }
  }
  return std::sqrt(best);
}

}  // namespace

SizeClass size_class_for(double longest_diameter_um) {
  if (longest_diameter_um <= kIsolatedTumourCellsMaxUm) return SizeClass::isolated_tumour_cells;
  if (longest_diameter_um <= kMicrometastasisMaxUm) return SizeClass::micrometastasis;
  return SizeClass::macrometastasis;
}

const char* to_string(SizeClass size_class) {
  switch (size_class) {
    case SizeClass::isolated_tumour_cells:
      return "isolated_tumour_cells";
    case SizeClass::micrometastasis:
      return "micrometastasis";
    case SizeClass::macrometastasis:
      return "macrometastasis";
  }
  return "?";
}

const char* label(SizeClass size_class) {
  return size_class == SizeClass::isolated_tumour_cells ? "isolated tumour cells" : to_string(size_class);
}

std::vector<Region> find_regions(const io::Heatmap& h, const RegionOptions& options) {
  check_heatmap(h, "find_regions");
  if (!(options.threshold > 0.0 && options.threshold <= 1.0)) {
    throw core::InternalError(fmt::format("find_regions: threshold {} is not in (0, 1]", options.threshold));
  }
  if (!(h.slide_mpp > 0.0)) {
    throw core::InputError("the slide's um/px is unknown (heatmap slide_mpp = 0): region areas and diameters need it",
                           h.slide_path.empty() ? h.slide_id : h.slide_path);
  }
  std::vector<Region> regions;
  if (h.rows == 0 || h.cols == 0) return regions;

  cv::Mat mask(h.rows, h.cols, CV_8U);
  for (int i = 0; i < h.rows; ++i) {
    for (int j = 0; j < h.cols; ++j) {
      const float p = h.at(i, j);
      mask.at<std::uint8_t>(i, j) = !std::isnan(p) && p >= options.threshold ? 255 : 0;
    }
  }
  cv::Mat labels, stats, centroids;
  const int count = cv::connectedComponentsWithStats(mask, labels, stats, centroids, 8, CV_32S);

  const double step = static_cast<double>(h.step);
  const cv::Rect2d first = io::cell_footprint(h, 0, 0);
  const auto width = static_cast<double>(h.slide_width);
  const auto height = static_cast<double>(h.slide_height);
  const double um2_per_px = h.slide_mpp * h.slide_mpp;

  for (int label = 1; label < count; ++label) {
    const int left = stats.at<int>(label, cv::CC_STAT_LEFT);
    const int top = stats.at<int>(label, cv::CC_STAT_TOP);
    const int w = stats.at<int>(label, cv::CC_STAT_WIDTH);
    const int ht = stats.at<int>(label, cv::CC_STAT_HEIGHT);

    Region region;
    cv::Mat local = cv::Mat::zeros(ht + 2, w + 2, CV_8U);  // padded: the border is outside
    double sum = 0.0;
    cv::Point2d centre_sum(0.0, 0.0);
    region.max_prob = -1.0f;
    for (int i = top; i < top + ht; ++i) {
      for (int j = left; j < left + w; ++j) {
        if (labels.at<int>(i, j) != label) continue;
        local.at<std::uint8_t>(i - top + 1, j - left + 1) = 1;
        const float p = h.at(i, j);
        ++region.cells;
        sum += p;
        centre_sum += io::cell_centre(h, i, j);
        if (p > region.max_prob) {
          region.max_prob = p;
          region.peak = io::cell_centre(h, i, j);
        }
      }
    }
    region.mean_prob = static_cast<float>(sum / static_cast<double>(region.cells));
    region.centroid = centre_sum / static_cast<double>(region.cells);

    // Lattice point (x, y) of `local` is the corner (left + x - 1, top + y - 1) of the grid.
    std::vector<io::Ring> rings;
    std::vector<double> areas;
    for (const auto& lattice : trace_boundaries(local)) {
      io::Ring ring;
      ring.reserve(lattice.size());
      for (const auto& v : lattice) {
        ring.emplace_back(std::clamp(first.x + (left + v.x - 1) * step, 0.0, width),
                          std::clamp(first.y + (top + v.y - 1) * step, 0.0, height));
      }
      ring = simplify(std::move(ring));
      if (ring.empty()) continue;  // clipped away entirely (a footprint outside the slide)
      areas.push_back(signed_area(ring));
      rings.push_back(std::move(ring));
    }
    if (rings.empty()) continue;
    const auto outer = static_cast<std::size_t>(std::max_element(areas.begin(), areas.end()) - areas.begin());
    if (!(areas[outer] > 0.0)) continue;
    region.outer = std::move(rings[outer]);
    for (std::size_t k = 0; k < rings.size(); ++k) {
      if (k != outer && areas[k] < 0.0) region.holes.push_back(std::move(rings[k]));
    }

    region.area_mm2 = io::ring_area(region.outer) * um2_per_px / kUm2PerMm2;
    for (const auto& hole : region.holes) region.area_mm2 -= io::ring_area(hole) * um2_per_px / kUm2PerMm2;
    region.longest_diameter_um = longest_diameter(region.outer) * h.slide_mpp;
    region.size_class = size_class_for(region.longest_diameter_um);
    region.bounds = io::bounding_box(region.outer);
    regions.push_back(std::move(region));
  }

  std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) {
    return std::make_tuple(-a.longest_diameter_um, -a.max_prob, a.bounds.y, a.bounds.x) <
           std::make_tuple(-b.longest_diameter_um, -b.max_prob, b.bounds.y, b.bounds.x);
  });
  for (std::size_t k = 0; k < regions.size(); ++k) regions[k].id = static_cast<int>(k) + 1;
  return regions;
}

std::vector<Detection> find_detections(const io::Heatmap& h, const DetectionOptions& options) {
  check_heatmap(h, "find_detections");
  if (!(options.min_prob >= 0.0 && options.min_prob <= 1.0) || !(options.nms_radius_tiles >= 0.0)) {
    throw core::InternalError(fmt::format("find_detections: min_prob {} must be in [0, 1] and nms_radius_tiles {} >= 0",
                                          options.min_prob, options.nms_radius_tiles));
  }
  std::vector<std::size_t> candidates;
  for (std::size_t k = 0; k < h.prob.size(); ++k) {
    if (!std::isnan(h.prob[k]) && h.prob[k] >= options.min_prob) candidates.push_back(k);
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](std::size_t a, std::size_t b) { return h.prob[a] > h.prob[b]; });

  const double radius = options.nms_radius_tiles * static_cast<double>(h.tile);
  const double step = static_cast<double>(h.step);
  const int reach = static_cast<int>(std::floor(radius / step));
  std::vector<std::uint8_t> suppressed(h.prob.size(), 0);
  std::vector<Detection> detections;
  for (const std::size_t k : candidates) {
    if (suppressed[k] != 0) continue;
    const int i = static_cast<int>(k / static_cast<std::size_t>(h.cols));
    const int j = static_cast<int>(k % static_cast<std::size_t>(h.cols));
    const cv::Point2d centre = io::cell_centre(h, i, j);
    detections.push_back(
        {static_cast<double>(h.prob[k]),
         static_cast<double>(std::clamp<std::int64_t>(std::llround(centre.x), 0, h.slide_width - 1)),
         static_cast<double>(std::clamp<std::int64_t>(std::llround(centre.y), 0, h.slide_height - 1))});
    if (options.max_detections > 0 && detections.size() == options.max_detections) break;
    for (int di = -reach; di <= reach; ++di) {
      for (int dj = -reach; dj <= reach; ++dj) {
        const int r = i + di, c = j + dj;
        if (r < 0 || r >= h.rows || c < 0 || c >= h.cols) continue;
        if ((di * di + dj * dj) * step * step <= radius * radius) {
          suppressed[static_cast<std::size_t>(r) * static_cast<std::size_t>(h.cols) + static_cast<std::size_t>(c)] = 1;
        }
      }
    }
  }
  return detections;
}

}  // namespace tessera::analysis
