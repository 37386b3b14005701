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
#include "core/signals.h"
#include "engine/models/registry.h"
#include "engine/trainer.h"

namespace tessera::app {
namespace {

struct TrainOptions {
  JobOptions job;
};

int run_train(const TrainOptions& options) {
  const auto config = load_job(engine::train_schema(), options.job);
  if (maybe_print_config(config, options.job)) return core::exit_ok;
  const auto& world = core::Comm::world();
  // Held to the end of the job: no other job writes this folder meanwhile (core/output_dir.h).
  const core::OutputLock lock = core::lock_output_folder(world, config.get_string("output"), "train");
  core::install_stop_handlers();  // SIGUSR1, SIGTERM: checkpoint at the next step and exit 75 (core/signals.h)
  const auto result = engine::train(config, world);
  if (result.stopped != core::StopRequest::none) return core::exit_interrupted;
  if (world.is_root() && result.steps_this_run == 0) {
    spdlog::info("nothing left to train: {} is at step {} ({} epochs) of this job", result.checkpoint, result.steps,
                 result.epochs);
  } else if (world.is_root()) {
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
  add_key_flag(command, options->job, "-o,--out", {"output"}, "Output folder (output)");
  add_key_flag(command, options->job, "--shards", {"data.shards"}, "Shard folder (data.shards)");
  add_key_flag(command, options->job, "--resume", {"train.resume"},
               "Resume from a checkpoint, or 'auto' for the output folder's latest (train.resume)");
  add_key_flag(command, options->job, "--epochs", {"train.epochs"}, "Epochs (train.epochs)");
  add_key_flag(command, options->job, "--precision", {"train.precision"},
               "fp32, or bf16 for the convolutions and linear layers where the CPU has AMX; weights, optimizer and "
               "checkpoints stay fp32 (train.precision)");
  command.footer(fmt::format("Models: {}. Runs the same under mpirun/srun (one replica per rank).",
                             fmt::join(engine::model_names(), ", ")));
  return [options] { return run_train(*options); };
}

}  // namespace tessera::app
