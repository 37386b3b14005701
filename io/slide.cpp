#include "io/slide.h"

#include <fmt/format.h>

#include <openslide/openslide.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <system_error>
#include <tuple>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tiffio.h>
#include <opencv2/imgproc.hpp>

#include "core/error.h"
#include "io/dicom_slide.h"
#include "io/provenance.h"
#include "io/tiff_reader.h"

namespace tessera::io {
namespace {

constexpr double kMicronsPerCentimetre = 10000.0;
constexpr double kMicronsPerInch = 25400.0;
// A pyramid level whose µm/px is within 1% of the target counts as "at or above" the target resolution, so
// rounding in reported downsamples (e.g. 1.998 for a 2× level of an odd-sized slide) does not skip it.
constexpr double kLevelMppTolerance = 1.01;
// Level coordinates beyond this are far outside any slide; clamping keeps llround() and lx + width in range.
constexpr double kMaxLevelCoordinate = 1e15;

std::optional<double> parse_double(const std::string& text) {
  // Property values are C-locale decimals; from_chars does not depend on the process locale.
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  while (begin < end && *begin == ' ') ++begin;
  double value = 0.0;
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr == begin) return std::nullopt;
  return value;
}

// OpenSlide vendors whose pyramid levels are plain tiled TIFF directories, which TiffTileReader can decode.
bool tiled_tiff_vendor(const std::string& vendor) { return vendor == "generic-tiff" || vendor == "aperio"; }

bool usable_mpp(std::optional<double> mpp) { return mpp && std::isfinite(*mpp) && *mpp > 0.0; }

std::string region_text(std::int64_t x, std::int64_t y, std::int64_t w, std::int64_t h) {
  return fmt::format("({}, {}, {}x{})", x, y, w, h);
}

// Many image tools write 72 or 96 dpi by default: taken at face value that is 265–353 µm/px, which no
// slide scanner produces. Such tags are not a resolution; the job's assume_mpp decides instead.
bool plausible_tiff_mpp(double mpp) { return mpp >= 0.01 && mpp <= 50.0; }

// Premultiplied ARGB (OpenSlide) composited over white: out = colour + (255 - alpha) per channel.
cv::Mat argb_to_rgb(const std::vector<std::uint32_t>& argb, std::int64_t width, std::int64_t height) {
  cv::Mat rgb(static_cast<int>(height), static_cast<int>(width), CV_8UC3);
  for (int r = 0; r < rgb.rows; ++r) {
    const std::uint32_t* src = argb.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(width);
    auto* dst = rgb.ptr<cv::Vec3b>(r);
    for (int c = 0; c < rgb.cols; ++c) {
      const std::uint32_t p = src[c];
      const std::uint32_t white = 255 - (p >> 24);
      dst[c] = cv::Vec3b(static_cast<unsigned char>(((p >> 16) & 0xff) + white),
                         static_cast<unsigned char>(((p >> 8) & 0xff) + white),
                         static_cast<unsigned char>((p & 0xff) + white));
    }
  }
  return rgb;
}

bool has_tiff_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::array<char, 4> magic{};
  if (!in.read(magic.data(), magic.size())) return false;
  const std::string m(magic.data(), magic.size());
  return m == std::string("II*\0", 4) || m == std::string("MM\0*", 4) || m == std::string("II+\0", 4) ||
         m == std::string("MM\0+", 4);
}

int keep_tiff_error(TIFF*, void* user_data, const char* module, const char* fmt, va_list ap) {
  std::array<char, 1024> buffer{};
  std::vsnprintf(buffer.data(), buffer.size(), fmt, ap);
  auto* message = static_cast<std::string*>(user_data);
  if (message->empty()) {
    *message =
        module != nullptr && *module != '\0' ? std::string(module) + ": " + buffer.data() : std::string(buffer.data());
  }
  return 1;
}

int ignore_tiff_warning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

