// tessera qc [job.yaml] — slide quality control (preprocessing/qc.h) over a set of slides: artefact masks per slide,
// slide-level flags, a cohort table and a cohort picture. Under mpirun the slides are spread over ranks.
//
// Output folder:
//   <slide>.qc.png          the masks: a 16-bit grey PNG at the QC level, bit k = class k (qc.h's order: blur,
//                           pen_green, pen_blue, pen_black, pen_red, fold, bubble, overexposed, underexposed),
//                           bit 13 = flagged, bit 14 = excluded (the unions by action), bit 15 = tissue (io/qc_masks.h)
//   <slide>.qc-preview.png  the slide at the QC level with each class tinted and outlined, and a legend
//   qc.csv                  one row per slide: tissue area, each class's fraction of the tissue, sharpness,
//                           brightness, stain, excluded and flagged fractions, flags, usable yes/no and the reasons
//   qc-cohort.png           each metric's distribution over the cohort, outlier slides named
//   qc-truth.csv            when slides carry tessera synth's truth masks (<slide stem>.artefacts.png beside the
//                           slide): per slide and drawn class, the intersection over union of QC's mask with the
//                           truth at the QC level; the log gives each class's mean
//   qc.config.yaml          the effective job
// A slide that cannot be read is a row with usable "no" and its error, and the job ends with exit code 3.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "app/cli.h"
#include "core/atomic_file.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/measure.h"
#include "core/output_dir.h"
#include "core/progress.h"
#include "io/image.h"
#include "io/slide.h"
#include "io/slide_list.h"
#include "preprocessing/qc.h"
#include "preprocessing/qc_report.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const core::Schema& qc_schema() {
  static const core::Schema instance = [] {
    core::Schema schema;
    io::declare_input_keys(schema).string("output", "qc", "Folder for qc.csv, qc-cohort.png and the per-slide masks");
    prep::declare_qc_keys(schema);
    return schema;
  }();
  return instance;
}

// One slide, on the rank that ran it: its row's numbers as JSON (sent to rank 0), masks written on the way.
json check_slide(const io::ListedSlide& input, const fs::path& out, const prep::QcOptions& options, double assume_mpp) {
  io::SlideOpenOptions open_options;
  open_options.assume_mpp = input.mpp > 0.0 ? input.mpp : assume_mpp;
  const auto start = std::chrono::steady_clock::now();
  const io::Slide slide = io::Slide::open(input.path, open_options);
  cv::Mat rgb;  // the QC-level image, for the preview
  const prep::QcResult result = prep::run_qc(slide, options, &rgb);
  const double downsample = result.tissue.downsample;
  io::write_qc_masks_png((out / (input.id + ".qc.png")).string(), prep::encode_qc_masks(result));
  io::write_png((out / (input.id + ".qc-preview.png")).string(), prep::render_qc_preview(rgb, result));
  rgb.release();  // as large as the QC level, and not needed below
  json record = prep::qc_summary_json(input.id, input.path, result);
  record["seconds"] = core::seconds_since(start);
  // Synthetic truth beside the slide: how well each drawn class was found.
  const fs::path truth_path = fs::path(input.path).replace_extension(".artefacts.png");
  if (fs::exists(truth_path)) {
    const cv::Mat truth = cv::imread(truth_path.string(), cv::IMREAD_UNCHANGED);
    if (truth.empty() || truth.type() != CV_16UC1) {
      throw core::InputError("not a 16-bit truth mask PNG (tessera synth's <slide>.artefacts.png)",
                             truth_path.string());
    }
    // Truth pixels are whole level-0 blocks; each QC pixel takes the truth pixel under its centre.
    const double truth_downsample = static_cast<double>(slide.width()) / truth.cols;
    cv::Mat1w at_qc(result.tissue.mask.size());
    for (int r = 0; r < at_qc.rows; ++r) {
      for (int c = 0; c < at_qc.cols; ++c) {
        const int tr = std::min(truth.rows - 1, static_cast<int>((r + 0.5) * downsample / truth_downsample));
        const int tc = std::min(truth.cols - 1, static_cast<int>((c + 0.5) * downsample / truth_downsample));
        at_qc(r, c) = truth.at<std::uint16_t>(tr, tc);
      }
    }
    json iou = json::object();
    for (const prep::Artefact a : prep::all_artefacts()) {
      const int k = prep::index(a);
      const cv::Mat1b t = (at_qc & static_cast<std::uint16_t>(1u << k)) != 0;
      if (cv::countNonZero(t) == 0) continue;
      iou[prep::to_string(a)] = prep::mask_iou(result.masks[static_cast<std::size_t>(k)], t);
    }
    record["truth_iou"] = iou;
  }
  return record;
}

