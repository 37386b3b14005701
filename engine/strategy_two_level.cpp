#include "engine/strategy_two_level.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/hosts.h"
#include "core/measure.h"
#include "engine/checkpoint_adapter.h"

namespace tessera::engine {

namespace {

using clock_type = core::MpiClock;  // simulated time under SMPI (core/comm.h)

constexpr std::size_t kParallelMin = 1 << 16;  // elements: below this, threads cost more than they save

std::size_t bytes_of(std::size_t floats) { return floats * sizeof(float); }

core::ConfigError bad_option(const std::string& key, const std::string& why) {
  return core::ConfigError(why, "", 0, fmt::format("distributed.{}", key));
}

// Splits `node` (the ranks that share memory) into groups of `per_group` consecutive world ranks; ConfigError on
// every rank of `world` when that does not divide some node's ranks or a group would span nodes.
core::Comm make_groups(const core::Comm& world, core::Comm node, int per_group) {
  if (per_group < 0) throw bad_option("ranks_per_node", fmt::format("ranks_per_node {} is negative", per_group));
  if (per_group == 0) return node;
  const bool divides = node.size() % per_group == 0;
  core::Comm group = node.split(world.rank() / per_group, world.rank());
  const bool fits = divides && group.size() == per_group;
  if (world.allreduce_value<std::int64_t>(fits ? 0 : 1, core::ReduceOp::max) != 0) {
    throw bad_option("ranks_per_node",
                     fmt::format("ranks_per_node {} does not make groups of {} consecutive ranks on one node: it must "
                                 "divide the number of ranks on every node ({} of the {} ranks share this rank's node)",
                                 per_group, per_group, node.size(), world.size()));
  }
  return group;
}

TwoLevelStrategy::Inter parse_inter(const std::string& name) {
  if (name == "allreduce") return TwoLevelStrategy::Inter::allreduce;
  if (name == "easgd") return TwoLevelStrategy::Inter::easgd;
  throw bad_option("inter", fmt::format("unknown inter-node exchange '{}'; known: allreduce, easgd", name));
}

}  // namespace

// A passive-target epoch on every rank of the window (MPI-3 shared memory: loads and stores between
// MPI_Win_lock_all and MPI_Win_unlock_all, ordered by MPI_Win_sync). Ends explicitly: a rank that throws inside
// one is taken down by abort_job(), which is why no destructor tries to close it.
class TwoLevelStrategy::Epoch {
 public:
  explicit Epoch(const core::Window* window) : window_(window) {
    if (window_ != nullptr) window_->lock_all();
  }
  void end() {
    if (window_ != nullptr) window_->unlock_all();
    window_ = nullptr;
  }

 private:
  const core::Window* window_;
};

TwoLevelStrategy::TwoLevelStrategy(const core::Comm& comm, const StrategyOptions& options)
    : Strategy(comm),
      inter_(parse_inter(options.inter)),
      tau_(options.tau),
      group_(make_groups(comm, comm.split_node(), options.ranks_per_node)),
      leaders_(comm.split(group_.rank() == 0 ? 0 : MPI_UNDEFINED, comm.rank())) {
  groups_ = static_cast<int>(comm.allreduce_value<std::int64_t>(is_leader() ? 1 : 0, core::ReduceOp::sum));
  log_groups(comm);

  if (inter_ == Inter::easgd) {
    // The leaders check the EASGD options for their communicator; the group learns the verdict from its leader,
    // so that every rank throws or none does.
    std::string key, message;
    if (is_leader()) {
      try {
        easgd_ = std::make_unique<EasgdStrategy>(leaders_, options);
      } catch (const core::ConfigError& e) {
        key = e.key();
        message = fmt::format("two-level with inter = easgd among {} node group(s): {}", groups_, e.message());
      }
    }
    group_.broadcast(key, 0);
    group_.broadcast(message, 0);
    if (!message.empty()) throw core::ConfigError(message, "", 0, key);
  }
}

TwoLevelStrategy::~TwoLevelStrategy() = default;

void TwoLevelStrategy::log_groups(const core::Comm& comm) const {
  // Every rank says its leader (a world rank) and its host; rank 0 writes one line: "t1: ranks 0-1; t2: ranks 2-3".
  std::string leader = std::to_string(comm.rank());
  group_.broadcast(leader, 0);
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) std::snprintf(host.data(), host.size(), "?");
  const auto all = comm.allgather_bytes(leader + " " + host.data());
  if (!comm.is_root()) return;
  std::map<int, std::pair<std::set<std::string>, std::vector<int>>> groups;  // leader -> hosts, ranks
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto space = all[r].find(' ');
    auto& g = groups[std::stoi(all[r].substr(0, space))];
    g.first.insert(all[r].substr(space + 1));
    g.second.push_back(static_cast<int>(r));
  }
  // At most 8 groups named, for the rank counts of a cluster.
  constexpr std::size_t kNamed = 8;
  std::vector<std::string> parts;
  for (const auto& [first, g] : groups) {
    if (parts.size() == kNamed) {
      parts.push_back(fmt::format("... ({} more)", groups.size() - kNamed));
      break;
    }
    parts.push_back(fmt::format("{}: ranks {}", fmt::join(g.first, "+"), core::rank_runs(g.second)));
  }
  spdlog::info("two-level: {} node group(s), leaders exchange by {}: {}", groups_,
               inter_ == Inter::easgd ? "easgd" : "allreduce", fmt::join(parts, "; "));
}