// OpenSlide does not say why it rejects a file. For a file that claims to be a TIFF, libtiff's own reading
// tells a damaged file (truncated, garbage directories) from a valid TIFF that is simply not a slide.
std::optional<std::string> tiff_damage(const std::string& path) {
  std::string message;
  TIFFOpenOptions* options = TIFFOpenOptionsAlloc();
  TIFFOpenOptionsSetErrorHandlerExtR(options, keep_tiff_error, &message);
  TIFFOpenOptionsSetWarningHandlerExtR(options, ignore_tiff_warning, nullptr);
  TIFF* tif = TIFFOpenExt(path.c_str(), "r", options);
  TIFFOpenOptionsFree(options);
  if (tif == nullptr) return message.empty() ? std::string("not a readable TIFF file") : message;
  // Walk every directory: a truncated file can have a readable first one.
  while (TIFFReadDirectory(tif) == 1) {
  }
  TIFFClose(tif);
  if (!message.empty()) return message;
  return std::nullopt;
}

// Says why `path` cannot be read, in open(2)'s terms, before any library looks at it: OpenSlide calls a file it
// may not read "unsupported format", and std::filesystem calls a symlink loop "not found".
void check_readable(const std::string& path) {
  // O_NONBLOCK: opening a FIFO named like a slide must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  const int error = errno;
  switch (error) {
    case ENOENT:
      throw core::FileNotFoundError(path);
    case EACCES:
    case EPERM:
      throw core::InputError("permission denied (this user may not read the file or a folder on its path)", path);
    case ELOOP:
      throw core::InputError("too many levels of symbolic links (a symlink loop)", path);
    default:
      throw core::InputError(std::string("cannot open: ") + std::strerror(error), path);
  }
}

// The file's size and modification time (ns), or nullopt when stat(2) fails.
std::optional<std::pair<std::int64_t, std::int64_t>> file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::pair{static_cast<std::int64_t>(st.st_size),
                   static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

}  // namespace

// The OpenSlide handle of a slide. OpenSlide 3.4.1's errors are sticky: once a read fails, every later call on
// the handle fails too, so a failed read replaces the handle.
struct Slide::OpenSlideHandle {
  std::shared_mutex mutex;  // shared: OpenSlide calls; exclusive: a retry and the replacement of `osr`
  openslide_t* osr = nullptr;

  explicit OpenSlideHandle(openslide_t* handle) : osr(handle) {}
  OpenSlideHandle(const OpenSlideHandle&) = delete;
  OpenSlideHandle& operator=(const OpenSlideHandle&) = delete;
  ~OpenSlideHandle() {
    if (osr != nullptr) openslide_close(osr);
  }

  // Runs call(osr) and returns OpenSlide's error after it (nullopt: it succeeded). A failed call may have failed
  // for another thread's damaged tile (the error is the handle's, not the call's), so it runs again alone on a
  // fresh handle: its error then is its own. The handle is fresh again after a call that failed.
  template <class Call>
  std::optional<std::string> run(const std::string& path, const Call& call) {
    {
      const std::shared_lock lock(mutex);
      call(osr);
      if (openslide_get_error(osr) == nullptr) return std::nullopt;
    }
    const std::unique_lock lock(mutex);
    reopen(path);
    call(osr);
    const char* error = openslide_get_error(osr);
    if (error == nullptr) return std::nullopt;
    std::string message = error;
    reopen(path);
    return message;
  }

  // With the exclusive lock held. Keeps the old handle (whose calls then fail) when the file no longer opens.
  void reopen(const std::string& path) {
    openslide_t* fresh = openslide_open(path.c_str());
    const char* error = fresh != nullptr ? openslide_get_error(fresh) : "the file is no longer a readable slide";
    if (error != nullptr) {
      const std::string message = error;
      if (fresh != nullptr) openslide_close(fresh);
      throw core::InputError("cannot reopen the slide after a failed read: " + message, path);
    }
    openslide_close(osr);
    osr = fresh;
  }
};

const char* to_string(MppSource source) {
  switch (source) {
    case MppSource::openslide_property:
      return "openslide property";
    case MppSource::tiff_resolution:
      return "TIFF resolution";
    case MppSource::dicom:
      return "DICOM";
    case MppSource::assumed:
      return "assumed";
    case MppSource::unknown:
      return "unknown";
  }
  return "unknown";
}

