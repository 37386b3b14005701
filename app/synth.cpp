// tessera synth [job.yaml] — a set of synthetic H&E slides with ground truth, for demos, tests and
// benchmarks on a machine that can download nothing. Under mpirun the slides are spread over ranks.
//
// Output folder:
//   slides/<id>.svs|.tif       the slides (Aperio-style .svs or generic pyramidal .tif)
//   slides/<id>/level-<i>.dcm  with --format dicom: each slide as a DICOM series (io/dicom_writer.h)
//   slides/<id>.xml            ASAP annotations (group _0 tumour, _2 exclusion), level-0 px
//   slides/<id>.geojson        the same as a QuPath FeatureCollection (class Tumor)
//   slides/<id>.artefacts.png  artefact truth masks (when any was drawn): 16-bit PNG at 1/16 scale, bit k = QC
//                              class k (preprocessing/qc.h's order)
//   previews/<id>.png          thumbnail with the ground truth outlined and a scale bar
//   dataset.csv                slide, label, annotation files, split, tumour regions and area
//   synth.config.yaml          the effective job
#include <algorithm>
#include <cmath>
#include <filesystem>
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
#include "core/output_dir.h"
#include "core/progress.h"
#include "io/annotations.h"
#include "io/dicom_writer.h"
#include "io/image.h"
#include "io/slide.h"
#include "preprocessing/overlay.h"
#include "preprocessing/qc.h"
#include "synth/synth.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;

const core::Schema& synth_schema() {
  static const core::Schema schema =
      core::Schema()
          .string("output", "data/synth", "Folder for slides/, dataset.csv and the effective config")
          .integer("seed", 1, "Seed: the same seed gives byte-identical files", 0, 9.0e15)
          .integer("slides.count", 8, "Number of slides", 1, 100000)
          .number("slides.tumour_fraction", 0.5, "Fraction of slides that contain tumour (the rest are normal)", 0, 1)
          .integer("slides.width", 16384, "Level-0 width in pixels", 512, 1 << 20)
          .integer("slides.height", 16384, "Level-0 height in pixels", 512, 1 << 20)
          .number("slides.mpp", 0.25, "Level-0 resolution in um/px", 0.05, 10)
          .string("slides.flavour", "mixed", "File flavour: Aperio-style .svs, generic TIFF, or alternating",
                  {"aperio", "generic", "mixed"})
          .string("slides.compression", "jpeg", "Tile compression", {"jpeg", "deflate"})
          .integer("slides.jpeg_quality", 85, "JPEG quality of the tiles", 30, 100)
          .integer("slides.tile_size", 256, "TIFF tile size in pixels", 64, 1024)
          .number("slides.hue_variation", 0.0,
                  "Haematoxylin's hue between slides: +-radians of tilt from blue towards red, drawn per slide "
                  "(0 = off, the default: QC's colour rules are fixed)",
                  0, synth::kMaxHueVariation)
          .string("slides.format", "tiff", "File format: pyramidal TIFF, or a DICOM series per slide (a folder)",
                  {"tiff", "dicom"})
          .string("slides.dicom.transfer_syntax", "jpeg-baseline",
                  "DICOM frames: the TIFF's JPEG tiles as they are, or uncompressed (explicit or implicit VR)",
                  {"jpeg-baseline", "explicit-little", "implicit-little"})
          .string("slides.dicom.organization", "tiled-full",
                  "DICOM tiles: implicit positions (TILED_FULL) or per-frame positions (TILED_SPARSE)",
                  {"tiled-full", "tiled-sparse"})
          .integer("tumour.max_regions", 6, "Tumour slides get 1..max regions of widely varied size", 1, 64)
          .boolean("tumour.exclusion_regions", true, "Add ASAP _2 (non-tumour) regions inside some large tumours")
          .boolean("artefacts.blur", true, "Out-of-focus patches")
          .boolean("artefacts.pen_marks", false, "Pen marks on the glass and tissue")
          .boolean("artefacts.folds", false, "Tissue folds")
          .boolean("artefacts.red_ink", false, "A red marker stroke")
          .boolean("artefacts.bubbles", false, "Air bubbles under the coverslip (a dark rim, paler tissue inside)")
          .boolean("artefacts.exposure", false, "One over-exposed and one under-exposed camera field")
          .number("split.train", 0.6, "Fraction of each class's slides in the train split", 0, 1)
          .number("split.val", 0.2, "Fraction in the validation split (the rest is test)", 0, 1)
          .boolean("preview.enabled", true, "Write previews/<slide>.png: thumbnail with the ground truth outlined")
          .integer("preview.size", 1024, "Longer side of the preview in pixels", 128, 8192);
  return schema;
}

