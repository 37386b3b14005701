// `tessera quantize`: int8 calibration of a trained checkpoint, kept in the checkpoint itself.
//
//   tessera quantize --checkpoint runs/train/checkpoint.h5 --shards data/shards [--splits val] [--tiles 512]
//
// Runs the folded fp32 model over the first `quantize.tiles` tiles of the shards (shuffled with a fixed seed, so
// the sample spans the slides and the same job gives the same calibration), records the range of every
// activation int8 quantizes (engine/precision.h: the "max" method) and rewrites the checkpoint atomically with
// those ranges under /quantization (io/checkpoint.h), everything else as it was. `infer`/`predict --precision
// int8` then read them; a checkpoint without them is refused there with a message naming this verb. Calibrating
// again replaces the ranges. Under MPI every rank computes the same ranges and rank 0 writes.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "engine/context.h"
#include "engine/inference.h"
#include "engine/precision.h"
#include "io/checkpoint.h"
#include "io/shard.h"
#include "io/shard_dataset.h"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;

const core::Schema& quantize_schema() {
  static const core::Schema instance = [] {
    core::Schema schema;
    schema.string("checkpoint", "", "Trained model to calibrate for int8 (rewritten with /quantization); required")
        .string("data.shards", "data/shards", "Folder with manifest.json and the shards (tessera tile's output)")
        .string_list("data.splits", {},
                     "Calibrate on the tiles of these splits, e.g. train or val (empty = every slide)")
        .integer("quantize.tiles", 512, "Tiles to calibrate on (fewer when the splits hold fewer)", 1, 1000000)
        .integer("quantize.batch_size", 32, "Tiles per forward pass", 1, 65536)
        .integer("quantize.threads", 0, "OpenMP threads (0 = the cores this process may use)", 0, 1024);
    return schema;
  }();
  return instance;
}

struct QuantizeOptions {
  JobOptions job;
};

int run_quantize(const QuantizeOptions& options) {
  const auto config = load_job(quantize_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  const std::string checkpoint = required_checkpoint(config);
  const std::string shards = config.get_string("data.shards");
  engine::Context::get().set_threads(static_cast<int>(config.get_int("quantize.threads")));

  engine::LoadedModel model = engine::load_model(checkpoint);
  if (!fs::is_directory(shards)) throw core::InputError("the shard folder does not exist", shards);
  const std::string manifest_path = (fs::path(shards) / "manifest.json").string();
  const io::Manifest manifest = io::read_manifest(manifest_path);
  const auto splits = config.get_string_list("data.splits");

  io::ShardDatasetOptions data_options;
  data_options.batch_size = static_cast<int>(config.get_int("quantize.batch_size"));
  data_options.shuffle = true;  // a sample over the slides; the fixed seed makes it the same every run
  data_options.seed = 1;
  data_options.drop_last = false;
  for (const auto& slide : manifest.slides) {
    if (splits.empty() || std::find(splits.begin(), splits.end(), slide.split) != splits.end()) {
      data_options.slides.insert(slide.id);
    }
  }
  if (data_options.slides.empty()) {
    throw core::ConfigError(fmt::format("no slide of {} is in the split(s) {}", shards, fmt::join(splits, ", ")),
                            config.source(), 0, "data.splits");
  }
  io::ShardDataset data(shards, data_options);
  engine::check_compatible(model, checkpoint, data, manifest_path);

  const std::int64_t tiles = std::min<std::int64_t>(config.get_int("quantize.tiles"), data.total_tiles());
  const engine::ActivationRanges ranges = engine::calibrate(model, data, tiles, shards);

  if (core::Comm::world().is_root()) {
    // Everything as it was (the replicas in files of their own stay where they are, named by the index) plus the
    // ranges; written under a temporary name and renamed (io/checkpoint.h).
    // Replicas in files of their own are neither read nor needed (a checkpoint copied without them calibrates too);
    // replicas inside the file are read, to be written back.
    io::Checkpoint file = io::read_checkpoint(checkpoint, io::ReplicaRead::skip);
    if (file.replica_files.empty()) file = io::read_checkpoint(checkpoint);
    file.quantization = engine::calibration_tensors(ranges);
    io::write_checkpoint(checkpoint, file);
    spdlog::info("calibrated {} activations of {} on {} tiles of {} (max method); wrote /quantization into {}",
                 ranges.size(), model.meta.architecture, tiles, shards, checkpoint);
  }
  return core::exit_ok;
}

}  // namespace

Action setup_quantize(CLI::App& command) {
  auto options = std::make_shared<QuantizeOptions>();
  add_job_options(command, options->job);
  add_key_flag(command, options->job, "-c,--checkpoint", {"checkpoint"},
               "Trained model, e.g. runs/train/checkpoint.h5; rewritten with the calibration (checkpoint)");
  add_key_flag(command, options->job, "--shards", {"data.shards"}, "Shard folder (data.shards)");
  add_key_flag(command, options->job, "--splits", {"data.splits"},
               "Comma-separated splits to calibrate on, e.g. val (data.splits; default: every slide)", FlagForm::list);
  add_key_flag(command, options->job, "--tiles", {"quantize.tiles"}, "Tiles to calibrate on (quantize.tiles)");
  add_key_flag(command, options->job, "--batch", {"quantize.batch_size"},
               "Tiles per forward pass (quantize.batch_size)");
  add_key_flag(command, options->job, "--threads", {"quantize.threads"},
               "OpenMP threads, 0 = all cores (quantize.threads)");
  command.footer(
      "Records the range of every activation the int8 model quantizes (the largest |value| over the tiles) and "
      "stores them in the checkpoint under /quantization, so that infer and predict --precision int8 can run.");
  return [options] { return run_quantize(*options); };
}

}  // namespace tessera::app
