#include "engine/inference.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "engine/models/registry.h"
#include "preprocessing/stain_norm.h"

namespace tessera::engine {

namespace {

// A stable per-tile index for the augmentation's generator: the same tile gets the same draws whichever rank,
// batch or thread handles it.
std::int64_t tile_key(const std::string& slide, std::int64_t x, std::int64_t y) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  for (unsigned char c : slide) mix(c);
  mix(static_cast<std::uint64_t>(x));
  mix(static_cast<std::uint64_t>(y));
  return static_cast<std::int64_t>(h >> 1);
}

std::size_t augmenter_count() { return static_cast<std::size_t>(std::max(1, omp_get_max_threads())); }

}  // namespace

InputBuilder::InputBuilder()
    : augment_(false), augmenters_(augmenter_count(), prep::Augmenter(prep::AugmentOptions{})) {}

InputBuilder::InputBuilder(const prep::AugmentOptions& options)
    : augment_(true), augmenters_(augmenter_count(), prep::Augmenter(options)) {}

void InputBuilder::build(const io::Batch& batch, std::uint64_t seed, std::int64_t epoch, Tensor& input) {
  const int t = batch.tile_size;
  const dims_t dims = {batch.size, 3, t, t};
  if (input.empty() || input.dims() != dims) input = Tensor::plain(dims);
  float* out = input.data();
  const std::size_t plane = static_cast<std::size_t>(t) * static_cast<std::size_t>(t);
  const prep::ChannelNormalization normalization;
  // One augmenter per thread of the team below (the thread count may have grown since construction).
  if (augmenters_.size() < augmenter_count()) augmenters_.resize(augmenter_count(), augmenters_.front());
#pragma omp parallel for schedule(static)
  for (int i = 0; i < batch.size; ++i) {
    auto& augmenter = augmenters_[static_cast<std::size_t>(omp_get_thread_num()) % augmenters_.size()];
    const auto k = static_cast<std::size_t>(i);
    const cv::Mat tile(t, t, CV_8UC3, const_cast<std::uint8_t*>(batch.images.data()) + k * plane * 3);
    prep::TileAugmentation a;  // identity
    if (augment_)
      a = augmenter.draw(seed, epoch, tile_key(batch.slide_ids[k], batch.coords[2 * k], batch.coords[2 * k + 1]));
    augmenter.apply(a, tile, out + k * plane * 3, normalization);
  }
}

const Tensor& TileScorer::logits(const io::Batch& batch) {
  inputs_.build(batch, input_);
  return model_.forward(input_);
}

const std::vector<float>& TileScorer::probabilities(const io::Batch& batch) { return softmax_.predict(logits(batch)); }

const std::vector<float>& TileScorer::probabilities(const io::Batch& batch, double& loss) {
  const Tensor& z = logits(batch);
  labels_.assign(batch.labels.begin(), batch.labels.end());
  loss = softmax_.forward(z, labels_);
  return softmax_.probabilities();
}

LoadedModel load_model(const std::string& checkpoint) {
  LoadedModel loaded;
  loaded.meta = io::read_checkpoint_meta(checkpoint);
  const auto& meta = loaded.meta;
  try {
    loaded.model = make_model(checkpoint_model_options(meta));  // the size /meta records, or the default
  } catch (const core::Error& e) {
    // An unknown architecture or an impossible input size is the file's fault here, not the job's.
    if (e.kind() != core::ErrorKind::config) throw;
    throw core::InputError(fmt::format("/meta describes a model this program cannot build: {}", e.message()),
                           checkpoint);
  }
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  loaded.model->collect(params, buffers);
  // The model alone: a run's replicas (in the file, or in files beside it) are for resuming it, not for inference.
  const io::Checkpoint file =
      io::read_checkpoint(checkpoint, checkpoint_layout(params, buffers), io::ReplicaRead::skip);
  load_checkpoint_tensors(file, params, buffers);
  for (const auto& [name, tensor] : file.quantization) {
    const bool pair = tensor.shape == std::vector<std::int64_t>{2} && tensor.data.size() == 2;
    if (!pair || !std::isfinite(tensor.data[0]) || !std::isfinite(tensor.data[1]) || tensor.data[0] > tensor.data[1]) {
      throw core::InputError(fmt::format("tensor '{}' in /quantization is not a range [min, max] of finite numbers "
                                         "(shape {}); calibrate again with tessera quantize",
                                         name, io::describe_shape(tensor.shape)),
                             checkpoint);
    }
    loaded.calibration[name] = ValueRange{tensor.data[0], tensor.data[1], true};
  }

  const auto& names = meta.class_names;
  const auto tumour =
      std::find_if(names.begin(), names.end(), [](const std::string& n) { return n == "tumor" || n == "tumour"; });
  if (tumour != names.end()) {
    loaded.positive_class = static_cast<int>(tumour - names.begin());
  } else if (meta.num_classes == 2) {
    loaded.positive_class = 1;
  } else {
    throw core::InputError(
        fmt::format("the model has {} classes ({}) and none is 'tumor'", meta.num_classes, fmt::join(names, ", ")),
        checkpoint);
  }
  loaded.model->fold_batchnorm();
  return loaded;
}

