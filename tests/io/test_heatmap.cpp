// heatmap.h5 (round trip, refusals naming the file) and heatmap.tif (OpenSlide opens it at the slide's size and its
// pixels follow the map; the tile-sharing writer gives the same tags and pixels, directory by directory and tile by
// tile, as the plain strip writer).
#include "io/heatmap.h"

#include <hdf5.h>
#include <openslide.h>
#include <tiffio.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/testing.h"

namespace tessera::io {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A rows×cols map with a deterministic mix of values and unscored cells.
Heatmap make_heatmap(int rows, int cols, std::int64_t tile, std::int64_t step) {
  Heatmap h;
  h.slide_id = "tumor_042";
  h.slide_path = "/data/slides/tumor_042.svs";
  h.slide_mpp = 0.25;
  h.tile_mpp = 0.5;
  h.origin_x = 0;
  h.origin_y = 0;
  h.tile = tile;
  h.step = step;
  h.rows = rows;
  h.cols = cols;
  h.slide_width = (cols - 1) * step + tile + 37;  // not a multiple of anything
  h.slide_height = (rows - 1) * step + tile + 11;
  h.checkpoint = "/runs/demo/checkpoint.h5";
  h.prob.resize(static_cast<std::size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      const int k = i * cols + j;
      h.prob[static_cast<std::size_t>(k)] = (i + 2 * j) % 7 == 0 ? kNaN : static_cast<float>((k * 37) % 101) / 100.0f;
    }
  }
  return h;
}

void expect_same(const Heatmap& a, const Heatmap& b) {
  EXPECT_EQ(a.slide_id, b.slide_id);
  EXPECT_EQ(a.slide_path, b.slide_path);
  EXPECT_EQ(a.slide_width, b.slide_width);
  EXPECT_EQ(a.slide_height, b.slide_height);
  EXPECT_EQ(a.slide_mpp, b.slide_mpp);
  EXPECT_EQ(a.tile_mpp, b.tile_mpp);
  EXPECT_EQ(a.origin_x, b.origin_x);
  EXPECT_EQ(a.origin_y, b.origin_y);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.tile, b.tile);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  EXPECT_EQ(a.checkpoint, b.checkpoint);
  ASSERT_EQ(a.prob.size(), b.prob.size());
  for (std::size_t k = 0; k < a.prob.size(); ++k) {
    if (std::isnan(a.prob[k])) {
      EXPECT_TRUE(std::isnan(b.prob[k])) << "cell " << k;
    } else {
      EXPECT_EQ(a.prob[k], b.prob[k]) << "cell " << k;
    }
  }
}

// The core::InputError read_heatmap throws for `path`, with the message checked to name the file and contain `text`.
void expect_refused(const std::string& path, const std::string& text) {
  try {
    read_heatmap(path);
    FAIL() << "read_heatmap accepted " << path;
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(e.message().find(text), std::string::npos) << e.what();
  }
}

std::vector<std::string> folder_names(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

// Opens an HDF5 file read-write for the tests that damage a valid heatmap.
struct H5File {
  hid_t id;
  explicit H5File(const std::string& path) : id(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {}
  ~H5File() {
    if (id >= 0) H5Fclose(id);
  }
};

void set_int_attribute(const std::string& path, const char* name, std::int64_t value) {
  H5File file(path);
  ASSERT_GE(file.id, 0);
  const hid_t attribute = H5Aopen(file.id, name, H5P_DEFAULT);
  ASSERT_GE(attribute, 0);
  ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, &value), 0);
  H5Aclose(attribute);
}

TEST(Heatmap, RoundTripKeepsEveryFieldAndNaN) {
  testing::TempDir dir;
  const Heatmap h = make_heatmap(9, 13, 512, 256);
  const std::string path = dir.file("tumor_042.heatmap.h5");
  write_heatmap(path, h);
  expect_same(h, read_heatmap(path));
  // Atomic: nothing but the file itself is left behind.
  EXPECT_EQ(folder_names(dir.path()), std::vector<std::string>{"tumor_042.heatmap.h5"});
}