struct PlannedSlide {
  std::string id;
  bool tumour = false;
  std::string split;
  synth::SynthSlideOptions options;
  std::string extension;
  // --format dicom: the TIFF is converted into the folder slides/<id> and removed.
  bool dicom = false;
  io::DicomWriterOptions dicom_options;
};

// Splits `n` slides of one class into train/val/test by the configured fractions (train first), so that
// every split of a large enough set has both classes.
std::vector<std::string> split_names(int n, double train, double val) {
  const int n_train = static_cast<int>(std::lround(n * train));
  const int n_val = std::min(n - n_train, static_cast<int>(std::lround(n * val)));
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.emplace_back(i < n_train ? "train" : i < n_train + n_val ? "val" : "test");
  return names;
}

std::vector<PlannedSlide> plan(const core::Config& config) {
  const int count = static_cast<int>(config.get_int("slides.count"));
  const int n_tumour = static_cast<int>(std::lround(count * config.get_number("slides.tumour_fraction")));
  const int n_normal = count - n_tumour;
  const double train = config.get_number("split.train");
  const double val = config.get_number("split.val");
  if (train + val > 1.0 + 1e-9) {
    throw core::ConfigError(fmt::format("split.train + split.val must be at most 1, got {:g}", train + val),
                            config.source(), 0, "split.val");
  }
  const auto tumour_splits = split_names(n_tumour, train, val);
  const auto normal_splits = split_names(n_normal, train, val);
  const auto seed = static_cast<std::uint64_t>(config.get_int("seed"));
  const std::string flavour = config.get_string("slides.flavour");

  std::vector<PlannedSlide> slides;
  int tumour_index = 0;
  int normal_index = 0;
  for (int i = 0; i < count; ++i) {
    // Interleave the classes so that any prefix of the set (and any rank's share) has both.
    const bool tumour = (i % 2 == 0 && tumour_index < n_tumour) || normal_index >= n_normal;
    PlannedSlide s;
    s.tumour = tumour;
    const int k = tumour ? tumour_index++ : normal_index++;
    s.id = fmt::format("{}_{:03d}", tumour ? "tumor" : "normal", k + 1);
    s.split = tumour ? tumour_splits[k] : normal_splits[k];
    auto& o = s.options;
    o.width = config.get_int("slides.width");
    o.height = config.get_int("slides.height");
    o.seed = synth::slide_seed(seed, static_cast<std::uint64_t>(i));
    o.tumour = tumour;
    o.max_tumour_regions = static_cast<int>(config.get_int("tumour.max_regions"));
    o.exclusion_regions = config.get_bool("tumour.exclusion_regions");
    o.blur_patches = config.get_bool("artefacts.blur");
    o.pen_marks = config.get_bool("artefacts.pen_marks");
    o.folds = config.get_bool("artefacts.folds");
    o.red_ink = config.get_bool("artefacts.red_ink");
    o.bubbles = config.get_bool("artefacts.bubbles");
    o.exposure = config.get_bool("artefacts.exposure");
    o.mpp = config.get_number("slides.mpp");
    o.hue_variation = config.get_number("slides.hue_variation");
    const bool aperio = flavour == "aperio" || (flavour == "mixed" && i % 2 == 0);
    o.tiff.flavor = aperio ? io::TiffFlavor::aperio : io::TiffFlavor::generic;
    o.tiff.compression =
        config.get_string("slides.compression") == "jpeg" ? io::TiffCompression::jpeg : io::TiffCompression::deflate;
    o.tiff.jpeg_quality = static_cast<int>(config.get_int("slides.jpeg_quality"));
    o.tiff.tile_size = static_cast<int>(config.get_int("slides.tile_size"));
    s.extension = aperio ? ".svs" : ".tif";
    if (config.get_string("slides.format") == "dicom") {
      if (o.tiff.compression != io::TiffCompression::jpeg &&
          config.get_string("slides.dicom.transfer_syntax") == "jpeg-baseline") {
        throw core::ConfigError("slides.format dicom with JPEG Baseline frames needs slides.compression jpeg",
                                config.source(), 0, "slides.compression");
      }
      s.dicom = true;
      s.extension.clear();
      const std::string syntax = config.get_string("slides.dicom.transfer_syntax");
      s.dicom_options.syntax = syntax == "jpeg-baseline"     ? io::DicomTransferSyntax::jpeg_baseline
                               : syntax == "explicit-little" ? io::DicomTransferSyntax::explicit_little
                                                             : io::DicomTransferSyntax::implicit_little;
      s.dicom_options.sparse = config.get_string("slides.dicom.organization") == "tiled-sparse";
      s.dicom_options.uid_seed = fmt::format("tessera synth {} {}", o.seed, s.id);
    }
    slides.push_back(std::move(s));
  }
  return slides;
}

