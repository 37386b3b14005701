// `tessera evaluate [job.yaml]`: CAMELYON16-style scores of a model's outputs against the ground truth.
//
// Inputs
//   dataset      dataset.csv (tessera synth's, or any CSV with columns slide_id, slide, label, annotation_xml /
//                annotation_geojson / annotation, split, optional mpp); paths relative to the CSV's folder
//   detections   folder of `tessera infer` outputs: <slide>.detections.csv (CAMELYON16 prob,X,Y, level-0) and
//                <slide>.report.json (its "slide_score"), also found as <slide>/<slide>.* or <slide>.csv
//   predictions  optional `tessera predict` CSV (slide_id,x,y,label,p_tumor) for the patch-level AUC
// Scores (analysis/evaluation.h states every rule): lesion-level FROC on the slides' annotations, slide-level ROC
// AUC of the reports' scores, patch-level ROC AUC of the predictions.
// Outputs (each written to a temporary name and renamed): <output>/evaluation.json, froc.png, roc.png.
//
// A slide without a detections file counts as a slide without detections and one without a report as score 0;
// both are listed. A slide whose inputs are broken (annotation, detections, report, unreadable slide) gets one
// error naming the file and is left out of every score; the others go on, and the exit code is then 3.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "analysis/evaluation.h"
#include "analysis/plot.h"
#include "app/cli.h"
#include "core/atomic_file.h"
#include "core/comm.h"
#include "core/csv.h"
#include "core/error.h"
#include "core/metrics.h"
#include "core/output_dir.h"
#include "io/annotations.h"
#include "io/dataset.h"
#include "io/image.h"
#include "io/slide.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keys in the order written: the summary reads top-down

const core::Schema& evaluate_schema() {
  static const core::Schema instance = [] {
    const io::AnnotationClasses classes;
    core::Schema schema;
    schema.string("dataset", "", "Ground truth: dataset.csv (slide_id, slide, label, annotation_xml/_geojson, split)")
        .string("detections", "", "Folder with <slide>.detections.csv and <slide>.report.json (tessera infer)")
        .string("predictions", "", "Optional patch predictions CSV (tessera predict) for the patch-level AUC")
        .string("output", "evaluation", "Folder for evaluation.json, froc.png and roc.png")
        .string_list("splits", {}, "Evaluate the slides of these splits (empty = every slide of the dataset)")
        .number("slides.assume_mpp", 0.0, "um/px for slides that record none (0 = such tumour slides fail)", 0, 100)
        .integer("froc.mask_level", 5, "Evaluation mask pixel = 2^level level-0 pixels (CAMELYON16: 5)", 0, 16)
        .number("froc.dilation_um", 75.0,
                "CAMELYON16's 75 um: lesion borders grow by half of it (distance < 75 / (2 * mask um/px))", 0.001,
                10000)
        .number("froc.itc_diameter_um", 200.0, "Isolated tumour cells: major axis < this + dilation_um", 0, 100000)
        .boolean("froc.include_itc", false, "Count isolated-tumour-cell lesions like the others (default: ignored)")
        .string_list("classes.tumour", classes.tumour, "Annotation groups/classes that are tumour")
        .string_list("classes.exclusion", classes.exclusion,
                     "Annotation groups/classes that are not tumour (drawn over tumour, e.g. ASAP _2)");
    return schema;
  }();
  return instance;
}

// ---- dataset.csv ------------------------------------------------------------------------------------------------

// io/dataset.h reads it: every row needs an id (slide_id, or the slide file's name) and a tumor/normal label; the
// slide file is optional (without it the mpp column gives the resolution).
using DatasetSlide = io::DatasetRow;
using core::split_csv_line;

// A CSV with a header: the column index of each name (for the predictions file).
class CsvHeader {
 public:
  explicit CsvHeader(const std::string& line) {
    const auto names = split_csv_line(line);
    for (std::size_t i = 0; i < names.size(); ++i) column_[names[i]] = i;
  }
  bool has(const std::string& name) const { return column_.contains(name); }
  std::string field(const std::vector<std::string>& fields, const std::string& name) const {
    const auto it = column_.find(name);
    return it != column_.end() && it->second < fields.size() ? fields[it->second] : std::string();
  }