void TwoLevelStrategy::check_layout(const std::vector<Param*>& params, const std::vector<Buffer*>* buffers) const {
  std::size_t n_params = 0, n_buffers = layout_.buffers;
  bool grads_match = true;
  for (const auto* p : params) {
    n_params += p->value.size();
    grads_match = grads_match && p->grad.size() == p->value.size();
  }
  if (buffers != nullptr) {
    n_buffers = 0;
    for (const auto* b : *buffers) n_buffers += b->value.size();
  }
  if (!initialized_ || !grads_match || n_params != layout_.params || n_buffers != layout_.buffers) {
    throw core::InternalError(fmt::format(
        "two-level: the model's {} parameter values and {} buffer values (gradients {}) are not what the strategy "
        "was initialized with ({} and {}{})",
        n_params, n_buffers, grads_match ? "matching" : "of other sizes", layout_.params, layout_.buffers,
        initialized_ ? "" : ": initialize() has not run"));
  }
}

float* TwoLevelStrategy::result_area() {
  float* leader = window_ ? static_cast<float*>(window_->shared_pointer(0)) : private_.data();
  return leader + result_offset_;
}

float* TwoLevelStrategy::share_area() {
  float* leader = window_ ? static_cast<float*>(window_->shared_pointer(0)) : private_.data();
  return leader + share_offset_;
}

void TwoLevelStrategy::group_sync() const {
  if (!window_) return;
  window_->sync();
  group_.barrier();
  window_->sync();
}

void TwoLevelStrategy::add(CommStats& phase, double wait_seconds, double seconds, std::size_t bytes,
                           std::int64_t exchanges) {
  for (CommStats* s : {&phase, &stats_}) {
    s->wait_seconds += wait_seconds;
    s->seconds += seconds;
    s->bytes += static_cast<std::int64_t>(bytes);
    s->exchanges += exchanges;
  }
}

void TwoLevelStrategy::add_inter(const CommStats& before, const CommStats& after) {
  const CommStats d = after - before;
  add(phases_.inter, d.wait_seconds, d.seconds, static_cast<std::size_t>(d.bytes), d.exchanges);
}

void TwoLevelStrategy::initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  Strategy::initialize(params, buffers);
  window_.reset();  // collective, as its creation below
  private_.clear();
  layout_ = {};
  for (const auto* p : params) layout_.params += p->value.size();
  for (const auto* b : buffers) layout_.buffers += b->value.size();
  const std::size_t replica = layout_.params + layout_.buffers;
  // After an update the leader shares world rank 0's buffers (allreduce), or its own buffers, and at an exchange
  // its whole replica and centre (easgd).
  layout_.share = inter_ == Inter::allreduce ? layout_.buffers : 2 * replica;

  if (group_.size() > 1) {
    // Leader: [gradient input | group sum | share]; the others: [gradient input].
    result_offset_ = layout_.params;
    share_offset_ = 2 * layout_.params;
    const std::size_t floats = is_leader() ? share_offset_ + layout_.share : layout_.params;
    window_ = std::make_unique<core::Window>(group_, bytes_of(floats), static_cast<int>(sizeof(float)),
                                             core::Window::Kind::shared);
  } else if (inter_ == Inter::allreduce && comm_.size() > 1) {
    // A group of one: the sum is the rank's own gradients, no input area.
    result_offset_ = 0;
    share_offset_ = layout_.params;
    private_.assign(share_offset_ + layout_.share, 0.0f);
  }
  initialized_ = true;

  if (inter_ == Inter::easgd) {
    if (is_leader()) easgd_->initialize(params, buffers);  // the checkpoint's centre, after load_state()
    // Not counted in stats(), as Strategy::initialize.
    if (is_leader()) center_ = easgd_->center();
    group_.broadcast(center_, 0);
    if (is_leader()) center_.clear();  // the leader's centre lives in its EasgdStrategy
  }
}