// One dataset.csv row, produced by the rank that rendered the slide.
std::string csv_row(const PlannedSlide& s, const synth::SynthGroundTruth& truth) {
  return fmt::format("{},slides/{}{},{},slides/{}.xml,slides/{}.geojson,{},{},{:.4f},{:.4f}\n", s.id, s.id, s.extension,
                     s.tumour ? "tumor" : "normal", s.id, s.id, s.split, truth.tumour.size(), truth.tumour_area_mm2,
                     truth.tissue_area_mm2);
}

// The slide as a person checks it: thumbnail read back through OpenSlide, tumour outlined in green,
// exclusion regions in blue, a scale bar.
void write_preview(const fs::path& slide_path, const synth::SynthGroundTruth& truth, const fs::path& png,
                   int max_side) {
  const auto slide = io::Slide::open(slide_path.string());
  cv::Mat thumbnail = slide.thumbnail(max_side);
  const double scale = static_cast<double>(slide.width()) / thumbnail.cols;
  prep::draw_outlines(thumbnail, truth.tumour, scale, cv::Scalar(0, 170, 0), std::max(2, max_side / 400));
  prep::draw_outlines(thumbnail, truth.exclusion, scale, cv::Scalar(30, 80, 230), std::max(1, max_side / 600));
  prep::draw_scale_bar(thumbnail, slide.mpp() * scale);
  io::write_png(png.string(), thumbnail);
}

// The artefact truth masks as one 16-bit PNG at 1/16 scale, bit k = class k (prep::all_artefacts() order), as
// `tessera qc` writes its masks (there bit 15 is tissue; here it stays 0).
void write_artefact_truth(const std::string& path, const synth::SynthGroundTruth& truth) {
  cv::Size size;
  for (const auto& m : truth.artefacts) {
    if (!m.empty()) size = m.size();
  }
  if (size.area() == 0) return;  // no artefact drawn: no file
  cv::Mat1w bits = cv::Mat1w::zeros(size);
  for (int k = 0; k < prep::kArtefactCount; ++k) {
    const cv::Mat1b& m = truth.artefacts[static_cast<std::size_t>(k)];
    if (m.empty()) continue;
    for (int r = 0; r < size.height; ++r) {
      for (int c = 0; c < size.width; ++c) {
        if (m(r, c) != 0) bits(r, c) = static_cast<std::uint16_t>(bits(r, c) | (1u << k));
      }
    }
  }
  std::vector<std::uint8_t> png;
  cv::imencode(".png", bits, png);
  core::write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(png.data()), png.size()));
}

