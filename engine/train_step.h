// One optimizer step, in the order every training loop of Tessera takes it: the trainer (engine/trainer.cpp), the
// communication benchmark (bench/comm.cpp) and the SMPI simulator (sim/simulate.cpp), whose calibrated stand-in
// for the computation is a delay of simulated time.
//
//   zero the gradients
//   for each of the step's micro-batches:  forward and loss → strategy.before_backward → backward
//   strategy.reduce_gradients → the optimizer's update → strategy.after_update
//
// The computation is the caller's (StepWork); the order and the collectives are here, so that what is measured,
// trained and simulated is one step.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/parameters.h"

namespace tessera::engine {

class Strategy;

struct StepWork {
  // Forward and loss of micro-batch `micro` (0-based) of the step; returns its loss. Layers keep what backward needs.
  std::function<double(std::int64_t micro)> forward;
  // Backward of the micro-batch just forwarded: layers add into the gradients, so micro-batches accumulate.
  std::function<void()> backward;
  // The optimizer's update of the reduced gradients.
  std::function<void()> update;
  // False for a caller whose gradients are only a payload (the simulator, whose calibrated delay already holds
  // the zeroing): they are not zeroed first.
  bool zero_gradients = true;
};

// Takes optimizer step `step` + 1 over `micro_batches` micro-batches; `strategy` may be null (one process, nothing
// to exchange). Returns the mean of the micro-batches' losses. A loss that is not finite throws core::InternalError
// before this rank's gradients reach any collective, so a failing rank takes the job down before a non-finite value
// can spread to the other replicas (or into a checkpoint).
double train_step(Strategy* strategy, const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                  std::int64_t step, std::int64_t micro_batches, const StepWork& work);

}  // namespace tessera::engine
