// Running a trained tile classifier: the network input of a batch of tiles, a model loaded from a checkpoint,
// and class probabilities per tile. `tessera train` (validation) and `tessera predict` both go through here, so
// a tile is normalised exactly the same way when it is validated and when it is predicted.
//
//   LoadedModel loaded = load_model("run/checkpoint.h5");    // eval mode, batch norm folded
//   TileScorer scorer(*loaded.model);
//   while (data.next(batch)) {
//     const std::vector<float>& p = scorer.probabilities(batch);   // N×K, row-major
//     ... p[i * K + loaded.positive_class] ...
//   }
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/layers/loss.h"
#include "engine/models/model.h"
#include "engine/precision.h"
#include "engine/tensor.h"
#include "io/checkpoint.h"
#include "io/shard_dataset.h"
#include "preprocessing/augment.h"

namespace tessera::engine {

// Turns a batch of uint8 RGB tiles (N×T×T×3) into the network's float input N×3×T×T: the per-channel
// normalisation of prep::ChannelNormalization (ImageNet statistics), after the training augmentation when
// `augment` is on. A tile's augmentation is drawn from (seed, epoch, slide id and position), so it is the same
// whichever rank, batch or thread handles the tile. Threads: OpenMP over the tiles of a batch.
class InputBuilder {
 public:
  // No augmentation: the input of validation and prediction.
  InputBuilder();
  // Training input, augmented with `options`.
  explicit InputBuilder(const prep::AugmentOptions& options);

  // (Re)allocates `input` when its shape differs from the batch's.
  void build(const io::Batch& batch, std::uint64_t seed, std::int64_t epoch, Tensor& input);
  void build(const io::Batch& batch, Tensor& input) { build(batch, 0, 0, input); }

 private:
  bool augment_;
  std::vector<prep::Augmenter> augmenters_;  // one per OpenMP thread
};

// Class probabilities of batches of tiles with a model in eval mode (unfolded while training, folded for
// prediction). Keeps its input tensor and softmax between calls.
class TileScorer {
 public:
  explicit TileScorer(Model& model) : model_(model) {}

  // P(class k | tile i) at [i · K + k]; valid until the next call. The model must be in eval mode.
  const std::vector<float>& probabilities(const io::Batch& batch);
  // The same, and the batch's mean cross-entropy against its labels (unweighted) in `loss`.
  const std::vector<float>& probabilities(const io::Batch& batch, double& loss);

 private:
  const Tensor& logits(const io::Batch& batch);

  Model& model_;
  InputBuilder inputs_;
  Tensor input_;
  SoftmaxCrossEntropy softmax_;
  std::vector<int> labels_;
};

// A classifier restored from a checkpoint, ready for inference.
struct LoadedModel {
  io::CheckpointMeta meta;
  std::unique_ptr<Model> model;  // eval mode, batch norm folded
  int positive_class = 1;        // the class whose probability is "p_tumor"
  ActivationRanges calibration;  // the checkpoint's /quantization (int8); empty when it has none
};

// Builds the model /meta names (architecture, input size, classes, width or classifier_width), reads the checkpoint
// against that model's tensors and folds batch norm. InputError naming the file when it is missing, truncated or not a
// checkpoint, when /meta describes a model make_model refuses (a size beyond kMaxModelWidth or kMaxClassifierWidth,
// before anything is allocated), when a tensor does not fit the architecture, when the classes have no tumour class
// (two classes: class 1 unless the names say otherwise), or when a /quantization range is not [min, max] of finite
// numbers.
LoadedModel load_model(const std::string& checkpoint);

// use_precision (engine/precision.h) with the checkpoint's calibration. int8 asked of a checkpoint without
// /quantization, or one that lacks a range this model needs, is an InputError naming `checkpoint` (which says to
// run `tessera quantize`), whether or not this CPU would then fall back to fp32.
Precision use_precision(LoadedModel& loaded, const std::string& checkpoint, Precision requested);

// int8 calibration: runs the folded fp32 model over the first `tiles` tiles of `data` (every tile when fewer)
// with a Calibrator attached and returns the ranges. InputError naming `data`'s folder when it yields no tile.
ActivationRanges calibrate(LoadedModel& loaded, io::ShardDataset& data, std::int64_t tiles, const std::string& folder);
// The ranges as /quantization tensors ([min, max] each).
io::TensorMap calibration_tensors(const ActivationRanges& ranges);

// Tile predictions of one rank (or, after a gather, of all), one entry per tile, and their byte form for the gather
// (pack on every rank, append_packed in rank order on rank 0: the rows come out in the same order on any rank count).
struct TilePredictions {
  std::vector<std::uint32_t> slide;  // index into the manifest's slides
  std::vector<std::int64_t> xy;      // x, y per tile
  std::vector<std::uint8_t> label;
  std::vector<float> p_tumor;

  std::size_t size() const { return label.size(); }

  std::string pack() const;
  void append_packed(const std::string& bytes);
};

// The shards must hold tiles the model was trained on: the same size, resolution and stain normalization; else
// InputError naming `manifest_path` and the checkpoint.
void check_compatible(const LoadedModel& model, const std::string& checkpoint, const io::ShardDataset& data,
                      const std::string& manifest_path);

}  // namespace tessera::engine
