#include "engine/strategy_async.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fault.h"
#include "engine/checkpoint_adapter.h"

namespace tessera::engine {

namespace {

using clock_type = core::MpiClock;             // simulated time under SMPI (core/comm.h)
constexpr std::size_t kParallelMin = 1 << 16;  // elements: below this, threads cost more than they save

double seconds_between(clock_type::time_point from, clock_type::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Calls fn(values) for every parameter's values, then every buffer's: the order of the flat centre.
template <class F>
void for_each_tensor(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, F&& fn) {
  for (auto* p : params) fn(p->value);
  for (auto* b : buffers) fn(b->value);
}

// Calls fn(x, count, at) for every run of tensor values that lies in the flat range [first, last): x points at
// the run's first value, `at` is the run's position relative to `first`.
template <class F>
void for_each_run(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, std::size_t first,
                  std::size_t last, F&& fn) {
  std::size_t offset = 0;
  for_each_tensor(params, buffers, [&](std::vector<float>& values) {
    const std::size_t lo = std::max(first, offset);
    const std::size_t hi = std::min(last, offset + values.size());
    if (lo < hi) fn(values.data() + (lo - offset), hi - lo, lo - first);
    offset += values.size();
  });
}

}  // namespace

// The option checks and α are EasgdStrategy's (a throwaway instance: its constructor only validates).
AsyncEasgdStrategy::AsyncEasgdStrategy(const core::Comm& comm, const StrategyOptions& options)
    : Strategy(comm), tau_(options.tau), alpha_(EasgdStrategy(comm, options).alpha()) {}

AsyncEasgdStrategy::~AsyncEasgdStrategy() = default;

std::pair<std::size_t, std::size_t> AsyncEasgdStrategy::shard(int rank) const {
  const auto p = static_cast<std::size_t>(comm_.size());
  const auto r = static_cast<std::size_t>(rank);
  return {total_ * r / p, total_ * (r + 1) / p};
}

void AsyncEasgdStrategy::check_layout(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) const {
  check_flat_layout("async-easgd", sizes_, params, buffers);
}

void AsyncEasgdStrategy::initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  Strategy::initialize(params, buffers);
  taken_ = false;
  sizes_.clear();
  total_ = 0;
  for_each_tensor(params, buffers, [&](const std::vector<float>& v) {
    sizes_.push_back(v.size());
    total_ += v.size();
  });
  if (loaded_.size() > sizes_.size())
    throw core::InternalError("async-easgd: the checkpoint's centre has too many tensors");
  for (std::size_t i = 0; i < loaded_.size(); ++i) {
    if (loaded_[i].size() != sizes_[i]) {
      throw core::InternalError(
          fmt::format("async-easgd: the checkpoint's centre's tensor {} has {} values, the model's {}", i,
                      loaded_[i].size(), sizes_[i]));
    }
  }

  window_.reset();  // collective, like the creation below: every rank calls initialize()
  const auto [first, last] = shard(comm_.rank());
  window_ = std::make_unique<core::Window>(comm_, (last - first) * sizeof(float), static_cast<int>(sizeof(float)));
  std::size_t largest = 0;
  for (int r = 0; r < comm_.size(); ++r) largest = std::max(largest, shard(r).second - shard(r).first);
  slice_center_.assign(largest, 0.0f);
  slice_diff_.assign(largest, 0.0f);

  // This rank's slice of the initial centre: the (broadcast) replica, or the checkpoint's centre for the
  // parameters (and the buffers, when the file has them). Stores into the window's memory, inside an exclusive epoch on
  // this rank's own window.
  if (last > first) {
    auto* mine = static_cast<float*>(window_->local());
    window_->lock(comm_.rank(), true);
    for_each_run(params, buffers, first, last,
                 [&](const float* x, std::size_t n, std::size_t at) { std::copy_n(x, n, mine + at); });
    std::size_t offset = 0;
    for (std::size_t i = 0; i < loaded_.size(); ++i) {
      const std::size_t lo = std::max(first, offset);
      const std::size_t hi = std::min(last, offset + sizes_[i]);
      if (lo < hi) std::copy_n(loaded_[i].data() + (lo - offset), hi - lo, mine + (lo - first));
      offset += sizes_[i];
    }
    window_->unlock(comm_.rank());
  }
  loaded_.clear();
  // Nobody exchanges before every slice holds the initial centre.
  comm_.barrier();
}

void AsyncEasgdStrategy::after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                      std::int64_t step) {
  if (step % tau_ == 0) exchange(params, buffers);
}

