#include "engine/batchnorm_recalibration.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/layers/batchnorm.h"

namespace tessera::engine {

int recalibrate_batch_norm(Model& model, std::int64_t batches, const std::function<const Tensor&(std::int64_t)>& input,
                           const core::Comm& comm) {
  if (batches < 1) throw core::InternalError(fmt::format("batch-norm recalibration over {} batches", batches));
  const std::vector<BatchNorm2d*> norms = model.batch_norms();
  if (norms.empty()) return 0;

  std::vector<float> momenta;
  for (const auto* bn : norms) momenta.push_back(bn->options().momentum);
  const Mode mode = model.mode();
  struct Restore {
    Model& model;
    const std::vector<BatchNorm2d*>& norms;
    const std::vector<float>& momenta;
    Mode mode;
    ~Restore() {
      model.set_mode(mode);
      for (std::size_t i = 0; i < norms.size(); ++i) norms[i]->set_momentum(momenta[i]);
    }
  } restore{model, norms, momenta, mode};

  model.set_mode(Mode::eval);
  for (auto* bn : norms) bn->set_mode(Mode::train);
  for (std::int64_t k = 0; k < batches; ++k) {
    const float momentum = 1.0f / static_cast<float>(k + 1);  // the plain mean of the batches so far
    for (auto* bn : norms) bn->set_momentum(momentum);
    model.forward(input(k));
  }

  // The mean over the ranks, in one allreduce.
  std::vector<float> flat;
  for (const auto* bn : norms) {
    flat.insert(flat.end(), bn->running_mean().value.begin(), bn->running_mean().value.end());
    flat.insert(flat.end(), bn->running_var().value.begin(), bn->running_var().value.end());
  }
  if (comm.size() > 1) {
    comm.allreduce(flat.data(), flat.size(), core::ReduceOp::sum);
    const float ranks = static_cast<float>(comm.size());
    for (auto& v : flat) v /= ranks;
  }
  auto at = flat.begin();
  for (auto* bn : norms) {
    for (auto* values : {&bn->running_mean().value, &bn->running_var().value}) {
      std::copy_n(at, values->size(), values->begin());
      at += static_cast<std::ptrdiff_t>(values->size());
    }
  }
  return static_cast<int>(norms.size());
}

}  // namespace tessera::engine
