#include "analysis/plot.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <opencv2/imgproc.hpp>

namespace tessera::analysis {
namespace {

const cv::Scalar kBlack(20, 20, 20);
const cv::Scalar kGrey(110, 110, 110);
const cv::Scalar kGrid(228, 228, 228);
const cv::Scalar kWhite(255, 255, 255);
constexpr int kFont = cv::FONT_HERSHEY_DUPLEX;

struct Text {
  double scale;
  int thickness;
};
constexpr Text kTitle{0.85, 1};
constexpr Text kLabel{0.62, 1};
constexpr Text kTick{0.5, 1};
constexpr Text kSmall{0.48, 1};

cv::Size text_size(const std::string& text, Text style, int* baseline = nullptr) {
  int base = 0;
  const cv::Size s = cv::getTextSize(text, kFont, style.scale, style.thickness, &base);
  if (baseline != nullptr) *baseline = base;
  return s;
}

// Writes `text` with its top-left at `at`.
void put(cv::Mat& image, const std::string& text, cv::Point at, Text style, const cv::Scalar& rgb) {
  const cv::Size s = text_size(text, style);
  cv::putText(image, text, cv::Point(at.x, at.y + s.height), kFont, style.scale, rgb, style.thickness, cv::LINE_AA);
}

void put_centred(cv::Mat& image, const std::string& text, cv::Point centre_top, Text style, const cv::Scalar& rgb) {
  put(image, text, cv::Point(centre_top.x - text_size(text, style).width / 2, centre_top.y), style, rgb);
}

// Vertical text reading bottom to top, centred on `centre`.
void put_vertical(cv::Mat& image, const std::string& text, cv::Point centre, Text style, const cv::Scalar& rgb) {
  int baseline = 0;
  const cv::Size s = text_size(text, style, &baseline);
  cv::Mat strip(s.height + baseline + 4, s.width + 4, image.type(), kWhite);
  cv::putText(strip, text, cv::Point(2, s.height + 2), kFont, style.scale, rgb, style.thickness, cv::LINE_AA);
  cv::Mat turned;
  cv::rotate(strip, turned, cv::ROTATE_90_COUNTERCLOCKWISE);
  const cv::Rect where(centre.x - turned.cols / 2, centre.y - turned.rows / 2, turned.cols, turned.rows);
  const cv::Rect inside = where & cv::Rect(0, 0, image.cols, image.rows);
  turned(cv::Rect(inside.x - where.x, inside.y - where.y, inside.width, inside.height)).copyTo(image(inside));
}

std::string tick_text(double v) {
  if (v != 0.0 && std::fabs(v) < 1e-3) return fmt::format("{:.0e}", v);
  return fmt::format("{:g}", std::round(v * 1e6) / 1e6);
}

void dashed_line(cv::Mat& image, cv::Point2d a, cv::Point2d b, const cv::Scalar& rgb, int thickness) {
  const double length = std::hypot(b.x - a.x, b.y - a.y);
  constexpr double kDash = 9.0, kGap = 7.0;
  for (double t = 0.0; t < length; t += kDash + kGap) {
    const double t1 = std::min(length, t + kDash);
    const cv::Point2d p = a + (b - a) * (t / length);
    const cv::Point2d q = a + (b - a) * (t1 / length);
    cv::line(image, cv::Point(cvRound(p.x), cvRound(p.y)), cv::Point(cvRound(q.x), cvRound(q.y)), rgb, thickness,
             cv::LINE_AA);
  }
}

}  // namespace

cv::Mat render_chart(const Chart& chart, cv::Size size) {
  cv::Mat image(size, CV_8UC3, kWhite);
  const int top = chart.subtitle.empty() ? 62 : 84;
  const cv::Rect area(92, top, size.width - 92 - 32, size.height - top - 78);

  const auto xf = [&](double x) { return chart.x_log2 ? std::log2(std::max(x, chart.x_min)) : x; };
  const double x0 = xf(chart.x_min), x1 = xf(chart.x_max);
  const auto px = [&](double x) {
    const double t = std::clamp((xf(x) - x0) / (x1 - x0), 0.0, 1.0);
    return area.x + t * area.width;
  };
  const auto py = [&](double y) {
    const double t = std::clamp((y - chart.y_min) / (chart.y_max - chart.y_min), 0.0, 1.0);
    return area.y + area.height - t * area.height;
  };

  // Title and subtitle.
  put_centred(image, chart.title, cv::Point(size.width / 2, 16), kTitle, kBlack);
  if (!chart.subtitle.empty()) put_centred(image, chart.subtitle, cv::Point(size.width / 2, 50), kSmall, kGrey);

  // Grid and ticks.
  for (const double x : chart.x_ticks) {
    const int u = cvRound(px(x));
    cv::line(image, cv::Point(u, area.y), cv::Point(u, area.y + area.height), kGrid, 1);
    cv::line(image, cv::Point(u, area.y + area.height), cv::Point(u, area.y + area.height + 6), kBlack, 1);
    put_centred(image, tick_text(x), cv::Point(u, area.y + area.height + 11), kTick, kBlack);
  }
  for (const double y : chart.y_ticks) {
    const int v = cvRound(py(y));
    cv::line(image, cv::Point(area.x, v), cv::Point(area.x + area.width, v), kGrid, 1);
    cv::line(image, cv::Point(area.x - 6, v), cv::Point(area.x, v), kBlack, 1);
    const std::string text = tick_text(y);
    const cv::Size s = text_size(text, kTick);
    put(image, text, cv::Point(area.x - 10 - s.width, v - s.height / 2), kTick, kBlack);
  }
  cv::rectangle(image, area, kBlack, 1);

  // Axis labels.
  put_centred(image, chart.x_label, cv::Point(area.x + area.width / 2, area.y + area.height + 42), kLabel, kBlack);
  put_vertical(image, chart.y_label, cv::Point(24, area.y + area.height / 2), kLabel, kBlack);

  // Curves, then markers on top.
  bool drawn = false;
  for (const auto& series : chart.series) {
    std::vector<cv::Point2d> points;
    for (const auto& p : series.points) points.emplace_back(px(p.x), py(p.y));
    for (std::size_t i = 1; i < points.size(); ++i) {
      if (series.dashed) {
        dashed_line(image, points[i - 1], points[i], series.rgb, series.thickness);
      } else {
        cv::line(image, cv::Point(cvRound(points[i - 1].x), cvRound(points[i - 1].y)),
                 cv::Point(cvRound(points[i].x), cvRound(points[i].y)), series.rgb, series.thickness, cv::LINE_AA);
      }
    }
    drawn = drawn || (points.size() > 1 && !series.label.empty());
  }
  for (const auto& marker : chart.markers) {
    const cv::Point at(cvRound(px(marker.at.x)), cvRound(py(marker.at.y)));
    cv::circle(image, at, 6, marker.rgb, cv::FILLED, cv::LINE_AA);
    cv::circle(image, at, 6, kBlack, 1, cv::LINE_AA);
    if (marker.text.empty()) continue;
    const cv::Size s = text_size(marker.text, kSmall);
    // Beside the point, kept inside the plot area: below-right, or left when it would leave the area.
    cv::Point corner(at.x + 9, at.y + 8);
    if (corner.x + s.width > area.x + area.width - 4) corner.x = at.x - 9 - s.width;
    if (corner.y + s.height > area.y + area.height - 4) corner.y = at.y - 10 - s.height;
    cv::rectangle(image, cv::Rect(corner.x - 2, corner.y - 2, s.width + 4, s.height + 6), kWhite, cv::FILLED);
    put(image, marker.text, corner, kSmall, kBlack);
  }
  if (!drawn && !chart.note.empty()) {
    put_centred(image, chart.note, cv::Point(area.x + area.width / 2, area.y + area.height / 2 - 10), kLabel, kGrey);
  }

  // Legend, bottom right inside the plot.
  std::vector<const PlotSeries*> entries;
  for (const auto& series : chart.series) {
    if (!series.label.empty()) entries.push_back(&series);
  }
  const bool marker_entry = !chart.marker_legend.empty() && !chart.markers.empty();
  const int rows = static_cast<int>(entries.size()) + (marker_entry ? 1 : 0);
  if (rows > 0) {
    int width = marker_entry ? text_size(chart.marker_legend, kSmall).width : 0;
    for (const auto* e : entries) width = std::max(width, text_size(e->label, kSmall).width);
    constexpr int kRow = 26, kSwatch = 34;
    const cv::Rect box(area.x + area.width - width - kSwatch - 30, area.y + area.height - 14 - kRow * rows,
                       width + kSwatch + 22, kRow * rows + 4);
    cv::rectangle(image, box, kWhite, cv::FILLED);
    cv::rectangle(image, box, kGrey, 1);
    for (int i = 0; i < rows; ++i) {
      const int y = box.y + 15 + kRow * i;
      const cv::Point a(box.x + 8, y), b(box.x + 8 + kSwatch - 8, y);
      if (i == static_cast<int>(entries.size())) {
        const cv::Point centre((a.x + b.x) / 2, y);
        cv::circle(image, centre, 6, chart.markers.front().rgb, cv::FILLED, cv::LINE_AA);
        cv::circle(image, centre, 6, kBlack, 1, cv::LINE_AA);
        put(image, chart.marker_legend, cv::Point(box.x + kSwatch + 8, y - 8), kSmall, kBlack);
        continue;
      }
      const PlotSeries& e = *entries[static_cast<std::size_t>(i)];
      if (e.dashed) {
        dashed_line(image, a, b, e.rgb, e.thickness);
      } else {
        cv::line(image, a, b, e.rgb, e.thickness + 1, cv::LINE_AA);
      }
      put(image, e.label, cv::Point(box.x + kSwatch + 8, y - 8), kSmall, kBlack);
    }
  }
  return image;
}

}  // namespace tessera::analysis
