#include "viewer/job.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "core/error.h"
#include "io/annotations.h"
#include "io/dataset.h"
#include "io/slide_list.h"

namespace tessera::viewer {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A path infer recorded relative to where it ran: as given (absolute, or from the working directory), else from
// each folder above `folder`. "" when none exists.
std::string resolve_recorded(const std::string& recorded, const fs::path& folder) {
  if (recorded.empty()) return "";
  const fs::path p(recorded);
  std::error_code ec;
  if (p.is_absolute() || fs::exists(p, ec)) return fs::exists(p, ec) ? p.string() : "";
  for (fs::path dir = fs::weakly_canonical(folder, ec); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / p, ec)) return (dir / p).string();
    if (dir == dir.parent_path()) break;
  }
  return "";
}

// `<folder>/<name>` when it exists and, symlinks resolved, lies inside the folder; "" when absent. InputError for a
// file that leads out of the folder (it is not served).
std::string output_file(const fs::path& folder, const std::string& name) {
  const fs::path path = folder / name;
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  const fs::path real = fs::canonical(path, ec);
  const fs::path root = fs::canonical(folder, ec);
  const auto rel = real.lexically_relative(root);
  if (ec || rel.empty() || *rel.begin() == "..") {
    throw core::InputError("leads out of the job's folder (a symlink to " + real.string() + "): not served",
                           path.string());
  }
  return path.string();
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw core::InputError("cannot be read", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw core::InputError(std::string("not valid JSON: ") + e.what(), path);
  }
}

json ring_json(const io::Ring& ring) {
  json points = json::array();
  for (const auto& p : ring) points.push_back({std::round(p.x * 10.0) / 10.0, std::round(p.y * 10.0) / 10.0});
  return points;
}

json polygons_json(const std::vector<io::Annotation>& annotations, bool with_class) {
  const io::AnnotationClasses classes;
  json out = json::array();
  for (const auto& a : annotations) {
    if (a.object_type != "annotation" || a.outer.size() < 3) continue;
    json holes = json::array();
    for (const auto& h : a.holes) holes.push_back(ring_json(h));
    json item = {{"name", a.name}, {"group", a.group}, {"outer", ring_json(a.outer)}, {"holes", holes}};
    if (with_class) item["tumour"] = classes.is_tumour(a.group);
    if (with_class) item["exclusion"] = classes.is_exclusion(a.group);
    out.push_back(std::move(item));
  }
  return out;
}

// One region of report.json for the page, with its outline when the GeoJSON has it.
json region_json(const json& r, const std::map<int, json>& outlines) {
  json item = {{"id", r.value("id", 0)},
               {"size_class", r.value("size_class", "")},
               {"area_mm2", r.value("area_mm2", 0.0)},
               {"longest_diameter_um", r.value("longest_diameter_um", 0.0)},
               {"max_prob", r.value("max_prob", 0.0)},
               {"bounds", r.value("bounds", json::array())},
               {"outline", nullptr}};
  if (const auto it = outlines.find(item["id"].get<int>()); it != outlines.end()) {
    item["outline"] = {{"outer", it->second.at("outer")}, {"holes", it->second.at("holes")}};
  }
  return item;
}

// The report's regions with their outlines from the GeoJSON ("Region <id>: <size class>" annotations). InputError
// naming the report when its regions are not what infer writes.
json regions_json(const json& report, const std::string& report_path, const std::string& geojson_path) {
  std::map<int, json> outlines;
  if (!geojson_path.empty()) {
    for (auto& polygon : polygons_json(io::read_geojson(geojson_path), false)) {
      // "Region <1 to 9 digits>:" at the start of the name.
      const std::string name = polygon["name"];
      constexpr std::string_view prefix = "Region ";
      if (!name.starts_with(prefix)) continue;
      std::size_t end = prefix.size();
      while (end < name.size() && end - prefix.size() < 10 && std::isdigit(static_cast<unsigned char>(name[end])))
        ++end;
      const std::size_t digits = end - prefix.size();
      if (digits == 0 || digits > 9 || end >= name.size() || name[end] != ':') continue;
      outlines[std::stoi(name.substr(prefix.size(), digits))] = polygon;
    }
  }
  json regions = json::array();
  if (!report.is_object() || !report.contains("regions")) return regions;
  try {
    for (const auto& r : report.at("regions")) regions.push_back(region_json(r, outlines));
  } catch (const json::exception& e) {
    throw core::InputError(std::string("regions unlike tessera infer's: ") + e.what(), report_path);
  }
  return regions;
}