Slide Slide::open(const std::string& path, const SlideOpenOptions& options) {
  check_readable(path);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw core::FileNotFoundError(path);
  if (looks_like_dicom(path)) return open_dicom(path, options);
  if (!std::filesystem::is_regular_file(path, ec)) throw core::InputError("not a regular file", path);
  const auto stamp = file_stamp(path);  // before any read: a file changed while it is read does not match it

  const char* vendor = openslide_detect_vendor(path.c_str());
  openslide_t* osr = vendor != nullptr ? openslide_open(path.c_str()) : nullptr;
  if (osr == nullptr) {
    if (has_tiff_magic(path)) {
      if (auto damage = tiff_damage(path))
        throw core::InputError("corrupt slide: damaged TIFF (" + *damage + ")", path);
      throw core::InputError("unsupported slide format (a TIFF file, but not a tiled, pyramidal slide)", path);
    }
    throw core::InputError("unsupported slide format", path);
  }
  if (const char* error = openslide_get_error(osr)) {
    std::string message = error;
    openslide_close(osr);
    throw core::InputError("corrupt slide: " + message, path);
  }

  Slide slide;
  slide.path_ = path;
  slide.vendor_ = vendor;
  slide.osr_ = std::make_unique<OpenSlideHandle>(osr);
  if (stamp) std::tie(slide.file_size_, slide.file_mtime_ns_) = *stamp;

  for (const char* const* name = openslide_get_property_names(osr); name != nullptr && *name != nullptr; ++name) {
    const char* value = openslide_get_property_value(osr, *name);
    slide.properties_[*name] = value != nullptr ? value : "";
  }

  const int32_t count = openslide_get_level_count(osr);
  if (count < 1) {
    const char* error = openslide_get_error(osr);
    throw core::InputError(std::string("corrupt slide: ") + (error != nullptr ? error : "no pyramid levels"), path);
  }
  for (int32_t i = 0; i < count; ++i) {
    SlideLevel level;
    openslide_get_level_dimensions(osr, i, &level.width, &level.height);
    level.downsample = openslide_get_level_downsample(osr, i);
    const std::string prefix = "openslide.level[" + std::to_string(i) + "].";
    const auto tile_side = [&](const std::string& name) -> std::int64_t {
      auto value = slide.property(prefix + name);
      return value ? static_cast<std::int64_t>(parse_double(*value).value_or(0.0)) : 0;
    };
    level.tile_width = tile_side("tile-width");
    level.tile_height = tile_side("tile-height");
    if (level.width <= 0 || level.height <= 0 || !(level.downsample > 0.0)) {
      core::InputError error("corrupt slide: invalid pyramid level", path);
      error.add_context("level", i);
      throw error;
    }
    slide.levels_.push_back(level);
  }

  for (const char* const* name = openslide_get_associated_image_names(osr); name != nullptr && *name != nullptr;
       ++name) {
    AssociatedImage image;
    image.name = *name;
    openslide_get_associated_image_dimensions(osr, *name, &image.width, &image.height);
    slide.associated_.push_back(image);
  }
  if (const char* error = openslide_get_error(osr))
    throw core::InputError(std::string("corrupt slide: ") + error, path);

  // Resolution chain of docs/ARCHITECTURE.md ("Slide geometry"): OpenSlide's mpp, else the TIFF resolution tags, else
  // the job's assumption.
  const auto number = [&](const std::string& name) -> std::optional<double> {
    auto value = slide.property(name);
    return value ? parse_double(*value) : std::nullopt;
  };
  const auto mpp_x = number("openslide.mpp-x");
  const auto mpp_y = number("openslide.mpp-y");
  const auto resolution_x = number("tiff.XResolution");
  const auto resolution_y = number("tiff.YResolution");
  const auto unit = slide.property("tiff.ResolutionUnit");
  const double microns_per_unit = unit == "centimeter" ? kMicronsPerCentimetre : unit == "inch" ? kMicronsPerInch : 0.0;
  if (usable_mpp(mpp_x)) {
    slide.mpp_x_ = *mpp_x;
    slide.mpp_y_ = usable_mpp(mpp_y) ? *mpp_y : *mpp_x;
    slide.mpp_source_ = MppSource::openslide_property;
  } else if (microns_per_unit > 0.0 && resolution_x && *resolution_x > 0.0 && std::isfinite(*resolution_x) &&
             plausible_tiff_mpp(microns_per_unit / *resolution_x)) {
    slide.mpp_x_ = microns_per_unit / *resolution_x;
    const bool has_y = resolution_y && *resolution_y > 0.0 && std::isfinite(*resolution_y);
    slide.mpp_y_ = has_y ? microns_per_unit / *resolution_y : slide.mpp_x_;
    slide.mpp_source_ = MppSource::tiff_resolution;
  } else if (options.assume_mpp > 0.0) {
    slide.mpp_x_ = options.assume_mpp;
    slide.mpp_y_ = options.assume_mpp;
    slide.mpp_source_ = MppSource::assumed;
  } else {
    slide.mpp_source_ = MppSource::unknown;
    slide.mpp_problem_ =
        resolution_x && microns_per_unit > 0.0
            ? fmt::format("the TIFF resolution tags say {:.1f} µm/px, a screen default rather than a scan resolution",
                          microns_per_unit / *resolution_x)
            : std::string("no resolution (µm/px) in the slide");
    if (options.require_mpp) slide.throw_unknown_mpp();
  }

  if (tiled_tiff_vendor(slide.vendor_)) {
    if (options.direct_tiff) {
      std::vector<TiffLevelSize> sizes;
      for (const SlideLevel& level : slide.levels_) sizes.push_back({level.width, level.height});
      std::string why_not;
      // Aperio scanners leave some tiles empty and OpenSlide's aperio driver shows them blank.
      slide.tiff_ = TiffTileReader::open(path, sizes, slide.vendor_ == "aperio", why_not);
      slide.reader_ = slide.tiff_ != nullptr ? "direct TIFF (" + slide.tiff_->description() + ")"
                                             : "OpenSlide (direct TIFF not used: " + why_not + ")";
    } else {
      slide.reader_ = "OpenSlide (direct TIFF disabled)";
    }
  }
  return slide;
}