TEST(Heatmap, SoftmaxRoundingJustAboveOneIsAccepted) {
  testing::TempDir dir;
  Heatmap h = make_heatmap(3, 4, 256, 256);
  h.prob[5] = 1.0000002f;  // what a float softmax returns for a confident tile
  h.prob[6] = -1e-7f;
  EXPECT_EQ(heatmap_problem(h), "");
  write_heatmap(dir.file("a.h5"), h);
  EXPECT_EQ(read_heatmap(dir.file("a.h5")).prob[5], 1.0000002f);
  h.prob[5] = 1.01f;
  EXPECT_NE(heatmap_problem(h), "");
}

TEST(Heatmap, EmptyGridRoundTrips) {
  testing::TempDir dir;
  Heatmap h = make_heatmap(3, 4, 256, 256);
  h.rows = 0;
  h.cols = 0;
  h.prob.clear();
  write_heatmap(dir.file("empty.h5"), h);
  const Heatmap back = read_heatmap(dir.file("empty.h5"));
  EXPECT_EQ(back.rows, 0);
  EXPECT_EQ(back.cols, 0);
  EXPECT_TRUE(back.prob.empty());
  EXPECT_EQ(back.scored_cells(), 0);
  EXPECT_TRUE(std::isnan(back.max_prob()));
}

TEST(Heatmap, WriteRefusesAnInvalidMapAndLeavesNothing) {
  testing::TempDir dir;
  Heatmap h = make_heatmap(4, 5, 256, 256);
  h.prob.pop_back();
  EXPECT_THROW(write_heatmap(dir.file("a.h5"), h), core::InternalError);
  h = make_heatmap(4, 5, 256, 256);
  h.prob[3] = 1.5f;
  try {
    write_heatmap(dir.file("a.h5"), h);
    FAIL();
  } catch (const core::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("row 0, column 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a.h5"), std::string::npos) << e.what();
  }
  h = make_heatmap(4, 5, 256, 0);
  EXPECT_THROW(write_heatmap(dir.file("a.h5"), h), core::InternalError);
  EXPECT_TRUE(folder_names(dir.path()).empty());
}

TEST(Heatmap, ReadRefusesMissingEmptyAndGarbageFiles) {
  testing::TempDir dir;
  EXPECT_THROW(read_heatmap(dir.file("missing.h5")), core::FileNotFoundError);
  std::ofstream(dir.file("empty.h5")).close();
  expect_refused(dir.file("empty.h5"), "empty file");
  std::ofstream(dir.file("text.h5")) << "this is not an HDF5 file\n";
  expect_refused(dir.file("text.h5"), "not a readable HDF5 heatmap");
}

TEST(Heatmap, ReadRefusesATruncatedFile) {
  testing::TempDir dir;
  const std::string path = dir.file("big.heatmap.h5");
  write_heatmap(path, make_heatmap(120, 160, 256, 128));
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  expect_refused(path, "truncated");
}

TEST(Heatmap, ReadRefusesAForeignHdf5File) {
  testing::TempDir dir;
  const std::string path = dir.file("foreign.h5");
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  H5Fclose(file);
  expect_refused(path, "not a Tessera heatmap");
}

TEST(Heatmap, ReadRefusesAShapeThatDisagreesWithTheAttributes) {
  testing::TempDir dir;
  const std::string path = dir.file("shape.h5");
  write_heatmap(path, make_heatmap(6, 7, 256, 256));
  set_int_attribute(path, "rows", 5);
  expect_refused(path, "dataset '/prob' must have shape [5, 7]");
}

TEST(Heatmap, ReadRefusesANewerVersionAndBadGeometry) {
  testing::TempDir dir;
  const std::string path = dir.file("v.h5");
  write_heatmap(path, make_heatmap(6, 7, 256, 256));
  set_int_attribute(path, "version", 99);
  expect_refused(path, "version 99 is newer");
  write_heatmap(path, make_heatmap(6, 7, 256, 256));
  set_int_attribute(path, "step", 0);
  expect_refused(path, "step 0");
}

