#include "io/tiff_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <optional>
#include <utility>

#include <tiffio.h>

#include "core/error.h"
#include "io/tile_cache.h"
#include "io/tile_grid.h"

namespace tessera::io {
namespace {

// A tile side above this is not a slide tile (those are 240–1024 px); refusing it bounds a decode buffer that a
// damaged directory could otherwise make huge.
constexpr std::uint32_t kMaxTileSide = 8192;
constexpr int kChannels = 3;
constexpr std::uint16_t kJpeg2000Aperio = 33003;     // YCbCr JPEG 2000 in Aperio files
constexpr std::uint16_t kJpeg2000AperioRgb = 33005;  // RGB JPEG 2000 in Aperio files
const cv::Scalar kWhite(255, 255, 255);

// One libtiff handle with its own first error and warning messages (libtiff reports through callbacks, set per
// handle with TIFFOpenOptions, so that concurrent handles in other threads never mix their messages) and the
// directory it is set to. Lives at a fixed address while open: libtiff holds a pointer to it.
struct Handle {
  TIFF* tif = nullptr;
  std::string last_error;
  std::string first_warning;
  std::optional<tdir_t> directory;

  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (tif != nullptr) TIFFClose(tif);
  }
};

// Keeps the first message in `kept`: it is the cause; later ones ("cannot read tile") only repeat it.
void keep_first(std::string& kept, const char* module, const char* fmt, va_list ap) {
  if (!kept.empty()) return;
  std::array<char, 1024> buffer{};
  std::vsnprintf(buffer.data(), buffer.size(), fmt, ap);
  kept = module != nullptr && *module != '\0' ? std::string(module) + ": " + buffer.data() : std::string(buffer.data());
}

int keep_error(TIFF*, void* user_data, const char* module, const char* fmt, va_list ap) {
  keep_first(static_cast<Handle*>(user_data)->last_error, module, fmt, ap);
  return 1;  // handled: libtiff must not print
}

// Warnings are kept too: libjpeg reports damaged entropy-coded data ("Corrupt JPEG data: 12 extraneous bytes
// before marker 0xd9", "Premature end of JPEG file") as a warning and fills what it could not decode with grey,
// which would reach the tiles as pixels. tile() fails a decode that warned; warnings while reading a directory
// (unknown vendor tags, for instance) are harmless and cleared before each decode.
int keep_warning(TIFF*, void* user_data, const char* module, const char* fmt, va_list ap) {
  keep_first(static_cast<Handle*>(user_data)->first_warning, module, fmt, ap);
  return 1;
}

// Opens `path` for reading; nullptr (with handle->last_error) when libtiff cannot. `header_only`: libtiff reads
// no directory now (the handle's first select() reads the one it needs). Tiles are read with read(2) ("m": libtiff
// maps the file into memory by default, and every tile read from the map then counts in the process's resident
// memory: 190 MB of a CAMELYON-size slide's TIFF for QC's sharpness read alone).
std::unique_ptr<Handle> open_handle(const std::string& path, bool header_only = false) {
  auto handle = std::make_unique<Handle>();
  TIFFOpenOptions* options = TIFFOpenOptionsAlloc();
  TIFFOpenOptionsSetErrorHandlerExtR(options, keep_error, handle.get());
  TIFFOpenOptionsSetWarningHandlerExtR(options, keep_warning, handle.get());
  handle->tif = TIFFOpenExt(path.c_str(), header_only ? "rmh" : "rm", options);
  TIFFOpenOptionsFree(options);
  return handle;
}

std::string compression_name(std::uint16_t compression) {
  switch (compression) {
    case COMPRESSION_NONE:
      return "uncompressed";
    case COMPRESSION_JPEG:
      return "JPEG";
    case COMPRESSION_ADOBE_DEFLATE:
    case COMPRESSION_DEFLATE:
      return "deflate";
    case COMPRESSION_LZW:
      return "LZW";
    case kJpeg2000Aperio:
    case kJpeg2000AperioRgb:
      return "JPEG 2000";
    default:
      return "compression " + std::to_string(compression);
  }
}

// "JPEG tiles", "JPEG, deflate tiles": the levels' encodings in level order.
std::string describe(const std::vector<TiffTileReader::LevelLayout>& levels) {
  std::vector<std::string> encodings;
  for (const auto& level : levels) {
    const std::string name = compression_name(level.compression);
    if (std::find(encodings.begin(), encodings.end(), name) == encodings.end()) encodings.push_back(name);
  }
  return fmt::format("{} tiles", fmt::join(encodings, ", "));
}

}  // namespace