// A header can be sound over pixels that do not decode: the smallest level is read (its top-left at most
// 2048² pixels), so such a slide is listed with its error rather than failing tile by tile (as `tessera info`).
void check_pixels(const io::Slide& slide) {
  constexpr std::int64_t kProbeSide = 2048;
  const int last = slide.level_count() - 1;
  const auto& level = slide.level(last);
  slide.read_region(0, 0, last, std::min(level.width, kProbeSide), std::min(level.height, kProbeSide));
}

void open_slide(ViewerSlide& s, double assume_mpp) {
  if (s.slide_path.empty()) {
    if (s.error.empty()) s.error = "slide file not found";
    return;
  }
  io::SlideOpenOptions open;
  open.assume_mpp = assume_mpp;
  open.require_mpp = false;  // shown without µm rather than refused
  auto slide = std::make_shared<io::Slide>(io::Slide::open(s.slide_path, open));
  check_pixels(*slide);
  if (s.heatmap && (s.heatmap->slide_width != slide->width() || s.heatmap->slide_height != slide->height())) {
    throw core::InputError(fmt::format("the heatmap is for a {}x{} slide, the slide is {}x{}", s.heatmap->slide_width,
                                       s.heatmap->slide_height, slide->width(), slide->height()),
                           s.slide_path);
  }
  if (s.qc) {
    // A mask of this slide: its rows cover the height at the downsample its columns give the width (tissue.h's
    // rounding up, give or take one row).
    const double downsample = io::qc_mask_downsample(slide->width(), s.qc->cols);
    const double rows = static_cast<double>(slide->height()) / downsample;
    if (std::abs(rows - s.qc->rows) > 1.0) {
      throw core::InputError(fmt::format("the QC masks ({}.qc.png, {}x{}) are not those of this {}x{} slide", s.id,
                                         s.qc->cols, s.qc->rows, slide->width(), slide->height()),
                             s.slide_path);
    }
  }
  s.slide = std::move(slide);
}

void load_ground_truth(ViewerSlide& s, const std::string& annotation) {
  if (annotation.empty()) return;
  try {
    s.ground_truth = polygons_json(io::read_annotations(annotation), true);
  } catch (const core::Error& e) {
    s.ground_truth_error = e.what();
  }
}

// id → annotation file of a dataset.csv (rows without one left out).
std::map<std::string, std::string> dataset_annotations(const std::string& csv) {
  std::map<std::string, std::string> out;
  io::DatasetNeeds needs;
  needs.slide = false;
  for (const auto& row : io::read_dataset_csv(csv, needs).rows) {
    if (!row.annotation.empty()) out[row.id] = row.annotation;
  }
  return out;
}

// Runs `what` for one slide; an input error becomes the slide's error (the rest of the job goes on).
template <typename F>
void per_slide(ViewerSlide& s, F&& what) {
  try {
    what();
  } catch (const core::Error& e) {
    if (e.kind() != core::ErrorKind::input) throw;
    if (s.error.empty()) s.error = e.what();
    s.slide.reset();
  }
}

