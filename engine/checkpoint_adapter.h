// Between the engine's parameters (engine/parameters.h) and checkpoint files (io/checkpoint.h).
//
// Both sides already speak PyTorch names and layouts, so the conversion is a copy by name: a Param's `value`
// (plain float32, C order over `shape`) is the checkpoint tensor's `data`. The io layer knows nothing of the
// engine; these functions are the only place the two meet.
//
//   write:  store_checkpoint_tensors(params, buffers, checkpoint);
//           checkpoint.optimizer = to_checkpoint_state(optimizer.name(), step, optimizer.state(), params);
//           io::write_checkpoint(path, checkpoint);
//   read:   auto checkpoint = io::read_checkpoint(path, checkpoint_layout(params, buffers));
//           load_checkpoint_tensors(checkpoint, params, buffers);
//           optimizer.load_state(from_checkpoint_state(checkpoint.optimizer), params, path);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/optim/optimizer.h"
#include "engine/parameters.h"
#include "io/checkpoint.h"

namespace tessera::engine {

// The names and shapes of the model's parameters and buffers in the model's order: what a checked read of a
// checkpoint for this model expects (and the order in which it names the first bad tensor).
io::CheckpointLayout checkpoint_layout(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers);

// Copies every parameter value and buffer into checkpoint.params / checkpoint.buffers (replacing those maps).
// InternalError when two tensors share a name or a value does not have its shape's size.
void store_checkpoint_tensors(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                              io::Checkpoint& checkpoint);

// Copies the checkpoint's tensors into the parameter values and buffers. Every one must be in the checkpoint
// with its shape, which io::read_checkpoint(path, checkpoint_layout(...)) has already made sure of; otherwise
// InternalError naming the tensor (and nothing is changed).
void load_checkpoint_tensors(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                             const std::vector<Buffer*>& buffers);

// Optimizer state: the engine's flat "<slot>/<param name>" vectors become /optimizer/<slot>/<param name> tensors
// shaped like their parameter. InternalError when a key names no parameter or a size does not match.
io::OptimizerState to_checkpoint_state(const std::string& name, std::int64_t step, const OptimizerState& state,
                                       const std::vector<Param*>& params);
// And back (the optimizer's load_state checks the result against the model).
OptimizerState from_checkpoint_state(const io::OptimizerState& state);

// The EASGD centre variable, one vector per parameter in `params` order, as /easgd/center tensors and back.
// InternalError when the counts or sizes do not match the parameters, or (reading) a parameter is missing.
io::TensorMap to_checkpoint_center(const std::vector<std::vector<float>>& center, const std::vector<Param*>& params);
std::vector<std::vector<float>> from_checkpoint_center(const io::TensorMap& center, const std::vector<Param*>& params);
// The centre's buffers (its batch-norm running statistics as the exchanges go on from them), one vector per buffer
// in `buffers` order, as /easgd/center_buffers tensors and back; the same checks against the buffers.
io::TensorMap to_checkpoint_center_buffers(const std::vector<std::vector<float>>& values,
                                           const std::vector<Buffer*>& buffers);
std::vector<std::vector<float>> from_checkpoint_center_buffers(const io::TensorMap& tensors,
                                                               const std::vector<Buffer*>& buffers);

// A replica read from a checkpoint (already checked against the model's layout) into the model's values; returns
// its optimizer state for the optimizer's load_state.
OptimizerState load_checkpoint_replica(const io::Replica& replica, const std::vector<Param*>& params,
                                       const std::vector<Buffer*>& buffers);

}  // namespace tessera::engine
