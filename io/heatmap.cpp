#include "io/heatmap.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <opencv2/imgproc.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/fault.h"
#include "io/hdf5.h"
#include "io/tiff_writer.h"

namespace tessera::io {
namespace {

constexpr const char* kFormatName = "tessera-heatmap";
constexpr std::int64_t kFormatVersion = 1;
// A map is at most one value per level-0 pixel of the largest slides; more than this is a corrupt header,
// refused before anything is allocated.
constexpr std::int64_t kMaxCells = std::int64_t{1} << 32;
// A float softmax can land a rounding step outside [0, 1] (1.0000002 is common): accepted, not a corrupt value.
constexpr float kProbabilitySlack = 1e-4f;

using hdf5::Handle;
using hdf5::Hdf5Checker;
using hdf5::QuietHdf5;

// ---------------------------------------------------------------------------------------------------------
// File helpers (the attributes and the map go through io/hdf5.h).

// HDF5 refuses a file shorter than the end address its superblock records with
// "truncated file: eof = <size>, sblock->base_addr = <b>, stored_eof = <expected>".
std::string truncated_message(const std::string& desc, std::int64_t actual) {
  const std::string key = "stored_eof = ";
  const auto at = desc.find(key);
  if (at != std::string::npos) {
    char* end = nullptr;
    const unsigned long long expected = std::strtoull(desc.c_str() + at + key.size(), &end, 10);
    if (end != desc.c_str() + at + key.size()) {
      return fmt::format("truncated: expected at least {} bytes, the file has {}", expected, actual);
    }
  }
  return fmt::format("truncated: the file has {} bytes (HDF5: {})", actual, desc);
}

// The left/top edge of footprint 0 along one axis: the tile centre minus half a step.
double footprint_start(std::int64_t origin, const Heatmap& h) {
  return static_cast<double>(origin) + 0.5 * static_cast<double>(h.tile - h.step);
}

std::vector<int> cell_indices(double start, double step, int cells, int n, double scale, double first) {
  std::vector<int> index(static_cast<std::size_t>(std::max(n, 0)), -1);
  if (step <= 0.0) return index;
  for (int k = 0; k < n; ++k) {
    const double centre = first + (k + 0.5) * scale;
    const double cell = std::floor((centre - start) / step);
    if (cell >= 0.0 && cell < cells) index[static_cast<std::size_t>(k)] = static_cast<int>(cell);
  }
  return index;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Geometry

std::int64_t Heatmap::scored_cells() const {
  return std::count_if(prob.begin(), prob.end(), [](float p) { return !std::isnan(p); });
}

float Heatmap::max_prob() const {
  float best = std::numeric_limits<float>::quiet_NaN();
  for (const float p : prob) {
    if (!std::isnan(p) && (std::isnan(best) || p > best)) best = p;
  }
  return best;
}

cv::Rect2d cell_footprint(const Heatmap& h, int row, int col) {
  const auto step = static_cast<double>(h.step);
  return {footprint_start(h.origin_x, h) + col * step, footprint_start(h.origin_y, h) + row * step, step, step};
}

cv::Point2d cell_centre(const Heatmap& h, int row, int col) {
  const double half = 0.5 * static_cast<double>(h.tile);
  return {static_cast<double>(h.origin_x + col * h.step) + half, static_cast<double>(h.origin_y + row * h.step) + half};
}

std::vector<int> cell_columns(const Heatmap& h, int n, double scale, double start) {
  return cell_indices(footprint_start(h.origin_x, h), static_cast<double>(h.step), h.cols, n, scale, start);
}

std::vector<int> cell_rows(const Heatmap& h, int n, double scale, double start) {
  return cell_indices(footprint_start(h.origin_y, h), static_cast<double>(h.step), h.rows, n, scale, start);
}

std::string heatmap_problem(const Heatmap& h) {
  if (h.slide_width <= 0 || h.slide_height <= 0) {
    return fmt::format("slide size {}x{} must be positive", h.slide_width, h.slide_height);
  }
  if (h.step <= 0 || h.tile <= 0) return fmt::format("step {} and tile {} must be positive", h.step, h.tile);
  if (h.rows < 0 || h.cols < 0) return fmt::format("grid {}x{} (rows x cols) must not be negative", h.rows, h.cols);
  if (!std::isfinite(h.slide_mpp) || h.slide_mpp < 0.0) return fmt::format("slide_mpp {} must be >= 0", h.slide_mpp);
  if (!std::isfinite(h.tile_mpp) || h.tile_mpp < 0.0) return fmt::format("tile_mpp {} must be >= 0", h.tile_mpp);
  const std::int64_t cells = std::int64_t{h.rows} * h.cols;
  if (cells > kMaxCells) return fmt::format("grid {}x{} is too large", h.rows, h.cols);
  if (static_cast<std::int64_t>(h.prob.size()) != cells) {
    return fmt::format("{} probabilities for a {}x{} grid", h.prob.size(), h.rows, h.cols);
  }
  for (std::size_t k = 0; k < h.prob.size(); ++k) {
    const float p = h.prob[k];
    if (!std::isnan(p) && !(p >= -kProbabilitySlack && p <= 1.0f + kProbabilitySlack)) {
      return fmt::format("probability {} at row {}, column {} is outside [0, 1]", p, k / h.cols, k % h.cols);
    }
  }
  return {};
}

// ---------------------------------------------------------------------------------------------------------
// heatmap.h5

void write_heatmap(const std::string& path, const Heatmap& h) {
  const Hdf5Checker h5(path, core::ErrorKind::internal);
  if (const std::string problem = heatmap_problem(h); !problem.empty()) h5.fail("invalid heatmap: " + problem);
  // HDF5 writes the file under a temporary name; core::write_atomic syncs it (HDF5 does not sync on close) and
  // renames it over `path`, and removes it when anything fails.
  core::write_atomic(path, [&](const std::string& temporary) {
    QuietHdf5 quiet;
    Handle fapl = h5.own(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "cannot create a file access list");
#if H5_VERSION_GE(1, 10, 7)
    h5.check(H5Pset_file_locking(fapl.get(), true, true), "cannot set file locking");
#endif
    Handle file = h5.own(H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose,
                         "cannot create the heatmap file");
    const hid_t root = file.get();
    // Every integer is stored as int64, every number as float64, every string as UTF-8.
    const auto write_int = [&](const char* name, std::int64_t value) {
      hdf5::write_attribute<std::int64_t>(h5, root, name, value);
    };
    const auto write_double = [&](const char* name, double value) {
      hdf5::write_attribute<double>(h5, root, name, value);
    };
    const auto write_string = [&](const char* name, const std::string& value) {
      hdf5::write_attribute<std::string>(h5, root, name, value);
    };
    write_string("format", kFormatName);
    write_int("version", kFormatVersion);
    write_string("slide_id", h.slide_id);
    write_string("slide_path", h.slide_path);
    write_int("slide_width", h.slide_width);
    write_int("slide_height", h.slide_height);
    write_double("slide_mpp", h.slide_mpp);
    write_double("tile_mpp", h.tile_mpp);
    write_int("origin_x", h.origin_x);
    write_int("origin_y", h.origin_y);
    write_int("step", h.step);
    write_int("tile", h.tile);
    write_int("rows", h.rows);
    write_int("cols", h.cols);
    write_string("checkpoint", h.checkpoint);

    const std::string what = "cannot write dataset '/prob'";
    Handle dataset = hdf5::create_dataset<float>(
        h5, root, "prob", {static_cast<hsize_t>(h.rows), static_cast<hsize_t>(h.cols)}, {}, what);
    // Fault point "heatmap.write" (core/fault.h): do=enospc|eio fails the map's write as a full disk would.
    if (const int error = core::fault::error_at("heatmap.write"); error != 0) h5.fail_system(what, error);
    hdf5::write_dataset(h5, dataset, h.prob, what);
    h5.close(dataset, what);
    h5.close(file, "cannot close the heatmap file");
  });
}

Heatmap read_heatmap(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) throw core::FileNotFoundError(path);
    throw core::InputError(std::string("cannot open: ") + std::strerror(errno), path);
  }
  if (!S_ISREG(info.st_mode)) throw core::InputError("not a regular file", path);
  const auto size = static_cast<std::int64_t>(info.st_size);
  if (size == 0) throw core::InputError("empty file (0 bytes), not a heatmap", path);

