#include "engine/trainer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/metrics.h"
#include "core/progress.h"
#include "core/random.h"
#include "engine/checkpoint_adapter.h"
#include "engine/context.h"
#include "engine/inference.h"
#include "engine/layers/loss.h"
#include "engine/models/registry.h"
#include "engine/optim/config.h"
#include "engine/strategy.h"
#include "io/annotations.h"
#include "io/checkpoint.h"
#include "io/shard.h"
#include "io/shard_dataset.h"
#include "preprocessing/augment.h"

namespace tessera::engine {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;  // metrics.jsonl keeps its keys in the order written
using clock_type = std::chrono::steady_clock;

const core::Schema& train_schema() {
  // One schema for the life of the process: a Config keeps a reference to the schema it was read against.
  static const core::Schema instance = [] {
    core::Schema schema;
    schema.string("output", "runs/train", "Folder for checkpoints, metrics.jsonl, metrics.csv and the effective config")
        .string("data.shards", "data/shards", "Folder with manifest.json and the shards (tessera tile's output)")
        .string_list("data.train_splits", {"train"}, "Slides whose split is one of these train the model")
        .string_list("data.val_splits", {"val"}, "Slides whose split is one of these validate it every epoch")
        .integer("data.block_size", 64, "Tiles per contiguous shard read", 1, 65536)
        .integer("data.shuffle_buffer", 2048, "Tiles in the shuffle buffer (memory: tiles x size^2 x 3 bytes)", 0,
                 10000000)
        .string("model.architecture", "compact", "Network (see tessera train --help for the list)")
        .integer("train.epochs", 10, "Passes over the training tiles", 1, 100000)
        .integer("train.max_steps", 0, "Stop after this many optimizer steps (0 = epochs decide)", 0, 1000000000)
        .integer("train.batch_size", 64, "Tiles per micro-batch on each rank", 1, 65536)
        .integer("train.accumulation_steps", 1,
                 "Micro-batches whose gradients add up to one optimizer step: global batch = batch_size x ranks x this",
                 1, 65536)
        .integer("train.seed", 1, "Seed of the initial weights, the data order and the augmentation", 0, 9.0e15)
        .integer("train.threads", 0, "OpenMP threads per rank (0 = the cores this rank may use)", 0, 1024)
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

// Appends one line to a text file (rank 0's metrics). A failure (a full disk) is an internal error naming the file,
// as every failed write of Tessera's own outputs is.
void append_line(const fs::path& path, const std::string& line) {
  errno = 0;
  std::ofstream out(path, std::ios::app);
  out << line << '\n';
  out.flush();
  if (!out) {
    // iostreams need not set errno; when the system said nothing, say what is likely.
    const int reason = errno;
    throw core::InternalError("cannot append to '" + path.string() +
                              "': " + (reason != 0 ? std::strerror(reason) : "write failed (is the disk full?)"));
  }
}

// A resumed run drops the metrics lines of steps after its checkpoint (the killed run had logged them; the
// resumed one logs them again). `step_of` reads a line's step, or nothing for a header line. Rewritten atomically.
template <class StepOf>
void keep_lines_up_to(const fs::path& path, std::int64_t step, StepOf step_of) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const std::optional<std::int64_t> at = step_of(line);
    if (!at || *at <= step) kept += line + '\n';
  }
  in.close();
  core::write_file_atomic(path.string(), kept);
}

void keep_metrics_up_to(const fs::path& out, std::int64_t step) {
  keep_lines_up_to(out / "metrics.jsonl", step, [](const std::string& line) -> std::optional<std::int64_t> {
    const auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) return std::nullopt;
    return record["step"].get<std::int64_t>();
  });
  keep_lines_up_to(out / "metrics.csv", step, [](const std::string& line) -> std::optional<std::int64_t> {
    const auto comma = line.find(',');
    if (comma == std::string::npos || line.compare(0, 6, "epoch,") == 0) return std::nullopt;
    return std::strtoll(line.c_str() + comma + 1, nullptr, 10);
  });
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : "null"; }

