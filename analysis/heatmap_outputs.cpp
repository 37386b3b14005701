#include "analysis/heatmap_outputs.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/annotations.h"
#include "io/image.h"
#include "io/slide.h"

namespace tessera::analysis {
namespace {

using nlohmann::ordered_json;

constexpr double kUm2PerMm2 = 1e6;
constexpr double kUmPerMm = 1000.0;
constexpr const char* kTumourClass = "Tumor";  // QuPath's built-in class; also a tumour group for `tessera tile`
constexpr const char* kReportFormat = "tessera-report";
constexpr int kReportVersion = 1;

// ---------------------------------------------------------------------------------------------------------
// Overlay drawing

// Region outlines: bright cyan over a dark halo reads on pale tissue, on pink H&E and on every colour of
// inferno and viridis alike.
const cv::Scalar kOutline(0, 235, 255);
const cv::Scalar kHalo(20, 20, 20);
const cv::Scalar kText(25, 25, 25);
const cv::Scalar kSubtleText(85, 85, 85);
const cv::Scalar kBackground(255, 255, 255);
const cv::Scalar kCaution(190, 20, 20);  // RGB: a red that reads as a warning on white
constexpr int kFont = cv::FONT_HERSHEY_DUPLEX;
constexpr int kMinImageWidth = 720;  // narrower thumbnails are centred on a canvas this wide (plus margins)

// Sizes that scale with the canvas, so a 2048 px overlay and a 600 px one look alike.
struct Metrics {
  double s = 1.0;  // scale relative to a 1600 px wide image
  int margin = 0;
  int title_height = 0;
  int caution_height = 0;  // the caution's band, when there is one
  int legend_height = 0;
  double title_font = 0, text_font = 0, small_font = 0;
  int line = 1;  // text and outline thickness
};

Metrics metrics_for(cv::Size thumbnail) {
  Metrics m;
  m.s = std::clamp(std::max(thumbnail.width, kMinImageWidth) / 1600.0, 0.5, 1.4);
  m.margin = static_cast<int>(std::lround(20 * m.s));
  m.title_font = 1.05 * m.s;
  m.text_font = 0.62 * m.s;
  m.small_font = 0.52 * m.s;
  m.line = std::max(1, static_cast<int>(std::lround(1.6 * m.s)));
  m.title_height = static_cast<int>(std::lround(92 * m.s));
  m.caution_height = static_cast<int>(std::lround(40 * m.s));
  m.legend_height = static_cast<int>(std::lround(118 * m.s));
  return m;
}

cv::Size text_size(const std::string& text, double font, int thickness, int* baseline = nullptr) {
  int base = 0;
  const cv::Size size = cv::getTextSize(text, kFont, font, thickness, &base);
  if (baseline != nullptr) *baseline = base;
  return size;
}

void put_text(cv::Mat& canvas, const std::string& text, cv::Point origin, double font, const cv::Scalar& colour,
              int thickness) {
  cv::putText(canvas, text, origin, kFont, font, colour, thickness, cv::LINE_AA);
}

// `text` with each em dash (UTF-8 "—", which Hershey fonts cannot draw) drawn as a line one "M" wide.
void put_text_with_dashes(cv::Mat& canvas, const std::string& text, cv::Point origin, double font,
                          const cv::Scalar& colour, int thickness) {
  static const std::string dash = "\xE2\x80\x94";
  const cv::Size em = text_size("M", font, thickness);
  std::size_t from = 0;
  int x = origin.x;
  while (true) {
    const std::size_t at = text.find(dash, from);
    const std::string part = text.substr(from, at == std::string::npos ? std::string::npos : at - from);
    put_text(canvas, part, cv::Point(x, origin.y), font, colour, thickness);
    x += text_size(part, font, thickness).width;
    if (at == std::string::npos) break;
    const int y = origin.y - em.height / 2;
    cv::line(canvas, cv::Point(x + thickness, y), cv::Point(x + em.width - thickness, y), colour, thickness,
             cv::LINE_AA);
    x += em.width;
    from = at + dash.size();
  }
}

// White text with a dark rim, legible anywhere on the slide.
void put_label(cv::Mat& image, const std::string& text, cv::Point origin, double font, int thickness) {
  cv::putText(image, text, origin, kFont, font, kHalo, thickness + 3, cv::LINE_AA);
  cv::putText(image, text, origin, kFont, font, cv::Scalar(255, 255, 255), thickness, cv::LINE_AA);
}

std::string format_probability(double p) { return std::isnan(p) ? std::string("n/a") : fmt::format("{:.2f}", p); }

// "0.5 mm", "2 mm", "0.05 mm": Hershey fonts have no µ, and millimetres are what a pathologist measures in.
std::string format_mm(double mm) {
  const int decimals = mm >= 10.0 ? 0 : mm >= 1.0 ? 1 : mm >= 0.1 ? 2 : 3;
  std::string text = fmt::format("{:.{}f}", mm, decimals);
  while (decimals > 0 && text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text + " mm";
}

std::string size_class_summary(const std::vector<Region>& regions) {
  std::array<int, 3> counts{};
  for (const auto& r : regions) ++counts[static_cast<std::size_t>(r.size_class)];
  std::vector<std::string> parts;
  const std::array<const char*, 3> names = {"ITC", "micrometastasis", "macrometastasis"};
  for (int k = 2; k >= 0; --k) {
    const int n = counts[static_cast<std::size_t>(k)];
    if (n == 0) continue;
    std::string name = names[static_cast<std::size_t>(k)];
    if (n > 1 && k > 0) name.replace(name.size() - 2, 2, "es");  // metastasis -> metastases
    parts.push_back(fmt::format("{} {}", n, name));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

void paint_map(cv::Mat& image, const io::Heatmap& h, const OutputOptions& options) {
  const double sx = static_cast<double>(h.slide_width) / image.cols;
  const double sy = static_cast<double>(h.slide_height) / image.rows;
  const std::vector<int> rows = io::cell_rows(h, image.rows, sy);
  const std::vector<int> cols = io::cell_columns(h, image.cols, sx);
  const OverlayOptions& o = options.overlay;
  for (int y = 0; y < image.rows; ++y) {
    const int i = rows[static_cast<std::size_t>(y)];
    if (i < 0) continue;
    auto* pixel = image.ptr<cv::Vec3b>(y);
    for (int x = 0; x < image.cols; ++x) {
      const int j = cols[static_cast<std::size_t>(x)];
      if (j < 0) continue;
      const float p = h.at(i, j);
      if (std::isnan(p)) continue;
      const cv::Vec3b colour = io::colormap_rgb(p, o.colormap);
      const double alpha = overlay_alpha(p, o);
      for (int c = 0; c < 3; ++c) {
        pixel[x][c] = cv::saturate_cast<std::uint8_t>((1.0 - alpha) * pixel[x][c] + alpha * colour[c]);
      }
    }
  }
}

void draw_regions(cv::Mat& image, const io::Heatmap& h, const std::vector<Region>& regions, const Metrics& m,
                  const OverlayOptions& o) {
  const double sx = static_cast<double>(h.slide_width) / image.cols;
  const double sy = static_cast<double>(h.slide_height) / image.rows;
  auto to_image = [&](const io::Ring& ring) {
    std::vector<cv::Point> points;
    points.reserve(ring.size());
    for (const auto& p : ring) {
      points.emplace_back(std::clamp(static_cast<int>(std::lround(p.x / sx)), 0, image.cols - 1),
                          std::clamp(static_cast<int>(std::lround(p.y / sy)), 0, image.rows - 1));
    }
    return points;
  };
  std::vector<std::vector<cv::Point>> rings;
  for (const auto& r : regions) {
    rings.push_back(to_image(r.outer));
    for (const auto& hole : r.holes) rings.push_back(to_image(hole));
  }
  cv::polylines(image, rings, true, kHalo, m.line + 2, cv::LINE_AA);
  cv::polylines(image, rings, true, kOutline, m.line, cv::LINE_AA);

  // Numbers as in report.json, just above each region's topmost point (below its lowest one at the top edge).
  const double font = 0.7 * m.s;
  const int gap = m.line + static_cast<int>(std::lround(6 * m.s));
  const int count = std::min<int>(static_cast<int>(regions.size()), std::max(0, o.max_labels));
  for (int k = 0; k < count; ++k) {
    const Region& r = regions[static_cast<std::size_t>(k)];
    const std::string text = std::to_string(r.id);
    int baseline = 0;
    const cv::Size size = text_size(text, font, m.line, &baseline);
    const auto [top, bottom] = std::minmax_element(r.outer.begin(), r.outer.end(), [](const auto& a, const auto& b) {
      return a.y < b.y || (a.y == b.y && a.x < b.x);
    });
    int x = static_cast<int>(std::lround(top->x / sx)) - size.width / 2;
    int y = static_cast<int>(std::lround(top->y / sy)) - gap;
    if (y - size.height < 0) {
      x = static_cast<int>(std::lround(bottom->x / sx)) - size.width / 2;
      y = static_cast<int>(std::lround(bottom->y / sy)) + gap + size.height;
    }
    x = std::clamp(x, 2, std::max(2, image.cols - size.width - 2));
    y = std::clamp(y, size.height + 2, std::max(size.height + 2, image.rows - baseline - 2));
    put_label(image, text, cv::Point(x, y), font, m.line);
  }
}

// A round length (1-2-5 steps, in mm) about a sixth of the image width.
double scale_bar_mm(double image_width_mm) {
  static constexpr std::array<double, 13> lengths = {0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100};
  const double target = image_width_mm / 6.0;
  double best = lengths.front();
  for (const double l : lengths) {
    if (l > 0.0 && l <= target) best = l;
  }
  return best;
}

void draw_title(cv::Mat& canvas, const io::Heatmap& h, const std::vector<Region>& regions, const Metrics& m,
                const OutputOptions& options) {
  const int x = m.margin;
  const std::string name = h.slide_id.empty() ? std::string("slide") : h.slide_id;
  const cv::Size title = text_size(name, m.title_font, m.line + 1);
  const int title_y = m.margin + title.height;
  put_text(canvas, name, cv::Point(x, title_y), m.title_font, kText, m.line + 1);
  const std::string kind = "  tumour probability";
  put_text(canvas, kind, cv::Point(x + title.width, title_y), m.text_font, kSubtleText, m.line);

  std::string line;
  const float score = h.max_prob();
  if (h.scored_cells() == 0) {
    line = "no tissue was scored";
  } else {
    line = fmt::format("slide score (max P) {}   |   ", format_probability(score));
    if (regions.empty()) {
      line += fmt::format("no region with P >= {:.2f}", options.regions.threshold);
    } else {
      line += fmt::format("{} region{} with P >= {:.2f}: {}   |   largest {}", regions.size(),
                          regions.size() == 1 ? "" : "s", options.regions.threshold, size_class_summary(regions),
                          format_mm(regions.front().longest_diameter_um / kUmPerMm));
    }
  }
  const cv::Size sub = text_size(line, m.text_font, m.line);
  put_text(canvas, line, cv::Point(x, title_y + static_cast<int>(std::lround(14 * m.s)) + sub.height), m.text_font,
           kSubtleText, m.line);
}

// The caution across its band, left-aligned with the title, in red and a little larger than the other text.
void draw_caution(cv::Mat& canvas, const OverlayLayout& layout, const std::string& caution, const Metrics& m) {
  const double font = 0.8 * m.s;
  const int thickness = m.line + 1;
  const cv::Size size = text_size("M", font, thickness);
  const int baseline = layout.caution.y + (layout.caution.height + size.height) / 2;
  put_text_with_dashes(canvas, caution, cv::Point(m.margin, baseline), font, kCaution, thickness);
}

void draw_legend(cv::Mat& canvas, const OverlayLayout& layout, const io::Heatmap& h, const Metrics& m,
                 const OutputOptions& options) {
  const OverlayOptions& o = options.overlay;
  const int top = layout.image.y + layout.image.height + static_cast<int>(std::lround(16 * m.s));
  const int left = m.margin;

  // Colour bar: the colours as painted at full opacity, ticks every 0.25, the threshold marked in the outline
  // colour (what lies above it is outlined).
  const std::string caption = "tumour probability P";
  const cv::Size caption_size = text_size(caption, m.text_font, m.line);
  put_text(canvas, caption, cv::Point(left, top + caption_size.height), m.text_font, kText, m.line);
  const int bar_top = top + caption_size.height + static_cast<int>(std::lround(10 * m.s));
  const int bar_width = std::min(static_cast<int>(std::lround(460 * m.s)), canvas.cols * 2 / 5);
  const int bar_height = static_cast<int>(std::lround(20 * m.s));
  for (int x = 0; x < bar_width; ++x) {
    const cv::Vec3b c = io::colormap_rgb(static_cast<double>(x) / (bar_width - 1), o.colormap);
    cv::line(canvas, cv::Point(left + x, bar_top), cv::Point(left + x, bar_top + bar_height - 1),
             cv::Scalar(c[0], c[1], c[2]));
  }
  cv::rectangle(canvas, cv::Rect(left - 1, bar_top - 1, bar_width + 2, bar_height + 2), kText, 1);
  const int tick = static_cast<int>(std::lround(6 * m.s));
  for (int k = 0; k <= 4; ++k) {
    const int x = left + static_cast<int>(std::lround(k / 4.0 * (bar_width - 1)));
    cv::line(canvas, cv::Point(x, bar_top + bar_height), cv::Point(x, bar_top + bar_height + tick), kText, 1);
    const std::string text = k == 0 ? "0" : k == 4 ? "1" : fmt::format("{:.2f}", k / 4.0);
    const cv::Size size = text_size(text, m.small_font, m.line);
    put_text(canvas, text, cv::Point(x - size.width / 2, bar_top + bar_height + tick + 4 + size.height), m.small_font,
             kText, m.line);
  }
  const int tx = left + static_cast<int>(std::lround(options.regions.threshold * (bar_width - 1)));
  cv::line(canvas, cv::Point(tx, bar_top - tick), cv::Point(tx, bar_top + bar_height + tick / 2), kHalo, m.line + 2);
  cv::line(canvas, cv::Point(tx, bar_top - tick), cv::Point(tx, bar_top + bar_height + tick / 2), kOutline, m.line);

  // What an outline means, right of the bar.
  const int key_left = left + bar_width + static_cast<int>(std::lround(40 * m.s));
  const int key_y = bar_top + bar_height / 2;
  const int swatch = static_cast<int>(std::lround(34 * m.s));
  cv::line(canvas, cv::Point(key_left, key_y), cv::Point(key_left + swatch, key_y), kHalo, m.line + 2, cv::LINE_AA);
  cv::line(canvas, cv::Point(key_left, key_y), cv::Point(key_left + swatch, key_y), kOutline, m.line, cv::LINE_AA);
  const std::string key = fmt::format("region, P >= {:.2f}", options.regions.threshold);
  const cv::Size key_size = text_size(key, m.text_font, m.line);
  put_text(canvas, key, cv::Point(key_left + swatch + 8, key_y + key_size.height / 2), m.text_font, kText, m.line);
  const std::string note = "numbers as in report.json";
  const cv::Size note_size = text_size(note, m.small_font, m.line);
  put_text(canvas, note, cv::Point(key_left + swatch + 8, key_y + key_size.height / 2 + 8 + note_size.height),
           m.small_font, kSubtleText, m.line);

  // Scale bar, right-aligned under the picture (same scale as the picture).
  const double um_per_pixel = h.slide_mpp * static_cast<double>(h.slide_width) / layout.image.width;
  if (um_per_pixel > 0.0) {
    const double length_mm = scale_bar_mm(layout.image.width * um_per_pixel / kUmPerMm);
    const int length = static_cast<int>(std::lround(length_mm * kUmPerMm / um_per_pixel));
    const int right = layout.image.x + layout.image.width;
    const int bar_y = bar_top + bar_height / 2;
    const int thick = std::max(3, static_cast<int>(std::lround(7 * m.s)));
    cv::rectangle(canvas, cv::Rect(right - length, bar_y - thick / 2, length, thick), kText, cv::FILLED);
    for (const int x : {right - length, right - 1}) {
      cv::line(canvas, cv::Point(x, bar_y - thick), cv::Point(x, bar_y + thick), kText, 1);
    }
    const std::string label = format_mm(length_mm);
    const cv::Size size = text_size(label, m.text_font, m.line);
    put_text(canvas, label, cv::Point(right - length / 2 - size.width / 2, bar_y - thick - 8), m.text_font, kText,
             m.line);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Annotations

io::Ring footprint_ring(const io::Heatmap& h, int row, int col) {
  const cv::Rect2d f = io::cell_footprint(h, row, col);
  const auto width = static_cast<double>(h.slide_width);
  const auto height = static_cast<double>(h.slide_height);
  const double x0 = std::clamp(f.x, 0.0, width), x1 = std::clamp(f.x + f.width, 0.0, width);
  const double y0 = std::clamp(f.y, 0.0, height), y1 = std::clamp(f.y + f.height, 0.0, height);
  return {{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}};
}

std::string region_name(const Region& r) { return fmt::format("Region {}: {}", r.id, label(r.size_class)); }

ordered_json point_json(const cv::Point2d& p) { return ordered_json::array({std::lround(p.x), std::lround(p.y)}); }

ordered_json number_or_null(double value) { return std::isfinite(value) ? ordered_json(value) : ordered_json(nullptr); }

// Rounded for people (the report), not for machines (heatmap.h5 has the exact values).
double round_to(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::isfinite(value) ? std::round(value * scale) / scale : value;
}

void write_heatmap_output(const std::string& path, const SlideResult& r, const OutputOptions&) {
  io::write_heatmap(path, r.heatmap);
}
void write_overlay_output(const std::string& path, const SlideResult& r, const OutputOptions& o) {
  write_overlay_png(path, r.heatmap, r.regions, r.thumbnail, o, r.caution, &r.qc);
}
void write_tiff_output(const std::string& path, const SlideResult& r, const OutputOptions& o) {
  io::write_heatmap_tiff(path, r.heatmap, o.tiff);
}
// A DICOM Segmentation must reference DICOM source images: the slide is opened again for its UIDs and geometry, and
// one that is not DICOM fails with the reason (io/dicom_seg.h).
void write_dicom_seg_output(const std::string& path, const SlideResult& r, const OutputOptions& o) {
  io::SlideOpenOptions open_options;
  open_options.assume_mpp = r.heatmap.slide_mpp;
  const io::Slide slide = io::Slide::open(r.heatmap.slide_path, open_options);
  for (const auto& note : io::write_dicom_seg(path, r.heatmap, slide, o.seg)) {
    spdlog::warn("{}: dicom-seg: {}", r.heatmap.slide_id, note);
  }
}
void write_geojson_output(const std::string& path, const SlideResult& r, const OutputOptions& o) {
  write_regions_geojson(path, r.heatmap, r.regions, o);
}
void write_xml_output(const std::string& path, const SlideResult& r, const OutputOptions&) {
  write_regions_asap(path, r.regions);
}
void write_csv_output(const std::string& path, const SlideResult& r, const OutputOptions&) {
  write_detections_csv(path, r.detections);
}
void write_report_output(const std::string& path, const SlideResult& r, const OutputOptions& o) {
  write_report_json(path, r, o);
}

}  // namespace

SlideResult analyse_heatmap(io::Heatmap heatmap, const OutputOptions& options) {
  SlideResult result;
  result.regions = find_regions(heatmap, options.regions);
  result.detections = find_detections(heatmap, options.detections);
  result.heatmap = std::move(heatmap);
  return result;
}

// ---------------------------------------------------------------------------------------------------------
// overlay.png

OverlayLayout overlay_layout(cv::Size thumbnail, bool caution) {
  const Metrics m = metrics_for(thumbnail);
  OverlayLayout layout;
  const int width = std::max(thumbnail.width, kMinImageWidth) + 2 * m.margin;
  const int caution_height = caution ? m.caution_height : 0;
  layout.canvas = cv::Size(width, m.title_height + caution_height + thumbnail.height + m.legend_height);
  if (caution) layout.caution = cv::Rect(0, m.title_height, width, caution_height);
  layout.image =
      cv::Rect((width - thumbnail.width) / 2, m.title_height + caution_height, thumbnail.width, thumbnail.height);
  return layout;
}

double overlay_alpha(double p, const OverlayOptions& overlay) {
  const double clamped = std::clamp(p, 0.0, 1.0);
  return overlay.min_alpha + (overlay.max_alpha - overlay.min_alpha) * clamped;
}

cv::Mat render_map_rgba(const io::Heatmap& h, double x0, double y0, double scale, cv::Size size,
                        const OverlayOptions& overlay, double min_prob) {
  cv::Mat image(size, CV_8UC4, cv::Scalar::all(0));
  const std::vector<int> rows = io::cell_rows(h, size.height, scale, y0);
  const std::vector<int> cols = io::cell_columns(h, size.width, scale, x0);
  for (int y = 0; y < size.height; ++y) {
    const int i = rows[static_cast<std::size_t>(y)];
    if (i < 0) continue;
    auto* pixel = image.ptr<cv::Vec4b>(y);
    for (int x = 0; x < size.width; ++x) {
      const int j = cols[static_cast<std::size_t>(x)];
      if (j < 0) continue;
      const float p = h.at(i, j);
      if (std::isnan(p) || p < min_prob) continue;
      const cv::Vec3b colour = io::colormap_rgb(p, overlay.colormap);
      const double alpha = overlay_alpha(p, overlay);
      pixel[x] = cv::Vec4b(colour[0], colour[1], colour[2], cv::saturate_cast<std::uint8_t>(255.0 * alpha));
    }
  }
  return image;
}

namespace {

// Excluded areas in grey, flagged ones in amber: outlines only, so the slide and the map stay visible.
void draw_qc(cv::Mat& image, const io::Heatmap& h, const QcOutcome& qc, const Metrics& m) {
  const std::array<std::pair<const cv::Mat1b*, cv::Scalar>, 2> layers = {
      {{&qc.excluded, cv::Scalar(110, 110, 110)}, {&qc.flagged, cv::Scalar(255, 170, 0)}}};
  for (const auto& [mask, colour] : layers) {
    if (mask->empty() || cv::countNonZero(*mask) == 0) continue;
    // Mask pixel (c, r) covers level-0 [c·downsample, ...); the image's pixels are slide_width / cols wide.
    cv::Mat1b scaled;
    const double f = qc.downsample * static_cast<double>(image.cols) / static_cast<double>(h.slide_width);
    cv::resize(*mask, scaled, cv::Size(), f, f, cv::INTER_NEAREST);
    cv::Mat1b fitted = cv::Mat1b::zeros(image.size());
    const cv::Rect common(0, 0, std::min(fitted.cols, scaled.cols), std::min(fitted.rows, scaled.rows));
    scaled(common).copyTo(fitted(common));
    std::vector<std::vector<cv::Point>> contours;
    cv::findContours(fitted, contours, cv::RETR_LIST, cv::CHAIN_APPROX_SIMPLE);
    cv::drawContours(image, contours, -1, colour, std::max(1, m.line / 2), cv::LINE_AA);
  }
}

std::string qc_text(const QcOutcome& qc) {
  std::string text =
      fmt::format("excluded {:.3f} mm2 (not scored), flagged {:.3f} mm2", qc.excluded_mm2, qc.flagged_mm2);
  for (const auto& c : qc.classes) {
    if (c.area_mm2 > 0.0) text += fmt::format("; {} {} {:.3f} mm2", c.name, c.action, c.area_mm2);
  }
  for (const auto& f : qc.flags) text += "; slide: " + f;
  return text;
}

}  // namespace

std::vector<std::string> region_artefacts(const Region& region, const QcOutcome& qc) {
  std::vector<std::string> out;
  if (!qc.ran || qc.masks.empty() || region.outer.empty()) return out;
  // The outline filled and dilated within its bounding box grown by the dilation's pixel (clipped to the masks): no
  // plane the masks' size per region.
  std::vector<cv::Point> ring;
  for (const auto& p : region.outer) {
    ring.emplace_back(static_cast<int>(std::lround(p.x / qc.downsample)),
                      static_cast<int>(std::lround(p.y / qc.downsample)));
  }
  const cv::Rect box = (cv::boundingRect(ring) + cv::Size(2, 2) - cv::Point(1, 1)) &
                       cv::Rect(cv::Point(), qc.masks.front().second.size());
  if (box.empty()) return out;
  for (auto& p : ring) p -= box.tl();
  cv::Mat1b shape = cv::Mat1b::zeros(box.size());
  cv::fillPoly(shape, std::vector<std::vector<cv::Point>>{ring}, cv::Scalar(255));
  cv::dilate(shape, shape, cv::getStructuringElement(cv::MORPH_RECT, cv::Size(3, 3)));
  for (const auto& [name, mask] : qc.masks) {
    if (cv::countNonZero(mask(box) & shape) > 0) out.push_back(name);
  }
  return out;
}

cv::Mat render_overlay(const io::Heatmap& h, const std::vector<Region>& regions, const cv::Mat& thumbnail,
                       const OutputOptions& options, const std::string& caution, const QcOutcome* qc) {
  if (const std::string problem = io::heatmap_problem(h); !problem.empty()) {
    throw core::InternalError("render_overlay: invalid heatmap: " + problem);
  }
  cv::Mat image;
  if (thumbnail.empty()) {
    // No slide pixels: the map on white, at the slide's aspect ratio.
    const int side = std::max(16, options.overlay.max_side);
    const double scale = static_cast<double>(side) / static_cast<double>(std::max(h.slide_width, h.slide_height));
    image = cv::Mat(std::max(1, static_cast<int>(std::lround(h.slide_height * scale))),
                    std::max(1, static_cast<int>(std::lround(h.slide_width * scale))), CV_8UC3, kBackground);
  } else if (thumbnail.type() == CV_8UC3) {
    image = thumbnail.clone();
  } else {
    throw core::InternalError("render_overlay: the thumbnail must be RGB CV_8UC3");
  }
  const Metrics m = metrics_for(image.size());
  paint_map(image, h, options);
  if (qc != nullptr && qc->ran) draw_qc(image, h, *qc, m);
  draw_regions(image, h, regions, m, options.overlay);

  const OverlayLayout layout = overlay_layout(image.size(), !caution.empty());
  cv::Mat canvas(layout.canvas, CV_8UC3, kBackground);
  image.copyTo(canvas(layout.image));
  cv::rectangle(canvas,
                cv::Rect(layout.image.x - 1, layout.image.y - 1, layout.image.width + 2, layout.image.height + 2),
                cv::Scalar(200, 200, 200), 1);
  draw_title(canvas, h, regions, m, options);
  if (!caution.empty()) draw_caution(canvas, layout, caution, m);
  draw_legend(canvas, layout, h, m, options);
  return canvas;
}

void write_overlay_png(const std::string& path, const io::Heatmap& heatmap, const std::vector<Region>& regions,
                       const cv::Mat& thumbnail, const OutputOptions& options, const std::string& caution,
                       const QcOutcome* qc) {
  std::vector<io::PngText> text;
  if (!caution.empty()) text.push_back({"Warning", caution});
  if (qc != nullptr && qc->ran) text.push_back({"QC", qc_text(*qc)});
  io::write_png(path, render_overlay(heatmap, regions, thumbnail, options, caution, qc), text);
}

// ---------------------------------------------------------------------------------------------------------
// GeoJSON, ASAP XML, CSV

void write_regions_geojson(const std::string& path, const io::Heatmap& h, const std::vector<Region>& regions,
                           const OutputOptions& options) {
  // One feature at a time (io::write_geojson_from streams them): the regions, then a detection per scored tile.
  io::Annotation a;
  std::size_t region = 0;
  std::int64_t cell = options.geojson.tiles ? 0 : std::int64_t{h.rows} * h.cols;
  const auto next = [&]() -> const io::Annotation* {
    if (region < regions.size()) {
      const Region& r = regions[region++];
      a = io::Annotation();
      a.name = region_name(r);
      a.group = kTumourClass;
      a.outer = r.outer;
      a.holes = r.holes;
      a.measurements = {{"Area mm^2", r.area_mm2},
                        {"Longest diameter µm", r.longest_diameter_um},
                        {"Max probability", r.max_prob},
                        {"Mean probability", r.mean_prob},
                        {"Tiles", static_cast<double>(r.cells)}};
      return &a;
    }
    for (; cell < std::int64_t{h.rows} * h.cols; ++cell) {
      const auto i = static_cast<int>(cell / h.cols), j = static_cast<int>(cell % h.cols);
      const float p = h.at(i, j);
      if (std::isnan(p)) continue;
      io::Ring ring = footprint_ring(h, i, j);
      if (io::ring_area(ring) <= 0.0) continue;  // a footprint wholly outside the slide
      a = io::Annotation();
      a.object_type = "detection";
      a.outer = std::move(ring);
      a.measurements = {{"tumor_prob", p}};
      ++cell;
      return &a;
    }
    return nullptr;
  };
  io::write_geojson_from(path, next, {}, /*pretty=*/false);
}

void write_regions_asap(const std::string& path, const std::vector<Region>& regions) {
  std::vector<io::Annotation> annotations;
  annotations.reserve(regions.size());
  for (const auto& r : regions) {
    io::Annotation a;
    a.name = region_name(r);
    a.group = kTumourClass;
    a.outer = r.outer;
    a.holes = r.holes;
    annotations.push_back(std::move(a));
  }
  io::write_asap_xml(path, annotations, {{kTumourClass, "#C80000"}});
}

// ---------------------------------------------------------------------------------------------------------
// report.json

std::string report_json(const SlideResult& result, const OutputOptions& options) {
  const io::Heatmap& h = result.heatmap;
  const std::int64_t scored = h.scored_cells();
  const double footprint_mm2 =
      static_cast<double>(h.step) * static_cast<double>(h.step) * h.slide_mpp * h.slide_mpp / kUm2PerMm2;
  const bool from_mask = !std::isnan(result.tissue_area_mm2);
  const double tissue_mm2 = from_mask ? result.tissue_area_mm2 : static_cast<double>(scored) * footprint_mm2;

  double tumour_mm2 = 0.0;
  ordered_json per_class = ordered_json::object();
  for (const SizeClass c : kSizeClasses) per_class[to_string(c)] = 0;
  ordered_json regions = ordered_json::array();
  for (const auto& r : result.regions) {
    tumour_mm2 += r.area_mm2;
    per_class[to_string(r.size_class)] = per_class[to_string(r.size_class)].get<int>() + 1;
    regions.push_back({{"id", r.id},
                       {"size_class", to_string(r.size_class)},
                       {"area_mm2", round_to(r.area_mm2, 6)},
                       {"longest_diameter_um", round_to(r.longest_diameter_um, 1)},
                       {"max_prob", round_to(r.max_prob, 4)},
                       {"mean_prob", round_to(r.mean_prob, 4)},
                       {"tiles", r.cells},
                       {"centroid", point_json(r.centroid)},
                       {"peak", point_json(r.peak)},
                       {"bounds", ordered_json::array({std::lround(r.bounds.x), std::lround(r.bounds.y),
                                                       std::lround(r.bounds.width), std::lround(r.bounds.height)})},
                       {"artefacts", region_artefacts(r, result.qc)}});
  }
  ordered_json qc = nullptr;
  if (result.qc.ran) {
    ordered_json classes = ordered_json::array();
    for (const auto& c : result.qc.classes) {
      classes.push_back({{"name", c.name},
                         {"action", c.action},
                         {"area_mm2", round_to(c.area_mm2, 6)},
                         {"tissue_fraction", round_to(c.tissue_fraction, 6)}});
    }
    qc = {{"flags", result.qc.flags},
          {"excluded_area_mm2", round_to(result.qc.excluded_mm2, 6)},
          {"flagged_area_mm2", round_to(result.qc.flagged_mm2, 6)},
          {"excluded_cells", result.qc.excluded_cells},
          {"classes", classes}};
  }
  const float score = h.max_prob();
  ordered_json report = {
      {"format", kReportFormat},
      {"version", kReportVersion},
      {"slide",
       {{"id", h.slide_id},
        {"path", h.slide_path},
        {"width", h.slide_width},
        {"height", h.slide_height},
        {"mpp", h.slide_mpp}}},
      {"model",
       {{"checkpoint", h.checkpoint},
        {"tile_mpp", h.tile_mpp},
        {"tile_um", round_to(static_cast<double>(h.tile) * h.slide_mpp, 2)},
        {"tile_level0_px", h.tile},
        {"step_level0_px", h.step},
        {"training_data", io::to_string(io::training_data(result.training))},
        {"training_slides", result.training ? ordered_json({{"synthetic", result.training->synthetic_slides},
                                                            {"real", result.training->real_slides},
                                                            {"unknown", result.training->unknown_slides}})
                                            : ordered_json(nullptr)},
        {"training_shards", result.training ? ordered_json(result.training->shards) : ordered_json(nullptr)}}},
      {"caution", result.caution.empty() ? ordered_json(nullptr) : ordered_json(result.caution)},
      {"threshold", options.regions.threshold},
      {"slide_score", number_or_null(std::isnan(score) ? NAN : round_to(score, 4))},
      {"slide_score_definition", "maximum tumour probability over the slide's tiles"},
      {"scored_tiles", scored},
      {"tissue_area_mm2", round_to(tissue_mm2, 4)},
      {"tissue_area_source", from_mask ? "tissue mask" : "scored tiles"},
      {"tumour_area_mm2", round_to(tumour_mm2, 6)},
      {"tumour_fraction_of_tissue", number_or_null(tissue_mm2 > 0.0 ? round_to(tumour_mm2 / tissue_mm2, 6) : NAN)},
      {"largest_size_class", result.regions.empty() ? "none" : to_string(result.regions.front().size_class)},
      {"regions_per_size_class", per_class},
      {"size_class_rule",
       "longest diameter: isolated_tumour_cells <= 0.2 mm < micrometastasis <= 2 mm < macrometastasis"},
      {"detections", result.detections.size()},
      {"regions", regions},
      {"qc", qc},
  };
  return report.dump(2) + "\n";
}

void write_report_json(const std::string& path, const SlideResult& result, const OutputOptions& options) {
  core::write_file_atomic(path, report_json(result, options));
}

// ---------------------------------------------------------------------------------------------------------
// Registry

const std::vector<OutputWriter>& output_writers() {
  static const std::vector<OutputWriter> writers = {
      {"heatmap.h5", "heatmap.h5", write_heatmap_output},
      {"overlay.png", "overlay.png", write_overlay_output},
      {"heatmap.tif", "heatmap.tif", write_tiff_output},
      {"geojson", "geojson", write_geojson_output},
      {"xml", "xml", write_xml_output},
      {"detections.csv", "detections.csv", write_csv_output},
      {"report.json", "report.json", write_report_output},
      {"dicom-seg", "seg.dcm", write_dicom_seg_output, true},
  };
  return writers;
}

const OutputWriter* find_output_writer(const std::string& name) {
  for (const auto& w : output_writers()) {
    if (name == w.name) return &w;
  }
  return nullptr;
}

std::string output_writer_names() {
  std::vector<std::string> names;
  for (const auto& w : output_writers()) names.emplace_back(w.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

std::vector<std::string> write_slide_outputs(const std::string& directory, const SlideResult& result,
                                             const OutputOptions& options,
                                             std::vector<std::pair<std::string, double>>* seconds) {
  for (const auto& name : options.outputs) {
    if (find_output_writer(name) == nullptr) {
      throw core::InternalError(fmt::format("unknown output '{}' (known: {})", name, output_writer_names()));
    }
  }
  // Registry order, whatever the order asked.
  std::vector<const OutputWriter*> selected;
  for (const auto& w : output_writers()) {
    const bool asked = std::find(options.outputs.begin(), options.outputs.end(), w.name) != options.outputs.end() ||
                       (options.dicom_seg && std::string(w.name) == "dicom-seg");
    if (asked || (options.outputs.empty() && !w.only_when_asked)) {
      selected.push_back(&w);
    }
  }
  const std::string id = result.heatmap.slide_id.empty() ? std::string("slide") : result.heatmap.slide_id;
  std::vector<std::string> written;
  for (const OutputWriter* w : selected) {
    const std::string path = (std::filesystem::path(directory) / (id + "." + w->suffix)).string();
    const auto start = std::chrono::steady_clock::now();
    try {
      w->write(path, result, options);
    } catch (core::Error& e) {
      e.add_context("output", w->name);
      e.add_context("slide", id);
      throw;
    }
    written.push_back(path);
    if (seconds != nullptr) {
      seconds->emplace_back(w->name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return written;
}

core::Schema& declare_output_keys(core::Schema& schema) {
  return schema
      .string_list("outputs", {},
                   "Outputs per slide (empty = all but dicom-seg): heatmap.h5, overlay.png, heatmap.tif, geojson, "
                   "xml, detections.csv, report.json, dicom-seg (a DICOM Segmentation, for slides read from DICOM)")
      .boolean("dicom_seg.enabled", false, "Also write dicom-seg (<slide>.seg.dcm) whatever `outputs` says")
      .string("dicom_seg.segment_label", "tumour", "Label of the segment")
      .string("dicom_seg.type_code", "14799000", "Segmented property type: code value (SNOMED CT by default)")
      .string("dicom_seg.type_scheme", "SCT", "Segmented property type: coding scheme designator")
      .string("dicom_seg.type_meaning", "Neoplasm, metastatic", "Segmented property type: code meaning")
      .string("overlay.colormap", "inferno", "Colour map of overlay.png and heatmap.tif", {"inferno", "viridis"})
      .integer("overlay.max_side", 2048, "Longer side of the slide thumbnail under the overlay, in pixels", 128, 16384)
      .boolean("geojson.tiles", true, "Every scored tile as a QuPath detection with a tumor_prob measurement")
      .number("detections.min_prob", 0.1, "Cells below this P(tumour) are never detections (detections.csv)", 0, 1)
      .number("detections.nms_radius_tiles", 2.0, "Non-maximum suppression radius of the detections, in tile widths", 0,
              1000);
}

OutputOptions read_output_options(const core::Config& config, double threshold, const std::string& threshold_key) {
  OutputOptions options;
  options.regions.threshold = threshold;
  options.detections.min_prob = config.get_number("detections.min_prob");
  options.detections.nms_radius_tiles = config.get_number("detections.nms_radius_tiles");
  options.overlay.colormap = io::parse_colormap(config.get_string("overlay.colormap"));
  options.overlay.max_side = static_cast<int>(config.get_int("overlay.max_side"));
  options.tiff.colormap = options.overlay.colormap;
  options.geojson.tiles = config.get_bool("geojson.tiles");
  options.outputs = config.get_string_list("outputs");
  options.dicom_seg = config.get_bool("dicom_seg.enabled");
  options.seg.segment_label = config.get_string("dicom_seg.segment_label");
  options.seg.type_code = config.get_string("dicom_seg.type_code");
  options.seg.type_scheme = config.get_string("dicom_seg.type_scheme");
  options.seg.type_meaning = config.get_string("dicom_seg.type_meaning");
  for (const auto& name : options.outputs) {
    if (find_output_writer(name) == nullptr) {
      throw core::ConfigError(fmt::format("unknown output '{}' (known: {})", name, output_writer_names()),
                              config.source(), 0, "outputs");
    }
  }
  if (!(threshold > 0.0)) {
    throw core::ConfigError("the threshold must be above 0 (regions are the cells with P >= threshold)",
                            config.source(), 0, threshold_key);
  }
  return options;
}

}  // namespace tessera::analysis
