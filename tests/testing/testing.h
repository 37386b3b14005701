// Helpers for Tessera's tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include <opencv2/core.hpp>

#include "io/tiff_writer.h"

namespace tessera::testing {

// A fresh, empty folder under the system temp dir, removed (with its contents) by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The folder of committed test cases (TESSERA_TEST_DATA, set by CTest).
std::filesystem::path test_data_dir();
// The project's real data, ../shared/data next to the repository (may be absent: tests then skip, saying so).
std::filesystem::path shared_data_dir();

// A deterministic test pattern: every pixel's colour is a function of its level-0 (x, y), so a reader's
// output can be checked against pattern_pixel() at any location and level.
cv::Vec3b pattern_pixel(std::int64_t x, std::int64_t y);

// Writes a width×height slide whose level-0 pixels are pattern_pixel(x, y), with the given options.
void write_pattern_slide(const std::string& path, std::int64_t width, std::int64_t height,
                         const io::TiffWriterOptions& options);

// Damage to the compressed bytes of a slide's tiles, made in place: the file keeps its size and its directories,
// so it opens, and only the damaged tiles fail to decode.
enum class TileDamage {
  zeros,     // every byte of the tile zero: the decoder cannot start (libjpeg: an error)
  scramble,  // a few bytes in the middle of JPEG entropy-coded data changed: libjpeg decodes the tile, with a
             // "Corrupt JPEG data" warning and wrong pixels
};

// Damages the tiles of pyramid level `level` (the tiled TIFF directories in file order, 0 = level 0; stripped
// associated images do not count) for which which(column, row) is true. Returns how many; throws
// std::runtime_error when the file or level cannot be read.
int damage_tiles(const std::string& path, int level, const std::function<bool(std::uint32_t, std::uint32_t)>& which,
                 TileDamage damage);

}  // namespace tessera::testing
