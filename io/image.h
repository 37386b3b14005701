// Writing RGB images for people to look at (previews, overlays, plots).
#pragma once

#include <string>

#include <opencv2/core.hpp>

namespace tessera::io {

// Writes an RGB (CV_8UC3) or RGBA (CV_8UC4) image as PNG, atomically and durably (core/atomic_file.h).
// core::InternalError naming the file when encoding or writing fails.
void write_png(const std::string& path, const cv::Mat& rgb);

// Reads a PNG/JPEG/TIFF image as RGB CV_8UC3; core::InputError naming the file when it cannot be decoded.
cv::Mat read_rgb_image(const std::string& path);

}  // namespace tessera::io
