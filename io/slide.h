// Whole-slide image reader over OpenSlide.
//
// Coordinates are level-0 pixels (x, y) of a region's top-left corner, as everywhere in Tessera.
// Pixels come back as 8-bit RGB cv::Mat (CV_8UC3, R-G-B channel order); transparent pixels (outside the
// scanned area) become white background.
//
// Resolution: mpp() follows the chain of docs/ARCHITECTURE.md ("Slide geometry") — the `openslide.mpp-x` property, else
// the TIFF resolution tags with their unit (`tiff.XResolution` + `tiff.ResolutionUnit`), else the caller's
// `assume_mpp`; with none of those, open() throws a core::InputError naming the slide and the setting — unless
// SlideOpenOptions::require_mpp is false (`tessera info`, which describes such a slide): the slide then opens with
// MppSource::unknown, has_mpp() is false, mpp_problem() says why, and everything that needs the resolution (mpp(),
// mpp_y(), best_level_for_mpp(), read_at_mpp(), SlideWindow) throws that same error. Nothing guesses a resolution.
// read_at_mpp() reads a region at a target µm/px from the best level at or above that resolution and
// resamples with area averaging; pyramid downsamples are used as OpenSlide reports them (they need not be
// powers of two).
//
// DICOM: a folder holding a DICOM whole-slide image series, or one file of it, is read by io::DicomSlide (vendor
// "dicom"; µm/px from Pixel Spacing or Imaged Volume, MppSource::dicom), with the same region semantics as the
// direct TIFF path below.
//
// Direct TIFF path: for the vendors whose levels are plain tiled TIFF directories (`generic-tiff`, `aperio`),
// read_region() decodes the touched tiles with libtiff (TiffTileReader: JPEG, deflate, LZW or uncompressed RGB
// tiles, with a 64 MB cache of decoded tiles) instead of going through OpenSlide's cairo compositing, which is
// many times slower. Anything else — other vendors, JPEG 2000 tiles (Aperio compression 33003/33005), other
// sample layouts, a file libtiff cannot open — reads through OpenSlide; SlideOpenOptions::direct_tiff = false
// forces OpenSlide, and reader() says which path a slide uses.
// The two paths give the same pixels (tests compare them pixel for pixel, JPEG included: both decode with
// libjpeg and its default upsampling) wherever OpenSlide places the region on the level's pixel grid, i.e. at
// level 0 and on levels whose downsample is an integer when x and y are multiples of it. On a level whose
// downsample is not an integer (odd-sized slides: 1.99871, 2.99925...) OpenSlide puts level pixel x/downsample
// at a fractional position and interpolates between neighbours; the direct path returns the level pixels from
// round(x/downsample), unresampled — what read_level_window() means to read, so that SlideWindow and per-tile
// reads agree exactly on such levels too. One more difference is OpenSlide's: on a non-JPEG level smaller than one
// tile, OpenSlide 3.4.1 with libtiff 4.5 (Debian 12) misplaces the rows (../shared/data's boxes.tiff: level 2 comes
// back 2 rows low, level 3 empty); the direct path reads what libtiff decodes from the tiles.
//
// Damaged pixels are an error, never data: a region whose tiles the decoder rejects or warns about (libjpeg's
// "Corrupt JPEG data" is a warning) throws core::CorruptTileError naming the file, level, region and the decoder's
// message, on both paths. OpenSlide 3.4.1's errors are sticky (every later call on that handle fails), so after
// a failed read the slide reopens its OpenSlide handle: the next read of an intact region works.
//
// Thread safety: every read method is const and may be called from several threads at once. OpenSlide handles
// are thread-safe; reads share the handle under a shared lock, and a failed read is retried alone on a fresh
// handle (exclusive lock), so that one thread's damaged tile never fails another thread's read. The direct path
// gives each concurrent read its own libtiff handle from a pool and guards its tile cache with a mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "io/tiff_reader.h"

typedef struct _openslide openslide_t;

