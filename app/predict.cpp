// `tessera predict [job.yaml]`: P(tumour) for every tile of a shard folder with a trained checkpoint.
//
// The model comes from the checkpoint alone (/meta: architecture, input size, classes, size), in eval mode with batch
// norm folded; tiles go through the same input normalisation as the trainer's validation (engine/inference.h),
// in shard order, without augmentation (or with predict.tta, the mean P over the flips or the 8 symmetries of each
// tile, as infer's tta). Under mpirun each rank scores a contiguous part of the tile sequence and
// rank 0 gathers the parts in rank order, so the rows come out in the same order on any number of ranks.
//
// Outputs (rank 0, each written to a temporary name and renamed):
//   <output>         CSV: slide_id,x,y,label,p_tumor (level-0 top-left as in the shard; label 0 normal, 1 tumour)
//   <output stem>.json   summary: tiles, auc (null when a class is absent), accuracy, and at the decision threshold
//                        the confusion counts, sensitivity, specificity, ppv (precision), F1 and balanced accuracy; the
//                        same per split ("per_split", slides without a split under "(none)"); the threshold and
//                        where it came from; the checkpoint, tiles per second
//   <output stem>.roc.png    the ROC curve of each split, with the threshold's point on it
// The decision threshold is predict.threshold (0.5), or with predict.threshold_from the one with the highest
// balanced accuracy on that split's tiles (core::balanced_threshold): chosen on validation tiles, it is then applied
// unchanged to the test tiles, whose labels never choose it.
// Shards always carry labels (docs/ARCHITECTURE.md "Shard files"), so the label column and the summary are always
// there; slides tiled without annotations have all their tiles labelled normal.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <span>
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
#include "core/error.h"
#include "core/metrics.h"
#include "core/output_dir.h"
#include "core/progress.h"
#include "engine/context.h"
#include "engine/inference.h"
#include "engine/precision.h"
#include "engine/slide_inference.h"
#include "io/annotations.h"
#include "io/image.h"
#include "io/shard.h"
#include "io/shard_dataset.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const core::Schema& predict_schema() {
  // One schema for the life of the process: a Config keeps a pointer to its schema.
  static const core::Schema instance = [] {
    core::Schema schema;
    schema.string("checkpoint", "", "Trained model (tessera train's checkpoint.h5); required")
        .string("data.shards", "data/shards", "Folder with manifest.json and the shards (tessera tile's output)")
        .string_list("data.splits", {}, "Predict the slides of these splits (empty = every slide)")
        .string("output", "predictions.csv", "CSV of predictions; the summary goes beside it with the extension .json")
        .integer("predict.batch_size", 32,
                 "Tiles per forward pass on each rank (larger batches cost memory and, on CPU, gain no speed)", 1,
                 65536)
        .integer("predict.threads", 0, "OpenMP threads per rank (0 = the cores this rank may use)", 0, 1024)
        .string("predict.precision", "fp32",
                "Number format of the convolutions and linear layers: fp32, bf16 where the CPU has AVX-512 BF16, "
                "or int8 where it has VNNI and the checkpoint is calibrated (tessera quantize) (else fp32, said once "
                "in the log)",
                {"fp32", "bf16", "int8"})
        .string("predict.tta", "none",
                "Test-time augmentation, probabilities averaged over the views: none, flips (4 mirror images), d8 "
                "(8 rotations and mirror images)",
                {"none", "flips", "d8"})
        .number("predict.threshold", 0.5, "P(tumour) at and above which a tile is called tumour in the summary", 0, 1)
        .string("predict.threshold_from", "",
                "A split (e.g. val) whose tiles choose the threshold: the highest balanced accuracy there, then "
                "applied to every split (it must be one of data.splits; empty = predict.threshold)");
    return schema;
  }();
  return instance;
}

struct Score {
  std::int64_t tiles = 0;
  double auc = 0.0;  // NaN when a class is absent
  core::OperatingPoint at;
};

