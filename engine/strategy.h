// Distributed strategies: how the model replicas of the ranks are kept together during training.
//
// The training loop (engine/trainer.h) runs, per step: forward → loss → backward → strategy.reduce_gradients →
// optimizer step → strategy.after_update. A strategy plugs into those two points only, so the loop reads the
// same for one process and for many (docs/ARCHITECTURE.md "Conventions"). Validation and checkpoints see the model
// through with_evaluation_model(), and a checkpoint carries what save_state() adds.
//
//   allreduce   synchronous data parallelism: before every update the gradients are averaged over all ranks,
//               so every replica takes the same step and stays identical. On one rank it does nothing.
//               Evaluated and saved: the replica. The gradients travel in buckets of distributed.bucket_mb
//               (25 MB; the first one closes once past 1 MB, so that it leaves early — as PyTorch DDP; a tensor is
//               never split): the parameters in
//               backward order (the last layer's first) are cut into consecutive buckets, and a bucket's
//               non-blocking allreduce starts as soon as backward has finished every layer with a parameter in
//               it, so communication overlaps the rest of backward. Buckets start in the same order on every
//               rank (the backward order is the model's). With bucket_mb = 0, or before attach(), one fused
//               allreduce of all gradients after backward.
//               Open MPI moves a non-blocking collective only inside MPI calls. With distributed.progress
//               "thread" (the default) a communication thread makes every MPI call of the buckets — it starts
//               each bucket the training thread hands it and tests the ones in flight every 100 µs while the
//               kernels of backward run; the training thread makes no MPI call until it waits for the last
//               bucket, so MPI_THREAD_SERIALIZED suffices (Open MPI's one-sided pt2pt transport, which
//               async-easgd needs over TCP, refuses MPI_THREAD_MULTIPLE). With "boundaries", or an MPI below
//               SERIALIZED (SimGrid's SMPI), the training thread tests them between modules instead.
//
//   easgd       synchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015), decentralized: every rank
//               keeps its own copy of the centre variable x̃ and trains its replica x_i on its own gradients
//               (nothing is averaged per step). Every τ steps one allreduce of the elastic differences:
//                   d_i = α (x_i − x̃)          (this rank, element-wise, float)
//                   x_i ← x_i − d_i            (the elastic pull, on the weights, outside the momentum buffer)
//                   x̃  ← x̃ + Σ_i d_i          (identical on every rank: one allreduce of d)
//               with α = β / p (β = distributed.beta, 0.9 by default; a fixed α with growing p makes β = pα > 2
//               and the centre unstable), unless distributed.alpha > 0 gives α directly. Every
//               center_sync_every exchanges rank 0 re-broadcasts x̃, so float differences between the ranks'
//               reductions cannot make the copies drift apart.
//               Batch-norm running statistics (running_mean, running_var) are averaged into the centre like the
//               parameters, but that average is not the statistics of the centre's averaged weights once the
//               replicas have moved apart (16 ranks x 256, τ 8: averaged variances 2.3-4.2x the centre's own, a
//               centre scoring AUC 0.13 that scores 0.999 with its own). So before every validation and every
//               checkpoint the trainer recomputes them for the centre's weights on training tiles
//               (engine/batchnorm_recalibration.h; distributed.center_bn_tiles); at an epoch's end it also hands them
//               to set_center_buffers(), and the live centre goes on from them.
//               Evaluated and saved: the centre (parameters and running statistics). A checkpoint's /params and
//               /buffers are the centre with those statistics, so `tessera infer`/`predict` use it whichever
//               checkpoint they read; /easgd/center repeats the centre's parameters and /easgd/center_buffers holds
//               the live centre's buffers (between epochs still the elastic average: docs/ARCHITECTURE.md). The
//               checkpoint also carries every rank's replica and momentum (a replica file per rank,
//               replicas_differ(); on one rank too, whose replica is not the centre either): a run resumed on as
//               many ranks continues bit for bit; on another rank count every replica starts again from the
//               centre's parameters and /buffers (the recomputed statistics), with rank 0's momentum, while the
//               live centre keeps /easgd/center_buffers.
//
// Every strategy starts from identical replicas (rank 0's parameters and buffers broadcast). Every rank must call
// every strategy method the same number of times (each may be collective): the trainer gives every rank the
// same number of steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/config.h"
#include "engine/parameters.h"
#include "io/checkpoint.h"