namespace tessera::io {

class DicomSlide;

struct SlideLevel {
  std::int64_t width = 0;
  std::int64_t height = 0;
  double downsample = 1.0;
  std::int64_t tile_width = 0;  // 0 when the format does not report it
  std::int64_t tile_height = 0;
};

enum class MppSource { openslide_property, tiff_resolution, dicom, assumed, unknown };
const char* to_string(MppSource source);

struct SlideOpenOptions {
  // Used only when the slide itself carries no resolution. 0 = none (missing resolution is an error).
  double assume_mpp = 0.0;
  // Read generic-tiff and aperio slides by decoding their TIFF tiles directly (see above); false = always
  // OpenSlide (to compare both, or to rule the direct path out).
  bool direct_tiff = true;
  // false: a slide with no resolution (and no assume_mpp) opens anyway, with MppSource::unknown (see above).
  bool require_mpp = true;
};

// What reading the regions of a slide read directly from its TIFF tiles needs (Slide::layout), so that a job that
// opened it once (the tile job's planning) can open it again for reads alone (Slide::reopen, its extraction, possibly
// on another rank): without OpenSlide and without walking the file's TIFF directories again.
struct SlideLayout {
  std::string path;
  std::string vendor;
  std::vector<SlideLevel> levels;
  double mpp_x = 0.0;
  double mpp_y = 0.0;
  MppSource mpp_source = MppSource::unknown;
  std::vector<TiffTileReader::LevelLayout> tiff;  // per level
  bool missing_tiles_blank = false;
  // The file as open() found it: reopen() refuses a file whose size or modification time differs (not the inode,
  // which differs between copies of the same file on each node).
  std::int64_t file_size = -1;
  std::int64_t file_mtime_ns = 0;
};

class Slide {
 public:
  // Throws core::FileNotFoundError (missing), core::InputError "permission denied" (not readable by this user),
  // core::InputError "too many levels of symbolic links (a symlink loop)", core::InputError "unsupported format"
  // (OpenSlide does not recognize it), core::InputError "corrupt slide: <openslide message>" (recognized but
  // unreadable), core::InputError for a missing resolution (message names the `assume_mpp` setting).
  static Slide open(const std::string& path, const SlideOpenOptions& options = {});

  // The slide of `layout` opened again for reads alone: read_region(), read_at_mpp(), SlideWindow and the geometry
  // (levels, µm/px) give exactly what the slide it was taken from gave; it has no properties, no associated images
  // (read_associated_image throws) and no OpenSlide handle. Throws what open() throws for a file that is missing or
  // not readable, core::InputError "changed since it was planned (size/mtime)" for a file whose size or
  // modification time is not the layout's; libtiff reads a level's directory when its tiles are first needed, and
  // a directory that no longer matches the layout fails that read naming the file (io/tiff_reader.h, open_known).
  static Slide reopen(const SlideLayout& layout);

  Slide(Slide&&) noexcept;
  Slide& operator=(Slide&&) noexcept;
  ~Slide();

  const std::string& path() const { return path_; }
  // The file name without directory and extension; for a DICOM series its folder's name (io/dicom_slide.h).
  std::string id() const;
  const std::string& vendor() const { return vendor_; }
  // Which path read_region() takes: "direct TIFF (JPEG tiles)", "OpenSlide", or "OpenSlide (direct TIFF not
  // used: <reason>)" for a generic-tiff or aperio slide the direct path declined.
  const std::string& reader() const { return reader_; }
  bool reads_tiff_directly() const { return tiff_ != nullptr; }
  // What reopen() needs; nullopt unless reads_tiff_directly() and the resolution is known.
  std::optional<SlideLayout> layout() const;
  bool is_dicom() const { return dicom_ != nullptr; }
  // What a reader of the slide should know that is not an error (DICOM: imperfections tolerated, files ignored,
  // optical paths not used, tiles of a sparse level missing); empty for most slides.
  const std::vector<std::string>& notes() const { return notes_; }
  int level_count() const { return static_cast<int>(levels_.size()); }
  const SlideLevel& level(int i) const;
  const std::vector<SlideLevel>& levels() const { return levels_; }
  std::int64_t width() const { return levels_.front().width; }
  std::int64_t height() const { return levels_.front().height; }

  // µm per level-0 pixel (x, y); throw the missing-resolution core::InputError when !has_mpp().
  double mpp() const {
    if (!has_mpp()) throw_unknown_mpp();
    return mpp_x_;
  }
  double mpp_y() const {
    if (!has_mpp()) throw_unknown_mpp();
    return mpp_y_;
  }
  bool has_mpp() const { return mpp_source_ != MppSource::unknown; }
  MppSource mpp_source() const { return mpp_source_; }
  // Why the slide has no resolution, e.g. "no resolution (µm/px) in the slide"; empty when has_mpp().
  const std::string& mpp_problem() const { return mpp_problem_; }
  std::optional<double> objective_power() const;

