// Regions and detections on hand-made maps with known blobs: counts, outlines, areas, diameters and size classes
// at a known µm/px; outlines checked against the cells they enclose on random maps; NMS maxima.
#include "analysis/regions.h"

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/imgproc.hpp>

#include "core/error.h"

namespace tessera::analysis {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A rows×cols map of background probability 0.05 over a slide that fits the grid exactly; 0.5 µm/px, tile = step
// = 100 level-0 px, so one cell is 50 µm square.
io::Heatmap blank_map(int rows, int cols, std::int64_t tile = 100, std::int64_t step = 100) {
  io::Heatmap h;
  h.slide_id = "blobs";
  h.slide_path = "/slides/blobs.tif";
  h.slide_mpp = 0.5;
  h.tile_mpp = 1.0;
  h.tile = tile;
  h.step = step;
  h.rows = rows;
  h.cols = cols;
  h.slide_width = (cols - 1) * step + tile;
  h.slide_height = (rows - 1) * step + tile;
  h.prob.assign(static_cast<std::size_t>(rows) * cols, 0.05f);
  return h;
}

void set(io::Heatmap& h, int row, int col, float p) { h.prob[static_cast<std::size_t>(row) * h.cols + col] = p; }

void fill(io::Heatmap& h, int top, int left, int height, int width, float p) {
  for (int i = top; i < top + height; ++i) {
    for (int j = left; j < left + width; ++j) set(h, i, j, p);
  }
}

double um2_to_mm2(double um2) { return um2 / 1e6; }

TEST(Regions, ASquareBlobHasItsCornersAreaAndDiagonal) {
  io::Heatmap h = blank_map(10, 12);
  fill(h, 2, 3, 3, 3, 0.9f);  // rows 2-4, columns 3-5
  set(h, 3, 4, 0.97f);        // the peak, in the middle
  const std::vector<Region> regions = find_regions(h);
  ASSERT_EQ(regions.size(), 1u);
  const Region& r = regions[0];
  EXPECT_EQ(r.id, 1);
  EXPECT_EQ(r.cells, 9);
  // Columns 3-5 span x [300, 600), rows 2-4 span y [200, 500): four corners, clockwise on screen.
  EXPECT_EQ(r.outer, (io::Ring{{300, 200}, {600, 200}, {600, 500}, {300, 500}}));
  EXPECT_TRUE(r.holes.empty());
  EXPECT_NEAR(r.area_mm2, um2_to_mm2(150.0 * 150.0), 1e-12);
  EXPECT_NEAR(r.longest_diameter_um, 150.0 * std::sqrt(2.0), 1e-9);
  EXPECT_EQ(r.size_class, SizeClass::micrometastasis);  // 212 µm > 200 µm
  EXPECT_FLOAT_EQ(r.max_prob, 0.97f);
  EXPECT_NEAR(r.mean_prob, (8 * 0.9 + 0.97) / 9, 1e-6);
  EXPECT_EQ(r.centroid, cv::Point2d(450, 350));
  EXPECT_EQ(r.peak, cv::Point2d(450, 350));
  EXPECT_EQ(r.bounds, cv::Rect2d(300, 200, 300, 300));
}

TEST(Regions, SizeClassesFollowTheLongestDiameter) {
  io::Heatmap h = blank_map(20, 60);
  set(h, 1, 1, 0.8f);           // one cell: 50 µm square, diagonal 70.7 µm → isolated tumour cells
  fill(h, 5, 5, 3, 3, 0.8f);    // 150 µm square, diagonal 212 µm → micrometastasis
  fill(h, 12, 4, 1, 50, 0.8f);  // 2500 × 50 µm → macrometastasis
  fill(h, 15, 30, 2, 2, 0.7f);  // 100 µm square, diagonal 141 µm → isolated tumour cells
  const std::vector<Region> regions = find_regions(h);
  ASSERT_EQ(regions.size(), 4u);
  // Numbered by decreasing longest diameter.
  EXPECT_EQ(regions[0].size_class, SizeClass::macrometastasis);
  EXPECT_NEAR(regions[0].longest_diameter_um, std::hypot(2500.0, 50.0), 1e-9);
  EXPECT_NEAR(regions[0].area_mm2, um2_to_mm2(2500.0 * 50.0), 1e-12);
  EXPECT_EQ(regions[1].size_class, SizeClass::micrometastasis);
  EXPECT_EQ(regions[2].size_class, SizeClass::isolated_tumour_cells);
  EXPECT_NEAR(regions[2].longest_diameter_um, 100.0 * std::sqrt(2.0), 1e-9);
  EXPECT_EQ(regions[3].size_class, SizeClass::isolated_tumour_cells);
  EXPECT_NEAR(regions[3].longest_diameter_um, 50.0 * std::sqrt(2.0), 1e-9);
  for (std::size_t k = 0; k < regions.size(); ++k) EXPECT_EQ(regions[k].id, static_cast<int>(k) + 1);

  // The staging boundaries themselves (AJCC: ≤ 0.2 mm ITC, ≤ 2 mm micro).
  EXPECT_EQ(size_class_for(200.0), SizeClass::isolated_tumour_cells);
  EXPECT_EQ(size_class_for(200.001), SizeClass::micrometastasis);
  EXPECT_EQ(size_class_for(2000.0), SizeClass::micrometastasis);
  EXPECT_EQ(size_class_for(2000.001), SizeClass::macrometastasis);
}

TEST(Regions, TheThresholdIsInclusiveAndUnscoredCellsNeverCount) {
  io::Heatmap h = blank_map(6, 6);
  set(h, 1, 1, 0.5f);
  set(h, 1, 2, kNaN);
  set(h, 1, 3, 0.4999f);
  EXPECT_EQ(find_regions(h).size(), 1u);
  RegionOptions strict;
  strict.threshold = 0.6;
  EXPECT_TRUE(find_regions(h, strict).empty());
  RegionOptions loose;
  loose.threshold = 0.4;
  // 0.5 and 0.4999 are not neighbours (the NaN cell lies between them).
  EXPECT_EQ(find_regions(h, loose).size(), 2u);
}

TEST(Regions, DiagonalNeighboursAreOneRegionWithAPinchedOutline) {
  io::Heatmap h = blank_map(5, 5);
  set(h, 1, 1, 0.9f);
  set(h, 2, 2, 0.9f);
  const std::vector<Region> regions = find_regions(h);
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].cells, 2);
  // One ring through the shared corner (200, 200) twice.
  EXPECT_EQ(regions[0].outer,
            (io::Ring{{100, 100}, {200, 100}, {200, 200}, {300, 200}, {300, 300}, {200, 300}, {200, 200}, {100, 200}}));
  EXPECT_NEAR(regions[0].area_mm2, um2_to_mm2(2 * 50.0 * 50.0), 1e-12);
  EXPECT_NEAR(regions[0].longest_diameter_um, 100.0 * std::sqrt(2.0), 1e-9);
}

