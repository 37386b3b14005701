#include "engine/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "core/config.h"
#include "core/error.h"

namespace tessera::engine {
namespace {

// Below this many elements a parallel region costs more than the loop it would split (biases, BN vectors).
constexpr std::int64_t parallel_min_elements = 32768;
// Norms are summed per block of this many elements, then the blocks in order: the same sum for any thread count.
constexpr std::int64_t norm_block = 8192;

// Options are checked where the optimizer is made, so that a bad value is reported against its config key.
void require(bool ok, const char* key, const std::string& message) {
  if (!ok) throw core::ConfigError(message, "", 0, key);
}

void check_common_options(const OptimizerOptions& o) {
  require(std::isfinite(o.momentum) && o.momentum >= 0.0 && o.momentum <= 1.0, "optimizer.momentum",
          "momentum must be in [0, 1], got " + std::to_string(o.momentum));
  require(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0, "optimizer.weight_decay",
          "weight decay must be a finite number >= 0, got " + std::to_string(o.weight_decay));
}

struct Norms {
  double value = 0.0;  // ‖w‖
  double grad = 0.0;   // ‖g‖
};

// Both norms of one parameter in one pass over memory.
Norms norms_of(const Param& param) {
  const std::int64_t n = param.numel();
  const float* w = param.value.data();
  const float* g = param.grad.data();
  const std::int64_t blocks = (n + norm_block - 1) / norm_block;
  std::vector<double> w_partial(static_cast<std::size_t>(blocks));
  std::vector<double> g_partial(static_cast<std::size_t>(blocks));
#pragma omp parallel for schedule(static) if (n >= parallel_min_elements)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = b * norm_block;
    const std::int64_t end = std::min(n, begin + norm_block);
    double ws = 0.0;
    double gs = 0.0;
#pragma omp simd reduction(+ : ws, gs)
    for (std::int64_t i = begin; i < end; ++i) {
      ws += static_cast<double>(w[i]) * w[i];
      gs += static_cast<double>(g[i]) * g[i];
    }
    w_partial[static_cast<std::size_t>(b)] = ws;
    g_partial[static_cast<std::size_t>(b)] = gs;
  }
  Norms norms;
  for (std::int64_t b = 0; b < blocks; ++b) {
    norms.value += w_partial[static_cast<std::size_t>(b)];
    norms.grad += g_partial[static_cast<std::size_t>(b)];
  }
  norms.value = std::sqrt(norms.value);
  norms.grad = std::sqrt(norms.grad);
  return norms;
}

// Splits "<slot>/<param name>"; false when there is no '/'.
bool split_key(const std::string& key, std::string& slot, std::string& param) {
  const auto slash = key.find('/');
  if (slash == std::string::npos) return false;
  slot = key.substr(0, slash);
  param = key.substr(slash + 1);
  return true;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

std::string state_key(const std::string& slot, const std::string& param_name) { return slot + "/" + param_name; }

// ---- Optimizer ----

void Optimizer::step(const std::vector<Param*>& params, double lr) {
  if (!std::isfinite(lr) || lr < 0.0) {
    throw core::InternalError(std::string(name()) + ": learning rate must be finite and >= 0, got " +
                              std::to_string(lr));
  }
  for (const Param* p : params) {
    const auto n = static_cast<std::size_t>(p->numel());
    if (p->value.size() != n || p->grad.size() != n) {
      throw core::InternalError(std::string(name()) + ": parameter '" + p->name + "' has " +
                                std::to_string(p->value.size()) + " values and " + std::to_string(p->grad.size()) +
                                " grads for " + std::to_string(n) + " elements");
    }
  }
  for (Param* p : params) update(*p, lr);
}

void Optimizer::zero_grad(const std::vector<Param*>& params) {
  for (Param* p : params) {
    const std::int64_t n = p->numel();
    p->grad.resize(static_cast<std::size_t>(n));
    float* g = p->grad.data();
#pragma omp parallel for simd schedule(static) if (n >= parallel_min_elements)
    for (std::int64_t i = 0; i < n; ++i) g[i] = 0.0f;
  }
}

void Optimizer::load_state(const OptimizerState& state, const std::vector<Param*>& params, const std::string& source) {
  const std::vector<std::string> known_slots = slots();
  std::map<std::string, std::int64_t> sizes;
  for (const Param* p : params) sizes.emplace(p->name, p->numel());

  std::map<std::string, std::set<std::string>> params_of_slot;
  for (const auto& [key, values] : state) {
    std::string slot, param;
    if (!split_key(key, slot, param)) {
      throw core::InputError(std::string(name()) + " state: entry '" + key + "' is not '<slot>/<parameter>'", source);
    }
    if (std::find(known_slots.begin(), known_slots.end(), slot) == known_slots.end()) {
      throw core::InputError(std::string(name()) + " state: entry '" + key + "' has unknown slot '" + slot +
                                 "' (this optimizer keeps: " + join(known_slots) + ")",
                             source);
    }
    const auto size = sizes.find(param);
    if (size == sizes.end()) {
      throw core::InputError(std::string(name()) + " state: entry '" + key + "' names no parameter of the model",
                             source);
    }
    if (static_cast<std::int64_t>(values.size()) != size->second) {
      throw core::InputError(std::string(name()) + " state: entry '" + key + "' has " + std::to_string(values.size()) +
                                 " values, the parameter has " + std::to_string(size->second),
                             source);
    }
    params_of_slot[slot].insert(param);
  }
  // Buffers are created for all parameters at the same step, so a partial set means a mismatched checkpoint.
  for (const auto& [slot, names] : params_of_slot) {
    for (const auto& [param, size] : sizes) {
      if (names.count(param) == 0) {
        throw core::InputError(
            std::string(name()) + " state: slot '" + slot + "' is missing for parameter '" + param + "'", source);
      }
    }
  }
  state_ = state;
}

std::vector<float>* Optimizer::find_slot(const std::string& slot, const Param& param) {
  const auto it = state_.find(state_key(slot, param.name));
  return it == state_.end() ? nullptr : &it->second;
}

std::vector<float>& Optimizer::create_slot(const std::string& slot, const Param& param) {
  auto& values = state_[state_key(slot, param.name)];
  values.assign(static_cast<std::size_t>(param.numel()), 0.0f);
  return values;
}

// ---- SGD ----

Sgd::Sgd(const OptimizerOptions& options) : Optimizer(options) {
  check_common_options(options);
  require(!options.nesterov || options.momentum > 0.0, "optimizer.nesterov", "Nesterov momentum needs momentum > 0");
}

void Sgd::update(Param& param, double lr) {
  const std::int64_t n = param.numel();
  float* w = param.value.data();
  const float* g = param.grad.data();
  // All arithmetic in float, in PyTorch's order, so that updates match its SGD on the same numbers.
  const float wd = param.decayed() ? static_cast<float>(options().weight_decay) : 0.0f;
  const float mu = static_cast<float>(options().momentum);
  const float rate = static_cast<float>(lr);
  const bool nesterov = options().nesterov;

  if (mu == 0.0f) {
#pragma omp parallel for simd schedule(static) if (n >= parallel_min_elements)
    for (std::int64_t i = 0; i < n; ++i) w[i] -= rate * (g[i] + wd * w[i]);
    return;
  }
  // A new buffer is zeros, so the first step's μ·0 + d is exactly PyTorch's buf = d.
  std::vector<float>* existing = find_slot(momentum_slot, param);
  float* buf = existing != nullptr ? existing->data() : create_slot(momentum_slot, param).data();
#pragma omp parallel for simd schedule(static) if (n >= parallel_min_elements)
  for (std::int64_t i = 0; i < n; ++i) {
    const float d = g[i] + wd * w[i];
    buf[i] = mu * buf[i] + d;
    w[i] -= rate * (nesterov ? d + mu * buf[i] : buf[i]);
  }
}

// ---- LARS ----

Lars::Lars(const OptimizerOptions& options) : Optimizer(options) {
  check_common_options(options);
  require(std::isfinite(options.trust_coefficient) && options.trust_coefficient > 0.0,
          "optimizer.lars.trust_coefficient",
          "trust coefficient must be a finite number > 0, got " + std::to_string(options.trust_coefficient));
  require(std::isfinite(options.epsilon) && options.epsilon >= 0.0, "optimizer.lars.epsilon",
          "epsilon must be a finite number >= 0, got " + std::to_string(options.epsilon));
  require(!options.nesterov, "optimizer.nesterov", "Nesterov momentum is available with sgd only, not lars");
}

double Lars::local_rate(const Param& param) const {
  const Norms norms = norms_of(param);
  if (norms.value == 0.0 || norms.grad == 0.0) return 1.0;
  return options().trust_coefficient * norms.value /
         (norms.grad + options().weight_decay * norms.value + options().epsilon);
}

void Lars::update(Param& param, double lr) {
  const std::int64_t n = param.numel();
  float* w = param.value.data();
  const float* g = param.grad.data();
  const bool decayed = param.decayed();
  const float wd = decayed ? static_cast<float>(options().weight_decay) : 0.0f;
  const float scale = static_cast<float>(decayed ? lr * local_rate(param) : lr);  // γ·λ, or γ
  const float mu = static_cast<float>(options().momentum);

  if (mu == 0.0f) {
#pragma omp parallel for simd schedule(static) if (n >= parallel_min_elements)
    for (std::int64_t i = 0; i < n; ++i) w[i] -= scale * (g[i] + wd * w[i]);
    return;
  }
  std::vector<float>* existing = find_slot(momentum_slot, param);
  float* v = existing != nullptr ? existing->data() : create_slot(momentum_slot, param).data();
#pragma omp parallel for simd schedule(static) if (n >= parallel_min_elements)
  for (std::int64_t i = 0; i < n; ++i) {
    v[i] = mu * v[i] + scale * (g[i] + wd * w[i]);
    w[i] -= v[i];
  }
}

// ---- registry ----

namespace {

template <typename T>
std::unique_ptr<Optimizer> make(const OptimizerOptions& options) {
  return std::make_unique<T>(options);
}

constexpr OptimizerEntry optimizers[] = {
    {"sgd", "SGD with momentum, optional Nesterov, coupled weight decay (PyTorch semantics)", &make<Sgd>},
    {"lars", "Layer-wise adaptive rate scaling with momentum, for large global batches", &make<Lars>},
};

}  // namespace

std::span<const OptimizerEntry> optimizer_registry() { return optimizers; }

std::vector<std::string> optimizer_names() {
  std::vector<std::string> names;
  for (const auto& entry : optimizers) names.emplace_back(entry.name);
  return names;
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const OptimizerOptions& options) {
  for (const auto& entry : optimizers) {
    if (name == entry.name) return entry.make(options);
  }
  const std::vector<std::string> names = optimizer_names();
  std::string message = "unknown optimizer '" + name + "' (known: " + join(names) + ")";
  if (const std::string guess = core::closest_match(name, names); !guess.empty()) {
    message += "; did you mean '" + guess + "'?";
  }
  throw core::ConfigError(message, "", 0, "optimizer.name");
}

}  // namespace tessera::engine
