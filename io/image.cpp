#include "io/image.h"

#include <filesystem>
#include <string_view>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace tessera::io {

void write_png(const std::string& path, const cv::Mat& rgb) {
  cv::Mat bgr;
  if (rgb.type() == CV_8UC3) {
    cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  } else if (rgb.type() == CV_8UC4) {
    cv::cvtColor(rgb, bgr, cv::COLOR_RGBA2BGRA);
  } else {
    throw core::InternalError("write_png: expected an 8-bit RGB or RGBA image for '" + path + "'");
  }
  std::vector<unsigned char> bytes;
  if (!cv::imencode(".png", bgr, bytes)) throw core::InternalError("cannot encode PNG '" + path + "'");
  core::write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

cv::Mat read_rgb_image(const std::string& path) {
  if (!std::filesystem::exists(path)) throw core::FileNotFoundError(path);
  cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR);
  if (bgr.empty()) throw core::InputError("cannot decode image", path);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

}  // namespace tessera::io