TEST(Regions, HolesAreKeptAndIslandsInsideThemAreRegionsOfTheirOwn) {
  io::Heatmap h = blank_map(11, 11);
  fill(h, 1, 1, 7, 7, 0.9f);  // a 7×7 block...
  fill(h, 2, 2, 5, 5, 0.1f);  // ...hollowed to a one-cell-wide frame
  set(h, 4, 4, 0.8f);         // with an island in the middle of the hole
  set(h, 2, 2, kNaN);         // unscored cells in a hole are part of it
  const std::vector<Region> regions = find_regions(h);
  ASSERT_EQ(regions.size(), 2u);
  const Region& frame = regions[0];
  EXPECT_EQ(frame.cells, 24);
  ASSERT_EQ(frame.holes.size(), 1u);
  EXPECT_EQ(frame.outer, (io::Ring{{100, 100}, {800, 100}, {800, 800}, {100, 800}}));
  EXPECT_EQ(io::ring_area(frame.holes[0]), 500.0 * 500.0);
  EXPECT_NEAR(frame.area_mm2, um2_to_mm2(24 * 50.0 * 50.0), 1e-12);
  EXPECT_NEAR(frame.mean_prob, 0.9, 1e-6);
  const Region& island = regions[1];
  EXPECT_EQ(island.cells, 1);
  EXPECT_TRUE(island.holes.empty());
  EXPECT_EQ(island.outer, (io::Ring{{400, 400}, {500, 400}, {500, 500}, {400, 500}}));
}

TEST(Regions, OverlappingTilesOutlineTheirFootprints) {
  // Tiles of 200 px every 100 px: a cell stands for the central 100 px of its tile.
  io::Heatmap h = blank_map(6, 6, 200, 100);
  set(h, 2, 3, 0.9f);
  const std::vector<Region> regions = find_regions(h);
  ASSERT_EQ(regions.size(), 1u);
  // Tile (2, 3) spans x [300, 500), y [200, 400); its footprint is x [350, 450), y [250, 350).
  EXPECT_EQ(regions[0].outer, (io::Ring{{350, 250}, {450, 250}, {450, 350}, {350, 350}}));
  EXPECT_EQ(regions[0].centroid, cv::Point2d(400, 300));
}