TEST(Heatmap, ReadRefusesProbabilitiesOutsideZeroOne) {
  testing::TempDir dir;
  const std::string path = dir.file("range.h5");
  const Heatmap h = make_heatmap(6, 7, 256, 256);
  write_heatmap(path, h);
  {
    H5File file(path);
    ASSERT_GE(file.id, 0);
    const hid_t dataset = H5Dopen2(file.id, "prob", H5P_DEFAULT);
    ASSERT_GE(dataset, 0);
    std::vector<float> values = h.prob;
    values[2 * 7 + 4] = 1.25f;
    ASSERT_GE(H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    H5Dclose(dataset);
  }
  expect_refused(path, "probability 1.25 at row 2, column 4 is outside [0, 1]");
}

TEST(Heatmap, FootprintsAreCentredOnTheirTiles) {
  Heatmap h = make_heatmap(3, 4, 200, 100);
  h.origin_x = 10;
  h.origin_y = 30;
  // Tile (1, 2) spans x [210, 410), y [130, 330); its footprint is the central 100 px square.
  const cv::Rect2d f = cell_footprint(h, 1, 2);
  EXPECT_EQ(f, cv::Rect2d(260, 180, 100, 100));
  EXPECT_EQ(cell_centre(h, 1, 2), cv::Point2d(310, 230));
  // Level-0 pixels: footprints of column 0 start at 10 + 50 = 60.
  const std::vector<int> columns = cell_columns(h, 500, 1.0);
  EXPECT_EQ(columns[59], -1);
  EXPECT_EQ(columns[60], 0);
  EXPECT_EQ(columns[159], 0);
  EXPECT_EQ(columns[160], 1);
  EXPECT_EQ(columns[459], 3);
  EXPECT_EQ(columns[460], -1);
  // At 50 level-0 px per output pixel, pixel k's centre is at 50k + 25.
  const std::vector<int> coarse = cell_rows(h, 8, 50.0);
  EXPECT_EQ(coarse, (std::vector<int>{-1, -1, 0, 0, 1, 1, 2, 2}));
}

TEST(Heatmap, ColormapsAreTheirMatplotlibEnds) {
  // inferno runs from near-black to pale yellow, viridis from dark purple to yellow.
  const cv::Vec3b inferno0 = colormap_rgb(0.0, Colormap::inferno);
  const cv::Vec3b inferno1 = colormap_rgb(1.0, Colormap::inferno);
  EXPECT_LT(inferno0[0] + inferno0[1] + inferno0[2], 30);
  EXPECT_GT(inferno1[0], 240);
  EXPECT_GT(inferno1[1], 240);
  const cv::Vec3b viridis0 = colormap_rgb(0.0, Colormap::viridis);
  const cv::Vec3b viridis1 = colormap_rgb(1.0, Colormap::viridis);
  EXPECT_GT(viridis0[2], viridis0[1]);  // purple: blue over green
  EXPECT_GT(viridis1[0], 200);          // yellow: red and green high, blue low
  EXPECT_LT(viridis1[2], 80);
  EXPECT_EQ(parse_colormap("viridis"), Colormap::viridis);
  EXPECT_THROW(parse_colormap("jet"), core::InternalError);
}

// The probability map as an OpenSlide reader sees it.
struct OpenSlideHandle {
  openslide_t* osr;
  explicit OpenSlideHandle(const std::string& path) : osr(openslide_open(path.c_str())) {}
  ~OpenSlideHandle() {
    if (osr != nullptr) openslide_close(osr);
  }
  cv::Vec3b pixel(std::int64_t x, std::int64_t y) const {
    std::uint32_t argb = 0;
    openslide_read_region(osr, &argb, x, y, 0, 1, 1);
    return cv::Vec3b((argb >> 16) & 0xFF, (argb >> 8) & 0xFF, argb & 0xFF);
  }
};

class HeatmapTiff : public ::testing::TestWithParam<HeatmapTiffOptions::Encoding> {};

TEST_P(HeatmapTiff, OpensWithOpenSlideAtTheSlideSizeAndFollowsTheMap) {
  testing::TempDir dir;
  // Overlapping tiles (step half a tile) and an offset grid: footprints are what the pixels follow.
  Heatmap h = make_heatmap(14, 19, 160, 80);
  h.origin_x = 24;
  h.origin_y = 8;
  h.slide_width = 1733;
  h.slide_height = 1291;
  HeatmapTiffOptions options;
  options.encoding = GetParam();
  const std::string path = dir.file("tumor_042.heatmap.tif");
  write_heatmap_tiff(path, h, options);
  EXPECT_EQ(folder_names(dir.path()), std::vector<std::string>{"tumor_042.heatmap.tif"});

  OpenSlideHandle slide(path);
  ASSERT_NE(slide.osr, nullptr);
  ASSERT_EQ(openslide_get_error(slide.osr), nullptr);
  std::int64_t w = 0, height = 0;
  openslide_get_level0_dimensions(slide.osr, &w, &height);
  EXPECT_EQ(w, h.slide_width);
  EXPECT_EQ(height, h.slide_height);
  EXPECT_GE(openslide_get_level_count(slide.osr), 3);  // 1733 → 867 → 434
  const char* mpp = openslide_get_property_value(slide.osr, OPENSLIDE_PROPERTY_NAME_MPP_X);
  ASSERT_NE(mpp, nullptr);
  EXPECT_DOUBLE_EQ(std::stod(mpp), h.slide_mpp);

  const bool grey = GetParam() == HeatmapTiffOptions::Encoding::grey;
  auto expected = [&](float p) {
    if (std::isnan(p)) return grey ? cv::Vec3b(0, 0, 0) : cv::Vec3b(255, 255, 255);
    if (grey) return cv::Vec3b::all(static_cast<std::uint8_t>(std::lround(p * 255.0f)));
    return colormap_rgb(p, Colormap::inferno);
  };
  for (int i = 0; i < h.rows; ++i) {
    for (int j = 0; j < h.cols; ++j) {
      const cv::Rect2d f = cell_footprint(h, i, j);
      // The footprint's first and last pixel, both ways: exact edges, no bleeding between cells.
      for (const auto& [x, y] : {std::pair{f.x, f.y}, std::pair{f.x + f.width - 1, f.y + f.height - 1}}) {
        const auto px = static_cast<std::int64_t>(x), py = static_cast<std::int64_t>(y);
        if (px >= h.slide_width || py >= h.slide_height) continue;
        EXPECT_EQ(slide.pixel(px, py), expected(h.at(i, j))) << "cell " << i << "," << j << " at " << px << "," << py;
      }
    }
  }
  // Outside the grid: the background.
  EXPECT_EQ(slide.pixel(0, 0), expected(kNaN));
  EXPECT_EQ(slide.pixel(h.slide_width - 1, h.slide_height - 1), expected(kNaN));
}

INSTANTIATE_TEST_SUITE_P(Encodings, HeatmapTiff,
                         ::testing::Values(HeatmapTiffOptions::Encoding::colour, HeatmapTiffOptions::Encoding::grey),
                         [](const ::testing::TestParamInfo<HeatmapTiffOptions::Encoding>& param) {
                           return param.param == HeatmapTiffOptions::Encoding::grey ? std::string("grey")
                                                                                    : std::string("colour");
                         });

// ---------------------------------------------------------------------------------------------------------
// write_heatmap_tiff (runs of cells, shared tiles) against write_heatmap_tiff_by_strips (every pixel rendered).

struct TiffCloser {
  void operator()(TIFF* tif) const { TIFFClose(tif); }
};
using TiffHandle = std::unique_ptr<TIFF, TiffCloser>;

std::string tag_text(TIFF* tif, std::uint32_t tag) {
  const char* text = nullptr;
  return TIFFGetField(tif, tag, &text) == 1 && text != nullptr ? std::string(text) : std::string("(none)");
}

// What a reader sees of one directory: its tags and its decoded pixels, tile by tile (strip by strip).
struct Directory {
  std::uint32_t width = 0, height = 0, tile_width = 0, tile_height = 0, subfile = 0, rows_per_strip = 0;
  std::uint16_t compression = 0, photometric = 0, predictor = 0, unit = 0, samples = 0, bits = 0, planar = 0;
  float x_resolution = 0, y_resolution = 0;
  std::string description, software;
  std::vector<std::vector<unsigned char>> pieces;  // decoded tiles or strips
  std::uint64_t distinct_offsets = 0;
};

std::vector<Directory> read_directories(const std::string& path) {
  TiffHandle tif(TIFFOpen(path.c_str(), "r"));
  if (!tif) return {};
  std::vector<Directory> out;
  do {
    TIFF* t = tif.get();
    Directory d;
    TIFFGetField(t, TIFFTAG_IMAGEWIDTH, &d.width);
    TIFFGetField(t, TIFFTAG_IMAGELENGTH, &d.height);
    TIFFGetField(t, TIFFTAG_TILEWIDTH, &d.tile_width);
    TIFFGetField(t, TIFFTAG_TILELENGTH, &d.tile_height);
    TIFFGetField(t, TIFFTAG_ROWSPERSTRIP, &d.rows_per_strip);
    TIFFGetField(t, TIFFTAG_SUBFILETYPE, &d.subfile);
    TIFFGetField(t, TIFFTAG_COMPRESSION, &d.compression);
    TIFFGetField(t, TIFFTAG_PHOTOMETRIC, &d.photometric);
    TIFFGetField(t, TIFFTAG_PREDICTOR, &d.predictor);
    TIFFGetField(t, TIFFTAG_RESOLUTIONUNIT, &d.unit);
    TIFFGetField(t, TIFFTAG_SAMPLESPERPIXEL, &d.samples);
    TIFFGetField(t, TIFFTAG_BITSPERSAMPLE, &d.bits);
    TIFFGetField(t, TIFFTAG_PLANARCONFIG, &d.planar);
    TIFFGetField(t, TIFFTAG_XRESOLUTION, &d.x_resolution);
    TIFFGetField(t, TIFFTAG_YRESOLUTION, &d.y_resolution);
    d.description = tag_text(t, TIFFTAG_IMAGEDESCRIPTION);
    d.software = tag_text(t, TIFFTAG_SOFTWARE);
    const bool tiled = TIFFIsTiled(t) != 0;
    const std::uint32_t n = tiled ? TIFFNumberOfTiles(t) : TIFFNumberOfStrips(t);
    const tmsize_t bytes = tiled ? TIFFTileSize(t) : TIFFStripSize(t);
    std::set<std::uint64_t> offsets;
    for (std::uint32_t k = 0; k < n; ++k) {
      std::vector<unsigned char> piece(static_cast<std::size_t>(bytes));
      const tmsize_t got =
          tiled ? TIFFReadEncodedTile(t, k, piece.data(), bytes) : TIFFReadEncodedStrip(t, k, piece.data(), bytes);
      EXPECT_GT(got, 0) << path << ": piece " << k << " of directory " << out.size();
      piece.resize(static_cast<std::size_t>(std::max<tmsize_t>(got, 0)));
      d.pieces.push_back(std::move(piece));
      offsets.insert(TIFFGetStrileOffset(t, k));
    }
    d.distinct_offsets = offsets.size();
    out.push_back(std::move(d));
  } while (TIFFReadDirectory(tif.get()) == 1);
  return out;
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return {std::istreambuf_iterator<char>(in), {}};
}

void expect_same_tiff(const std::string& expected_path, const std::string& actual_path) {
  const std::vector<Directory> expected = read_directories(expected_path);
  const std::vector<Directory> actual = read_directories(actual_path);
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t k = 0; k < expected.size(); ++k) {
    const Directory& e = expected[k];
    const Directory& a = actual[k];
    SCOPED_TRACE("directory " + std::to_string(k));
    EXPECT_EQ(a.width, e.width);
    EXPECT_EQ(a.height, e.height);
    EXPECT_EQ(a.tile_width, e.tile_width);
    EXPECT_EQ(a.tile_height, e.tile_height);
    EXPECT_EQ(a.rows_per_strip, e.rows_per_strip);
    EXPECT_EQ(a.subfile, e.subfile);
    EXPECT_EQ(a.compression, e.compression);
    EXPECT_EQ(a.photometric, e.photometric);
    EXPECT_EQ(a.predictor, e.predictor);
    EXPECT_EQ(a.unit, e.unit);
    EXPECT_EQ(a.samples, e.samples);
    EXPECT_EQ(a.bits, e.bits);
    EXPECT_EQ(a.planar, e.planar);
    EXPECT_EQ(a.x_resolution, e.x_resolution);
    EXPECT_EQ(a.y_resolution, e.y_resolution);
    EXPECT_EQ(a.description, e.description);
    EXPECT_EQ(a.software, e.software);
    ASSERT_EQ(a.pieces.size(), e.pieces.size());
    for (std::size_t t = 0; t < e.pieces.size(); ++t) {
      // Whole decoded tiles, their padding past the image's edge included.
      EXPECT_TRUE(a.pieces[t] == e.pieces[t]) << "tile (strip) " << t << " differs";
    }
  }
}

