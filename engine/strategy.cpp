#include "engine/strategy.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "engine/models/model.h"
#include "engine/sequential.h"
#include "engine/strategy_async.h"
#include "engine/strategy_two_level.h"

namespace tessera::engine {

namespace {

constexpr int kMaxTau = 1000000;
constexpr std::size_t kParallelMin = 1 << 16;  // elements: below this, threads cost more than they save
constexpr double kFirstBucketMb = 1.0;         // allreduce: the first bucket closes once past this (as DDP's)
// allreduce: how often the communication thread tests the buckets in flight (a wait that new buckets end early).
constexpr auto kProgressInterval = std::chrono::microseconds(100);

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::size_t total_size(const std::vector<std::size_t>& sizes) {
  std::size_t n = 0;
  for (auto s : sizes) n += s;
  return n;
}

// Calls fn(values) for every parameter's values, then every buffer's: the order of the flat centre.
template <class F>
void for_each_tensor(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, F&& fn) {
  for (auto* p : params) fn(p->value);
  for (auto* b : buffers) fn(b->value);
}

}  // namespace

// ------------------------------------------------------------------------------------------------- Strategy

float* pack_values(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers, float* out) {
  for (const auto* p : params) out = std::copy(p->value.begin(), p->value.end(), out);
  for (const auto* b : buffers) out = std::copy(b->value.begin(), b->value.end(), out);
  return out;
}

const float* unpack_values(const float* in, const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  for (auto* p : params) {
    std::copy_n(in, p->value.size(), p->value.begin());
    in += p->value.size();
  }
  for (auto* b : buffers) {
    std::copy_n(in, b->value.size(), b->value.begin());
    in += b->value.size();
  }
  return in;
}

void store_buffers(const std::vector<Buffer*>& buffers, std::size_t buffer_values, std::vector<float>& model) {
  std::size_t values = 0;
  for (const auto* b : buffers) values += b->value.size();
  if (values != buffer_values || buffer_values > model.size()) {
    throw core::InternalError(fmt::format("buffers of {} values for the last {} values of a model of {}", values,
                                          buffer_values, model.size()));
  }
  auto at = model.end() - static_cast<std::ptrdiff_t>(buffer_values);
  for (const auto* b : buffers) at = std::copy(b->value.begin(), b->value.end(), at);
}

std::size_t last_tensors_size(const std::vector<std::size_t>& sizes, std::size_t count) {
  if (count > sizes.size()) {
    throw core::InternalError(fmt::format("the last {} tensors of a model of {}", count, sizes.size()));
  }
  std::size_t n = 0;
  for (std::size_t i = sizes.size() - count; i < sizes.size(); ++i) n += sizes[i];
  return n;
}

void run_with_values(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                     const std::vector<float>& model, std::vector<float>& backup, const std::function<void()>& fn) {
  std::size_t total = 0;
  for (const auto* p : params) total += p->value.size();
  for (const auto* b : buffers) total += b->value.size();
  if (model.size() != total) {
    throw core::InternalError(fmt::format("a model of {} values for tensors of {}", model.size(), total));
  }
  backup.resize(total);
  pack_values(params, buffers, backup.data());
  unpack_values(model.data(), params, buffers);
  struct Restore {
    const std::vector<Param*>& params;
    const std::vector<Buffer*>& buffers;
    const std::vector<float>& replica;
    ~Restore() { unpack_values(replica.data(), params, buffers); }
  } restore{params, buffers, backup};
  fn();
}

void check_flat_layout(const char* strategy, const std::vector<std::size_t>& sizes, const std::vector<Param*>& params,
                       const std::vector<Buffer*>& buffers) {
  std::size_t i = 0;
  bool same = params.size() + buffers.size() == sizes.size();
  if (same) {
    for_each_tensor(params, buffers, [&](const std::vector<float>& v) { same = same && v.size() == sizes[i++]; });
  }
  if (!same) {
    throw core::InternalError(
        fmt::format("{}: the model's {} parameters and {} buffers are not the tensors the "
                    "strategy was initialized with ({} tensors)",
                    strategy, params.size(), buffers.size(), sizes.size()));
  }
}

void center_to_checkpoint(const std::vector<float>& center, const std::vector<Param*>& params,
                          const std::vector<Buffer*>& buffers, io::Checkpoint& checkpoint) {
  std::vector<std::vector<float>> tensors;
  tensors.reserve(params.size() + buffers.size());
  auto at = center.begin();
  auto take = [&](const std::string& name, std::size_t n) {
    if (static_cast<std::size_t>(center.end() - at) < n) {
      throw core::InternalError(fmt::format("the centre ({} values) ends before '{}'", center.size(), name));
    }
    tensors.emplace_back(at, at + static_cast<std::ptrdiff_t>(n));
    at += static_cast<std::ptrdiff_t>(n);
  };
  for (const auto* p : params) take(p->name, p->value.size());
  checkpoint.easgd_center = to_checkpoint_center(tensors, params);
  tensors.clear();
  for (const auto* b : buffers) take(b->name, b->value.size());
  checkpoint.easgd_center_buffers = to_checkpoint_center_buffers(tensors, buffers);
}

std::vector<std::vector<float>> center_from_checkpoint(const io::Checkpoint& checkpoint,
                                                       const std::vector<Param*>& params,
                                                       const std::vector<Buffer*>& buffers) {
  if (checkpoint.easgd_center.empty()) return {};
  auto tensors = from_checkpoint_center(checkpoint.easgd_center, params);
  if (!checkpoint.easgd_center_buffers.empty()) {
    for (auto& b : from_checkpoint_center_buffers(checkpoint.easgd_center_buffers, buffers)) {
      tensors.push_back(std::move(b));
    }
  }
  return tensors;
}

void Strategy::initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  if (comm_.size() == 1) return;
  for (auto* p : params) comm_.broadcast(p->value.data(), p->value.size() * sizeof(float), 0);
  for (auto* b : buffers) comm_.broadcast(b->value.data(), b->value.size() * sizeof(float), 0);
}