TEST(Regions, OutlinesAreClippedToTheSlide) {
  io::Heatmap h = blank_map(4, 5);
  h.origin_x = -50;  // the first column of footprints starts left of the slide
  h.slide_width = 430;
  fill(h, 0, 0, 2, 1, 0.9f);
  fill(h, 2, 4, 2, 1, 0.9f);  // last column: x [350, 450) → clipped at 430
  const std::vector<Region> regions = find_regions(h);
  ASSERT_EQ(regions.size(), 2u);
  for (const auto& r : regions) {
    for (const auto& p : r.outer) {
      EXPECT_GE(p.x, 0);
      EXPECT_LE(p.x, h.slide_width);
      EXPECT_GE(p.y, 0);
      EXPECT_LE(p.y, h.slide_height);
    }
  }
  std::set<double> areas;
  for (const auto& r : regions) areas.insert(io::ring_area(r.outer));
  EXPECT_EQ(areas, (std::set<double>{50.0 * 200.0, 80.0 * 200.0}));
}

TEST(Regions, NoneOnAnEmptyOrLowMapAndSizesNeedTheResolution) {
  EXPECT_TRUE(find_regions(blank_map(5, 5)).empty());
  io::Heatmap empty = blank_map(1, 1);
  empty.rows = 0;
  empty.cols = 0;
  empty.prob.clear();
  EXPECT_TRUE(find_regions(empty).empty());
  EXPECT_TRUE(find_detections(empty).empty());

  io::Heatmap h = blank_map(5, 5);
  h.slide_mpp = 0.0;
  try {
    find_regions(h);
    FAIL();
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), h.slide_path);
  }
  RegionOptions bad;
  bad.threshold = 0.0;
  EXPECT_THROW(find_regions(blank_map(3, 3), bad), core::InternalError);
}

// Whether level-0 point p lies inside the region (outer ring minus holes); p is never on an edge here.
bool inside(const Region& r, cv::Point2d p) {
  auto in_ring = [&](const io::Ring& ring) {
    std::vector<cv::Point2f> contour;
    for (const auto& q : ring) contour.emplace_back(static_cast<float>(q.x), static_cast<float>(q.y));
    return cv::pointPolygonTest(contour, cv::Point2f(static_cast<float>(p.x), static_cast<float>(p.y)), false) > 0;
  };
  if (!in_ring(r.outer)) return false;
  for (const auto& hole : r.holes) {
    if (in_ring(hole)) return false;
  }
  return true;
}

TEST(Regions, OutlinesEncloseExactlyTheirCellsOnRandomMaps) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (int trial = 0; trial < 20; ++trial) {
    io::Heatmap h = blank_map(23, 31);
    for (auto& p : h.prob) p = uniform(rng) < 0.05f ? kNaN : uniform(rng);
    const std::vector<Region> regions = find_regions(h);

    // The same components, counted independently (OpenCV, 8-connected).
    cv::Mat mask(h.rows, h.cols, CV_8U);
    for (int i = 0; i < h.rows; ++i) {
      for (int j = 0; j < h.cols; ++j) mask.at<std::uint8_t>(i, j) = h.at(i, j) >= 0.5f ? 1 : 0;
    }
    cv::Mat labels;
    ASSERT_EQ(static_cast<int>(regions.size()), cv::connectedComponents(mask, labels, 8) - 1) << "trial " << trial;

    std::int64_t cells = 0;
    for (const auto& r : regions) {
      cells += r.cells;
      // Area from the outline equals the cells' area; no two points of a ring in a row are equal or collinear.
      double area = io::ring_area(r.outer);
      for (const auto& hole : r.holes) area -= io::ring_area(hole);
      EXPECT_DOUBLE_EQ(area, static_cast<double>(r.cells) * 100.0 * 100.0) << "trial " << trial << " region " << r.id;
      for (std::size_t k = 0; k < r.outer.size(); ++k) {
        const cv::Point2d a = r.outer[k], b = r.outer[(k + 1) % r.outer.size()], c = r.outer[(k + 2) % r.outer.size()];
        EXPECT_NE(a, b);
        EXPECT_NE((b - a).x * (c - b).y - (b - a).y * (c - b).x, 0.0) << "collinear point in region " << r.id;
      }
    }
    EXPECT_EQ(cells, cv::countNonZero(mask));

    // Every cell centre lies inside exactly the region of its component, and outside all others.
    for (int i = 0; i < h.rows; ++i) {
      for (int j = 0; j < h.cols; ++j) {
        const cv::Point2d centre = io::cell_centre(h, i, j);
        int hits = 0;
        for (const auto& r : regions) hits += inside(r, centre) ? 1 : 0;
        ASSERT_EQ(hits, mask.at<std::uint8_t>(i, j)) << "trial " << trial << " cell " << i << "," << j;
      }
    }
  }
}

