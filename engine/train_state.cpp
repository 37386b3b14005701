#include "engine/train_state.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/fault.h"
#include "engine/checkpoint_adapter.h"
#include "engine/models/registry.h"
#include "engine/strategy.h"

namespace tessera::engine {

void write_train_checkpoint(const std::string& path, const io::CheckpointMeta& meta, const TrainPosition& at,
                            const TrainState& state, const core::Comm& comm, std::span<const float> center_buffers) {
  const auto t_start = std::chrono::steady_clock::now();
  // One model to evaluate and save, the same on every rank: a strategy whose ranks run apart (async-easgd) takes
  // its centre once here, every rank held until it is taken (a no-op when nothing moved since the last settle).
  state.strategy.settle(state.params, state.buffers);
  io::CheckpointMeta stamped = meta;
  stamped.step = at.step;
  stamped.epoch = at.epoch;

  // Each rank writes its own replica, in parallel, into a set no published checkpoint names; rank 0 publishes the
  // checkpoint naming the set only once every file is in place (io/checkpoint.h "Replica files"). No rank holds
  // more than its own replica, whatever the rank count.
  io::ReplicaFiles files;
  if (state.strategy.replicas_differ()) {
    if (comm.is_root()) files.set = io::new_replica_set(path, at.step);
    comm.broadcast(files.set, 0);
    std::int64_t bytes = 0;
    {
      io::Checkpoint own;
      store_checkpoint_tensors(state.params, state.buffers, own);
      const io::Replica replica{
          std::move(own.params), std::move(own.buffers),
          to_checkpoint_state(state.optimizer.name(), at.step, state.optimizer.state(), state.params)};
      bytes = io::write_replica_file(path, files.set, comm.rank(), stamped, replica);
    }
    // Fault point "train.replica-written" (core/fault.h): every rank, once its replica file is in place and before
    // the checkpoint naming the set is published.
    core::fault::at("train.replica-written");
    // A rank whose write failed has thrown: the job ends (core/comm.h abort_job) before rank 0 publishes anything.
    std::string mine(sizeof bytes, '\0');
    std::memcpy(mine.data(), &bytes, sizeof bytes);
    for (const auto& part : comm.gather_bytes(mine, 0)) {
      std::int64_t size = 0;
      std::memcpy(&size, part.data(), sizeof size);
      files.bytes.push_back(size);
    }
  }
  if (!comm.is_root()) return;
  io::Checkpoint checkpoint;
  checkpoint.meta = stamped;
  state.strategy.with_evaluation_model(state.params, state.buffers, [&] {
    if (!center_buffers.empty()) {
      std::size_t values = 0;
      for (const auto* b : state.buffers) values += b->value.size();
      if (values != center_buffers.size()) {
        throw core::InternalError(
            fmt::format("{} values for the centre's buffers of {} values", center_buffers.size(), values));
      }
      unpack_values(center_buffers.data(), {}, state.buffers);  // put back by with_evaluation_model()
    }
    store_checkpoint_tensors(state.params, state.buffers, checkpoint);
  });
  state.strategy.save_state(state.params, state.buffers, checkpoint);
  checkpoint.optimizer = to_checkpoint_state(state.optimizer.name(), at.step, state.optimizer.state(), state.params);
  checkpoint.replica_files = files;
  checkpoint.state["replicas"] = static_cast<std::int64_t>(files.bytes.size());
  checkpoint.state["batch_in_epoch"] = at.batch_in_epoch;
  checkpoint.state["tiles_in_epoch"] = at.batch_in_epoch * state.batch_size * comm.size();
  checkpoint.state["seed"] = state.seed;
  checkpoint.state["ranks"] = static_cast<std::int64_t>(comm.size());
  io::write_checkpoint(path, checkpoint);
  if (std::filesystem::path(path).filename() == "checkpoint.h5") core::fault::at("train.checkpoint-written");
  // The sets of checkpoints this one replaced, and any a killed job left unnamed.
  io::remove_other_replica_sets(path, files.set);

  // What it cost (scripts/bench-checkpoint.sh reads this line): the seconds on rank 0 (once every rank's replica was
  // written), the bytes of the checkpoint and of each rank's replica file, and rank 0's peak memory so far.
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  constexpr double kMB = 1024.0 * 1024.0;
  const double replica_mb = files.bytes.empty() ? 0.0 : static_cast<double>(files.bytes.front()) / kMB;
  spdlog::debug(
      "checkpoint {} written in {:.3f} s: {:.1f} MB, {} replica file(s) of {:.1f} MB (rank 0's), one per "
      "rank; rank 0's peak memory {:.0f} MB",
      path, std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(),
      static_cast<double>(std::filesystem::file_size(path)) / kMB, files.bytes.size(), replica_mb,
      static_cast<double>(usage.ru_maxrss) * 1024.0 / kMB);
}

Resumed resume_train_checkpoint(const std::string& path, const io::CheckpointMeta& job, const std::string& shards,
                                const TrainState& state, const core::Comm& comm) {
  // The job's description first: another model is named as such, not as the first tensor whose shape differs.
  const io::CheckpointMeta saved = io::read_checkpoint_meta(path);
  if (saved.architecture != job.architecture) {
    throw core::InputError(
        fmt::format("the checkpoint holds a {}, the job trains a {}", saved.architecture, job.architecture), path);
  }
  if (const std::string other = other_model_size(saved, checkpoint_model_options(job)); !other.empty()) {
    throw core::InputError(fmt::format("the checkpoint holds {}", other), path);
  }
  if (saved.input_size != job.input_size ||
      (job.mpp > 0 && saved.mpp > 0 && std::abs(saved.mpp - job.mpp) > 1e-6 * job.mpp)) {
    throw core::InputError(fmt::format("the checkpoint was trained on {} px tiles at {} um/px, the shards in {} hold "
                                       "{} px tiles at {} um/px",
                                       saved.input_size, saved.mpp, shards, job.input_size, job.mpp),
                           path);
  }
  const io::CheckpointLayout layout = checkpoint_layout(state.params, state.buffers);
  const io::Checkpoint checkpoint = io::read_checkpoint(path, layout, io::ReplicaRead::skip);
  load_checkpoint_tensors(checkpoint, state.params, state.buffers);
  if (!checkpoint.optimizer.empty()) {
    state.optimizer.load_state(from_checkpoint_state(checkpoint.optimizer), state.params, path);
  }
  state.strategy.load_state(checkpoint, state.params, state.buffers);

  Resumed resumed;
  resumed.at.step = checkpoint.meta.step;
  resumed.at.epoch = checkpoint.meta.epoch;
  resumed.config_yaml = checkpoint.meta.config_yaml;
  auto state_int = [&](const char* key) -> std::optional<std::int64_t> {
    const auto it = checkpoint.state.find(key);
    if (it == checkpoint.state.end()) return std::nullopt;
    const auto* value = std::get_if<std::int64_t>(&it->second);
    if (value == nullptr || *value < 0) throw core::InputError(fmt::format("/state {} is not a count", key), path);
    return *value;
  };
  const auto written_by = state_int("ranks");
  const bool same_ranks = !written_by || *written_by == comm.size();
  if (const auto position = state_int("batch_in_epoch")) {
    resumed.at.batch_in_epoch = *position;
    const auto tiles = state_int("tiles_in_epoch");
    if (!same_ranks && tiles) {
      // Another rank count: the epoch goes on after as many tiles as the run before had taken (rounded down to a
      // whole step of this run).
      const std::int64_t accumulation = state.accumulation;
      const std::int64_t steps_per_epoch = state.batches_per_epoch / accumulation;
      std::int64_t batch = *tiles / (static_cast<std::int64_t>(state.batch_size) * comm.size());
      batch = batch / accumulation * accumulation;
      resumed.at.batch_in_epoch = std::min(batch, steps_per_epoch * accumulation);
    }
    if (resumed.at.batch_in_epoch > state.batches_per_epoch) {
      throw core::InputError("/state batch_in_epoch is not a batch position of this job's epochs", path);
    }
  }
  // Each rank's own replica and optimizer state, when the strategy keeps replicas apart and the file has one per
  // rank of this run.
  const auto replicas = state_int("replicas").value_or(0);
  if (state.strategy.replicas_differ() && replicas == comm.size()) {
    resumed.own_replica = io::read_checkpoint_replica(path, comm.rank(), layout);
  }
  if (!same_ranks && comm.is_root()) {
    spdlog::warn(
        "{} was written by a run on {} rank(s), this one has {}: training continues from its weights{} and "
        "optimizer state after {} of this epoch's tiles, but the data order differs from an uninterrupted run",
        path, *written_by, comm.size(), replicas > 0 ? " (the centre; every replica starts from it)" : "",
        state_int("tiles_in_epoch").value_or(0));
  }
  if (comm.is_root()) {
    spdlog::info("resuming from {} at step {} (epoch {}, batch {})", path, resumed.at.step, resumed.at.epoch,
                 resumed.at.batch_in_epoch);
  }
  return resumed;
}

void finish_resume(Resumed& resumed, const std::string& path, const TrainState& state) {
  if (!resumed.own_replica) return;
  const OptimizerState own = load_checkpoint_replica(*resumed.own_replica, state.params, state.buffers);
  state.optimizer.load_state(own, state.params, path);
  resumed.own_replica.reset();
}

}  // namespace tessera::engine