Slide Slide::reopen(const SlideLayout& layout) {
  check_readable(layout.path);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(layout.path, ec)) throw core::InputError("not a regular file", layout.path);
  if (layout.levels.empty() || layout.tiff.size() != layout.levels.size() || layout.mpp_source == MppSource::unknown) {
    throw core::InternalError("slide layout of '" + layout.path + "' without levels or resolution");
  }
  const auto stamp = file_stamp(layout.path);
  if (!stamp || stamp->first != layout.file_size || stamp->second != layout.file_mtime_ns) {
    throw core::InputError("changed since it was planned (size/mtime)", layout.path);
  }
  Slide slide;
  slide.path_ = layout.path;
  slide.vendor_ = layout.vendor;
  slide.levels_ = layout.levels;
  slide.mpp_x_ = layout.mpp_x;
  slide.mpp_y_ = layout.mpp_y;
  slide.mpp_source_ = layout.mpp_source;
  slide.tiff_ = TiffTileReader::open_known(layout.path, layout.tiff, layout.missing_tiles_blank);
  slide.reader_ = "direct TIFF (" + slide.tiff_->description() + ")";
  return slide;
}

std::optional<SlideLayout> Slide::layout() const {
  if (tiff_ == nullptr || !has_mpp() || file_size_ < 0) return std::nullopt;
  return SlideLayout{path_,      vendor_,       levels_,         mpp_x_,
                     mpp_y_,     mpp_source_,   tiff_->layout(), tiff_->missing_tiles_blank(),
                     file_size_, file_mtime_ns_};
}

Slide Slide::open_dicom(const std::string& path, const SlideOpenOptions& options) {
  Slide slide;
  slide.path_ = path;
  slide.vendor_ = "dicom";
  slide.dicom_ = DicomSlide::open(path);
  const DicomSlide& dicom = *slide.dicom_;
  slide.reader_ = "DICOM (" + dicom.description() + ")";
  for (const auto& l : dicom.levels()) {
    slide.levels_.push_back({l.width, l.height, l.downsample, l.tile_width, l.tile_height});
    if (l.missing_tiles > 0) {
      slide.notes_.push_back(fmt::format("level {}: TILED_SPARSE, {} tiles without a frame read as background",
                                         slide.levels_.size() - 1, l.missing_tiles));
    }
  }
  for (const auto& a : dicom.associated()) slide.associated_.push_back({a.name, a.width, a.height});
  slide.properties_ = dicom.properties();
  slide.notes_.insert(slide.notes_.begin(), dicom.notes().begin(), dicom.notes().end());
  if (dicom.mpp_x() && dicom.mpp_y()) {
    slide.mpp_x_ = *dicom.mpp_x();
    slide.mpp_y_ = *dicom.mpp_y();
    slide.mpp_source_ = MppSource::dicom;
    slide.properties_["dicom.mpp-origin"] = dicom.mpp_origin();
  } else if (options.assume_mpp > 0.0) {
    slide.mpp_x_ = options.assume_mpp;
    slide.mpp_y_ = options.assume_mpp;
    slide.mpp_source_ = MppSource::assumed;
  } else {
    slide.mpp_source_ = MppSource::unknown;
    slide.mpp_problem_ = "no resolution (Pixel Spacing or Imaged Volume) in the DICOM series";
    if (options.require_mpp) slide.throw_unknown_mpp();
  }
  return slide;
}

