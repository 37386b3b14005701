#include "preprocessing/overlay.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <opencv2/imgproc.hpp>

namespace tessera::prep {
namespace {

std::vector<cv::Point> to_thumbnail(const io::Ring& ring, double scale) {
  std::vector<cv::Point> points;
  points.reserve(ring.size());
  for (const auto& p : ring) {
    points.emplace_back(static_cast<int>(std::lround(p.x / scale)), static_cast<int>(std::lround(p.y / scale)));
  }
  return points;
}

}  // namespace

void draw_outlines(cv::Mat& thumbnail, const std::vector<io::Annotation>& annotations, double scale,
                   const cv::Scalar& rgb, int thickness) {
  std::vector<std::vector<cv::Point>> rings;
  for (const auto& a : annotations) {
    rings.push_back(to_thumbnail(a.outer, scale));
    for (const auto& hole : a.holes) rings.push_back(to_thumbnail(hole, scale));
  }
  cv::polylines(thumbnail, rings, true, rgb, thickness, cv::LINE_AA);
}

void draw_mask_outline(cv::Mat& thumbnail, const cv::Mat1b& mask, double downsample, double scale,
                       const cv::Scalar& rgb, int thickness) {
  if (mask.empty() || cv::countNonZero(mask) == 0 || !(scale > 0.0)) return;
  // Nearest mask pixel under each thumbnail pixel's centre.
  cv::Mat1b fitted;
  const double a = scale / downsample;  // mask pixels per thumbnail pixel
  cv::resize(mask, fitted, cv::Size(static_cast<int>(std::lround(mask.cols / a)),
                                    static_cast<int>(std::lround(mask.rows / a))),
             0, 0, cv::INTER_NEAREST);
  cv::Mat1b canvas = cv::Mat1b::zeros(thumbnail.size());
  const cv::Rect common(0, 0, std::min(canvas.cols, fitted.cols), std::min(canvas.rows, fitted.rows));
  fitted(common).copyTo(canvas(common));
  std::vector<std::vector<cv::Point>> contours;
  cv::findContours(canvas, contours, cv::RETR_LIST, cv::CHAIN_APPROX_SIMPLE);
  cv::drawContours(thumbnail, contours, -1, rgb, thickness, cv::LINE_8);
}

void draw_scale_bar(cv::Mat& thumbnail, double um_per_pixel) {
  // The largest "round" length that fits in a fifth of the width.
  static constexpr std::array<double, 10> lengths_um = {10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000};
  const double target_um = thumbnail.cols / 5.0 * um_per_pixel;
  double length_um = lengths_um.front();
  for (double l : lengths_um) {
    if (l <= target_um) length_um = l;
  }
  const int length_px = static_cast<int>(std::lround(length_um / um_per_pixel));
  const int margin = std::max(8, thumbnail.cols / 64);
  const int bar_h = std::max(3, thumbnail.rows / 160);
  const cv::Point origin(margin, thumbnail.rows - margin);
  const std::string label = length_um >= 1000 ? std::to_string(static_cast<int>(length_um / 1000)) + " mm"
                                              : std::to_string(static_cast<int>(length_um)) + " um";
  const double font_scale = std::max(0.4, thumbnail.cols / 1600.0);
  int baseline = 0;
  const cv::Size text = cv::getTextSize(label, cv::FONT_HERSHEY_SIMPLEX, font_scale, 1, &baseline);
  // A white box behind bar and label keeps them readable on tissue.
  const cv::Rect box(origin.x - 4, origin.y - bar_h - text.height - 12, std::max(length_px, text.width) + 8,
                     bar_h + text.height + 16);
  cv::rectangle(thumbnail, box & cv::Rect(0, 0, thumbnail.cols, thumbnail.rows), cv::Scalar(255, 255, 255), cv::FILLED);
  cv::rectangle(thumbnail, cv::Rect(origin.x, origin.y - bar_h, length_px, bar_h), cv::Scalar(0, 0, 0), cv::FILLED);
  cv::putText(thumbnail, label, cv::Point(origin.x, origin.y - bar_h - 6), cv::FONT_HERSHEY_SIMPLEX, font_scale,
              cv::Scalar(0, 0, 0), 1, cv::LINE_AA);
}

}  // namespace tessera::prep
