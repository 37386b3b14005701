// The two-level distributed strategy (engine/strategy.h lists the others): ranks that share memory combine first,
// through a node-local MPI-3 shared-memory window, and only one rank per group talks to the other nodes.
//
//   two-level   Node groups: the ranks that share memory (MPI_COMM_TYPE_SHARED), or, with
//               distributed.ranks_per_node = k > 0, consecutive world ranks in groups of k that must also share a
//               node (k divides every node's rank count; anything else is a ConfigError on that key). Local rank 0
//               of a group is its leader; the leaders form their own communicator (world rank 0 is leader 0).
//               Every step the group sums its gradients in shared memory: each rank writes its gradients into
//               its segment of the window, and after a group barrier local rank r adds up the r-th of k slices
//               of the flat gradient over all k segments into the leader's result area (a reduce-scatter in
//               shared memory; each rank touches only its slice, so no two ranks write the same bytes). Then,
//               by distributed.inter:
//     allreduce  the leaders allreduce the group sums and every rank reads the result from shared memory,
//               scaled by 1 / world size: every replica takes the same averaged-gradient step, as with the
//               single-level allreduce (equal up to the order of the float additions: the group adds its
//               segments in local-rank order, MPI picks its own tree). Batch-norm statistics: world rank 0's
//               after every update (as allreduce does), through the leaders and the shared window.
//               Evaluated and saved: the replica.
//     easgd     the group's ranks are one replica: gradients are averaged inside the group every step (1/k) and
//               the leader's batch-norm statistics are shared after every update, so a group's ranks stay
//               identical bit for bit. Every τ steps the leaders run one EASGD exchange among themselves
//               (EasgdStrategy on the leader communicator: α = β / number of groups unless distributed.alpha
//               is given, centre re-broadcast every center_sync_every exchanges), after which the leader's
//               replica (parameters and buffers) and its centre are copied to its group through shared memory.
//               Every rank keeps a copy of the centre, refreshed at each exchange, so that validation (which
//               every rank takes part in) and checkpoints use the centre on any rank without a collective.
//               Evaluated and saved: the centre, exactly as easgd (/easgd/center and /easgd/center_buffers in
//               checkpoints); on resume the leaders take the checkpoint's centre and hand it to their groups in
//               initialize(), and on as many ranks every rank gets its own saved replica back (its replica file,
//               replicas_differ(), on one rank too).
//               Optimizer momentum stays per rank (identical inside a group, since its gradients are).
//
// Memory model (MPI-3 unified shared memory): every phase runs inside a passive-target epoch (MPI_Win_lock_all);
// a hand-over between ranks is MPI_Win_sync (the writer's stores are visible) + barrier on the group +
// MPI_Win_sync (the reader's loads happen after). The leader's segment has separate areas for the gradient
// input, the group sum and what it shares after the update, so that a rank still reading one area never races
// with the leader writing the next; that saves one barrier per step. Per step: two group barriers around the sum
// (a third while the leaders allreduce, inter = allreduce with several groups) and one after the update. Window
// size: every rank's segment holds its gradients; the leader's also the group sum and its share area (the
// buffers, or for easgd replica and centre), i.e. 2P + B floats (allreduce) or 4P + 2B (easgd) for P parameter
// and B buffer values. A group of one rank has no window.
//
// stats(): both phases. phases().shared: the shared-memory phase (wait = the barrier where the group's ranks
// arrive; bytes = the gradients this rank hands to the group and what a leader shares with it);
// phases().inter: the leaders' allreduce, broadcast or EASGD exchange (wait = the barrier among leaders), and,
// on every rank of a group, the time spent waiting at the group barrier for the leader's result.
// distributed.bucket_mb does not apply.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/comm.h"
#include "engine/strategy.h"

namespace tessera::engine {

class TwoLevelStrategy final : public Strategy {
 public:
  enum class Inter { allreduce, easgd };

