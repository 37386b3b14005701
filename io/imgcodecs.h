// OpenCV's image codecs (opencv_imgcodecs), loaded when first called. Linked into the program, that library and the
// 130-odd libraries it needs (GDAL, Poppler, libheif and theirs) are loaded and relocated when any tessera process
// starts, whether it reads or writes an image or not: 80 ms of CPU time per process here, 6% of a `tessera tile`
// job of 64 slides with quality control off, which writes no image. These are OpenCV's own functions, with their
// behaviour and results; the first call loads the library (core::InternalError naming it when it cannot).
#pragma once

#include <string>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>  // declarations and flags only: the library is not linked

namespace tessera::io::imgcodecs {

cv::Mat imread(const std::string& path, int flags = cv::IMREAD_COLOR);
bool imwrite(const std::string& path, cv::InputArray image, const std::vector<int>& params = {});
bool imencode(const std::string& extension, cv::InputArray image, std::vector<uchar>& bytes,
              const std::vector<int>& params = {});
cv::Mat imdecode(cv::InputArray bytes, int flags);

}  // namespace tessera::io::imgcodecs
