// <slide>.qc.png (io/qc_masks.h).
#include "io/qc_masks.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

#include <opencv2/imgcodecs.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace tessera::io {

void write_qc_masks_png(const std::string& path, const cv::Mat1w& bits) {
  std::vector<std::uint8_t> png;
  if (!cv::imencode(".png", bits, png)) throw core::InternalError("cannot encode PNG '" + path + "'");
  core::write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
}

cv::Mat1w read_qc_masks_png(const std::string& path) {
  if (!std::filesystem::exists(path)) throw core::FileNotFoundError(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::InputError("cannot be read", path);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // OpenCV's PNG decoder fails (empty image) on a truncated file or a bad CRC.
  const cv::Mat image = cv::imdecode(bytes, cv::IMREAD_UNCHANGED);
  if (image.empty()) throw core::InputError("not a readable PNG (quality control masks, <slide>.qc.png)", path);
  if (image.type() != CV_16UC1) {
    throw core::InputError("not a 16-bit one-channel PNG (quality control masks, <slide>.qc.png)", path);
  }
  return image;
}

double qc_mask_downsample(std::int64_t slide_width, int columns) {
  if (columns <= 0) throw core::InternalError("qc_mask_downsample: a mask without columns");
  return static_cast<double>(slide_width) / columns;
}

cv::Mat1b qc_mask_of(const cv::Mat1w& bits, std::uint16_t mask) {
  cv::Mat1b out(bits.size());
  for (int r = 0; r < bits.rows; ++r) {
    const auto* b = bits.ptr<std::uint16_t>(r);
    auto* o = out.ptr<std::uint8_t>(r);
    for (int c = 0; c < bits.cols; ++c) o[c] = (b[c] & mask) != 0 ? 255 : 0;
  }
  return out;
}

}  // namespace tessera::io