void Strategy::with_evaluation_model(const std::vector<Param*>&, const std::vector<Buffer*>&,
                                     const std::function<void()>& fn) {
  fn();
}

void Strategy::set_center_buffers(const std::vector<Buffer*>&) {
  throw core::InternalError(fmt::format("{}: the evaluated model is the replica, it has no centre to set", name()));
}

// ----------------------------------------------------------------------------------------------- allreduce

// Reports the end of every watched module's backward to its strategy.
class AllreduceStrategy::Watcher final : public ModuleObserver {
 public:
  explicit Watcher(AllreduceStrategy& strategy) : strategy_(strategy) {}
  void begin(const Module&, Pass) override {}
  void end(const Module& child, Pass pass) override {
    if (pass != Pass::backward || !strategy_.armed_) return;
    for (auto& [module, params] : strategy_.module_params_) {
      if (module != &child) continue;
      for (Param* p : params) strategy_.ready(p);
      break;
    }
  }

 private:
  AllreduceStrategy& strategy_;
};

// The communication thread of the buckets (distributed.progress "thread"). The training thread hands it the
// buckets backward has completed, in order (hand); the thread starts their allreduces and tests the ones in flight
// every kProgressInterval until all are reduced; the training thread then waits for it (wait). Between wait() and
// the next hand() the thread makes no MPI call, so the two threads never call MPI at once (MPI_THREAD_SERIALIZED).
class AllreduceStrategy::Progress {
 public:
  explicit Progress(AllreduceStrategy& strategy) : strategy_(strategy), thread_([this] { run(); }) {}
  ~Progress() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();  // requests still in flight (a step cut short by an exception) are left to MPI
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A new pass: nothing handed yet.
  void begin() {
    std::lock_guard lock(mutex_);
    handed_ = posted_ = reduced_ = 0;
    error_ = nullptr;
  }
  // Buckets [0, n) are packed and may start.
  void hand(std::size_t n) {
    {
      std::lock_guard lock(mutex_);
      handed_ = n;
    }
    wake_.notify_all();
  }
  // Waits until the first n buckets are reduced; rethrows what the thread caught.
  void wait(std::size_t n) {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return reduced_ >= n || error_ != nullptr; });
    if (error_ != nullptr) std::rethrow_exception(error_);
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      // After an error nothing more is posted or tested in this pass (the training thread rethrows it at wait()).
      auto work = [&] { return stop_ || (error_ == nullptr && posted_ < handed_); };
      if (error_ == nullptr && reduced_ < posted_) {
        wake_.wait_for(lock, kProgressInterval, work);
      } else {
        wake_.wait(lock, work);
      }
      if (stop_) return;
      if (error_ != nullptr) continue;
      const std::size_t handed = handed_;
      std::size_t posted = posted_;
      std::size_t reduced = reduced_;
      lock.unlock();
      std::exception_ptr error;
      try {
        auto& buckets = strategy_.buckets_;
        for (; posted < handed; ++posted) {
          buckets[posted].request =
              strategy_.comm_.iallreduce_sum(buckets[posted].data.data(), buckets[posted].data.size());
        }
        // Every request in flight is tested (each call moves all of them); they complete in order in practice.
        for (std::size_t i = reduced; i < posted; ++i) {
          if (buckets[i].request != MPI_REQUEST_NULL && core::Comm::test(buckets[i].request)) {
            buckets[i].timing.reduced_s = seconds_between(strategy_.backward_start_, std::chrono::steady_clock::now());
          }
        }
        while (reduced < posted && buckets[reduced].request == MPI_REQUEST_NULL) ++reduced;
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      posted_ = posted;
      reduced_ = reduced;
      if (error != nullptr) error_ = error;  // idle until the next pass's begin() (the job is going down)
      done_.notify_all();
    }
  }

  AllreduceStrategy& strategy_;
  std::mutex mutex_;
  std::condition_variable wake_;  // the thread: new buckets, or stop
  std::condition_variable done_;  // the training thread: more buckets reduced, or an error
  std::size_t handed_ = 0, posted_ = 0, reduced_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once everything above is constructed
};

