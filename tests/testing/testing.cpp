#include "tests/testing/testing.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include <tiffio.h>

namespace tessera::testing {

TempDir::TempDir() {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / ("tessera-test-" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary folder under " + base.string());
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::filesystem::path test_data_dir() {
  const char* dir = std::getenv("TESSERA_TEST_DATA");
  return dir ? std::filesystem::path(dir) : std::filesystem::path(TESSERA_SOURCE_DIR) / "tests" / "data";
}

std::filesystem::path shared_data_dir() {
  return (std::filesystem::path(TESSERA_SOURCE_DIR) / ".." / "shared" / "data").lexically_normal();
}

cv::Vec3b pattern_pixel(std::int64_t x, std::int64_t y) {
  // Smooth in both directions (so JPEG and area-averaging keep it within a few levels) and different along
  // x and y (so a transposed or shifted read is caught).
  const double fx = static_cast<double>(x);
  const double fy = static_cast<double>(y);
  auto clamp = [](double v) { return static_cast<unsigned char>(std::lround(std::fmin(255.0, std::fmax(0.0, v)))); };
  return {clamp(128.0 + 100.0 * std::sin(fx / 97.0)), clamp(128.0 + 100.0 * std::cos(fy / 131.0)),
          clamp(40.0 + 170.0 * std::fmod((fx + 2.0 * fy) / 1500.0, 1.0))};
}

void write_pattern_slide(const std::string& path, std::int64_t width, std::int64_t height,
                         const io::TiffWriterOptions& options) {
  io::TiffWriter writer(path, width, height, options);
  for (std::int64_t y0 = 0; y0 < height; y0 += options.tile_size) {
    const int rows = static_cast<int>(std::min<std::int64_t>(options.tile_size, height - y0));
    cv::Mat strip(rows, static_cast<int>(width), CV_8UC3);
    for (int r = 0; r < rows; ++r) {
      auto* row = strip.ptr<cv::Vec3b>(r);
      for (std::int64_t x = 0; x < width; ++x) row[x] = pattern_pixel(x, y0 + r);
    }
    writer.write_strip(strip);
  }
  writer.finish();
}

int damage_tiles(const std::string& path, int level, const std::function<bool(std::uint32_t, std::uint32_t)>& which,
                 TileDamage damage) {
  TIFF* tif = TIFFOpen(path.c_str(), "r");
  if (tif == nullptr) throw std::runtime_error("damage_tiles: libtiff cannot open " + path);
  int seen = -1;
  bool found = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // offset, bytes
  do {
    if (!TIFFIsTiled(tif)) continue;  // associated images (thumbnail, label) are stripped
    if (++seen != level) continue;
    found = true;
    std::uint32_t width = 0, tile_width = 0, tile_height = 0;
    TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &width);
    TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tile_width);
    TIFFGetField(tif, TIFFTAG_TILELENGTH, &tile_height);
    const std::uint32_t across = (width + tile_width - 1) / tile_width;
    for (std::uint32_t t = 0; t < TIFFNumberOfTiles(tif); ++t) {
      if (which(t % across, t / across)) {
        spans.emplace_back(TIFFGetStrileOffset(tif, t), TIFFGetStrileByteCount(tif, t));
      }
    }
    break;
  } while (TIFFReadDirectory(tif));
  TIFFClose(tif);
  if (!found) throw std::runtime_error("damage_tiles: " + path + " has no level " + std::to_string(level));

  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  for (const auto& [offset, bytes] : spans) {
    std::string data(bytes, '\0');
    if (damage == TileDamage::scramble) {
      file.seekg(static_cast<std::streamoff>(offset));
      file.read(data.data(), static_cast<std::streamsize>(data.size()));
      // Eight bytes from the middle of the tile, well inside the entropy-coded data of a JPEG tile; bytes next to
      // 0xFF are left alone, and none becomes 0xFF, so that no marker appears or disappears: the damage stays
      // in the coded data, where libjpeg warns instead of failing.
      int changed = 0;
      for (std::size_t i = data.size() / 2; i + 1 < data.size() && changed < 8; ++i) {
        const auto byte = static_cast<unsigned char>(data[i]);
        const auto before = static_cast<unsigned char>(data[i - 1]);
        const auto changed_byte = static_cast<unsigned char>(byte ^ 0x5a);
        if (byte == 0xff || before == 0xff || changed_byte == 0xff) continue;
        data[i] = static_cast<char>(changed_byte);
        ++changed;
      }
    }
    file.seekp(static_cast<std::streamoff>(offset));
    file.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  if (!file) throw std::runtime_error("damage_tiles: cannot rewrite the tiles of " + path);
  return static_cast<int>(spans.size());
}

}  // namespace tessera::testing