struct TiffTileReader::Impl {
  struct Level : LevelLayout {
    std::uint32_t tiles_across = 0;
  };

  std::string path;
  std::vector<Level> levels;
  bool missing_tiles_blank = false;
  bool header_only = false;  // open_known: new handles read no directory at open
  std::string description;

  std::mutex pool_mutex;
  std::vector<std::unique_ptr<Handle>> idle;  // handles no thread is using
  TileCache cache;

  explicit Impl(std::size_t cache_bytes) : cache(cache_bytes) {}

  // A handle for one thread's use; returned to the pool on destruction unless discard()ed (after a failed
  // decode, whose codec state is not worth trusting).
  class Lease {
   public:
    Lease(Impl& impl, std::unique_ptr<Handle> handle) : impl_(impl), handle_(std::move(handle)) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (handle_ == nullptr) return;
      const std::lock_guard lock(impl_.pool_mutex);
      impl_.idle.push_back(std::move(handle_));
    }
    Handle& operator*() const { return *handle_; }
    void discard() { handle_.reset(); }

   private:
    Impl& impl_;
    std::unique_ptr<Handle> handle_;
  };

  Lease acquire() {
    {
      const std::lock_guard lock(pool_mutex);
      if (!idle.empty()) {
        std::unique_ptr<Handle> handle = std::move(idle.back());
        idle.pop_back();
        return Lease(*this, std::move(handle));
      }
    }
    std::unique_ptr<Handle> handle = open_handle(path, header_only);
    if (handle->tif == nullptr) {
      throw core::InputError("cannot reopen the slide with libtiff" +
                                 (handle->last_error.empty() ? std::string() : ": " + handle->last_error),
                             path);
    }
    return Lease(*this, std::move(handle));
  }

  // Sets `handle` to `level`'s directory; false (with handle.last_error) on failure.
  bool select(Handle& handle, const Level& level) const {
    if (handle.directory == level.directory) return true;
    handle.directory.reset();
    if (TIFFSetDirectory(handle.tif, level.directory) != 1) {
      // open_known: the planned directory is gone (a file changed since, which reopen()'s size and time check
      // did not catch, or that changed after it).
      if (header_only) {
        handle.last_error =
            fmt::format("the file has no readable TIFF directory {} (it changed since it was planned){}",
                        level.directory, handle.last_error.empty() ? "" : ": " + handle.last_error);
      }
      return false;
    }
    // A pseudo-tag: reset by every directory read. libjpeg then converts YCbCr to RGB with its usual
    // upsampling, as OpenSlide's own JPEG decoding does.
    if (level.jpeg_ycbcr && TIFFSetField(handle.tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB) != 1) return false;
    // The directory is still the one the level was found in (open_known: the file may have changed since).
    std::uint32_t width = 0, height = 0, tile_width = 0, tile_height = 0;
    std::uint16_t compression = COMPRESSION_NONE;
    TIFFGetField(handle.tif, TIFFTAG_IMAGEWIDTH, &width);
    TIFFGetField(handle.tif, TIFFTAG_IMAGELENGTH, &height);
    TIFFGetField(handle.tif, TIFFTAG_TILEWIDTH, &tile_width);
    TIFFGetField(handle.tif, TIFFTAG_TILELENGTH, &tile_height);
    TIFFGetFieldDefaulted(handle.tif, TIFFTAG_COMPRESSION, &compression);
    if (width != level.width || height != level.height || tile_width != level.tile_width ||
        tile_height != level.tile_height || compression != level.compression ||
        TIFFTileSize(handle.tif) != static_cast<tmsize_t>(level.tile_width) * level.tile_height * kChannels) {
      handle.last_error = fmt::format(
          "the directory holds {}x{} pixels in {}x{} {} tiles, not the {}x{} in {}x{} {} tiles the slide was planned "
          "with (the file changed since it was planned)",
          width, height, tile_width, tile_height, compression_name(compression), level.width, level.height,
          level.tile_width, level.tile_height, compression_name(level.compression));
      return false;
    }
    handle.directory = level.directory;
    return true;
  }

  cv::Mat tile(int level_index, std::uint32_t column, std::uint32_t row) {
    const Level& level = levels[static_cast<std::size_t>(level_index)];
    const std::uint32_t index = row * level.tiles_across + column;
    const std::uint64_t key = TileCache::key(static_cast<std::uint32_t>(level_index), index);
    return cache.get(key, [&] { return decode(level_index, level, column, row, index); });
  }

  cv::Mat decode(int level_index, const Level& level, std::uint32_t column, std::uint32_t row, std::uint32_t index) {
    cv::Mat pixels(static_cast<int>(level.tile_height), static_cast<int>(level.tile_width), CV_8UC3);
    const auto bytes = static_cast<tmsize_t>(pixels.total() * pixels.elemSize());
    Lease lease = acquire();
    Handle& handle = *lease;
    handle.last_error.clear();
    const auto where = [&] {
      return fmt::format("tile {} (column {}, row {}) of level {} (TIFF directory {})", index, column, row, level_index,
                         level.directory);
    };
    if (!select(handle, level)) {
      const core::InputError error(fmt::format("cannot select the directory of {}{}", where(),
                                               handle.last_error.empty() ? "" : ": " + handle.last_error),
                                   path);
      lease.discard();
      throw error;
    }
    handle.first_warning.clear();
    if (missing_tiles_blank && TIFFGetStrileByteCount(handle.tif, index) == 0) {
      pixels.setTo(kWhite);
    } else {
      const bool decoded = TIFFReadEncodedTile(handle.tif, index, pixels.data, bytes) == bytes;
      if (!decoded || !handle.first_warning.empty()) {
        // The decoder's own words: its error, else the warning by which it let damaged data through.
        const std::string& cause = !handle.last_error.empty() ? handle.last_error : handle.first_warning;
        const core::CorruptTileError error(
            fmt::format("cannot decode {}: {}", where(), cause.empty() ? "libtiff gave no reason" : cause), path);
        lease.discard();  // the codec's state after damaged data is not worth trusting
        throw error;
      }
    }
    return pixels;
  }
};

