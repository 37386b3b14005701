#include "preprocessing/qc_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <opencv2/imgproc.hpp>

namespace tessera::prep {

namespace {

using json = nlohmann::json;

// A slide with more of its tissue in excluded artefacts is not usable.
constexpr double kMaxExcludedTissue = 0.5;
// A robust z-score above this names the slide on the cohort picture.
constexpr double kOutlierZ = 3.5;
constexpr double kMadToSigma = 1.4826;

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// CSV field: quoted when it holds a comma or a quote.
std::string field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

struct Metric {
  std::string name;
  std::string label;
  std::vector<double> values;  // per row; NaN for failed slides
};

cv::Mat render_cohort(const std::vector<json>& rows, const std::vector<Metric>& metrics) {
  constexpr int kLabelWidth = 230, kPlotWidth = 700, kPanel = 64, kMargin = 16;
  const int width = kLabelWidth + kPlotWidth + 2 * kMargin;
  const int height = 48 + static_cast<int>(metrics.size()) * kPanel + kMargin;
  cv::Mat canvas(height, width, CV_8UC3, cv::Scalar(255, 255, 255));
  const cv::Scalar ink(20, 20, 20), grid(200, 200, 200), dot(40, 90, 200), outlier(220, 30, 30);
  cv::putText(
      canvas,
      fmt::format("Slide QC over {} slide(s): each dot a slide, the line the median, outliers named", rows.size()),
      {kMargin, 28}, cv::FONT_HERSHEY_SIMPLEX, 0.55, ink, 1, cv::LINE_AA);
  for (std::size_t m = 0; m < metrics.size(); ++m) {
    const Metric& metric = metrics[m];
    const int top = 48 + static_cast<int>(m) * kPanel;
    const int mid = top + kPanel / 2 - 6;
    cv::putText(canvas, metric.label, {kMargin, mid + 5}, cv::FONT_HERSHEY_SIMPLEX, 0.45, ink, 1, cv::LINE_AA);
    std::vector<double> finite;
    for (const double v : metric.values) {
      if (std::isfinite(v)) finite.push_back(v);
    }
    const int x0 = kMargin + kLabelWidth, x1 = x0 + kPlotWidth;
    cv::line(canvas, {x0, mid}, {x1, mid}, grid, 1);
    if (finite.empty()) continue;
    const auto [lo_it, hi_it] = std::minmax_element(finite.begin(), finite.end());
    double lo = *lo_it, hi = *hi_it;
    if (hi - lo < 1e-9) {
      lo -= 0.5 * std::max(std::abs(lo), 1e-3);
      hi += 0.5 * std::max(std::abs(hi), 1e-3);
    }
    const auto x_of = [&](double v) { return x0 + static_cast<int>(std::lround((v - lo) / (hi - lo) * kPlotWidth)); };
    cv::putText(canvas, fmt::format("{:.3g}", lo), {x0 - 4, top + kPanel - 6}, cv::FONT_HERSHEY_SIMPLEX, 0.35, ink, 1,
                cv::LINE_AA);
    cv::putText(canvas, fmt::format("{:.3g}", hi), {x1 - 30, top + kPanel - 6}, cv::FONT_HERSHEY_SIMPLEX, 0.35, ink, 1,
                cv::LINE_AA);
    const double med = median(finite);
    std::vector<double> deviations;
    for (const double v : finite) deviations.push_back(std::abs(v - med));
    const double sigma = kMadToSigma * median(deviations);
    cv::line(canvas, {x_of(med), mid - 12}, {x_of(med), mid + 12}, ink, 2);
    int named = 0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const double v = metric.values[r];
      if (!std::isfinite(v)) continue;
      const bool out = sigma > 0.0 ? std::abs(v - med) / sigma > kOutlierZ : v != med;
      const int jitter = static_cast<int>((r * 7) % 11) - 5;  // spreads equal values apart, deterministically
      const cv::Point p(x_of(v), mid + jitter);
      cv::circle(canvas, p, out ? 4 : 3, out ? outlier : dot, cv::FILLED, cv::LINE_AA);
      if (out && named < 4) {
        cv::putText(canvas, rows[r]["id"].get<std::string>(), {std::min(p.x + 6, x1 - 80), mid - 10 + 12 * named},
                    cv::FONT_HERSHEY_SIMPLEX, 0.35, outlier, 1, cv::LINE_AA);
        ++named;
      }
    }
  }
  return canvas;
}

}  // namespace

json qc_summary_json(const std::string& id, const std::string& path, const QcResult& result) {
  json fractions = json::object();
  for (const Artefact a : all_artefacts())
    fractions[to_string(a)] = result.fraction[static_cast<std::size_t>(index(a))];
  const cv::Mat1b& tissue = result.tissue.mask;
  const double tissue_pixels = std::max(1, cv::countNonZero(tissue));
  return {{"id", id},
          {"path", path},
          {"tissue_area_mm2", result.tissue_area_mm2},
          {"fractions", fractions},
          {"sharpness", result.sharpness},
          {"brightness", result.brightness},
          {"background_brightness", result.background_brightness},
          {"stain_h", result.stain_h},
          {"stain_e", result.stain_e},
          {"stain_angle", result.stain_angle},
          {"excluded_fraction", cv::countNonZero(result.excluded() & tissue) / tissue_pixels},
          {"flagged_fraction", cv::countNonZero(result.flagged() & tissue) / tissue_pixels},
          {"flags", result.flags}};
}

