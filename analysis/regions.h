// Tumour regions and detections from a probability map (io::Heatmap): what the per-slide reports, viewer
// annotations and CAMELYON-style detections of `tessera infer` are made of.
//
// Regions: cells with P >= threshold, grouped into 8-connected components (OpenCV). Each region's outline is the
// boundary of the union of its cells' footprints (io::cell_footprint: the step×step square centred on each tile,
// the tile itself when step == tile), traced along cell corners, so it encloses exactly the area its scores stand
// for; collinear points are dropped, holes (unscored or sub-threshold cells enclosed by the region) are kept as
// interior rings, and points are clipped to the slide. Diagonal neighbours belong to one region and share one
// outline (pinched at the touching corner).
//   area: outline minus holes, × slide_mpp², in mm².
//   longest diameter: the largest distance between two points of the outline's convex hull, × slide_mpp, in µm
//     (footprints are whole cells, so lengths are known to about one step).
//   size class (AJCC breast lymph-node staging by longest diameter): isolated tumour cells ≤ 0.2 mm,
//     micrometastasis > 0.2 mm and ≤ 2 mm, macrometastasis > 2 mm.
// Regions are numbered from 1 in decreasing longest diameter (ties: higher max probability, then position), so
// region 1 is the one that stages the slide.
//
// Detections (CAMELYON16 `prob,X,Y`): the level-0 centres of cells that are local maxima of the map, by greedy
// non-maximum suppression: cells with P >= min_prob in decreasing order of P (ties: row-major order), each kept
// unless a kept cell lies within `nms_radius_tiles` tile widths (centre to centre), so every detection is the
// highest score within that radius. The default radius of 2 tiles keeps one detection per small lesion
// while separate lesions a few tiles apart each get their own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "analysis/detections.h"
#include "io/annotations.h"
#include "io/heatmap.h"

namespace tessera::analysis {

enum class SizeClass { isolated_tumour_cells, micrometastasis, macrometastasis };

inline constexpr double kIsolatedTumourCellsMaxUm = 200.0;  // longest diameter ≤ this: isolated tumour cells
inline constexpr double kMicrometastasisMaxUm = 2000.0;     // ≤ this: micrometastasis; above: macrometastasis

SizeClass size_class_for(double longest_diameter_um);
const char* to_string(SizeClass size_class);  // "isolated_tumour_cells", "micrometastasis", "macrometastasis"
const char* label(SizeClass size_class);      // "isolated tumour cells", ...
constexpr SizeClass kSizeClasses[] = {SizeClass::isolated_tumour_cells, SizeClass::micrometastasis,
                                      SizeClass::macrometastasis};

struct RegionOptions {
  double threshold = 0.5;  // cells with P >= threshold are tumour
};

struct Region {
  int id = 0;                   // 1-based, in report order (see above)
  io::Ring outer;               // level-0 px, clockwise on screen, first point not repeated
  std::vector<io::Ring> holes;  // level-0 px
  std::int64_t cells = 0;       // grid cells in the region
  double area_mm2 = 0.0;
  double longest_diameter_um = 0.0;
  float max_prob = 0.0f;
  float mean_prob = 0.0f;
  cv::Point2d centroid;  // level-0: mean of the cells' tile centres
  cv::Point2d peak;      // level-0 tile centre of the cell with the highest probability
  cv::Rect2d bounds;     // level-0 bounding box of the outline
  SizeClass size_class = SizeClass::isolated_tumour_cells;
};

// The regions of a map; none when no cell reaches the threshold. Needs the slide's µm/px for sizes: InputError
// naming the slide when slide_mpp is 0; InternalError when the map breaks io::heatmap_problem()'s invariants or
// the threshold is not in (0, 1].
std::vector<Region> find_regions(const io::Heatmap& heatmap, const RegionOptions& options = {});

struct DetectionOptions {
  double min_prob = 0.1;           // cells below this are never detections
  double nms_radius_tiles = 2.0;   // suppression radius in tile widths (level-0: × heatmap.tile)
  std::size_t max_detections = 0;  // keep the most probable ones; 0 = all
};

// Detections in decreasing probability (see above).
std::vector<Detection> find_detections(const io::Heatmap& heatmap, const DetectionOptions& options = {});

}  // namespace tessera::analysis
