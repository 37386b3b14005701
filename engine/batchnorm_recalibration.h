// Batch-norm running statistics recomputed for a model's current weights.
//
// A model that is not itself trained, such as the EASGD centre (the elastic average of replicas: engine/strategy.h),
// carries running statistics that belong to other weights: the average of its replicas' statistics is not the
// statistics of its averaged weights once the replicas have moved apart (the average of their activation
// variances exceeds the variance of the averaged network's activations). Recalibration replaces them with its own:
//
//   for k = 1 .. n:  forward batch k with every batch norm in training mode (the rest in eval: no dropout),
//                    no backward, with momentum 1/k, so that after n batches
//                    running_mean = (1/n) Σ_k mean_k,   running_var = (1/n) Σ_k var_k · M/(M − 1)
//   then the mean of both over the ranks of `comm` (every rank passes n batches of the same size, and holds the
//   same weights: the result is the mean over all p·n batches, identical on every rank).
//
// The batch norms' momenta and the model's mode are restored afterwards, also when a forward pass throws.
#pragma once

#include <cstdint>
#include <functional>

#include "core/comm.h"
#include "engine/models/model.h"
#include "engine/tensor.h"

namespace tessera::engine {

// `input(k)` gives the k-th batch (k = 0 .. batches − 1) as the network input. Collective over `comm` (every rank
// must pass the same `batches`). Returns the number of batch-norm layers recalibrated (0: none, and nothing was
// run). InternalError when `batches` < 1.
int recalibrate_batch_norm(Model& model, std::int64_t batches, const std::function<const Tensor&(std::int64_t)>& input,
                           const core::Comm& comm);

}  // namespace tessera::engine
