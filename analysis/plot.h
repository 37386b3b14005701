// Line charts drawn with OpenCV, for the curves a verb reports (ROC, FROC): title, axes with ticks and grid, axis
// labels, curves, labelled points and a legend. Text is ASCII (OpenCV's Hershey fonts have no µ or ≥).
#pragma once

#include <string>
#include <vector>

#include <opencv2/core.hpp>

namespace tessera::analysis {

struct PlotSeries {
  std::string label;                // legend text; "" = not in the legend
  std::vector<cv::Point2d> points;  // data coordinates, joined in order
  cv::Scalar rgb;
  int thickness = 2;
  bool dashed = false;
};

struct PlotMarker {
  cv::Point2d at;    // data coordinates
  std::string text;  // written beside the marker ("" = none)
  cv::Scalar rgb;
};

struct Chart {
  std::string title;
  std::string subtitle;  // a smaller second line ("" = none)
  std::string x_label;
  std::string y_label;
  double x_min = 0.0, x_max = 1.0;
  double y_min = 0.0, y_max = 1.0;
  bool x_log2 = false;  // logarithmic x axis (x_min > 0); smaller x values are drawn at x_min
  std::vector<double> x_ticks;
  std::vector<double> y_ticks;
  std::vector<PlotSeries> series;
  std::vector<PlotMarker> markers;
  std::string marker_legend;  // legend text for the markers ("" = none)
  std::string note;           // centred in the plot area when there is nothing to draw (e.g. "undefined: one class")
};

// The chart as an RGB image (CV_8UC3) of `size` pixels. Values outside the axis ranges are drawn at the edge.
cv::Mat render_chart(const Chart& chart, cv::Size size = cv::Size(960, 720));

}  // namespace tessera::analysis