struct SharedTileCase {
  const char* name;
  int rows, cols;
  std::int64_t tile, step, origin_x, origin_y, width, height;
  int tiff_tile;
  HeatmapTiffOptions::Encoding encoding;
};

class HeatmapTiffSharedTiles : public ::testing::TestWithParam<SharedTileCase> {};

TEST_P(HeatmapTiffSharedTiles, SameTagsAndPixelsAsEveryPixelRendered) {
  const SharedTileCase& c = GetParam();
  testing::TempDir dir;
  Heatmap h = make_heatmap(c.rows, c.cols, c.tile, c.step);
  h.origin_x = c.origin_x;
  h.origin_y = c.origin_y;
  h.slide_width = c.width;
  h.slide_height = c.height;
  // A block of equal values: equal neighbours' footprints merge into shared tiles.
  for (int i = 0; i < std::min(4, c.rows); ++i) {
    for (int j = 0; j < std::min(5, c.cols); ++j) h.prob[static_cast<std::size_t>(i) * c.cols + j] = 0.75f;
  }
  HeatmapTiffOptions options;
  options.encoding = c.encoding;
  options.tile_size = c.tiff_tile;
  const std::string reference = dir.file("strips.tif");
  const std::string shared = dir.file("shared.tif");
  write_heatmap_tiff_by_strips(reference, h, options);
  write_heatmap_tiff(shared, h, options);
  expect_same_tiff(reference, shared);

  // Its distinct tiles compressed on three threads (in batches of 48, one thread's 16: odd_step_small_tiles has more
  // than one at level 0): the same file, byte for byte.
  HeatmapTiffOptions threaded = options;
  threaded.threads = 3;
  write_heatmap_tiff(dir.file("threads.tif"), h, threaded);
  EXPECT_TRUE(file_bytes(dir.file("threads.tif")) == file_bytes(shared));

  // Shared tiles: level 0 stores fewer tile bodies than it has tiles (the background alone repeats).
  const std::vector<Directory> directories = read_directories(shared);
  ASSERT_FALSE(directories.empty());
  EXPECT_LT(directories.front().distinct_offsets, directories.front().pieces.size());

  // OpenSlide reads it as before: vendor, resolution, every level's size and pixels.
  OpenSlideHandle a(reference), b(shared);
  ASSERT_NE(b.osr, nullptr);
  ASSERT_EQ(openslide_get_error(b.osr), nullptr);
  EXPECT_STREQ(openslide_get_property_value(b.osr, OPENSLIDE_PROPERTY_NAME_VENDOR), "aperio");
  EXPECT_DOUBLE_EQ(std::stod(openslide_get_property_value(b.osr, OPENSLIDE_PROPERTY_NAME_MPP_X)), h.slide_mpp);
  ASSERT_EQ(openslide_get_level_count(b.osr), openslide_get_level_count(a.osr));
  for (std::int32_t level = 0; level < openslide_get_level_count(b.osr); ++level) {
    std::int64_t w = 0, height = 0, w_ref = 0, height_ref = 0;
    openslide_get_level_dimensions(b.osr, level, &w, &height);
    openslide_get_level_dimensions(a.osr, level, &w_ref, &height_ref);
    ASSERT_EQ(w, w_ref);
    ASSERT_EQ(height, height_ref);
    const double downsample = openslide_get_level_downsample(b.osr, level);
    std::vector<std::uint32_t> pixels(static_cast<std::size_t>(w * height)), pixels_ref(pixels.size());
    openslide_read_region(b.osr, pixels.data(), 0, 0, level, w, height);
    openslide_read_region(a.osr, pixels_ref.data(), 0, 0, level, w, height);
    EXPECT_TRUE(pixels == pixels_ref) << "level " << level << " (downsample " << downsample << ")";
  }
  EXPECT_EQ(openslide_get_error(b.osr), nullptr);
  // The slide's own size at level 0.
  std::int64_t w = 0, height = 0;
  openslide_get_level0_dimensions(b.osr, &w, &height);
  EXPECT_EQ(w, h.slide_width);
  EXPECT_EQ(height, h.slide_height);
}

