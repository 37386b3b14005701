#include "io/tiff_writer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <future>
#include <system_error>
#include <unordered_map>

#include <libdeflate.h>
#include <tiffio.h>
#include <opencv2/imgproc.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace tessera::io {
namespace {

constexpr double kMicronsPerCentimetre = 10000.0;
// Aperio scanners store a thumbnail of about 1024 px on its longer side as the second directory.
constexpr int kThumbnailMaxSide = 1024;
// Stripped directories (thumbnail, label, macro): rows per strip, a multiple of 16 as JPEG with 2×2
// chroma subsampling needs.
constexpr std::uint32_t kAssociatedRowsPerStrip = 64;
// Classic TIFF offsets are 32-bit. The estimate is the uncompressed size, so a slide that would come close
// to 4 GiB even uncompressed (incompressible data, tile tables, directories) switches to BigTIFF early.
constexpr std::uint64_t kClassicTiffLimit = (std::uint64_t{4} << 30) - (std::uint64_t{128} << 20);
constexpr int kMaxLevelFactor = 8;
constexpr int kTileAlignment = 16;
constexpr const char* kAperioPrefix = "Aperio Image Library Tessera";
// write_tiles() deflates its tiles itself, as libtiff's codec does for PREDICTOR_HORIZONTAL at its default
// ZIPQUALITY, so that tiles can be compressed on several threads and appended raw, in tile order. libtiff 4.5 built
// with libdeflate (Debian 12's) compresses a whole tile with libdeflate at level 7: the same bytes as here.
constexpr int kDeflateLevel = 7;
constexpr int kSamplesPerPixel = 3;
// Distinct tiles each thread compresses before a batch is appended: memory stays a few tiles per thread, and a batch
// is long enough (about 15 ms a thread at 0.9 ms a tile) that starting its threads costs nothing measurable.
constexpr std::size_t kTilesPerThreadBatch = 16;

// libtiff reports problems through callbacks; each open file keeps its last message so the exception can say
// why (disk full, bad tag) instead of libtiff printing to stderr.
struct TiffFile {
  std::string path;
  std::string last_error;
  TIFF* tif = nullptr;

  TiffFile() = default;
  TiffFile(const TiffFile&) = delete;
  TiffFile& operator=(const TiffFile&) = delete;
  ~TiffFile() { close(); }