 private:
  std::map<std::string, std::size_t> column_;
};

std::vector<DatasetSlide> read_dataset(const std::string& path) {
  auto slides = io::read_dataset_csv(path, {.slide = false, .label = true}).rows;
  std::set<std::string> ids;
  for (const auto& s : slides) {
    if (!ids.insert(s.id).second)
      throw core::InputError(fmt::format("line {}: slide '{}' is listed twice", s.line, s.id), path);
  }
  if (slides.empty()) throw core::InputError("the dataset lists no slide", path);
  return slides;
}

// ---- per-slide inputs ------------------------------------------------------------------------------------------

// The first of `names` (relative to `dir`) that exists, or "".
std::string find_file(const fs::path& dir, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    if (fs::is_regular_file(dir / name)) return (dir / name).string();
  }
  return "";
}

double read_slide_score(const std::string& path) {
  json j;
  try {
    std::ifstream in(path);
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw core::InputError(fmt::format("not valid JSON: {}", e.what()), path);
  }
  // tessera infer's report.json (analysis/heatmap_outputs.h): "slide_score" is null when no tile of the
  // slide was over tissue.
  if (!j.is_object() || !j.contains("slide_score")) {
    throw core::InputError("the report has no \"slide_score\" (not a tessera infer report.json)", path);
  }
  if (!j["slide_score"].is_number()) {
    throw core::InputError("the report's \"slide_score\" is not a number (no tile of the slide was scored)", path);
  }
  const double score = j["slide_score"].get<double>();
  if (!std::isfinite(score)) throw core::InputError("the report's \"slide_score\" is not finite", path);
  return score;
}

struct SlideResult {
  const DatasetSlide* slide = nullptr;
  bool tumour = false;
  analysis::SlideFroc froc;
  std::string detections_file;  // "" = none found
  std::string report_file;      // "" = none found
  std::optional<double> score;
  double mpp = 0.0;  // tumour slides
  std::vector<analysis::Lesion> lesions;
  double downsample = 0.0;
};

struct Settings {
  std::string dataset;
  fs::path detections;  // empty = no FROC
  double assume_mpp = 0.0;
  analysis::FrocOptions froc;
  io::AnnotationClasses classes;
};

SlideResult evaluate_slide(const DatasetSlide& s, const Settings& settings) {
  SlideResult r;
  r.slide = &s;
  r.tumour = s.label == io::SlideLabel::tumour;
  const fs::path& dir = settings.detections;
  r.detections_file = find_file(dir, {fmt::format("{}.detections.csv", s.id),
                                      fmt::format("{0}/{0}.detections.csv", s.id), fmt::format("{}.csv", s.id)});
  r.report_file = find_file(dir, {fmt::format("{}.report.json", s.id), fmt::format("{0}/{0}.report.json", s.id)});
  std::vector<analysis::Detection> detections;
  if (!r.detections_file.empty()) detections = analysis::read_detections(r.detections_file);
  if (!r.report_file.empty()) r.score = read_slide_score(r.report_file);
  if (!r.tumour) {
    r.froc = analysis::match_detections(s.id, detections, nullptr);
    return r;
  }

  if (s.annotation.empty()) {
    throw core::InputError(
        fmt::format("line {}: slide '{}' is labelled tumour but has no annotation file", s.line, s.id),
        settings.dataset);
  }
  auto annotations = io::read_annotations(s.annotation);
  // The slide's µm/px and size: the dataset's mpp column wins; the slide file gives its size (and the µm/px when
  // the column is empty). Without the slide file the mask is not clipped to the slide.
  std::int64_t width = 0, height = 0;
  r.mpp = s.mpp.value_or(0.0);
  if (!s.slide.empty() && fs::exists(s.slide)) {
    io::SlideOpenOptions open;
    open.assume_mpp = r.mpp > 0.0 ? r.mpp : settings.assume_mpp;
    const auto slide = io::Slide::open(s.slide, open);
    width = slide.width();
    height = slide.height();
    if (!(r.mpp > 0.0)) r.mpp = slide.mpp();
  } else if (!(r.mpp > 0.0)) {
    throw core::InputError(
        fmt::format("slide '{}' not found: its µm/px is needed for the evaluation mask (or give an mpp column)", s.id),
        s.slide.empty() ? settings.dataset : s.slide);
  }
  // As tile does: clipped to the slide, and a ground truth that labels no tumour would count every detection
  // of this tumour slide as a false positive.
  annotations =
      io::prepare_annotations(annotations, settings.classes, {s.annotation, "classes.tumour", true, width, height});
  try {
    const analysis::EvaluationMask mask(annotations, settings.classes, r.mpp, width, height, settings.froc);
    r.froc = analysis::match_detections(s.id, detections, &mask);
    r.lesions = mask.lesions();
    r.downsample = mask.downsample();
  } catch (core::Error& e) {
    e.add_context("annotation", s.annotation);
    throw;
  }
  return r;
}