Slide::Slide() = default;
Slide::Slide(Slide&&) noexcept = default;
Slide& Slide::operator=(Slide&&) noexcept = default;
Slide::~Slide() = default;

void Slide::throw_unknown_mpp() const {
  throw core::InputError(fmt::format("{}; set assume_mpp in the job", mpp_problem_), path_);
}

std::string Slide::id() const {
  if (dicom_ != nullptr) return dicom_->id();
  return std::filesystem::path(path_).stem().string();
}

const SlideLevel& Slide::level(int i) const {
  if (i < 0 || i >= level_count()) {
    core::InternalError error("pyramid level " + std::to_string(i) + " out of range (the slide has " +
                              std::to_string(level_count()) + ")");
    error.add_context("file", path_);
    throw error;
  }
  return levels_[static_cast<std::size_t>(i)];
}

std::optional<double> Slide::objective_power() const {
  auto value = property("openslide.objective-power");
  if (!value) return std::nullopt;
  auto power = parse_double(*value);
  return usable_mpp(power) ? power : std::nullopt;
}

std::optional<std::string> Slide::property(const std::string& name) const {
  auto it = properties_.find(name);
  if (it == properties_.end()) return std::nullopt;
  return it->second;
}

bool Slide::synthetic() const { return is_synthetic_slide(properties_); }

cv::Mat Slide::read_associated_image(const std::string& name) const {
  auto it = std::find_if(associated_.begin(), associated_.end(), [&](const auto& a) { return a.name == name; });
  if (it == associated_.end()) {
    std::string known;
    for (const auto& a : associated_) known += (known.empty() ? "" : ", ") + a.name;
    throw core::InputError(
        "no associated image '" + name + "' (the slide has: " + (known.empty() ? "none" : known) + ")", path_);
  }
  if (dicom_ != nullptr) {
    try {
      return dicom_->read_associated(name);
    } catch (core::Error& e) {
      e.add_context("associated image", name);
      throw;
    }
  }
  if (osr_ == nullptr) throw core::InternalError("slide '" + path_ + "' was reopened for reads alone (Slide::reopen)");
  std::vector<std::uint32_t> argb(static_cast<std::size_t>(it->width) * static_cast<std::size_t>(it->height));
  if (const auto error = osr_->run(
          path_, [&](openslide_t* osr) { openslide_read_associated_image(osr, name.c_str(), argb.data()); })) {
    core::InputError e("openslide: " + *error, path_);
    e.add_context("associated image", name);
    throw e;
  }
  return argb_to_rgb(argb, it->width, it->height);
}

namespace {
// `pixels` as read_region() returns them: in `into` when one is given.
cv::Mat deliver(const cv::Mat& pixels, cv::Mat into) {
  if (into.empty()) return pixels;
  pixels.copyTo(into);  // into's own memory: it has pixels' size and type
  return into;
}
}  // namespace

