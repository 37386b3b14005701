// HDF5 shards and the manifest: exact round trips, the documented layout as seen by plain HDF5, atomic writes,
// and the error for each kind of broken file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// tessera_io_tests does not get HDF5's include folder (tessera_io links it privately); Debian's serial
// headers live under hdf5/serial and include each other with quotes, so this path works either way.
#if __has_include(<hdf5.h>)
#include <hdf5.h>
#else
#include <hdf5/serial/hdf5.h>
#endif

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/shard.h"
#include "tests/testing/testing.h"

namespace {

namespace io = tessera::io;
namespace core = tessera::core;
namespace fs = std::filesystem;
using tessera::testing::TempDir;

// ---------------------------------------------------------------------------------------------------------
// Tiles that identify themselves: the first four bytes are the tile's global index, the rest a pattern of it.

std::vector<std::uint8_t> tile_pixels(std::int64_t index, int t) {
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(t) * t * 3);
  for (std::size_t k = 0; k < pixels.size(); ++k) {
    pixels[k] = static_cast<std::uint8_t>((static_cast<std::uint64_t>(index) * 131 + k * 7 + (k >> 5)) & 0xff);
  }
  for (int b = 0; b < 4; ++b) pixels[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(index >> (8 * b));
  return pixels;
}

io::ShardTileRecord tile_record(std::int64_t index, std::uint32_t slide) {
  io::ShardTileRecord r;
  r.label = index % 3 == 0 ? 1 : 0;
  r.tumor_fraction = static_cast<float>(index) / 1024.0f + 0.1f;
  r.x = 5'000'000'000LL + index * 1'000'003;  // beyond 32 bits
  r.y = index * 17 + 3;
  r.slide_index = slide;
  return r;
}

// Slide of tile i: runs of different lengths.
std::uint32_t slide_of(std::int64_t i) { return i < 70 ? 0 : i < 71 ? 1 : i < 200 ? 2 : 0; }

io::ShardAttributes attributes(int t) {
  io::ShardAttributes a;
  a.tile_size = t;
  a.mpp = 0.2425;  // no short binary form
  a.stain_normalization = "macenko";
  return a;
}

const std::vector<std::string> slide_ids = {"slide-α", "b", "tumor_042"};

// Writes `n` tiles in uneven chunks and out of order, so hyperslab offsets are exercised.
void write_shard(const std::string& path, std::int64_t n, int t) {
  io::ShardWriter writer(path, attributes(t), n, slide_ids);
  const std::vector<std::pair<std::int64_t, std::int64_t>> chunks = [n] {
    std::vector<std::pair<std::int64_t, std::int64_t>> c;
    for (std::int64_t first = 0, size = 1; first < n; first += size, size = size % 37 + 13) {
      c.emplace_back(first, std::min(size, n - first));
    }
    std::reverse(c.begin(), c.end());
    return c;
  }();
  for (const auto& [first, count] : chunks) {
    std::vector<io::ShardTileRecord> records;
    std::vector<std::uint8_t> images;
    for (std::int64_t i = first; i < first + count; ++i) {
      records.push_back(tile_record(i, slide_of(i)));
      const auto pixels = tile_pixels(i, t);
      images.insert(images.end(), pixels.begin(), pixels.end());
    }
    writer.write(first, records, images.data());
  }
  writer.finish();
}

std::vector<std::string> folder_listing(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void copy_truncated(const std::string& from, const std::string& to, std::uintmax_t size) {
  fs::copy_file(from, to);
  fs::resize_file(to, size);
}

// The message of the core::InputError that `open` throws, or a failure.
std::string open_error(const std::string& path) {
  try {
    io::ShardFile::open(path);
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "no core::InputError for " << path;
  return {};
}

// ---------------------------------------------------------------------------------------------------------
// Plain HDF5, with only the documented names: what h5py or another tool would do.

struct H5Id {
  hid_t id;
  herr_t (*closer)(hid_t);
  ~H5Id() {
    if (id >= 0) closer(id);
  }
};

std::vector<hsize_t> plain_dims(hid_t dataset) {
  H5Id space{H5Dget_space(dataset), H5Sclose};
  std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space.id)));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  return dims;
}

std::string plain_string_attribute(hid_t file, const char* name) {
  H5Id attribute{H5Aopen(file, name, H5P_DEFAULT), H5Aclose};
  H5Id type{H5Aget_type(attribute.id), H5Tclose};
  EXPECT_EQ(H5Tget_class(type.id), H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(type.id), 0);
  char* value = nullptr;
  EXPECT_GE(H5Aread(attribute.id, type.id, &value), 0);
  std::string result = value != nullptr ? value : "";
  H5free_memory(value);
  return result;
}

// A shard built with plain HDF5 calls; the knobs break one rule each.
struct PlainShard {
  std::int64_t n = 40;
  int t = 8;
  bool chunked_images = false;
  bool fixed_length_slides = false;
  std::string format = "tessera-shard";
  int version = 1;
  hsize_t coords_width = 2;
  std::uint32_t bad_slide_index = 0;  // > 0: written at tile 5
  bool int64_labels = false;
  std::optional<std::int64_t> bad_label;  // written at tile 7
};