// ---- patch predictions ------------------------------------------------------------------------------------------

struct PatchScores {
  std::vector<float> p;
  std::vector<std::uint8_t> label;
  std::int64_t other_slides = 0;  // rows of slides that are not evaluated
};

PatchScores read_predictions(const std::string& path, const std::set<std::string>& slides) {
  if (!fs::exists(path)) throw core::FileNotFoundError(path);
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) throw core::InputError("empty predictions file (no header line)", path);
  const CsvHeader header(line);
  for (const char* name : {"slide_id", "label", "p_tumor"}) {
    if (!header.has(name)) {
      throw core::InputError(
          fmt::format("no '{}' column (expected tessera predict's slide_id,x,y,label,p_tumor)", name), path);
    }
  }
  PatchScores scores;
  for (int row = 2; std::getline(in, line); ++row) {
    if (line.empty() || line == "\r") continue;
    const auto fields = split_csv_line(line);
    if (!slides.contains(header.field(fields, "slide_id"))) {
      ++scores.other_slides;
      continue;
    }
    const std::string label = header.field(fields, "label");
    const std::string p = header.field(fields, "p_tumor");
    float value = 0.0f;
    try {
      std::size_t used = 0;
      value = std::stof(p, &used);
      if (used != p.size()) throw std::invalid_argument(p);
    } catch (const std::exception&) {
      throw core::InputError(fmt::format("line {}: p_tumor '{}' is not a number", row, p), path);
    }
    if (!(value >= 0.0f && value <= 1.0f)) {
      throw core::InputError(fmt::format("line {}: p_tumor {} is outside [0, 1]", row, p), path);
    }
    if (label != "0" && label != "1")
      throw core::InputError(fmt::format("line {}: label '{}' is not 0 or 1", row, label), path);
    scores.p.push_back(value);
    scores.label.push_back(label == "1" ? 1 : 0);
  }
  return scores;
}

// ---- outputs ----------------------------------------------------------------------------------------------------

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string score_text(double v) { return std::isfinite(v) ? fmt::format("{:.4f}", v) : std::string("n/a"); }

const cv::Scalar kCurveRed(200, 30, 45);
const cv::Scalar kCurveBlue(30, 90, 190);
const cv::Scalar kChance(150, 150, 150);

