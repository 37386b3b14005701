// Helpers for Tessera's tests.
#pragma once

#include <cstdint>
#include <filesystem>
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

// A deterministic test pattern: every pixel's colour is a function of its level-0 (x, y), so a reader's
// output can be checked against pattern_pixel() at any location and level.
cv::Vec3b pattern_pixel(std::int64_t x, std::int64_t y);

// Writes a width×height slide whose level-0 pixels are pattern_pixel(x, y), with the given options.
void write_pattern_slide(const std::string& path, std::int64_t width, std::int64_t height,
                         const io::TiffWriterOptions& options);

}  // namespace tessera::testing