cv::Mat Slide::read_region(std::int64_t x, std::int64_t y, int level_index, std::int64_t width, std::int64_t height,
                           cv::Mat into) const {
  const auto fail = [&](const std::string& message) {
    core::InputError error(message, path_);
    error.add_context("region", region_text(x, y, width, height));
    error.add_context("level", level_index);
    return error;
  };
  if (level_index < 0 || level_index >= level_count()) throw fail("no pyramid level " + std::to_string(level_index));
  if (width <= 0 || height <= 0 || width > INT32_MAX || height > INT32_MAX ||
      width * height > static_cast<std::int64_t>(INT32_MAX)) {
    throw fail("invalid region size");
  }
  if (tiff_ != nullptr || dicom_ != nullptr) {
    // The level pixel nearest to (x, y): read_level_window() asks for llround(lx·downsample), which maps back
    // to lx exactly for any downsample ≥ 1.
    const double ds = levels_[static_cast<std::size_t>(level_index)].downsample;
    const auto level_coordinate = [&](std::int64_t v) {
      return std::llround(std::clamp(static_cast<double>(v) / ds, -kMaxLevelCoordinate, kMaxLevelCoordinate));
    };
    try {
      if (dicom_ != nullptr) {
        return deliver(dicom_->read(level_index, level_coordinate(x), level_coordinate(y), static_cast<int>(width),
                                    static_cast<int>(height)),
                       into);
      }
      return tiff_->read(level_index, level_coordinate(x), level_coordinate(y), static_cast<int>(width),
                         static_cast<int>(height), into);
    } catch (core::Error& e) {
      e.add_context("region", region_text(x, y, width, height));
      e.add_context("level", level_index);
      throw;
    }
  }
  std::vector<std::uint32_t> argb(static_cast<std::size_t>(width) * static_cast<std::size_t>(height));
  if (const auto message = osr_->run(path_, [&](openslide_t* osr) {
        openslide_read_region(osr, argb.data(), x, y, level_index, width, height);
      })) {
    // OpenSlide fails a read for damaged tile data ("Bogus marker length", "Corrupt JPEG data", "Cannot read
    // TIFF tile"); the slide opened, so the damage is in the pixels.
    core::CorruptTileError error(fmt::format("cannot read the region: openslide: {}", *message), path_);
    error.add_context("region", region_text(x, y, width, height));
    error.add_context("level", level_index);
    throw error;
  }
  return deliver(argb_to_rgb(argb, width, height), into);
}

int Slide::best_level_for_mpp(double target_mpp) const {
  if (!has_mpp()) throw_unknown_mpp();
  int best = 0;
  for (int i = 0; i < level_count(); ++i) {
    if (mpp_x_ * levels_[static_cast<std::size_t>(i)].downsample <= target_mpp * kLevelMppTolerance) best = i;
  }
  return best;
}

Slide::LevelRead Slide::plan_read_at_mpp(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height,
                                         double target_mpp) const {
  if (!(target_mpp > 0.0) || width <= 0 || height <= 0) {
    core::InputError error("invalid read at " + std::to_string(target_mpp) + " µm/px", path_);
    error.add_context("region", region_text(x, y, width, height));
    throw error;
  }
  LevelRead r;
  r.level = best_level_for_mpp(target_mpp);
  r.width = width;
  r.height = height;
  const double ds = levels_[static_cast<std::size_t>(r.level)].downsample;
  if (std::abs(mpp_x_ * ds - target_mpp) <= target_mpp * (kLevelMppTolerance - 1.0) &&
      std::abs(mpp_y_ * ds - target_mpp) <= target_mpp * (kLevelMppTolerance - 1.0)) {
    // The level is at the target resolution (its downsample is only off by rounding, as for odd-sized
    // slides): its pixels are the answer, no resampling.
    r.lx = static_cast<std::int64_t>(std::floor(static_cast<double>(x) / ds));
    r.ly = static_cast<std::int64_t>(std::floor(static_cast<double>(y) / ds));
    r.lw = width;
    r.lh = height;
    return r;
  }
  // The level-0 footprint of the requested pixels, in level pixels, rounded outward.
  const double x0 = static_cast<double>(x) / ds;
  const double y0 = static_cast<double>(y) / ds;
  const double x1 = (static_cast<double>(x) + static_cast<double>(width) * target_mpp / mpp_x_) / ds;
  const double y1 = (static_cast<double>(y) + static_cast<double>(height) * target_mpp / mpp_y_) / ds;
  r.lx = static_cast<std::int64_t>(std::floor(x0));
  r.ly = static_cast<std::int64_t>(std::floor(y0));
  // Tolerate floating error so an exact fit does not pick up an extra pixel.
  constexpr double kEpsilon = 1e-6;
  r.lw = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(x1 - kEpsilon)) - r.lx);
  r.lh = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(y1 - kEpsilon)) - r.ly);
  return r;
}