void TwoLevelStrategy::reduce_gradients(const std::vector<Param*>& params) {
  const int k = group_.size();
  // Nothing to combine: one rank in all (allreduce), or a group of one whose replica is its own (easgd).
  if (inter_ == Inter::allreduce ? comm_.size() == 1 : k == 1) return;
  check_layout(params, nullptr);
  const std::size_t n = layout_.params;

  const auto start = clock_type::now();
  Epoch epoch(window_.get());
  float* sum = result_area();
  double wait = 0.0;
  if (k > 1) {
    // Every rank's gradients into its own segment, then each adds up its slice of all k segments.
    float* mine = static_cast<float*>(window_->local());
    for (const auto* p : params) mine = std::copy(p->grad.begin(), p->grad.end(), mine);
    const auto arrived = clock_type::now();
    group_sync();
    wait = core::seconds_since(arrived);
    std::vector<const float*> segments(static_cast<std::size_t>(k));
    for (int r = 0; r < k; ++r) segments[static_cast<std::size_t>(r)] = static_cast<float*>(window_->shared_pointer(r));
    const std::size_t r = static_cast<std::size_t>(group_.rank());
    const std::size_t first = n * r / static_cast<std::size_t>(k);
    const std::size_t last = n * (r + 1) / static_cast<std::size_t>(k);
    const float* s0 = segments[0];
    // Element-wise, segments in local-rank order: the same sums for any thread count.
#pragma omp parallel for simd schedule(static) if (last - first > kParallelMin)
    for (std::size_t j = first; j < last; ++j) sum[j] = s0[j];
    for (int q = 1; q < k; ++q) {
      const float* s = segments[static_cast<std::size_t>(q)];
#pragma omp parallel for simd schedule(static) if (last - first > kParallelMin)
      for (std::size_t j = first; j < last; ++j) sum[j] += s[j];
    }
    group_sync();
  } else {
    float* out = sum;
    for (const auto* p : params) out = std::copy(p->grad.begin(), p->grad.end(), out);
  }
  add(phases_.shared, wait, core::seconds_since(start) - wait, bytes_of(k > 1 ? n : 0), k > 1 ? 1 : 0);

  float scale = 1.0f / static_cast<float>(k);
  if (inter_ == Inter::allreduce) {
    scale = 1.0f / static_cast<float>(comm_.size());
    if (groups_ > 1) {
      const auto inter_start = clock_type::now();
      double inter_wait = 0.0;
      if (is_leader()) {
        const auto arrived = clock_type::now();
        leaders_.barrier();
        inter_wait = core::seconds_since(arrived);
        leaders_.allreduce(sum, n, core::ReduceOp::sum);
      }
      group_sync();  // the others wait for their leader's result
      add(phases_.inter, inter_wait, core::seconds_since(inter_start) - inter_wait, is_leader() ? bytes_of(n) : 0,
          is_leader() ? 1 : 0);
    }
  }

  const auto read_start = clock_type::now();
  const float* in = sum;
  for (auto* p : params) {
    float* g = p->grad.data();
    const std::size_t m = p->grad.size();
#pragma omp parallel for simd schedule(static) if (m > kParallelMin)
    for (std::size_t j = 0; j < m; ++j) g[j] = in[j] * scale;
    in += m;
  }
  epoch.end();
  add(phases_.shared, 0.0, core::seconds_since(read_start), 0, 0);
}

