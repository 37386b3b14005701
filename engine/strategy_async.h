// async-easgd: asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015, Algorithm 1) with the centre
// variable sharded over all ranks in MPI one-sided windows — no parameter server, no collective per exchange.
//
//   The centre x̃ is flat, as EasgdStrategy's: every parameter's values, then every buffer's (batch-norm running
//   statistics are part of it, for the reasons strategy.h gives for easgd). Rank r owns the contiguous slice
//   [⌊n·r/p⌋, ⌊n·(r+1)/p⌋) of its n floats, in an MPI window (MPI_Win_allocate) whose memory only RMA calls touch
//   once training runs. Each rank trains its replica x_i on its own gradients; every τ local steps
//   (distributed.tau: after_update with step % τ == 0) it visits every owner r in turn, starting with itself:
//       lock r exclusively                     (MPI_Win_lock, passive target: r takes no part)
//       c   = x̃[slice r]                       (MPI_Get, completed by a flush)
//       d   = α (x_i[slice r] − c)             (element-wise, float)
//       x_i[slice r] ← x_i[slice r] − d        (the elastic pull, on the weights, outside the momentum buffer)
//       x̃[slice r]  += d                       (MPI_Accumulate SUM)
//       unlock r                               (completes the accumulate at r)
//   and goes on training without waiting for anyone. α = β / p (distributed.beta) unless distributed.alpha > 0
//   gives it, with EasgdStrategy's rules (refused when α·p > 1). One exchange is the synchronous EASGD update
//   of one rank: the centre moves by α (x_i − x̃) = (1 − α) x̃ + α x_i, a convex combination, so averaged
//   running variances stay positive.
//
// Consistency: an exchange is atomic per shard — it runs under an exclusive lock of that shard, so no other
// rank's exchange reads or adds to the slice between its get and its accumulate, and every d is added exactly
// once (the centre's change is the sum of all ranks' d: "no update is lost"). It is not atomic across shards:
// another rank may exchange with shard r' between this rank's visits of r and r', so the centre a rank pulls
// towards is a mix of slightly different ages — the asynchrony EASGD is designed to tolerate. A rank holds one
// lock at a time, so exchanges cannot deadlock, and ranks that take different numbers of steps never wait for
// each other. settle() (collective, at every epoch end) is a barrier after each rank's last unlock: every
// exchange is complete once it returns, and all ranks then see one centre.
//
// Evaluated and saved: the centre (parameters and running statistics), as easgd does: a checkpoint's /params and
// /buffers are the centre (its batch-norm statistics recomputed for its weights: engine/trainer.cpp), /easgd/center
// repeats its parameters and /easgd/center_buffers holds the windows' buffers; on resume every owner fills its slice
// from the file, and every replica restarts from its own saved replica (replicas_differ(): io/checkpoint.h
// "Replica files") on as many ranks, from the centre otherwise. The centre validated and saved is one: settle() (at
// every epoch end, and at every checkpoint) takes it once, every rank held until it is taken, and
// with_evaluation_model() and save_state() use it; without a settle since this rank's last exchange they fetch the
// centre one-sidedly (every slice under a shared lock, so atomic per shard only). Neither is collective.
//
// stats(): `bytes` counts what this rank moved in its exchanges (the slices it got plus the d it accumulated:
// 2 · 4n bytes per exchange), `exchanges` one per exchange (all shards), `seconds` the wall time from holding a
// lock to its unlock returning (get, flush, compute, accumulate, unlock), `wait_seconds` the time blocked in
// MPI_Win_lock waiting for another rank's exchange of that shard to end (Open MPI's shared-memory osc takes the
// lock eagerly; an implementation that defers acquiring it to the first operation counts that wait in
// `seconds`). There is no barrier per exchange. Centre fetches for evaluation and checkpoints, and settle(),
// are not counted: they are not part of the training steps.
//
// Progress: on one node Open MPI's osc/sm makes every operation a load or store by the origin itself. Across
// nodes, whether a target that is busy computing serves locks and gets depends on the MPI (RDMA networks do it
// in hardware; a software fallback may wait until the target next enters MPI, at its own next exchange).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/comm.h"
#include "engine/strategy.h"