namespace tessera::engine {

class Model;
class Sequential;

// Settings of the strategies (the job's distributed.* keys); each strategy reads the ones it uses.
struct StrategyOptions {
  int tau = 8;                      // easgd: optimizer steps between two exchanges, ≥ 1
  double beta = 0.9;                // easgd: β = p·α, in [0, 1]
  double alpha = 0.0;               // easgd: the moving rate α itself when > 0 (then β is ignored), ≤ 1
  int center_sync_every = 100;      // easgd: rank 0 re-broadcasts the centre every N exchanges (0 = never)
  double bucket_mb = 25.0;          // allreduce: gradient bucket size in MB; each bucket's allreduce starts during
                                    // backward as soon as its gradients are complete (0 = one allreduce after backward)
  std::string progress = "thread";  // allreduce: what moves the buckets' allreduces during backward: a communication
                                    // thread ("thread") or the training thread between modules ("boundaries")
  std::string inter = "allreduce";  // two-level: the exchange between node leaders, allreduce or easgd
  int ranks_per_node = 0;           // two-level: ranks per node group (0 = the ranks that share memory, as MPI says)
};

// What a strategy's communication cost this rank so far.
// A blocking collective is preceded by a barrier, so that the time a rank waits for the slowest one to arrive is
// told apart from the time the data takes to move (a barrier costs a few microseconds on shared memory).
// Bucketed allreduce has no barrier: its `seconds` are the communication backward did not hide (the wait for the
// buckets after backward, and the MPI calls during it). async-easgd's are its one-sided exchanges (see its header).
struct CommStats {
  double seconds = 0.0;        // wall time moving data: inside collectives, once every rank has arrived
  double wait_seconds = 0.0;   // wall time waiting for the other ranks to arrive at a collective
  std::int64_t bytes = 0;      // payload this rank handed to collectives (a ring allreduce of n bytes sends
                               // about 2(p−1)/p · n per rank)
  std::int64_t exchanges = 0;  // collective rounds (allreduces and centre broadcasts)

  CommStats operator-(const CommStats& earlier) const {
    return {seconds - earlier.seconds, wait_seconds - earlier.wait_seconds, bytes - earlier.bytes,
            exchanges - earlier.exchanges};
  }
};

class Strategy {
 public:
  explicit Strategy(const core::Comm& comm) : comm_(comm) {}
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  virtual const char* name() const = 0;
  const core::Comm& comm() const { return comm_; }

  // How many ranks' batches one optimizer update of this rank averages over: its learning rate is scaled for
  // batch_size × accumulation × this (engine/optim/config.h, the linear scaling rule). allreduce (the default): every
  // rank's. easgd and async-easgd: 1 — each replica steps on its own gradient; the elastic averaging is not a
  // gradient average. two-level: every rank's with inter allreduce, its node group's with inter easgd.
  virtual int ranks_per_update() const { return comm_.size(); }

  // Once, before initialize(): a strategy that overlaps communication with backward watches the model's
  // Sequentials (it takes their ModuleObserver slot, and gives it back when destroyed: the model must outlive
  // the strategy).
  virtual void attach(Model& /*model*/) {}
  // Before every backward pass. `completes_step`: the gradients after this backward are the ones the next
  // reduce_gradients() reduces (with gradient accumulation, only the last micro-batch's backward).
  virtual void before_backward(bool /*completes_step*/) {}