// A figure as metrics.jsonl holds it: 6 significant digits, as metrics.csv, and null when not finite.
ordered_json metric(double v) { return ordered_json::parse(json_number(v)); }

// The training steps of one epoch (this run): their wall time, and the parts of it spent in the strategy's
// collectives moving data and waiting for the other ranks to arrive (CommStats), per rank and as means over the
// ranks. Collective.
struct RankTiming {
  double seconds = 0.0;
  double comm_seconds = 0.0;
  double wait_seconds = 0.0;
  double comm_bytes = 0.0;  // payload this rank sent
};

struct StepTiming {
  std::int64_t steps = 0;
  RankTiming mean;
  std::vector<RankTiming> ranks;  // index = rank
};

StepTiming step_timing(const core::Comm& comm, clock_type::duration elapsed, std::int64_t steps, const CommStats& c) {
  // Every rank fills its own four slots; a sum gathers them (adding zeros is exact).
  constexpr std::size_t kFigures = 4;
  std::vector<double> all(kFigures * static_cast<std::size_t>(comm.size()), 0.0);
  double* mine = all.data() + kFigures * static_cast<std::size_t>(comm.rank());
  mine[0] = std::chrono::duration<double>(elapsed).count();
  mine[1] = c.seconds;
  mine[2] = c.wait_seconds;
  mine[3] = static_cast<double>(c.bytes);
  comm.allreduce(all.data(), all.size(), core::ReduceOp::sum);
  StepTiming t;
  t.steps = steps;
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
    const double* f = all.data() + kFigures * r;
    t.ranks.push_back({f[0], f[1], f[2], f[3]});
    t.mean.seconds += f[0];
    t.mean.comm_seconds += f[1];
    t.mean.wait_seconds += f[2];
    t.mean.comm_bytes += f[3];
  }
  const double ranks = comm.size();
  t.mean = {t.mean.seconds / ranks, t.mean.comm_seconds / ranks, t.mean.wait_seconds / ranks,
            t.mean.comm_bytes / ranks};
  return t;
}

