// Direct reader of the pyramid levels of tiled TIFF slides (libtiff), used by Slide under read_region() for the
// OpenSlide vendors whose levels are plain tiled TIFF directories (`generic-tiff`, `aperio`).
//
// Why: OpenSlide composites every region through cairo in premultiplied ARGB; decoding the tiles and copying
// them into an RGB region is many times faster and gives the same pixels (see Slide's header for the one
// difference: OpenSlide's sub-pixel placement on levels whose downsample is not an integer).
//
// Level i is the first tiled directory (in file order, not taken by an earlier level) whose width × height is
// level i's as OpenSlide reports it; stripped directories (Aperio thumbnail, label, macro) are skipped. Every
// level must be 8-bit, 3 samples, contiguous, unsigned, top-left oriented, compressed with JPEG (YCbCr,
// decoded to RGB by libjpeg through libtiff's JPEGCOLORMODE_RGB, or RGB), deflate, LZW or none (RGB);
// otherwise open() declines with the reason and the caller keeps OpenSlide (e.g. JPEG 2000, compression
// 33003/33005, in some Aperio files).
//
// Regions: read(level, lx, ly, w, h) returns level pixels [lx, lx+w) × [ly, ly+h) as RGB CV_8UC3; pixels
// outside the level (negative or past the edge, including the padding of partial edge tiles) are white, as
// OpenSlide's transparent pixels become white in Slide.
//
// Decoded tiles are kept in an LRU cache of at most kCacheBytes per reader, so the tiles that neighbouring
// regions share are decoded once.
//
// Thread safety: read() may be called from many threads at once. A TIFF* is not thread-safe (it holds the
// current directory and codec state), so the reader keeps a pool of handles: each read takes one for itself
// (opening another when all are busy) and gives it back afterwards; the pool grows to the number of threads
// that read at the same time. The cache has its own mutex; a thread that needs a tile another thread is decoding
// waits for that decode (io/tile_cache.h) rather than decode it again. libtiff's error and warning messages go to
// per-handle callbacks (TIFFOpenOptions), never to process-wide state, so a thread only ever sees its own decode's
// messages; a handle whose decode failed is closed, not returned to the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::io {

struct TiffLevelSize {
  std::int64_t width = 0;
  std::int64_t height = 0;
};

class TiffTileReader {
 public:
  static constexpr std::size_t kCacheBytes = std::size_t{64} << 20;

  // Where a level's tiles are, as open() found them: enough to read them again without walking the file's
  // directories (open_known).
  struct LevelLayout {
    std::uint32_t directory = 0;  // TIFF directory
    std::int64_t width = 0;
    std::int64_t height = 0;
    std::uint32_t tile_width = 0;
    std::uint32_t tile_height = 0;
    std::uint16_t compression = 0;  // TIFF compression tag
    bool jpeg_ycbcr = false;        // YCbCr JPEG, decoded to RGB by libjpeg
  };

  // The reader for `path` whose pyramid levels have `levels` sizes (level 0 first), or nullptr when some level
  // cannot be read directly; `why_not` then says why ("level 0: JPEG 2000 tiles (compression 33003)").
  // `missing_tiles_blank`: a tile with no bytes reads as white instead of failing (Aperio scanners leave such
  // tiles and OpenSlide's aperio driver shows them blank). `cache_bytes` bounds the decoded-tile cache (Slide
  // uses the default; tests make it small to exercise eviction). Never throws for a file it cannot use.
  static std::unique_ptr<TiffTileReader> open(const std::string& path, const std::vector<TiffLevelSize>& levels,
                                              bool missing_tiles_blank, std::string& why_not,
                                              std::size_t cache_bytes = kCacheBytes);
  // The reader of a file open() accepted with these `levels` (layout()), without reading the file now: each level's
  // directory is read when its tiles are first needed (libtiff reads only that directory, not the others), and
  // checked against its layout then: a file changed since (another size, tiles or compression) fails that read
  // with a core::InputError naming the file.
  static std::unique_ptr<TiffTileReader> open_known(const std::string& path, const std::vector<LevelLayout>& levels,
                                                    bool missing_tiles_blank, std::size_t cache_bytes = kCacheBytes);
  ~TiffTileReader();
  TiffTileReader(const TiffTileReader&) = delete;
  TiffTileReader& operator=(const TiffTileReader&) = delete;

  // Level pixels [lx, lx+width) × [ly, ly+height) as RGB CV_8UC3, white outside the level. width, height ≥ 1.
  // With `into` (CV_8UC3, height × width: e.g. a header over the caller's memory) they are written there, the only
  // copy made of the decoded tiles' pixels, and `into` is returned.
  // Throws core::CorruptTileError naming the file, the tile, the level and its TIFF directory, and the decoder's
  // message when a tile's decode fails or warns: libjpeg reports damaged entropy-coded data ("Corrupt JPEG data: ...")
  // only as a warning and returns made-up pixels, which must never pass for the slide's.
  cv::Mat read(int level, std::int64_t lx, std::int64_t ly, int width, int height, cv::Mat into = cv::Mat()) const;

  // The tile encodings, e.g. "JPEG tiles" or "JPEG, deflate tiles" (levels may differ).
  const std::string& description() const;
  // Every level's layout, for open_known().
  std::vector<LevelLayout> layout() const;
  bool missing_tiles_blank() const;
  // The TIFF directory that holds `level`.
  int directory(int level) const;
  // Bytes of decoded tiles held in the cache now (≤ cache_bytes).
  std::size_t cached_bytes() const;

 private:
  struct Impl;
  explicit TiffTileReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
