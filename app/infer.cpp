// `tessera infer [job.yaml]`: a trained checkpoint over whole slides → tumour-probability heatmaps.
//
// The slides are files, globs, or one dataset.csv (columns slide, and optionally split, slide_id, mpp; `splits`
// picks rows by split). The model, its tile size, µm/px and stain normalization come from the checkpoint
// (engine/slide_inference.h), so the slides are read as the model's training tiles were. Slides go one after
// another and every rank works on each slide (a contiguous share of its tiles), so a large slide uses every
// rank; rank 0 gathers each map and writes the slide's outputs on a second thread while the next slide is scored.
//
// Outputs in the output folder (rank 0, each written atomically): per slide the outputs of
// analysis/heatmap_outputs.h (`outputs` picks some; default all):
//   <slide>.heatmap.h5, .overlay.png, .heatmap.tif, .geojson, .xml, .detections.csv, .report.json
// and for the job
//   infer.json            per slide: outputs, cells, tiles, seconds, max probability, regions; the failures
//   infer.config.yaml     the effective job
// A slide that fails (missing, corrupt, unreadable region) is reported with the error naming its file, the
// others go on, and the failures are listed at the end with exit code 3 (the outputs of the others are kept).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "analysis/heatmap_outputs.h"
#include "app/cli.h"
#include "core/atomic_file.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/hash.h"
#include "core/output_dir.h"
#include "engine/context.h"
#include "engine/inference.h"
#include "engine/slide_inference.h"
#include "io/annotations.h"
#include "io/dataset.h"
#include "io/heatmap.h"
#include "io/slide.h"
#include "io/slide_list.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const core::Schema& infer_schema() {
  // One schema for the life of the process: a Config keeps a pointer to its schema.
  static const core::Schema instance = [] {
    core::Schema schema;
    schema.string("checkpoint", "", "Trained model (tessera train's checkpoint.h5); required")
        .string_list("slides", {},
                     "Slides: files, globs (e.g. data/slides/*.svs), or one dataset.csv (columns slide, and optionally "
                     "split, slide_id, mpp); required")
        .string_list("splits", {}, "With a dataset.csv: only the slides of these splits (empty = every row)")
        .string("output", "infer", "Folder for the per-slide outputs (<slide>.heatmap.h5, ...)")
        .integer("infer.stride", 0,
                 "Pixels at the model's resolution between heatmap cells; 0 = half a tile (cells overlap)", 0, 65536)
        .integer("infer.batch_size", 32, "Tiles per forward pass on each rank", 1, 65536)
        .string("infer.tta", "none",
                "Test-time augmentation, probabilities averaged over the views: none, flips (4 mirror images), d8 "
                "(8 rotations and mirror images)",
                {"none", "flips", "d8"})
        .number("infer.threshold", 0.5, "P(tumour) at and above which a cell counts as tumour in the summaries", 0, 1)
        .integer("infer.threads", 0, "OpenMP threads per rank (0 = the cores this rank may use)", 0, 1024)
        .number("tissue.min_fraction", 0.5,
                "Minimum tissue fraction of a scored cell; unset: the checkpoint's (its tiling's tissue.min_fraction), "
                "else this default",
                0, 1)
        .number("tissue.mask_mpp", 8.0,
                "Resolution of the tissue mask in um/px; unset: the checkpoint's (its tiling's), else this default", 1,
                64)
        .boolean("tissue.reject_pen_marks", true,
                 "Remove green/blue/black marker ink from the tissue mask; unset: the checkpoint's (its tiling's), "
                 "else this default")
        .number("input.assume_mpp", 0.0, "um/px for slides that record none (0 = such slides fail)", 0, 100)
        .string_list("outputs", {},
                     "Outputs per slide (empty = all): heatmap.h5, overlay.png, heatmap.tif, geojson, xml, "
                     "detections.csv, report.json")
        .string("overlay.colormap", "inferno", "Colour map of overlay.png and heatmap.tif", {"inferno", "viridis"})
        .integer("overlay.max_side", 2048, "Longer side of the slide thumbnail under the overlay, in pixels", 128,
                 16384)
        .boolean("geojson.tiles", true, "Every scored tile as a QuPath detection with a tumor_prob measurement")
        .number("detections.min_prob", 0.1, "Cells below this P(tumour) are never detections (detections.csv)", 0, 1)
        .number("detections.nms_radius_tiles", 2.0, "Non-maximum suppression radius of the detections, in tile widths",
                0, 1000);
    return schema;
  }();
  return instance;
}