  // Makes every replica equal to rank 0's (parameters and buffers). Called once before training, after a resumed
  // run has loaded its checkpoint (and load_state). Not counted in stats().
  virtual void initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers);
  // Between backward and the optimizer's update.
  virtual void reduce_gradients(const std::vector<Param*>& params) = 0;
  // After the optimizer's update number `step` (1-based, counted over the whole run including before a resume).
  virtual void after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                            std::int64_t step) = 0;

  // Called on every rank at the end of every epoch, before validation, and at the start of every checkpoint
  // (collective): a strategy whose ranks run apart (async-easgd) completes every exchange in flight and takes the
  // centre once, so that all ranks validate and save one centre. Cheap when nothing moved since the last call.
  virtual void settle(const std::vector<Param*>& /*params*/, const std::vector<Buffer*>& /*buffers*/) {}

  // Runs `fn` while the parameters and buffers hold the model to validate and save (the replica for allreduce,
  // the centre for easgd), and puts the replica back afterwards, also when `fn` throws. Not collective.
  virtual void with_evaluation_model(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                     const std::function<void()>& fn);
  // True when the ranks' replicas (and optimizer states) differ from what is evaluated (and from one another), so
  // that a checkpoint must carry each rank's own to resume bit for bit, and the evaluated centre needs batch-norm
  // statistics of its own (easgd-type strategies, on any rank count).
  virtual bool replicas_differ() const { return false; }
  // Makes `buffers`' values the live centre's buffers from now on (under async-easgd those of the centre taken and of
  // the centre in the windows), for a strategy whose evaluated model is not the replica (replicas_differ()): the
  // trainer calls it at an epoch's end inside with_evaluation_model() with the centre's batch-norm statistics
  // recomputed for the centre's own weights (engine/batchnorm_recalibration.h). The centre's parameters are
  // untouched. Every rank gives the same values; not collective, except under async-easgd. InternalError for the other
  // strategies (their evaluated model is the replica) and for buffers whose total size is not the strategy's.
  virtual void set_center_buffers(const std::vector<Buffer*>& buffers);

  // Adds the strategy's own state to a checkpoint being written (easgd: /easgd/center and /easgd/center_buffers,
  // the live centre), and takes it back from a checkpoint being resumed (before initialize()). A checkpoint without
  // it leaves the strategy to start from the loaded weights (and one without /easgd/center_buffers the centre's
  // buffers from /buffers).
  virtual void save_state(const std::vector<Param*>& /*params*/, const std::vector<Buffer*>& /*buffers*/,
                          io::Checkpoint& /*checkpoint*/) const {}
  virtual void load_state(const io::Checkpoint& /*checkpoint*/, const std::vector<Param*>& /*params*/,
                          const std::vector<Buffer*>& /*buffers*/) {}

  // Communication so far (this rank).
  const CommStats& stats() const { return stats_; }

 protected:
  // Runs one collective `fn` moving `bytes` of payload after a barrier, and counts both in stats().
  template <class F>
  void timed(std::size_t bytes, F&& fn);

  const core::Comm& comm_;
  CommStats stats_;
};