// metrics.jsonl's "timing" line: per step, seconds in total, in computation (everything but the strategy's
// collectives: data, forward, backward, update), in communication and in waiting for other ranks; the fractions
// of the step time communicating and waiting; the payload bytes a rank sent. Means over the ranks, and under
// "ranks" the same per step figures of every rank (index = rank).
std::string timing_json(const StepTiming& t, std::int64_t epoch, std::int64_t step, std::int64_t global_batch) {
  const double n = static_cast<double>(std::max<std::int64_t>(t.steps, 1));
  const RankTiming& m = t.mean;
  const double total = std::max(m.seconds, 1e-12);
  ordered_json ranks = ordered_json::array();
  for (const RankTiming& r : t.ranks) {
    ranks.push_back({{"step_s", metric(r.seconds / n)},
                     {"compute_s", metric((r.seconds - r.comm_seconds - r.wait_seconds) / n)},
                     {"comm_s", metric(r.comm_seconds / n)},
                     {"wait_s", metric(r.wait_seconds / n)},
                     {"comm_bytes_per_step", metric(r.comm_bytes / n)}});
  }
  return ordered_json{{"kind", "timing"},
                      {"epoch", epoch},
                      {"step", step},
                      {"steps", t.steps},
                      {"step_s", metric(m.seconds / n)},
                      {"compute_s", metric((m.seconds - m.comm_seconds - m.wait_seconds) / n)},
                      {"comm_s", metric(m.comm_seconds / n)},
                      {"wait_s", metric(m.wait_seconds / n)},
                      {"comm_fraction", metric(m.comm_seconds / total)},
                      {"wait_fraction", metric(m.wait_seconds / total)},
                      {"comm_bytes_per_step", metric(m.comm_bytes / n)},
                      {"images_per_s", metric(static_cast<double>(t.steps * global_batch) / total)},
                      {"ranks", ranks}}
      .dump();
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
  ModelOptions model_options;
  model_options.architecture = config.get_string("model.architecture");
  model_options.input_size = train_data.tile_size();
  model_options.num_classes = kClasses;
  model_options.seed = seed;
  auto model = make_model(model_options);
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
  TrainingShape shape;
  shape.global_batch = static_cast<std::int64_t>(batch_size) * comm.size() * accumulation;
  shape.steps_per_epoch = steps_per_epoch;
  shape.total_steps = total_steps;
  auto optimizer = build_optimizer(config);
  auto schedule = build_schedule(config, shape);
  auto strategy = make_strategy(config.get_string("distributed.strategy"), comm, strategy_options(config));

  // Resume.
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t batch_in_epoch = 0;
  std::optional<io::Replica> own_replica;
  std::string resume = config.get_string("train.resume");
  if (resume == "auto") resume = fs::exists(out / "checkpoint.h5") ? (out / "checkpoint.h5").string() : "";
  if (!resume.empty()) {
    // Every rank reads the shared part, and its own replica when the file has one per rank of this run.
    const io::CheckpointLayout layout = checkpoint_layout(params, buffers);
    const io::Checkpoint checkpoint = io::read_checkpoint(resume, layout, io::ReplicaRead::skip);
    if (checkpoint.meta.architecture != model_options.architecture) {
      throw core::InputError(fmt::format("the checkpoint holds a {}, the job trains a {}", checkpoint.meta.architecture,
                                         model_options.architecture),
                             resume);
    }
    if (checkpoint.meta.input_size != model_options.input_size ||
        (manifest.attributes.mpp > 0 && checkpoint.meta.mpp > 0 &&
         std::abs(checkpoint.meta.mpp - manifest.attributes.mpp) > 1e-6 * manifest.attributes.mpp)) {
      throw core::InputError(fmt::format("the checkpoint was trained on {} px tiles at {} um/px, the shards in {} hold "
                                         "{} px tiles at {} um/px",
                                         checkpoint.meta.input_size, checkpoint.meta.mpp, shards,
                                         model_options.input_size, manifest.attributes.mpp),
                             resume);
    }
    load_checkpoint_tensors(checkpoint, params, buffers);
    if (!checkpoint.optimizer.empty()) {
      optimizer->load_state(from_checkpoint_state(checkpoint.optimizer), params, resume);
    }
    strategy->load_state(checkpoint, params);
    step = checkpoint.meta.step;
    epoch = checkpoint.meta.epoch;
    auto state_int = [&](const char* key) -> std::optional<std::int64_t> {
      const auto it = checkpoint.state.find(key);
      if (it == checkpoint.state.end()) return std::nullopt;
      const auto* value = std::get_if<std::int64_t>(&it->second);
      if (value == nullptr || *value < 0) throw core::InputError(fmt::format("/state {} is not a count", key), resume);
      return *value;
    };
    const auto written_by = state_int("ranks");
    const bool same_ranks = !written_by || *written_by == comm.size();
    if (const auto position = state_int("batch_in_epoch")) {
      batch_in_epoch = *position;
      const auto tiles = state_int("tiles_in_epoch");
      if (!same_ranks && tiles) {
        // Another rank count: the epoch goes on after as many tiles as the run before had taken (rounded down to
        // a whole step of this run).
        batch_in_epoch = *tiles / (static_cast<std::int64_t>(batch_size) * comm.size()) / accumulation * accumulation;
        batch_in_epoch = std::min(batch_in_epoch, steps_per_epoch * accumulation);
      }
      if (batch_in_epoch > batches_per_epoch) {
        throw core::InputError("/state batch_in_epoch is not a batch position of this job's epochs", resume);
      }
    }
    // Each rank's own replica and optimizer state, when the strategy keeps replicas apart and the file has one
    // per rank of this run.
    const auto replicas = state_int("replicas").value_or(0);
    if (strategy->replicas_differ() && replicas == comm.size()) {
      own_replica = io::read_checkpoint_replica(resume, comm.rank(), layout);
    }
    if (!same_ranks && comm.is_root()) {
      spdlog::warn(
          "{} was written by a run on {} rank(s), this one has {}: training continues from its weights{} and "
          "optimizer state after {} of this epoch's tiles, but the data order differs from an uninterrupted "
          "run",
          resume, *written_by, comm.size(), replicas > 0 ? " (the centre; every replica starts from it)" : "",
          state_int("tiles_in_epoch").value_or(0));
    }
    if (comm.is_root())
      spdlog::info("resuming from {} at step {} (epoch {}, batch {})", resume, step, epoch, batch_in_epoch);
    // The steps left are this run's: on another rank count (or batch size) an epoch has another number of steps
    // than the checkpointed run's, whose steps `step` counts. On the same, this is the total computed above.
    const std::int64_t left = steps_per_epoch * (epochs - epoch) - batch_in_epoch / accumulation;
    total_steps = step + std::max<std::int64_t>(left, 0);
    if (config.get_int("train.max_steps") > 0) total_steps = std::min(total_steps, config.get_int("train.max_steps"));
    if (total_steps != shape.total_steps) {
      shape.total_steps = total_steps;
      schedule = build_schedule(config, shape);
    }
  }
  strategy->attach(*model);
  strategy->initialize(params, buffers);
  if (own_replica) {
    // initialize() made every replica the centre; this rank's own replica and momentum take their place.
    const OptimizerState state = load_checkpoint_replica(*own_replica, params, buffers);
    optimizer->load_state(state, params, resume);
    own_replica.reset();
  }

  if (comm.is_root()) {
    fs::create_directories(out);
    config.save((out / "train.config.yaml").string());
    spdlog::info(
        "{}: {} parameters; {} training tiles ({} slides), {} validation slides; {} rank(s) x batch {}{} = "
        "global batch {}; {} steps per epoch; strategy {}",
        model_options.architecture, model->parameter_count(), train_data.total_tiles(), train_options.slides.size(),
        val_options.slides.size(), comm.size(), batch_size,
        accumulation > 1 ? fmt::format(" x {} accumulated", accumulation) : "", shape.global_batch, steps_per_epoch,
        strategy->name());
  }
  comm.barrier();

  auto write_checkpoint = [&](const fs::path& path, std::int64_t batch_position) {
    // Collective. What is evaluated (the replica under allreduce, the centre under easgd) is the same everywhere:
    // rank 0 writes it, with every rank's own replica gathered when they differ.
    const bool with_replicas = strategy->replicas_differ();
    std::vector<std::string> packed;
    if (with_replicas) packed = comm.gather_bytes(pack_replica(params, buffers, optimizer->state()), 0);
    if (!comm.is_root()) return;
    io::Checkpoint checkpoint;
    checkpoint.meta.architecture = model_options.architecture;
    checkpoint.meta.input_size = model_options.input_size;
    checkpoint.meta.num_classes = kClasses;
    checkpoint.meta.class_names = io::kLabelNames;
    checkpoint.meta.mpp = manifest.attributes.mpp;
    checkpoint.meta.stain_normalization = manifest.attributes.stain_normalization;
    checkpoint.meta.tissue = manifest.tissue;  // so that inference finds tissue as the tiling did
    checkpoint.meta.config_yaml = config.to_yaml();
    checkpoint.meta.step = step;
    checkpoint.meta.epoch = epoch;
    strategy->with_evaluation_model(params, buffers, [&] { store_checkpoint_tensors(params, buffers, checkpoint); });
    strategy->save_state(params, checkpoint);
    checkpoint.optimizer = to_checkpoint_state(optimizer->name(), step, optimizer->state(), params);
    for (const auto& bytes : packed) {
      checkpoint.replicas.push_back(unpack_replica(bytes, params, buffers, optimizer->name(), step));
    }
    checkpoint.state["replicas"] = static_cast<std::int64_t>(checkpoint.replicas.size());
    checkpoint.state["batch_in_epoch"] = batch_position;
    checkpoint.state["tiles_in_epoch"] = batch_position * batch_size * comm.size();
    checkpoint.state["seed"] = static_cast<std::uint64_t>(seed);
    checkpoint.state["ranks"] = static_cast<std::int64_t>(comm.size());
    io::write_checkpoint(path.string(), checkpoint);
    if (path.filename() == "checkpoint.h5") core::fault::at("train.checkpoint-written");
  };

  InputBuilder train_inputs(prep::augment_options_from_config(config));
  const auto log_every = config.get_int("train.log_every");
  const auto checkpoint_every = config.get_int("train.checkpoint_every");
  if (comm.is_root() && step == 0) {
    std::ofstream(out / "metrics.csv") << "epoch,step,lr,train_loss,val_loss,val_accuracy,val_auc,seconds\n";
    std::ofstream(out / "metrics.jsonl", std::ios::trunc);
  } else if (comm.is_root()) {
    keep_metrics_up_to(out, step);
  }

  TrainResult result;
  const std::int64_t first_step = step;
  // Progress counts global steps: every rank takes each step together, so rank 0 alone advances it.
  core::Progress progress(comm, total_steps - step, {.label = "train", .unit = "steps"});
  io::Batch batch;
  Tensor input;
  std::vector<int> labels;
  double loss_window = 0.0;
  std::int64_t loss_window_steps = 0;
  double epoch_loss = 0.0;
  std::int64_t epoch_steps = 0;
  double last_lr = 0.0;
  auto t_window = clock_type::now();
  model->set_mode(Mode::train);

  while (epoch < epochs && step < total_steps) {
    train_data.start_epoch(epoch);
    // A resumed run skips the batches the checkpointed run had already taken in this epoch.
    for (std::int64_t b = 0; b < batch_in_epoch; ++b) {
      if (!train_data.next(batch)) break;
    }
    const auto t_steps = clock_type::now();
    const CommStats comm_before = strategy->stats();
    // batch_in_epoch counts micro-batches; a step takes `accumulation` of them.
    while (step < total_steps && batch_in_epoch + accumulation <= steps_per_epoch * accumulation) {
      Optimizer::zero_grad(params);
      double batch_loss = 0.0;
      for (std::int64_t micro = 0; micro < accumulation; ++micro) {
        if (!train_data.next(batch)) {
          throw core::InternalError(fmt::format("the training data ended after {} of {} micro-batches of epoch {}",
                                                batch_in_epoch, batches_per_epoch, epoch + 1));
        }
        train_inputs.build(batch, seed, epoch, input);
        labels.assign(batch.labels.begin(), batch.labels.end());
        // Dropout masks differ per micro-batch and per rank (rank 0's are a single process's).
        model->reseed(seed ^ (static_cast<std::uint64_t>(step) * core::golden_gamma) ^
                      (static_cast<std::uint64_t>(comm.rank()) * 0xD1B54A32D192ED03ull) ^
                      (static_cast<std::uint64_t>(micro) * 0x94D049BB133111EBull));
        const Tensor& logits = model->forward(input);
        // The mean over the step's micro-batches: each one's gradient counts 1/accumulation.
        const double micro_loss = loss.forward(logits, labels, 1.0 / static_cast<double>(accumulation));
        // Checked before this rank's gradients reach any collective: a failing rank takes the job down before a
        // non-finite value can spread to the other replicas (or into a checkpoint).
        if (!std::isfinite(micro_loss)) {
          throw core::InternalError(fmt::format(
              "the training loss is {} at step {}: lower optimizer.lr or check the data", micro_loss, step + 1));
        }
        batch_loss += micro_loss / static_cast<double>(accumulation);
        strategy->before_backward(micro + 1 == accumulation);
        model->backward(loss.backward());  // layers add into the gradients: the micro-batches accumulate
        ++batch_in_epoch;
      }
      strategy->reduce_gradients(params);
      last_lr = schedule->lr(step);
      optimizer->step(params, last_lr);
      ++step;
      strategy->after_update(params, buffers, step);
      loss_window += batch_loss;
      ++loss_window_steps;
      epoch_loss += batch_loss;
      ++epoch_steps;
      if (comm.is_root()) progress.advance();
      if (step % log_every == 0 || step == total_steps) {
        const double mean =
            comm.allreduce_value(loss_window / static_cast<double>(loss_window_steps), core::ReduceOp::sum) /
            comm.size();
        const double seconds = std::chrono::duration<double>(clock_type::now() - t_window).count();
        const double images_per_s = static_cast<double>(loss_window_steps * shape.global_batch) / seconds;
        if (comm.is_root()) {
          append_line(out / "metrics.jsonl", ordered_json{{"kind", "train"},
                                                          {"epoch", epoch + 1},  // 1-based, as val lines
                                                          {"step", step},
                                                          {"lr", metric(last_lr)},
                                                          {"loss", metric(mean)},
                                                          {"images_per_s", metric(images_per_s)}}
                                                 .dump());
          spdlog::debug("step {}: loss {:.4f}, lr {:.4g}, {:.1f} images/s", step, mean, last_lr, images_per_s);
        }
        loss_window = 0.0;
        loss_window_steps = 0;
        t_window = clock_type::now();
      }
      if (checkpoint_every > 0 && step % checkpoint_every == 0) write_checkpoint(out / "checkpoint.h5", batch_in_epoch);
      core::fault::at("train.step");  // after the step's metrics line and checkpoint
    }
    const StepTiming timing =
        step_timing(comm, clock_type::now() - t_steps, epoch_steps, strategy->stats() - comm_before);
    const bool epoch_done = batch_in_epoch + accumulation > steps_per_epoch * accumulation;
    if (epoch_done) {
      ++epoch;
      batch_in_epoch = 0;
    }

    // Validation and the epoch's checkpoint, of one centre on every rank.
    strategy->settle(params, buffers);
    core::BinaryEvaluation val;
    if (val_data) {
      strategy->with_evaluation_model(params, buffers, [&] { val = validate(*model, *val_data, val_scorer, comm); });
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
    const double elapsed = std::chrono::duration<double>(clock_type::now() - t_start).count();
    if (comm.is_root()) {
      append_line(out / "metrics.jsonl", timing_json(timing, epoch, step, shape.global_batch));
      append_line(out / "metrics.jsonl", ordered_json{{"kind", "val"},
                                                      {"epoch", epoch},
                                                      {"step", step},
                                                      {"loss", metric(result.final_val_loss)},
                                                      {"accuracy", metric(result.final_val_accuracy)},
                                                      {"auc", metric(result.final_val_auc)},
                                                      {"tiles", val.count}}
                                             .dump());
      append_line(out / "metrics.csv",
                  fmt::format("{},{},{},{},{},{},{},{:.1f}", epoch, step, json_number(last_lr), json_number(train_loss),
                              json_number(result.final_val_loss), json_number(result.final_val_accuracy),
                              json_number(result.final_val_auc), elapsed));
      spdlog::info(
          "epoch {} (step {}): train loss {:.4f}; validation loss {:.4f}, accuracy {:.3f}, AUC {:.3f} on {} tiles",
          epoch, step, train_loss, result.final_val_loss, result.final_val_accuracy, result.final_val_auc, val.count);
    }
    // Both written atomically (a temporary renamed over the name): a killed job never leaves half a checkpoint.
    write_checkpoint(out / "checkpoint.h5", batch_in_epoch);
    if (epoch_done) write_checkpoint(out / fmt::format("checkpoint-epoch-{:03d}.h5", epoch), batch_in_epoch);
  }
  progress.finish();

  result.steps = step;
  result.epochs = epoch;
  result.seconds = std::chrono::duration<double>(clock_type::now() - t_start).count();
  result.images_per_second =
      static_cast<double>((step - first_step) * shape.global_batch) / std::max(result.seconds, 1e-9);
  result.checkpoint = (out / "checkpoint.h5").string();
  return result;
}

}  // namespace tessera::engine