struct SlideInput {
  std::string id;
  std::string path;
  double mpp = 0.0;  // per-slide override (0 = from the slide or input.assume_mpp)
};

// dataset.csv (io/dataset.h); `splits` selects rows by their split column.
std::vector<SlideInput> read_csv_inputs(const std::string& csv_path, const std::vector<std::string>& splits,
                                        const core::Config& config) {
  const auto dataset = io::read_dataset_csv(csv_path, {.slide = true, .label = false});
  if (!splits.empty()) {
    if (!dataset.has_column("split")) {
      throw core::ConfigError(
          fmt::format("splits {} were asked for, but {} has no 'split' column", fmt::join(splits, ", "), csv_path),
          config.source(), 0, "splits");
    }
  }
  std::vector<SlideInput> inputs;
  std::set<std::string> present;
  for (const auto& row : dataset.rows) {
    present.insert(row.split.empty() ? "(none)" : row.split);
    if (!splits.empty() && std::find(splits.begin(), splits.end(), row.split) == splits.end()) continue;
    inputs.push_back({row.id, row.slide, row.mpp.value_or(0.0)});
  }
  if (inputs.empty() && !splits.empty()) {
    throw core::ConfigError(fmt::format("no slide of {} is in the split(s) {} (the list has: {})", csv_path,
                                        fmt::join(splits, ", "), fmt::join(present, ", ")),
                            config.source(), 0, "splits");
  }
  return inputs;
}

// The slides to run, identical on every rank: one dataset.csv, or files and globs (a glob matching nothing is
// a mistake in the job; a plain path that does not exist fails as that slide, later).
std::vector<SlideInput> resolve_inputs(const core::Config& config) {
  const auto& entries = config.get_string_list("slides");
  const auto& splits = config.get_string_list("splits");
  if (entries.empty())
    throw core::ConfigError("no slides given (--slides or the job's 'slides' key)", config.source(), 0, "slides");
  std::vector<SlideInput> inputs;
  if (entries.size() == 1 && fs::path(entries.front()).extension() == ".csv") {
    inputs = read_csv_inputs(entries.front(), splits, config);
  } else {
    if (!splits.empty()) {
      throw core::ConfigError("splits select rows of a dataset.csv; the slides here are files or globs",
                              config.source(), 0, "splits");
    }
    for (const auto& f : io::expand_slide_patterns(entries, config.source(), "slides")) {
      inputs.push_back({io::slide_id_of(f), f, 0.0});
    }
  }
  std::vector<std::string> ids;
  for (const auto& s : inputs) ids.push_back(s.id);
  io::check_unique_slide_ids(ids, config.source(), "slides",
                             "ids are file names without extension; the outputs would overwrite each other");
  if (inputs.empty()) throw core::ConfigError("no slides to run", config.source(), 0, "slides");
  return inputs;
}

struct InferOptions {
  JobOptions job;
  std::string checkpoint;
  std::string slides;
  std::string out;
  std::string splits;
  std::string tta;
  bool force = false;
};

// ---------------------------------------------------------------------------------------------------------
// Resume: a record per finished slide.
//
// Once a slide's outputs are all written, rank 0 records them in `.tessera-infer/<slide id>.json` with a key made
// of the checkpoint (path, size, modification time), the settings that shape the outputs and the slide file (path,
// size, modification time, mpp override). A rerun skips a slide whose record has this run's key and whose outputs
// are all there (--force redoes every slide), so a job killed after N slides redoes only the rest.

const char* const kRecordFolder = ".tessera-infer";