AllreduceStrategy::AllreduceStrategy(const core::Comm& comm, const StrategyOptions& options)
    : Strategy(comm), bucket_mb_(options.bucket_mb), progress_mode_(options.progress) {
  if (!(options.bucket_mb >= 0.0)) {
    throw core::ConfigError(fmt::format("bucket_mb {} is negative", options.bucket_mb), "", 0, "distributed.bucket_mb");
  }
  if (progress_mode_ != "thread" && progress_mode_ != "boundaries") {
    throw core::ConfigError(fmt::format("progress '{}' is neither 'thread' nor 'boundaries'", progress_mode_), "", 0,
                            "distributed.progress");
  }
}

AllreduceStrategy::~AllreduceStrategy() {
  progress_.reset();
  for (auto* seq : watched_) seq->set_observer(nullptr);
  // Requests still in flight (a step cut short by an exception) are left to MPI: the job is going down.
}

void AllreduceStrategy::attach(Model& model) {
  if (comm_.size() == 1 || bucket_mb_ <= 0.0) return;
  progress_.reset();
  for (auto* seq : watched_) seq->set_observer(nullptr);
  watched_.clear();
  module_params_.clear();
  buckets_.clear();
  slots_.clear();
  // The body and every Sequential below it (ResNet's layerN): their children are the units whose end of backward
  // is reported; a parameter is reported by the first (innermost) watched module that ends after it is complete.
  std::vector<Sequential*> stack = {&model.body()};
  while (!stack.empty()) {
    Sequential* seq = stack.back();
    stack.pop_back();
    watched_.push_back(seq);
    for (std::size_t i = 0; i < seq->size(); ++i) {
      Module& child = (*seq)[i];
      std::vector<Param*> params;
      std::vector<Buffer*> buffers;
      child.collect(params, buffers);
      if (!params.empty()) module_params_.emplace_back(&child, std::move(params));
      if (auto* nested = dynamic_cast<Sequential*>(&child)) stack.push_back(nested);
    }
  }
  if (!watcher_) watcher_ = std::make_unique<Watcher>(*this);
  for (auto* seq : watched_) seq->set_observer(watcher_.get());

  // Buckets over the parameters in backward order (the reverse of the model's); the first one small.
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  model.collect(params, buffers);
  auto limit = [&](std::size_t bucket) {
    const double mb = bucket == 0 ? std::min(kFirstBucketMb, bucket_mb_) : bucket_mb_;
    return static_cast<std::size_t>(std::max(1.0, mb * 1048576.0 / sizeof(float)));
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (buckets_.empty() || buckets_.back().data.size() >= limit(buckets_.size() - 1)) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    slots_.emplace_back(*it, Slot{buckets_.size() - 1, b.data.size(), false});
    b.params.push_back(*it);
    b.data.resize(b.data.size() + (*it)->value.size());
  }
  std::sort(slots_.begin(), slots_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });

  if (progress_mode_ == "thread") {
    int level = MPI_THREAD_SINGLE;
    TESSERA_MPI_CHECK(MPI_Query_thread(&level));
    if (level >= MPI_THREAD_SERIALIZED) {
      progress_ = std::make_unique<Progress>(*this);
    } else if (comm_.is_root()) {
      spdlog::info(
          "allreduce: MPI offers thread level {} (below MPI_THREAD_SERIALIZED): the buckets progress between modules",
          level);
    }
  }
}

