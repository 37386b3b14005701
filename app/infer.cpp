// `tessera infer [job.yaml]`: a trained checkpoint over whole slides → tumour-probability heatmaps.
//
// The slides are input.slides (files, globs) or input.csv (a dataset.csv: columns slide, and optionally split,
// slide_id, mpp; input.splits picks rows by split), as in every verb (io/slide_list.h). The model, its tile size, µm/px
// and stain normalization come from the checkpoint (engine/slide_inference.h), so the slides are read as the model's
// training tiles were. Slides go one after another and every rank works on each slide (a contiguous share of its
// tiles), so a large slide uses every rank; rank 0 gathers each map and writes the slide's outputs on a second thread
// while the next slide is scored.
//
// Outputs in the output folder (rank 0, each written atomically): per slide the outputs of
// analysis/heatmap_outputs.h (`outputs` picks some; default all):
//   <slide>.heatmap.h5, .overlay.png, .heatmap.tif, .geojson, .xml, .detections.csv, .report.json
// and for the job infer.json (per slide: outputs, cells, tiles, seconds, max probability, regions; the failures)
// and infer.config.yaml (the effective job).
// A slide that fails (missing, corrupt, unreadable region) is reported naming its file, the others go on, and the
// failures are listed at the end with exit code 3. The resume records are analysis/infer_outputs.h's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "analysis/heatmap_outputs.h"
#include "analysis/infer_outputs.h"
#include "app/cli.h"
#include "core/atomic_file.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/output_dir.h"
#include "core/signals.h"
#include "engine/context.h"
#include "engine/inference.h"
#include "engine/precision.h"
#include "engine/slide_inference.h"
#include "io/heatmap.h"
#include "io/provenance.h"
#include "io/slide_list.h"
#include "preprocessing/qc.h"
#include "preprocessing/tissue.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const core::Schema& infer_schema() {
  // One schema for the life of the process: a Config keeps a pointer to its schema.
  static const core::Schema instance = [] {
    core::Schema schema;
    schema.string("checkpoint", "", "Trained model (tessera train's checkpoint.h5); required");
    io::declare_input_keys(schema)
        .renamed("slides", "input.slides")
        .renamed("splits", "input.splits")
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
        .string("infer.precision", "fp32",
                "Number format of the convolutions and linear layers: fp32, or bf16 where the CPU has AVX-512 BF16 "
                "(else fp32, said once in the log)",
                {"fp32", "bf16"});
    prep::declare_tissue_keys(schema, "unset: the checkpoint's (its tiling's), else this default");
    prep::declare_qc_keys(schema);
    analysis::declare_output_keys(schema);
    return schema;
  }();
  return instance;
}

// The Slurm job of this run for infer.json (io/provenance.h); null outside Slurm.
json slurm_record() {
  const auto job = io::slurm_job();
  if (!job) return nullptr;
  return {{"job_id", job->job_id},
          {"array_job_id", job->array_job_id},
          {"array_task_id", job->array_task_id},
          {"nodelist", job->nodelist},
          {"ntasks", job->ntasks},
          {"restarts", job->restarts}};
}

// What the QC stage found on a slide, for its report and overlay.
analysis::QcOutcome qc_outcome(const engine::SlideInferenceStats& stats) {
  analysis::QcOutcome out;
  if (!stats.qc) return out;
  const prep::QcResult& qc = *stats.qc;
  out.ran = true;
  out.flags = qc.flags;
  out.excluded_cells = stats.qc_excluded_cells;
  out.downsample = qc.tissue.downsample;
  out.excluded = qc.excluded();
  out.flagged = qc.flagged();
  out.bits = prep::encode_qc_masks(qc);
  const double mm2_per_pixel = qc.tissue.mpp * qc.tissue.mpp * 1e-6;
  out.excluded_mm2 = cv::countNonZero(out.excluded) * mm2_per_pixel;
  out.flagged_mm2 = cv::countNonZero(out.flagged) * mm2_per_pixel;
  for (const prep::Artefact a : prep::all_artefacts()) {
    const auto i = static_cast<std::size_t>(prep::index(a));
    if (!qc.options.enabled[i]) continue;
    const std::string action = prep::to_string(qc.options.action[i]);
    out.classes.push_back({prep::to_string(a), action, qc.area_mm2[i], qc.fraction[i]});
    if (cv::countNonZero(qc.masks[i]) > 0) {
      out.masks.emplace_back(std::string(prep::to_string(a)) + " (" + action + ")", qc.masks[i]);
    }
  }
  if (!qc.severe_blur.empty() && cv::countNonZero(qc.severe_blur) > 0) {
    out.masks.emplace_back("blur, severe (exclude)", qc.severe_blur);
  }
  return out;
}