cv::Mat froc_chart(const analysis::FrocResult& froc) {
  analysis::Chart chart;
  chart.title = fmt::format("Lesion-level FROC (CAMELYON16): score {}", score_text(froc.score));
  chart.subtitle = fmt::format(
      "mean sensitivity at 1/4, 1/2, 1, 2, 4, 8 FP/slide (interpolated: {}); {} slides, {} "
      "lesions, {} ITC ignored",
      score_text(froc.score_interpolated), froc.slides, froc.lesions, froc.itc_lesions);
  chart.x_label = "Average false positives per slide (log scale; 0 at the left edge)";
  chart.y_label = "Lesion sensitivity";
  chart.x_log2 = true;
  chart.x_min = 0.125;
  double max_fps = 8.0;
  for (const auto& p : froc.curve) max_fps = std::max(max_fps, p.fps_per_slide);
  chart.x_max = std::exp2(std::ceil(std::log2(max_fps)));
  for (double x = chart.x_min; x <= chart.x_max * 1.0001; x *= 2) chart.x_ticks.push_back(x);
  chart.y_min = -0.02;
  chart.y_max = 1.04;
  chart.y_ticks = {0, 0.2, 0.4, 0.6, 0.8, 1.0};
  if (froc.lesions > 0) {
    analysis::PlotSeries curve{.label = "FROC curve", .points = {}, .rgb = kCurveRed, .thickness = 2, .dashed = false};
    for (const auto& p : froc.curve) curve.points.emplace_back(p.fps_per_slide, p.sensitivity);
    // The score holds the lowest threshold's sensitivity for rates beyond the last point: show it dashed.
    const analysis::FrocPoint& last = froc.curve.front();
    if (last.fps_per_slide < chart.x_max) {
      chart.series.push_back({.label = "",
                              .points = {{last.fps_per_slide, last.sensitivity}, {chart.x_max, last.sensitivity}},
                              .rgb = kCurveRed,
                              .thickness = 1,
                              .dashed = true});
    }
    chart.series.push_back(std::move(curve));
    for (std::size_t k = 0; k < analysis::kFrocRates.size(); ++k) {
      chart.markers.push_back({cv::Point2d(analysis::kFrocRates[k], froc.sensitivity[k]),
                               fmt::format("{:.2f}", froc.sensitivity[k]), cv::Scalar(250, 190, 40)});
    }
    chart.marker_legend = "sensitivity at the six rates (score)";
  }
  chart.note = "no lesion in the evaluated slides: FROC undefined";
  return analysis::render_chart(chart);
}

cv::Mat roc_chart(const std::vector<analysis::RocPoint>& slides, double slide_auc, std::size_t n_slides,
                  const std::vector<analysis::RocPoint>& patches, double patch_auc, std::size_t n_patches) {
  analysis::Chart chart;
  std::vector<std::string> parts;
  if (!slides.empty()) parts.push_back(fmt::format("slide AUC {}", score_text(slide_auc)));
  if (!patches.empty()) parts.push_back(fmt::format("patch AUC {}", score_text(patch_auc)));
  chart.title = parts.empty() ? std::string("ROC") : fmt::format("ROC: {}", fmt::join(parts, ", "));
  chart.x_label = "False positive rate (1 - specificity)";
  chart.y_label = "True positive rate (sensitivity)";
  chart.x_ticks = chart.y_ticks = {0, 0.2, 0.4, 0.6, 0.8, 1.0};
  chart.x_min = chart.y_min = -0.02;
  chart.x_max = chart.y_max = 1.02;
  chart.series.push_back(
      {.label = "chance", .points = {{0, 0}, {1, 1}}, .rgb = kChance, .thickness = 1, .dashed = true});
  if (!patches.empty()) {
    analysis::PlotSeries s{.label = fmt::format("patches: AUC {} ({} tiles)", score_text(patch_auc), n_patches),
                           .points = {},
                           .rgb = kCurveBlue,
                           .thickness = 2,
                           .dashed = false};
    for (const auto& p : patches) s.points.emplace_back(p.fpr, p.tpr);
    chart.series.push_back(std::move(s));
  }
  if (!slides.empty()) {
    analysis::PlotSeries s{.label = fmt::format("slides: AUC {} ({} slides)", score_text(slide_auc), n_slides),
                           .points = {},
                           .rgb = kCurveRed,
                           .thickness = 3,
                           .dashed = false};
    for (const auto& p : slides) s.points.emplace_back(p.fpr, p.tpr);
    chart.series.push_back(std::move(s));
  }
  if (slides.empty() && patches.empty()) {
    chart.series.clear();
    chart.note = "ROC undefined: no scores with both classes";
  }
  return analysis::render_chart(chart);
}

