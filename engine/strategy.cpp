#include "engine/strategy.h"

#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "engine/checkpoint_adapter.h"
#include "io/error.h"

namespace tessera::engine {

namespace {

constexpr int kMaxTau = 1000000;
constexpr std::size_t kParallelMin = 1 << 16;  // elements: below this, threads cost more than they save

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

void Strategy::initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  if (comm_.size() == 1) return;
  for (auto* p : params) comm_.broadcast(p->value.data(), p->value.size() * sizeof(float), 0);
  for (auto* b : buffers) comm_.broadcast(b->value.data(), b->value.size() * sizeof(float), 0);
}

void Strategy::with_evaluation_model(const std::vector<Param*>&, const std::vector<Buffer*>&,
                                     const std::function<void()>& fn) {
  fn();
}

// ----------------------------------------------------------------------------------------------- allreduce

void AllreduceStrategy::reduce_gradients(const std::vector<Param*>& params) {
  if (comm_.size() == 1) return;
  std::size_t total = 0;
  for (const auto* p : params) total += p->grad.size();
  flat_.resize(total);
  std::size_t offset = 0;
  for (const auto* p : params) {
    std::memcpy(flat_.data() + offset, p->grad.data(), p->grad.size() * sizeof(float));
    offset += p->grad.size();
  }
  timed(flat_.size() * sizeof(float), [&] { comm_.allreduce(flat_.data(), flat_.size(), io::ReduceOp::sum); });
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

EasgdStrategy::EasgdStrategy(const io::Comm& comm, const StrategyOptions& options) : Strategy(comm), options_(options) {
  auto bad = [](const std::string& key, const std::string& why) {
    return io::ConfigError(why, "", 0, fmt::format("distributed.{}", key));
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
  std::size_t i = 0;
  bool same = params.size() + buffers.size() == sizes_.size();
  if (same) {
    for_each_tensor(params, buffers, [&](const std::vector<float>& v) { same = same && v.size() == sizes_[i++]; });
  }
  if (!same) {
    throw io::InternalError(
        fmt::format("easgd: the model's {} parameters and {} buffers are not the tensors the "
                    "strategy was initialized with ({} tensors)",
                    params.size(), buffers.size(), sizes_.size()));
  }
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
    // A resumed run: the checkpoint's centre for the parameters (every rank read the same file).
    std::size_t offset = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (loaded_[i].size() != sizes_[i]) {
        throw io::InternalError(fmt::format("easgd: the checkpoint's centre of '{}' has {} values, the parameter {}",
                                            params[i]->name, loaded_[i].size(), sizes_[i]));
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
  timed(flat_.size() * sizeof(float), [&] { comm_.allreduce(flat_.data(), flat_.size(), io::ReduceOp::sum); });
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
  // Copies, not swaps of the vectors: layers may hold on to a tensor's storage.
  std::size_t offset = 0;
  for_each_tensor(params, buffers, [&](std::vector<float>& x) {
    std::copy(x.begin(), x.end(), flat_.begin() + static_cast<std::ptrdiff_t>(offset));
    std::copy_n(center_.begin() + static_cast<std::ptrdiff_t>(offset), x.size(), x.begin());
    offset += x.size();
  });
  struct Restore {
    const std::vector<Param*>& params;
    const std::vector<Buffer*>& buffers;
    const std::vector<float>& replica;
    ~Restore() {
      std::size_t at = 0;
      for_each_tensor(params, buffers, [&](std::vector<float>& x) {
        std::copy_n(replica.begin() + static_cast<std::ptrdiff_t>(at), x.size(), x.begin());
        at += x.size();
      });
    }
  } restore{params, buffers, flat_};
  fn();
}

void EasgdStrategy::save_state(const std::vector<Param*>& params, io::Checkpoint& checkpoint) const {
  if (sizes_.size() < params.size()) throw io::InternalError("easgd: save_state before initialize");
  std::vector<std::vector<float>> center;
  center.reserve(params.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto first = center_.begin() + static_cast<std::ptrdiff_t>(offset);
    center.emplace_back(first, first + static_cast<std::ptrdiff_t>(sizes_[i]));
    offset += sizes_[i];
  }
  checkpoint.easgd_center = to_checkpoint_center(center, params);
}

void EasgdStrategy::load_state(const io::Checkpoint& checkpoint, const std::vector<Param*>& params) {
  loaded_.clear();
  if (!checkpoint.easgd_center.empty()) loaded_ = from_checkpoint_center(checkpoint.easgd_center, params);
}

// ------------------------------------------------------------------------------------------------ registry

namespace {
// One entry per strategy; strategies in their own files add their entry here.
const StrategyEntry kStrategies[] = {
    {"allreduce", "synchronous SGD: gradients averaged over all ranks every step",
     [](const io::Comm& comm, const StrategyOptions&) -> std::unique_ptr<Strategy> {
       return std::make_unique<AllreduceStrategy>(comm);
     }},
    {"easgd",
     "synchronous elastic averaging: local SGD, every tau steps one allreduce pulls replicas and centre together",
     [](const io::Comm& comm, const StrategyOptions& options) -> std::unique_ptr<Strategy> {
       return std::make_unique<EasgdStrategy>(comm, options);
     }},
};
}  // namespace

std::span<const StrategyEntry> strategy_registry() { return std::span<const StrategyEntry>(kStrategies); }

std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for (const auto& s : kStrategies) names.emplace_back(s.name);
  return names;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, const io::Comm& comm, const StrategyOptions& options) {
  for (const auto& s : kStrategies) {
    if (name == s.name) return s.make(comm, options);
  }
  throw io::ConfigError(fmt::format("unknown strategy '{}'; known: {}", name, fmt::join(strategy_names(), ", ")), "", 0,
                        "distributed.strategy");
}

io::Schema& declare_strategy_keys(io::Schema& schema) {
  const StrategyOptions o;
  return schema.string("distributed.strategy", "allreduce", "How the ranks' replicas stay together", strategy_names())
      .integer("distributed.tau", o.tau, "easgd: optimizer steps between two elastic exchanges", 1, kMaxTau)
      .number("distributed.beta", o.beta, "easgd: moving rate alpha = beta / ranks (0.9 as in the EASGD paper)", 0, 1)
      .number("distributed.alpha", o.alpha, "easgd: the moving rate itself when > 0 (beta is then ignored)", 0, 1)
      .integer("distributed.center_sync_every", o.center_sync_every,
               "easgd: rank 0 re-broadcasts the centre every N exchanges against float drift (0 = never)", 0, 1e9)
      .number("distributed.bucket_mb", o.bucket_mb,
              "allreduce: gradient bucket size in MB, each bucket reduced during backward (0 = one allreduce after)",
              0, 1e6)
      .string("distributed.inter", o.inter, "two-level: the exchange between node leaders", {"allreduce", "easgd"})
      .integer("distributed.ranks_per_node", o.ranks_per_node,
               "two-level: ranks per node group (0 = the ranks that share memory)", 0, 1e6);
}

StrategyOptions strategy_options(const io::Config& config) {
  StrategyOptions o;
  o.tau = static_cast<int>(config.get_int("distributed.tau"));
  o.beta = config.get_number("distributed.beta");
  o.alpha = config.get_number("distributed.alpha");
  o.center_sync_every = static_cast<int>(config.get_int("distributed.center_sync_every"));
  o.bucket_mb = config.get_number("distributed.bucket_mb");
  o.inter = config.get_string("distributed.inter");
  o.ranks_per_node = static_cast<int>(config.get_int("distributed.ranks_per_node"));
  return o;
}

}  // namespace tessera::engine