AllreduceStrategy::Slot* AllreduceStrategy::find_slot(const Param* p) {
  auto it =
      std::lower_bound(slots_.begin(), slots_.end(), p, [](const auto& s, const Param* q) { return s.first < q; });
  return it != slots_.end() && it->first == p ? &it->second : nullptr;
}

void AllreduceStrategy::before_backward(bool completes_step) {
  armed_ = completes_step && !buckets_.empty();
  if (!armed_) return;
  for (auto& [param, slot] : slots_) slot.reported = false;
  for (auto& b : buckets_) {
    if (b.started) throw core::InternalError("allreduce: a bucket of the previous step was never completed");
    b.pending = b.params.size();
    b.timing = {b.data.size() * sizeof(float), 0.0, 0.0};
  }
  next_start_ = 0;
  overlapped_ = 0;
  pass_comm_seconds_ = 0.0;
  if (progress_) progress_->begin();
  backward_start_ = std::chrono::steady_clock::now();
}

void AllreduceStrategy::ready(Param* p) {
  Slot* slot = find_slot(p);
  if (slot == nullptr || slot->reported) return;
  slot->reported = true;
  Bucket& b = buckets_[slot->bucket];
  if (p->grad.size() != p->value.size()) {
    throw core::InternalError(fmt::format("allreduce: the gradient of '{}' has {} values, the parameter {}", p->name,
                                          p->grad.size(), p->value.size()));
  }
  std::copy(p->grad.begin(), p->grad.end(), b.data.begin() + static_cast<std::ptrdiff_t>(slot->offset));
  if (--b.pending == 0) b.timing.ready_s = seconds_between(backward_start_, std::chrono::steady_clock::now());
  if (progress_) return start_ready_buckets();  // no MPI call on this thread: the communication thread makes them
  const auto t0 = core::MpiClock::now();
  start_ready_buckets();
  // Open MPI moves non-blocking collectives forward only inside MPI calls: test the ones in flight.
  for (std::size_t i = 0; i < next_start_; ++i) {
    if (buckets_[i].request != MPI_REQUEST_NULL && core::Comm::test(buckets_[i].request)) {
      buckets_[i].timing.reduced_s = seconds_between(backward_start_, std::chrono::steady_clock::now());
    }
  }
  pass_comm_seconds_ += std::chrono::duration<double>(core::MpiClock::now() - t0).count();
}

