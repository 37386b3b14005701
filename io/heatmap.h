// A tumour-probability map over a slide, its HDF5 file (`<slide>.heatmap.h5`) and its pyramidal TIFF
// (`<slide>.heatmap.tif`), the two outputs of `tessera infer` that hold the map itself.
//
// Geometry (all lengths in level-0 pixels): cell (i, j) is the tile whose top-left is
// (origin_x + j·step, origin_y + i·step) and whose side is `tile`; its value is the model's P(tumour) for that
// tile, NaN where no tissue was scored. With overlapping tiles (step < tile) a pixel lies in several tiles, so
// pictures and regions give each cell its *footprint*: the step×step square centred on its tile (the part of
// the slide its score stands for; the tile itself when step == tile). Footprints tile the plane without
// overlap, cell_footprint() gives one, and the TIFF, the overlay and the region outlines all use them.
//
// heatmap.h5 layout: dataset `/prob` float32 [rows, cols] (NaN = no tissue), contiguous, and attributes on `/`:
// format = "tessera-heatmap", version, slide_id, slide_path, slide_width, slide_height, slide_mpp, tile_mpp,
// origin_x, origin_y, step, tile, rows, cols, checkpoint. h5py reads it directly:
//   f = h5py.File("tumor_001.heatmap.h5"); p = f["prob"][:]; step = f.attrs["step"]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::io {

// A tumour-probability map over a slide: one value per grid cell, row-major, NaN where no tissue was scored.
// Cell (i, j) covers the level-0 square [origin_x + j*step, +tile) x [origin_y + i*step, +tile); its value is the
// model's P(tumour) for the tile there. All lengths in level-0 pixels.
struct Heatmap {
  std::string slide_id;  // e.g. "tumor_001"
  std::string slide_path;
  std::int64_t slide_width = 0, slide_height = 0;               // level 0
  double slide_mpp = 0.0;                                       // level-0 um/px (0 = unknown)
  double tile_mpp = 0.0;                                        // the model's um/px
  std::int64_t origin_x = 0, origin_y = 0, step = 0, tile = 0;  // level-0 px
  int rows = 0, cols = 0;
  std::vector<float> prob;  // rows*cols
  std::string checkpoint;   // path of the model, for provenance

  float at(int row, int col) const { return prob[static_cast<std::size_t>(row) * cols + col]; }
  std::int64_t scored_cells() const;  // cells that are not NaN
  float max_prob() const;             // NaN when no cell was scored
};

// The level-0 footprint of cell (row, col): the step×step square centred on its tile (see above). Not clipped
// to the slide.
cv::Rect2d cell_footprint(const Heatmap& heatmap, int row, int col);
// The level-0 centre of cell (row, col)'s tile.
cv::Point2d cell_centre(const Heatmap& heatmap, int row, int col);

// For `n` output pixels along x (or y) that are `scale` level-0 pixels wide each (pixel k covers level-0
// [start + k·scale, start + (k+1)·scale)), the column (row) of the cell whose footprint holds the pixel's centre,
// or -1 when none does. Used to paint the map at any resolution and over any window (the viewer's tiles): every
// pixel takes exactly one cell's value.
std::vector<int> cell_columns(const Heatmap& heatmap, int n, double scale, double start = 0.0);
std::vector<int> cell_rows(const Heatmap& heatmap, int n, double scale, double start = 0.0);

// Checks the invariants every writer and reader relies on: positive slide size, step and tile; rows, cols >= 0;
// prob.size() == rows·cols; every value NaN or in [0, 1] (give or take 1e-4: a float softmax can return
// 1.0000002; every consumer clamps); slide_mpp and tile_mpp finite and >= 0.
// Returns the first problem, "" when there is none.
std::string heatmap_problem(const Heatmap& heatmap);

// Writes `<slide>.heatmap.h5` atomically (temporary name, fsync, rename). core::InternalError naming the file when the
// map breaks an invariant above or when writing fails.
void write_heatmap(const std::string& path, const Heatmap& heatmap);
// Reads a heatmap file; core::InputError naming the file and the problem (missing, truncated, not HDF5, not a Tessera
// heatmap, a newer version, a missing or malformed attribute, /prob of the wrong shape or type, values outside
// [0, 1]).
Heatmap read_heatmap(const std::string& path);

// Perceptual colour maps (matplotlib's, as OpenCV ships them). The same function colours the overlay, its
// legend and the TIFF, so that a colour means one probability everywhere.
enum class Colormap { inferno, viridis };
Colormap parse_colormap(const std::string& name);  // "inferno" | "viridis"; core::InternalError listing the names
const char* to_string(Colormap colormap);
// RGB colour of probability p (clamped to [0, 1], quantized to 256 steps).
cv::Vec3b colormap_rgb(double p, Colormap colormap);

struct HeatmapTiffOptions {
  // colour: RGB through `colormap`, unscored (NaN) cells and the area outside the grid white, for viewing the
  // TIFF as an image (QuPath, ASAP, any OpenSlide viewer). grey: R = G = B = round(255·p), unscored 0, for
  // programs that read the probability back (0 is then both "no tissue" and "p < 1/510"; heatmap.h5 has NaN).
  enum class Encoding { colour, grey };
  Encoding encoding = Encoding::colour;
  Colormap colormap = Colormap::inferno;
  int tile_size = 256;  // TIFF tile side
  int threads = 1;      // write_heatmap_tiff(): threads compressing its distinct tiles (the file is the same)
};

// Writes `<slide>.heatmap.tif`: a pyramidal TIFF (Aperio layout, deflate: lossless) exactly the slide's level-0
// size and resolution, each pixel taking the value of the cell whose footprint holds it, so it lies on the
// slide pixel for pixel in a viewer; OpenSlide opens it (vendor aperio, openslide.mpp-x = slide_mpp). Written
// atomically by io::TiffWriter. Needs slide_mpp > 0 (core::InternalError otherwise).
//   Cost follows the cells, not the slide's area: every level is held as runs of columns times runs of rows (a
// level-0 run is one cell's footprint; a lower level's runs are the distinct tuples of the runs its pixels average),
// so no level is ever rendered whole; each distinct tile is compressed once and every equal tile (background,
// the inside of a cell's footprint, equal neighbours) points at its bytes (TiffWriter::write_tiles). Memory: the
// runs and one tile per distinct tile key, about the grid's size.
void write_heatmap_tiff(const std::string& path, const Heatmap& h, const HeatmapTiffOptions& options = {});

// The same file made the plain way, the reference write_heatmap_tiff() is tested against: every level-0 pixel
// rendered, strip by strip, into TiffWriter::write_strip, which compresses every tile and downsamples every level.
// Time and work grow with the slide's area.
void write_heatmap_tiff_by_strips(const std::string& path, const Heatmap& h, const HeatmapTiffOptions& options = {});

}  // namespace tessera::io
