#include "engine/inference.h"

#include <omp.h>

#include <algorithm>
#include <cstddef>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "engine/models/registry.h"

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
  ModelOptions options;
  options.architecture = meta.architecture;
  options.input_size = static_cast<int>(meta.input_size);
  options.num_classes = static_cast<int>(meta.num_classes);
  try {
    loaded.model = make_model(options);
  } catch (const core::Error& e) {
    // An unknown architecture or an impossible input size is the file's fault here, not the job's.
    if (e.kind() != core::ErrorKind::config) throw;
    throw core::InputError(fmt::format("/meta describes a model this program cannot build: {}", e.message()),
                           checkpoint);
  }
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  loaded.model->collect(params, buffers);
  const io::Checkpoint file = io::read_checkpoint(checkpoint, checkpoint_layout(params, buffers));
  load_checkpoint_tensors(file, params, buffers);

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

}  // namespace tessera::engine
