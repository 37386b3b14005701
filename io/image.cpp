#include "io/image.h"

#include <unistd.h>

#include <filesystem>
#include <vector>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

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
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    core::check_errno(f != nullptr, "cannot create '" + tmp + "'");
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    const bool closed = std::fclose(f) == 0;
    if (!ok || !closed) {
      std::filesystem::remove(tmp);
      throw core::InternalError("cannot write '" + path + "' (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw core::InternalError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  }
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
