// A training run's metrics: metrics.jsonl (one JSON object per line) and metrics.csv (one row per epoch) in the
// output folder, written by rank 0.
//
// metrics.jsonl lines, by "kind":
//   train   every `train.log_every` steps: epoch (1-based), step, lr, loss (mean over the window and the ranks),
//           images_per_s
//   timing  per epoch: the step time split into computation, the strategy's communication and waiting for other
//           ranks, per step, with the payload bytes a rank sent; means over the ranks, and every rank's own figures
//           under "ranks" (index = rank)
//   val     per epoch: loss, accuracy, patch-level ROC AUC, tiles
//   slurm   at the start of a run under Slurm (a requeued run adds its own): step, job_id, array_job_id,
//           array_task_id, nodelist, ntasks, restarts (io/provenance.h)
// Figures carry 6 significant digits, as metrics.csv, and are null when not finite (an AUC of one class).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/comm.h"
#include "engine/strategy.h"
#include "io/provenance.h"

namespace tessera::engine {

// The training steps of one epoch (this run): their wall time and the parts of it spent in the strategy's
// collectives moving data and waiting for the other ranks to arrive, per rank and as means over the ranks.
struct RankTiming {
  double seconds = 0.0;
  double comm_seconds = 0.0;
  double wait_seconds = 0.0;
  double comm_bytes = 0.0;  // payload this rank sent
};
struct StepTiming {
  std::int64_t steps = 0;
  RankTiming mean;
  std::vector<RankTiming> ranks;  // index = rank
};
// Collective: gathers every rank's figures of `steps` steps that took `elapsed` and `comm` of the strategy's time.
StepTiming step_timing(const core::Comm& comm, std::chrono::steady_clock::duration elapsed, std::int64_t steps,
                       const CommStats& comm_stats);

// An epoch's end, as metrics.jsonl's timing and val lines and metrics.csv's row report it.
struct EpochMetrics {
  std::int64_t epoch = 0;  // completed epochs
  std::int64_t step = 0;
  std::int64_t global_batch = 0;
  double lr = 0.0;
  double train_loss = 0.0;
  double val_loss = 0.0;  // NaN when there was no validation
  double val_accuracy = 0.0;
  double val_auc = 0.0;
  std::int64_t val_tiles = 0;
  double seconds = 0.0;  // since the run started
};

// Rank 0's writer. A failed append (a full disk) is an internal error naming the file, as every failed write of
// Tessera's own outputs is.
class MetricsLog {
 public:
  // A run from step 0 starts both files afresh; a resumed one keeps their lines up to `step` (the killed run had
  // logged later ones, which this run logs again), rewritten atomically.
  MetricsLog(std::filesystem::path folder, std::int64_t step);

  void train(std::int64_t epoch, std::int64_t step, double lr, double loss, double images_per_second) const;
  void epoch(const StepTiming& timing, const EpochMetrics& m) const;
  // The Slurm job of the run that starts at `step`.
  void slurm(std::int64_t step, const io::SlurmJob& job) const;

 private:
  std::filesystem::path jsonl_;
  std::filesystem::path csv_;
};

}  // namespace tessera::engine
