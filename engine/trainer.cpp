#include "engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/fault.h"
#include "core/metrics.h"
#include "core/progress.h"
#include "core/random.h"
#include "core/signals.h"
#include "engine/batchnorm_recalibration.h"
#include "engine/context.h"
#include "engine/inference.h"
#include "engine/init_from.h"
#include "engine/layers/loss.h"
#include "engine/models/registry.h"
#include "engine/optim/config.h"
#include "engine/precision.h"
#include "engine/strategy.h"
#include "engine/train_metrics.h"
#include "engine/train_state.h"
#include "engine/train_step.h"
#include "io/provenance.h"
#include "io/shard.h"
#include "io/shard_dataset.h"
#include "preprocessing/augment.h"

namespace tessera::engine {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

const core::Schema& train_schema() {
  // One schema for the life of the process: a Config keeps a reference to the schema it was read against.
  static const core::Schema instance = [] {
    const ModelOptions model;
    core::Schema schema;
    schema.string("output", "runs/train", "Folder for checkpoints, metrics.jsonl, metrics.csv and the effective config")
        .string("data.shards", "data/shards", "Folder with manifest.json and the shards (tessera tile's output)")
        .string_list("data.train_splits", {"train"}, "Slides whose split is one of these train the model")
        .string_list("data.val_splits", {"val"}, "Slides whose split is one of these validate it every epoch")
        .boolean("data.exclude_artefacts", false,
                 "Leave out the tiles a shard kept with quality control's excluded-artefact bit "
                 "(tile.artefact_tiles: keep); training and validation alike")
        .integer("data.block_size", 64, "Tiles per contiguous shard read", 1, 65536)
        .integer("data.shuffle_buffer", 2048, "Tiles in the shuffle buffer (memory: tiles x size^2 x 3 bytes)", 0,
                 10000000)
        .string("model.architecture", "compact", "Network (see tessera train --help for the list)")
        .integer("model.width", model.width,
                 "compact only: channels of its first stage (the five stages have 1, 2, 4, 8, 8 times as many); the "
                 "compute grows about as its square",
                 1, kMaxModelWidth)
        .integer("model.classifier_width", model.classifier_width,
                 "alexnet and vgg* only: hidden units of the classifier's two hidden linear layers (torchvision: 4096)",
                 1, kMaxClassifierWidth)
        .string(
            "model.init_from", "",
            "Start from this checkpoint's weights (same architecture and size; the classifier head is replaced when "
            "its class count differs; a PyTorch state dict: convert it with scripts/torch_checkpoint.py export)")
        .integer("train.epochs", 10, "Passes over the training tiles", 1, 100000)
        .integer("train.max_steps", 0, "Stop after this many optimizer steps (0 = epochs decide)", 0, 1000000000)
        .integer("train.batch_size", 64, "Tiles per micro-batch on each rank", 1, 65536)
        .integer("train.accumulation_steps", 1,
                 "Micro-batches whose gradients add up to one optimizer step: global batch = batch_size x ranks x this",
                 1, 65536)
        .integer("train.seed", 1, "Seed of the initial weights, the data order and the augmentation", 0, 9.0e15)
        .integer("train.threads", 0, "OpenMP threads per rank (0 = the cores this rank may use)", 0, 1024)
        .string("train.precision", "fp32",
                "Number format of the convolutions and linear layers: fp32, or bf16 where the CPU has AMX (else fp32, "
                "said once in the log); master weights, optimizer, batch-norm statistics, loss and checkpoints stay "
                "fp32",
                {"fp32", "bf16"})
        .string("train.class_weights", "balanced",
                "Loss weights per class: none, or balanced (inverse class frequency of the training tiles)",
                {"none", "balanced"})
        .integer("train.checkpoint_every", 0, "Also checkpoint every N steps (0 = at the end of every epoch only)", 0,
                 1000000000)
        .integer("train.log_every", 20, "Log the training loss every N steps", 1, 1000000)
        .string("train.resume", "",
                "Resume from this checkpoint; 'auto' = the output folder's checkpoint.h5 when it exists");
    declare_strategy_keys(schema);
    declare_optim_keys(schema);
    prep::declare_augment_schema(schema);
    return schema;
  }();
  return instance;
}

namespace {

constexpr int kClasses = 2;  // normal, tumour

std::set<std::string> slides_in_splits(const io::Manifest& manifest, const std::vector<std::string>& splits) {
  std::set<std::string> ids;
  for (const auto& s : manifest.slides) {
    if (std::find(splits.begin(), splits.end(), s.split) != splits.end()) ids.insert(s.id);
  }
  return ids;
}

// What the model is trained on, for the checkpoint (io/provenance.h): the training slides by the origin the
// manifest records (none in a manifest tiled before it did: unknown), and the shard folder.
io::TrainingProvenance training_provenance(const io::Manifest& manifest, const std::set<std::string>& training_slides,
                                           const std::string& shards) {
  io::TrainingProvenance p;
  p.shards = fs::absolute(shards).lexically_normal().string();
  for (const auto& s : manifest.slides) {
    if (!training_slides.contains(s.id)) continue;
    if (s.origin == io::slide_origin(true)) {
      ++p.synthetic_slides;
    } else if (s.origin == io::slide_origin(false)) {
      ++p.real_slides;
    } else {
      ++p.unknown_slides;
    }
  }
  return p;
}

// The job's model: model.width and model.classifier_width go to the architectures built with them (models/registry.h
// ModelSize). Either at a value other than its default for an architecture that is not built with it is a mistake
// (a train.config.yaml a run saved holds both at their defaults, and is read again as it was).
ModelOptions job_model(const core::Config& config, int input_size, std::uint64_t seed) {
  ModelOptions o;
  o.architecture = config.get_string("model.architecture");
  o.input_size = input_size;
  o.num_classes = kClasses;
  o.seed = seed;
  const ModelSize size = model_entry(o.architecture).size;
  const auto take = [&](const char* key, ModelSize used_by, int& field) {
    const std::int64_t value = config.get_int(key);
    if (size == used_by) {
      field = static_cast<int>(value);
    } else if (value != field) {
      std::vector<std::string> users;
      for (const auto& entry : model_registry()) {
        if (entry.size == used_by) users.emplace_back(entry.name);
      }
      throw core::ConfigError(fmt::format("{} is {}, but a {} is not built with it (only {}); leave it at {}", key,
                                          value, o.architecture, fmt::join(users, ", "), field),
                              config.source(), 0, key);
    }
  };
  take("model.width", ModelSize::width, o.width);
  take("model.classifier_width", ModelSize::classifier_width, o.classifier_width);
  return o;
}

// Validation on this rank's share of the held-out tiles; the scores are gathered on every rank.
// The input and the probabilities come from engine/inference.h, as in `tessera predict`.
core::BinaryEvaluation validate(Model& model, io::ShardDataset& data, TileScorer& scorer, const core::Comm& comm) {
  model.set_mode(Mode::eval);
  core::BinaryEvaluation local;
  data.start_epoch(0);
  io::Batch batch;
  while (data.next(batch)) {
    double batch_loss = 0.0;
    const auto& p = scorer.probabilities(batch, batch_loss);
    local.loss_sum += batch_loss * batch.size;  // unweighted classes in validation: the plain mean
    for (int i = 0; i < batch.size; ++i) {
      const float tumour = p[static_cast<std::size_t>(i) * kClasses + 1];
      local.scores.push_back(tumour);
      local.labels.push_back(batch.labels[static_cast<std::size_t>(i)]);
      local.correct += (tumour >= 0.5f) == (batch.labels[static_cast<std::size_t>(i)] != 0);
    }
    local.count += batch.size;
  }
  model.set_mode(Mode::train);
  // Gather everything (validation sets are small: a few bytes per tile).
  std::string mine(sizeof(double) + sizeof(std::int64_t) * 2, '\0');
  std::memcpy(mine.data(), &local.loss_sum, sizeof(double));
  std::memcpy(mine.data() + sizeof(double), &local.count, sizeof(std::int64_t));
  std::memcpy(mine.data() + sizeof(double) + sizeof(std::int64_t), &local.correct, sizeof(std::int64_t));
  mine.append(reinterpret_cast<const char*>(local.scores.data()), local.scores.size() * sizeof(float));
  mine.append(reinterpret_cast<const char*>(local.labels.data()), local.labels.size());
  core::BinaryEvaluation all;
  for (const auto& part : comm.allgather_bytes(mine)) {
    double loss_sum = 0;
    std::int64_t count = 0, correct = 0;
    std::memcpy(&loss_sum, part.data(), sizeof(double));
    std::memcpy(&count, part.data() + sizeof(double), sizeof(std::int64_t));
    std::memcpy(&correct, part.data() + sizeof(double) + sizeof(std::int64_t), sizeof(std::int64_t));
    all.loss_sum += loss_sum;
    all.count += count;
    all.correct += correct;
    const char* scores = part.data() + sizeof(double) + 2 * sizeof(std::int64_t);
    const auto n = static_cast<std::size_t>(count);
    const auto first = all.scores.size();
    all.scores.resize(first + n);
    if (n > 0) std::memcpy(all.scores.data() + first, scores, n * sizeof(float));
    all.labels.insert(all.labels.end(), scores + n * sizeof(float), scores + n * sizeof(float) + n);
  }
  return all;
}

// The precision a checkpointed run trained in, from its config (fp32 before train.precision existed); nullopt when
// this version's schema cannot read that config.
std::optional<std::string> trained_precision(const std::string& config_yaml, const std::string& path) {
  if (config_yaml.empty()) return std::nullopt;
  try {
    return core::Config::parse(train_schema(), config_yaml, path).get_string("train.precision");
  } catch (const core::ConfigError&) {
    return std::nullopt;
  }
}

}  // namespace

TrainResult train(const core::Config& config, const core::Comm& comm) {
  const auto t_start = clock_type::now();
  auto& context = Context::get();
  context.set_threads(static_cast<int>(config.get_int("train.threads")));

  const fs::path out = config.get_string("output");
  const std::string shards = config.get_string("data.shards");
  const auto seed = static_cast<std::uint64_t>(config.get_int("train.seed"));
  const int batch_size = static_cast<int>(config.get_int("train.batch_size"));
  const auto accumulation = config.get_int("train.accumulation_steps");

  // Data: training and validation slides by split; equal shares per rank.
  io::ShardDatasetOptions train_options;
  train_options.batch_size = batch_size;
  train_options.block_size = static_cast<int>(config.get_int("data.block_size"));
  train_options.shuffle_buffer = static_cast<int>(config.get_int("data.shuffle_buffer"));
  train_options.exclude_artefacts = config.get_bool("data.exclude_artefacts");
  train_options.seed = seed;
  train_options.rank = comm.rank();
  train_options.world_size = comm.size();
  const io::Manifest manifest = io::read_manifest((fs::path(shards) / "manifest.json").string());
  train_options.slides = slides_in_splits(manifest, config.get_string_list("data.train_splits"));
  if (train_options.slides.empty()) {
    throw core::ConfigError(fmt::format("no slide of {} is in a training split ({})", shards,
                                        fmt::join(config.get_string_list("data.train_splits"), ", ")),
                            config.source(), 0, "data.train_splits");
  }
  io::ShardDataset train_data(shards, train_options);
  if (train_data.batches_per_epoch() == 0) {
    throw core::ConfigError(fmt::format("{} training tiles cannot make one batch of {} per rank on {} rank(s)",
                                        train_data.total_tiles(), batch_size, comm.size()),
                            config.source(), 0, "train.batch_size");
  }
  io::ShardDatasetOptions val_options = train_options;
  val_options.shuffle = false;
  val_options.drop_last = false;
  val_options.slides = slides_in_splits(manifest, config.get_string_list("data.val_splits"));
  for (const auto& id : val_options.slides) {
    if (train_options.slides.contains(id)) {
      throw core::ConfigError(fmt::format("slide {} is in both a training and a validation split", id), config.source(),
                              0, "data.val_splits");
    }
  }
  std::unique_ptr<io::ShardDataset> val_data;
  if (!val_options.slides.empty()) val_data = std::make_unique<io::ShardDataset>(shards, val_options);

  // Model, loss, optimizer, schedule, strategy.
  const ModelOptions model_options = job_model(config, train_data.tile_size(), seed);
  auto model = make_model(model_options);
  // The precision this run trains in is what its config records (train.config.yaml, every checkpoint).
  const Precision precision =
      use_training_precision(*model, parse_precision(config.get_string("train.precision"), "train.precision"), comm);
  core::Config recorded = config;
  recorded.set_value("train.precision", to_string(precision), "train");
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  model->collect(params, buffers);

  std::vector<float> class_weights;
  if (config.get_string("train.class_weights") == "balanced") {
    std::int64_t normal = 0, tumour = 0;
    for (const auto& s : manifest.slides) {
      if (!train_options.slides.contains(s.id)) continue;
      normal += s.normal;
      tumour += s.tumour;
    }
    const double total = static_cast<double>(normal + tumour);
    if (normal > 0 && tumour > 0) {
      class_weights = {static_cast<float>(total / (2.0 * static_cast<double>(normal))),
                       static_cast<float>(total / (2.0 * static_cast<double>(tumour)))};
    }
  }
  SoftmaxCrossEntropy loss(class_weights);
  TileScorer val_scorer(*model);

  // An optimizer step takes `accumulation` micro-batches; an epoch's last micro-batches that cannot make a whole
  // step are left out (like a last partial batch).
  const std::int64_t batches_per_epoch = train_data.batches_per_epoch();
  const std::int64_t steps_per_epoch = batches_per_epoch / accumulation;
  if (steps_per_epoch == 0) {
    throw core::ConfigError(fmt::format("{} micro-batches per epoch and rank cannot make one step of {} accumulated "
                                        "micro-batches",
                                        batches_per_epoch, accumulation),
                            config.source(), 0, "train.accumulation_steps");
  }
  const auto epochs = config.get_int("train.epochs");
  std::int64_t total_steps = steps_per_epoch * epochs;
  if (config.get_int("train.max_steps") > 0) total_steps = std::min(total_steps, config.get_int("train.max_steps"));
  auto strategy = make_strategy(config.get_string("distributed.strategy"), comm, strategy_options(config));
  TrainingShape shape;
  shape.global_batch = static_cast<std::int64_t>(batch_size) * comm.size() * accumulation;
  shape.update_batch = static_cast<std::int64_t>(batch_size) * strategy->ranks_per_update() * accumulation;
  shape.steps_per_epoch = steps_per_epoch;
  shape.total_steps = total_steps;
  auto optimizer = build_optimizer(config);
  auto schedule = build_schedule(config, shape);

  // What every checkpoint says of the job, beside its tensors: enough for inference to find tissue and make tiles
  // as the tiling did.
  io::CheckpointMeta meta;
  describe_model(model_options, meta);
  meta.class_names = io::kLabelNames;
  meta.mpp = manifest.attributes.mpp;
  meta.stain_normalization = manifest.attributes.stain_normalization;
  meta.tissue = manifest.tissue;
  meta.provenance = training_provenance(manifest, train_options.slides, shards);
  meta.config_yaml = recorded.to_yaml();
  const auto slurm = io::slurm_job();  // the job this run is, traced into the checkpoint and metrics.jsonl
  meta.slurm = slurm;
  const TrainState state{.params = params,
                         .buffers = buffers,
                         .optimizer = *optimizer,
                         .strategy = *strategy,
                         .batch_size = batch_size,
                         .accumulation = accumulation,
                         .batches_per_epoch = batches_per_epoch,
                         .seed = seed};

  // Resume.
  TrainPosition at;
  std::optional<Resumed> resumed;
  std::string resume = config.get_string("train.resume");
  if (resume == "auto") resume = fs::exists(out / "checkpoint.h5") ? (out / "checkpoint.h5").string() : "";
  if (!resume.empty()) {
    resumed = resume_train_checkpoint(resume, meta, shards, state, comm);
    at = resumed->at;
    if (comm.is_root()) {
      const auto before = trained_precision(resumed->config_yaml, resume);
      if (before && *before != to_string(precision)) {
        spdlog::info("{} was trained in {} up to step {}: continuing in {}", resume, *before, at.step,
                     to_string(precision));
      }
    }
    // The steps left are this run's: on another rank count (or batch size) an epoch has another number of steps
    // than the checkpointed run's, whose steps `step` counts. On the same, this is the total computed above.
    const std::int64_t left = steps_per_epoch * (epochs - at.epoch) - at.batch_in_epoch / accumulation;
    total_steps = at.step + std::max<std::int64_t>(left, 0);
    if (config.get_int("train.max_steps") > 0) total_steps = std::min(total_steps, config.get_int("train.max_steps"));
    if (total_steps != shape.total_steps) {
      shape.total_steps = total_steps;
      schedule = build_schedule(config, shape);
    }
  }
  // Given weights (every rank reads the same file, so every rank fails alike); a resumed run has its own.
  if (const std::string& init_from = config.get_string("model.init_from"); !init_from.empty()) {
    if (resumed) {
      if (comm.is_root()) spdlog::info("model.init_from ({}) is not used: the run resumes from {}", init_from, resume);
    } else {
      const auto loaded = init_from_checkpoint(init_from, model_options, params, buffers);
      if (comm.is_root()) {
        spdlog::info("initial weights from {}: {} tensors{}", init_from, loaded.tensors,
                     loaded.replaced.empty() ? std::string()
                                             : fmt::format("; classifier head replaced (seeded initialisation): {}",
                                                           fmt::join(loaded.replaced, ", ")));
      }
    }
  }
  strategy->attach(*model);
  strategy->initialize(params, buffers);
  if (resumed) finish_resume(*resumed, resume, state);

  std::optional<MetricsLog> metrics;  // rank 0's
  if (comm.is_root()) {
    fs::create_directories(out);
    recorded.save((out / "train.config.yaml").string());
    metrics.emplace(out, at.step);
    if (slurm) {
      metrics->slurm(at.step, *slurm);
      spdlog::info("Slurm {}", io::describe(*slurm));
    }
    spdlog::info(
        "{}: {} parameters; {} training tiles ({} slides), {} validation slides; {} rank(s) x batch {}{} = "
        "global batch {}; {} steps per epoch; strategy {}; precision {}",
        model_options.architecture, model->parameter_count(), train_data.total_tiles(), train_options.slides.size(),
        val_options.slides.size(), comm.size(), batch_size,
        accumulation > 1 ? fmt::format(" x {} accumulated", accumulation) : "", shape.global_batch, steps_per_epoch,
        strategy->name(), to_string(precision));
    // The rate each replica steps with, and the batch it was scaled for: under easgd one rank's, not the global one.
    spdlog::info(
        "learning rate {:g} per update after warmup, scaled for the {} tiles one update averages ({}: {} "
        "rank(s) x batch {}{}; optimizer.lr {:g} at schedule.reference_batch {})",
        schedule_options(config, shape).base_lr, shape.update_batch, strategy->name(), strategy->ranks_per_update(),
        batch_size, accumulation > 1 ? fmt::format(" x {} accumulated", accumulation) : "",
        config.get_number("optimizer.lr"), config.get_int("schedule.reference_batch"));
    spdlog::info("training data: {}; tiles of {} px at {:g} µm/px, stain normalization {}",
                 io::describe(meta.provenance), meta.input_size, meta.mpp, meta.stain_normalization);
  }
  comm.barrier();

  // One step's computation (engine/train_step.h takes the step in its order, with the strategy's exchanges):
  // the next micro-batch of this rank's share, augmented into the network input; forward; loss; backward; the
  // optimizer's update at the schedule's rate.
  InputBuilder train_inputs(prep::augment_options_from_config(config));
  io::Batch batch;
  Tensor input;
  std::vector<int> labels;
  double last_lr = 0.0;
  const StepWork work{
      .forward =
          [&](std::int64_t micro) {
            if (!train_data.next(batch)) {
              throw core::InternalError(fmt::format("the training data ended after {} of {} micro-batches of epoch {}",
                                                    at.batch_in_epoch, batches_per_epoch, at.epoch + 1));
            }
            ++at.batch_in_epoch;
            train_inputs.build(batch, seed, at.epoch, input);
            labels.assign(batch.labels.begin(), batch.labels.end());
            // Dropout masks differ per micro-batch and per rank (rank 0's are a single process's).
            model->reseed(seed ^ (static_cast<std::uint64_t>(at.step) * core::golden_gamma) ^
                          (static_cast<std::uint64_t>(comm.rank()) * 0xD1B54A32D192ED03ull) ^
                          (static_cast<std::uint64_t>(micro) * 0x94D049BB133111EBull));
            // The mean over the step's micro-batches: each one's gradient counts 1/accumulation.
            return loss.forward(model->forward(input), labels, 1.0 / static_cast<double>(accumulation));
          },
      .backward = [&] { model->backward(loss.backward()); },
      .update =
          [&] {
            last_lr = schedule->lr(at.step);
            optimizer->step(params, last_lr);
          }};

  // A centre evaluated apart from the replicas (easgd, async-easgd, two-level with inter easgd; on one rank too) gets
  // batch-norm statistics of its own weights for every validation and every checkpoint: the elastic average of its
  // replicas' statistics is not that once the replicas have moved apart (engine/batchnorm_recalibration.h). The
  // tiles come from a reader of their own (the training data's order is the same with and without it), and are the
  // same ones every time (its epoch 0, augmented as in training epoch 0): the statistics are a function of the
  // centre's weights alone, so an unchanged centre validates and saves unchanged. At an epoch's end they also become
  // the live centre's (Strategy::set_center_buffers), which the next exchanges pull the replicas' towards; between
  // epochs (train.checkpoint_every, a stop, train.max_steps) they go into the checkpoint's /buffers and validation
  // only, so that writing a checkpoint changes nothing of the training, and the live centre's, saved with the
  // strategy's state (/easgd/center_buffers), let a resumed run continue bit for bit.
  const std::int64_t center_bn_tiles = config.get_int("distributed.center_bn_tiles");
  std::unique_ptr<io::ShardDataset> bn_data;
  std::int64_t bn_batches = 0;
  if (strategy->replicas_differ() && center_bn_tiles > 0 && !model->batch_norms().empty()) {
    io::ShardDatasetOptions bn_options = train_options;
    // Another order than the training data's, through the same shuffle buffer, so that a batch mixes slides as a
    // training batch does (a buffer of one batch would hold one or two blocks of one slide, and the mean of such
    // batches' variances misses the variance between slides).
    bn_options.seed = seed ^ 0x6A09E667F3BCC909ull;
    bn_options.prefetch_batches = 1;
    bn_data = std::make_unique<io::ShardDataset>(shards, bn_options);
    const std::int64_t per_pass = static_cast<std::int64_t>(batch_size) * comm.size();
    bn_batches = std::min((center_bn_tiles + per_pass - 1) / per_pass, bn_data->batches_per_epoch());
    if (comm.is_root()) {
      spdlog::info(
          "the centre's batch-norm statistics are recomputed for its weights before every validation and "
          "checkpoint: {} batch(es) of {} on each of {} rank(s), {} training tiles (distributed.center_bn_tiles {})",
          bn_batches, batch_size, comm.size(), bn_batches * per_pass, center_bn_tiles);
    }
  }
  std::size_t buffer_values = 0;
  for (const auto* b : buffers) buffer_values += b->value.size();
  // The centre's statistics for its weights now (collective; every buffer's values in order), and the step they were
  // recomputed at: the centre changes only in a step, so those of this step serve again (a checkpoint of
  // train.checkpoint_every at an epoch's last step, then the epoch's end).
  std::vector<float> center_statistics;
  std::int64_t center_statistics_step = -1;
  auto recompute_center_statistics = [&](bool live) {
    if (center_statistics_step != at.step) {
      const auto t_recompute = clock_type::now();
      strategy->settle(params, buffers);
      bn_data->start_epoch(0);
      io::Batch bn_batch;
      Tensor bn_input;
      center_statistics.assign(buffer_values, 0.0f);
      strategy->with_evaluation_model(params, buffers, [&] {
        recalibrate_batch_norm(
            *model, bn_batches,
            [&](std::int64_t) -> const Tensor& {
              if (!bn_data->next(bn_batch)) {
                throw core::InternalError(fmt::format("the training data ended before {} batches", bn_batches));
              }
              train_inputs.build(bn_batch, seed, 0, bn_input);
              return bn_input;
            },
            comm);
        pack_values({}, buffers, center_statistics.data());
      });
      center_statistics_step = at.step;
      if (comm.is_root()) {
        spdlog::debug("the centre's batch-norm statistics recomputed at step {} in {:.3f} s", at.step,
                      std::chrono::duration<double>(clock_type::now() - t_recompute).count());
      }
    }
    if (!live) return;
    strategy->with_evaluation_model(params, buffers, [&] {
      unpack_values(center_statistics.data(), {}, buffers);
      strategy->set_center_buffers(buffers);
    });
  };
  // Every checkpoint: with the centre's own statistics as its /buffers, recomputed unless they are this step's. With
  // `recompute` false (a SIGTERM stop: Slurm's SIGKILL follows within KillWait) and none of this step's, the live
  // centre's statistics are its /buffers instead, and the resumed run recomputes them at its next validation.
  auto write_checkpoint = [&](const fs::path& path, bool recompute = true) {
    if (bn_data && recompute && center_statistics_step != at.step) recompute_center_statistics(false);
    const bool center_statistics_now = bn_data && center_statistics_step == at.step;
    write_train_checkpoint(
        path.string(), meta, at, state, comm,
        center_statistics_now ? std::span<const float>(center_statistics) : std::span<const float>());
  };

  const auto log_every = config.get_int("train.log_every");
  const auto checkpoint_every = config.get_int("train.checkpoint_every");
  TrainResult result;
  const std::int64_t first_step = at.step;
  // Progress counts global steps: every rank takes each step together, so rank 0 alone advances it.
  core::Progress progress(comm, total_steps - at.step, {.label = "train", .unit = "steps"});
  double loss_window = 0.0;
  std::int64_t loss_window_steps = 0;
  double epoch_loss = 0.0;
  std::int64_t epoch_steps = 0;
  auto t_window = clock_type::now();
  model->set_mode(Mode::train);

  // A stop request (SIGUSR1 or SIGTERM, core/signals.h) is honoured at the next step boundary, agreed by every rank:
  // the checkpoint is written there and the run ends; `--resume auto` continues from that step.
  core::StopRequest stop = core::StopRequest::none;
  auto stop_here = [&](bool checkpoint_written) {
    stop = core::agree_stop(comm);
    if (stop == core::StopRequest::none) return false;
    const auto t_checkpoint = clock_type::now();
    // SIGTERM (the time limit, preemption) leaves seconds before SIGKILL: the checkpoint without the forward passes
    // that recompute the centre's statistics (distributed.center_bn_tiles tiles).
    if (!checkpoint_written) write_checkpoint(out / "checkpoint.h5", stop != core::StopRequest::now);
    if (comm.is_root()) {
      spdlog::warn(
          "{}: stopped at step {} (epoch {}, batch {} of it); checkpoint {} written in {:.2f} s; "
          "'--resume auto' goes on from here",
          core::signal_name(stop), at.step, at.epoch + 1, at.batch_in_epoch, (out / "checkpoint.h5").string(),
          std::chrono::duration<double>(clock_type::now() - t_checkpoint).count());
    }
    return true;
  };

  while (at.epoch < epochs && at.step < total_steps && stop == core::StopRequest::none) {
    train_data.start_epoch(at.epoch);
    // A resumed run skips the batches the checkpointed run had already taken in this epoch.
    for (std::int64_t b = 0; b < at.batch_in_epoch; ++b) {
      if (!train_data.next(batch)) break;
    }
    const auto t_steps = clock_type::now();
    const CommStats comm_before = strategy->stats();
    // batch_in_epoch counts micro-batches; a step takes `accumulation` of them.
    while (at.step < total_steps && at.batch_in_epoch + accumulation <= steps_per_epoch * accumulation) {
      const double step_loss = train_step(strategy.get(), params, buffers, at.step, accumulation, work);
      ++at.step;
      loss_window += step_loss;
      ++loss_window_steps;
      epoch_loss += step_loss;
      ++epoch_steps;
      if (comm.is_root()) progress.advance();
      if (at.step % log_every == 0 || at.step == total_steps) {
        const double mean =
            comm.allreduce_value(loss_window / static_cast<double>(loss_window_steps), core::ReduceOp::sum) /
            comm.size();
        const double seconds = std::chrono::duration<double>(clock_type::now() - t_window).count();
        const double images_per_s = static_cast<double>(loss_window_steps * shape.global_batch) / seconds;
        if (metrics) {
          metrics->train(at.epoch + 1, at.step, last_lr, mean, images_per_s);  // epoch 1-based, as val lines
          spdlog::debug("step {}: loss {:.4f}, lr {:.4g}, {:.1f} images/s", at.step, mean, last_lr, images_per_s);
        }
        loss_window = 0.0;
        loss_window_steps = 0;
        t_window = clock_type::now();
      }
      if (checkpoint_every > 0 && at.step % checkpoint_every == 0) write_checkpoint(out / "checkpoint.h5");
      core::fault::at("train.step");  // after the step's metrics line and checkpoint
      // After the last step the run ends anyway (its validation and checkpoint follow): nothing to stop.
      if (at.step < total_steps && stop_here(checkpoint_every > 0 && at.step % checkpoint_every == 0)) break;
    }
    if (stop != core::StopRequest::none) break;  // the epoch's end is the resumed run's
    const StepTiming timing =
        step_timing(comm, clock_type::now() - t_steps, epoch_steps, strategy->stats() - comm_before);
    const bool epoch_done = at.batch_in_epoch + accumulation > steps_per_epoch * accumulation;
    if (epoch_done) {
      ++at.epoch;
      at.batch_in_epoch = 0;
    }

    // Validation and the epoch's checkpoint, of one centre on every rank.
    strategy->settle(params, buffers);
    if (bn_data) recompute_center_statistics(epoch_done);
    core::BinaryEvaluation val;
    if (val_data) {
      strategy->with_evaluation_model(params, buffers, [&] {
        if (bn_data) unpack_values(center_statistics.data(), {}, buffers);  // put back by with_evaluation_model()
        val = validate(*model, *val_data, val_scorer, comm);
      });
    }
    const double train_loss =
        comm.allreduce_value(epoch_steps > 0 ? epoch_loss / static_cast<double>(epoch_steps) : 0.0,
                             core::ReduceOp::sum) /
        comm.size();
    epoch_loss = 0.0;
    epoch_steps = 0;
    const double no_value = std::numeric_limits<double>::quiet_NaN();  // printed as null
    const bool validated = val_data && val.count > 0;
    result.final_val_auc = validated ? val.auc() : no_value;
    result.final_val_loss = validated ? val.loss() : no_value;
    result.final_val_accuracy = validated ? val.accuracy() : no_value;
    if (metrics) {
      metrics->epoch(timing, {.epoch = at.epoch,
                              .step = at.step,
                              .global_batch = shape.global_batch,
                              .lr = last_lr,
                              .train_loss = train_loss,
                              .val_loss = result.final_val_loss,
                              .val_accuracy = result.final_val_accuracy,
                              .val_auc = result.final_val_auc,
                              .val_tiles = val.count,
                              .seconds = std::chrono::duration<double>(clock_type::now() - t_start).count()});
      spdlog::info(
          "epoch {} (step {}): train loss {:.4f}; validation loss {:.4f}, accuracy {:.3f}, AUC {:.3f} on {} tiles",
          at.epoch, at.step, train_loss, result.final_val_loss, result.final_val_accuracy, result.final_val_auc,
          val.count);
    }
    // Both written atomically (a temporary renamed over the name): a killed job never leaves half a checkpoint.
    write_checkpoint(out / "checkpoint.h5");
    if (epoch_done) write_checkpoint(out / fmt::format("checkpoint-epoch-{:03d}.h5", at.epoch));
    // An epoch's end is a step boundary too (its checkpoint is written); when the run is over anyway, it just ends.
    if (at.epoch < epochs && at.step < total_steps && stop_here(true)) break;
  }
  progress.finish();
  result.stopped = stop;

  result.steps = at.step;
  result.steps_this_run = at.step - first_step;
  result.epochs = at.epoch;
  result.seconds = std::chrono::duration<double>(clock_type::now() - t_start).count();
  result.images_per_second =
      static_cast<double>((at.step - first_step) * shape.global_batch) / std::max(result.seconds, 1e-9);
  result.checkpoint = (out / "checkpoint.h5").string();
  return result;
}

}  // namespace tessera::engine