std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return path + "|missing";
  return fmt::format("{}|{}|{}.{:09d}", path, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

// What every slide's outputs depend on: the checkpoint file and the effective job, less the keys that pick the
// slides, the folder or the threads (they change no slide's outputs).
std::string job_key(const core::Config& config, const std::string& checkpoint_path) {
  core::Config keyed = config;
  for (const char* neutral : {"slides=[]", "splits=[]", "output=\"\"", "infer.threads=0"}) keyed.set(neutral);
  return file_identity(checkpoint_path) + "\n" + keyed.to_yaml();
}

std::string slide_key(const std::string& job, const std::string& path, double mpp) {
  return fmt::format("{:016x}",
                     core::fnv1a(job + "\n" + file_identity(fs::absolute(path).string()) + fmt::format("|{}", mpp)));
}

fs::path slide_record_path(const fs::path& out, const std::string& id) { return out / kRecordFolder / (id + ".json"); }

// The summary entry of a slide whose outputs an earlier run made with `key` and that are all still there.
std::optional<json> finished_entry(const fs::path& out, const std::string& id, const std::string& key) {
  const fs::path path = slide_record_path(out, id);
  if (!fs::exists(path)) return std::nullopt;
  try {
    std::ifstream in(path);
    const json record = json::parse(in);
    if (record.at("key").get<std::string>() != key) return std::nullopt;
    const json& entry = record.at("entry");
    for (const auto& file : entry.at("outputs")) {
      if (!fs::exists(out / file.get<std::string>())) return std::nullopt;
    }
    return entry;
  } catch (const std::exception& e) {
    spdlog::warn("{}: unreadable ({}); the slide is done again", path.string(), e.what());
    return std::nullopt;
  }
}

// Files of a killed run that were never finished: `<output>.tmp-<pid>` and the pyramid levels of a TIFF,
// `<output>.tmp-<pid>.levelN`. Under the folder's lock no live job writes them.
void remove_temporaries(const fs::path& out) {
  int removed = 0;
  for (const fs::path& folder : {out, out / kRecordFolder}) {
    if (!fs::is_directory(folder)) continue;
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.path().filename().string().find(".tmp-") == std::string::npos) continue;
      fs::remove(entry.path());
      ++removed;
    }
  }
  if (removed > 0) spdlog::info("removed {} unfinished file(s) of an earlier run from {}", removed, out.string());
}

// One slide's outputs as the summary records them; `error` set when the slide failed while writing.
struct WrittenSlide {
  std::string id;
  json entry;
  std::string error;
};

// The outputs of one slide (rank 0). The map is complete here: a slide whose analysis or picture fails is
// reported as failed with what was written so far kept (each file is complete).
WrittenSlide write_outputs(const SlideInput& input, io::Heatmap map, const engine::SlideInferenceStats& stats,
                           const std::string& position, const fs::path& out,
                           const analysis::OutputOptions& output_options, double assume_mpp, double threshold,
                           const std::string& key) {
  const auto t_outputs = std::chrono::steady_clock::now();
  // The slide's record goes first: outputs being rewritten (other settings, a killed or failing run) are never
  // taken for the recorded ones.
  std::error_code ignored;  // no record to remove is fine; one that cannot be removed fails the write below
  fs::remove(slide_record_path(out, input.id), ignored);
  std::vector<std::string> written;
  analysis::SlideResult result;
  try {
    result = analysis::analyse_heatmap(std::move(map), output_options);
    result.tissue_area_mm2 = stats.tissue_area_mm2;
    const bool overlay = output_options.outputs.empty() ||
                         std::find(output_options.outputs.begin(), output_options.outputs.end(), "overlay.png") !=
                             output_options.outputs.end();
    if (overlay) {
      io::SlideOpenOptions open_options;
      open_options.assume_mpp = input.mpp > 0.0 ? input.mpp : assume_mpp;
      result.thumbnail = io::Slide::open(input.path, open_options).thumbnail(output_options.overlay.max_side);
    }
    written = analysis::write_slide_outputs(out.string(), result, output_options);
  } catch (const core::Error& e) {
    if (e.kind() != core::ErrorKind::input) throw;
    spdlog::error("slide {} failed while writing its outputs: {}", position, e.what());
    return {input.id, json(), e.what()};
  }
  const double output_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_outputs).count();
  const auto& heatmap = result.heatmap;
  const float max_prob = heatmap.max_prob();
  json outputs = json::array();
  for (const auto& path : written) outputs.push_back(fs::path(path).filename().string());
  spdlog::info(
      "slide {} {}: {} tiles of {} cells ({}x{}, step {} px) in {:.1f} s ({:.0f} tiles/s; plan {:.1f} s, "
      "waiting for the reader {:.1f} s); outputs written in {:.1f} s; max P {:.3f}, {} region(s) at P >= {:g}",
      position, input.id, stats.tiles, stats.cells, heatmap.rows, heatmap.cols, heatmap.step, stats.seconds,
      static_cast<double>(stats.tiles) / std::max(stats.seconds, 1e-9), stats.plan_seconds, stats.read_wait_seconds,
      output_seconds, std::isnan(max_prob) ? 0.0f : max_prob, result.regions.size(), threshold);
  json entry = {{"id", input.id},
                {"slide", input.path},
                {"outputs", outputs},
                {"rows", heatmap.rows},
                {"cols", heatmap.cols},
                {"step", heatmap.step},
                {"tiles", stats.tiles},
                {"regions", result.regions.size()},
                {"detections", result.detections.size()},
                {"max_prob", std::isnan(max_prob) ? json(nullptr) : json(max_prob)},
                {"seconds", stats.seconds},
                {"plan_seconds", stats.plan_seconds},
                {"read_wait_seconds", stats.read_wait_seconds},
                {"output_seconds", output_seconds},
                {"tiles_per_second", static_cast<double>(stats.tiles) / std::max(stats.seconds, 1e-9)}};
  core::write_file_atomic(slide_record_path(out, input.id).string(),
                          json({{"key", key}, {"entry", entry}}).dump() + "\n");
  // Fault point "infer.slide-finished" (core/fault.h): after a slide's outputs and its record are complete, e.g.
  // "infer.slide-finished after=1 do=kill" kills the job once its first slide is done.
  core::fault::at("infer.slide-finished");
  return {input.id, std::move(entry), ""};
}