Score score(std::span<const float> p, std::span<const std::uint8_t> labels, double threshold) {
  Score s;
  s.tiles = static_cast<std::int64_t>(p.size());
  s.auc = core::roc_auc(p, labels);
  s.at = core::operating_point(p, labels, threshold);
  return s;
}

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json score_json(const Score& s) {
  return {{"tiles", s.tiles},
          {"auc", number_or_null(s.auc)},
          {"accuracy", number_or_null(s.at.accuracy())},
          {"balanced_accuracy", number_or_null(s.at.balanced_accuracy())},
          {"sensitivity", number_or_null(s.at.sensitivity())},
          {"specificity", number_or_null(s.at.specificity())},
          {"ppv", number_or_null(s.at.precision())},  // precision, positive predictive value
          {"f1", number_or_null(s.at.f1())},
          {"tp", s.at.tp},
          {"fp", s.at.fp},
          {"tn", s.at.tn},
          {"fn", s.at.fn}};
}

// <stem>.roc.png: each split's ROC curve, the threshold's operating point marked on it.
cv::Mat roc_picture(const std::map<std::string, std::pair<std::vector<float>, std::vector<std::uint8_t>>>& by_split,
                    double threshold, const std::string& threshold_text, const std::string& checkpoint) {
  analysis::Chart chart;
  chart.title = "Tile-level ROC (tessera predict)";
  chart.subtitle = fmt::format("{}; threshold {:.4f} ({})", checkpoint, threshold, threshold_text);
  chart.x_label = "False-positive rate (1 - specificity)";
  chart.y_label = "True-positive rate (sensitivity)";
  chart.x_ticks = chart.y_ticks = {0.0, 0.2, 0.4, 0.6, 0.8, 1.0};
  chart.series.push_back({"", {{0.0, 0.0}, {1.0, 1.0}}, cv::Scalar(160, 160, 160), 1, true});
  const std::vector<cv::Scalar> colours = {cv::Scalar(31, 119, 180), cv::Scalar(214, 39, 40), cv::Scalar(44, 160, 44),
                                           cv::Scalar(148, 103, 189), cv::Scalar(255, 127, 14)};
  std::size_t k = 0;
  for (const auto& [split, values] : by_split) {
    const auto curve = analysis::roc_curve(values.first, values.second);
    if (curve.empty()) continue;  // one class only
    const cv::Scalar colour = colours[k++ % colours.size()];
    analysis::PlotSeries series{fmt::format("{}: AUC {:.4f} ({} tiles)", split,
                                            core::roc_auc(values.first, values.second), values.first.size()),
                                {},
                                colour};
    for (const auto& point : curve) series.points.emplace_back(point.fpr, point.tpr);
    chart.series.push_back(std::move(series));
    const core::OperatingPoint at = core::operating_point(values.first, values.second, threshold);
    chart.markers.push_back({{1.0 - at.specificity(), at.sensitivity()},
                             fmt::format("{}: BA {:.3f} F1 {:.3f}", split, at.balanced_accuracy(), at.f1()),
                             colour});
  }
  chart.marker_legend = "at the threshold";
  if (chart.series.size() == 1) chart.note = "undefined: every split has one class only";
  return analysis::render_chart(chart);
}

// The summary's path: the CSV's with the extension .json ("preds.csv" → "preds.json").
fs::path summary_path(const fs::path& csv) {
  fs::path json_path = csv;
  return csv.extension() == ".csv" ? json_path.replace_extension(".json") : fs::path(csv.string() + ".json");
}

// The ROC picture's path: "preds.csv" → "preds.roc.png".
fs::path roc_path(const fs::path& csv) {
  fs::path png = csv;
  return csv.extension() == ".csv" ? png.replace_extension(".roc.png") : fs::path(csv.string() + ".roc.png");
}

