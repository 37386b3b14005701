// Models from checkpoints for the tests that compare Tessera's outputs with PyTorch's (test_models.cpp and
// test_torch_models.cpp): the documented fixed input of scripts/torch_checkpoint.py, and a checkpoint's model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint_adapter.h"
#include "engine/models/registry.h"
#include "io/checkpoint.h"

namespace tessera::engine::testing {

// The fixture's input, reproducible without torch: x[i] = float32(((i · 2654435761) mod 2³²) / 2³¹ − 1).
inline std::vector<float> fixture_input(std::size_t count) {
  std::vector<float> x(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t k = (static_cast<std::uint64_t>(i) * 2654435761ULL) % 4294967296ULL;
    x[i] = static_cast<float>(static_cast<double>(k) / 2147483648.0 - 1.0);
  }
  return x;
}

// Builds the checkpoint's architecture (and size) from its /meta and loads its tensors through the checkpoint adapter.
inline std::unique_ptr<Model> load_model(const std::string& path) {
  auto model = make_model(checkpoint_model_options(io::read_checkpoint_meta(path)));
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  model->collect(params, buffers);
  load_checkpoint_tensors(io::read_checkpoint(path, checkpoint_layout(params, buffers)), params, buffers);
  return model;
}

}  // namespace tessera::engine::testing