void AllreduceStrategy::start_ready_buckets() {
  // In bucket order on every rank: MPI requires collectives, non-blocking ones too, in the same order everywhere.
  const std::size_t before = next_start_;
  while (next_start_ < buckets_.size() && buckets_[next_start_].pending == 0) {
    Bucket& b = buckets_[next_start_++];
    if (!progress_) b.request = comm_.iallreduce_sum(b.data.data(), b.data.size());
    b.started = true;
    if (armed_) ++overlapped_;
  }
  if (progress_ && next_start_ > before) progress_->hand(next_start_);
}

void AllreduceStrategy::reduce_gradients(const std::vector<Param*>& params) {
  if (comm_.size() == 1) return;
  if (!armed_) return fused_reduce(params);
  armed_ = false;
  if (params.size() != slots_.size()) {
    throw core::InternalError(
        fmt::format("allreduce: {} parameters to reduce, {} were attached", params.size(), slots_.size()));
  }
  const auto backward_end = std::chrono::steady_clock::now();
  // The wait is timed with MPI's clock (simulated time under SMPI), except while the communication thread may be
  // inside MPI: under MPI_THREAD_SERIALIZED this thread then makes no MPI call, MPI_Wtime included.
  const auto t0 = progress_ ? core::MpiClock::time_point{} : core::MpiClock::now();
  const auto t0_steady = std::chrono::steady_clock::now();
  // Parameters backward did not report (none in Tessera's models): packed now, their buckets started in order.
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const Slot* slot = find_slot(*it);
    if (slot == nullptr)
      throw core::InternalError(fmt::format("allreduce: parameter '{}' was not attached", (*it)->name));
    if (!slot->reported) ready(*it);
  }
  start_ready_buckets();
  if (next_start_ != buckets_.size()) {
    throw core::InternalError(fmt::format("allreduce: {} of {} buckets were never complete (a parameter given twice?)",
                                          buckets_.size() - next_start_, buckets_.size()));
  }
  if (progress_) progress_->wait(buckets_.size());
  const float scale = 1.0f / static_cast<float>(comm_.size());
  std::size_t bytes = 0;
  for (auto& b : buckets_) {
    if (b.request != MPI_REQUEST_NULL) {
      core::Comm::wait(b.request);
      b.timing.reduced_s = seconds_between(backward_start_, std::chrono::steady_clock::now());
    }
    b.started = false;
    std::size_t offset = 0;
    for (Param* p : b.params) {
      const float* src = b.data.data() + offset;
      for (std::size_t i = 0; i < p->grad.size(); ++i) p->grad[i] = src[i] * scale;
      offset += p->grad.size();
    }
    bytes += b.data.size() * sizeof(float);
  }
  timeline_.backward_end_s = seconds_between(backward_start_, backward_end);
  timeline_.buckets.clear();
  for (const auto& b : buckets_) timeline_.buckets.push_back(b.timing);
  // No barrier here: the time counted is what the step waited for communication backward did not hide.
  const double waited = progress_ ? seconds_between(t0_steady, std::chrono::steady_clock::now())
                                  : std::chrono::duration<double>(core::MpiClock::now() - t0).count();
  stats_.seconds += pass_comm_seconds_ + waited;
  stats_.bytes += static_cast<std::int64_t>(bytes);
  stats_.exchanges += static_cast<std::int64_t>(buckets_.size());
  pass_comm_seconds_ = 0.0;
}