cv::Mat Slide::read_level_window(const LevelRead& r, cv::Mat into) const {
  // Level-0 coordinates of the level pixel (lx, ly), so OpenSlide reads on the level's pixel grid.
  const double ds = levels_[static_cast<std::size_t>(r.level)].downsample;
  return read_region(std::llround(static_cast<double>(r.lx) * ds), std::llround(static_cast<double>(r.ly) * ds),
                     r.level, r.lw, r.lh, std::move(into));
}

namespace {
cv::Mat resample(const cv::Mat& region, const Slide::LevelRead& r, cv::Mat into = cv::Mat()) {
  if (region.cols == r.width && region.rows == r.height) return region;
  cv::resize(region, into, cv::Size(static_cast<int>(r.width), static_cast<int>(r.height)), 0, 0, cv::INTER_AREA);
  return into;
}
}  // namespace

cv::Mat Slide::read_at_mpp(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height, double target_mpp,
                           cv::Mat into) const {
  const auto r = plan_read_at_mpp(x, y, width, height, target_mpp);
  // The level's pixels are the answer when no resampling is needed: read straight into `into`.
  if (r.lw == r.width && r.lh == r.height) return read_level_window(r, std::move(into));
  return resample(read_level_window(r), r, std::move(into));
}

SlideWindow::SlideWindow(const Slide& slide, std::int64_t x, std::int64_t y, std::int64_t width0, std::int64_t height0,
                         double target_mpp)
    : slide_(&slide) {
  // The window's size at the target resolution, rounded up, so that its level footprint covers the rectangle.
  const auto w = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(static_cast<double>(width0) * slide.mpp() / target_mpp)));
  const auto h = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(std::ceil(static_cast<double>(height0) * slide.mpp_y() / target_mpp)));
  window_ = slide.plan_read_at_mpp(x, y, w, h, target_mpp);
  pixels_ = slide.read_level_window(window_);
}

bool SlideWindow::contains(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height,
                           double target_mpp) const {
  const auto r = slide_->plan_read_at_mpp(x, y, width, height, target_mpp);
  return r.level == window_.level && r.lx >= window_.lx && r.ly >= window_.ly &&
         r.lx + r.lw <= window_.lx + window_.lw && r.ly + r.lh <= window_.ly + window_.lh;
}

cv::Mat SlideWindow::read_at_mpp(std::int64_t x, std::int64_t y, std::int64_t width, std::int64_t height,
                                 double target_mpp) const {
  const auto r = slide_->plan_read_at_mpp(x, y, width, height, target_mpp);
  if (!contains(x, y, width, height, target_mpp)) {
    throw core::InternalError("slide window: request outside the window");
  }
  const cv::Rect roi(static_cast<int>(r.lx - window_.lx), static_cast<int>(r.ly - window_.ly), static_cast<int>(r.lw),
                     static_cast<int>(r.lh));
  return resample(pixels_(roi).clone(), r);
}

cv::Mat Slide::thumbnail(int max_side) const {
  if (max_side <= 0) {
    throw core::InputError("invalid thumbnail size " + std::to_string(max_side), path_);
  }
  const double scale = static_cast<double>(max_side) / static_cast<double>(std::max(width(), height()));
  const double used_scale = std::min(1.0, scale);
  const int tw = std::max(1, static_cast<int>(std::lround(static_cast<double>(width()) * used_scale)));
  const int th = std::max(1, static_cast<int>(std::lround(static_cast<double>(height()) * used_scale)));
  int level_index = 0;
  for (int i = 0; i < level_count(); ++i) {
    const SlideLevel& l = levels_[static_cast<std::size_t>(i)];
    if (l.width >= tw && l.height >= th) level_index = i;
  }
  const SlideLevel& l = levels_[static_cast<std::size_t>(level_index)];
  cv::Mat region = read_region(0, 0, level_index, l.width, l.height);
  if (region.cols == tw && region.rows == th) return region;
  cv::Mat resized;
  cv::resize(region, resized, cv::Size(tw, th), 0, 0, cv::INTER_AREA);
  return resized;
}

}  // namespace tessera::io