INSTANTIATE_TEST_SUITE_P(
    Maps, HeatmapTiffSharedTiles,
    ::testing::Values(
        // Overlapping tiles and an offset grid; odd sizes: edge tiles padded on both sides at every level.
        SharedTileCase{"overlapping_offset_colour", 14, 19, 160, 80, 24, 8, 1733, 1291, 256,
                       HeatmapTiffOptions::Encoding::colour},
        SharedTileCase{"overlapping_offset_grey", 14, 19, 160, 80, 24, 8, 1733, 1291, 256,
                       HeatmapTiffOptions::Encoding::grey},
        // Footprints not aligned with TIFF tiles (step 384, tiles of 256), as infer's default grid at 0.25 um/px;
        // several levels (down to 512 px).
        SharedTileCase{"step_384", 5, 7, 384, 384, 0, 0, 2601, 1859, 256, HeatmapTiffOptions::Encoding::colour},
        // Footprints narrower than a pixel of the lower levels, odd step, small TIFF tiles.
        SharedTileCase{"odd_step_small_tiles", 31, 27, 21, 7, 3, 5, 250, 300, 32, HeatmapTiffOptions::Encoding::colour},
        // A grid larger than the slide on one side, smaller on the other.
        SharedTileCase{"grid_past_the_edge", 12, 5, 256, 256, 0, 0, 2100, 2600, 128,
                       HeatmapTiffOptions::Encoding::grey}),
    [](const ::testing::TestParamInfo<SharedTileCase>& param) { return std::string(param.param.name); });

TEST(HeatmapTiffErrors, NeedsTheSlideResolution) {
  testing::TempDir dir;
  Heatmap h = make_heatmap(3, 3, 256, 256);
  h.slide_mpp = 0.0;
  EXPECT_THROW(write_heatmap_tiff(dir.file("a.tif"), h), core::InternalError);
  EXPECT_TRUE(folder_names(dir.path()).empty());
}

TEST(HeatmapTiffErrors, AnEmptyMapIsAllBackground) {
  testing::TempDir dir;
  Heatmap h = make_heatmap(3, 3, 256, 256);
  h.rows = 0;
  h.cols = 0;
  h.prob.clear();
  write_heatmap_tiff(dir.file("empty.tif"), h);
  OpenSlideHandle slide(dir.file("empty.tif"));
  ASSERT_NE(slide.osr, nullptr);
  EXPECT_EQ(slide.pixel(100, 100), cv::Vec3b(255, 255, 255));
}

}  // namespace
}  // namespace tessera::io