json froc_json(const analysis::FrocResult& froc, const analysis::FrocOptions& options) {
  json curve = json::array();
  for (const auto& p : froc.curve) {
    curve.push_back({{"threshold", number(p.threshold)},
                     {"fps_per_slide", p.fps_per_slide},
                     {"sensitivity", number(p.sensitivity)}});
  }
  json at = json::array();
  for (std::size_t k = 0; k < analysis::kFrocRates.size(); ++k) {
    at.push_back({{"fps_per_slide", analysis::kFrocRates[k]},
                  {"sensitivity", number(froc.sensitivity[k])},
                  {"sensitivity_interpolated", number(froc.sensitivity_interpolated[k])}});
  }
  return {{"score", number(froc.score)},
          {"score_interpolated", number(froc.score_interpolated)},
          {"operating_points", at},
          {"slides", froc.slides},
          {"lesions", froc.lesions},
          {"itc_lesions", froc.itc_lesions},
          {"detected_lesions", froc.detected_lesions},
          {"false_positives", froc.false_positives},
          {"curve", curve},
          {"rules",
           {{"mask_level", options.mask_level},
            {"mask_downsample", std::ldexp(1.0, options.mask_level)},
            {"dilation_um", options.dilation_um},
            {"border_growth_um", options.dilation_um / 2},
            {"itc_major_axis_um", options.itc_diameter_um + options.dilation_um},
            {"include_itc", options.include_itc},
            {"score", "evaluate.py: sensitivity of the first curve point with FPs/slide >= rate (else the last)"},
            {"score_interpolated", "numpy.interp over the curve by ascending FPs/slide (MONAI)"}}}};
}

json slide_json(const SlideResult& r) {
  const auto& f = r.froc;
  json j = {{"slide_id", r.slide->id},
            {"label", r.tumour ? "tumor" : "normal"},
            {"split", r.slide->split},
            {"detections_file", r.detections_file.empty() ? json(nullptr) : json(r.detections_file)},
            {"report_file", r.report_file.empty() ? json(nullptr) : json(r.report_file)},
            {"score", r.score ? json(*r.score) : json(nullptr)},
            {"detections", f.detections},
            {"lesions", f.lesions()},
            {"itc_lesions", f.itc_lesions},
            {"true_positives", f.true_positives()},
            {"false_positives", f.false_positives()},
            {"itc_hits", f.itc_hits},
            {"repeat_hits", f.repeat_hits}};
  if (r.tumour) {
    j["mpp"] = r.mpp;
    json lesions = json::array();
    std::size_t entry = 0;
    for (const auto& lesion : r.lesions) {
      json l = {{"label", lesion.label},
                {"major_axis_um", lesion.major_axis_um},
                {"itc", lesion.itc},
                {"box",
                 {lesion.box.x * r.downsample, lesion.box.y * r.downsample, lesion.box.width * r.downsample,
                  lesion.box.height * r.downsample}}};
      if (!lesion.itc && entry < f.lesion_p.size() && f.lesion_label[entry] == lesion.label) {
        l["p"] = f.lesion_p[entry++];
      }
      lesions.push_back(std::move(l));
    }
    j["lesion_list"] = std::move(lesions);
  }
  return j;
}

struct EvaluateOptions {
  JobOptions job;
  std::string dataset;
  std::string detections;
  std::string predictions;
  std::string out;
  std::string splits;
  bool include_itc = false;
};

std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> names(1);
  for (const char c : text) {
    if (c == ',') {
      names.emplace_back();
    } else if (c != ' ') {
      names.back() += c;
    }
  }
  std::erase(names, std::string());
  return names;
}

