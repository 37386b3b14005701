#include "engine/init_from.h"

#include <fmt/format.h>

#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "engine/models/registry.h"
#include "io/checkpoint.h"

namespace tessera::engine {

InitFrom init_from_checkpoint(const std::string& path, const ModelOptions& job, const std::vector<Param*>& params,
                              const std::vector<Buffer*>& buffers) {
  const std::string& architecture = job.architecture;
  // The model alone: the replicas of an EASGD-type run (one per rank that wrote it) are not needed.
  const io::Checkpoint source = io::read_checkpoint(path, io::ReplicaRead::skip);
  if (source.meta.architecture != architecture) {
    throw core::InputError(fmt::format("holds a {} model, and the job trains a {} (model.architecture); give a "
                                       "checkpoint of the same architecture to model.init_from",
                                       source.meta.architecture, architecture),
                           path);
  }
  if (const std::string other = other_model_size(source.meta, job); !other.empty()) {
    throw core::InputError(
        fmt::format("holds {}; give a checkpoint of the same size to model.init_from, or train its size", other), path);
  }
  // The head: the model's last layer, whose parameters come last in the model's order (weight, then bias).
  std::size_t head_begin = params.size();
  if (!params.empty()) {
    const std::string layer = params.back()->name.substr(0, params.back()->name.rfind('.'));
    while (head_begin > 0 && params[head_begin - 1]->name.rfind(layer + ".", 0) == 0) --head_begin;
  }
  // What is loaded: the checkpoint's tensor for each of the model's, or for the head (another shape) its own value.
  io::Checkpoint chosen;
  InitFrom result;
  result.architecture = source.meta.architecture;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Param& p = *params[i];
    const auto it = source.params.find(p.name);
    if (it == source.params.end()) {
      throw core::InputError(fmt::format("has no parameter '{}' of the job's {} model", p.name, architecture), path);
    }
    if (it->second.shape == p.shape) {
      chosen.params.emplace(p.name, it->second);
      ++result.tensors;
    } else if (i >= head_begin) {
      chosen.params.emplace(p.name, io::CheckpointTensor{p.shape, p.value});
      result.replaced.push_back(fmt::format("{} {} (the checkpoint's {})", p.name, io::describe_shape(p.shape),
                                            io::describe_shape(it->second.shape)));
    } else {
      throw core::InputError(fmt::format("parameter '{}' is {} there and {} in the job's model (only the classifier "
                                         "head may differ)",
                                         p.name, io::describe_shape(it->second.shape), io::describe_shape(p.shape)),
                             path);
    }
  }
  for (const Buffer* b : buffers) {
    const auto it = source.buffers.find(b->name);
    if (it == source.buffers.end() || it->second.shape != b->shape) {
      throw core::InputError(it == source.buffers.end()
                                 ? fmt::format("has no buffer '{}' of the job's {} model", b->name, architecture)
                                 : fmt::format("buffer '{}' is {} there and {} in the job's model", b->name,
                                               io::describe_shape(it->second.shape), io::describe_shape(b->shape)),
                             path);
    }
    chosen.buffers.emplace(b->name, it->second);
    ++result.tensors;
  }
  load_checkpoint_tensors(chosen, params, buffers);
  return result;
}

}  // namespace tessera::engine