// The slides to predict: those whose split is in `splits` (every slide when empty). ConfigError when none is.
std::set<std::string> select_slides(const io::Manifest& manifest, const std::vector<std::string>& splits,
                                    const core::Config& config) {
  std::set<std::string> ids;
  std::set<std::string> present;
  for (const auto& s : manifest.slides) {
    present.insert(s.split.empty() ? "(none)" : s.split);
    if (splits.empty() || std::find(splits.begin(), splits.end(), s.split) != splits.end()) ids.insert(s.id);
  }
  if (ids.empty()) {
    throw core::ConfigError(
        fmt::format("no slide of {} is in the split(s) {} (the manifest has: {})", config.get_string("data.shards"),
                    fmt::join(splits, ", "), fmt::join(present, ", ")),
        config.source(), 0, "data.splits");
  }
  return ids;
}

struct PredictOptions {
  JobOptions job;
};

int run_predict(const PredictOptions& options) {
  const auto config = load_job(predict_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;

  const std::string checkpoint = required_checkpoint(config);
  const std::string shards = config.get_string("data.shards");
  const fs::path out = config.get_string("output");
  const auto& world = core::Comm::world();
  // A predictions file that cannot be written fails now, not after every tile is scored.
  core::prepare_output_file(world, out.string());
  engine::Context::get().set_threads(static_cast<int>(config.get_int("predict.threads")));

  engine::LoadedModel model = engine::load_model(checkpoint);
  const engine::Precision precision = engine::use_precision(
      model, checkpoint, engine::parse_precision(config.get_string("predict.precision"), "predict.precision"));
  if (!fs::is_directory(shards)) throw core::InputError("the shard folder does not exist", shards);
  const std::string manifest_path = (fs::path(shards) / "manifest.json").string();
  const io::Manifest manifest = io::read_manifest(manifest_path);
  const auto splits = config.get_string_list("data.splits");
  const std::string threshold_from = config.get_string("predict.threshold_from");
  if (!threshold_from.empty() && !splits.empty() &&
      std::find(splits.begin(), splits.end(), threshold_from) == splits.end()) {
    throw core::ConfigError(fmt::format("split '{}' chooses the threshold but is not predicted (data.splits: {})",
                                        threshold_from, fmt::join(splits, ", ")),
                            config.source(), 0, "predict.threshold_from");
  }

  io::ShardDatasetOptions data_options;
  data_options.batch_size = static_cast<int>(config.get_int("predict.batch_size"));
  data_options.shuffle = false;
  data_options.drop_last = false;
  data_options.rank = world.rank();
  data_options.world_size = world.size();
  data_options.slides = select_slides(manifest, splits, config);
  if (!threshold_from.empty() &&
      std::none_of(manifest.slides.begin(), manifest.slides.end(), [&](const io::ManifestSlide& slide) {
        return slide.split == threshold_from && data_options.slides.count(slide.id) > 0;
      })) {
    throw core::ConfigError(
        fmt::format("no slide of {} is in split '{}', which should choose the threshold", shards, threshold_from),
        config.source(), 0, "predict.threshold_from");
  }
  io::ShardDataset data(shards, data_options);
  engine::check_compatible(model, checkpoint, data, manifest_path);

  std::map<std::string, std::uint32_t> slide_row;
  for (std::size_t i = 0; i < manifest.slides.size(); ++i) {
    slide_row[manifest.slides[i].id] = static_cast<std::uint32_t>(i);
  }
  if (world.is_root()) {
    spdlog::info("predicting {} tiles ({} slides{}) with {} ({}, epoch {}, {}) on {} rank(s)", data.total_tiles(),
                 data_options.slides.size(),
                 splits.empty() ? std::string() : fmt::format(" of split {}", fmt::join(splits, ", ")), checkpoint,
                 model.meta.architecture, model.meta.epoch, engine::to_string(precision), world.size());
  }

  // Score this rank's part.
  const auto t_start = std::chrono::steady_clock::now();
  engine::TileScorer scorer(*model.model);
  const engine::Tta tta = engine::parse_tta(config.get_string("predict.tta"));
  const int views = engine::tta_views(tta);
  const auto classes = static_cast<std::size_t>(model.meta.num_classes);
  const auto positive = static_cast<std::size_t>(model.positive_class);
  engine::TilePredictions mine;
  io::Batch batch;
  {
    core::Progress progress(world, data.total_tiles(), {.label = "predict", .unit = "tiles"});
    data.start_epoch(0);
    io::Batch view;
    std::vector<double> sum;
    while (data.next(batch)) {
      const auto n = static_cast<std::size_t>(batch.size);
      sum.assign(n, 0.0);
      for (int v = 0; v < views; ++v) {
        const io::Batch* scored = &batch;
        if (v > 0) {
          view = batch;
          engine::tta_view(batch.images.data(), view.images.data(), batch.size, batch.tile_size, tta, v);
          scored = &view;
        }
        const auto& p = scorer.probabilities(*scored);
        for (std::size_t i = 0; i < n; ++i) sum[i] += p[i * classes + positive];
      }
      for (std::size_t i = 0; i < n; ++i) {
        mine.slide.push_back(slide_row.at(batch.slide_ids[i]));
        mine.xy.push_back(batch.coords[2 * i]);
        mine.xy.push_back(batch.coords[2 * i + 1]);
        mine.label.push_back(batch.labels[i]);
        mine.p_tumor.push_back(views == 1 ? static_cast<float>(sum[i]) : static_cast<float>(sum[i] / views));
      }
      progress.advance(batch.size);
    }
    progress.finish();
  }
  const auto parts = world.gather_bytes(mine.pack(), 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (!world.is_root()) return core::exit_ok;

  engine::TilePredictions all;
  for (const auto& part : parts) all.append_packed(part);
  if (static_cast<std::int64_t>(all.size()) != data.total_tiles()) {
    throw core::InternalError(fmt::format("predict: {} rows gathered for {} tiles", all.size(), data.total_tiles()));
  }

  std::string csv = "slide_id,x,y,label,p_tumor\n";
  csv.reserve(all.size() * 48);
  for (std::size_t i = 0; i < all.size(); ++i) {
    // {} prints the shortest text that reads back as the same float: the CSV holds the exact scores.
    fmt::format_to(std::back_inserter(csv), "{},{},{},{},{}\n", manifest.slides[all.slide[i]].id, all.xy[2 * i],
                   all.xy[2 * i + 1], all.label[i], all.p_tumor[i]);
  }
  if (out.has_parent_path()) fs::create_directories(out.parent_path());
  core::write_file_atomic(out.string(), csv);

  // The summary: overall and per split, at the decision threshold.
  std::map<std::string, std::pair<std::vector<float>, std::vector<std::uint8_t>>> by_split;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::string& split = manifest.slides[all.slide[i]].split;
    auto& [p, labels] = by_split[split.empty() ? "(none)" : split];
    p.push_back(all.p_tumor[i]);
    labels.push_back(all.label[i]);
  }
  double threshold = config.get_number("predict.threshold");
  std::string threshold_text = "predict.threshold";
  if (!threshold_from.empty()) {
    const auto& [p, labels] = by_split.at(threshold_from);
    threshold = core::balanced_threshold(p, labels);
    if (std::isnan(threshold)) {
      throw core::InputError(fmt::format("split '{}' has tiles of one class only: it cannot choose a threshold "
                                         "(predict.threshold_from)",
                                         threshold_from),
                             manifest_path);
    }
    threshold_text = fmt::format("the highest balanced accuracy on split {}", threshold_from);
  }
  const Score overall = score(all.p_tumor, all.label, threshold);
  json per_split = json::object();
  for (const auto& [split, values] : by_split) {
    per_split[split] = score_json(score(values.first, values.second, threshold));
  }
  json summary = score_json(overall);
  summary["tta"] = engine::to_string(tta);
  summary["threshold"] = number_or_null(threshold);
  summary["threshold_from"] = threshold_from.empty() ? json(nullptr) : json(threshold_from);
  summary["checkpoint"] = fs::absolute(checkpoint).lexically_normal().string();
  summary["architecture"] = model.meta.architecture;
  summary["epoch"] = model.meta.epoch;
  summary["shards"] = fs::absolute(shards).lexically_normal().string();
  summary["splits"] = splits;
  summary["per_split"] = per_split;
  summary["predictions"] = out.filename().string();
  summary["ranks"] = world.size();
  summary["precision"] = engine::to_string(precision);
  summary["seconds"] = seconds;
  summary["tiles_per_second"] = static_cast<double>(all.size()) / std::max(seconds, 1e-9);
  const fs::path summary_file = summary_path(out);
  const fs::path roc_file = roc_path(out);
  io::write_png(roc_file.string(),
                roc_picture(by_split, threshold, threshold_text, fs::path(checkpoint).filename().string()));
  core::write_file_atomic(summary_file.string(), summary.dump(2) + "\n");

  std::string split_text;
  for (const auto& [split, values] : by_split) {
    const Score s = score(values.first, values.second, threshold);
    split_text += fmt::format(
        "\n  {}: AUC {:.4f}, balanced accuracy {:.4f}, F1 {:.4f}, sensitivity {:.4f}, "
        "specificity {:.4f} ({} tiles)",
        split, s.auc, s.at.balanced_accuracy(), s.at.f1(), s.at.sensitivity(), s.at.specificity(), s.tiles);
  }
  spdlog::info("{} tiles in {:.2f} s ({:.0f} tiles/s): AUC {:.4f}; at threshold {:.4f} ({}):{}\nwrote {}, {} and {}",
               all.size(), seconds, static_cast<double>(all.size()) / std::max(seconds, 1e-9), overall.auc, threshold,
               threshold_text, split_text, out.string(), summary_file.string(), roc_file.string());
  return core::exit_ok;
}

}  // namespace