int run_evaluate(const EvaluateOptions& options) {
  std::vector<std::string> overrides;
  if (!options.dataset.empty()) overrides.push_back("dataset=" + options.dataset);
  if (!options.detections.empty()) overrides.push_back("detections=" + options.detections);
  if (!options.predictions.empty()) overrides.push_back("predictions=" + options.predictions);
  if (!options.out.empty()) overrides.push_back("output=" + options.out);
  if (!options.splits.empty())
    overrides.push_back(fmt::format("splits=[{}]", fmt::join(comma_list(options.splits), ", ")));
  if (options.include_itc) overrides.push_back("froc.include_itc=true");
  const auto config = load_job(evaluate_schema(), options.job, overrides);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  // One process does the work; under mpirun the other ranks have nothing to do.
  if (!core::Comm::world().is_root()) return core::exit_ok;

  Settings settings;
  settings.dataset = config.get_string("dataset");
  if (settings.dataset.empty()) {
    throw core::ConfigError("no dataset given (--dataset or the job's 'dataset' key)", config.source(), 0, "dataset");
  }
  settings.detections = config.get_string("detections");
  const std::string predictions = config.get_string("predictions");
  if (settings.detections.empty() && predictions.empty()) {
    throw core::ConfigError("nothing to evaluate: give --detections (FROC, slide AUC) and/or --predictions (patch AUC)",
                            config.source(), 0, "detections");
  }
  if (!settings.detections.empty() && !fs::is_directory(settings.detections)) {
    throw core::InputError("the detections folder does not exist", settings.detections.string());
  }
  settings.assume_mpp = config.get_number("slides.assume_mpp");
  settings.froc.mask_level = static_cast<int>(config.get_int("froc.mask_level"));
  settings.froc.dilation_um = config.get_number("froc.dilation_um");
  settings.froc.itc_diameter_um = config.get_number("froc.itc_diameter_um");
  settings.froc.include_itc = config.get_bool("froc.include_itc");
  settings.classes.tumour = config.get_string_list("classes.tumour");
  settings.classes.exclusion = config.get_string_list("classes.exclusion");
  const fs::path out = config.get_string("output");
  // Checked and held before any scoring: a folder that cannot be written fails now, not after the work.
  const core::OutputLock lock = core::OutputLock::acquire(out.string(), "evaluate");

  // The slides to evaluate.
  const auto all = read_dataset(settings.dataset);
  const auto& splits = config.get_string_list("splits");
  std::vector<const DatasetSlide*> selected;
  std::set<std::string> present;
  for (const auto& s : all) {
    present.insert(s.split.empty() ? "(none)" : s.split);
    if (splits.empty() || std::find(splits.begin(), splits.end(), s.split) != splits.end()) selected.push_back(&s);
  }
  if (selected.empty()) {
    throw core::ConfigError(fmt::format("no slide of {} is in the split(s) {} (the dataset has: {})", settings.dataset,
                                        fmt::join(splits, ", "), fmt::join(present, ", ")),
                            config.source(), 0, "splits");
  }
  std::set<std::string> selected_ids;
  for (const auto* s : selected) selected_ids.insert(s->id);

  std::vector<std::pair<std::string, std::string>> failed;  // what, error
  std::vector<SlideResult> results;
  std::vector<std::string> missing_detections, missing_reports;
  if (!settings.detections.empty()) {
    for (std::size_t i = 0; i < selected.size(); ++i) {
      const DatasetSlide& s = *selected[i];
      try {
        SlideResult r = evaluate_slide(s, settings);
        if (r.detections_file.empty()) {
          spdlog::warn("{}: no detections file in {} (counted as no detections)", s.id, settings.detections.string());
          missing_detections.push_back(s.id);
        }
        if (r.report_file.empty()) missing_reports.push_back(s.id);
        spdlog::info("[{}/{}] {} ({}): {} detections, {} lesions ({} ITC), {} true positives, {} false positives",
                     i + 1, selected.size(), s.id, r.tumour ? "tumour" : "normal", r.froc.detections, r.froc.lesions(),
                     r.froc.itc_lesions, r.froc.true_positives(), r.froc.false_positives());
        results.push_back(std::move(r));
      } catch (const core::Error& e) {
        if (e.kind() == core::ErrorKind::internal) throw;
        spdlog::error("{}: {}", s.id, e.what());
        failed.emplace_back(s.id, e.what());
      }
    }
  }

  // Scores.
  json summary = {{"dataset", settings.dataset},
                  {"detections", settings.detections.empty() ? json(nullptr) : json(settings.detections.string())},
                  {"predictions", predictions.empty() ? json(nullptr) : json(predictions)},
                  {"splits", splits},
                  {"slides", selected.size()},
                  {"evaluated_slides", results.size()}};
  std::optional<analysis::FrocResult> froc;
  std::vector<analysis::RocPoint> slide_roc, patch_roc;
  double slide_auc = std::nan(""), patch_auc = std::nan("");
  std::size_t scored_slides = 0;
  if (!results.empty()) {
    std::vector<analysis::SlideFroc> per_slide;
    for (const auto& r : results) per_slide.push_back(r.froc);
    froc = analysis::compute_froc(per_slide);
    summary["froc"] = froc_json(*froc, settings.froc);
    if (missing_reports.size() < results.size()) {
      std::vector<float> scores;
      std::vector<std::uint8_t> labels;
      for (const auto& r : results) {
        scores.push_back(static_cast<float>(r.score.value_or(0.0)));
        labels.push_back(r.tumour ? 1 : 0);
      }
      slide_auc = core::roc_auc(scores, labels);
      slide_roc = analysis::roc_curve(scores, labels);
      scored_slides = scores.size();
    }
  } else {
    summary["froc"] = nullptr;
  }
  summary["slide_auc"] = number(slide_auc);
  json roc_points = json::array();
  for (const auto& p : slide_roc) {
    roc_points.push_back({{"threshold", number(p.threshold)}, {"fpr", p.fpr}, {"tpr", p.tpr}});
  }
  summary["slide_roc"] = roc_points;

  PatchScores patches;
  summary["patch"] = nullptr;
  if (!predictions.empty()) {
    try {
      patches = read_predictions(predictions, selected_ids);
      patch_auc = core::roc_auc(patches.p, patches.label);
      patch_roc = analysis::roc_curve(patches.p, patches.label);
      summary["patch"] = {{"auc", number(patch_auc)},
                          {"tiles", patches.p.size()},
                          {"tumour_tiles", std::count(patches.label.begin(), patches.label.end(), 1)},
                          {"rows_of_other_slides", patches.other_slides}};
      if (patches.p.empty()) spdlog::warn("{}: no row belongs to the evaluated slides", predictions);
    } catch (const core::Error& e) {
      if (e.kind() == core::ErrorKind::internal) throw;
      spdlog::error("{}", e.what());
      failed.emplace_back("predictions", e.what());
    }
  }

  json slides_json = json::array();
  for (const auto& r : results) slides_json.push_back(slide_json(r));
  summary["per_slide"] = slides_json;
  summary["missing_detections"] = missing_detections;
  summary["missing_reports"] = missing_reports;
  json failed_json = json::array();
  for (const auto& [what, error] : failed) failed_json.push_back({{"slide", what}, {"error", error}});
  summary["failed"] = failed_json;

  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw core::InputError(fmt::format("cannot create the output folder: {}", ec.message()), out.string());
  const std::string json_path = (out / "evaluation.json").string();
  const std::string froc_path = (out / "froc.png").string();
  const std::string roc_path = (out / "roc.png").string();
  core::write_file_atomic(json_path, summary.dump(2) + "\n");
  std::vector<std::string> written = {json_path};
  if (froc) {
    io::write_png(froc_path, froc_chart(*froc));
    written.push_back(froc_path);
  }
  if (!slide_roc.empty() || !patch_roc.empty()) {
    io::write_png(roc_path, roc_chart(slide_roc, slide_auc, scored_slides, patch_roc, patch_auc, patches.p.size()));
    written.push_back(roc_path);
  }

  // The summary a person reads.
  const auto tumour_count = std::count_if(results.begin(), results.end(), [](const auto& r) { return r.tumour; });
  const std::string split_text = splits.empty() ? std::string() : fmt::format(" [split {}]", fmt::join(splits, ", "));
  std::string text =
      settings.detections.empty()
          ? fmt::format("{} slides from {}{}\n", selected.size(), settings.dataset, split_text)
          : fmt::format("evaluated {} of {} slides ({} tumour, {} normal) from {}{}\n", results.size(), selected.size(),
                        tumour_count, static_cast<std::ptrdiff_t>(results.size()) - tumour_count, settings.dataset,
                        split_text);
  if (froc) {
    std::vector<std::string> at;
    for (std::size_t k = 0; k < analysis::kFrocRates.size(); ++k) {
      at.push_back(fmt::format("{:g}:{}", analysis::kFrocRates[k], score_text(froc->sensitivity[k])));
    }
    text += fmt::format(
        "FROC {} (interpolated {}); sensitivity at FP/slide {}; {} lesions ({} ITC ignored), {} "
        "detected, {} false positives\n",
        score_text(froc->score), score_text(froc->score_interpolated), fmt::join(at, " "), froc->lesions,
        froc->itc_lesions, froc->detected_lesions, froc->false_positives);
    text += scored_slides > 0 ? fmt::format("slide AUC {} ({} slides)\n", score_text(slide_auc), scored_slides)
                              : std::string("slide AUC n/a (no <slide>.report.json found)\n");
  }
  if (!predictions.empty()) text += fmt::format("patch AUC {} ({} tiles)\n", score_text(patch_auc), patches.p.size());
  text += fmt::format("wrote {}\n", fmt::join(written, ", "));
  if (!missing_detections.empty()) {
    text += fmt::format("no detections file (counted as none): {}\n", fmt::join(missing_detections, ", "));
  }
  if (!missing_reports.empty() && missing_reports.size() < results.size()) {
    text += fmt::format("no report (slide score 0): {}\n", fmt::join(missing_reports, ", "));
  }
  for (const auto& [what, error] : failed) text += fmt::format("FAILED {}: {}\n", what, error);
  std::cout << text << std::flush;
  return failed.empty() ? core::exit_ok : core::exit_input;
}

}  // namespace

