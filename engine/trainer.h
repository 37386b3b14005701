// `tessera train`: trains a patch classifier on tile shards, on one process or many.
//
// train() reads top to bottom: data, model, loss, optimizer, schedule, strategy; resume (engine/train_state.h);
// then per step (engine/train_step.h): next batch (this rank's share of the shuffled epoch) → augment into the
// network input → forward → loss → backward → strategy.reduce_gradients → optimizer step at the schedule's rate →
// strategy.after_update → log; every `train.checkpoint_every` steps and at the end of every epoch a checkpoint
// (engine/train_state.h); at the end of every epoch a validation pass over the held-out slides (loss, accuracy,
// patch-level ROC AUC) and its metrics (engine/train_metrics.h).
//
// Outputs in `output`: checkpoint.h5 (the latest; also checkpoint-epoch-NNN.h5 per epoch), metrics.jsonl and
// metrics.csv (engine/train_metrics.h), train.config.yaml. Validation and checkpoints use the strategy's
// evaluation model (engine/strategy.h: the replica under allreduce, the EASGD centre under easgd).
//
// Determinism: the same job, seed and rank count give the same weights, bit for bit, and a run resumed from a
// checkpoint continues exactly as the uninterrupted run would have (the data order, the augmentation of every
// tile, the optimizer state and the step all come back; models with dropout draw their masks from (seed, step)).
// Under easgd the checkpoint carries every rank's replica, so a run resumed on as many ranks continues bit for bit
// too; on another rank count every replica restarts from the saved centre (strategy.h). async-easgd is not
// bit-reproducible (its ranks reach the centre in whatever order they run).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "core/comm.h"
#include "core/config.h"
#include "core/signals.h"

namespace tessera::engine {

// The train job's keys (data, model, train, optimizer, schedule, augment, distributed, output).
const core::Schema& train_schema();

struct TrainResult {
  std::int64_t steps = 0;           // optimizer steps taken in total (including those before a resume)
  std::int64_t steps_this_run = 0;  // 0: a resumed job that had nothing left to do
  std::int64_t epochs = 0;          // completed epochs
  // NaN when this run validated nothing (the validation set is empty, or nothing was left to train); the AUC also
  // when the validation set has one class.
  double final_val_auc = std::numeric_limits<double>::quiet_NaN();
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();
  double final_val_accuracy = std::numeric_limits<double>::quiet_NaN();
  double seconds = 0.0;            // this run's wall time
  double images_per_second = 0.0;  // training images per second over all ranks (this run)
  std::string checkpoint;          // the last checkpoint written
  // Not none: the run stopped early on this request (core/signals.h), at a step boundary every rank agreed on,
  // with `checkpoint` written there; a run with `train.resume: auto` goes on from it.
  core::StopRequest stopped = core::StopRequest::none;
};

// Runs the job. Collective: every rank calls it with the same config. Throws core::Error (InputError for bad
// shards or checkpoints, ConfigError for bad settings).
TrainResult train(const core::Config& config, const core::Comm& comm);

}  // namespace tessera::engine
