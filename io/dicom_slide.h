// DICOM whole-slide images (VL Whole Slide Microscopy Image Storage) read as a pyramid of tiled levels, behind
// io::Slide (docs/ARCHITECTURE.md, "DICOM slides").
//
// A slide is a series: a folder of instances, or one file of the series (its siblings in the same folder are found
// by Series Instance UID; files of other series are ignored with a note). DCMTK parses the files (pixel data is
// loaded lazily, frame by frame, never whole); frames are decoded by libjpeg(-turbo) for JPEG baseline and
// extended (the decoder under the TIFF path's JPEG tiles, with its default colour conversion and upsampling),
// OpenJPEG for JPEG 2000 and DCMTK's codec for JPEG-LS; uncompressed frames (explicit or implicit VR little endian)
// are converted here. Any other transfer syntax is an InputError naming it.
//
// Levels: the VOLUME instances of the first optical path, ordered by total pixel matrix size, largest first; their
// sizes must form a pyramid of one image (aspect ratios agree within rounding) and no two may have one size, or
// the error names the files. LABEL, OVERVIEW and THUMBNAIL instances are the associated images "label", "macro"
// and "thumbnail" (OpenSlide's names). Tiles: TILED_FULL (frame = row × tiles across + column, first optical path
// and focal plane) or TILED_SPARSE (positions from each frame's Plane Position (Slide) sequence; tiles no frame
// covers read as white background and are counted). Frame boundaries come from the Basic or Extended Offset Table,
// or, when the table is empty, from one walk over the fragments when the file is opened (one fragment per frame
// when the counts agree; otherwise a frame starts at each fragment that begins with a JPEG, JPEG-LS or JPEG 2000
// start marker). Nothing is looked up per tile but the frame's fragments.
//
// Colour: JPEG frames are decoded as their headers say (JFIF or Adobe markers, component ids), as libjpeg does,
// also when Photometric Interpretation says RGB over YCbCr-coded frames (many converters write that); an
// uncompressed frame is converted from its Photometric Interpretation (RGB, YBR_FULL, YBR_FULL_422, MONOCHROME1/2)
// and planar configuration. An ICC profile is kept (its size is reported) but not applied.
//
// Resolution: Pixel Spacing (mm) of the shared functional groups, else of the first frame's; else Imaged Volume
// Width/Height ÷ total pixel matrix, with a note; else none (the Slide's assume_mpp rule applies).
//
// Damaged data is an error, never data: an unparsable or truncated file, a frame count that disagrees with the
// pixel data, a frame whose decode fails or warns, throw core::InputError / core::CorruptTileError naming the file
// (and frame).
//
// Thread safety: read() and read_associated() may be called from several threads. Each instance's DCMTK object
// is read under its own mutex (only the frame's bytes are fetched under it); decoding runs outside it. Decoded
// frames are kept in a TileCache (io/tile_cache.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::io {

// Whether Slide::open should read `path` as DICOM: a folder, or a file with the DICOM preamble ("DICM" at byte 128).
bool looks_like_dicom(const std::string& path);

// The slide id of a DICOM series given as `path` (a folder or one file): the folder's name, or the Series Instance UID
// when the folder holds several series. Never throws: a series that cannot be read gets its folder's name.
std::string dicom_slide_id(const std::string& path);

class DicomSlide {
 public:
  struct Level {
    std::int64_t width = 0;
    std::int64_t height = 0;
    double downsample = 1.0;
    int tile_width = 0;
    int tile_height = 0;
    std::string file;
    std::string transfer_syntax;     // e.g. "JPEG Baseline"
    std::int64_t frames = 0;         // frames of the first optical path and focal plane
    std::int64_t missing_tiles = 0;  // TILED_SPARSE: tiles no frame covers (read as background)
    bool sparse = false;
  };
  struct Associated {
    std::string name;  // label, macro, thumbnail
    std::int64_t width = 0;
    std::int64_t height = 0;
    std::string file;
  };

  static constexpr std::size_t kCacheBytes = std::size_t{64} << 20;

  // Opens the series `path` names (a folder or one file of it). Throws core::InputError naming the file and the
  // problem; see the header comment.
  static std::unique_ptr<DicomSlide> open(const std::string& path, std::size_t cache_bytes = kCacheBytes);
  ~DicomSlide();
  DicomSlide(const DicomSlide&) = delete;
  DicomSlide& operator=(const DicomSlide&) = delete;

  // The slide id: the folder's name, or the Series Instance UID when the folder holds several series.
  const std::string& id() const;
  const std::vector<Level>& levels() const;
  const std::vector<Associated>& associated() const;
  // µm per level-0 pixel (x, y), when the series records it; mpp_origin() says from what.
  std::optional<double> mpp_x() const;
  std::optional<double> mpp_y() const;
  const std::string& mpp_origin() const;
  // dicom.* properties (UIDs, transfer syntaxes, photometric interpretation, optical paths, ICC profile size...).
  const std::map<std::string, std::string>& properties() const;
  // What a reader of the series should know: imperfections tolerated (no optical path sequence, a Frame of
  // Reference UID per level...), files ignored, optical paths and focal planes not used.
  const std::vector<std::string>& notes() const;
  // The ICC profile of the first optical path (or of the data set), byte for byte; empty when the series has none.
  // Kept for a caller that manages colour; the pixels read() returns are as encoded, the profile not applied.
  const std::string& icc_profile() const;
  // "JPEG Baseline frames", "JPEG 2000, JPEG Baseline frames"...
  const std::string& description() const;

  // Level pixels [lx, lx+width) × [ly, ly+height) as RGB CV_8UC3, white outside the level and on missing tiles.
  cv::Mat read(int level, std::int64_t lx, std::int64_t ly, int width, int height) const;
  // The whole associated image `name` (one of associated()).
  cv::Mat read_associated(const std::string& name) const;
  // Bytes of decoded frames held in the cache now.
  std::size_t cached_bytes() const;

 private:
  struct Impl;
  explicit DicomSlide(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
