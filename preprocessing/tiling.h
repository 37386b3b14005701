// The tile grid of one slide at a target resolution, with labels from annotation polygons.
//
// Tiles are `tile_size` pixels at `mpp` µm/px; on level 0 a tile covers tile_size·mpp/slide_mpp pixels
// (not necessarily an integer: positions are rounded, footprints are not accumulated). The grid starts at
// level-0 (0, 0) and steps by `stride` tile pixels. A tile is kept when its tissue fraction (from the tissue
// mask) is at least `min_tissue`. Its tumour fraction is computed exactly at tile resolution by rasterizing
// the tumour polygons (holes and exclusion polygons subtracted) into the tile's own pixel grid.
// Label rule: tumour when fraction ≥ tumour_threshold, normal when fraction == 0, and the ambiguous band in
// between is dropped or kept (labelled by the threshold) as configured. Exclusion polygons (CAMELYON16
// `_2`) are not tumour; a tile inside one is normal unless tumour is also present.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "io/annotations.h"
#include "io/slide.h"
#include "preprocessing/qc.h"
#include "preprocessing/tissue.h"

namespace tessera::prep {

// The annotation class rules (which groups are tumour, which exclusion) are io::AnnotationClasses.
using io::AnnotationClasses;

struct GridOptions {
  int tile_size = 256;      // pixels at `mpp`
  double mpp = 0.5;         // target µm/px
  int stride = 0;           // tile pixels between tile origins; 0 = tile_size (no overlap)
  double min_tissue = 0.5;  // minimum tissue fraction of a kept tile
  double tumour_threshold = 0.5;
  bool keep_ambiguous = false;  // keep tiles with 0 < fraction < threshold (labelled normal)
};

struct PlannedTile {
  std::int64_t x = 0;  // level-0 top-left
  std::int64_t y = 0;
  float tissue_fraction = 0.0f;
  float tumour_fraction = 0.0f;
  std::uint8_t label = 0;  // 0 normal, 1 tumour
  // Quality control (tile_job): the shard's artefact bits (io::kShardArtefact*), and the class covering most of the
  // tile when it is over qc.max_fraction in excluded artefacts (-1 otherwise).
  std::uint16_t artefacts = 0;
  std::int8_t worst_artefact = -1;
};

struct SlidePlan {
  std::string slide_path;
  std::string slide_id;
  double slide_mpp = 0.0;
  double footprint = 0.0;          // level-0 pixels covered by one tile side
  std::vector<PlannedTile> tiles;  // row-major order (y, then x)
  std::int64_t count(std::uint8_t label) const;
};

// The exact tumour fraction of the square region with level-0 top-left (x, y) and side `footprint`,
// rasterized at `pixels`×`pixels`.
double tumour_fraction(const std::vector<io::Annotation>& tumour, const std::vector<io::Annotation>& exclusion,
                       double x, double y, double footprint, int pixels);

SlidePlan plan_slide(const io::Slide& slide, const TissueMask& tissue, const std::vector<io::Annotation>& annotations,
                     const AnnotationClasses& classes, const GridOptions& options);

// The tissue fraction of every level-0 square [xs[j], xs[j] + side) × [ys[i], ys[i] + side), row-major (i, then
// j), by the rule plan_slide keeps tiles with: for grids that plan_slide's rounded origins do not describe
// (inference's heatmap cells, whose level-0 step must be a whole number of pixels).
std::vector<double> tissue_fractions(const TissueMask& tissue, const std::vector<std::int64_t>& xs,
                                     const std::vector<std::int64_t>& ys, double side);

// Caps a plan: at most `max_tiles` tiles (0 = no cap) and, when `max_normal_per_tumour` > 0, at most that many
// normal tiles per tumour tile (slides without tumour keep up to max_tiles normal tiles). The choice is a
// seeded random subset; the kept tiles stay in row-major order.
void cap_tiles(SlidePlan& plan, std::int64_t max_tiles, double max_normal_per_tumour, std::uint64_t seed);

// A preview a person checks at a glance: slide thumbnail, tissue mask contour, the grid's tiles as
// rectangles coloured by label (normal green, tumour red, ambiguous-kept orange), and tumour polygons. With `qc`
// (quality control ran), its excluded areas outlined in grey and its flagged ones in amber (kQcExcludedRgb,
// kQcFlaggedRgb, as infer's overlay draws them), with a legend entry each.
cv::Mat render_plan_preview(const io::Slide& slide, const TissueMask& tissue, const SlidePlan& plan,
                            const std::vector<io::Annotation>& tumour, int max_side, const QcResult* qc = nullptr);

}  // namespace tessera::prep