  QuietHdf5 quiet;
  const Hdf5Checker h5(path, core::ErrorKind::input);
  Handle fapl = hdf5::make_file_access(h5);
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id < 0) {
    const hdf5::Failure failure = hdf5::last_failure();
    if (!failure.truncated.empty()) throw core::InputError(truncated_message(failure.truncated, size), path);
    h5.fail("not a readable HDF5 heatmap", failure.text());
  }
  Handle file(id, H5Fclose);
  const hid_t root = file.get();
  const auto read_int = [&](const char* name) { return hdf5::read_attribute<std::int64_t>(h5, root, name); };
  const auto read_double = [&](const char* name) { return hdf5::read_attribute<double>(h5, root, name); };
  const auto read_string = [&](const char* name) { return hdf5::read_attribute<std::string>(h5, root, name); };

  if (!hdf5::has_attribute(h5, root, "format")) h5.fail("not a Tessera heatmap (no 'format' attribute)");
  const std::string format = read_string("format");
  if (format != kFormatName) {
    h5.fail(fmt::format("not a Tessera heatmap (format attribute is '{}', expected '{}')", format, kFormatName));
  }
  const std::int64_t version = read_int("version");
  if (version < 1) h5.fail(fmt::format("invalid heatmap format version {}", version));
  if (version > kFormatVersion) {
    h5.fail(fmt::format("heatmap format version {} is newer than this Tessera reads ({})", version, kFormatVersion));
  }

