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

namespace {

void check_tiff_heatmap(const std::string& path, const Heatmap& h) {
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
}

TiffWriterOptions heatmap_tiff_writer_options(const Heatmap& h, const HeatmapTiffOptions& options) {
  const bool grey = options.encoding == HeatmapTiffOptions::Encoding::grey;
  TiffWriterOptions tiff;
  tiff.flavor = TiffFlavor::aperio;  // carries MPP, so viewers show the map at the slide's scale
  tiff.compression = TiffCompression::deflate;
  tiff.tile_size = options.tile_size;
  tiff.threads = options.threads;
  tiff.mpp = h.slide_mpp;
  constexpr double kObjectiveMicrons = 10.0;  // 40x ≈ 0.25 µm/px
  tiff.objective_power = kObjectiveMicrons / h.slide_mpp;
  tiff.description = fmt::format("Tessera tumour probability map of {} ({}, step {} px, tile {} px)", h.slide_id,
                                 grey ? "grey = 255 p" : to_string(options.colormap), h.step, h.tile);
  return tiff;
}

// The colour of cell (row, col); -1 = outside the grid.
class CellColours {
 public:
  CellColours(const Heatmap& h, const HeatmapTiffOptions& options)
      : h_(h),
        options_(options),
        grey_(options.encoding == HeatmapTiffOptions::Encoding::grey),
        background_(grey_ ? cv::Vec3b(0, 0, 0) : cv::Vec3b(255, 255, 255)) {}
  cv::Vec3b operator()(int row, int col) const {
    if (row < 0 || col < 0) return background_;
    const float p = h_.at(row, col);
    if (std::isnan(p)) return background_;
    return grey_ ? cv::Vec3b::all(static_cast<std::uint8_t>(std::lround(p * 255.0f)))
                 : colormap_rgb(p, options_.colormap);
  }

 private:
  const Heatmap& h_;
  const HeatmapTiffOptions& options_;
  bool grey_;
  cv::Vec3b background_;
};

// Runs of equal descriptors along one axis of a pyramid level: run_of[x] is the run of column (row) x, start[r] the
// first column of run r (and start.back() the level's width).
struct Runs {
  std::vector<int> run_of;
  std::vector<std::int64_t> start;
  int count() const { return static_cast<int>(start.size()) - 1; }
};

// Level 0: runs of pixels in the same cell (or outside the grid, -1); `cell` gets each run's cell.
Runs cell_runs(const std::vector<int>& index, std::vector<int>& cell) {
  Runs runs;
  runs.run_of.resize(index.size());
  for (std::size_t x = 0; x < index.size(); ++x) {
    if (x == 0 || index[x] != index[x - 1]) {
      runs.start.push_back(static_cast<std::int64_t>(x));
      cell.push_back(index[x]);
    }
    runs.run_of[x] = static_cast<int>(runs.start.size()) - 1;
  }
  runs.start.push_back(static_cast<std::int64_t>(index.size()));
  return runs;
}

// The next level: pixel x takes the `factor` pixels factor·x + u of this one (the last repeated past the edge),
// and runs of pixels that take the same runs of this level. `sources` gets each new run's `factor` runs.
Runs downsampled_runs(const Runs& runs, std::int64_t size, int factor, std::vector<int>& sources) {
  const std::int64_t last = static_cast<std::int64_t>(runs.run_of.size()) - 1;
  Runs next;
  next.run_of.resize(static_cast<std::size_t>(size));
  std::vector<int> current(static_cast<std::size_t>(factor));
  for (std::int64_t x = 0; x < size; ++x) {
    for (int u = 0; u < factor; ++u) {
      current[static_cast<std::size_t>(u)] = runs.run_of[static_cast<std::size_t>(std::min(factor * x + u, last))];
    }
    if (x == 0 || !std::equal(current.begin(), current.end(), sources.end() - factor)) {
      next.start.push_back(x);
      sources.insert(sources.end(), current.begin(), current.end());
    }
    next.run_of[static_cast<std::size_t>(x)] = static_cast<int>(next.start.size()) - 1;
  }
  next.start.push_back(size);
  return next;
}

// The pixels of heatmap.tif, every level, without the area: each pixel of level 0 is the colour of its cell's
// footprint, so a level is runs of columns times runs of rows, each pair one colour (`values`, CV_8UC3, row runs ×
// column runs). Level k+1's pixel averages a factor×factor block of level k's; its runs are the distinct tuples of
// level-k runs its columns (rows) take, and its values are exactly what downsample_for_pyramid makes of a block
// laid out from those tuples — the same arithmetic as the strips' pyramid, on a grid of about the cells' size.
class HeatmapTiles final : public TileSource {
 public:
  HeatmapTiles(const Heatmap& h, const HeatmapTiffOptions& options, const TiffWriter& writer) {
    const CellColours colour(h, options);
    const int factor = writer.level_factor();
    Level base;
    std::vector<int> col_cell, row_cell;
    base.cols = cell_runs(cell_columns(h, static_cast<int>(h.slide_width), 1.0), col_cell);
    base.rows = cell_runs(cell_rows(h, static_cast<int>(h.slide_height), 1.0), row_cell);
    base.values.create(base.rows.count(), base.cols.count(), CV_8UC3);
    for (int i = 0; i < base.rows.count(); ++i) {
      auto* out = base.values.ptr<cv::Vec3b>(i);
      for (int j = 0; j < base.cols.count(); ++j) {
        out[j] = colour(row_cell[static_cast<std::size_t>(i)], col_cell[static_cast<std::size_t>(j)]);
      }
    }
    levels_.push_back(std::move(base));
    for (int k = 1; k < writer.level_count(); ++k) {
      const Level& above = levels_.back();
      Level level;
      std::vector<int> col_sources, row_sources;
      level.cols = downsampled_runs(above.cols, writer.level_width(k), factor, col_sources);
      level.rows = downsampled_runs(above.rows, writer.level_height(k), factor, row_sources);
      cv::Mat block(factor * level.rows.count(), factor * level.cols.count(), CV_8UC3);
      for (int y = 0; y < block.rows; ++y) {
        const int source_row = row_sources[static_cast<std::size_t>(y)];
        const auto* in = above.values.ptr<cv::Vec3b>(source_row);
        auto* out = block.ptr<cv::Vec3b>(y);
        for (int x = 0; x < block.cols; ++x) out[x] = in[col_sources[static_cast<std::size_t>(x)]];
      }
      level.values = downsample_for_pyramid(block, factor);
      levels_.push_back(std::move(level));
    }
  }