void write_plain_shard(const std::string& path, const PlainShard& p) {
  H5Id file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
  ASSERT_GE(file.id, 0);
  const auto n = static_cast<hsize_t>(p.n);
  const auto t = static_cast<hsize_t>(p.t);
  {
    const hsize_t dims[4] = {n, t, t, 3};
    H5Id space{H5Screate_simple(4, dims, nullptr), H5Sclose};
    H5Id dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    if (p.chunked_images) {
      const hsize_t chunk[4] = {1, t, t, 3};
      H5Pset_chunk(dcpl.id, 4, chunk);
    }
    H5Id images{H5Dcreate2(file.id, "images", H5T_STD_U8LE, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose};
    std::vector<std::uint8_t> pixels;
    for (std::int64_t i = 0; i < p.n; ++i) {
      const auto tile = tile_pixels(i, p.t);
      pixels.insert(pixels.end(), tile.begin(), tile.end());
    }
    ASSERT_GE(H5Dwrite(images.id, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, pixels.data()), 0);
  }
  auto write_1d = [&](const char* name, hid_t file_type, hid_t memory_type, const void* data, hsize_t width = 0) {
    const hsize_t dims[2] = {n, width};
    H5Id space{H5Screate_simple(width == 0 ? 1 : 2, dims, nullptr), H5Sclose};
    H5Id dataset{H5Dcreate2(file.id, name, file_type, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(H5Dwrite(dataset.id, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  };
  std::vector<std::int64_t> labels;
  std::vector<float> fractions;
  std::vector<std::int64_t> coords;
  std::vector<std::uint32_t> slide_index;
  for (std::int64_t i = 0; i < p.n; ++i) {
    const auto r = tile_record(i, static_cast<std::uint32_t>(i % 2));
    labels.push_back(i == 7 && p.bad_label ? *p.bad_label : r.label);
    fractions.push_back(r.tumor_fraction);
    for (hsize_t c = 0; c < p.coords_width; ++c) coords.push_back(c == 0 ? r.x : c == 1 ? r.y : 0);
    slide_index.push_back(i == 5 && p.bad_slide_index > 0 ? p.bad_slide_index : r.slide_index);
  }
  write_1d("labels", p.int64_labels ? H5T_STD_I64LE : H5T_STD_U8LE, H5T_NATIVE_INT64, labels.data());
  write_1d("tumor_fraction", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, fractions.data());
  write_1d("coords", H5T_STD_I64LE, H5T_NATIVE_INT64, coords.data(), p.coords_width);
  write_1d("slide_index", H5T_STD_U32LE, H5T_NATIVE_UINT32, slide_index.data());
  {
    const hsize_t dims[1] = {2};
    H5Id space{H5Screate_simple(1, dims, nullptr), H5Sclose};
    H5Id type{H5Tcopy(H5T_C_S1), H5Tclose};
    if (p.fixed_length_slides) {
      H5Tset_size(type.id, 6);
      H5Id dataset{H5Dcreate2(file.id, "slides", type.id, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
      const char data[12] = {'s', 'l', 'i', 'd', 'e', '0', 'b', 0, 0, 0, 0, 0};  // "slide0" fills its field
      ASSERT_GE(H5Dwrite(dataset.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
    } else {
      H5Tset_size(type.id, H5T_VARIABLE);
      H5Id dataset{H5Dcreate2(file.id, "slides", type.id, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
      const char* data[2] = {"slide0", "b"};
      ASSERT_GE(H5Dwrite(dataset.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
    }
  }
  auto string_attribute = [&](const char* name, const std::string& value) {
    H5Id type{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(type.id, value.size());  // fixed-length, as numpy's bytes attributes are
    H5Id space{H5Screate(H5S_SCALAR), H5Sclose};
    H5Id attribute{H5Acreate2(file.id, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    H5Awrite(attribute.id, type.id, value.c_str());
  };
  auto number_attribute = [&](const char* name, hid_t type, const void* value) {
    H5Id space{H5Screate(H5S_SCALAR), H5Sclose};
    H5Id attribute{H5Acreate2(file.id, name, type, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    H5Awrite(attribute.id, type, value);
  };
  string_attribute("format", p.format);
  const std::int64_t version = p.version;
  const std::int64_t tile_size = p.t;
  const double mpp = 0.5;
  number_attribute("version", H5T_NATIVE_INT64, &version);
  number_attribute("tile_size", H5T_NATIVE_INT64, &tile_size);
  number_attribute("mpp", H5T_NATIVE_DOUBLE, &mpp);
  string_attribute("stain_normalization", "none");
}

// ---------------------------------------------------------------------------------------------------------

TEST(ShardFile, RoundTripIsExact) {
  TempDir dir;
  const std::string path = dir.file("shard-00000.h5");
  constexpr std::int64_t n = 300;
  constexpr int t = 8;
  write_shard(path, n, t);
  EXPECT_EQ(folder_listing(dir.path()), std::vector<std::string>{"shard-00000.h5"}) << "no temporary left behind";

  const auto shard = io::ShardFile::open(path);
  EXPECT_EQ(shard.path(), path);
  EXPECT_EQ(shard.size(), n);
  EXPECT_EQ(shard.tile_size(), t);
  EXPECT_EQ(shard.tile_bytes(), static_cast<std::size_t>(t * t * 3));
  EXPECT_EQ(shard.attributes().mpp, 0.2425);
  EXPECT_EQ(shard.attributes().stain_normalization, "macenko");
  EXPECT_EQ(shard.slides(), slide_ids);
  ASSERT_EQ(shard.labels().size(), static_cast<std::size_t>(n));
  ASSERT_EQ(shard.coords().size(), static_cast<std::size_t>(2 * n));
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const auto expected = tile_record(i, slide_of(i));
    EXPECT_EQ(shard.labels()[k], expected.label) << i;
    EXPECT_EQ(shard.tumor_fractions()[k], expected.tumor_fraction) << i;
    EXPECT_EQ(shard.coords()[2 * k], expected.x) << i;
    EXPECT_EQ(shard.coords()[2 * k + 1], expected.y) << i;
    EXPECT_EQ(shard.slide_indices()[k], expected.slide_index) << i;
  }

  std::vector<std::uint8_t> all(static_cast<std::size_t>(n) * shard.tile_bytes());
  shard.read_images(0, n, all.data());
  for (std::int64_t i = 0; i < n; ++i) {
    const auto expected = tile_pixels(i, t);
    ASSERT_TRUE(std::equal(expected.begin(), expected.end(), all.begin() + static_cast<std::ptrdiff_t>(i) * 192))
        << "tile " << i;
  }
  // A block in the middle, and one tile as a cv::Mat.
  std::vector<std::uint8_t> block(17 * shard.tile_bytes());
  shard.read_images(131, 17, block.data());
  EXPECT_TRUE(std::equal(block.begin(), block.end(), all.begin() + 131 * 192));
  const cv::Mat one = shard.read_image(n - 1);
  ASSERT_EQ(one.type(), CV_8UC3);
  ASSERT_EQ(one.rows, t);
  const auto last = tile_pixels(n - 1, t);
  EXPECT_TRUE(std::equal(last.begin(), last.end(), one.ptr<std::uint8_t>()));

  EXPECT_THROW(shard.read_images(n - 2, 3, block.data()), core::InternalError);
  EXPECT_THROW(shard.read_images(-1, 1, block.data()), core::InternalError);
}

// Quality control's per-tile artefact bits: written when the attributes ask for them and read back as written; a
// shard without the dataset (QC off, tessera import, or written before it) reads as no artefact.
TEST(ShardFile, ArtefactBitsRoundTripAndAbsentReadsAsNone) {
  TempDir dir;
  constexpr std::int64_t n = 50;
  const auto bits_of = [](std::int64_t i) {
    return static_cast<std::uint16_t>(i % 3 == 0 ? 0 : i % 3 == 1 ? (1u << 1) | io::kShardArtefactExcluded : 1u << 8);
  };
  const std::string with = dir.file("with.h5");
  {
    auto a = attributes(8);
    a.artefacts = true;
    io::ShardWriter writer(with, a, n, slide_ids);
    for (std::int64_t i = 0; i < n; ++i) {
      auto record = tile_record(i, slide_of(i));
      record.artefacts = bits_of(i);
      writer.write(i, {record}, tile_pixels(i, 8).data());
    }
    writer.finish();
  }
  const auto shard = io::ShardFile::open(with);
  EXPECT_TRUE(shard.attributes().artefacts);
  ASSERT_EQ(shard.artefacts().size(), static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(shard.artefacts()[static_cast<std::size_t>(i)], bits_of(i)) << i;

  const std::string without = dir.file("without.h5");
  write_shard(without, n, 8);
  const auto plain = io::ShardFile::open(without);
  EXPECT_FALSE(plain.attributes().artefacts);
  EXPECT_EQ(plain.artefacts(), std::vector<std::uint16_t>(static_cast<std::size_t>(n), 0));

  // Bits where the shard has no field for them, or bits no class has, are a writer's bug.
  io::ShardWriter no_field(dir.file("no-field.h5"), attributes(8), 1, slide_ids);
  auto record = tile_record(0, 0);
  record.artefacts = 1u << 2;
  EXPECT_THROW(no_field.write(0, {record}, tile_pixels(0, 8).data()), core::InternalError);
  auto a = attributes(8);
  a.artefacts = true;
  io::ShardWriter unknown_bit(dir.file("unknown-bit.h5"), a, 1, slide_ids);
  record.artefacts = 1u << 12;
  EXPECT_THROW(unknown_bit.write(0, {record}, tile_pixels(0, 8).data()), core::InternalError);
}

TEST(ShardFile, MatOverloadAndEmptyShard) {
  TempDir dir;
  const std::string path = dir.file("mats.h5");
  {
    io::ShardWriter writer(path, attributes(16), 2, {"only"});
    cv::Mat big(20, 30, CV_8UC3, cv::Scalar(1, 2, 3));
    cv::Mat roi = big(cv::Rect(5, 2, 16, 16));  // not continuous
    roi.at<cv::Vec3b>(3, 4) = cv::Vec3b(200, 100, 50);
    writer.write(1, tile_record(1, 0), roi);
    writer.write(0, tile_record(0, 0), cv::Mat(16, 16, CV_8UC3, cv::Scalar(9, 8, 7)));
    EXPECT_THROW(writer.write(0, tile_record(0, 0), cv::Mat(8, 8, CV_8UC3)), core::InternalError);
    writer.finish();
  }
  const auto shard = io::ShardFile::open(path);
  const cv::Mat tile = shard.read_image(1);
  EXPECT_EQ(tile.at<cv::Vec3b>(3, 4), cv::Vec3b(200, 100, 50));
  EXPECT_EQ(tile.at<cv::Vec3b>(0, 0), cv::Vec3b(1, 2, 3));
  EXPECT_EQ(shard.read_image(0).at<cv::Vec3b>(15, 15), cv::Vec3b(9, 8, 7));

  const std::string empty = dir.file("empty.h5");
  io::ShardWriter writer(empty, attributes(16), 0, {});
  writer.finish();
  const auto none = io::ShardFile::open(empty);
  EXPECT_EQ(none.size(), 0);
  EXPECT_TRUE(none.slides().empty());
}

TEST(ShardFile, LayoutAsSeenByPlainHdf5) {
  TempDir dir;
  const std::string path = dir.file("plain.h5");
  constexpr std::int64_t n = 123;
  constexpr int t = 16;
  write_shard(path, n, t);
  const auto shard = io::ShardFile::open(path);

  H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  ASSERT_GE(file.id, 0);
  EXPECT_EQ(plain_string_attribute(file.id, "format"), "tessera-shard");
  EXPECT_EQ(plain_string_attribute(file.id, "stain_normalization"), "macenko");
  {
    H5Id attribute{H5Aopen(file.id, "tile_size", H5P_DEFAULT), H5Aclose};
    int value = 0;
    H5Aread(attribute.id, H5T_NATIVE_INT, &value);
    EXPECT_EQ(value, t);
  }

  H5Id images{H5Dopen2(file.id, "images", H5P_DEFAULT), H5Dclose};
  ASSERT_GE(images.id, 0);
  EXPECT_EQ(plain_dims(images.id), (std::vector<hsize_t>{n, t, t, 3}));
  H5Id dcpl{H5Dget_create_plist(images.id), H5Pclose};
  EXPECT_EQ(H5Pget_layout(dcpl.id), H5D_CONTIGUOUS);
  EXPECT_EQ(H5Dget_offset(images.id), shard.images_offset());

  std::vector<std::uint8_t> by_hdf5(static_cast<std::size_t>(n) * shard.tile_bytes());
  ASSERT_GE(H5Dread(images.id, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, by_hdf5.data()), 0);
  std::vector<std::uint8_t> by_pread(by_hdf5.size());
  shard.read_images(0, n, by_pread.data());
  EXPECT_TRUE(by_hdf5 == by_pread);

  for (const char* name : {"labels", "tumor_fraction", "slide_index"}) {
    H5Id dataset{H5Dopen2(file.id, name, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(dataset.id, 0) << name;
    EXPECT_EQ(plain_dims(dataset.id), (std::vector<hsize_t>{n})) << name;
  }
  H5Id coords{H5Dopen2(file.id, "coords", H5P_DEFAULT), H5Dclose};
  EXPECT_EQ(plain_dims(coords.id), (std::vector<hsize_t>{n, 2}));
  std::vector<std::int64_t> xy(2 * n);
  H5Dread(coords.id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, xy.data());
  EXPECT_EQ(xy, shard.coords());

  H5Id slides{H5Dopen2(file.id, "slides", H5P_DEFAULT), H5Dclose};
  H5Id type{H5Dget_type(slides.id), H5Tclose};
  EXPECT_GT(H5Tis_variable_str(type.id), 0);
  EXPECT_EQ(H5Tget_cset(type.id), H5T_CSET_UTF8);
  std::vector<char*> ids(slide_ids.size());
  ASSERT_GE(H5Dread(slides.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids.data()), 0);
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], slide_ids[i]);
  H5Id space{H5Dget_space(slides.id), H5Sclose};
  H5Dvlen_reclaim(type.id, space.id, H5P_DEFAULT, ids.data());
}

TEST(ShardFile, ReadsShardWrittenByPlainHdf5) {
  // Another tool's shard: int64 attributes, fixed-length strings, int64 labels, late allocation.
  TempDir dir;
  const std::string path = dir.file("other.h5");
  PlainShard p;
  p.fixed_length_slides = true;
  p.int64_labels = true;
  write_plain_shard(path, p);
  const auto shard = io::ShardFile::open(path);
  EXPECT_EQ(shard.size(), p.n);
  EXPECT_EQ(shard.attributes().mpp, 0.5);
  EXPECT_EQ(shard.slides(), (std::vector<std::string>{"slide0", "b"}));
  for (std::int64_t i = 0; i < p.n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    EXPECT_EQ(shard.labels()[k], tile_record(i, 0).label);
    EXPECT_EQ(shard.coords()[2 * k], tile_record(i, 0).x);
    EXPECT_EQ(shard.slide_indices()[k], static_cast<std::uint32_t>(i % 2));
    const auto expected = tile_pixels(i, p.t);
    const cv::Mat tile = shard.read_image(i);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), tile.ptr<std::uint8_t>())) << i;
  }
}

TEST(ShardFile, CopiesShareTheFileAndReadConcurrently) {
  TempDir dir;
  const std::string path = dir.file("shared.h5");
  constexpr std::int64_t n = 200;
  write_shard(path, n, 8);
  std::optional<io::ShardFile> original(io::ShardFile::open(path));
  const io::ShardFile copy = *original;
  original.reset();  // the descriptor stays open for the copy
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::vector<std::uint8_t> block(10 * copy.tile_bytes());
      for (std::int64_t first = w; first + 10 <= n; first += 7) {
        copy.read_images(first, 10, block.data());
        for (std::int64_t k = 0; k < 10; ++k) {
          const auto expected = tile_pixels(first + k, 8);
          if (!std::equal(expected.begin(), expected.end(), block.begin() + k * 192))
            ++bad[static_cast<std::size_t>(w)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
}

// ---------------------------------------------------------------------------------------------------------
// Atomic writes

TEST(ShardWriter, AbandonedWriteLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("shard-00007.h5");
  {
    io::ShardWriter writer(path, attributes(8), 100, slide_ids);
    EXPECT_FALSE(folder_listing(dir.path()).empty()) << "the temporary exists while writing";
    EXPECT_FALSE(fs::exists(path));
    const auto pixels = tile_pixels(0, 8);
    writer.write(0, {tile_record(0, 0)}, pixels.data());
    // Destroyed without finish(), as when an exception unwinds through the writing code.
  }
  EXPECT_TRUE(folder_listing(dir.path()).empty());
}

TEST(ShardWriter, FinishRefusesMissingTiles) {
  TempDir dir;
  const std::string path = dir.file("holes.h5");
  {
    io::ShardWriter writer(path, attributes(8), 10, slide_ids);
    std::vector<io::ShardTileRecord> records;
    std::vector<std::uint8_t> images;
    for (int i = 0; i < 10; ++i) {
      if (i == 6) continue;
      const auto pixels = tile_pixels(i, 8);
      writer.write(i, {tile_record(i, 0)}, pixels.data());
    }
    try {
      writer.finish();
      FAIL() << "finish() with a missing tile";
    } catch (const core::InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("1 of 10 tiles"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("first: 6"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path));
  }
  EXPECT_TRUE(folder_listing(dir.path()).empty());
}

TEST(ShardWriter, RejectsBadWrites) {
  TempDir dir;
  io::ShardWriter writer(dir.file("bad.h5"), attributes(8), 10, slide_ids);
  const auto pixels = tile_pixels(0, 8);
  EXPECT_THROW(writer.write(10, {tile_record(0, 0)}, pixels.data()), core::InternalError);
  EXPECT_THROW(writer.write(-1, {tile_record(0, 0)}, pixels.data()), core::InternalError);
  EXPECT_THROW(writer.write(0, {tile_record(0, 3)}, pixels.data()), core::InternalError) << "slide index >= S";
  EXPECT_THROW(io::ShardWriter(dir.file("zero.h5"), attributes(0), 1, slide_ids), core::InternalError);
  EXPECT_THROW(io::ShardWriter(dir.file("nofolder/x.h5"), attributes(8), 1, slide_ids), core::InternalError);
  EXPECT_FALSE(fs::exists(dir.file("zero.h5")));
}

TEST(ShardWriter, ReplacesAnOlderShardOnlyWhenFinished) {
  TempDir dir;
  const std::string path = dir.file("shard.h5");
  write_shard(path, 50, 8);
  {
    io::ShardWriter writer(path, attributes(8), 20, slide_ids);  // abandoned
  }
  EXPECT_EQ(io::ShardFile::open(path).size(), 50) << "the old shard is untouched";
  write_shard(path, 20, 8);
  EXPECT_EQ(io::ShardFile::open(path).size(), 20);
  EXPECT_EQ(folder_listing(dir.path()), std::vector<std::string>{"shard.h5"});
}

// Where the file system does direct I/O, tiles from an aligned buffer (io::ImageBuffer) go to the disk directly,
// the partial pages at a block's ends through the page cache; from an unaligned buffer all of it through the page
// cache. Both shards hold the same tiles. Blocks of uneven sizes, out of order: page boundaries fall inside tiles.
TEST(ShardWriter, DirectWritesGiveTheSameTiles) {
  TempDir dir;
  // The writer's own condition for direct writes, on a file of this folder.
  std::ofstream(dir.file("probe")).put('x');
  const std::uint64_t alignment = io::direct_write_alignment(dir.file("probe"));
  if (alignment == 0) {
    GTEST_SKIP() << "no direct writes in " << dir.path()
                 << " (needs Linux 6.1 or later and a file system stating its direct-I/O alignment, e.g. ext4, XFS)";
  }
  constexpr int t = 96;  // 27,648 bytes: 6.75 pages
  constexpr std::int64_t n = 150;
  const std::size_t tile_bytes = static_cast<std::size_t>(t) * t * 3;
  const std::vector<std::pair<std::int64_t, std::int64_t>> blocks = {{64, 64}, {0, 1}, {1, 63}, {128, 22}};
  const auto write = [&](const std::string& path, bool aligned) {
    io::ShardWriter writer(path, attributes(t), n, slide_ids);
    io::ImageBuffer buffer;
    for (const auto& [first, count] : blocks) {
      buffer.resize(static_cast<std::size_t>(count) * tile_bytes + 1);
      std::uint8_t* images = buffer.data() + (aligned ? 0 : 1);
      std::vector<io::ShardTileRecord> records;
      for (std::int64_t i = first; i < first + count; ++i) {
        const auto pixels = tile_pixels(i, t);
        std::copy(pixels.begin(), pixels.end(), images + static_cast<std::size_t>(i - first) * tile_bytes);
        records.push_back(tile_record(i, slide_of(i)));
      }
      writer.write(first, records, images);
    }
    const std::uint64_t direct = writer.direct_bytes();
    writer.finish();
    return direct;
  };
  const std::uint64_t direct = write(dir.file("direct.h5"), true);
  const std::uint64_t unaligned = write(dir.file("buffered.h5"), false);
  EXPECT_GT(direct, n * tile_bytes / 2) << "most pages written directly";
  // One byte past an aligned address is unaligned unless any address will do.
  if (alignment > 1) {
    EXPECT_EQ(unaligned, 0u) << "an unaligned buffer goes through the page cache";
  }

  const auto a = io::ShardFile::open(dir.file("direct.h5"));
  const auto b = io::ShardFile::open(dir.file("buffered.h5"));
  EXPECT_EQ(fs::file_size(dir.file("direct.h5")), fs::file_size(dir.file("buffered.h5")));
  std::vector<std::uint8_t> from_a(static_cast<std::size_t>(n) * tile_bytes);
  std::vector<std::uint8_t> from_b(from_a.size());
  a.read_images(0, n, from_a.data());
  b.read_images(0, n, from_b.data());
  for (std::int64_t i = 0; i < n; ++i) {
    const auto expected = tile_pixels(i, t);
    const auto at = static_cast<std::ptrdiff_t>(i) * static_cast<std::ptrdiff_t>(tile_bytes);
    ASSERT_TRUE(std::equal(expected.begin(), expected.end(), from_a.begin() + at)) << "direct, tile " << i;
    ASSERT_TRUE(std::equal(expected.begin(), expected.end(), from_b.begin() + at)) << "buffered, tile " << i;
  }
  EXPECT_EQ(a.labels(), b.labels());
  EXPECT_EQ(a.coords(), b.coords());
  EXPECT_EQ(a.slide_indices(), b.slide_indices());
}

// One tile per write, as `shards.write_batch: 1` writes from an aligned ImageBuffer and a slide's rewrite without
// its damaged tiles writes from a std::vector: where 3t² is not a multiple of the direct-write alignment, some blocks
// can go directly and some cannot, in one shard. Every tile must read back as written (HDF5's data-sieve buffer
// once wrote a window read before the direct writes back over them).
TEST(ShardWriter, SingleTileWritesAlignedOrNotKeepEveryTile) {
  TempDir dir;
  // Direct writes beside HDF5's own are what this checks; without them both runs write through HDF5 alike.
  std::ofstream(dir.file("probe")).put('x');
  if (io::direct_write_alignment(dir.file("probe")) == 0) {
    GTEST_SKIP() << "no direct writes in " << dir.path()
                 << " (needs Linux 6.1 or later and a file system stating its direct-I/O alignment, e.g. ext4, XFS)";
  }
  constexpr std::int64_t n = 40;
  for (const int t : {112, 100}) {
    const std::size_t tile_bytes = static_cast<std::size_t>(t) * t * 3;
    std::vector<std::uint8_t> all(static_cast<std::size_t>(n) * tile_bytes);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto pixels = tile_pixels(i, t);
      std::copy(pixels.begin(), pixels.end(), all.begin() + static_cast<std::ptrdiff_t>(i * tile_bytes));
    }
    for (const std::string source : {"buffer", "vector", "both"}) {
      const std::string path = dir.file(source + "-" + std::to_string(t) + ".h5");
      {
        io::ShardWriter writer(path, attributes(t), n, slide_ids);
        io::ImageBuffer buffer;
        buffer.resize(tile_bytes);
        for (std::int64_t i = 0; i < n; ++i) {
          const std::uint8_t* tile = all.data() + static_cast<std::size_t>(i) * tile_bytes;
          if (source == "buffer" || (source == "both" && i % 3 != 0)) {
            std::copy(tile, tile + tile_bytes, buffer.data());
            tile = buffer.data();
          }
          writer.write(i, {tile_record(i, slide_of(i))}, tile);
        }
        writer.finish();
      }
      const auto shard = io::ShardFile::open(path);
      std::vector<std::uint8_t> back(all.size());
      shard.read_images(0, n, back.data());
      for (std::int64_t i = 0; i < n; ++i) {
        const auto at = static_cast<std::ptrdiff_t>(i * tile_bytes);
        ASSERT_TRUE(
            std::equal(all.begin() + at, all.begin() + at + static_cast<std::ptrdiff_t>(tile_bytes), back.begin() + at))
            << "tile " << i << " of " << path;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Broken files

class ShardBroken : public ::testing::Test {
 protected:
  void SetUp() override {
    good_ = dir_.file("good.h5");
    write_shard(good_, 200, 8);
  }
  // A copy of the good shard changed with plain HDF5.
  std::string edited(const std::string& name, const std::function<void(hid_t)>& edit) {
    const std::string path = dir_.file(name);
    fs::copy_file(good_, path);
    H5Id file{H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
    EXPECT_GE(file.id, 0);
    edit(file.id);
    return path;
  }
  TempDir dir_;
  std::string good_;
};

TEST_F(ShardBroken, MissingFile) { EXPECT_THROW(io::ShardFile::open(dir_.file("absent.h5")), core::FileNotFoundError); }

TEST_F(ShardBroken, TruncatedCopy) {
  const auto size = fs::file_size(good_);
  const std::string half = dir_.file("half.h5");
  copy_truncated(good_, half, size / 2);
  const std::string message = open_error(half);
  EXPECT_EQ(message.rfind("truncated: expected at least ", 0), 0u) << message;
  EXPECT_NE(message.find("file has " + std::to_string(size / 2)), std::string::npos) << message;

  const std::string one_byte_short = dir_.file("short.h5");
  copy_truncated(good_, one_byte_short, size - 1);
  EXPECT_EQ(open_error(one_byte_short).rfind("truncated", 0), 0u);

  const std::string stub = dir_.file("stub.h5");  // not even a whole superblock
  copy_truncated(good_, stub, 12);
  EXPECT_EQ(open_error(stub).rfind("not a readable HDF5 shard", 0), 0u) << open_error(stub);
}

TEST_F(ShardBroken, TruncatedAfterOpen) {
  const std::string path = dir_.file("shrinks.h5");
  fs::copy_file(good_, path);
  const auto shard = io::ShardFile::open(path);
  fs::resize_file(path, shard.images_offset() + 50 * shard.tile_bytes() + 10);
  std::vector<std::uint8_t> block(20 * shard.tile_bytes());
  shard.read_images(30, 20, block.data());  // still there
  try {
    shard.read_images(40, 20, block.data());
    FAIL() << "read past the end";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.message().rfind("truncated: expected at least", 0), 0u) << e.what();
  }
}

// The scattered read (one preadv into separate buffers, as the shuffle buffer's free slots) gives each tile's
// bytes, also past IOV_MAX tiles, and fails like the contiguous read.
TEST_F(ShardBroken, ScatteredReadAndItsErrors) {
  const auto shard = io::ShardFile::open(good_);
  const std::size_t bytes = shard.tile_bytes();
  std::vector<std::uint8_t> all(200 * bytes);
  shard.read_images(0, 200, all.data());
  // Destinations in reverse order, inside one buffer with gaps between them.
  std::vector<std::uint8_t> slots(2 * 150 * bytes, 0xAB);
  std::vector<std::uint8_t*> destinations;
  for (std::size_t k = 0; k < 150; ++k) destinations.push_back(slots.data() + 2 * (149 - k) * bytes);
  shard.read_images(40, destinations);
  for (std::size_t k = 0; k < 150; ++k) {
    ASSERT_TRUE(std::equal(destinations[k], destinations[k] + bytes,
                           all.begin() + static_cast<std::ptrdiff_t>((40 + k) * bytes)))
        << "tile " << 40 + k;
    const std::uint8_t* gap = destinations[k] + bytes;
    EXPECT_TRUE(std::all_of(gap, gap + bytes, [](std::uint8_t b) { return b == 0xAB; })) << "after tile " << 40 + k;
  }
  shard.read_images(200, std::vector<std::uint8_t*>{});  // nothing, at the end
  EXPECT_THROW(shard.read_images(51, destinations), core::InternalError);
  EXPECT_THROW(shard.read_images(-1, std::vector<std::uint8_t*>{slots.data()}), core::InternalError);

  // More tiles than one preadv takes (IOV_MAX), from a shard of small tiles.
  const std::string many = dir_.file("many.h5");
  write_shard(many, 2500, 2);
  const auto small = io::ShardFile::open(many);
  std::vector<std::uint8_t> tiles(2500 * small.tile_bytes());
  std::vector<std::uint8_t*> each;
  for (std::size_t k = 0; k < 2500; ++k) each.push_back(tiles.data() + (2499 - k) * small.tile_bytes());
  small.read_images(0, each);
  for (std::int64_t i = 0; i < 2500; ++i) {
    const auto expected = tile_pixels(i, 2);
    ASSERT_TRUE(std::equal(expected.begin(), expected.end(), each[static_cast<std::size_t>(i)])) << "tile " << i;
  }

  // Truncated after open: the tiles still there read, the others fail naming the file.
  const std::string path = dir_.file("shrinks-scattered.h5");
  fs::copy_file(good_, path);
  const auto shrinking = io::ShardFile::open(path);
  fs::resize_file(path, shrinking.images_offset() + 50 * bytes + 10);
  destinations.resize(20);
  shrinking.read_images(30, destinations);
  try {
    shrinking.read_images(40, destinations);
    FAIL() << "read past the end";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.message().rfind("truncated: expected at least", 0), 0u) << e.what();
  }
}

TEST_F(ShardBroken, NotHdf5) {
  const std::string path = dir_.file("text.h5");
  std::ofstream(path) << "these are not the tiles you are looking for\n";
  const std::string message = open_error(path);
  EXPECT_EQ(message.rfind("not a readable HDF5 shard: HDF5: ", 0), 0u) << message;
  EXPECT_NE(message.find("signature"), std::string::npos) << "HDF5's own reason: " << message;
  const std::string empty = dir_.file("empty.h5");
  std::ofstream{empty};
  EXPECT_EQ(open_error(empty).rfind("not a readable HDF5 shard", 0), 0u);
}

TEST_F(ShardBroken, WrongFormatAttribute) {
  const std::string path = edited("foreign.h5", [](hid_t file) {
    H5Adelete(file, "format");
    H5Id type{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(type.id, H5T_VARIABLE);
    H5Id space{H5Screate(H5S_SCALAR), H5Sclose};
    H5Id attribute{H5Acreate2(file, "format", type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
    const char* value = "keras-weights";
    H5Awrite(attribute.id, type.id, &value);
  });
  EXPECT_EQ(open_error(path), "not a Tessera shard (format attribute is 'keras-weights', expected 'tessera-shard')");
  const std::string none = edited("no-format.h5", [](hid_t file) { H5Adelete(file, "format"); });
  EXPECT_EQ(open_error(none), "not a Tessera shard (no 'format' attribute)");
}

TEST_F(ShardBroken, MissingDataset) {
  const std::string path = edited("no-labels.h5", [](hid_t file) { H5Ldelete(file, "labels", H5P_DEFAULT); });
  EXPECT_EQ(open_error(path), "missing dataset 'labels'");
  const std::string images = edited("no-images.h5", [](hid_t file) { H5Ldelete(file, "images", H5P_DEFAULT); });
  EXPECT_EQ(open_error(images), "missing dataset 'images'");
}

TEST_F(ShardBroken, RuleBreakingShards) {
  PlainShard chunked;
  chunked.chunked_images = true;
  write_plain_shard(dir_.file("chunked.h5"), chunked);
  EXPECT_EQ(
      open_error(dir_.file("chunked.h5")).rfind("dataset 'images' is not stored contiguously (layout: chunked)", 0),
      0u);

  PlainShard newer;
  newer.version = 2;
  write_plain_shard(dir_.file("newer.h5"), newer);
  EXPECT_EQ(open_error(dir_.file("newer.h5")), "shard format version 2 is newer than this Tessera reads (1)");

  PlainShard wide;
  wide.coords_width = 3;
  write_plain_shard(dir_.file("wide.h5"), wide);
  EXPECT_EQ(open_error(dir_.file("wide.h5")), "dataset 'coords' has shape [40, 3], expected [40, 2]");

  PlainShard stray;
  stray.bad_slide_index = 2;
  write_plain_shard(dir_.file("stray.h5"), stray);
  EXPECT_EQ(open_error(dir_.file("stray.h5")), "slide_index[5] = 2 is out of range (2 slides)");

  // Labels are 0 or 1, whatever integer type stores them; HDF5 must not clip -1 or 256 into range on the way.
  for (const std::int64_t label : {2, 255, -1, 256}) {
    PlainShard mislabelled;
    mislabelled.bad_label = label;
    mislabelled.int64_labels = label < 0 || label > 255;
    const std::string path = dir_.file("label" + std::to_string(label) + ".h5");
    write_plain_shard(path, mislabelled);
    EXPECT_EQ(open_error(path), "labels[7] = " + std::to_string(label) + " is not 0 (normal) or 1 (tumour)");
  }

  const std::string tile_size = edited("tile-size.h5", [](hid_t file) {
    H5Id attribute{H5Aopen(file, "tile_size", H5P_DEFAULT), H5Aclose};
    const int value = 16;
    H5Awrite(attribute.id, H5T_NATIVE_INT, &value);
  });
  EXPECT_EQ(open_error(tile_size), "dataset 'images' has shape [200, 8, 8, 3], expected [200, 16, 16, 3]");
}

// A stored artefacts value with a bit no class has, or of another shape, is refused (never read as another value).
TEST_F(ShardBroken, ArtefactBitsOutsideTheClasses) {
  const auto with_artefacts = [&](const std::string& name, std::vector<std::int32_t> values) {
    return edited(name, [values](hid_t file) {
      const hsize_t count = values.size();
      H5Id space{H5Screate_simple(1, &count, nullptr), H5Sclose};
      H5Id dataset{H5Dcreate2(file, "artefacts", H5T_STD_I32LE, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose};
      H5Dwrite(dataset.id, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    });
  };
  const auto n = static_cast<std::size_t>(io::ShardFile::open(good_).size());
  std::vector<std::int32_t> values(n, 0);
  values[3] = 1 << 12;
  EXPECT_EQ(open_error(with_artefacts("bit12.h5", values)),
            "artefacts[3] = 4096 has bits no artefact class has (known: 0-8 and 9, excluded)");
  values[3] = -1;
  EXPECT_EQ(open_error(with_artefacts("negative.h5", values)),
            "artefacts[3] = -1 has bits no artefact class has (known: 0-8 and 9, excluded)");
  EXPECT_EQ(open_error(with_artefacts("short.h5", std::vector<std::int32_t>(n - 1, 0))),
            "dataset 'artefacts' has shape [" + std::to_string(n - 1) + "], expected [" + std::to_string(n) + "]");
  values[3] = (1 << 5) | (1 << 9);
  const auto read = io::ShardFile::open(with_artefacts("good-bits.h5", values));
  EXPECT_EQ(read.artefacts()[3], (1u << 5) | io::kShardArtefactExcluded);
}

// ---------------------------------------------------------------------------------------------------------
// Manifest

io::Manifest sample_manifest() {
  io::Manifest m;
  m.config_hash = "9f86d081884c7d65";
  m.config_yaml = "tile:\n  mpp: 0.2425\n  name: \"quoted\\\\ and ünïcode\"\n";
  m.attributes = attributes(256);
  m.shards = {{"shard-00000.h5", 1000, 700, 300, {"a", "b"}}, {"shard-00001.h5", 12, 12, 0, {"b"}}};
  m.slides = {{"a", "/data/a.svs", "tumor", "train", 600, 300, 300}, {"b", "/data/b b.tif", "", "", 412, 412, 0}};
  m.slides[0].origin = "synthetic";                   // slide b: a manifest from before origins were recorded
  m.slides[0].qc_dropped_tiles = {{"pen_green", 7}};  // slide b: none (QC off, or a manifest from before)
  m.slides[0].qc_kept_tiles = {{"fold", 3}, {"pen_red", 2}};
  m.failures = {{"c", "file '/data/c.svs': openslide: cannot read tile"}};
  return m;
}

TEST(Manifest, RoundTrip) {
  TempDir dir;
  const std::string path = dir.file("manifest.json");
  const io::Manifest m = sample_manifest();
  io::write_manifest(path, m);
  EXPECT_EQ(folder_listing(dir.path()), std::vector<std::string>{"manifest.json"});
  const io::Manifest r = io::read_manifest(path);
  EXPECT_EQ(r.config_hash, m.config_hash);
  EXPECT_EQ(r.config_yaml, m.config_yaml);
  EXPECT_EQ(r.attributes.tile_size, 256);
  EXPECT_EQ(r.attributes.mpp, 0.2425);
  EXPECT_EQ(r.attributes.stain_normalization, "macenko");
  ASSERT_EQ(r.shards.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.shards[i].file, m.shards[i].file);
    EXPECT_EQ(r.shards[i].tiles, m.shards[i].tiles);
    EXPECT_EQ(r.shards[i].normal, m.shards[i].normal);
    EXPECT_EQ(r.shards[i].tumour, m.shards[i].tumour);
    EXPECT_EQ(r.shards[i].slides, m.shards[i].slides);
  }
  ASSERT_EQ(r.slides.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.slides[i].id, m.slides[i].id);
    EXPECT_EQ(r.slides[i].path, m.slides[i].path);
    EXPECT_EQ(r.slides[i].label, m.slides[i].label);
    EXPECT_EQ(r.slides[i].split, m.slides[i].split);
    EXPECT_EQ(r.slides[i].tiles, m.slides[i].tiles);
    EXPECT_EQ(r.slides[i].normal, m.slides[i].normal);
    EXPECT_EQ(r.slides[i].tumour, m.slides[i].tumour);
    EXPECT_EQ(r.slides[i].origin, m.slides[i].origin);
    EXPECT_EQ(r.slides[i].qc_dropped_tiles, m.slides[i].qc_dropped_tiles);
    EXPECT_EQ(r.slides[i].qc_kept_tiles, m.slides[i].qc_kept_tiles);
  }
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0].slide, "c");
  EXPECT_EQ(r.failures[0].error, m.failures[0].error);
  EXPECT_EQ(r.total_tiles(), 1012);

  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str().rfind("{\n  \"format\": \"tessera-shards\",\n  \"version\": 1,", 0), 0u) << text.str();
}

class ManifestBroken : public ::testing::Test {
 protected:
  // The message of the error reading `text` as a manifest.
  std::string error_for(const std::string& text) {
    const std::string path = dir_.file("manifest-" + std::to_string(count_++) + ".json");
    std::ofstream(path) << text;
    try {
      io::read_manifest(path);
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path);
      return e.message();
    }
    ADD_FAILURE() << "no core::InputError for " << text;
    return {};
  }
  TempDir dir_;
  int count_ = 0;
};

TEST_F(ManifestBroken, EachProblemIsNamed) {
  const std::string head = R"({"format": "tessera-shards", "version": 1, )";
  const std::string attributes = R"("attributes": {"tile_size": 64, "mpp": 0.5}, )";
  {
    const std::string minimal = dir_.file("minimal.json");
    std::ofstream(minimal) << head + attributes + R"("shards": []})";
    const io::Manifest m = io::read_manifest(minimal);  // only the required fields
    EXPECT_EQ(m.attributes.stain_normalization, "none");
    EXPECT_TRUE(m.shards.empty());
  }
  EXPECT_EQ(error_for(R"({"format": "tessera-shards", "version": 1,)").rfind("invalid JSON at byte", 0), 0u);
  EXPECT_EQ(error_for("[1, 2]"), "manifest must be a JSON object, got array");
  // A number past a double's range is bad input too, not an uncaught library error (found by fuzz/manifest).
  EXPECT_EQ(error_for(head + R"("attributes": {"tile_size": 64, "mpp": 5e400}, "shards": []})"),
            "invalid JSON: number overflow parsing '5e400'");
  EXPECT_EQ(error_for(R"({"version": 1})"), "missing required field 'format'");
  EXPECT_EQ(error_for(R"({"format": "tessera-shard", "version": 1})"),
            "field 'format': expected 'tessera-shards', got 'tessera-shard'");
  EXPECT_EQ(error_for(R"({"format": "tessera-shards", "version": 2})"),
            "field 'version': manifest version 2 is not supported (this Tessera reads 1)");
  EXPECT_EQ(error_for(R"({"format": "tessera-shards", "version": "1"})"),
            "field 'version': expected a non-negative integer, got string");
  EXPECT_EQ(error_for(head + R"("shards": []})"), "missing required field 'attributes'");
  EXPECT_EQ(error_for(head + R"("attributes": {"tile_size": 64.5, "mpp": 0.5}, "shards": []})"),
            "field 'attributes.tile_size': expected a non-negative integer, got number 64.5");
  EXPECT_EQ(error_for(head + R"("attributes": {"tile_size": 64, "mpp": "fine"}, "shards": []})"),
            "field 'attributes.mpp': expected a number, got string");
  EXPECT_EQ(error_for(head + R"("attributes": {"tile_size": 64, "mpp": 0.5}})"), "missing required field 'shards'");
  EXPECT_EQ(error_for(head + attributes + R"("shards": {}})"), "field 'shards': expected an array, got object");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [{"file": "a.h5", "tiles": 3}, {"file": "b.h5"}]})"),
            "missing required field 'shards[1].tiles'");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [{"file": "a.h5", "tiles": -3}]})"),
            "field 'shards[0].tiles': expected a non-negative integer, got -3");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [{"file": "a.h5", "tiles": 3, "slides": ["x", 7]}]})"),
            "field 'shards[0].slides[1]': expected a string, got number");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [], "slides": [{"path": "x.svs"}]})"),
            "missing required field 'slides[0].id'");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [], "failures": ["x"]})"),
            "field 'failures[0]': expected an object, got string");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [], "slides": [{"id": "x", "origin": "scanned"}]})"),
            "field 'slides[0].origin': expected 'synthetic' or 'real', got 'scanned'");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [], "slides": [{"id": "x", "origin": true}]})"),
            "field 'slides[0].origin': expected a string, got boolean");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [], "slides": [{"id": "x", "qc_kept_tiles": {"fold": -2}}]})"),
            "field 'slides[0].qc_kept_tiles.fold': expected a count (an integer >= 0)");
  EXPECT_EQ(error_for(head + attributes + R"("shards": [], "slides": [{"id": "x", "qc_kept_tiles": [1]}]})"),
            "field 'slides[0].qc_kept_tiles': expected an object of counts");
}