  Heatmap h;
  h.slide_id = read_string("slide_id");
  h.slide_path = read_string("slide_path");
  h.slide_width = read_int("slide_width");
  h.slide_height = read_int("slide_height");
  h.slide_mpp = read_double("slide_mpp");
  h.tile_mpp = read_double("tile_mpp");
  h.origin_x = read_int("origin_x");
  h.origin_y = read_int("origin_y");
  h.step = read_int("step");
  h.tile = read_int("tile");
  const std::int64_t rows = read_int("rows");
  const std::int64_t cols = read_int("cols");
  h.checkpoint = read_string("checkpoint");
  if (rows < 0 || cols < 0 || rows > std::numeric_limits<int>::max() || cols > std::numeric_limits<int>::max() ||
      rows * cols > kMaxCells) {
    h5.fail(fmt::format("invalid grid size {}x{} (rows x cols)", rows, cols));
  }
  h.rows = static_cast<int>(rows);
  h.cols = static_cast<int>(cols);

  const std::string what = "cannot read dataset '/prob'";
  const hdf5::Dataset prob = hdf5::open_dataset(h5, root, "/prob", what);
  hdf5::expect_class(h5, prob, H5T_FLOAT, "floating-point values");
  if (prob.dims != std::vector<hsize_t>{static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)}) {
    h5.fail(fmt::format("dataset '/prob' must have shape [{}, {}] (the rows and cols attributes)", rows, cols));
  }
  h.prob = hdf5::read_dataset<float>(h5, prob, what);
  if (const std::string problem = heatmap_problem(h); !problem.empty()) h5.fail("invalid heatmap: " + problem);
  return h;
}

// ---------------------------------------------------------------------------------------------------------
// Colour maps

Colormap parse_colormap(const std::string& name) {
  if (name == "inferno") return Colormap::inferno;
  if (name == "viridis") return Colormap::viridis;
  throw core::InternalError("unknown colour map '" + name + "' (known: inferno, viridis)");
}

const char* to_string(Colormap colormap) { return colormap == Colormap::inferno ? "inferno" : "viridis"; }

cv::Vec3b colormap_rgb(double p, Colormap colormap) {
  // OpenCV's tables, read once: a 256-entry ramp through applyColorMap (BGR out).
  static const auto tables = [] {
    cv::Mat ramp(256, 1, CV_8U);
    for (int k = 0; k < 256; ++k) ramp.at<std::uint8_t>(k) = static_cast<std::uint8_t>(k);
    std::array<std::array<cv::Vec3b, 256>, 2> out{};
    const std::array<int, 2> maps = {cv::COLORMAP_INFERNO, cv::COLORMAP_VIRIDIS};
    for (std::size_t m = 0; m < maps.size(); ++m) {
      cv::Mat bgr;
      cv::applyColorMap(ramp, bgr, maps[m]);
      for (int k = 0; k < 256; ++k) {
        const cv::Vec3b c = bgr.at<cv::Vec3b>(k);
        out[m][static_cast<std::size_t>(k)] = cv::Vec3b(c[2], c[1], c[0]);
      }
    }
    return out;
  }();
  const double clamped = std::isnan(p) ? 0.0 : std::clamp(p, 0.0, 1.0);
  const auto k = static_cast<std::size_t>(std::lround(clamped * 255.0));
  return tables[colormap == Colormap::inferno ? 0 : 1][k];
}