class AllreduceStrategy final : public Strategy {
 public:
  // Throws ConfigError (key "distributed.bucket_mb") on a negative bucket size.
  explicit AllreduceStrategy(const core::Comm& comm, const StrategyOptions& options = {});
  ~AllreduceStrategy() override;
  const char* name() const override { return "allreduce"; }
  // Plans the buckets over the model's parameters and watches the body and every Sequential in it.
  void attach(Model& model) override;
  void before_backward(bool completes_step) override;
  // Bucketed: completes what backward started (a bucket whose parameters backward never reported starts now),
  // waits for every bucket and copies the averages back. Otherwise one fused allreduce.
  void reduce_gradients(const std::vector<Param*>& params) override;
  // Batch-norm running statistics are not gradients: each rank's would follow its own batches. As PyTorch's
  // DistributedDataParallel does (broadcast_buffers), rank 0's buffers are broadcast after every update, so
  // the replicas stay identical and validation and checkpoints see one model.
  void after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, std::int64_t step) override;

  // Buckets planned by attach() (0: not attached or bucket_mb = 0), and how many the last step started during
  // backward rather than in reduce_gradients() (for tests and `bench comm`).
  std::size_t buckets() const { return buckets_.size(); }
  std::size_t buckets_overlapped() const { return overlapped_; }
  // True when a communication thread moves the buckets (progress "thread" and an MPI that allows it).
  bool progress_thread() const { return progress_ != nullptr; }

  // The last bucketed step, for `bench comm`: per bucket (in order) its bytes, when backward completed it and when
  // its allreduce completed, and when backward ended — seconds since that step's backward began, on this rank.
  struct BucketTiming {
    std::size_t bytes = 0;
    double ready_s = 0.0, reduced_s = 0.0;
  };
  struct Timeline {
    double backward_end_s = 0.0;
    std::vector<BucketTiming> buckets;
  };
  const Timeline& last_timeline() const { return timeline_; }

 private:
  class Watcher;
  class Progress;
  struct Bucket {
    std::vector<Param*> params;  // in backward order
    std::vector<float> data;     // their gradients, packed
    std::size_t pending = 0;     // parameters not yet reported by backward in this pass
    MPI_Request request = MPI_REQUEST_NULL;
    bool started = false;
    BucketTiming timing;
  };
  // Copies p's gradient into its bucket and starts every bucket that is complete, in order.
  void ready(Param* p);
  void start_ready_buckets();
  void fused_reduce(const std::vector<Param*>& params);

  double bucket_mb_ = 25.0;
  std::string progress_mode_ = "thread";
  std::unique_ptr<Progress> progress_;  // the communication thread (attached, several ranks, progress "thread")
  std::chrono::steady_clock::time_point backward_start_;
  Timeline timeline_;
  std::vector<float> flat_;  // all gradients (or buffers), packed for one collective
  std::vector<Bucket> buckets_;
  struct Slot {
    std::size_t bucket = 0, offset = 0;
    bool reported = false;
  };
  std::vector<std::pair<const Param*, Slot>> slots_;                        // sorted by Param address
  std::vector<std::pair<const void*, std::vector<Param*>>> module_params_;  // watched module → its parameters
  std::vector<Sequential*> watched_;
  std::unique_ptr<Watcher> watcher_;
  bool armed_ = false;          // this backward completes a step: report parameters as they become ready
  std::size_t next_start_ = 0;  // buckets started (by the communication thread: handed to it)
  std::size_t overlapped_ = 0;
  double pass_comm_seconds_ = 0.0;  // time inside MPI calls during this backward
  Slot* find_slot(const Param* p);
};

class EasgdStrategy final : public Strategy {
 public:
  // Throws ConfigError (keys "distributed.*") on options out of range.
  EasgdStrategy(const core::Comm& comm, const StrategyOptions& options);
  const char* name() const override { return "easgd"; }
  int ranks_per_update() const override { return 1; }

  void initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) override;
  void reduce_gradients(const std::vector<Param*>&) override {}
  // Every tau-th step: exchange().
  void after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, std::int64_t step) override;
  void with_evaluation_model(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                             const std::function<void()>& fn) override;
  // On one rank too: the centre is then the elastic average of the one replica's past, not the replica.
  bool replicas_differ() const override { return true; }
  void set_center_buffers(const std::vector<Buffer*>& buffers) override;
  void save_state(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                  io::Checkpoint& checkpoint) const override;
  void load_state(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                  const std::vector<Buffer*>& buffers) override;

  // One elastic exchange now (collective), as described at the top. initialize() must have run.
  void exchange(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers);
  // Rank 0's centre to every rank (collective). after_update() calls it after every center_sync_every-th
  // exchange of the run (counted from step 0, so a resumed run keeps the schedule).
  void sync_center();

  float alpha() const { return alpha_; }
  int tau() const { return options_.tau; }
  // The centre: every parameter's values, then every buffer's, in the order initialize() was given them.
  const std::vector<float>& center() const { return center_; }

 private:
  // Throws InternalError when the tensors are not the ones initialize() saw (count or sizes).
  void check_layout(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) const;

  StrategyOptions options_;
  float alpha_ = 0.0f;
  std::vector<std::size_t> sizes_;          // element count of each parameter, then of each buffer
  std::vector<float> center_;               // x̃, flat (see center())
  std::vector<float> flat_;                 // the elastic differences d, then their sum
  std::vector<std::vector<float>> loaded_;  // the centre from a checkpoint (its parameters, then its buffers when
                                            // the file has them), until initialize()
};

