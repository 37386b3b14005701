#include "engine/train_step.h"

#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/optim/optimizer.h"
#include "engine/strategy.h"

namespace tessera::engine {

double train_step(Strategy* strategy, const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                  std::int64_t step, std::int64_t micro_batches, const StepWork& work) {
  if (work.zero_gradients) Optimizer::zero_grad(params);
  double loss = 0.0;
  for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
    const double micro_loss = work.forward(micro);
    if (!std::isfinite(micro_loss)) {
      throw core::InternalError(fmt::format("the training loss is {} at step {}: lower optimizer.lr or check the data",
                                            micro_loss, step + 1));
    }
    loss += micro_loss / static_cast<double>(micro_batches);
    if (strategy != nullptr) strategy->before_backward(micro + 1 == micro_batches);
    work.backward();
  }
  if (strategy != nullptr) strategy->reduce_gradients(params);
  work.update();
  if (strategy != nullptr) strategy->after_update(params, buffers, step + 1);
  return loss;
}

}  // namespace tessera::engine