TiffTileReader::TiffTileReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TiffTileReader::~TiffTileReader() = default;

std::unique_ptr<TiffTileReader> TiffTileReader::open(const std::string& path, const std::vector<TiffLevelSize>& levels,
                                                     bool missing_tiles_blank, std::string& why_not,
                                                     std::size_t cache_bytes) {
  why_not.clear();
  std::unique_ptr<Handle> handle = open_handle(path);
  if (handle->tif == nullptr) {
    why_not = "libtiff cannot open the file" + (handle->last_error.empty() ? "" : ": " + handle->last_error);
    return nullptr;
  }
  TIFF* tif = handle->tif;

  // Every tiled directory, in file order.
  struct Tiled {
    tdir_t directory;
    std::uint32_t width;
    std::uint32_t height;
    bool taken;
  };
  std::vector<Tiled> tiled;
  do {
    std::uint32_t width = 0;
    std::uint32_t height = 0;
    if (TIFFIsTiled(tif) != 0 && TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &width) == 1 &&
        TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &height) == 1) {
      tiled.push_back({TIFFCurrentDirectory(tif), width, height, false});
    }
  } while (TIFFReadDirectory(tif) == 1);

  auto impl = std::make_unique<Impl>(cache_bytes);
  impl->path = path;
  impl->missing_tiles_blank = missing_tiles_blank;
  for (std::size_t i = 0; i < levels.size(); ++i) {
    const auto decline = [&](const std::string& why) {
      why_not = fmt::format("level {}: {}", i, why);
      return nullptr;
    };
    const TiffLevelSize& size = levels[i];
    auto match = std::find_if(tiled.begin(), tiled.end(), [&](const Tiled& t) {
      return !t.taken && t.width == size.width && t.height == size.height;
    });
    if (match == tiled.end()) return decline(fmt::format("no tiled directory of {}x{}", size.width, size.height));
    match->taken = true;

    Impl::Level level;
    level.directory = match->directory;
    level.width = size.width;
    level.height = size.height;
    handle->last_error.clear();
    if (TIFFSetDirectory(tif, level.directory) != 1) return decline("unreadable directory: " + handle->last_error);
    std::uint16_t bits = 0;
    std::uint16_t samples = 0;
    std::uint16_t planar = 0;
    std::uint16_t sample_format = 0;
    std::uint16_t photometric = 0;
    std::uint16_t orientation = 0;
    // TIFFGetFieldDefaulted: these have TIFF defaults (1 bit, 1 sample, contiguous, unsigned, top-left).
    TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &bits);
    TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &samples);
    TIFFGetFieldDefaulted(tif, TIFFTAG_PLANARCONFIG, &planar);
    TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLEFORMAT, &sample_format);
    TIFFGetFieldDefaulted(tif, TIFFTAG_ORIENTATION, &orientation);
    TIFFGetFieldDefaulted(tif, TIFFTAG_COMPRESSION, &level.compression);
    if (TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photometric) != 1) return decline("no photometric tag");
    if (TIFFGetField(tif, TIFFTAG_TILEWIDTH, &level.tile_width) != 1 ||
        TIFFGetField(tif, TIFFTAG_TILELENGTH, &level.tile_height) != 1) {
      return decline("no tile size");
    }
    if (bits != 8 || samples != kChannels || planar != PLANARCONFIG_CONTIG || sample_format != SAMPLEFORMAT_UINT) {
      return decline(
          fmt::format("{} bits, {} samples, planar configuration {}, sample format {} (not 8-bit "
                      "contiguous RGB)",
                      bits, samples, planar, sample_format));
    }
    if (orientation != ORIENTATION_TOPLEFT) return decline(fmt::format("orientation {}", orientation));
    if (level.tile_width == 0 || level.tile_height == 0 || level.tile_width > kMaxTileSide ||
        level.tile_height > kMaxTileSide) {
      return decline(fmt::format("tile size {}x{}", level.tile_width, level.tile_height));
    }
    const std::string name = compression_name(level.compression);
    switch (level.compression) {
      case COMPRESSION_JPEG:
        if (photometric == PHOTOMETRIC_YCBCR) {
          level.jpeg_ycbcr = true;
        } else if (photometric != PHOTOMETRIC_RGB) {
          return decline(fmt::format("JPEG tiles with photometric interpretation {}", photometric));
        }
        break;
      case COMPRESSION_ADOBE_DEFLATE:
      case COMPRESSION_DEFLATE:
      case COMPRESSION_LZW:
      case COMPRESSION_NONE:
        if (photometric != PHOTOMETRIC_RGB) {
          return decline(fmt::format("{} tiles with photometric interpretation {}", name, photometric));
        }
        break;
      default:
        return decline(fmt::format("{} tiles (compression {})", name, level.compression));
    }
    if (TIFFIsCODECConfigured(level.compression) == 0) return decline("libtiff has no " + name + " decoder");
    // Check on this handle that libtiff will deliver whole RGB tiles, as read() expects.
    handle->directory.reset();
    if (level.jpeg_ycbcr && TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB) != 1) {
      return decline("libtiff cannot convert YCbCr JPEG to RGB");
    }
    handle->directory = level.directory;
    const auto expected = static_cast<tmsize_t>(level.tile_width) * level.tile_height * kChannels;
    if (TIFFTileSize(tif) != expected) return decline(fmt::format("tile of {} bytes", TIFFTileSize(tif)));
    const std::uint64_t tiles_across =
        (static_cast<std::uint64_t>(size.width) + level.tile_width - 1) / level.tile_width;
    const std::uint64_t tiles_down =
        (static_cast<std::uint64_t>(size.height) + level.tile_height - 1) / level.tile_height;
    level.tiles_across = static_cast<std::uint32_t>(tiles_across);
    if (tiles_across * tiles_down != TIFFNumberOfTiles(tif)) {
      return decline(fmt::format("{} tiles, not a {}x{} grid", TIFFNumberOfTiles(tif), level.tiles_across, tiles_down));
    }
    impl->levels.push_back(level);
  }
  if (impl->levels.empty()) {
    why_not = "no pyramid levels";
    return nullptr;
  }
  impl->description = describe({impl->levels.begin(), impl->levels.end()});
  impl->idle.push_back(std::move(handle));
  return std::unique_ptr<TiffTileReader>(new TiffTileReader(std::move(impl)));
}