QcCohort qc_cohort(const std::vector<json>& records) {
  QcCohort cohort;
  cohort.rows = records;
  // The cohort's stain check works on the numbers alone.
  std::vector<QcResult> stains;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < records.size(); ++i) {
    if (records[i].contains("error")) continue;
    QcResult r;
    r.tissue_area_mm2 = records[i]["tissue_area_mm2"].get<double>();
    r.stain_h = records[i]["stain_h"].get<double>();
    r.stain_e = records[i]["stain_e"].get<double>();
    r.stain_angle = records[i]["stain_angle"].get<double>();
    stains.push_back(std::move(r));
    which.push_back(i);
  }
  std::vector<QcResult*> pointers;
  for (auto& r : stains) pointers.push_back(&r);
  add_cohort_flags(pointers);
  for (std::size_t k = 0; k < stains.size(); ++k) {
    for (const auto& flag : stains[k].flags) cohort.rows[which[k]]["flags"].push_back(flag);
  }

  std::string csv = "slide_id,slide,tissue_area_mm2";
  for (const Artefact a : all_artefacts()) csv += fmt::format(",{}_fraction", to_string(a));
  csv +=
      ",sharpness,brightness,background_brightness,stain_h,stain_e,stain_angle,excluded_fraction,flagged_fraction,"
      "flags,usable,reasons\n";
  for (auto& row : cohort.rows) {
    std::vector<std::string> reasons;
    if (row.contains("error")) {
      reasons.push_back(row["error"].get<std::string>());
      row["usable"] = false;
      row["reasons"] = reasons;
      csv += fmt::format("{},{}", field(row["id"].get<std::string>()), field(row["path"].get<std::string>()));
      for (int k = 0; k < 1 + kArtefactCount + 8 + 1; ++k) csv += ",";  // tissue .. flags empty
      csv += fmt::format(",no,{}\n", field(reasons.front()));
      continue;
    }
    const auto& flags = row["flags"];
    if (!flags.empty()) ++cohort.flagged_slides;
    for (const auto& f : flags) reasons.push_back(f.get<std::string>());
    const double excluded = row["excluded_fraction"].get<double>();
    if (excluded > kMaxExcludedTissue) {
      reasons.push_back(fmt::format("{:.0f}% of the tissue in excluded artefacts", 100.0 * excluded));
    }
    row["usable"] = reasons.empty();
    row["reasons"] = reasons;
    std::string flag_text, reason_text;
    for (const auto& f : flags) flag_text += (flag_text.empty() ? "" : "; ") + f.get<std::string>();
    for (const auto& r : reasons) reason_text += (reason_text.empty() ? "" : "; ") + r;
    csv += fmt::format("{},{},{:.4f}", field(row["id"].get<std::string>()), field(row["path"].get<std::string>()),
                       row["tissue_area_mm2"].get<double>());
    for (const Artefact a : all_artefacts())
      csv += fmt::format(",{:.4f}", row["fractions"][to_string(a)].get<double>());
    csv += fmt::format(
        ",{:.3f},{:.1f},{:.1f},{:.4f},{:.4f},{:.2f},{:.4f},{:.4f},{},{},{}\n", row["sharpness"].get<double>(),
        row["brightness"].get<double>(), row["background_brightness"].get<double>(), row["stain_h"].get<double>(),
        row["stain_e"].get<double>(), row["stain_angle"].get<double>(), excluded, row["flagged_fraction"].get<double>(),
        field(flag_text), reasons.empty() ? "yes" : "no", field(reason_text));
  }
  cohort.csv = csv;

  std::vector<Metric> metrics = {{"tissue_area_mm2", "tissue area (mm2)", {}},
                                 {"sharpness", "sharpness (median |Laplacian|)", {}},
                                 {"brightness", "tissue brightness (0..255)", {}},
                                 {"background_brightness", "background brightness", {}},
                                 {"stain_h", "haematoxylin (OD)", {}},
                                 {"stain_e", "eosin (OD)", {}},
                                 {"stain_angle", "stain angle (deg)", {}},
                                 {"excluded_fraction", "tissue excluded (share)", {}},
                                 {"flagged_fraction", "tissue flagged (share)", {}}};
  for (auto& metric : metrics) {
    for (const auto& row : cohort.rows) {
      metric.values.push_back(row.contains(metric.name) ? row[metric.name].get<double>()
                                                        : std::numeric_limits<double>::quiet_NaN());
    }
  }
  cohort.picture = render_cohort(cohort.rows, metrics);
  return cohort;
}

}  // namespace tessera::prep