  void describe_tile(int level, std::int64_t x0, std::int64_t y0, int width, int height, std::string& key) override {
    const Tile& t = tile(level, x0, y0, width, height);
    const auto append = [&key](const void* data, std::size_t bytes) {
      key.append(static_cast<const char*>(data), bytes);
    };
    for (const auto* lengths : {&t.col_lengths, &t.row_lengths}) {
      const auto n = static_cast<std::uint32_t>(lengths->size());
      append(&n, sizeof n);
      append(lengths->data(), lengths->size() * sizeof(std::int32_t));
    }
    append(t.values.data(), t.values.size() * sizeof(cv::Vec3b));
  }

  void render_tile(int level, std::int64_t x0, std::int64_t y0, int width, int height, cv::Mat& out) override {
    const Tile& t = tile(level, x0, y0, width, height);
    out.create(height, width, CV_8UC3);
    int y = 0;
    for (std::size_t i = 0; i < t.row_lengths.size(); ++i) {
      int x = 0;
      for (std::size_t j = 0; j < t.col_lengths.size(); ++j) {
        const cv::Vec3b c = t.values[i * t.col_lengths.size() + j];
        out(cv::Rect(x, y, t.col_lengths[j], t.row_lengths[i])).setTo(cv::Scalar(c[0], c[1], c[2]));
        x += t.col_lengths[j];
      }
      y += t.row_lengths[i];
    }
  }

 private:
  struct Level {
    Runs cols, rows;
    cv::Mat values;
  };
  // One tile: runs of columns and of rows (clipped to the tile, the last run carried to its edge as the strips pad
  // it, neighbours of equal colours merged) and the colour of each pair, row-major.
  struct Tile {
    int level = -1;
    std::int64_t x0 = -1, y0 = -1;
    int width = 0, height = 0;
    std::vector<std::int32_t> col_lengths, row_lengths;
    std::vector<int> col_runs, row_runs;
    std::vector<cv::Vec3b> values;
  };