void AsyncEasgdStrategy::exchange(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                  std::vector<double>* sent) {
  if (!window_) throw core::InternalError("async-easgd: exchange() before initialize()");
  check_layout(params, buffers);
  if (sent != nullptr && sent->size() != total_) sent->assign(total_, 0.0);
  const float alpha = alpha_;
  const int p = comm_.size();
  taken_ = false;  // the centre moves
  // Owners in turn from this rank's own: ranks that exchange at the same moment start on different shards.
  for (int k = 0; k < p; ++k) {
    const int owner = (comm_.rank() + k) % p;
    const auto [first, last] = shard(owner);
    if (last == first) continue;
    const std::size_t n = last - first;
    const auto t_lock = clock_type::now();
    window_->lock(owner, true);
    const auto t_locked = clock_type::now();
    window_->get(slice_center_.data(), n * sizeof(float), owner, 0);
    window_->flush(owner);  // c is needed before d can be computed
    for_each_run(params, buffers, first, last, [&](float* x, std::size_t m, std::size_t at) {
      const float* c = slice_center_.data() + at;
      float* d = slice_diff_.data() + at;
      // Element-wise: the same result for any thread count.
#pragma omp parallel for simd schedule(static) if (m > kParallelMin)
      for (std::size_t j = 0; j < m; ++j) {
        d[j] = alpha * (x[j] - c[j]);
        x[j] -= d[j];
      }
    });
    window_->accumulate_sum(slice_diff_.data(), n, owner, 0);
    window_->unlock(owner);
    const auto t_done = clock_type::now();
    stats_.wait_seconds += seconds_between(t_lock, t_locked);
    stats_.seconds += seconds_between(t_locked, t_done);
    stats_.bytes += static_cast<std::int64_t>(2 * n * sizeof(float));
    if (sent != nullptr) {
      for (std::size_t j = 0; j < n; ++j) (*sent)[first + j] += static_cast<double>(slice_diff_[j]);
    }
  }
  ++stats_.exchanges;
}

void AsyncEasgdStrategy::settle(const std::vector<Param*>&, const std::vector<Buffer*>&) {
  // Every exchange ended with an unlock, which completed its accumulate at the target: once every rank is past
  // its last one (this allreduce), the centre is final. When no rank has exchanged since the last settle, every
  // rank still holds the centre taken then.
  const std::int64_t moved = comm_.allreduce_value<std::int64_t>(taken_ ? 0 : 1, core::ReduceOp::max);
  if (moved == 0) return;
  // Taken once, by rank 0; the broadcast holds every other rank until it is taken (none can leave it, and exchange
  // again, before rank 0 has fetched) and gives them the same values.
  if (comm_.is_root()) {
    taken_center_ = fetch_center();
    // Fault point "async-easgd.center-taken" (core/fault.h): rank 0, the centre taken, the other ranks held.
    core::fault::at("async-easgd.center-taken");
  } else {
    taken_center_.assign(total_, 0.0f);
  }
  comm_.broadcast(taken_center_.data(), taken_center_.size() * sizeof(float), 0);
  taken_ = true;
}

std::vector<float> AsyncEasgdStrategy::fetch_center() const {
  if (!window_) throw core::InternalError("async-easgd: fetch_center() before initialize()");
  std::vector<float> center(total_);
  for (int owner = 0; owner < comm_.size(); ++owner) {
    const auto [first, last] = shard(owner);
    if (last == first) continue;
    window_->lock(owner, false);
    window_->get(center.data() + first, (last - first) * sizeof(float), owner, 0);
    window_->unlock(owner);
  }
  return center;
}

void AsyncEasgdStrategy::with_evaluation_model(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                               const std::function<void()>& fn) {
  check_layout(params, buffers);
  run_with_values(params, buffers, taken_ ? taken_center_ : fetch_center(), replica_, fn);
}

void AsyncEasgdStrategy::set_center_buffers(const std::vector<Buffer*>& buffers) {
  if (!taken_) throw core::InternalError("async-easgd: set_center_buffers() without the centre settle() takes");
  const std::size_t values = last_tensors_size(sizes_, buffers.size());
  store_buffers(buffers, values, taken_center_);
  // The windows' centre too, each rank its own slice of the buffers (under an exclusive lock of its own window, as
  // initialize() fills it), so that the exchanges go on from the values validated and saved.
  const auto [first, last] = shard(comm_.rank());
  const std::size_t lo = std::max(first, total_ - values);
  if (lo < last) {
    auto* mine = static_cast<float*>(window_->local());
    window_->lock(comm_.rank(), true);
    std::copy(taken_center_.begin() + static_cast<std::ptrdiff_t>(lo),
              taken_center_.begin() + static_cast<std::ptrdiff_t>(last), mine + (lo - first));
    window_->unlock(comm_.rank());
  }
  // No rank exchanges again before every slice holds them.
  comm_.barrier();
}

void AsyncEasgdStrategy::save_state(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                    io::Checkpoint& checkpoint) const {
  if (sizes_.size() < params.size()) throw core::InternalError("async-easgd: save_state before initialize");
  check_layout(params, buffers);
  center_to_checkpoint(taken_ ? taken_center_ : fetch_center(), params, buffers, checkpoint);
}

void AsyncEasgdStrategy::load_state(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                                    const std::vector<Buffer*>& buffers) {
  loaded_ = center_from_checkpoint(checkpoint, params, buffers);
}

}  // namespace tessera::engine
