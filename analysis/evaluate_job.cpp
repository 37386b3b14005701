#include "analysis/evaluate_job.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "analysis/plot.h"
#include "core/atomic_file.h"
#include "core/csv.h"
#include "core/error.h"
#include "core/metrics.h"
#include "io/image.h"
#include "io/qc_masks.h"
#include "io/slide.h"

namespace tessera::analysis {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keys in the order written: the summary reads top-down
using core::split_csv_line;

// ---- dataset.csv ------------------------------------------------------------------------------------------------

// io/dataset.h reads it: every row needs an id (slide_id, or the slide file's name) and a tumor/normal label; the
// slide file is optional (without it the mpp column gives the resolution). Ids must be unique.
std::vector<io::DatasetRow> read_dataset(const std::string& path) {
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

// Per lesion of `mask` (by label - 1), the share of its mask pixels whose centre lies on an excluded QC pixel (bit 14
// of <slide>.qc.png; the QC pixel under that level-0 point, none outside the QC mask).
std::vector<double> lesion_excluded_shares(const EvaluationMask& mask, const cv::Mat1w& qc_bits,
                                           std::int64_t slide_width) {
  const double qc_downsample = io::qc_mask_downsample(slide_width, qc_bits.cols);
  std::vector<std::int64_t> total(mask.lesions().size(), 0), excluded(mask.lesions().size(), 0);
  const cv::Mat1i& labels = mask.labels();
  for (int r = 0; r < labels.rows; ++r) {
    const double y0 = (mask.origin().y + r + 0.5) * mask.downsample();
    const auto qr = static_cast<int>(std::floor(y0 / qc_downsample));
    for (int c = 0; c < labels.cols; ++c) {
      const int label = labels(r, c);
      if (label <= 0) continue;
      const auto k = static_cast<std::size_t>(label - 1);
      ++total[k];
      const double x0 = (mask.origin().x + c + 0.5) * mask.downsample();
      const auto qc = static_cast<int>(std::floor(x0 / qc_downsample));
      if (qr >= 0 && qc >= 0 && qr < qc_bits.rows && qc < qc_bits.cols && (qc_bits(qr, qc) & io::kQcExcludedBit) != 0) {
        ++excluded[k];
      }
    }
  }
  std::vector<double> shares(total.size(), 0.0);
  for (std::size_t k = 0; k < total.size(); ++k) {
    if (total[k] > 0) shares[k] = static_cast<double>(excluded[k]) / static_cast<double>(total[k]);
  }
  return shares;
}

SlideEvaluation evaluate_slide(const io::DatasetRow& s, const EvaluateJob& job) {
  SlideEvaluation r;
  r.slide = s;
  r.tumour = s.label == io::SlideLabel::tumour;
  const fs::path dir = job.detections;
  r.detections_file = find_file(dir, {fmt::format("{}.detections.csv", s.id),
                                      fmt::format("{0}/{0}.detections.csv", s.id), fmt::format("{}.csv", s.id)});
  r.report_file = find_file(dir, {fmt::format("{}.report.json", s.id), fmt::format("{0}/{0}.report.json", s.id)});
  std::vector<Detection> detections;
  if (!r.detections_file.empty()) detections = read_detections(r.detections_file);
  if (!r.report_file.empty()) r.score = read_slide_score(r.report_file);
  if (!r.tumour) {
    r.froc = match_detections(s.id, detections, nullptr);
    return r;
  }

  if (s.annotation.empty()) {
    throw core::InputError(
        fmt::format("line {}: slide '{}' is labelled tumour but has no annotation file", s.line, s.id), job.dataset);
  }
  auto annotations = io::read_annotations(s.annotation);
  // The slide's µm/px and size: the dataset's mpp column wins; the slide file gives its size (and the µm/px when
  // the column is empty). Without the slide file the mask is not clipped to the slide.
  std::int64_t width = 0, height = 0;
  r.mpp = s.mpp.value_or(0.0);
  if (!s.slide.empty() && fs::exists(s.slide)) {
    io::SlideOpenOptions open;
    open.assume_mpp = r.mpp > 0.0 ? r.mpp : job.assume_mpp;
    const auto slide = io::Slide::open(s.slide, open);
    width = slide.width();
    height = slide.height();
    if (!(r.mpp > 0.0)) r.mpp = slide.mpp();
  } else if (!(r.mpp > 0.0)) {
    throw core::InputError(
        fmt::format("slide '{}' not found: its µm/px is needed for the evaluation mask (or give an mpp column)", s.id),
        s.slide.empty() ? job.dataset : s.slide);
  }
  // As tile does: clipped to the slide, and a ground truth that labels no tumour would count every detection
  // of this tumour slide as a false positive.
  annotations =
      io::prepare_annotations(annotations, job.classes, {s.annotation, "classes.tumour", true, width, height});
  try {
    const EvaluationMask mask(annotations, job.classes, r.mpp, width, height, job.froc);
    r.froc = match_detections(s.id, detections, &mask);
    r.lesions = mask.lesions();
    r.downsample = mask.downsample();
    const std::vector<std::string> qc_names = {fmt::format("{}.qc.png", s.id), fmt::format("{0}/{0}.qc.png", s.id)};
    r.qc_file = find_file(dir, qc_names);
    for (const std::string& folder : job.also_excluded) {
      const std::string file = find_file(folder, qc_names);
      if (file.empty()) {
        spdlog::warn(
            "evaluate: also_excluded folder {} has no {} (slide '{}'): its excluded areas there come from "
            "the other folders only",
            folder, qc_names.front(), s.id);
      } else {
        r.also_excluded_files.push_back(file);
      }
    }
    if (r.has_qc_masks()) {
      std::vector<std::string> files = r.also_excluded_files;
      if (!r.qc_file.empty()) files.insert(files.begin(), r.qc_file);
      if (width <= 0) {
        throw core::InputError(
            fmt::format("slide '{}' not found: its width is needed to place the QC masks {}", s.id, files.front()),
            s.slide.empty() ? job.dataset : s.slide);
      }
      // The union of the files' excluded areas (the same slide: masks of one size).
      cv::Mat1w bits = io::read_qc_masks_png(files.front());
      for (std::size_t i = 1; i < files.size(); ++i) {
        const cv::Mat1w more = io::read_qc_masks_png(files[i]);
        if (more.size() != bits.size()) {
          throw core::InputError(fmt::format("QC masks of {}×{} px where {} has {}×{}: not the same slide's", more.cols,
                                             more.rows, files.front(), bits.cols, bits.rows),
                                 files[i]);
        }
        bits |= more & io::kQcExcludedBit;
      }
      r.lesion_excluded = lesion_excluded_shares(mask, bits, width);
    }
  } catch (core::Error& e) {
    e.add_context("annotation", s.annotation);
    throw;
  }
  return r;
}

FrocOutsideExcluded froc_outside_excluded(const std::vector<SlideEvaluation>& evaluated) {
  FrocOutsideExcluded out;
  std::vector<SlideFroc> per_slide;
  for (const auto& r : evaluated) {
    SlideFroc f = r.froc;
    if (r.tumour && !r.has_qc_masks()) out.tumour_slides_without_masks.push_back(r.slide.id);
    if (r.tumour && r.has_qc_masks()) {
      ++out.slides_with_masks;
      SlideFroc kept = f;
      kept.lesion_p.clear();
      kept.lesion_label.clear();
      for (std::size_t i = 0; i < f.lesion_p.size(); ++i) {
        const auto label = static_cast<std::size_t>(f.lesion_label[i]);
        if (r.lesion_excluded.at(label - 1) >= kMostlyExcluded) {
          ++out.excluded_lesions;
          continue;
        }
        kept.lesion_p.push_back(f.lesion_p[i]);
        kept.lesion_label.push_back(f.lesion_label[i]);
      }
      f = std::move(kept);
    }
    per_slide.push_back(std::move(f));
  }
  out.froc = compute_froc(per_slide);
  return out;
}

// ---- patch predictions ------------------------------------------------------------------------------------------

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

// The rows of `slides` (p and label); the AUC and ROC are left for the caller.
PatchEvaluation read_predictions(const std::string& path, const std::set<std::string>& slides) {
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
  PatchEvaluation scores;
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

json froc_json(const FrocResult& froc, const FrocOptions& options) {
  json curve = json::array();
  for (const auto& p : froc.curve) {
    curve.push_back({{"threshold", number(p.threshold)},
                     {"fps_per_slide", p.fps_per_slide},
                     {"sensitivity", number(p.sensitivity)}});
  }
  json at = json::array();
  for (std::size_t k = 0; k < kFrocRates.size(); ++k) {
    at.push_back({{"fps_per_slide", kFrocRates[k]},
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

json slide_json(const SlideEvaluation& r) {
  const auto& f = r.froc;
  json j = {{"slide_id", r.slide.id},
            {"label", r.tumour ? "tumor" : "normal"},
            {"split", r.slide.split},
            {"detections_file", r.detections_file.empty() ? json(nullptr) : json(r.detections_file)},
            {"report_file", r.report_file.empty() ? json(nullptr) : json(r.report_file)},
            {"qc_file", r.qc_file.empty() ? json(nullptr) : json(r.qc_file)},
            {"also_excluded_files", r.also_excluded_files},
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
      if (!r.lesion_excluded.empty())
        l["excluded_fraction"] = r.lesion_excluded.at(static_cast<std::size_t>(lesion.label - 1));
      if (!lesion.itc && entry < f.lesion_p.size() && f.lesion_label[entry] == lesion.label) {
        l["p"] = f.lesion_p[entry++];
      }
      lesions.push_back(std::move(l));
    }
    j["lesion_list"] = std::move(lesions);
  }
  return j;
}

// evaluation.json.
json evaluation_json(const EvaluateJob& job, const EvaluateResult& result) {
  json summary = {{"dataset", job.dataset},
                  {"detections", job.detections.empty() ? json(nullptr) : json(job.detections)},
                  {"predictions", job.predictions.empty() ? json(nullptr) : json(job.predictions)},
                  {"also_excluded", job.also_excluded},
                  {"splits", job.splits},
                  {"slides", result.slides},
                  {"evaluated_slides", result.evaluated.size()}};
  summary["froc"] = result.froc ? froc_json(*result.froc, job.froc) : json(nullptr);
  summary["froc_outside_excluded"] = nullptr;
  if (const auto& outside = result.froc_outside_excluded) {
    json j = froc_json(outside->froc, job.froc);
    j["slides_with_qc_masks"] = outside->slides_with_masks;
    j["excluded_lesions"] = outside->excluded_lesions;
    j["tumour_slides_without_qc_masks"] = outside->tumour_slides_without_masks;
    j["rule"] = fmt::format(
        "lesions with at least {:g} of their area in excluded artefacts (<slide>.qc.png bit 14) left out; false "
        "positives as in froc",
        kMostlyExcluded);
    summary["froc_outside_excluded"] = std::move(j);
  }
  summary["slide_auc"] = number(result.slide_auc);
  json roc_points = json::array();
  for (const auto& p : result.slide_roc) {
    roc_points.push_back({{"threshold", number(p.threshold)}, {"fpr", p.fpr}, {"tpr", p.tpr}});
  }
  summary["slide_roc"] = roc_points;
  summary["patch"] = nullptr;
  if (const auto& patch = result.patch) {
    summary["patch"] = {{"auc", number(patch->auc)},
                        {"tiles", patch->p.size()},
                        {"tumour_tiles", std::count(patch->label.begin(), patch->label.end(), 1)},
                        {"rows_of_other_slides", patch->other_slides}};
  }
  json slides_json = json::array();
  for (const auto& r : result.evaluated) slides_json.push_back(slide_json(r));
  summary["per_slide"] = slides_json;
  summary["missing_detections"] = result.missing_detections;
  summary["missing_reports"] = result.missing_reports;
  json failed_json = json::array();
  for (const auto& [what, error] : result.failed) failed_json.push_back({{"slide", what}, {"error", error}});
  summary["failed"] = failed_json;
  return summary;
}

}  // namespace

void check_evaluate_job(const EvaluateJob& job) {
  if (job.dataset.empty()) throw core::ConfigError("no dataset given", job.source, 0, "input.csv");
  if (job.detections.empty() && job.predictions.empty()) {
    throw core::ConfigError("nothing to evaluate: no detections and no predictions given", job.source, 0, "detections");
  }
  if (!job.detections.empty() && !fs::is_directory(job.detections)) {
    throw core::InputError("the detections folder does not exist", job.detections);
  }
  for (const std::string& folder : job.also_excluded) {
    if (!fs::is_directory(folder)) throw core::InputError("the also_excluded folder does not exist", folder);
  }
}

EvaluateResult run_evaluation(const EvaluateJob& job) {
  check_evaluate_job(job);
  EvaluateResult result;

  // The slides to evaluate.
  const auto all = read_dataset(job.dataset);
  const auto& splits = job.splits;
  std::vector<const io::DatasetRow*> selected;
  std::set<std::string> present;
  for (const auto& s : all) {
    present.insert(s.split.empty() ? "(none)" : s.split);
    if (splits.empty() || std::find(splits.begin(), splits.end(), s.split) != splits.end()) selected.push_back(&s);
  }
  if (selected.empty()) {
    throw core::ConfigError(fmt::format("no slide of {} is in the split(s) {} (the dataset has: {})", job.dataset,
                                        fmt::join(splits, ", "), fmt::join(present, ", ")),
                            job.source, 0, "input.splits");
  }
  result.slides = selected.size();
  std::set<std::string> selected_ids;
  for (const auto* s : selected) selected_ids.insert(s->id);

  if (!job.detections.empty()) {
    for (std::size_t i = 0; i < selected.size(); ++i) {
      const io::DatasetRow& s = *selected[i];
      try {
        SlideEvaluation r = evaluate_slide(s, job);
        if (r.detections_file.empty()) {
          spdlog::warn("{}: no detections file in {} (counted as no detections)", s.id, job.detections);
          result.missing_detections.push_back(s.id);
        }
        if (r.report_file.empty()) result.missing_reports.push_back(s.id);
        spdlog::info("[{}/{}] {} ({}): {} detections, {} lesions ({} ITC), {} true positives, {} false positives",
                     i + 1, selected.size(), s.id, r.tumour ? "tumour" : "normal", r.froc.detections, r.froc.lesions(),
                     r.froc.itc_lesions, r.froc.true_positives(), r.froc.false_positives());
        result.evaluated.push_back(std::move(r));
      } catch (const core::Error& e) {
        if (e.kind() == core::ErrorKind::internal) throw;
        spdlog::error("{}: {}", s.id, e.what());
        result.failed.push_back({s.id, e.what()});
      }
    }
  }

  // Scores: the FROC over the evaluated slides, the slide AUC when any report was found.
  const auto& evaluated = result.evaluated;
  if (!evaluated.empty()) {
    std::vector<SlideFroc> per_slide;
    for (const auto& r : evaluated) per_slide.push_back(r.froc);
    result.froc = compute_froc(per_slide);
    if (std::any_of(evaluated.begin(), evaluated.end(), [](const auto& r) { return r.has_qc_masks(); })) {
      result.froc_outside_excluded = froc_outside_excluded(evaluated);
    }
    if (result.missing_reports.size() < evaluated.size()) {
      std::vector<float> scores;
      std::vector<std::uint8_t> labels;
      for (const auto& r : evaluated) {
        scores.push_back(static_cast<float>(r.score.value_or(0.0)));
        labels.push_back(r.tumour ? 1 : 0);
      }
      result.slide_auc = core::roc_auc(scores, labels);
      result.slide_roc = roc_curve(scores, labels);
      result.scored_slides = scores.size();
    }
  }
  if (!job.predictions.empty()) {
    try {
      PatchEvaluation patch = read_predictions(job.predictions, selected_ids);
      patch.auc = core::roc_auc(patch.p, patch.label);
      patch.roc = roc_curve(patch.p, patch.label);
      if (patch.p.empty()) spdlog::warn("{}: no row belongs to the evaluated slides", job.predictions);
      result.patch = std::move(patch);
    } catch (const core::Error& e) {
      if (e.kind() == core::ErrorKind::internal) throw;
      spdlog::error("{}", e.what());
      result.failed.push_back({"predictions", e.what()});
    }
  }

  // Outputs.
  const fs::path out = job.output;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw core::InputError(fmt::format("cannot create the output folder: {}", ec.message()), out.string());
  const std::string json_path = (out / "evaluation.json").string();
  const std::string froc_path = (out / "froc.png").string();
  const std::string roc_path = (out / "roc.png").string();
  core::write_file_atomic(json_path, evaluation_json(job, result).dump(2) + "\n");
  result.written.push_back(json_path);
  if (result.froc) {
    io::write_png(froc_path, froc_chart(*result.froc));
    result.written.push_back(froc_path);
  }
  const PatchEvaluation none;  // no predictions read: no patch curve
  const PatchEvaluation& patch = result.patch ? *result.patch : none;
  if (!result.slide_roc.empty() || !patch.roc.empty()) {
    io::write_png(roc_path, roc_chart(result.slide_roc, result.slide_auc, result.scored_slides, patch.roc, patch.auc,
                                      patch.p.size()));
    result.written.push_back(roc_path);
  }
  return result;
}

std::string evaluation_summary(const EvaluateJob& job, const EvaluateResult& result) {
  const auto& evaluated = result.evaluated;
  const auto tumour_count = std::count_if(evaluated.begin(), evaluated.end(), [](const auto& r) { return r.tumour; });
  const auto& splits = job.splits;
  const std::string split_text = splits.empty() ? std::string() : fmt::format(" [split {}]", fmt::join(splits, ", "));
  std::string text =
      job.detections.empty()
          ? fmt::format("{} slides from {}{}\n", result.slides, job.dataset, split_text)
          : fmt::format("evaluated {} of {} slides ({} tumour, {} normal) from {}{}\n", evaluated.size(), result.slides,
                        tumour_count, static_cast<std::ptrdiff_t>(evaluated.size()) - tumour_count, job.dataset,
                        split_text);
  if (const auto& froc = result.froc) {
    std::vector<std::string> at;
    for (std::size_t k = 0; k < kFrocRates.size(); ++k) {
      at.push_back(fmt::format("{:g}:{}", kFrocRates[k], score_text(froc->sensitivity[k])));
    }
    text += fmt::format(
        "FROC {} (interpolated {}); sensitivity at FP/slide {}; {} lesions ({} ITC ignored), {} "
        "detected, {} false positives\n",
        score_text(froc->score), score_text(froc->score_interpolated), fmt::join(at, " "), froc->lesions,
        froc->itc_lesions, froc->detected_lesions, froc->false_positives);
    if (const auto& outside = result.froc_outside_excluded) {
      text += fmt::format(
          "FROC outside excluded areas {} (interpolated {}); {} lesions, {} left out as mostly under excluded "
          "artefacts; QC masks for {} tumour slide(s){}\n",
          score_text(outside->froc.score), score_text(outside->froc.score_interpolated), outside->froc.lesions,
          outside->excluded_lesions, outside->slides_with_masks,
          outside->tumour_slides_without_masks.empty()
              ? std::string()
              : fmt::format(" (none for {}: every lesion counted)",
                            fmt::join(outside->tumour_slides_without_masks, ", ")));
    }
    text += result.scored_slides > 0
                ? fmt::format("slide AUC {} ({} slides)\n", score_text(result.slide_auc), result.scored_slides)
                : std::string("slide AUC n/a (no <slide>.report.json found)\n");
  }
  if (!job.predictions.empty()) {
    const PatchEvaluation none;  // none read: AUC n/a, 0 tiles
    const PatchEvaluation& patch = result.patch ? *result.patch : none;
    text += fmt::format("patch AUC {} ({} tiles)\n", score_text(patch.auc), patch.p.size());
  }
  text += fmt::format("wrote {}\n", fmt::join(result.written, ", "));
  if (!result.missing_detections.empty()) {
    text += fmt::format("no detections file (counted as none): {}\n", fmt::join(result.missing_detections, ", "));
  }
  if (!result.missing_reports.empty() && result.missing_reports.size() < evaluated.size()) {
    text += fmt::format("no report (slide score 0): {}\n", fmt::join(result.missing_reports, ", "));
  }
  for (const auto& [what, error] : result.failed) text += fmt::format("FAILED {}: {}\n", what, error);
  return text;
}

cv::Mat froc_chart(const FrocResult& froc) {
  Chart chart;
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
    PlotSeries curve{.label = "FROC curve", .points = {}, .rgb = kCurveRed, .thickness = 2, .dashed = false};
    for (const auto& p : froc.curve) curve.points.emplace_back(p.fps_per_slide, p.sensitivity);
    // The score holds the lowest threshold's sensitivity for rates beyond the last point: show it dashed.
    const FrocPoint& last = froc.curve.front();
    if (last.fps_per_slide < chart.x_max) {
      chart.series.push_back({.label = "",
                              .points = {{last.fps_per_slide, last.sensitivity}, {chart.x_max, last.sensitivity}},
                              .rgb = kCurveRed,
                              .thickness = 1,
                              .dashed = true});
    }
    chart.series.push_back(std::move(curve));
    for (std::size_t k = 0; k < kFrocRates.size(); ++k) {
      chart.markers.push_back({cv::Point2d(kFrocRates[k], froc.sensitivity[k]),
                               fmt::format("{:.2f}", froc.sensitivity[k]), cv::Scalar(250, 190, 40)});
    }
    chart.marker_legend = "sensitivity at the six rates (score)";
  }
  chart.note = "no lesion in the evaluated slides: FROC undefined";
  return render_chart(chart);
}

cv::Mat roc_chart(const std::vector<RocPoint>& slides, double slide_auc, std::size_t n_slides,
                  const std::vector<RocPoint>& patches, double patch_auc, std::size_t n_patches) {
  Chart chart;
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
    PlotSeries s{.label = fmt::format("patches: AUC {} ({} tiles)", score_text(patch_auc), n_patches),
                 .points = {},
                 .rgb = kCurveBlue,
                 .thickness = 2,
                 .dashed = false};
    for (const auto& p : patches) s.points.emplace_back(p.fpr, p.tpr);
    chart.series.push_back(std::move(s));
  }
  if (!slides.empty()) {
    PlotSeries s{.label = fmt::format("slides: AUC {} ({} slides)", score_text(slide_auc), n_slides),
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
  return render_chart(chart);
}

}  // namespace tessera::analysis
