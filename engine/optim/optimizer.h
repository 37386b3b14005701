// Optimizers: turn each parameter's gradient into an update of its value, at a global rate the schedule gives.
//
// Per element of a parameter w with gradient g, momentum μ, weight decay wd and global rate γ (the step's lr):
//
//   sgd   d = g + wd·w                                   (PyTorch's coupled L2 decay)
//         buf = d on the first step, then buf = μ·buf + d (dampening 0; no buffer at all when μ = 0)
//         d = d + μ·buf (Nesterov) or d = buf
//         w = w − γ·d
//
//   lars  per parameter (a "layer" of the paper): λ = η·‖w‖ / (‖g‖ + wd·‖w‖ + ε), with trust coefficient η,
//         and λ = 1 when ‖w‖ = 0 or ‖g‖ = 0 (a zero-initialised layer must still move; a layer with no gradient
//         only decays);
//         v = μ·v + γ·λ·(g + wd·w)   (v starts at 0, so the first step gives v = γ·λ·d; no buffer when μ = 0)
//         w = w − v
//         Biases and batch-norm parameters (Param::decayed() false) take the plain rate and no decay:
//         v = μ·v + γ·g.  Norms are taken over the whole parameter tensor.
//
// Weight decay applies to decayed() parameters only (convolution and linear weights), in both optimizers.
// Note the two buffers differ: sgd's holds a gradient direction (γ is applied after), lars's a velocity with γ
// and λ inside, as in the LARS paper; a change of γ between steps therefore acts differently on them.
//
// Updates are element-wise, OpenMP-parallel and vectorised; the norms are summed in double over fixed blocks and
// the blocks added in order, so the result does not depend on the thread count (bit-identical runs).
//
// State for checkpoints: named float vectors, "<slot>/<param name>" (e.g. "momentum_buffer/layer1.0.conv1.weight"),
// exported by state() and restored by load_state(); a resumed run continues bit for bit.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/parameters.h"

namespace tessera::engine {

struct OptimizerOptions {
  double momentum = 0.9;             // μ, in [0, 1]
  bool nesterov = false;             // sgd only; needs μ > 0
  double weight_decay = 1e-4;        // wd ≥ 0, on decayed() parameters
  double trust_coefficient = 0.001;  // lars η > 0
  double epsilon = 1e-9;             // lars ε ≥ 0, keeps λ finite
};

// Per-parameter optimizer state, "<slot>/<param name>" → values (same size as the parameter).
using OptimizerState = std::map<std::string, std::vector<float>>;

// The key of one state vector.
std::string state_key(const std::string& slot, const std::string& param_name);

class Optimizer {
 public:
  explicit Optimizer(const OptimizerOptions& options) : options_(options) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual const char* name() const = 0;
  const OptimizerOptions& options() const { return options_; }

  // One update of every parameter from its grad at global rate `lr` (≥ 0, finite). Throws InternalError when a
  // parameter's value or grad does not have numel() elements, or `lr` is not a valid rate.
  void step(const std::vector<Param*>& params, double lr);

  // Sets every grad to numel() zeros (layers accumulate into grad between steps).
  static void zero_grad(const std::vector<Param*>& params);

  // The current state (copy it to keep it); empty before the first step and when no slot is kept (μ = 0).
  const OptimizerState& state() const { return state_; }

  // Replaces the state with `state`, checked against `params`: every key must be one of this optimizer's slots
  // and one of `params`, with the parameter's size, and a slot present for one parameter must be present for all.
  // Throws InputError naming `source` (the checkpoint file) otherwise, and leaves the state unchanged.
  void load_state(const OptimizerState& state, const std::vector<Param*>& params, const std::string& source);

  // The slots this optimizer keeps per parameter, e.g. {"momentum_buffer"}.
  virtual std::vector<std::string> slots() const = 0;

 protected:
  // Updates one parameter (sizes already checked) at rate `lr`.
  virtual void update(Param& param, double lr) = 0;

  // The slot vector of `param`, or nullptr when it does not exist yet.
  std::vector<float>* find_slot(const std::string& slot, const Param& param);
  // Creates the slot vector of `param`: numel() zeros.
  std::vector<float>& create_slot(const std::string& slot, const Param& param);

 private:
  OptimizerOptions options_;
  OptimizerState state_;
};

// The slot name both optimizers use.
inline constexpr const char* momentum_slot = "momentum_buffer";

class Sgd final : public Optimizer {
 public:
  // Throws ConfigError (keys "optimizer.*") on out-of-range options or Nesterov without momentum.
  explicit Sgd(const OptimizerOptions& options);
  const char* name() const override { return "sgd"; }
  std::vector<std::string> slots() const override { return {momentum_slot}; }

 protected:
  void update(Param& param, double lr) override;
};

class Lars final : public Optimizer {
 public:
  // Throws ConfigError (keys "optimizer.*") on out-of-range options or when Nesterov is asked for.
  explicit Lars(const OptimizerOptions& options);
  const char* name() const override { return "lars"; }
  std::vector<std::string> slots() const override { return {momentum_slot}; }

  // λ of one decayed parameter from its current value and grad (what the next step would use).
  double local_rate(const Param& param) const;

 protected:
  void update(Param& param, double lr) override;
};

// The one list of optimizers (STYLE item 5).
struct OptimizerEntry {
  const char* name;
  const char* doc;
  std::unique_ptr<Optimizer> (*make)(const OptimizerOptions& options);
};
std::span<const OptimizerEntry> optimizer_registry();
std::vector<std::string> optimizer_names();

// The optimizer called `name`; an unknown name is a ConfigError on key "optimizer.name" listing the known ones.
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const OptimizerOptions& options);

}  // namespace tessera::engine