  // The runs of [first, first + length) of `runs`, clipped, the last extended to the end.
  static void clip(const Runs& runs, std::int64_t first, int length, std::vector<int>& which,
                   std::vector<std::int32_t>& lengths) {
    which.clear();
    lengths.clear();
    const std::int64_t end = first + length;
    const auto last_pixel = static_cast<std::int64_t>(runs.run_of.size()) - 1;
    const int last = runs.run_of[static_cast<std::size_t>(std::min(end - 1, last_pixel))];
    for (int r = runs.run_of[static_cast<std::size_t>(first)]; r <= last; ++r) {
      const std::int64_t from = std::max(runs.start[static_cast<std::size_t>(r)], first);
      const std::int64_t to = r == last ? end : runs.start[static_cast<std::size_t>(r) + 1];
      which.push_back(r);
      lengths.push_back(static_cast<std::int32_t>(to - from));
    }
  }

  const Tile& tile(int level, std::int64_t x0, std::int64_t y0, int width, int height) {
    Tile& t = last_;
    if (t.level == level && t.x0 == x0 && t.y0 == y0 && t.width == width && t.height == height) return t;
    t.level = level;
    t.x0 = x0;
    t.y0 = y0;
    t.width = width;
    t.height = height;
    const Level& l = levels_[static_cast<std::size_t>(level)];
    clip(l.cols, x0, width, t.col_runs, t.col_lengths);
    clip(l.rows, y0, height, t.row_runs, t.row_lengths);
    const auto value = [&](std::size_t i, std::size_t j) {
      return l.values.at<cv::Vec3b>(t.row_runs[i], t.col_runs[j]);
    };
    // Merge neighbouring columns of equal colours over every row, then neighbouring rows over the columns left:
    // a tile of one colour has one key however many cells it crosses.
    std::vector<std::size_t> cols;
    for (std::size_t j = 0; j < t.col_runs.size(); ++j) {
      bool same = !cols.empty();
      for (std::size_t i = 0; same && i < t.row_runs.size(); ++i) same = value(i, cols.back()) == value(i, j);
      if (same) {
        t.col_lengths[cols.size() - 1] += t.col_lengths[j];
      } else {
        t.col_lengths[cols.size()] = t.col_lengths[j];
        cols.push_back(j);
      }
    }
    t.col_lengths.resize(cols.size());
    std::vector<std::size_t> rows;
    for (std::size_t i = 0; i < t.row_runs.size(); ++i) {
      bool same = !rows.empty();
      for (std::size_t c = 0; same && c < cols.size(); ++c) same = value(rows.back(), cols[c]) == value(i, cols[c]);
      if (same) {
        t.row_lengths[rows.size() - 1] += t.row_lengths[i];
      } else {
        t.row_lengths[rows.size()] = t.row_lengths[i];
        rows.push_back(i);
      }
    }
    t.row_lengths.resize(rows.size());
    t.values.clear();
    for (const std::size_t i : rows) {
      for (const std::size_t j : cols) t.values.push_back(value(i, j));
    }
    return t;
  }

  std::vector<Level> levels_;
  Tile last_;
};

}  // namespace

void write_heatmap_tiff(const std::string& path, const Heatmap& h, const HeatmapTiffOptions& options) {
  check_tiff_heatmap(path, h);
  TiffWriter writer(path, h.slide_width, h.slide_height, heatmap_tiff_writer_options(h, options));
  HeatmapTiles tiles(h, options, writer);
  writer.write_tiles(tiles);
  writer.finish();
}

void write_heatmap_tiff_by_strips(const std::string& path, const Heatmap& h, const HeatmapTiffOptions& options) {
  check_tiff_heatmap(path, h);
  const CellColours colour(h, options);
  TiffWriter writer(path, h.slide_width, h.slide_height, heatmap_tiff_writer_options(h, options));
  const int width = static_cast<int>(h.slide_width);
  const std::vector<int> columns = cell_columns(h, width, 1.0);
  const std::vector<int> rows = cell_rows(h, static_cast<int>(h.slide_height), 1.0);
  cv::Mat strip;
  for (std::int64_t y0 = 0; y0 < h.slide_height; y0 += options.tile_size) {
    const int n = static_cast<int>(std::min<std::int64_t>(options.tile_size, h.slide_height - y0));
    strip.create(n, width, CV_8UC3);
    for (int r = 0; r < n; ++r) {
      auto* out = strip.ptr<cv::Vec3b>(r);
      const int row = rows[static_cast<std::size_t>(y0 + r)];
      for (int x = 0; x < width; ++x) out[x] = colour(row, columns[static_cast<std::size_t>(x)]);
    }
    writer.write_strip(strip);
  }
  writer.finish();
}

}  // namespace tessera::io