std::unique_ptr<TiffTileReader> TiffTileReader::open_known(const std::string& path,
                                                           const std::vector<LevelLayout>& levels,
                                                           bool missing_tiles_blank, std::size_t cache_bytes) {
  if (levels.empty()) throw core::InternalError("direct TIFF reader of '" + path + "' without levels");
  auto impl = std::make_unique<Impl>(cache_bytes);
  impl->path = path;
  impl->missing_tiles_blank = missing_tiles_blank;
  impl->header_only = true;
  for (const auto& known : levels) {
    if (known.tile_width == 0 || known.tile_height == 0 || known.tile_width > kMaxTileSide ||
        known.tile_height > kMaxTileSide || known.width <= 0 || known.height <= 0) {
      throw core::InternalError(fmt::format("direct TIFF reader of '{}': invalid level layout", path));
    }
    Impl::Level level;
    static_cast<LevelLayout&>(level) = known;
    level.tiles_across =
        static_cast<std::uint32_t>((static_cast<std::uint64_t>(known.width) + known.tile_width - 1) / known.tile_width);
    impl->levels.push_back(level);
  }
  impl->description = describe(levels);
  return std::unique_ptr<TiffTileReader>(new TiffTileReader(std::move(impl)));
}

std::vector<TiffTileReader::LevelLayout> TiffTileReader::layout() const {
  return {impl_->levels.begin(), impl_->levels.end()};
}

bool TiffTileReader::missing_tiles_blank() const { return impl_->missing_tiles_blank; }

cv::Mat TiffTileReader::read(int level_index, std::int64_t lx, std::int64_t ly, int width, int height,
                             cv::Mat into) const {
  if (level_index < 0 || level_index >= static_cast<int>(impl_->levels.size()) || width <= 0 || height <= 0) {
    throw core::InternalError(
        fmt::format("direct TIFF read of level {}, {}x{} pixels: invalid request", level_index, width, height));
  }
  const Impl::Level& level = impl_->levels[static_cast<std::size_t>(level_index)];
  return assemble_region(
      {level.width, level.height, level.tile_width, level.tile_height}, lx, ly, width, height,
      [&](std::int64_t column, std::int64_t row) {
        return impl_->tile(level_index, static_cast<std::uint32_t>(column), static_cast<std::uint32_t>(row));
      },
      std::move(into));
}

const std::string& TiffTileReader::description() const { return impl_->description; }

std::size_t TiffTileReader::cached_bytes() const { return impl_->cache.bytes(); }

int TiffTileReader::directory(int level) const {
  return static_cast<int>(impl_->levels.at(static_cast<std::size_t>(level)).directory);
}

}  // namespace tessera::io