// The tiling's tissue settings come from the effective job the manifest carries: what training records in the
// checkpoint for inference.
TEST(Manifest, TissueSettingsComeFromTheTilingJob) {
  TempDir dir;
  const std::string path = dir.file("manifest.json");
  io::Manifest m = sample_manifest();
  io::write_manifest(path, m);
  EXPECT_FALSE(io::read_manifest(path).tissue.has_value()) << "config_yaml has no tissue section";
  m.config_yaml =
      "# doc\ntile:\n  size: 96\ntissue:\n  # Minimum tissue fraction\n  min_fraction: 0.3\n"
      "  mask_mpp: 16\n  reject_pen_marks: false\n";
  io::write_manifest(path, m);
  auto tissue = io::read_manifest(path).tissue;
  ASSERT_TRUE(tissue.has_value());
  EXPECT_EQ(*tissue, (io::TissueSettings{0.3, 16.0, false}));
  // A key an older job lacked takes today's default.
  m.config_yaml = "tissue:\n  min_fraction: 0.25\n";
  io::write_manifest(path, m);
  tissue = io::read_manifest(path).tissue;
  ASSERT_TRUE(tissue.has_value());
  EXPECT_EQ(*tissue, (io::TissueSettings{0.25, 8.0, true}));
  // Settings that cannot be used are an error naming the manifest.
  for (const std::string bad : {"tissue:\n  min_fraction: lots\n", "tissue:\n  min_fraction: 1.5\n",
                                "tissue:\n  mask_mpp: 0\n", "tissue: [\n"}) {
    m.config_yaml = bad;
    io::write_manifest(path, m);
    try {
      io::read_manifest(path);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_NE(e.message().find("config_yaml"), std::string::npos) << e.message();
    }
  }
}