// ---------------------------------------------------------------------------------------------------------
// heatmap.tif

void write_heatmap_tiff(const std::string& path, const Heatmap& h, const HeatmapTiffOptions& options) {
  if (const std::string problem = heatmap_problem(h); !problem.empty()) {
    core::InternalError error("invalid heatmap: " + problem);
    error.add_context("file", path);
    throw error;
  }
  if (!(h.slide_mpp > 0.0)) {
    core::InternalError error("the heatmap TIFF needs the slide's um/px (slide_mpp is 0)");
    error.add_context("file", path);
    throw error;
  }
  const bool grey = options.encoding == HeatmapTiffOptions::Encoding::grey;
  const cv::Vec3b background = grey ? cv::Vec3b(0, 0, 0) : cv::Vec3b(255, 255, 255);

  TiffWriterOptions tiff;
  tiff.flavor = TiffFlavor::aperio;  // carries MPP, so viewers show the map at the slide's scale
  tiff.compression = TiffCompression::deflate;
  tiff.tile_size = options.tile_size;
  tiff.mpp = h.slide_mpp;
  constexpr double kObjectiveMicrons = 10.0;  // 40x ≈ 0.25 µm/px
  tiff.objective_power = kObjectiveMicrons / h.slide_mpp;
  tiff.description = fmt::format("Tessera tumour probability map of {} ({}, step {} px, tile {} px)", h.slide_id,
                                 grey ? "grey = 255 p" : to_string(options.colormap), h.step, h.tile);
  TiffWriter writer(path, h.slide_width, h.slide_height, tiff);

  const int width = static_cast<int>(h.slide_width);
  const std::vector<int> columns = cell_columns(h, width, 1.0);
  // One row of cells rendered to a full-width row of pixels; consecutive pixel rows of the same cell row reuse it.
  std::vector<cv::Vec3b> cell_colours(static_cast<std::size_t>(h.cols));
  cv::Mat row_pixels(1, width, CV_8UC3);
  int rendered_row = std::numeric_limits<int>::min();
  auto render_row = [&](int cell_row) {
    if (cell_row == rendered_row) return;
    rendered_row = cell_row;
    if (cell_row >= 0) {
      for (int j = 0; j < h.cols; ++j) {
        const float p = h.at(cell_row, j);
        cell_colours[static_cast<std::size_t>(j)] =
            std::isnan(p) ? background
            : grey        ? cv::Vec3b::all(static_cast<std::uint8_t>(std::lround(p * 255.0f)))
                          : colormap_rgb(p, options.colormap);
      }
    }
    auto* out = row_pixels.ptr<cv::Vec3b>();
    for (int x = 0; x < width; ++x) {
      const int j = columns[static_cast<std::size_t>(x)];
      out[x] = cell_row >= 0 && j >= 0 ? cell_colours[static_cast<std::size_t>(j)] : background;
    }
  };

  const double start_y = footprint_start(h.origin_y, h);
  const auto step = static_cast<double>(h.step);
  cv::Mat strip;
  for (std::int64_t y0 = 0; y0 < h.slide_height; y0 += options.tile_size) {
    const int n = static_cast<int>(std::min<std::int64_t>(options.tile_size, h.slide_height - y0));
    strip.create(n, width, CV_8UC3);
    for (int r = 0; r < n; ++r) {
      const double cell = std::floor((static_cast<double>(y0 + r) + 0.5 - start_y) / step);
      render_row(cell >= 0.0 && cell < h.rows ? static_cast<int>(cell) : -1);
      row_pixels.copyTo(strip.row(r));
    }
    writer.write_strip(strip);
  }
  writer.finish();
}

}  // namespace tessera::io
