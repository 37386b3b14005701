// Training from given weights (`model.init_from`): a model fine-tuned on a group's own slides starts from a
// checkpoint instead of random weights.
//
// The source is a Tessera checkpoint: one written by `tessera train`, or a PyTorch state dict converted by
// `scripts/torch_checkpoint.py export --arch A --state-dict model.pt OUT.h5` (reading PyTorch's pickled files here
// would need libtorch; the script uses Debian's python3-torch). Its architecture must be the job's, and so must its
// size (/meta width, classifier_width against model.width, model.classifier_width; absent: the default). Every
// parameter and buffer is taken by name and shape, except the classifier head — the model's last layer — when its shape
// differs (another class count): it keeps the job's seeded initialisation, as fine-tuning replaces a head. Any other
// missing or differently shaped tensor is a core::InputError naming the file and the tensor, and the model is left as
// it was. Only weights are taken: the optimizer, the schedule and the step start afresh (resuming is `train.resume`).
#pragma once

#include <string>
#include <vector>

#include "engine/models/model.h"
#include "engine/parameters.h"

namespace tessera::engine {

struct InitFrom {
  std::string architecture;           // the checkpoint's
  int tensors = 0;                    // parameters and buffers taken from it
  std::vector<std::string> replaced;  // the head's tensors kept as initialised ("fc.weight [2, 512] vs [5, 512]")
};

// Loads `path` into `params` and `buffers` of the job's model, built from `job` (every rank reads the same file).
InitFrom init_from_checkpoint(const std::string& path, const ModelOptions& job, const std::vector<Param*>& params,
                              const std::vector<Buffer*>& buffers);

}  // namespace tessera::engine