int run_infer(const InferOptions& options) {
  std::vector<std::string> overrides;
  if (!options.checkpoint.empty()) overrides.push_back("checkpoint=" + options.checkpoint);
  if (!options.slides.empty()) overrides.push_back("slides=" + yaml_list(comma_list(options.slides)));
  if (!options.splits.empty()) overrides.push_back("splits=" + yaml_list(comma_list(options.splits)));
  if (!options.out.empty()) overrides.push_back("output=" + options.out);
  if (!options.tta.empty()) overrides.push_back("infer.tta=" + options.tta);
  auto config = load_job(infer_schema(), options.job, overrides);
  if (maybe_print_config(config, options.job)) return core::exit_ok;

  const std::string checkpoint = config.get_string("checkpoint");
  if (checkpoint.empty()) {
    throw core::ConfigError("no checkpoint given (--checkpoint or the job's 'checkpoint' key)", config.source(), 0,
                            "checkpoint");
  }
  const auto inputs = resolve_inputs(config);
  const fs::path out = config.get_string("output");
  const double threshold = config.get_number("infer.threshold");
  const auto& world = core::Comm::world();
  // Held to the end of the job: no other job writes this folder meanwhile (core/output_dir.h).
  const core::OutputLock lock = core::lock_output_folder(world, out.string(), "infer");
  engine::Context::get().set_threads(static_cast<int>(config.get_int("infer.threads")));

  engine::SlideInferenceOptions inference_options;
  inference_options.stride = static_cast<int>(config.get_int("infer.stride"));
  inference_options.batch_size = static_cast<int>(config.get_int("infer.batch_size"));
  inference_options.tta = engine::parse_tta(config.get_string("infer.tta"));
  inference_options.assume_mpp = config.get_number("input.assume_mpp");

  analysis::OutputOptions output_options;
  output_options.regions.threshold = threshold;
  output_options.detections.min_prob = config.get_number("detections.min_prob");
  output_options.detections.nms_radius_tiles = config.get_number("detections.nms_radius_tiles");
  output_options.overlay.colormap = io::parse_colormap(config.get_string("overlay.colormap"));
  output_options.overlay.max_side = static_cast<int>(config.get_int("overlay.max_side"));
  output_options.tiff.colormap = output_options.overlay.colormap;
  output_options.geojson.tiles = config.get_bool("geojson.tiles");
  output_options.outputs = config.get_string_list("outputs");
  for (const auto& name : output_options.outputs) {
    if (analysis::find_output_writer(name) == nullptr) {
      throw core::ConfigError(fmt::format("unknown output '{}' (known: {})", name, analysis::output_writer_names()),
                              config.source(), 0, "outputs");
    }
  }
  if (!(threshold > 0.0)) {
    throw core::ConfigError("the threshold must be above 0 (regions are the cells with P >= threshold)",
                            config.source(), 0, "infer.threshold");
  }

  engine::LoadedModel model = engine::load_model(checkpoint);
  const std::string checkpoint_path = fs::absolute(checkpoint).lexically_normal().string();
  // Tissue is found as the tiling found it for training, unless the job says otherwise: each tissue.* key the
  // job leaves unset takes the checkpoint's value (a checkpoint from before they were recorded has none; the
  // defaults stand). infer.config.yaml then holds the values used.
  if (const auto& tissue = model.meta.tissue) {
    const std::vector<std::pair<const char*, std::string>> from_checkpoint = {
        {"tissue.min_fraction", fmt::format("{}", tissue->min_fraction)},
        {"tissue.mask_mpp", fmt::format("{}", tissue->mask_mpp)},
        {"tissue.reject_pen_marks", tissue->reject_pen_marks ? "true" : "false"}};
    for (const auto& [key, value] : from_checkpoint) {
      if (config.is_set(key)) continue;
      try {
        config.set(fmt::format("{}={}", key, value));
      } catch (const core::ConfigError& e) {
        throw core::InputError(
            fmt::format("/meta records the tiling's {} as {}, which inference cannot use: {}", key, value, e.message()),
            checkpoint);
      }
    }
  }
  inference_options.min_tissue = config.get_number("tissue.min_fraction");
  inference_options.tissue.mask_mpp = config.get_number("tissue.mask_mpp");
  inference_options.tissue.reject_pen_marks = config.get_bool("tissue.reject_pen_marks");
  engine::SlideInference inference(model, checkpoint_path, inference_options);

  // Slides finished by an earlier run of this job are skipped (rank 0 decides, every rank follows).
  const std::string job = job_key(config, checkpoint_path);
  std::vector<std::string> keys;
  for (const auto& input : inputs) keys.push_back(slide_key(job, input.path, input.mpp));
  std::vector<std::uint8_t> skip(inputs.size(), 0);
  std::map<std::string, json> finished;  // id → summary entry (rank 0)
  if (world.is_root()) {
    remove_temporaries(out);
    fs::create_directories(out / kRecordFolder);
    for (std::size_t s = 0; s < inputs.size() && !options.force; ++s) {
      if (auto entry = finished_entry(out, inputs[s].id, keys[s])) {
        finished[inputs[s].id] = std::move(*entry);
        skip[s] = 1;
      }
    }
  }
  world.broadcast(skip, 0);

  if (world.is_root()) {
    fs::create_directories(out);
    config.save((out / "infer.config.yaml").string());
    spdlog::info(
        "inferring {} slide(s) with {} ({}, {} px at {:g} µm/px, stain {}, epoch {}), stride {} px, tta {}, "
        "tissue >= {:g} of a tile on a {:g} µm/px mask{} ({}), on {} rank(s) x {} thread(s)",
        inputs.size(), checkpoint, model.meta.architecture, inference.input_size(), inference.mpp(),
        model.meta.stain_normalization, model.meta.epoch, inference.stride(), engine::to_string(inference_options.tta),
        inference_options.min_tissue, inference_options.tissue.mask_mpp,
        inference_options.tissue.reject_pen_marks ? ", pen marks rejected" : "",
        model.meta.tissue ? "the checkpoint's tiling unless set" : "the job's; the checkpoint records none",
        world.size(), engine::threads());
  }

  const auto t_start = std::chrono::steady_clock::now();
  std::map<std::string, std::string> failed;  // id → error
  json slides = json::array();
  std::int64_t total_tiles = 0;

  // Rank 0 writes a slide's outputs on a second thread while every rank scores the next slide (one slide in
  // flight: memory stays at one extra map and thumbnail). Its outcome joins the summary in slide order.
  std::future<WrittenSlide> writing;
  auto collect = [&] {
    if (!writing.valid()) return;
    WrittenSlide done = writing.get();  // rethrows an internal error of the writer
    if (done.error.empty()) {
      slides.push_back(std::move(done.entry));
    } else {
      failed[done.id] = done.error;
    }
  };
  for (std::size_t s = 0; s < inputs.size(); ++s) {
    const auto& input = inputs[s];
    if (skip[s]) {
      if (!world.is_root()) continue;
      collect();  // the summary stays in slide order
      spdlog::info(
          "slide {}/{} {}: up to date (its outputs are from an earlier run with this checkpoint and these "
          "settings; --force redoes it)",
          s + 1, inputs.size(), input.id);
      slides.push_back(finished[input.id]);
      continue;
    }
    engine::SlideInferenceStats stats;
    io::Heatmap map;
    try {
      map = inference.run(input.path, input.id, world, &stats, input.mpp);
    } catch (const core::Error& e) {
      if (e.kind() != core::ErrorKind::input) throw;
      failed[input.id] = e.what();
      if (world.is_root()) spdlog::error("slide {}/{} failed: {}", s + 1, inputs.size(), e.what());
      continue;
    }
    total_tiles += stats.tiles;
    if (!world.is_root()) continue;
    collect();
    const std::string position = fmt::format("{}/{}", s + 1, inputs.size());
    writing =
        std::async(std::launch::async, [&, input, stats, position, key = keys[s], map = std::move(map)]() mutable {
          return write_outputs(input, std::move(map), stats, position, out, output_options,
                               inference_options.assume_mpp, threshold, key);
        });
  }
  collect();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (!world.is_root()) return failed.empty() ? core::exit_ok : core::exit_input;

  json failures = json::array();
  for (const auto& [id, error] : failed) failures.push_back({{"id", id}, {"error", error}});
  const json summary = {{"checkpoint", checkpoint_path},
                        {"ranks", world.size()},
                        {"threads_per_rank", engine::threads()},
                        {"stride", inference.stride()},
                        {"tta", engine::to_string(inference_options.tta)},
                        {"threshold", threshold},
                        {"tiles", total_tiles},
                        {"seconds", seconds},
                        {"tiles_per_second", static_cast<double>(total_tiles) / std::max(seconds, 1e-9)},
                        {"slides", slides},
                        {"failures", failures}};
  core::write_file_atomic((out / "infer.json").string(), summary.dump(2) + "\n");

  const std::string where = fs::absolute(out).lexically_normal().string();
  spdlog::info(
      "{} of {} slide(s) done, {} tiles in {:.1f} s ({:.0f} tiles/s); outputs in {} "
      "(<slide>.<output> per slide; summary infer.json)",
      inputs.size() - failed.size(), inputs.size(), total_tiles, seconds,
      static_cast<double>(total_tiles) / std::max(seconds, 1e-9), where);
  if (!failed.empty()) {
    std::fprintf(stderr, "tessera infer: %zu of %zu slides failed (the others' outputs are in %s):\n", failed.size(),
                 inputs.size(), where.c_str());
    for (const auto& [id, error] : failed) std::fprintf(stderr, "  %s\n", error.c_str());
    return core::exit_input;
  }
  return core::exit_ok;
}

}  // namespace