std::string render_slide(const PlannedSlide& s, const fs::path& slides_dir, const fs::path& previews_dir,
                         int preview_size) {
  const auto slide_path = slides_dir / (s.id + s.extension);
  synth::SynthGroundTruth truth;
  if (s.dicom) {
    // The TIFF first (same pixels, same JPEG tiles), then its DICOM series; the TIFF goes.
    const auto tiff = slides_dir / (s.id + ".source.tif");
    truth = synth::write_synthetic_slide(tiff.string(), s.options);
    io::write_dicom_series(tiff.string(), slide_path.string(), s.dicom_options);
    std::error_code ec;
    fs::remove(tiff, ec);
  } else {
    truth = synth::write_synthetic_slide(slide_path.string(), s.options);
  }

  std::vector<io::Annotation> annotations = truth.tumour;
  annotations.insert(annotations.end(), truth.exclusion.begin(), truth.exclusion.end());
  io::write_asap_xml((slides_dir / (s.id + ".xml")).string(), annotations,
                     {{"_0", "#FF0000"}, {"_1", "#FF0000"}, {"_2", "#00FF00"}});
  // QuPath: tumour as class Tumor; exclusion regions as holes are already cut from the tumour map, and
  // are exported with QuPath's conventional "Ignore*" class so they are not mistaken for tumour.
  std::vector<io::Annotation> qupath = truth.tumour;
  for (auto& a : qupath) a.group = "Tumor";
  for (auto a : truth.exclusion) {
    a.group = "Ignore*";
    qupath.push_back(std::move(a));
  }
  io::write_geojson((slides_dir / (s.id + ".geojson")).string(), qupath,
                    {{"Tumor", "#C80000"}, {"Ignore*", "#B4B4B4"}});
  write_artefact_truth((slides_dir / (s.id + ".artefacts.png")).string(), truth);
  if (preview_size > 0) write_preview(slide_path, truth, previews_dir / (s.id + ".png"), preview_size);
  spdlog::info("{}: {} tumour region(s), {:.2f} mm2 tumour, {:.1f} mm2 tissue", slide_path.string(),
               truth.tumour.size(), truth.tumour_area_mm2, truth.tissue_area_mm2);
  return csv_row(s, truth);
}

int run_synth(const JobOptions& job) {
  const auto config = load_job(synth_schema(), job);
  if (maybe_print_config(config, job)) return core::exit_ok;

  const auto& world = core::Comm::world();
  const fs::path out = config.get_string("output");
  // Held to the end of the job: no other job writes this folder meanwhile (core/output_dir.h).
  const core::OutputLock lock = core::lock_output_folder(world, out.string(), "synth");
  const fs::path slides_dir = out / "slides";
  const fs::path previews_dir = out / "previews";
  const int preview_size = config.get_bool("preview.enabled") ? static_cast<int>(config.get_int("preview.size")) : 0;
  if (world.is_root()) {
    for (const auto& dir : {slides_dir, previews_dir}) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw core::InputError("cannot create the output folder: " + ec.message(), dir.string());
    }
  }
  world.barrier();

  const auto slides = plan(config);
  core::Progress progress(world, static_cast<std::int64_t>(slides.size()), {.label = "synth", .unit = "slides"});
  std::string rows;
  for (std::size_t i = static_cast<std::size_t>(world.rank()); i < slides.size();
       i += static_cast<std::size_t>(world.size())) {
    rows += render_slide(slides[i], slides_dir, previews_dir, preview_size);
    progress.advance();
  }
  progress.finish();

  const auto gathered = world.gather_bytes(rows, 0);
  if (world.is_root()) {
    // Rows come back grouped by rank; sort them into the planned slide order.
    std::vector<std::string> lines;
    for (const auto& part : gathered) {
      std::istringstream in(part);
      for (std::string line; std::getline(in, line);) lines.push_back(line);
    }
    std::vector<std::string> ordered;
    for (const auto& s : slides) {
      for (const auto& line : lines) {
        if (line.compare(0, s.id.size() + 1, s.id + ",") == 0) ordered.push_back(line);
      }
    }
    std::string csv =
        "slide_id,slide,label,annotation_xml,annotation_geojson,split,tumour_regions,"
        "tumour_area_mm2,tissue_area_mm2\n";
    for (const auto& line : ordered) csv += line + "\n";
    core::write_file_atomic((out / "dataset.csv").string(), csv);
    config.save((out / "synth.config.yaml").string());
    spdlog::info("wrote {} slides, {} and {}", slides.size(), (out / "dataset.csv").string(),
                 (out / "synth.config.yaml").string());
  }
  return core::exit_ok;
}

}  // namespace

Action setup_synth(CLI::App& command) {
  auto job = std::make_shared<JobOptions>();
  add_job_options(command, *job);
  add_key_flag(command, *job, "-o,--out", {"output"}, "Output folder (output)");
  add_key_flag(command, *job, "-n,--slides", {"slides.count"}, "Number of slides (slides.count)");
  add_key_flag(command, *job, "--size", {"slides.width", "slides.height"},
               "Level-0 width and height in pixels (slides.width/height)");
  add_key_flag(command, *job, "--seed", {"seed"}, "Seed (seed)");
  add_key_flag(command, *job, "--format", {"slides.format"}, "tiff or dicom (slides.format)");
  return [job] { return run_synth(*job); };
}

}  // namespace tessera::app