  void close() {
    if (tif != nullptr) TIFFClose(tif);
    tif = nullptr;
  }
};

int on_tiff_error(TIFF*, void* user_data, const char* module, const char* fmt, va_list ap) {
  std::array<char, 1024> buffer{};
  std::vsnprintf(buffer.data(), buffer.size(), fmt, ap);
  auto* file = static_cast<TiffFile*>(user_data);
  file->last_error =
      module != nullptr && *module != '\0' ? std::string(module) + ": " + buffer.data() : std::string(buffer.data());
  return 1;  // handled: do not also print
}

int on_tiff_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

// Opens `file.path` with `mode`; the TiffFile must stay at its address while open (it receives messages).
void open_tiff(TiffFile& file, const char* mode) {
  TIFFOpenOptions* options = TIFFOpenOptionsAlloc();
  TIFFOpenOptionsSetErrorHandlerExtR(options, on_tiff_error, &file);
  TIFFOpenOptionsSetWarningHandlerExtR(options, on_tiff_warning, &file);
  file.tif = TIFFOpenExt(file.path.c_str(), mode, options);
  TIFFOpenOptionsFree(options);
  if (file.tif == nullptr) {
    core::InternalError error("libtiff cannot open the file" +
                              (file.last_error.empty() ? std::string() : ": " + file.last_error));
    error.add_context("file", file.path);
    throw error;
  }
}

[[noreturn]] void fail(const TiffFile& file, const std::string& what) {
  core::InternalError error(what + (file.last_error.empty() ? std::string() : ": " + file.last_error));
  error.add_context("file", file.path);
  throw error;
}

template <typename... Args>
void set_field(const TiffFile& file, std::uint32_t tag, Args... args) {
  if (TIFFSetField(file.tif, tag, args...) != 1) fail(file, "cannot set TIFF tag " + std::to_string(tag));
}

// Shortest round-trip decimal, independent of the C locale (OpenSlide parses with g_ascii_strtod).
std::string format_number(double value) {
  std::array<char, 64> buffer{};
  auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return ec == std::errc() ? std::string(buffer.data(), end) : std::to_string(value);
}

std::string dims(std::int64_t w, std::int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

// OpenSlide splits the Aperio description on '|' and takes the first word of the second line as an associated
// image's name, so free text must not contain either separator.
std::string sanitize_description(std::string text) {
  for (char& c : text) {
    if (c == '|' || c == '\r' || c == '\n') c = ' ';
  }
  return text;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

struct DeflateCompressorFree {
  void operator()(libdeflate_compressor* compressor) const { libdeflate_free_compressor(compressor); }
};
using DeflateCompressor = std::unique_ptr<libdeflate_compressor, DeflateCompressorFree>;

// One RGB tile (continuous CV_8UC3) as libtiff stores it with PREDICTOR_HORIZONTAL: in each row, every sample minus
// the same sample of the pixel before it (the first pixel as it is), then deflated in zlib format into `out`.
// `differences` is scratch space.
void deflate_tile(libdeflate_compressor* compressor, const cv::Mat& tile, std::vector<unsigned char>& differences,
                  std::vector<unsigned char>& out) {
  const auto row_bytes = static_cast<std::size_t>(tile.cols) * kSamplesPerPixel;
  differences.resize(row_bytes * static_cast<std::size_t>(tile.rows));
  for (int y = 0; y < tile.rows; ++y) {
    const unsigned char* in = tile.ptr<unsigned char>(y);
    unsigned char* d = differences.data() + row_bytes * static_cast<std::size_t>(y);
    for (std::size_t x = 0; x < kSamplesPerPixel && x < row_bytes; ++x) d[x] = in[x];
    for (std::size_t x = kSamplesPerPixel; x < row_bytes; ++x) {
      d[x] = static_cast<unsigned char>(in[x] - in[x - kSamplesPerPixel]);
    }
  }
  out.resize(libdeflate_zlib_compress_bound(compressor, differences.size()));
  const std::size_t bytes =
      libdeflate_zlib_compress(compressor, differences.data(), differences.size(), out.data(), out.size());
  // The bound is the worst case, so this cannot happen short of a libdeflate defect.
  if (bytes == 0) throw core::InternalError("libdeflate could not compress a tile into its bound");
  out.resize(bytes);
}

}  // namespace

struct TiffWriter::Impl {
  // One pyramid level: where its tiles go, the rows waiting to fill a row of tiles, and the rows waiting to be
  // downsampled into the next level (fewer than level_factor).
  struct Level {
    std::int64_t width = 0;
    std::int64_t height = 0;
    int tile_width = 0;  // tile_size, or less for a level smaller than a tile (see the constructor)
    int tile_height = 0;
    TiffFile file;                  // level 0: the output itself; others: a temporary TIFF beside it
    cv::Mat tile_rows;              // tile_height × width, allocated on first use
    int buffered = 0;               // rows in tile_rows
    std::int64_t rows_in = 0;       // rows received so far
    std::int64_t rows_encoded = 0;  // rows written as tiles
    cv::Mat pending;                // rows not yet downsampled (< level_factor)
    cv::Mat tile;                   // one tile, reused for every encode
  };

  struct Associated {
    std::string name;
    cv::Mat image;
  };

  std::string path;
  std::string temp_path;
  TiffWriterOptions options;
  bool bigtiff = false;
  std::vector<std::unique_ptr<Level>> levels;
  int thumbnail_level = -1;  // aperio: the level whose pixels the thumbnail is made from
  cv::Mat thumbnail_source;  // that level, whole (at most about kThumbnailMaxSide² pixels)
  std::vector<Associated> associated;
  bool finished = false;

  Impl(const std::string& output, std::int64_t width, std::int64_t height, const TiffWriterOptions& opts);
  ~Impl();

  [[noreturn]] void bad_call(const std::string& what) const {
    core::InternalError error(what);
    error.add_context("file", path);
    throw error;
  }

  std::string compression_text() const {
    return options.compression == TiffCompression::jpeg ? "JPEG/RGB Q=" + std::to_string(options.jpeg_quality)
                                                        : std::string("Deflate/RGB");
  }

  std::string level_description(std::size_t k) const;
  // tile_width 0 = stripped; downsample 0 = no resolution tags; encoding = set libjpeg's pseudo-tags.
  void set_image_tags(const TiffFile& file, std::int64_t width, std::int64_t height, int tile_width, int tile_height,
                      bool encoding, double downsample_x, double downsample_y, std::uint32_t subfile_type,
                      const std::string& description) const;
  void push_rows(std::size_t k, const cv::Mat& rows);
  void encode_rows(Level& level, const cv::Mat& rows);
  void encode_tile_row(Level& level, const cv::Mat& rows);
  void downsample_rows(std::size_t k, const cv::Mat& rows);
  void flush(std::size_t k);
  cv::Mat downsample_block(const cv::Mat& block) const;
  void write_stripped(const TiffFile& out, const cv::Mat& image, const std::string& description);
  void append_level(const TiffFile& out, std::size_t k);
  void remove_temporaries() noexcept;
  void open_level(std::size_t k);
  void set_level_tags(const TiffFile& file, std::size_t k) const;
  void write_source_level(const TiffFile& out, std::size_t k, TileSource& source);
  void append_batch(const TiffFile& out, std::size_t k);
  cv::Mat thumbnail_from(TileSource& source);
  void write_thumbnail(const TiffFile& out, const cv::Mat& source);

  // write_tiles(): the tiles stored so far by key (their offset and size in the output, set once appended), and the
  // counts.
  struct StoredTile {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
  };
  std::unordered_map<std::string, StoredTile> stored;
  // write_tiles(): distinct tiles rendered and waiting to be compressed and appended (the first `batched` of `batch`,
  // whose buffers are reused), and each thread's compressor and scratch space.
  struct PendingTile {
    std::uint32_t index = 0;
    StoredTile* stored = nullptr;  // its entry in `stored` (unordered_map entries stay where they are)
    cv::Mat pixels;
    std::vector<unsigned char> bytes;
  };
  std::vector<PendingTile> batch;
  std::size_t batched = 0;
  std::vector<DeflateCompressor> compressors;
  std::vector<std::vector<unsigned char>> scratch;
  bool strips_started = false;
  bool tiles_written = false;
  std::int64_t tiles_stored = 0;
  std::int64_t tiles_total = 0;
};

TiffWriter::Impl::Impl(const std::string& output, std::int64_t width, std::int64_t height,
                       const TiffWriterOptions& opts)
    : path(output), temp_path(core::temporary_name(output)), options(opts) {
  const auto invalid = [&](const std::string& what) { bad_call("invalid TIFF writer setting: " + what); };
  if (width <= 0 || height <= 0 || width > UINT32_MAX || height > UINT32_MAX) {
    invalid("image size " + dims(width, height));
  }
  if (options.tile_size < kTileAlignment || options.tile_size % kTileAlignment != 0) {
    invalid("tile_size " + std::to_string(options.tile_size) + " (a positive multiple of 16)");
  }
  if (options.level_factor < 2 || options.level_factor > kMaxLevelFactor) {
    invalid("level_factor " + std::to_string(options.level_factor) + " (2..8)");
  }
  if (options.min_level_size < 1) invalid("min_level_size " + std::to_string(options.min_level_size));
  if (!(options.mpp > 0.0) || !std::isfinite(options.mpp)) invalid("mpp " + format_number(options.mpp));
  if (options.jpeg_quality < 1 || options.jpeg_quality > 100) {
    invalid("jpeg_quality " + std::to_string(options.jpeg_quality) + " (1..100)");
  }
  if (options.threads < 1) invalid("threads " + std::to_string(options.threads) + " (at least 1)");

  // Pyramid geometry: each level is ceil(previous / factor) while either side is above min_level_size.
  std::uint64_t estimated_bytes = 0;
  std::int64_t w = width;
  std::int64_t h = height;
  for (;;) {
    auto level = std::make_unique<Level>();
    level->width = w;
    level->height = h;
    // OpenSlide 3.4.1 decodes non-JPEG tiles with TIFFRGBAImageGet() at the full tile size, and libtiff 4.5
    // shrinks that raster to the image when the image is smaller than a tile, which garbles the level
    // (rows skewed, content shifted down). A level smaller than a tile therefore gets the largest tile (a
    // multiple of 16) that fits; JPEG is decoded differently but gets the same layout for simplicity.
    const auto fitting = [&](std::int64_t side) {
      const std::int64_t largest = std::max<std::int64_t>(kTileAlignment, side / kTileAlignment * kTileAlignment);
      return static_cast<int>(std::min<std::int64_t>(options.tile_size, largest));
    };
    level->tile_width = fitting(w);
    level->tile_height = fitting(h);
    estimated_bytes += static_cast<std::uint64_t>(w) * static_cast<std::uint64_t>(h) * 3;
    levels.push_back(std::move(level));
    if (w <= options.min_level_size && h <= options.min_level_size) break;
    w = ceil_div(w, options.level_factor);
    h = ceil_div(h, options.level_factor);
  }
  bigtiff = estimated_bytes > kClassicTiffLimit;

  if (options.flavor == TiffFlavor::aperio) {
    thumbnail_level = static_cast<int>(levels.size()) - 1;
    for (std::size_t k = 0; k < levels.size(); ++k) {
      if (std::max(levels[k]->width, levels[k]->height) <= kThumbnailMaxSide) {
        thumbnail_level = static_cast<int>(k);
        break;
      }
    }
    const Level& source = *levels[static_cast<std::size_t>(thumbnail_level)];
    thumbnail_source.create(static_cast<int>(source.height), static_cast<int>(source.width), CV_8UC3);
  }

  // The output now; the lower levels' temporary files when the first strip comes (write_tiles() needs none).
  try {
    open_level(0);
  } catch (...) {
    remove_temporaries();
    throw;
  }
}

void TiffWriter::Impl::open_level(std::size_t k) {
  Level& level = *levels[k];
  level.file.path = k == 0 ? temp_path : temp_path + ".level" + std::to_string(k);
  open_tiff(level.file, bigtiff ? "w8" : "w");
  set_level_tags(level.file, k);
}

void TiffWriter::Impl::set_level_tags(const TiffFile& file, std::size_t k) const {
  const Level& base = *levels.front();
  const Level& level = *levels[k];
  set_image_tags(file, level.width, level.height, level.tile_width, level.tile_height, /*encoding=*/true,
                 static_cast<double>(base.width) / static_cast<double>(level.width),
                 static_cast<double>(base.height) / static_cast<double>(level.height),
                 k == 0 ? 0 : FILETYPE_REDUCEDIMAGE, level_description(k));
}

TiffWriter::Impl::~Impl() {
  if (!finished) remove_temporaries();
}

void TiffWriter::Impl::remove_temporaries() noexcept {
  std::error_code ec;
  for (auto& level : levels) {
    level->file.close();
    if (!level->file.path.empty()) std::filesystem::remove(level->file.path, ec);
  }
  std::filesystem::remove(temp_path, ec);
}

std::string TiffWriter::Impl::level_description(std::size_t k) const {
  const Level& base = *levels.front();
  const Level& level = *levels[k];
  if (options.flavor == TiffFlavor::generic) return k == 0 ? options.description : std::string();
  // The layout of a real Aperio description; OpenSlide needs the "Aperio" prefix and parses the
  // "key = value" fields after '|' into aperio.* properties (MPP → openslide.mpp-x, AppMag →
  // openslide.objective-power).
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) about a chain of operator+ here.
  std::string text(kAperioPrefix);
  for (const std::string& piece :
       {std::string("\r\n"), dims(base.width, base.height), std::string(" [0,0 "), dims(base.width, base.height),
        std::string("] ("), dims(base.tile_width, base.tile_height), std::string(")")}) {
    text += piece;
  }
  if (k > 0) {
    text += " -> ";
    text += dims(level.width, level.height);
  }
  text += ' ';
  text += compression_text();
  if (k == 0) {
    text += "|AppMag = ";
    text += format_number(options.objective_power);
    text += "|MPP = ";
    text += format_number(options.mpp);
    if (!options.description.empty()) {
      text += "|Description = ";
      text += sanitize_description(options.description);
    }
  }
  return text;
}

void TiffWriter::Impl::set_image_tags(const TiffFile& file, std::int64_t width, std::int64_t height, int tile_width,
                                      int tile_height, bool encoding, double downsample_x, double downsample_y,
                                      std::uint32_t subfile_type, const std::string& description) const {
  set_field(file, TIFFTAG_SUBFILETYPE, subfile_type);
  set_field(file, TIFFTAG_IMAGEWIDTH, static_cast<std::uint32_t>(width));
  set_field(file, TIFFTAG_IMAGELENGTH, static_cast<std::uint32_t>(height));
  set_field(file, TIFFTAG_BITSPERSAMPLE, 8);
  set_field(file, TIFFTAG_SAMPLESPERPIXEL, 3);
  set_field(file, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  if (tile_width > 0) {
    set_field(file, TIFFTAG_TILEWIDTH, static_cast<std::uint32_t>(tile_width));
    set_field(file, TIFFTAG_TILELENGTH, static_cast<std::uint32_t>(tile_height));
  } else {
    set_field(file, TIFFTAG_ROWSPERSTRIP, kAssociatedRowsPerStrip);
  }
  if (options.compression == TiffCompression::jpeg) {
    set_field(file, TIFFTAG_COMPRESSION, COMPRESSION_JPEG);
    set_field(file, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_YCBCR);
    set_field(file, TIFFTAG_YCBCRSUBSAMPLING, 2, 2);
    if (encoding) {
      // libjpeg converts our RGB to YCbCr; pseudo-tags, not stored in the file.
      set_field(file, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
      set_field(file, TIFFTAG_JPEGQUALITY, options.jpeg_quality);
    }
  } else {
    set_field(file, TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
    set_field(file, TIFFTAG_PHOTOMETRIC, PHOTOMETRIC_RGB);
    set_field(file, TIFFTAG_PREDICTOR, PREDICTOR_HORIZONTAL);
  }
  if (downsample_x > 0.0 && downsample_y > 0.0) {
    set_field(file, TIFFTAG_XRESOLUTION, kMicronsPerCentimetre / (options.mpp * downsample_x));
    set_field(file, TIFFTAG_YRESOLUTION, kMicronsPerCentimetre / (options.mpp * downsample_y));
    set_field(file, TIFFTAG_RESOLUTIONUNIT, RESUNIT_CENTIMETER);
  }
  if (!options.software.empty()) set_field(file, TIFFTAG_SOFTWARE, options.software.c_str());
  if (!description.empty()) set_field(file, TIFFTAG_IMAGEDESCRIPTION, description.c_str());
}

void TiffWriter::Impl::push_rows(std::size_t k, const cv::Mat& rows) {
  Level& level = *levels[k];
  if (static_cast<int>(k) == thumbnail_level) {
    const int first = static_cast<int>(level.rows_in);
    rows.copyTo(thumbnail_source.rowRange(first, first + rows.rows));
  }
  level.rows_in += rows.rows;
  encode_rows(level, rows);
  if (k + 1 < levels.size()) downsample_rows(k, rows);
}

void TiffWriter::Impl::encode_rows(Level& level, const cv::Mat& rows) {
  const int tile_height = level.tile_height;
  // A whole row of tiles (the usual case for level 0) is encoded straight from the caller's rows.
  if (level.buffered == 0 &&
      (rows.rows == tile_height || (rows.rows < tile_height && level.rows_encoded + rows.rows == level.height))) {
    encode_tile_row(level, rows);
    level.rows_encoded += rows.rows;
    return;
  }
  if (level.tile_rows.empty()) level.tile_rows.create(tile_height, static_cast<int>(level.width), CV_8UC3);
  int offset = 0;
  while (offset < rows.rows) {
    const int n = std::min(tile_height - level.buffered, rows.rows - offset);
    rows.rowRange(offset, offset + n).copyTo(level.tile_rows.rowRange(level.buffered, level.buffered + n));
    level.buffered += n;
    offset += n;
    if (level.buffered == tile_height || level.rows_encoded + level.buffered == level.height) {
      encode_tile_row(level, level.tile_rows.rowRange(0, level.buffered));
      level.rows_encoded += level.buffered;
      level.buffered = 0;
    }
  }
}

void TiffWriter::Impl::encode_tile_row(Level& level, const cv::Mat& rows) {
  const int tile_height = level.tile_height;
  const int tile_width = level.tile_width;
  cv::Mat& tile = level.tile;
  if (tile.empty()) tile.create(tile_height, tile_width, CV_8UC3);
  const auto tile_bytes = static_cast<tmsize_t>(tile.total() * tile.elemSize());
  const auto y0 = static_cast<std::uint32_t>(level.rows_encoded);
  for (int x0 = 0; x0 < rows.cols; x0 += tile_width) {
    const int w = std::min(tile_width, rows.cols - x0);
    const cv::Mat region = rows(cv::Rect(x0, 0, w, rows.rows));
    if (w == tile_width && rows.rows == tile_height) {
      region.copyTo(tile);
    } else {
      // Edge tiles are padded by replication: readers clip them, and a flat continuation compresses best
      // and keeps JPEG's 8×8 blocks at the edge from ringing. ISOLATED: `region` is a view into a larger
      // buffer whose other rows are stale, and OpenCV would otherwise take the border from them.
      cv::copyMakeBorder(region, tile, 0, tile_height - rows.rows, 0, tile_width - w,
                         cv::BORDER_REPLICATE | cv::BORDER_ISOLATED);
    }
    const std::uint32_t index = TIFFComputeTile(level.file.tif, static_cast<std::uint32_t>(x0), y0, 0, 0);
    if (TIFFWriteEncodedTile(level.file.tif, index, tile.data, tile_bytes) < 0) {
      fail(level.file, "cannot write tile " + std::to_string(index));
    }
  }
}

cv::Mat TiffWriter::Impl::downsample_block(const cv::Mat& block) const {
  return downsample_for_pyramid(block, options.level_factor);
}

cv::Mat downsample_for_pyramid(const cv::Mat& block, int factor) {
  cv::Mat source = block;
  const int pad_x = (factor - block.cols % factor) % factor;
  if (pad_x != 0) {
    cv::copyMakeBorder(block, source, 0, 0, 0, pad_x, cv::BORDER_REPLICATE | cv::BORDER_ISOLATED);
  }
  cv::Mat result;
  // Integer factor on a multiple of it: INTER_AREA is an exact box average.
  cv::resize(source, result, cv::Size(source.cols / factor, source.rows / factor), 0, 0, cv::INTER_AREA);
  return result;
}

void TiffWriter::Impl::downsample_rows(std::size_t k, const cv::Mat& rows) {
  Level& level = *levels[k];
  const int factor = options.level_factor;
  cv::Mat input;
  if (level.pending.empty()) {
    input = rows;
  } else {
    cv::vconcat(level.pending, rows, input);
  }
  const int usable = input.rows / factor * factor;
  cv::Mat rest = input.rowRange(usable, input.rows).clone();
  if (usable > 0) push_rows(k + 1, downsample_block(input.rowRange(0, usable)));
  level.pending = rest;
}

void TiffWriter::Impl::flush(std::size_t k) {
  Level& level = *levels[k];
  if (k + 1 < levels.size() && !level.pending.empty()) {
    // The bottom edge: replicate the last row so the block is a multiple of the factor.
    cv::Mat padded;
    cv::copyMakeBorder(level.pending, padded, 0, options.level_factor - level.pending.rows, 0, 0,
                       cv::BORDER_REPLICATE | cv::BORDER_ISOLATED);
    level.pending.release();
    push_rows(k + 1, downsample_block(padded));
  }
  if (level.rows_encoded != level.height) {
    bad_call("pyramid level " + std::to_string(k) + " got " + std::to_string(level.rows_encoded) + " of " +
             std::to_string(level.height) + " rows");
  }
  if (k + 1 < levels.size()) flush(k + 1);
}

void TiffWriter::Impl::write_stripped(const TiffFile& out, const cv::Mat& image, const std::string& description) {
  set_image_tags(out, image.cols, image.rows, /*tile_width=*/0, /*tile_height=*/0, /*encoding=*/true, 0.0, 0.0,
                 FILETYPE_REDUCEDIMAGE, description);
  cv::Mat contiguous = image.isContinuous() ? image : image.clone();
  const auto row_bytes = static_cast<std::size_t>(contiguous.cols) * 3;
  std::uint32_t strip = 0;
  for (int y = 0; y < contiguous.rows; y += static_cast<int>(kAssociatedRowsPerStrip), ++strip) {
    const int n = std::min(static_cast<int>(kAssociatedRowsPerStrip), contiguous.rows - y);
    if (TIFFWriteEncodedStrip(out.tif, strip, contiguous.ptr(y), static_cast<tmsize_t>(row_bytes * n)) < 0) {
      fail(out, "cannot write strip " + std::to_string(strip));
    }
  }
  if (TIFFWriteDirectory(out.tif) != 1) fail(out, "cannot write a TIFF directory");
}

void TiffWriter::Impl::write_thumbnail(const TiffFile& out, const cv::Mat& source) {
  cv::Mat thumbnail = source;
  const int longer = std::max(thumbnail.cols, thumbnail.rows);
  if (longer > kThumbnailMaxSide) {
    const double scale = static_cast<double>(kThumbnailMaxSide) / longer;
    const cv::Size size(std::max(1, static_cast<int>(std::lround(thumbnail.cols * scale))),
                        std::max(1, static_cast<int>(std::lround(thumbnail.rows * scale))));
    cv::resize(source, thumbnail, size, 0, 0, cv::INTER_AREA);
  }
  const Level& base = *levels.front();
  const std::string description = std::string(kAperioPrefix) + "\r\n" + dims(base.width, base.height) + " -> " +
                                  dims(thumbnail.cols, thumbnail.rows) + " " + compression_text();
  write_stripped(out, thumbnail, description);
}

void TiffWriter::Impl::append_level(const TiffFile& out, std::size_t k) {
  Level& level = *levels[k];
  // The level's own temporary file is complete; reopen it to copy its compressed tiles as they are.
  if (TIFFWriteDirectory(level.file.tif) != 1) fail(level.file, "cannot write a TIFF directory");
  level.file.close();
  open_tiff(level.file, "r");
  const Level& base = *levels.front();
  set_image_tags(out, level.width, level.height, level.tile_width, level.tile_height, /*encoding=*/false,
                 static_cast<double>(base.width) / static_cast<double>(level.width),
                 static_cast<double>(base.height) / static_cast<double>(level.height), FILETYPE_REDUCEDIMAGE,
                 level_description(k));
  if (options.compression == TiffCompression::jpeg) {
    // The tiles are abbreviated JPEG streams: they need the quantization and Huffman tables of the file
    // they were encoded in, and the colour-range tag libjpeg's encoder set.
    std::uint32_t table_bytes = 0;
    void* tables = nullptr;
    if (TIFFGetField(level.file.tif, TIFFTAG_JPEGTABLES, &table_bytes, &tables) == 1 && table_bytes > 0) {
      set_field(out, TIFFTAG_JPEGTABLES, table_bytes, tables);
    }
    float* reference = nullptr;
    if (TIFFGetField(level.file.tif, TIFFTAG_REFERENCEBLACKWHITE, &reference) == 1 && reference != nullptr) {
      set_field(out, TIFFTAG_REFERENCEBLACKWHITE, reference);
    }
  }
  std::vector<unsigned char> buffer;
  const std::uint32_t tiles = TIFFNumberOfTiles(level.file.tif);
  for (std::uint32_t t = 0; t < tiles; ++t) {
    const std::uint64_t bytes = TIFFGetStrileByteCount(level.file.tif, t);
    buffer.resize(static_cast<std::size_t>(bytes));
    if (bytes == 0 || TIFFReadRawTile(level.file.tif, t, buffer.data(), static_cast<tmsize_t>(bytes)) !=
                          static_cast<tmsize_t>(bytes)) {
      fail(level.file, "cannot read back tile " + std::to_string(t));
    }
    if (TIFFWriteRawTile(out.tif, t, buffer.data(), static_cast<tmsize_t>(bytes)) != static_cast<tmsize_t>(bytes)) {
      fail(out, "cannot copy tile " + std::to_string(t) + " of pyramid level " + std::to_string(k));
    }
  }
  if (TIFFWriteDirectory(out.tif) != 1) fail(out, "cannot write a TIFF directory");
  level.file.close();
  std::error_code ec;
  std::filesystem::remove(level.file.path, ec);
}

TiffWriter::TiffWriter(const std::string& path, std::int64_t width, std::int64_t height,
                       const TiffWriterOptions& options)
    : impl_(std::make_unique<Impl>(path, width, height, options)) {}

TiffWriter::~TiffWriter() = default;

void TiffWriter::write_strip(const cv::Mat& strip) {
  Impl& d = *impl_;
  if (d.finished) d.bad_call("write_strip() after finish()");
  const Impl::Level& base = *d.levels.front();
  const std::int64_t expected_rows = std::min<std::int64_t>(d.options.tile_size, base.height - base.rows_in);
  if (expected_rows <= 0) d.bad_call("write_strip(): all " + std::to_string(base.height) + " rows already written");
  if (strip.type() != CV_8UC3 || strip.cols != base.width || strip.rows != expected_rows) {
    d.bad_call("write_strip(): expected an RGB CV_8UC3 strip of " + dims(base.width, expected_rows) + " pixels, got " +
               dims(strip.cols, strip.rows) + " with " + std::to_string(strip.channels()) + " channel(s) of depth " +
               std::to_string(strip.depth()));
  }
  if (d.tiles_written) d.bad_call("write_strip() after write_tiles()");
  if (!d.strips_started) {
    d.strips_started = true;
    try {
      for (std::size_t k = 1; k < d.levels.size(); ++k) d.open_level(k);
    } catch (...) {
      d.remove_temporaries();
      throw;
    }
  }
  d.push_rows(0, strip);
}

void TiffWriter::Impl::write_source_level(const TiffFile& out, std::size_t k, TileSource& source) {
  const Level& level = *levels[k];
  if (k > 0) set_level_tags(out, k);
  // Allocates the level's offset arrays now: every tile of a level may point at tiles of levels before it.
  if (TIFFWriteCheck(out.tif, /*tiles=*/1, "write_tiles") != 1) {
    fail(out, "cannot start pyramid level " + std::to_string(k));
  }
  // Tiles equal to one stored before point at its bytes: their entries in the offset and byte-count arrays are set
  // once the level's distinct tiles are written, just before its directory. libtiff has no call that sets one entry,
  // but TIFFGetField hands out the arrays it writes into the directory (allocated when the first tile is written).
  std::vector<std::pair<std::uint32_t, const StoredTile*>> shared;
  std::string key;
  const std::int64_t tiles_across = ceil_div(level.width, level.tile_width);
  const std::int64_t tiles_down = ceil_div(level.height, level.tile_height);
  for (std::int64_t ty = 0; ty < tiles_down; ++ty) {
    for (std::int64_t tx = 0; tx < tiles_across; ++tx) {
      const std::int64_t x0 = tx * level.tile_width;
      const std::int64_t y0 = ty * level.tile_height;
      const auto index = TIFFComputeTile(out.tif, static_cast<std::uint32_t>(x0), static_cast<std::uint32_t>(y0), 0, 0);
      key.clear();
      source.describe_tile(static_cast<int>(k), x0, y0, level.tile_width, level.tile_height, key);
      ++tiles_total;
      const auto [entry, distinct] = stored.try_emplace(key);
      if (!distinct) {
        shared.emplace_back(index, &entry->second);
        continue;
      }
      PendingTile& pending = batch[batched++];
      pending.index = index;
      pending.stored = &entry->second;
      cv::Mat& tile = pending.pixels;
      source.render_tile(static_cast<int>(k), x0, y0, level.tile_width, level.tile_height, tile);
      if (tile.type() != CV_8UC3 || tile.cols != level.tile_width || tile.rows != level.tile_height ||
          !tile.isContinuous()) {
        bad_call("write_tiles(): the source made a tile that is not " + dims(level.tile_width, level.tile_height) +
                 " continuous RGB CV_8UC3");
      }
      ++tiles_stored;
      if (batched == batch.size()) append_batch(out, k);
    }
  }
  append_batch(out, k);
  if (!shared.empty()) {
    std::uint64_t* offsets = nullptr;
    std::uint64_t* byte_counts = nullptr;
    if (TIFFGetField(out.tif, TIFFTAG_TILEOFFSETS, &offsets) != 1 ||
        TIFFGetField(out.tif, TIFFTAG_TILEBYTECOUNTS, &byte_counts) != 1 || offsets == nullptr ||
        byte_counts == nullptr) {
      fail(out, "cannot reach the tile offsets of pyramid level " + std::to_string(k));
    }
    for (const auto& [index, stored_tile] : shared) {
      offsets[index] = stored_tile->offset;
      byte_counts[index] = stored_tile->bytes;
    }
  }
  if (TIFFWriteDirectory(out.tif) != 1) fail(out, "cannot write a TIFF directory");
}

void TiffWriter::Impl::append_batch(const TiffFile& out, std::size_t k) {
  const std::size_t count = batched;
  batched = 0;
  // Compress: every thread takes the next tile not taken until none is left (tiles differ in cost).
  std::atomic<std::size_t> next{0};
  const auto compress = [&](std::size_t thread) {
    for (std::size_t i = next++; i < count; i = next++) {
      deflate_tile(compressors[thread].get(), batch[i].pixels, scratch[thread], batch[i].bytes);
    }
  };
  std::vector<std::future<void>> helpers;
  for (std::size_t thread = 1; thread < std::min(compressors.size(), count); ++thread) {
    helpers.push_back(std::async(std::launch::async, compress, thread));
  }
  compress(0);
  for (auto& helper : helpers) helper.get();
  // Append, in tile order.
  for (std::size_t i = 0; i < count; ++i) {
    PendingTile& pending = batch[i];
    const auto bytes = static_cast<tmsize_t>(pending.bytes.size());
    if (TIFFWriteRawTile(out.tif, pending.index, pending.bytes.data(), bytes) != bytes) {
      fail(out, "cannot write tile " + std::to_string(pending.index) + " of pyramid level " + std::to_string(k));
    }
    *pending.stored = {TIFFGetStrileOffset(out.tif, pending.index), TIFFGetStrileByteCount(out.tif, pending.index)};
  }
}

cv::Mat TiffWriter::Impl::thumbnail_from(TileSource& source) {
  const Level& level = *levels[static_cast<std::size_t>(thumbnail_level)];
  cv::Mat whole;
  source.render_tile(thumbnail_level, 0, 0, static_cast<int>(level.width), static_cast<int>(level.height), whole);
  if (whole.type() != CV_8UC3 || whole.cols != level.width || whole.rows != level.height) {
    bad_call("write_tiles(): the source made a thumbnail level that is not " + dims(level.width, level.height) +
             " RGB CV_8UC3");
  }
  return whole;
}

void TiffWriter::write_tiles(TileSource& source) {
  Impl& d = *impl_;
  if (d.finished) d.bad_call("write_tiles() after finish()");
  if (d.strips_started) d.bad_call("write_tiles() after write_strip()");
  if (d.tiles_written) d.bad_call("write_tiles() called twice");
  if (d.options.compression != TiffCompression::deflate) d.bad_call("write_tiles() writes deflate tiles only");
  d.tiles_written = true;
  const auto threads = static_cast<std::size_t>(d.options.threads);
  d.batch.resize(threads * kTilesPerThreadBatch);
  for (std::size_t thread = 0; thread < threads; ++thread) {
    d.compressors.emplace_back(libdeflate_alloc_compressor(kDeflateLevel));
    if (!d.compressors.back()) d.bad_call("libdeflate cannot allocate a compressor (out of memory)");
  }
  d.scratch.resize(threads);
  const TiffFile& out = d.levels.front()->file;
  d.write_source_level(out, 0, source);
  if (d.options.flavor == TiffFlavor::aperio) d.write_thumbnail(out, d.thumbnail_from(source));
  for (std::size_t k = 1; k < d.levels.size(); ++k) d.write_source_level(out, k, source);
  d.stored.clear();
  d.batch.clear();
  d.compressors.clear();
  d.scratch.clear();
  d.thumbnail_source.release();
}

void TiffWriter::add_associated_image(const std::string& name, const cv::Mat& image) {
  Impl& d = *impl_;
  if (d.finished) d.bad_call("add_associated_image() after finish()");
  if (name.empty() || name.find_first_of(" \t\r\n|") != std::string::npos || name == "thumbnail") {
    d.bad_call("invalid associated image name '" + name + "' (one word such as label or macro)");
  }
  if (image.type() != CV_8UC3 || image.empty()) d.bad_call("associated image '" + name + "' must be RGB CV_8UC3");
  for (const auto& other : d.associated) {
    if (other.name == name) d.bad_call("associated image '" + name + "' added twice");
  }
  d.associated.push_back({name, image.clone()});
}

void TiffWriter::finish() {
  Impl& d = *impl_;
  if (d.finished) d.bad_call("finish() called twice");
  const TiffFile& out = d.levels.front()->file;
  if (!d.tiles_written) {
    const Impl::Level& base = *d.levels.front();
    if (base.rows_in != base.height) {
      d.bad_call("finish() after " + std::to_string(base.rows_in) + " of " + std::to_string(base.height) + " rows");
    }
    d.flush(0);
    if (TIFFWriteDirectory(out.tif) != 1) fail(out, "cannot write a TIFF directory");
    if (d.options.flavor == TiffFlavor::aperio) {
      d.write_thumbnail(out, d.thumbnail_source);
      d.thumbnail_source.release();
    }
    for (std::size_t k = 1; k < d.levels.size(); ++k) d.append_level(out, k);
  }
  for (const auto& image : d.associated) {
    // OpenSlide's aperio driver names a stripped directory after the first word of the description's second
    // line; it splits lines on '\r' and '\n' separately, so a plain '\n' is needed here.
    const std::string description =
        d.options.flavor == TiffFlavor::aperio
            ? std::string(kAperioPrefix) + "\n" + image.name + " " + dims(image.image.cols, image.image.rows)
            : image.name;
    d.write_stripped(out, image.image, description);
  }
  d.associated.clear();

  TIFF* tif = d.levels.front()->file.tif;
  d.levels.front()->file.tif = nullptr;
  if (TIFFFlush(tif) != 1) {
    TIFFClose(tif);
    fail(out, "cannot flush the TIFF file");
  }
  TIFFClose(tif);
  // libtiff does not sync on close: publish_file syncs the file, renames it over the output and syncs the folder.
  try {
    core::publish_file(d.temp_path, d.path);
  } catch (core::Error& e) {
    e.add_context("file", d.path);
    throw;
  }
  d.finished = true;
}

int TiffWriter::level_count() const { return static_cast<int>(impl_->levels.size()); }

std::int64_t TiffWriter::level_width(int level) const {
  return impl_->levels.at(static_cast<std::size_t>(level))->width;
}

std::int64_t TiffWriter::level_height(int level) const {
  return impl_->levels.at(static_cast<std::size_t>(level))->height;
}

int TiffWriter::level_factor() const { return impl_->options.level_factor; }

std::int64_t TiffWriter::tiles_stored() const { return impl_->tiles_stored; }

std::int64_t TiffWriter::tiles_total() const { return impl_->tiles_total; }

std::int64_t TiffWriter::rows_written() const { return impl_->levels.front()->rows_in; }

}  // namespace tessera::io