  // Splits `comm` into groups and leaders (collective). Throws ConfigError on every rank for a bad
  // distributed.ranks_per_node or distributed.inter, or (inter = easgd) the EASGD options among the leaders.
  TwoLevelStrategy(const core::Comm& comm, const StrategyOptions& options);
  ~TwoLevelStrategy() override;

  const char* name() const override { return "two-level"; }
  // inter easgd: a group's ranks average their gradients, the groups' replicas do not; inter allreduce: all ranks.
  int ranks_per_update() const override { return inter_ == Inter::easgd ? group_.size() : comm_.size(); }

  // Broadcasts rank 0's replica to every rank and sets up the shared window for these tensors (collective).
  void initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) override;
  void reduce_gradients(const std::vector<Param*>& params) override;
  void after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, std::int64_t step) override;
  void with_evaluation_model(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                             const std::function<void()>& fn) override;
  // inter = easgd: the groups' replicas differ from one another and from the centre.
  // inter easgd, on one rank too (as EasgdStrategy).
  bool replicas_differ() const override { return inter_ == Inter::easgd; }
  void set_center_buffers(const std::vector<Buffer*>& buffers) override;
  void save_state(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                  io::Checkpoint& checkpoint) const override;
  void load_state(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                  const std::vector<Buffer*>& buffers) override;

  Inter inter() const { return inter_; }
  // This rank's group (node-local) and the leaders' communicator (empty on non-leaders).
  const core::Comm& group() const { return group_; }
  const core::Comm& leaders() const { return leaders_; }
  bool is_leader() const { return group_.rank() == 0; }
  int groups() const { return groups_; }
  // inter = easgd: the leaders' EASGD among groups (null on non-leaders and for inter = allreduce).
  const EasgdStrategy* leader_easgd() const { return easgd_.get(); }
  // inter = easgd: the centre as this rank holds it (every parameter's values, then every buffer's).
  const std::vector<float>& center() const;

  struct Phases {
    CommStats shared;  // the node-local shared-memory phase
    CommStats inter;   // the exchange among leaders
  };
  const Phases& phases() const { return phases_; }

 private:
  // Rank 0 logs which ranks form which group, on which hosts (collective).
  void log_groups(const core::Comm& comm) const;

  class Epoch;  // one passive-target epoch on the window

  // Element counts of the model the window was made for.
  struct Layout {
    std::size_t params = 0;  // = gradients
    std::size_t buffers = 0;
    std::size_t share = 0;  // floats the leader shares after an update
  };

  // InternalError unless initialize() has run for tensors of these sizes (buffers too, unless null).
  void check_layout(const std::vector<Param*>& params, const std::vector<Buffer*>* buffers) const;
  // A leader's area: the group sum and what it shares (in the window, or in private memory for a group of one).
  float* result_area();
  float* share_area();
  // Makes this rank's stores to the window visible to the group and waits for the group (no-op for one rank).
  void group_sync() const;
  // The leader's EASGD stats since `before`, into phases_.inter.
  void add_inter(const CommStats& before, const CommStats& after);
  void add(CommStats& phase, double wait_seconds, double seconds, std::size_t bytes, std::int64_t exchanges);

  Inter inter_ = Inter::allreduce;
  int tau_ = 1;
  core::Comm group_;
  core::Comm leaders_;
  int groups_ = 1;
  std::unique_ptr<EasgdStrategy> easgd_;  // refers to leaders_: declared after it
  Layout layout_;
  bool initialized_ = false;
  std::unique_ptr<core::Window> window_;  // groups of more than one rank
  std::vector<float> private_;            // a group of one: its leader areas
  std::size_t result_offset_ = 0;         // floats into the leader's segment
  std::size_t share_offset_ = 0;
  std::vector<float> center_;  // inter = easgd, non-leaders: the centre shared by the leader
  std::vector<float> saved_;   // with_evaluation_model: the replica while the centre is in
  Phases phases_;
};

}  // namespace tessera::engine