void AllreduceStrategy::fused_reduce(const std::vector<Param*>& params) {
  std::size_t total = 0;
  for (const auto* p : params) total += p->grad.size();
  flat_.resize(total);
  std::size_t offset = 0;
  for (const auto* p : params) {
    std::memcpy(flat_.data() + offset, p->grad.data(), p->grad.size() * sizeof(float));
    offset += p->grad.size();
  }
  timed(flat_.size() * sizeof(float), [&] { comm_.allreduce(flat_.data(), flat_.size(), core::ReduceOp::sum); });
  const float scale = 1.0f / static_cast<float>(comm_.size());
  offset = 0;
  for (auto* p : params) {
    for (std::size_t i = 0; i < p->grad.size(); ++i) p->grad[i] = flat_[offset + i] * scale;
    offset += p->grad.size();
  }
}

void AllreduceStrategy::after_update(const std::vector<Param*>&, const std::vector<Buffer*>& buffers, std::int64_t) {
  if (comm_.size() == 1 || buffers.empty()) return;
  std::size_t total = 0;
  for (const auto* b : buffers) total += b->value.size();
  if (total == 0) return;
  flat_.resize(total);
  std::size_t offset = 0;
  for (const auto* b : buffers) {
    std::copy(b->value.begin(), b->value.end(), flat_.begin() + static_cast<std::ptrdiff_t>(offset));
    offset += b->value.size();
  }
  timed(flat_.size() * sizeof(float), [&] { comm_.broadcast(flat_.data(), flat_.size() * sizeof(float), 0); });
  offset = 0;
  for (auto* b : buffers) {
    std::copy_n(flat_.begin() + static_cast<std::ptrdiff_t>(offset), b->value.size(), b->value.begin());
    offset += b->value.size();
  }
}

// --------------------------------------------------------------------------------------------------- easgd

EasgdStrategy::EasgdStrategy(const core::Comm& comm, const StrategyOptions& options)
    : Strategy(comm), options_(options) {
  auto bad = [](const std::string& key, const std::string& why) {
    return core::ConfigError(why, "", 0, fmt::format("distributed.{}", key));
  };
  if (options.tau < 1 || options.tau > kMaxTau)
    throw bad("tau", fmt::format("tau {} is not in [1, {}]", options.tau, kMaxTau));
  if (!(options.beta >= 0.0 && options.beta <= 1.0))
    throw bad("beta", fmt::format("beta {} is not in [0, 1]", options.beta));
  if (!(options.alpha >= 0.0 && options.alpha <= 1.0)) {
    throw bad("alpha", fmt::format("alpha {} is not in [0, 1]", options.alpha));
  }
  if (options.center_sync_every < 0) {
    throw bad("center_sync_every", fmt::format("center_sync_every {} is negative", options.center_sync_every));
  }
  alpha_ = static_cast<float>(options.alpha > 0.0 ? options.alpha : options.beta / comm.size());
  // The centre moves by alpha * sum over ranks of (x_i - centre): beyond p * alpha = 1 it overshoots the
  // replicas' mean (and batch-norm variances averaged into it could turn negative).
  if (static_cast<double>(alpha_) * comm.size() > 1.0) {
    throw bad("alpha", fmt::format("alpha {} x {} ranks = {} exceeds 1: the centre would overshoot; use "
                                   "distributed.beta (alpha = beta / ranks) or alpha <= {}",
                                   options.alpha, comm.size(), options.alpha * comm.size(), 1.0 / comm.size()));
  }
}

void EasgdStrategy::check_layout(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) const {
  check_flat_layout("easgd", sizes_, params, buffers);
}