void TwoLevelStrategy::after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                    std::int64_t step) {
  check_layout(params, &buffers);
  const int k = group_.size();
  const auto start = clock_type::now();

  if (inter_ == Inter::allreduce) {
    // World rank 0's batch-norm statistics to every rank: rank 0 → leaders → their groups.
    if (comm_.size() == 1 || layout_.buffers == 0) return;
    Epoch epoch(window_.get());
    float* shared = share_area();
    if (comm_.rank() == 0) pack_values({}, buffers, shared);
    double inter_wait = 0.0, inter_seconds = 0.0;
    if (groups_ > 1 && is_leader()) {
      const auto arrived = clock_type::now();
      leaders_.barrier();
      const auto moving = clock_type::now();
      inter_wait = std::chrono::duration<double>(moving - arrived).count();
      leaders_.broadcast(shared, bytes_of(layout_.buffers), 0);
      inter_seconds = core::seconds_since(moving);
      add(phases_.inter, inter_wait, inter_seconds, bytes_of(layout_.buffers), 1);
    }
    const auto arrived = clock_type::now();
    group_sync();
    const double wait = core::seconds_since(arrived);
    if (comm_.rank() != 0) unpack_values(shared, {}, buffers);
    epoch.end();
    add(phases_.shared, wait, core::seconds_since(start) - wait - inter_wait - inter_seconds,
        k > 1 && is_leader() ? bytes_of(layout_.buffers) : 0, k > 1 ? 1 : 0);
    return;
  }

  // easgd: the leaders' exchange every tau steps, then the leader's replica to its group.
  const bool exchanged = step % tau_ == 0;
  if (is_leader()) {
    const CommStats before = easgd_->stats();
    easgd_->after_update(params, buffers, step);
    add_inter(before, easgd_->stats());
  }
  if (k == 1 || (!exchanged && layout_.buffers == 0)) return;
  const auto share_start = clock_type::now();
  Epoch epoch(window_.get());
  float* shared = share_area();
  // Between exchanges only the batch-norm statistics differ inside the group (gradients were averaged).
  const std::size_t count = exchanged ? 2 * (layout_.params + layout_.buffers) : layout_.buffers;
  if (is_leader()) {
    if (exchanged) {
      float* end = pack_values(params, buffers, shared);
      std::copy(easgd_->center().begin(), easgd_->center().end(), end);
    } else {
      pack_values({}, buffers, shared);
    }
  }
  const auto arrived = clock_type::now();
  group_sync();
  const double wait = core::seconds_since(arrived);
  if (!is_leader()) {
    if (exchanged) {
      const float* c = unpack_values(shared, params, buffers);
      center_.assign(c, c + static_cast<std::ptrdiff_t>(layout_.params + layout_.buffers));
    } else {
      unpack_values(shared, {}, buffers);
    }
  }
  epoch.end();
  add(phases_.shared, wait, core::seconds_since(share_start) - wait, is_leader() ? bytes_of(count) : 0, 1);
}

const std::vector<float>& TwoLevelStrategy::center() const {
  if (easgd_) return easgd_->center();
  return center_;
}

void TwoLevelStrategy::with_evaluation_model(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                             const std::function<void()>& fn) {
  if (inter_ == Inter::allreduce) {
    fn();
    return;
  }
  if (easgd_) {
    easgd_->with_evaluation_model(params, buffers, fn);
    return;
  }
  check_layout(params, &buffers);
  run_with_values(params, buffers, center_, saved_, fn);
}

void TwoLevelStrategy::set_center_buffers(const std::vector<Buffer*>& buffers) {
  if (inter_ == Inter::allreduce) {
    Strategy::set_center_buffers(buffers);
  } else if (easgd_) {
    easgd_->set_center_buffers(buffers);
  } else {
    store_buffers(buffers, layout_.buffers, center_);
  }
}

void TwoLevelStrategy::save_state(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                  io::Checkpoint& checkpoint) const {
  if (inter_ == Inter::allreduce) return;
  if (easgd_) {
    easgd_->save_state(params, buffers, checkpoint);
    return;
  }
  if (!initialized_ || center_.size() < layout_.params)
    throw core::InternalError("two-level: save_state before initialize");
  center_to_checkpoint(center_, params, buffers, checkpoint);
}

void TwoLevelStrategy::load_state(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                                  const std::vector<Buffer*>& buffers) {
  // Non-leaders receive the centre from their leader in initialize().
  if (easgd_) easgd_->load_state(checkpoint, params, buffers);
}

}  // namespace tessera::engine