Action setup_predict(CLI::App& command) {
  auto options = std::make_shared<PredictOptions>();
  add_job_options(command, options->job);
  add_key_flag(command, options->job, "-c,--checkpoint", {"checkpoint"},
               "Trained model, e.g. runs/train/checkpoint.h5 (checkpoint)");
  add_key_flag(command, options->job, "--shards", {"data.shards"}, "Shard folder (data.shards)");
  add_key_flag(command, options->job, "-o,--out", {"output"},
               "Predictions CSV; the .json summary goes beside it (output)");
  add_key_flag(command, options->job, "--splits", {"data.splits"},
               "Comma-separated splits to predict, e.g. test,val (data.splits; default: every slide)", FlagForm::list);
  add_key_flag(command, options->job, "--batch", {"predict.batch_size"}, "Tiles per forward pass (predict.batch_size)");
  add_key_flag(command, options->job, "--precision", {"predict.precision"},
               "fp32, bf16 (where the CPU has AVX-512 BF16) or int8 (VNNI; calibrated by tessera quantize) "
               "(predict.precision)");
  add_key_flag(command, options->job, "--threads", {"predict.threads"},
               "OpenMP threads per rank, 0 = all cores (predict.threads)");
  add_key_flag(command, options->job, "--tta", {"predict.tta"},
               "Test-time augmentation: none, flips, d8 (predict.tta)");
  add_key_flag(command, options->job, "--threshold", {"predict.threshold"},
               "P(tumour) at and above which a tile is called tumour (predict.threshold)", FlagForm::value,
               {"predict.threshold_from"});
  add_key_flag(command, options->job, "--threshold-from", {"predict.threshold_from"},
               "Split whose tiles choose the threshold by balanced accuracy, e.g. val (predict.threshold_from)",
               FlagForm::value, {"predict.threshold"});
  command.footer(
      "Writes slide_id,x,y,label,p_tumor per tile in shard order, a JSON summary (AUC; accuracy, balanced accuracy, "
      "F1, sensitivity, specificity at the threshold; per split) and a ROC picture. Runs the same under mpirun/srun: "
      "each rank scores a part, rank 0 writes.");
  return [options] { return run_predict(*options); };
}

}  // namespace tessera::app