void EasgdStrategy::initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  Strategy::initialize(params, buffers);
  sizes_.clear();
  for_each_tensor(params, buffers, [&](const std::vector<float>& v) { sizes_.push_back(v.size()); });
  center_.clear();
  center_.reserve(total_size(sizes_));
  for_each_tensor(params, buffers,
                  [&](const std::vector<float>& v) { center_.insert(center_.end(), v.begin(), v.end()); });
  if (!loaded_.empty()) {
    // A resumed run: the checkpoint's centre, its parameters and (when the file has them) its buffers; every rank
    // read the same file.
    if (loaded_.size() > sizes_.size())
      throw core::InternalError("easgd: the checkpoint's centre has too many tensors");
    std::size_t offset = 0;
    for (std::size_t i = 0; i < loaded_.size(); ++i) {
      if (loaded_[i].size() != sizes_[i]) {
        throw core::InternalError(
            fmt::format("easgd: the checkpoint's centre's tensor {} has {} values, the model's {}", i,
                        loaded_[i].size(), sizes_[i]));
      }
      std::copy(loaded_[i].begin(), loaded_[i].end(), center_.begin() + static_cast<std::ptrdiff_t>(offset));
      offset += sizes_[i];
    }
    loaded_.clear();
  }
  flat_.assign(center_.size(), 0.0f);
}

void EasgdStrategy::after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                 std::int64_t step) {
  if (step % options_.tau != 0) return;
  exchange(params, buffers);
  const std::int64_t exchange_number = step / options_.tau;
  if (options_.center_sync_every > 0 && exchange_number % options_.center_sync_every == 0) sync_center();
}

void EasgdStrategy::exchange(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  check_layout(params, buffers);
  const float alpha = alpha_;
  std::size_t offset = 0;
  for_each_tensor(params, buffers, [&](std::vector<float>& values) {
    float* x = values.data();
    float* d = flat_.data() + offset;
    const float* c = center_.data() + offset;
    const std::size_t n = values.size();
    // Element-wise: the same result for any thread count.
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (std::size_t j = 0; j < n; ++j) {
      d[j] = alpha * (x[j] - c[j]);
      x[j] -= d[j];
    }
    offset += n;
  });
  timed(flat_.size() * sizeof(float), [&] { comm_.allreduce(flat_.data(), flat_.size(), core::ReduceOp::sum); });
  const std::size_t n = center_.size();
  float* c = center_.data();
  const float* sum = flat_.data();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (std::size_t j = 0; j < n; ++j) c[j] += sum[j];
}

void EasgdStrategy::sync_center() {
  timed(center_.size() * sizeof(float), [&] { comm_.broadcast(center_.data(), center_.size() * sizeof(float), 0); });
}

void EasgdStrategy::with_evaluation_model(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                                          const std::function<void()>& fn) {
  check_layout(params, buffers);
  run_with_values(params, buffers, center_, flat_, fn);
}

void EasgdStrategy::set_center_buffers(const std::vector<Buffer*>& buffers) {
  store_buffers(buffers, last_tensors_size(sizes_, buffers.size()), center_);
}

void EasgdStrategy::save_state(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                               io::Checkpoint& checkpoint) const {
  if (sizes_.size() < params.size()) throw core::InternalError("easgd: save_state before initialize");
  check_layout(params, buffers);
  center_to_checkpoint(center_, params, buffers, checkpoint);
}

void EasgdStrategy::load_state(const io::Checkpoint& checkpoint, const std::vector<Param*>& params,
                               const std::vector<Buffer*>& buffers) {
  loaded_ = center_from_checkpoint(checkpoint, params, buffers);
}

// ------------------------------------------------------------------------------------------------ registry