// The flat order every strategy keeps models in: every parameter's values, then every buffer's.
// pack_values copies the model to `out` and returns the end; unpack_values copies it back from `in`.
float* pack_values(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, float* out);
const float* unpack_values(const float* in, const std::vector<Param*>& params, const std::vector<Buffer*>& buffers);
// Copies the buffers' values over the buffer part of a flat model, its last `buffer_values` values. InternalError
// when the buffers do not hold that many values or the model is shorter.
void store_buffers(const std::vector<Buffer*>& buffers, std::size_t buffer_values, std::vector<float>& model);
// The values of the last `count` tensors of `sizes` (element counts, parameters then buffers); InternalError when
// there are fewer.
std::size_t last_tensors_size(const std::vector<std::size_t>& sizes, std::size_t count);
// Runs `fn` while the parameters and buffers hold `model` (flat), the replica kept in `backup` meanwhile and put
// back afterwards, also when `fn` throws. Copies, not swaps of the vectors: layers may hold on to their storage.
void run_with_values(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                     const std::vector<float>& model, std::vector<float>& backup, const std::function<void()>& fn);
// Throws InternalError naming `strategy` when the tensors' count or sizes are not `sizes` (the element counts of
// every parameter, then every buffer, that the strategy was initialized with).
void check_flat_layout(const char* strategy, const std::vector<std::size_t>& sizes, const std::vector<Param*>& params,
                       const std::vector<Buffer*>& buffers);
// A flat centre as a checkpoint's /easgd/center (its parameters) and /easgd/center_buffers (its buffers).
void center_to_checkpoint(const std::vector<float>& center, const std::vector<Param*>& params,
                          const std::vector<Buffer*>& buffers, io::Checkpoint& checkpoint);
// And back: one vector per tensor, the parameters', then the buffers' when the checkpoint has them (empty: the
// checkpoint has no centre).
std::vector<std::vector<float>> center_from_checkpoint(const io::Checkpoint& checkpoint,
                                                       const std::vector<Param*>& params,
                                                       const std::vector<Buffer*>& buffers);

// The one list of strategies (docs/ARCHITECTURE.md "Conventions": explicit registries).
struct StrategyEntry {
  const char* name;
  const char* doc;
  std::unique_ptr<Strategy> (*make)(const core::Comm& comm, const StrategyOptions& options);
};
std::span<const StrategyEntry> strategy_registry();
std::vector<std::string> strategy_names();
// An unknown name is a ConfigError on key "distributed.strategy" listing the known ones.
std::unique_ptr<Strategy> make_strategy(const std::string& name, const core::Comm& comm,
                                        const StrategyOptions& options = {});

// distributed.center_bn_tiles by default: the training tiles on which the trainer recomputes the batch-norm
// statistics of an evaluated centre (set_center_buffers()).
constexpr std::int64_t kCenterBnTiles = 2048;
// The job's distributed.* keys (strategy, tau, beta, alpha, center_sync_every, center_bn_tiles, ...); returns
// `schema`.
core::Schema& declare_strategy_keys(core::Schema& schema);
StrategyOptions strategy_options(const core::Config& config);

// --------------------------------------------------------------------------------------------------------------

template <class F>
void Strategy::timed(std::size_t bytes, F&& fn) {
  using clock = core::MpiClock;
  const auto arrived = clock::now();
  if (comm_.size() > 1) comm_.barrier();
  const auto start = clock::now();
  fn();
  stats_.wait_seconds += std::chrono::duration<double>(start - arrived).count();
  stats_.seconds += std::chrono::duration<double>(clock::now() - start).count();
  stats_.bytes += static_cast<std::int64_t>(bytes);
  ++stats_.exchanges;
}

}  // namespace tessera::engine
