// `tessera train [job.yaml]`: trains a tumour/normal patch classifier on tile shards (engine/trainer.h).
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "app/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/output_dir.h"
#include "engine/models/registry.h"
#include "engine/trainer.h"

namespace tessera::app {
namespace {

struct TrainOptions {
  JobOptions job;
  std::string out;
  std::string shards;
  std::string resume;
};

int run_train(const TrainOptions& options) {
  std::vector<std::string> overrides;
  if (!options.out.empty()) overrides.push_back("output=" + options.out);
  if (!options.shards.empty()) overrides.push_back("data.shards=" + options.shards);
  if (!options.resume.empty()) overrides.push_back("train.resume=" + options.resume);
  const auto config = load_job(engine::train_schema(), options.job, overrides);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  const auto& world = core::Comm::world();
  // Held to the end of the job: no other job writes this folder meanwhile (core/output_dir.h).
  const core::OutputLock lock = core::lock_output_folder(world, config.get_string("output"), "train");
  const auto result = engine::train(config, world);
  if (world.is_root()) {
    spdlog::info("trained {} steps ({} epochs) in {:.1f} s, {:.1f} images/s; validation AUC {:.3f}; checkpoint {}",
                 result.steps, result.epochs, result.seconds, result.images_per_second, result.final_val_auc,
                 result.checkpoint);
  }
  return core::exit_ok;
}

}  // namespace

Action setup_train(CLI::App& command) {
  auto options = std::make_shared<TrainOptions>();
  add_job_options(command, options->job);
  command.add_option("-o,--out", options->out, "Output folder (same as --set output=...)");
  command.add_option("--shards", options->shards, "Shard folder (same as --set data.shards=...)");
  command.add_option("--resume", options->resume,
                     "Resume from a checkpoint, or 'auto' for the output folder's latest (train.resume)");
  add_key_flag(command, options->job, "--epochs", {"train.epochs"}, "Epochs (same as --set train.epochs=...)");
  command.footer(fmt::format("Models: {}. Runs the same under mpirun/srun (one replica per rank).",
                             fmt::join(engine::model_names(), ", ")));
  return [options] { return run_train(*options); };
}

}  // namespace tessera::app