namespace {
// One entry per strategy; strategies in their own files add their entry here.
const StrategyEntry kStrategies[] = {
    {"allreduce", "synchronous SGD: gradients averaged over all ranks every step",
     [](const core::Comm& comm, const StrategyOptions& options) -> std::unique_ptr<Strategy> {
       return std::make_unique<AllreduceStrategy>(comm, options);
     }},
    {"easgd",
     "synchronous elastic averaging: local SGD, every tau steps one allreduce pulls replicas and centre together",
     [](const core::Comm& comm, const StrategyOptions& options) -> std::unique_ptr<Strategy> {
       return std::make_unique<EasgdStrategy>(comm, options);
     }},
    {"async-easgd",
     "asynchronous elastic averaging: the centre sharded over all ranks in MPI windows, every tau steps each rank "
     "exchanges with every shard one-sidedly and goes on",
     [](const core::Comm& comm, const StrategyOptions& options) -> std::unique_ptr<Strategy> {
       return std::make_unique<AsyncEasgdStrategy>(comm, options);
     }},
    {"two-level",
     "hierarchical: ranks on a node sum gradients in shared memory, node leaders run allreduce or easgd (inter)",
     [](const core::Comm& comm, const StrategyOptions& options) -> std::unique_ptr<Strategy> {
       return std::make_unique<TwoLevelStrategy>(comm, options);
     }},
};
}  // namespace

std::span<const StrategyEntry> strategy_registry() { return std::span<const StrategyEntry>(kStrategies); }

std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for (const auto& s : kStrategies) names.emplace_back(s.name);
  return names;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, const core::Comm& comm,
                                        const StrategyOptions& options) {
  for (const auto& s : kStrategies) {
    if (name == s.name) return s.make(comm, options);
  }
  throw core::ConfigError(fmt::format("unknown strategy '{}'; known: {}", name, fmt::join(strategy_names(), ", ")), "",
                          0, "distributed.strategy");
}

core::Schema& declare_strategy_keys(core::Schema& schema) {
  const StrategyOptions o;
  return schema.string("distributed.strategy", "allreduce", "How the ranks' replicas stay together", strategy_names())
      .integer("distributed.tau", o.tau, "easgd: optimizer steps between two elastic exchanges", 1, kMaxTau)
      .number("distributed.beta", o.beta, "easgd: moving rate alpha = beta / ranks (0.9 as in the EASGD paper)", 0, 1)
      .number("distributed.alpha", o.alpha, "easgd: the moving rate itself when > 0 (beta is then ignored)", 0, 1)
      .integer("distributed.center_sync_every", o.center_sync_every,
               "easgd: rank 0 re-broadcasts the centre every N exchanges against float drift (0 = never)", 0, 1e9)
      .integer("distributed.center_bn_tiles", kCenterBnTiles,
               "easgd, async-easgd, two-level with inter easgd: training tiles (over all ranks) on which the centre's "
               "batch-norm statistics are recomputed for its own weights before every validation and epoch "
               "checkpoint (0 = keep the elastic average of the replicas' statistics)",
               0, 1e9)
      .number("distributed.bucket_mb", o.bucket_mb,
              "allreduce: gradient bucket size in MB, each bucket reduced during backward (0 = one allreduce after)", 0,
              1e6)
      .string("distributed.progress", o.progress,
              "allreduce: what moves the buckets during backward: a communication thread, or the training thread "
              "between modules",
              {"thread", "boundaries"})
      .string("distributed.inter", o.inter, "two-level: the exchange between node leaders", {"allreduce", "easgd"})
      .integer("distributed.ranks_per_node", o.ranks_per_node,
               "two-level: ranks per node group (0 = the ranks that share memory)", 0, 1e6);
}

StrategyOptions strategy_options(const core::Config& config) {
  StrategyOptions o;
  o.tau = static_cast<int>(config.get_int("distributed.tau"));
  o.beta = config.get_number("distributed.beta");
  o.alpha = config.get_number("distributed.alpha");
  o.center_sync_every = static_cast<int>(config.get_int("distributed.center_sync_every"));
  o.bucket_mb = config.get_number("distributed.bucket_mb");
  o.progress = config.get_string("distributed.progress");
  o.inter = config.get_string("distributed.inter");
  o.ranks_per_node = static_cast<int>(config.get_int("distributed.ranks_per_node"));
  return o;
}

}  // namespace tessera::engine