ViewerJob open_infer_folder(const fs::path& folder, const JobOptions& options) {
  ViewerJob job;
  job.infer = true;
  job.title = folder.string();
  std::vector<std::pair<std::string, std::string>> listed;  // id, recorded slide path
  std::vector<std::pair<std::string, std::string>> failed;  // id, error
  std::error_code ec;
  if (fs::exists(folder / "infer.json", ec)) {
    const json record = read_json_file((folder / "infer.json").string());
    for (const auto& s : record.value("slides", json::array())) {
      listed.emplace_back(s.value("id", ""), s.value("slide", ""));
    }
    for (const auto& f : record.value("failures", json::array())) {
      failed.emplace_back(f.value("id", ""), f.value("error", ""));
    }
  } else {
    for (const auto& entry : fs::directory_iterator(folder)) {
      const std::string name = entry.path().filename().string();
      const std::string suffix = ".heatmap.h5";
      if (name.size() > suffix.size() && name.ends_with(suffix)) {
        listed.emplace_back(name.substr(0, name.size() - suffix.size()), "");
      }
    }
    std::sort(listed.begin(), listed.end());
  }
  if (listed.empty() && failed.empty()) {
    throw core::InputError("holds no tessera infer outputs (no infer.json and no .heatmap.h5)", folder.string());
  }

  // The job's settings that decide the pictures, and its dataset for the ground truth.
  std::map<std::string, std::string> annotations;
  double assume_mpp = options.assume_mpp;
  if (fs::exists(folder / "infer.config.yaml", ec)) {
    const std::string config_path = (folder / "infer.config.yaml").string();
    try {
      const YAML::Node config = YAML::LoadFile(config_path);
      if (config["overlay"] && config["overlay"]["colormap"]) {
        job.overlay.colormap = io::parse_colormap(config["overlay"]["colormap"].as<std::string>());
      }
      if (config["infer"] && config["infer"]["threshold"]) job.threshold = config["infer"]["threshold"].as<double>();
      if (assume_mpp == 0.0 && config["input"] && config["input"]["assume_mpp"]) {
        assume_mpp = config["input"]["assume_mpp"].as<double>();
      }
      if (config["input"] && config["input"]["csv"]) {
        const std::string csv = resolve_recorded(config["input"]["csv"].as<std::string>(), folder);
        if (!csv.empty()) annotations = dataset_annotations(csv);
      }
    } catch (const YAML::Exception& e) {
      throw core::InputError(std::string("not a readable job: ") + e.what(), config_path);
    }
  }

  for (const auto& [id, recorded] : listed) {
    ViewerSlide s;
    s.id = id;
    per_slide(s, [&] {
      if (const auto path = output_file(folder, id + ".heatmap.h5"); !path.empty()) {
        s.heatmap = std::make_shared<io::Heatmap>(io::read_heatmap(path));
      }
      const std::string from = !recorded.empty() ? recorded : (s.heatmap ? s.heatmap->slide_path : "");
      s.slide_path = resolve_recorded(from, folder);
      if (s.slide_path.empty()) s.error = "slide file not found: " + (from.empty() ? id : from);
      if (!s.heatmap) s.error = "no heatmap: " + (folder / (id + ".heatmap.h5")).string() + " is missing";
      const auto report_path = output_file(folder, id + ".report.json");
      if (!report_path.empty()) s.report = read_json_file(report_path);
      if (const auto qc_path = output_file(folder, id + ".qc.png"); !qc_path.empty()) {
        s.qc = std::make_shared<const cv::Mat1w>(io::read_qc_masks_png(qc_path));
      }
      s.regions = regions_json(s.report, report_path, output_file(folder, id + ".geojson"));
      if (s.error.empty()) open_slide(s, assume_mpp);
    });
    if (const auto it = annotations.find(id); it != annotations.end()) load_ground_truth(s, it->second);
    job.slides.push_back(std::move(s));
  }
  for (const auto& [id, error] : failed) {
    ViewerSlide s;
    s.id = id;
    s.error = "tessera infer failed: " + error;
    job.slides.push_back(std::move(s));
  }
  return job;
}

ViewerJob open_slides(const std::vector<std::string>& inputs, const JobOptions& options) {
  ViewerJob job;
  const auto listed = io::list_slides(inputs, options.splits, "command line", "slides", "--splits");
  std::map<std::string, std::string> annotations;
  if (inputs.size() == 1 && inputs.front().ends_with(".csv")) annotations = dataset_annotations(inputs.front());
  job.title = listed.size() == 1 ? listed.front().path : fmt::format("{} slides", listed.size());
  for (const auto& l : listed) {
    ViewerSlide s;
    s.id = l.id;
    s.slide_path = l.path;
    s.regions = json::array();
    per_slide(s, [&] { open_slide(s, l.mpp > 0.0 ? l.mpp : options.assume_mpp); });
    if (const auto it = annotations.find(l.id); it != annotations.end()) load_ground_truth(s, it->second);
    job.slides.push_back(std::move(s));
  }
  return job;
}

}  // namespace

const ViewerSlide* ViewerJob::find(const std::string& id) const {
  for (const auto& s : slides) {
    if (s.id == id) return &s;
  }
  return nullptr;
}

ViewerJob open_job(const std::vector<std::string>& inputs, const JobOptions& options) {
  if (inputs.empty()) throw core::UsageError("tessera view needs a folder of infer outputs or slides");
  std::error_code ec;
  if (inputs.size() == 1 && fs::is_directory(inputs.front(), ec)) {
    if (!options.splits.empty()) {
      throw core::UsageError("--splits selects rows of a dataset.csv, not of a folder of infer outputs");
    }
    return open_infer_folder(inputs.front(), options);
  }
  return open_slides(inputs, options);
}

}  // namespace tessera::viewer