Action setup_evaluate(CLI::App& command) {
  auto options = std::make_shared<EvaluateOptions>();
  add_job_options(command, options->job);
  command.add_option("-d,--dataset", options->dataset, "Ground truth, e.g. data/synth/dataset.csv (dataset)");
  command.add_option("--detections", options->detections,
                     "Folder of <slide>.detections.csv and <slide>.report.json from tessera infer (detections)");
  command.add_option("-p,--predictions", options->predictions,
                     "Patch predictions CSV from tessera predict, for the patch AUC (predictions)");
  command.add_option("-o,--out", options->out, "Output folder (output; default: evaluation)");
  command.add_option("--splits", options->splits,
                     "Comma-separated splits to evaluate, e.g. test (splits; default: all)");
  command.add_flag("--include-itc", options->include_itc,
                   "Count isolated-tumour-cell lesions like the others (froc.include_itc)");
  add_key_flag(command, options->job, "--assume-mpp", {"slides.assume_mpp"},
               "um/px for slides that record none (slides.assume_mpp)");
  command.footer(
      "Lesion-level FROC exactly as CAMELYON16 scores it (evaluation mask at 32x the level-0 um/px, borders grown by "
      "37.5 um, ITC lesions < 275 um ignored, one true positive per lesion; score = mean sensitivity at 1/4, 1/2, "
      "1, 2, 4, 8 false positives per slide), slide-level ROC AUC of the reports' scores, patch-level ROC AUC. "
      "Writes evaluation.json, froc.png and roc.png. Exit code 3 when a slide's inputs are broken (the rest is "
      "still scored).");
  return [options] { return run_evaluate(*options); };
}

}  // namespace tessera::app
