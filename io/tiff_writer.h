// Streaming pyramidal TIFF writer (libtiff).
//
// The caller hands over level 0 as horizontal strips, top to bottom, each `tile_size` rows high (the last
// may be shorter) and the full level-0 width, RGB CV_8UC3. The writer encodes level-0 tiles as strips
// arrive and builds every lower level on the fly by area-downsampling by `level_factor`, so memory is a
// few strips per level and never a whole level. Lower levels stream into temporary TIFFs beside the
// output; finish() appends their compressed tiles to the output without re-encoding, then syncs the output and
// renames it from a temporary name (core/atomic_file.h), so a reader never sees a half-written slide.
//
// Flavours:
//  - generic: tiled RGB TIFF with resolution tags (centimetre unit); OpenSlide reports `generic-tiff`.
//  - aperio: adds an Aperio-style ImageDescription carrying `MPP` and `AppMag` (OpenSlide reports vendor
//    `aperio` and `openslide.mpp-x`), and a thumbnail as the second directory as Aperio scanners do;
//    further associated images (label, macro) are written as stripped directories named in their
//    descriptions.
// Files larger than 4 GiB are written as BigTIFF automatically.
//
// Images whose tiles repeat (a heatmap: every pixel of a cell's footprint has the cell's colour) can be given tile by
// tile instead (write_tiles() with a TileSource): each distinct tile is compressed and stored once and every equal
// tile points at the same bytes (TIFF lets tiles share offsets), so the cost follows the distinct tiles, not the
// area. The source makes every level itself, exactly as the strips would have made it (downsample_for_pyramid()).
// The distinct tiles are compressed on `threads` threads, a batch at a time (libdeflate, with libtiff's horizontal
// predictor, as libtiff compresses them by default), and appended in tile order; the file does not depend on the
// thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::io {

enum class TiffFlavor { generic, aperio };
enum class TiffCompression { jpeg, deflate };

struct TiffWriterOptions {
  TiffFlavor flavor = TiffFlavor::generic;
  TiffCompression compression = TiffCompression::jpeg;
  int jpeg_quality = 85;
  int tile_size = 256;               // multiple of 16
  int level_factor = 2;              // downsample between pyramid levels (2..8)
  int min_level_size = 512;          // stop adding levels once both sides are at most this
  double mpp = 0.25;                 // µm per level-0 pixel; must be > 0
  double objective_power = 40.0;     // written as AppMag in the aperio flavour
  std::string description;           // free text added to the image description
  std::string software = "Tessera";  // the TIFF Software tag (tessera synth: io::kSyntheticSlideSoftware)
  int threads = 1;                   // write_tiles(): threads compressing the distinct tiles (>= 1)
};

// The lower levels' pixels: `block` (rows a multiple of `factor`) area-averaged by `factor` after padding its right
// edge by replicating the last column to a multiple of it. Level k+1 of a pyramid is this of level k (the bottom edge
// replicated the same way); a TileSource that makes its levels itself uses it to get the same pixels.
cv::Mat downsample_for_pyramid(const cv::Mat& block, int factor);

// The pixels of a pyramid given tile by tile (TiffWriter::write_tiles). Level k is TiffWriter::level_width(k) ×
// level_height(k) pixels.
class TileSource {
 public:
  virtual ~TileSource() = default;
  // Bytes that identify the pixels of the `width`×`height` tile whose top-left is (x0, y0) at level `level`: two tiles
  // (of any levels) with equal keys must have equal pixels; equal pixels may have different keys (then they are
  // simply stored twice).
  virtual void describe_tile(int level, std::int64_t x0, std::int64_t y0, int width, int height, std::string& key) = 0;
  // That tile's pixels into `tile` (RGB CV_8UC3, height×width): the image's pixels, and past its right or bottom
  // edge its last column or row repeated, as write_strip() pads edge tiles.
  virtual void render_tile(int level, std::int64_t x0, std::int64_t y0, int width, int height, cv::Mat& tile) = 0;
};

class TiffWriter {
 public:
  // Opens `path` (written under a temporary name until finish()). Throws core::InternalError/InputError naming
  // the file on failure.
  TiffWriter(const std::string& path, std::int64_t width, std::int64_t height, const TiffWriterOptions& options);
  ~TiffWriter();  // without finish(): removes the temporary files, leaves nothing behind
  TiffWriter(const TiffWriter&) = delete;
  TiffWriter& operator=(const TiffWriter&) = delete;

  // Next level-0 strip: CV_8UC3 RGB, cols == width, rows == tile_size (or the remainder for the last one).
  void write_strip(const cv::Mat& strip);
  // The whole pyramid from `source` instead of write_strip(): every level, each distinct tile (by its key) compressed
  // once (on options.threads threads; the source is called from this thread only) and every equal tile pointing at
  // its bytes. Deflate compression only (JPEG tiles need their directory's tables). Then finish() as usual.
  void write_tiles(TileSource& source);
  // Associated image (aperio flavour: "label" or "macro"); RGB CV_8UC3. Call before finish().
  void add_associated_image(const std::string& name, const cv::Mat& image);
  // Writes the remaining levels and associated images, closes and renames into place.
  void finish();

  int level_count() const;  // number of pyramid levels that will be written
  std::int64_t level_width(int level) const;
  std::int64_t level_height(int level) const;
  int level_factor() const;
  std::int64_t tiles_stored() const;  // write_tiles(): tiles compressed and stored (the rest point at them)
  std::int64_t tiles_total() const;   // write_tiles(): tiles of every level
  std::int64_t rows_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