// tessera tile writes the settings as a "tissue" object; config_yaml is read only for manifests written before it.
TEST(Manifest, TissueSettingsAreAnObjectOfTheirOwn) {
  TempDir dir;
  const std::string path = dir.file("manifest.json");
  io::Manifest m = sample_manifest();
  m.config_yaml = "tissue:\n  min_fraction: 0.9\n";  // not read: the object wins
  m.tissue = io::TissueSettings{0.3, 16.0, false};
  io::write_manifest(path, m);
  std::stringstream written;
  written << std::ifstream(path).rdbuf();
  const auto doc = nlohmann::json::parse(written.str());
  EXPECT_EQ(doc["tissue"], (nlohmann::json{{"min_fraction", 0.3}, {"mask_mpp", 16.0}, {"reject_pen_marks", false}}));
  EXPECT_EQ(io::read_manifest(path).tissue, m.tissue);

  for (const auto& [tissue, problem] : std::vector<std::pair<std::string, std::string>>{
           {R"("tissue": 3)", "field 'tissue': expected an object, got number"},
           {R"("tissue": {"mask_mpp": 8, "reject_pen_marks": true})", "missing required field 'tissue.min_fraction'"},
           {R"("tissue": {"min_fraction": 2, "mask_mpp": 8, "reject_pen_marks": true})",
            "field 'tissue.min_fraction': expected a fraction in [0, 1]"},
           {R"("tissue": {"min_fraction": 0.5, "mask_mpp": 0, "reject_pen_marks": true})",
            "field 'tissue.mask_mpp': must be positive"},
           {R"("tissue": {"min_fraction": 0.5, "mask_mpp": 8, "reject_pen_marks": "yes"})",
            "field 'tissue.reject_pen_marks': expected a boolean, got string"}}) {
    auto broken = doc;
    broken.erase("tissue");
    const std::string text = broken.dump();
    std::ofstream(path) << text.substr(0, text.size() - 1) << "," << tissue << "}";
    try {
      io::read_manifest(path);
      ADD_FAILURE() << "no error for " << tissue;
    } catch (const core::InputError& e) {
      EXPECT_EQ(e.message(), problem);
    }
  }
}

TEST(Manifest, MissingFile) {
  TempDir dir;
  EXPECT_THROW(io::read_manifest(dir.file("manifest.json")), core::FileNotFoundError);
}

}  // namespace