struct InferOptions {
  JobOptions job;
  bool force = false;
};

int run_infer(const InferOptions& options) {
  auto config = load_job(infer_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;

  const std::string checkpoint = config.get_string("checkpoint");
  if (checkpoint.empty()) {
    throw core::ConfigError("no checkpoint given (--checkpoint or the job's 'checkpoint' key)", config.source(), 0,
                            "checkpoint");
  }
  const auto inputs = io::list_input_slides(config);
  const fs::path out = config.get_string("output");
  const double threshold = config.get_number("infer.threshold");
  const auto& world = core::Comm::world();
  // Held to the end of the job: no other job writes this folder meanwhile (core/output_dir.h).
  const core::OutputLock lock = core::lock_output_folder(world, out.string(), "infer");
  core::install_stop_handlers();  // SIGUSR1: finish the slide in hand; SIGTERM: stop now (core/signals.h)
  engine::Context::get().set_threads(static_cast<int>(config.get_int("infer.threads")));

  engine::SlideInferenceOptions inference_options;
  inference_options.stride = static_cast<int>(config.get_int("infer.stride"));
  inference_options.batch_size = static_cast<int>(config.get_int("infer.batch_size"));
  inference_options.tta = engine::parse_tta(config.get_string("infer.tta"));
  inference_options.assume_mpp = config.get_number("input.assume_mpp");

  const analysis::OutputOptions output_options = analysis::read_output_options(config, threshold, "infer.threshold");

  engine::LoadedModel model = engine::load_model(checkpoint);
  const engine::Precision precision = engine::use_precision(
      *model.model, engine::parse_precision(config.get_string("infer.precision"), "infer.precision"));
  const std::string checkpoint_path = fs::absolute(checkpoint).lexically_normal().string();
  // Tissue is found as the tiling found it for training, unless the job says otherwise: each tissue.* key the
  // job leaves unset takes the checkpoint's value (a checkpoint from before they were recorded has none; the
  // defaults stand). infer.config.yaml then holds the values used.
  if (const auto& tissue = model.meta.tissue) {
    const std::vector<std::pair<const char*, core::Value>> from_checkpoint = {
        {"tissue.min_fraction", tissue->min_fraction},
        {"tissue.mask_mpp", tissue->mask_mpp},
        {"tissue.reject_pen_marks", tissue->reject_pen_marks}};
    for (const auto& [key, value] : from_checkpoint) {
      if (config.is_set(key)) continue;
      try {
        config.assign(key, value, checkpoint);
      } catch (const core::ConfigError& e) {
        throw core::InputError(
            fmt::format("/meta records the tiling's {}, which inference cannot use: {}", key, e.message()), checkpoint);
      }
    }
  }
  const io::TissueSettings tissue = prep::tissue_settings(config);
  inference_options.min_tissue = tissue.min_fraction;
  inference_options.tissue.mask_mpp = tissue.mask_mpp;
  inference_options.tissue.reject_pen_marks = tissue.reject_pen_marks;
  if (prep::qc_enabled(config)) inference_options.qc = prep::qc_options(config);
  engine::SlideInference inference(model, checkpoint_path, inference_options);

  // Slides finished by an earlier run of this job are skipped (rank 0 decides, every rank follows).
  const std::string job = analysis::infer_job_key(config, checkpoint_path);
  std::vector<std::string> keys;
  for (const auto& input : inputs) keys.push_back(analysis::slide_key(job, input.path, input.mpp));
  std::vector<std::uint8_t> skip(inputs.size(), 0);
  std::map<std::string, json> finished;  // id → summary entry (rank 0)
  if (world.is_root()) {
    analysis::remove_unfinished(out);
    fs::create_directories(out / analysis::kInferRecordFolder);
    for (std::size_t s = 0; s < inputs.size() && !options.force; ++s) {
      if (auto entry = analysis::finished_slide(out, inputs[s].id, keys[s])) {
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
    spdlog::info("the model's training data: {}", io::describe(model.meta.provenance));
  }

  const auto t_start = std::chrono::steady_clock::now();
  std::map<std::string, std::string> failed;  // id → error
  json slides = json::array();
  std::int64_t total_tiles = 0;

  // Rank 0 writes a slide's outputs on a second thread while every rank scores the next slide (one slide in
  // flight: memory stays at one extra map and thumbnail). Its outcome joins the summary in slide order.
  std::future<analysis::WrittenSlide> writing;
  auto collect = [&] {
    if (!writing.valid()) return;
    analysis::WrittenSlide done = writing.get();  // rethrows an internal error of the writer
    if (done.error.empty()) {
      slides.push_back(std::move(done.entry));
    } else {
      failed[done.id] = done.error;
    }
  };
  for (std::size_t s = 0; s < inputs.size(); ++s) {
    const auto& input = inputs[s];
    // Between slides every rank agrees whether to stop (SIGUSR1: the slide in hand is finished; core/signals.h).
    if (const auto stop = core::agree_stop(world); stop != core::StopRequest::none) {
      collect();  // the last slide's outputs and record are complete before the job ends
      if (world.is_root()) {
        spdlog::warn("{}: stopped before slide {}/{} {}; the slides done are recorded, run the job again for the rest",
                     core::signal_name(stop), s + 1, inputs.size(), input.id);
      }
      return core::exit_interrupted;
    }
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
    core::fault::at("infer.slide-scored");
    if (!world.is_root()) continue;
    collect();
    const std::string position = fmt::format("{}/{}", s + 1, inputs.size());
    // A model that saw only synthetic slides, on a slide tessera synth did not make: said once here, and in the
    // slide's report.json and overlay (io/provenance.h).
    const std::string caution = io::model_caution(model.meta.provenance, stats.synthetic_slide);
    if (!caution.empty()) {
      spdlog::warn(
          "slide {} {}: {} (the model saw only slides made by tessera synth and this slide is not one: its heatmap "
          "and report are no diagnosis)",
          position, input.id, caution);
    }
    const analysis::QcOutcome qc = qc_outcome(stats);
    for (const auto& flag : qc.flags) spdlog::warn("slide {} {}: quality control: {}", position, input.id, flag);
    writing = std::async(
        std::launch::async, [&, input, stats, position, caution, qc, key = keys[s], map = std::move(map)]() mutable {
          const analysis::ScoringStats scored{stats.cells,        stats.tiles,           stats.seconds,
                                              stats.plan_seconds, stats.tissue_area_mm2, stats.read_wait_seconds};
          return analysis::write_slide({input.id, input.path, input.mpp, model.meta.provenance, caution, qc},
                                       std::move(map), scored, position, out, output_options,
                                       inference_options.assume_mpp, threshold, key);
        });
  }
  collect();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (!world.is_root()) return failed.empty() ? core::exit_ok : core::exit_input;

  json failures = json::array();
  for (const auto& [id, error] : failed) failures.push_back({{"id", id}, {"error", error}});
  const json summary = {{"checkpoint", checkpoint_path},
                        {"training_data", io::to_string(io::training_data(model.meta.provenance))},
                        {"ranks", world.size()},
                        {"threads_per_rank", engine::threads()},
                        {"stride", inference.stride()},
                        {"tta", engine::to_string(inference_options.tta)},
                        {"precision", engine::to_string(precision)},
                        {"threshold", threshold},
                        {"tiles", total_tiles},
                        {"seconds", seconds},
                        {"tiles_per_second", static_cast<double>(total_tiles) / std::max(seconds, 1e-9)},
                        {"slides", slides},
                        {"failures", failures},
                        {"slurm", slurm_record()}};
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
  add_key_flag(command, options->job, "-c,--checkpoint", {"checkpoint"},
               "Trained model, e.g. runs/train/checkpoint.h5 (checkpoint)");
  add_key_flag(command, options->job, "--slides", {"input.slides"},
               "Slides: comma-separated files or globs, or one dataset.csv (input.slides)", FlagForm::list,
               {"input.csv"});
  add_key_flag(command, options->job, "--csv", {"input.csv"}, "dataset.csv of the slides (input.csv)", FlagForm::value,
               {"input.slides"});
  add_key_flag(command, options->job, "-o,--out", {"output"}, "Output folder (output)");
  add_key_flag(command, options->job, "--splits", {"input.splits"},
               "With a dataset.csv: comma-separated splits, e.g. test (input.splits)", FlagForm::list);
  add_key_flag(command, options->job, "--stride", {"infer.stride"},
               "Pixels at the model's resolution between cells; 0 = half a tile (infer.stride)");
  add_key_flag(command, options->job, "--batch", {"infer.batch_size"}, "Tiles per forward pass (infer.batch_size)");
  add_key_flag(command, options->job, "--tta", {"infer.tta"}, "Test-time augmentation: none, flips, d8 (infer.tta)");
  add_key_flag(command, options->job, "--threshold", {"infer.threshold"},
               "P(tumour) that counts as tumour (infer.threshold)");
  add_key_flag(command, options->job, "--dicom-seg", {"dicom_seg.enabled"},
               "Also write <slide>.seg.dcm, a DICOM Segmentation (slides read from DICOM only; dicom_seg.enabled)",
               FlagForm::on);
  add_key_flag(command, options->job, "--precision", {"infer.precision"},
               "fp32 or bf16 (where the CPU has AVX-512 BF16) (infer.precision)");
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
