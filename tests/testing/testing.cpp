#include "tests/testing/testing.h"

#include <cmath>
#include <cstdlib>
#include <random>

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

}  // namespace tessera::testing