TEST(Detections, NonMaximumSuppressionKeepsOnePeakPerRadius) {
  io::Heatmap h = blank_map(12, 20);
  set(h, 3, 3, 0.95f);
  set(h, 3, 4, 0.9f);    // next to the first peak: suppressed
  set(h, 4, 5, 0.85f);   // sqrt(1 + 4) = 2.24 cells away: beyond 2 tiles, a detection of its own
  set(h, 9, 15, 0.6f);   // far away
  set(h, 9, 17, 0.3f);   // exactly 2 tiles from it: suppressed (within the radius, inclusive)
  set(h, 0, 19, 0.08f);  // below the floor
  const std::vector<Detection> detections = find_detections(h);
  ASSERT_EQ(detections.size(), 3u);
  EXPECT_FLOAT_EQ(detections[0].p, 0.95f);
  EXPECT_EQ(detections[0].x, 350);  // centre of column 3: 3·100 + 50
  EXPECT_EQ(detections[0].y, 350);
  EXPECT_FLOAT_EQ(detections[1].p, 0.85f);
  EXPECT_EQ(detections[1].x, 550);
  EXPECT_EQ(detections[1].y, 450);
  EXPECT_FLOAT_EQ(detections[2].p, 0.6f);
  EXPECT_EQ(detections[2].x, 1550);
  EXPECT_EQ(detections[2].y, 950);

  DetectionOptions one;
  one.max_detections = 1;
  EXPECT_EQ(find_detections(h, one).size(), 1u);
  DetectionOptions none;
  none.nms_radius_tiles = 0.0;
  none.min_prob = 0.5;
  EXPECT_EQ(find_detections(h, none).size(), 4u);  // every cell ≥ 0.5
}

TEST(Detections, EqualScoresResolveInRowMajorOrder) {
  io::Heatmap h = blank_map(3, 8);
  set(h, 1, 6, 0.7f);
  set(h, 1, 5, 0.7f);
  const std::vector<Detection> detections = find_detections(h);
  ASSERT_EQ(detections.size(), 1u);
  EXPECT_EQ(detections[0].x, 550);  // column 5 comes first
}

TEST(Detections, AreSeparatedAndCoverEveryCellAboveTheFloorOnRandomMaps) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  io::Heatmap h = blank_map(40, 50, 256, 128);
  for (auto& p : h.prob) p = uniform(rng) < 0.1f ? kNaN : uniform(rng);
  DetectionOptions options;  // floor 0.1, radius 2 tiles = 512 px
  const std::vector<Detection> detections = find_detections(h, options);
  ASSERT_FALSE(detections.empty());
  const double radius = options.nms_radius_tiles * static_cast<double>(h.tile);
  for (std::size_t a = 0; a < detections.size(); ++a) {
    if (a > 0) {
      EXPECT_LE(detections[a].p, detections[a - 1].p);
    }
    for (std::size_t b = a + 1; b < detections.size(); ++b) {
      const double d = std::hypot(static_cast<double>(detections[a].x - detections[b].x),
                                  static_cast<double>(detections[a].y - detections[b].y));
      EXPECT_GT(d, radius);
    }
  }
  // Every cell above the floor is a detection or lies within the radius of a detection at least as probable.
  for (int i = 0; i < h.rows; ++i) {
    for (int j = 0; j < h.cols; ++j) {
      const float p = h.at(i, j);
      if (std::isnan(p) || p < options.min_prob) continue;
      const cv::Point2d c = io::cell_centre(h, i, j);
      bool covered = false;
      for (const auto& d : detections) {
        covered = covered || (d.p >= p && std::hypot(c.x - d.x, c.y - d.y) <= radius);
      }
      EXPECT_TRUE(covered) << "cell " << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace tessera::analysis
