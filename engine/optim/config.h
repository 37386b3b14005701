// The `optimizer:` and `schedule:` sections of a training job, and the objects built from them.
//
//   optimizer:                       schedule:
//     name: lars          # sgd|lars   name: poly              # constant|step|cosine|poly
//     lr: 0.1             # at ref.    reference_batch: 256    # lr · update batch / 256 (0 = as given)
//     momentum: 0.9                    warmup_epochs: 5
//     nesterov: false                  warmup_start_factor: 0.1
//     weight_decay: 5.0e-5             milestones: [30, 60, 80]  # step
//     lars:                            gamma: 0.1                # step
//       trust_coefficient: 0.001       power: 2                  # poly
//       epsilon: 1.0e-9                min_lr: 0                 # cosine, poly
//
// The verb that trains adds these keys to its schema with declare_optim_keys and, once the data, the rank count and
// the strategy fix the batches and the steps per epoch, builds the optimizer and schedule from the loaded config.
// The rate is scaled for the batch one update of a replica averages over (TrainingShape::update_batch), not the
// global batch: under easgd each replica steps on its own rank's batch, and a rate scaled for all ranks' would
// grow with the rank count. Warmup and decay count optimizer steps, and LARS scales this rate per layer.
// Every inconsistency the schema's ranges cannot catch (Nesterov without momentum, a warmup longer than training,
// unordered milestones, a floor above the peak) is a ConfigError naming the key and the config's file.
#pragma once

#include <cstdint>
#include <memory>

#include "core/config.h"
#include "engine/optim/optimizer.h"
#include "engine/optim/schedule.h"

namespace tessera::engine {

// Adds the optimizer.* and schedule.* keys with their defaults, ranges and docs; returns `schema`.
core::Schema& declare_optim_keys(core::Schema& schema);

// What the training run contributes to the schedule.
struct TrainingShape {
  std::int64_t global_batch = 1;     // samples per step over all ranks (throughput)
  std::int64_t update_batch = 1;     // samples one update of a replica averages over: what the rate is scaled for
                                     // (allreduce: the global batch; easgd: one rank's; Strategy::ranks_per_update)
  std::int64_t steps_per_epoch = 1;  // optimizer steps per epoch
  std::int64_t total_steps = 1;      // optimizer steps of the whole run
};

OptimizerOptions optimizer_options(const core::Config& config);
std::unique_ptr<Optimizer> build_optimizer(const core::Config& config);

// Milestones parsed, warmup epochs turned into steps (rounded), optimizer.lr linearly scaled.
ScheduleOptions schedule_options(const core::Config& config, const TrainingShape& shape);
std::unique_ptr<Schedule> build_schedule(const core::Config& config, const TrainingShape& shape);

}  // namespace tessera::engine
