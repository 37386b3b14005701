// `tessera predict [job.yaml]`: P(tumour) for every tile of a shard folder with a trained checkpoint.
//
// The model comes from the checkpoint alone (/meta: architecture, input size, classes), in eval mode with batch
// norm folded; tiles go through the same input normalisation as the trainer's validation (engine/inference.h),
// in shard order, without augmentation. Under mpirun each rank scores a contiguous part of the tile sequence and
// rank 0 gathers the parts in rank order, so the rows come out in the same order on any number of ranks.
//
// Outputs (rank 0, each written to a temporary name and renamed):
//   <output>         CSV: slide_id,x,y,label,p_tumor (level-0 top-left as in the shard; label 0 normal, 1 tumour)
//   <output stem>.json   summary: tiles, auc (null when a class is absent), accuracy at 0.5, the same per split
//                        ("per_split", slides without a split under "(none)"), the checkpoint, tiles per second
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
#include "io/annotations.h"
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
                "Number format of the convolutions and linear layers: fp32, or bf16 where the CPU has AVX-512 BF16 "
                "(else fp32, said once in the log)",
                {"fp32", "bf16"});
    return schema;
  }();
  return instance;
}

struct Score {
  std::int64_t tiles = 0;
  double auc = 0.0;       // NaN when a class is absent
  double accuracy = 0.0;  // P(tumour) ≥ 0.5 ⇔ label 1
};

Score score(std::span<const float> p, std::span<const std::uint8_t> labels) {
  Score s;
  s.tiles = static_cast<std::int64_t>(p.size());
  s.auc = core::roc_auc(p, labels);
  std::int64_t correct = 0;
  for (std::size_t i = 0; i < p.size(); ++i) correct += (p[i] >= 0.5f) == (labels[i] != 0);
  s.accuracy = s.tiles > 0 ? static_cast<double>(correct) / static_cast<double>(s.tiles) : 0.0;
  return s;
}

json score_json(const Score& s) {
  return {{"tiles", s.tiles}, {"auc", std::isfinite(s.auc) ? json(s.auc) : json(nullptr)}, {"accuracy", s.accuracy}};
}

// The summary's path: the CSV's with the extension .json ("preds.csv" → "preds.json").
fs::path summary_path(const fs::path& csv) {
  fs::path json_path = csv;
  return csv.extension() == ".csv" ? json_path.replace_extension(".json") : fs::path(csv.string() + ".json");
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

  const std::string checkpoint = config.get_string("checkpoint");
  if (checkpoint.empty()) {
    throw core::ConfigError("no checkpoint given (--checkpoint or the job's 'checkpoint' key)", config.source(), 0,
                            "checkpoint");
  }
  const std::string shards = config.get_string("data.shards");
  const fs::path out = config.get_string("output");
  const auto& world = core::Comm::world();
  // A predictions file that cannot be written fails now, not after every tile is scored.
  core::prepare_output_file(world, out.string());
  engine::Context::get().set_threads(static_cast<int>(config.get_int("predict.threads")));

  const engine::LoadedModel model = engine::load_model(checkpoint);
  const engine::Precision precision = engine::use_precision(
      *model.model, engine::parse_precision(config.get_string("predict.precision"), "predict.precision"));
  if (!fs::is_directory(shards)) throw core::InputError("the shard folder does not exist", shards);
  const std::string manifest_path = (fs::path(shards) / "manifest.json").string();
  const io::Manifest manifest = io::read_manifest(manifest_path);
  const auto splits = config.get_string_list("data.splits");

  io::ShardDatasetOptions data_options;
  data_options.batch_size = static_cast<int>(config.get_int("predict.batch_size"));
  data_options.shuffle = false;
  data_options.drop_last = false;
  data_options.rank = world.rank();
  data_options.world_size = world.size();
  data_options.slides = select_slides(manifest, splits, config);
  io::ShardDataset data(shards, data_options);
  engine::check_compatible(model, checkpoint, data, manifest_path);

  std::map<std::string, std::uint32_t> slide_row;
  for (std::size_t i = 0; i < manifest.slides.size(); ++i) {
    slide_row[manifest.slides[i].id] = static_cast<std::uint32_t>(i);
  }
  if (world.is_root()) {
    spdlog::info("predicting {} tiles ({} slides{}) with {} ({}, epoch {}) on {} rank(s)", data.total_tiles(),
                 data_options.slides.size(),
                 splits.empty() ? std::string() : fmt::format(" of split {}", fmt::join(splits, ", ")), checkpoint,
                 model.meta.architecture, model.meta.epoch, world.size());
  }

  // Score this rank's part.
  const auto t_start = std::chrono::steady_clock::now();
  engine::TileScorer scorer(*model.model);
  const auto classes = static_cast<std::size_t>(model.meta.num_classes);
  const auto positive = static_cast<std::size_t>(model.positive_class);
  engine::TilePredictions mine;
  io::Batch batch;
  {
    core::Progress progress(world, data.total_tiles(), {.label = "predict", .unit = "tiles"});
    data.start_epoch(0);
    while (data.next(batch)) {
      const auto& p = scorer.probabilities(batch);
      for (std::size_t i = 0; i < static_cast<std::size_t>(batch.size); ++i) {
        mine.slide.push_back(slide_row.at(batch.slide_ids[i]));
        mine.xy.push_back(batch.coords[2 * i]);
        mine.xy.push_back(batch.coords[2 * i + 1]);
        mine.label.push_back(batch.labels[i]);
        mine.p_tumor.push_back(p[i * classes + positive]);
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

  // The summary: overall and per split.
  const Score overall = score(all.p_tumor, all.label);
  json per_split = json::object();
  std::map<std::string, std::pair<std::vector<float>, std::vector<std::uint8_t>>> by_split;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::string& split = manifest.slides[all.slide[i]].split;
    auto& [p, labels] = by_split[split.empty() ? "(none)" : split];
    p.push_back(all.p_tumor[i]);
    labels.push_back(all.label[i]);
  }
  for (const auto& [split, values] : by_split) per_split[split] = score_json(score(values.first, values.second));
  json summary = score_json(overall);
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
  core::write_file_atomic(summary_file.string(), summary.dump(2) + "\n");

  std::string split_text;
  for (const auto& [split, values] : by_split) {
    const Score s = score(values.first, values.second);
    split_text += fmt::format("; {} AUC {:.4f} ({} tiles)", split, s.auc, s.tiles);
  }
  spdlog::info("{} tiles in {:.2f} s ({:.0f} tiles/s): AUC {:.4f}, accuracy {:.4f}{}; wrote {} and {}", all.size(),
               seconds, static_cast<double>(all.size()) / std::max(seconds, 1e-9), overall.auc, overall.accuracy,
               split_text, out.string(), summary_file.string());
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
               "fp32 or bf16 (where the CPU has AVX-512 BF16) (predict.precision)");
  add_key_flag(command, options->job, "--threads", {"predict.threads"},
               "OpenMP threads per rank, 0 = all cores (predict.threads)");
  command.footer(
      "Writes slide_id,x,y,label,p_tumor per tile in shard order, and a JSON summary (AUC, accuracy at 0.5, per "
      "split). Runs the same under mpirun/srun: each rank scores a part, rank 0 writes.");
  return [options] { return run_predict(*options); };
}

}  // namespace tessera::app
