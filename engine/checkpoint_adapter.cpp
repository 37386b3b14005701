#include "engine/checkpoint_adapter.h"

#include <cstring>
#include <map>
#include <utility>

#include "core/error.h"

namespace tessera::engine {
namespace {

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

[[noreturn]] void fail(const std::string& message) { throw core::InternalError("checkpoint: " + message); }

io::CheckpointTensor make_tensor(const std::string& name, const std::vector<std::int64_t>& shape,
                                 const std::vector<float>& values) {
  if (static_cast<std::int64_t>(values.size()) != numel_of(shape)) {
    fail("tensor '" + name + "' has " + std::to_string(values.size()) + " values but shape " +
         io::describe_shape(shape) + " needs " + std::to_string(numel_of(shape)));
  }
  return {shape, values};
}

void insert_unique(io::TensorMap& map, const std::string& name, io::CheckpointTensor tensor) {
  if (!map.emplace(name, std::move(tensor)).second) fail("two tensors are named '" + name + "'");
}

const io::CheckpointTensor& find_tensor(const io::TensorMap& map, const char* group, const std::string& name,
                                        const std::vector<std::int64_t>& shape) {
  const auto it = map.find(name);
  if (it == map.end()) {
    fail("tensor '" + name + "' is missing from /" + group + " (read the checkpoint with checkpoint_layout())");
  }
  if (it->second.shape != shape || static_cast<std::int64_t>(it->second.data.size()) != numel_of(shape)) {
    fail("tensor '" + name + "' in /" + group + " has shape " + io::describe_shape(it->second.shape) +
         ", the model expects " + io::describe_shape(shape));
  }
  return it->second;
}

}  // namespace

io::CheckpointLayout checkpoint_layout(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  io::CheckpointLayout layout;
  layout.params.reserve(params.size());
  for (const Param* p : params) layout.params.push_back({p->name, p->shape});
  layout.buffers.reserve(buffers.size());
  for (const Buffer* b : buffers) layout.buffers.push_back({b->name, b->shape});
  return layout;
}

void store_checkpoint_tensors(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                              io::Checkpoint& checkpoint) {
  io::TensorMap stored_params;
  for (const Param* p : params) insert_unique(stored_params, p->name, make_tensor(p->name, p->shape, p->value));
  io::TensorMap stored_buffers;
  for (const Buffer* b : buffers) insert_unique(stored_buffers, b->name, make_tensor(b->name, b->shape, b->value));
  checkpoint.params = std::move(stored_params);
  checkpoint.buffers = std::move(stored_buffers);
}

void load_checkpoint_tensors(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                             const std::vector<Buffer*>& buffers) {
  // Everything is found and checked first, so a mismatch leaves the model as it was.
  std::vector<const io::CheckpointTensor*> param_sources;
  for (const Param* p : params) param_sources.push_back(&find_tensor(checkpoint.params, "params", p->name, p->shape));
  std::vector<const io::CheckpointTensor*> buffer_sources;
  for (const Buffer* b : buffers) {
    buffer_sources.push_back(&find_tensor(checkpoint.buffers, "buffers", b->name, b->shape));
  }
  for (std::size_t i = 0; i < params.size(); ++i) params[i]->value = param_sources[i]->data;
  for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i]->value = buffer_sources[i]->data;
}

io::OptimizerState to_checkpoint_state(const std::string& name, std::int64_t step, const OptimizerState& state,
                                       const std::vector<Param*>& params) {
  std::map<std::string, const Param*> by_name;
  for (const Param* p : params) by_name.emplace(p->name, p);
  io::OptimizerState result;
  result.name = name;
  result.step = step;
  for (const auto& [key, values] : state) {
    // Slot names have no '/', parameter names neither: the key is "<slot>/<param name>".
    const auto slash = key.find('/');
    if (slash == std::string::npos) fail("optimizer state key '" + key + "' is not '<slot>/<parameter>'");
    const std::string slot = key.substr(0, slash);
    const std::string param_name = key.substr(slash + 1);
    const auto it = by_name.find(param_name);
    if (it == by_name.end()) fail("optimizer state '" + key + "' is for no parameter of the model");
    insert_unique(result.slots[slot], param_name, make_tensor(key, it->second->shape, values));
  }
  return result;
}

OptimizerState from_checkpoint_state(const io::OptimizerState& state) {
  OptimizerState result;
  for (const auto& [slot, tensors] : state.slots) {
    for (const auto& [param_name, tensor] : tensors) result[state_key(slot, param_name)] = tensor.data;
  }
  return result;
}

namespace {

// One vector per tensor of `tensors` (parameters or buffers), in their order, as tensors of `group` named and shaped
// like them, and back.
template <class T>
io::TensorMap tensors_to_checkpoint(const char* group, const std::vector<std::vector<float>>& values,
                                    const std::vector<T*>& tensors) {
  if (values.size() != tensors.size()) {
    fail(std::string("/") + group + " has " + std::to_string(values.size()) + " tensors for " +
         std::to_string(tensors.size()) + " of the model");
  }
  io::TensorMap result;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    insert_unique(result, tensors[i]->name, make_tensor(tensors[i]->name, tensors[i]->shape, values[i]));
  }
  return result;
}

template <class T>
std::vector<std::vector<float>> tensors_from_checkpoint(const char* group, const io::TensorMap& map,
                                                        const std::vector<T*>& tensors) {
  std::vector<std::vector<float>> result;
  result.reserve(tensors.size());
  for (const T* t : tensors) result.push_back(find_tensor(map, group, t->name, t->shape).data);
  return result;
}

}  // namespace

io::TensorMap to_checkpoint_center(const std::vector<std::vector<float>>& center, const std::vector<Param*>& params) {
  return tensors_to_checkpoint("easgd/center", center, params);
}

std::vector<std::vector<float>> from_checkpoint_center(const io::TensorMap& center, const std::vector<Param*>& params) {
  return tensors_from_checkpoint("easgd/center", center, params);
}

io::TensorMap to_checkpoint_center_buffers(const std::vector<std::vector<float>>& values,
                                           const std::vector<Buffer*>& buffers) {
  return tensors_to_checkpoint("easgd/center_buffers", values, buffers);
}

std::vector<std::vector<float>> from_checkpoint_center_buffers(const io::TensorMap& tensors,
                                                               const std::vector<Buffer*>& buffers) {
  return tensors_from_checkpoint("easgd/center_buffers", tensors, buffers);
}

OptimizerState load_checkpoint_replica(const io::Replica& replica, const std::vector<Param*>& params,
                                       const std::vector<Buffer*>& buffers) {
  io::Checkpoint tensors;
  tensors.params = replica.params;
  tensors.buffers = replica.buffers;
  load_checkpoint_tensors(tensors, params, buffers);
  return from_checkpoint_state(replica.optimizer);
}

}  // namespace tessera::engine