int run_qc(const JobOptions& job) {
  const auto config = load_job(qc_schema(), job);
  if (maybe_print_config(config, job)) return core::exit_ok;
  const auto& world = core::Comm::world();
  const auto inputs = io::list_input_slides(config);
  const fs::path out = config.get_string("output");
  if (!config.get_bool("qc.enabled")) {
    throw core::ConfigError("tessera qc always runs quality control; qc.enabled switches it off in tile and infer",
                            config.source(), 0, "qc.enabled");
  }
  const prep::QcOptions options = prep::qc_options(config);
  const double assume_mpp = config.get_number("input.assume_mpp");
  const core::OutputLock lock = core::lock_output_folder(world, out.string(), "qc");
  if (world.is_root()) {
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) throw core::InputError("cannot create the output folder: " + ec.message(), out.string());
  }
  world.barrier();

  core::Progress progress(world, static_cast<std::int64_t>(inputs.size()), {.label = "qc", .unit = "slides"});
  json mine = json::array();
  for (std::size_t i = static_cast<std::size_t>(world.rank()); i < inputs.size();
       i += static_cast<std::size_t>(world.size())) {
    try {
      mine.push_back(check_slide(inputs[i], out, options, assume_mpp));
    } catch (const core::Error& e) {
      if (e.kind() != core::ErrorKind::input) throw;
      spdlog::error("{}: {}", inputs[i].id, e.what());
      mine.push_back({{"id", inputs[i].id}, {"path", inputs[i].path}, {"error", e.what()}});
    }
    progress.advance();
  }
  progress.finish();

  const auto gathered = world.gather_bytes(mine.dump(), 0);
  if (!world.is_root()) return core::exit_ok;
  std::map<std::string, json> by_id;
  for (const auto& part : gathered) {
    for (auto& row : json::parse(part)) by_id[row["id"].get<std::string>()] = row;
  }
  std::vector<json> rows;
  for (const auto& input : inputs) rows.push_back(by_id.at(input.id));
  const prep::QcCohort cohort = prep::qc_cohort(rows);
  core::write_file_atomic((out / "qc.csv").string(), cohort.csv);
  io::write_png((out / "qc-cohort.png").string(), cohort.picture);
  config.save((out / "qc.config.yaml").string());
  // Against synthetic truth, when there was any.
  std::map<std::string, std::vector<double>> ious;
  std::string truth_csv = "slide_id,class,iou\n";
  for (const auto& row : rows) {
    if (!row.contains("truth_iou")) continue;
    for (const auto& [name, value] : row["truth_iou"].items()) {
      truth_csv += fmt::format("{},{},{:.4f}\n", row["id"].get<std::string>(), name, value.get<double>());
      ious[name].push_back(value.get<double>());
    }
  }
  if (!ious.empty()) {
    core::write_file_atomic((out / "qc-truth.csv").string(), truth_csv);
    for (const auto& [name, values] : ious) {
      double sum = 0.0;
      for (const double v : values) sum += v;
      spdlog::info("truth: {} mean IoU {:.3f} over {} slide(s)", name, sum / static_cast<double>(values.size()),
                   values.size());
    }
  }

  int failed = 0, unusable = 0;
  for (const auto& row : cohort.rows) {
    if (row.contains("error")) {
      ++failed;
      continue;
    }
    for (const auto& flag : row["flags"]) spdlog::warn("{}: {}", row["id"].get<std::string>(), flag.get<std::string>());
    if (!row["usable"].get<bool>()) ++unusable;
  }
  const int refused = options.refuse_flagged ? cohort.flagged_slides : 0;
  spdlog::info("{} slide(s): {} usable, {} not usable, {} failed; {} and {} in {}", inputs.size(),
               inputs.size() - static_cast<std::size_t>(unusable + failed), unusable, failed, "qc.csv", "qc-cohort.png",
               fs::absolute(out).lexically_normal().string());
  if (failed > 0 || refused > 0) {
    std::fprintf(stderr, "tessera qc: %d slide(s) failed%s (qc.csv names them and why)\n", failed + refused,
                 refused > 0 ? ", flagged slides refused (qc.refuse_flagged)" : "");
    return core::exit_input;
  }
  return core::exit_ok;
}

}  // namespace

Action setup_qc(CLI::App& command) {
  auto job = std::make_shared<JobOptions>();
  add_job_options(command, *job);
  add_key_flag(command, *job, "--slides", {"input.slides"},
               "Slides: comma-separated files or globs, or one dataset.csv (input.slides)", FlagForm::list,
               {"input.csv"});
  add_key_flag(command, *job, "--csv", {"input.csv"}, "dataset.csv of the slides (input.csv)", FlagForm::value,
               {"input.slides"});
  add_key_flag(command, *job, "-o,--out", {"output"}, "Output folder (output)");
  command.footer(
      "Writes <slide>.qc.png (masks, one bit per class), <slide>.qc-preview.png, qc.csv (one row per slide), "
      "qc-cohort.png (each metric over the cohort, outliers named) and qc.config.yaml.");
  return [job] { return run_qc(*job); };
}

}  // namespace tessera::app