  const std::map<std::string, std::string>& properties() const { return properties_; }
  std::optional<std::string> property(const std::string& name) const;
  // Whether `tessera synth` made the slide: its marker in the properties (io/provenance.h).
  bool synthetic() const;

  struct AssociatedImage {
    std::string name;
    std::int64_t width = 0;
    std::int64_t height = 0;
  };
  const std::vector<AssociatedImage>& associated_images() const { return associated_; }
  cv::Mat read_associated_image(const std::string& name) const;

  // Reads a `width`×`height` region of `level` whose top-left is (x, y) in level-0 coordinates.
  // Regions may extend past the slide (that part is white). Errors carry file, level and region; damaged tiles
  // throw core::CorruptTileError.
  // The direct TIFF path starts at level pixel (round(x/downsample), round(y/downsample)).
  // With `into` (CV_8UC3, height × width: e.g. a header over the caller's memory), the pixels are written there and
  // `into` is returned (on the direct TIFF path without another copy).
  cv::Mat read_region(std::int64_t x, std::int64_t y, int level, std::int64_t width, std::int64_t height,
                      cv::Mat into = cv::Mat()) const;

  // The level to read for a target resolution: the coarsest level whose µm/px is ≤ target (within 1%).
  int best_level_for_mpp(double target_mpp) const;
  // Reads the region whose top-left is (x, y) (level 0) and which covers width×height pixels at
  // `target_mpp`, resampled from best_level_for_mpp() with area averaging. `into`: as for read_region().
  cv::Mat read_at_mpp(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height, double target_mpp,
                      cv::Mat into = cv::Mat()) const;

  // Where read_at_mpp() gets its pixels: a window of one level, in level pixels, and the size to resample it
  // to. Exposed so that SlideWindow can serve many reads from one OpenSlide call with identical results.
  struct LevelRead {
    int level = 0;
    std::int64_t lx = 0, ly = 0;         // top-left in level pixels
    std::int64_t lw = 0, lh = 0;         // size in level pixels
    std::int64_t width = 0, height = 0;  // output size (== lw, lh when no resampling is needed)
  };
  LevelRead plan_read_at_mpp(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height,
                             double target_mpp) const;

  // A whole-slide thumbnail whose longer side is at most `max_side` pixels, read from the smallest level
  // that is still larger than needed.
  cv::Mat thumbnail(int max_side) const;

 private:
  friend class SlideWindow;
  cv::Mat read_level_window(const LevelRead& r, cv::Mat into = cv::Mat()) const;
  struct OpenSlideHandle;
  Slide();
  static Slide open_dicom(const std::string& path, const SlideOpenOptions& options);
  [[noreturn]] void throw_unknown_mpp() const;
  std::string path_;
  std::string vendor_;
  std::unique_ptr<OpenSlideHandle> osr_;
  std::unique_ptr<TiffTileReader> tiff_;  // the direct path; null = OpenSlide
  std::unique_ptr<DicomSlide> dicom_;     // a DICOM series (then osr_ and tiff_ are null)
  std::vector<std::string> notes_;
  std::string reader_ = "OpenSlide";
  std::vector<SlideLevel> levels_;
  std::map<std::string, std::string> properties_;
  std::vector<AssociatedImage> associated_;
  double mpp_x_ = 0.0;
  double mpp_y_ = 0.0;
  MppSource mpp_source_ = MppSource::openslide_property;
  std::string mpp_problem_;
  std::int64_t file_size_ = -1;  // the file's size and modification time when open() began (SlideLayout)
  std::int64_t file_mtime_ns_ = 0;
};

// One read of a level window kept in memory, from which read_at_mpp() requests that fall inside it are served
// with exactly the pixels Slide::read_at_mpp() would return — one OpenSlide call for a whole row of tiles
// instead of one per tile (OpenSlide's per-call overhead dominates small tiles). Holds a reference to the slide.
class SlideWindow {
 public:
  // The window covering the level-0 rectangle (x, y, width0, height0) at `target_mpp`'s level.
  SlideWindow(const Slide& slide, std::int64_t x, std::int64_t y, std::int64_t width0, std::int64_t height0,
              double target_mpp);
  // Whether a read_at_mpp() request lies inside the window.
  bool contains(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height, double target_mpp) const;
  // Same result as slide.read_at_mpp(); requires contains().
  cv::Mat read_at_mpp(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height, double target_mpp) const;

 private:
  const Slide* slide_;
  Slide::LevelRead window_;
  cv::Mat pixels_;
};

}  // namespace tessera::io
