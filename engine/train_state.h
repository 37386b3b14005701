// A training run's checkpoints: what `tessera train` writes at its checkpoints and reads back to resume.
//
// A checkpoint (io/checkpoint.h; docs/ARCHITECTURE.md has the layout) holds the evaluation model's tensors, the
// job's description (meta: architecture, tile size, µm/px, tiling settings, the effective config), the optimizer
// and strategy state, the index of every rank's own replica file when the strategy keeps replicas apart (easgd), and
// the run's position under /state: the micro-batches each rank had taken of the current epoch, the tiles they make, the
// rank count, the seed. From these a resumed run continues exactly where the checkpointed one was (on the same rank
// count, bit for bit), or, on another rank count, after as many of the epoch's tiles.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/comm.h"
#include "engine/optim/optimizer.h"
#include "engine/parameters.h"
#include "io/checkpoint.h"

namespace tessera::engine {

class Strategy;

// Where a run is.
struct TrainPosition {
  std::int64_t step = 0;            // optimizer steps taken (all runs)
  std::int64_t epoch = 0;           // completed epochs
  std::int64_t batch_in_epoch = 0;  // micro-batches of the current epoch each rank has taken
};

// What is trained, and how a step is shaped: what a checkpoint is assembled from and restored into.
struct TrainState {
  const std::vector<Param*>& params;
  const std::vector<Buffer*>& buffers;
  Optimizer& optimizer;
  Strategy& strategy;
  int batch_size = 0;                  // per rank and micro-batch
  std::int64_t accumulation = 1;       // micro-batches per step
  std::int64_t batches_per_epoch = 0;  // micro-batches per epoch and rank
  std::uint64_t seed = 0;
};

// Writes `path` atomically: the one way a checkpoint is written (the epoch's end, train.checkpoint_every). Collective:
// the strategy settles (every rank then sees one evaluation model), every rank writes its own replica file when the
// strategy keeps replicas apart (in parallel, into a new set: io/checkpoint.h "Replica files"), and once all are in
// place rank 0 writes the evaluation model and `meta` (its step and epoch set from `at`) naming the set, then
// removes the sets it replaced. No rank holds more than its own replica (rank 0: and the model).
// `center_buffers`, when given (every buffer's values in order), are the evaluation model's /buffers instead of its
// own: the centre's batch-norm statistics recomputed for its weights, while the strategy's state keeps the live
// centre's (/easgd/center_buffers) for resuming.
void write_train_checkpoint(const std::string& path, const io::CheckpointMeta& meta, const TrainPosition& at,
                            const TrainState& state, const core::Comm& comm,
                            std::span<const float> center_buffers = {});

// Restores the run saved in `path` into `state` (tensors, optimizer, strategy) and returns its position in this
// run's terms. Every rank reads the shared part, and its own replica when the file has one per rank of this run.
// `job` is this job's meta: a checkpoint of another architecture, tile size or µm/px is an InputError naming the
// file (`shards` names the tiles in the message). Call before strategy.initialize(); then finish_resume().
struct Resumed {
  TrainPosition at;
  std::optional<io::Replica> own_replica;  // this rank's replica, when the file has one per rank of this run
  std::string config_yaml;                 // the checkpointed run's config (/meta)
};
Resumed resume_train_checkpoint(const std::string& path, const io::CheckpointMeta& job, const std::string& shards,
                                const TrainState& state, const core::Comm& comm);

// After strategy.initialize() made every replica the centre: this rank's own replica and optimizer state, when the
// checkpoint had them, take its place.
void finish_resume(Resumed& resumed, const std::string& path, const TrainState& state);

}  // namespace tessera::engine
