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
  // Associated image (aperio flavour: "label" or "macro"); RGB CV_8UC3. Call before finish().
  void add_associated_image(const std::string& name, const cv::Mat& image);
  // Writes the remaining levels and associated images, closes and renames into place.
  void finish();

  int level_count() const;  // number of pyramid levels that will be written
  std::int64_t rows_written() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