Action setup_infer(CLI::App& command) {
  auto options = std::make_shared<InferOptions>();
  add_job_options(command, options->job);
  command.add_option("-c,--checkpoint", options->checkpoint,
                     "Trained model, e.g. runs/train/checkpoint.h5 (checkpoint)");
  command.add_option("--slides", options->slides,
                     "Slides: a glob, a comma-separated list of files/globs, or a dataset.csv (slides)");
  command.add_option("-o,--out", options->out, "Output folder (output)");
  command.add_option("--splits", options->splits, "With a dataset.csv: comma-separated splits, e.g. test (splits)");
  add_key_flag(command, options->job, "--stride", {"infer.stride"},
               "Pixels at the model's resolution between cells; 0 = half a tile (infer.stride)");
  add_key_flag(command, options->job, "--batch", {"infer.batch_size"}, "Tiles per forward pass (infer.batch_size)");
  command.add_option("--tta", options->tta, "Test-time augmentation: none, flips, d8 (infer.tta)");
  add_key_flag(command, options->job, "--threshold", {"infer.threshold"},
               "P(tumour) that counts as tumour (infer.threshold)");
  add_key_flag(command, options->job, "--threads", {"infer.threads"},
               "OpenMP threads per rank, 0 = all cores (infer.threads)");
  command.add_flag("--force", options->force,
                   "Redo every slide, also those whose outputs an earlier run made with the same checkpoint and "
                   "settings (skipped otherwise)");
  command.footer(
      "Writes per slide <slide>.heatmap.h5, .overlay.png, .heatmap.tif, .geojson (QuPath), .xml (ASAP), "
      ".detections.csv (CAMELYON16) and .report.json into the output folder, and infer.json. Runs the "
      "same under mpirun/srun: every rank reads and scores a share of each slide's tiles, rank 0 writes. A failing "
      "slide is reported and the rest go on (exit code 3 at the end).");
  return [options] { return run_infer(*options); };
}

}  // namespace tessera::app