Precision use_precision(LoadedModel& loaded, const std::string& checkpoint, Precision requested) {
  if (requested == Precision::int8) {
    if (loaded.calibration.empty()) {
      throw core::InputError(fmt::format("int8 needs a calibration and the checkpoint has none (no /quantization): "
                                         "run tessera quantize --checkpoint {} --shards <shard folder> first",
                                         checkpoint),
                             checkpoint);
    }
    for (const std::string& name : calibration_points(*loaded.model)) {
      if (loaded.calibration.count(name) == 0) {
        throw core::InputError(fmt::format("/quantization has no range for '{}' (calibrated for another model?): "
                                           "run tessera quantize again",
                                           name),
                               checkpoint);
      }
    }
  }
  return use_precision(*loaded.model, requested, &loaded.calibration);
}

ActivationRanges calibrate(LoadedModel& loaded, io::ShardDataset& data, std::int64_t tiles, const std::string& folder) {
  Calibrator calibrator(*loaded.model);
  TileScorer scorer(*loaded.model);
  io::Batch batch;
  std::int64_t seen = 0;
  data.start_epoch(0);
  while (seen < tiles && data.next(batch)) {
    if (batch.size > tiles - seen) {
      // Only the tiles asked for: the batch cut to the rest.
      const auto keep = static_cast<std::size_t>(tiles - seen);
      const std::size_t per_tile = batch.images.size() / static_cast<std::size_t>(batch.size);
      batch.images.resize(keep * per_tile);
      batch.labels.resize(keep);
      batch.size = static_cast<int>(keep);
    }
    (void)scorer.probabilities(batch);
    seen += batch.size;
  }
  if (seen == 0) throw core::InputError("no tile to calibrate on", folder);
  return calibrator.ranges();
}

io::TensorMap calibration_tensors(const ActivationRanges& ranges) {
  io::TensorMap tensors;
  for (const auto& [name, range] : ranges) tensors[name] = io::CheckpointTensor{{2}, {range.min, range.max}};
  return tensors;
}

std::string TilePredictions::pack() const {
  const std::uint64_t n = size();
  std::string bytes(sizeof n, '\0');
  std::memcpy(bytes.data(), &n, sizeof n);
  bytes.append(reinterpret_cast<const char*>(slide.data()), n * sizeof(std::uint32_t));
  bytes.append(reinterpret_cast<const char*>(xy.data()), 2 * n * sizeof(std::int64_t));
  bytes.append(reinterpret_cast<const char*>(label.data()), n);
  bytes.append(reinterpret_cast<const char*>(p_tumor.data()), n * sizeof(float));
  return bytes;
}

void TilePredictions::append_packed(const std::string& bytes) {
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), sizeof n);
  const char* at = bytes.data() + sizeof n;
  auto take = [&](auto& values, std::size_t count) {
    using T = typename std::decay_t<decltype(values)>::value_type;
    const std::size_t first = values.size();
    values.resize(first + count);
    if (count > 0) std::memcpy(values.data() + first, at, count * sizeof(T));
    at += count * sizeof(T);
  };
  take(slide, n);
  take(xy, 2 * n);
  take(label, n);
  take(p_tumor, n);
}

// The shards must hold tiles the model was trained on: same size, resolution and stain normalisation.
void check_compatible(const LoadedModel& model, const std::string& checkpoint, const io::ShardDataset& data,
                      const std::string& manifest_path) {
  const auto& meta = model.meta;
  const auto& tiles = data.manifest().attributes;
  if (data.tile_size() != meta.input_size) {
    throw core::InputError(fmt::format("the tiles are {} px, the model in '{}' ({}) takes {} px", data.tile_size(),
                                       checkpoint, meta.architecture, meta.input_size),
                           manifest_path);
  }
  if (meta.mpp > 0 && tiles.mpp > 0 && std::fabs(meta.mpp - tiles.mpp) > 1e-6 * meta.mpp) {
    throw core::InputError(fmt::format("the tiles are at {:g} µm/px, the model in '{}' was trained at {:g} µm/px",
                                       tiles.mpp, checkpoint, meta.mpp),
                           manifest_path);
  }
  if (meta.stain_normalization != tiles.stain_normalization) {
    // The same target fitted per group on one side and tile by tile on the other maps a patient's tiles otherwise.
    const std::string suffix = prep::kPerGroupSuffix;
    const bool fit_differs = meta.stain_normalization + suffix == tiles.stain_normalization ||
                             tiles.stain_normalization + suffix == meta.stain_normalization;
    throw core::InputError(
        fmt::format("the tiles have stain normalization '{}', the model in '{}' was trained with '{}'{}",
                    tiles.stain_normalization, checkpoint, meta.stain_normalization,
                    fit_differs ? " (the same target, but one fitted once per group (patient) and the other tile by "
                                  "tile: import the tiles with the model's stain.fit)"
                                : ""),
        manifest_path);
  }
}

}  // namespace tessera::engine