namespace tessera::engine {

class AsyncEasgdStrategy final : public Strategy {
 public:
  // Throws ConfigError (keys "distributed.*") on options out of range, as EasgdStrategy.
  AsyncEasgdStrategy(const core::Comm& comm, const StrategyOptions& options);
  // Frees the window: collective (every rank destroys its strategy at the same point of the program).
  ~AsyncEasgdStrategy() override;
  const char* name() const override { return "async-easgd"; }
  int ranks_per_update() const override { return 1; }

  // Collective: rank 0's replica to every rank, then the window (a new one each call), each owner filling its
  // slice from that replica (parameters from a loaded checkpoint's centre, if load_state() got one); returns
  // once every slice holds the initial centre.
  void initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) override;
  void reduce_gradients(const std::vector<Param*>&) override {}
  // Every tau-th step: exchange(). Not collective.
  void after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, std::int64_t step) override;
  // Collective: every exchange of every rank is complete when it returns, and every rank holds the same centre,
  // taken once: rank 0 fetches it while the other ranks are held in a broadcast of it (none exchanges again before
  // it is taken). with_evaluation_model() and save_state() then use that centre, until this rank next exchanges;
  // a settle when no rank has exchanged since the last one only checks so (one allreduce).
  void settle(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) override;
  void with_evaluation_model(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                             const std::function<void()>& fn) override;
  // On one rank too (as EasgdStrategy).
  bool replicas_differ() const override { return true; }
  // Sets the buffers of the centre settle() took (InternalError before it or after an exchange since) and of the
  // centre in the windows, each rank its own slice. Collective (unlike the base class's): no rank exchanges again
  // before every slice holds them.
  void set_center_buffers(const std::vector<Buffer*>& buffers) override;
  void save_state(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                  io::Checkpoint& checkpoint) const override;
  void load_state(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                  const std::vector<Buffer*>& buffers) override;

  // One asynchronous exchange with every shard owner now, as described at the top (not collective).
  // When `sent` is given, every d this exchange added to the centre is added to it, in flat centre order (it is
  // resized to the centre's size if it is not that size already): a rank's account of the mass it moved.
  // InternalError before initialize() or when the tensors are not the ones initialize() saw.
  void exchange(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                std::vector<double>* sent = nullptr);
  // The whole centre now (every parameter's values, then every buffer's), each slice read under a shared lock
  // of its owner. Not collective.
  std::vector<float> fetch_center() const;

  float alpha() const { return alpha_; }
  int tau() const { return tau_; }
  // The flat range [first, second) of the centre that `rank` owns (valid after initialize()).
  std::pair<std::size_t, std::size_t> shard(int rank) const;

 private:
  void check_layout(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) const;

  int tau_ = 1;
  float alpha_ = 0.0f;
  std::vector<std::size_t> sizes_;          // element count of each parameter, then of each buffer
  std::size_t total_ = 0;                   // n: the centre's length
  std::unique_ptr<core::Window> window_;    // this rank's slice of the centre (floats, disp_unit 4)
  std::vector<float> slice_center_;         // c of the shard being exchanged (largest shard's size)
  std::vector<float> slice_diff_;           // d of the shard being exchanged
  std::vector<float> replica_;              // with_evaluation_model: the replica while the centre is swapped in
  std::vector<std::vector<float>> loaded_;  // the centre from a checkpoint (parameters, then buffers when the file
                                            // has them), until initialize()
  std::vector<float> taken_center_;         // the centre settle() took, the same on every rank
  bool taken_ = false;                      // taken_center_ is the centre: no exchange of this rank since
};

}  // namespace tessera::engine
