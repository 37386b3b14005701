#include "engine/optim/config.h"

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::engine {
namespace {

// The optimizer and schedule check their options against config key names without knowing the file; here the
// error gets the file the config came from.
template <typename Build>
auto with_source(const core::Config& config, Build build) {
  try {
    return build();
  } catch (const core::ConfigError& e) {
    if (!e.file().empty()) throw;
    throw core::ConfigError(e.message(), config.source(), e.line(), e.key());
  }
}

std::vector<double> parse_milestones(const core::Config& config) {
  constexpr const char* key = "schedule.milestones";
  std::vector<double> epochs;
  for (const std::string& text : config.get_string_list(key)) {
    double value = 0.0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (ec != std::errc() || ptr != end || !std::isfinite(value)) {
      throw core::ConfigError(
          "expected epochs (numbers), got '" + text + "' as item " + std::to_string(epochs.size() + 1), config.source(),
          0, key);
    }
    epochs.push_back(value);
  }
  return epochs;
}

}  // namespace

core::Schema& declare_optim_keys(core::Schema& schema) {
  const std::vector<std::string> optimizers = optimizer_names();
  const std::vector<std::string> schedules = schedule_names();
  const OptimizerOptions o;
  const ScheduleOptions s;
  return schema.string("optimizer.name", "sgd", "Optimizer (lars for very large global batches)", optimizers)
      .number("optimizer.lr", s.base_lr, "Peak learning rate at schedule.reference_batch (reached after warmup)", 0,
              1e3)
      .number("optimizer.momentum", o.momentum, "Momentum (0 = none)", 0, 1)
      .boolean("optimizer.nesterov", o.nesterov, "Nesterov momentum (sgd only; needs momentum > 0)")
      .number("optimizer.weight_decay", o.weight_decay, "L2 weight decay on conv and linear weights (not biases or BN)",
              0, 1)
      .number("optimizer.lars.trust_coefficient", o.trust_coefficient,
              "LARS trust coefficient: local rate = this * |w| / (|g| + weight_decay * |w| + epsilon)", 1e-12, 1e3)
      .number("optimizer.lars.epsilon", o.epsilon, "LARS: added to the local rate's denominator", 0, 1)
      .string("schedule.name", "cosine",
              "Learning-rate schedule after warmup; cosine and poly end at min_lr with training", schedules)
      .integer("schedule.reference_batch", 256,
               "Linear scaling: rate = optimizer.lr * the batch one update averages / this (allreduce: the global "
               "batch; easgd: "
               "one rank's; 0 = optimizer.lr as given)",
               0, 1e9)
      .number("schedule.warmup_epochs", 0.0, "Epochs of linear warmup to the peak rate (0 = none)", 0, 1e6)
      .number("schedule.warmup_start_factor", s.warmup_start_factor, "Warmup starts at this fraction of the peak rate",
              0, 1)
      .string_list("schedule.milestones", {}, "step: epochs at which the rate is multiplied by gamma, ascending")
      .number("schedule.gamma", s.gamma, "step: factor applied at each milestone", 0, 1)
      .number("schedule.power", s.power, "poly: exponent of (1 - progress)", 0, 100)
      .number("schedule.min_lr", s.min_lr, "cosine, poly: the rate at the end of training (not scaled)", 0, 1e3);
}

OptimizerOptions optimizer_options(const core::Config& config) {
  OptimizerOptions o;
  o.momentum = config.get_number("optimizer.momentum");
  o.nesterov = config.get_bool("optimizer.nesterov");
  o.weight_decay = config.get_number("optimizer.weight_decay");
  o.trust_coefficient = config.get_number("optimizer.lars.trust_coefficient");
  o.epsilon = config.get_number("optimizer.lars.epsilon");
  return o;
}

std::unique_ptr<Optimizer> build_optimizer(const core::Config& config) {
  return with_source(config,
                     [&] { return make_optimizer(config.get_string("optimizer.name"), optimizer_options(config)); });
}

ScheduleOptions schedule_options(const core::Config& config, const TrainingShape& shape) {
  return with_source(config, [&] {
    ScheduleOptions s;
    s.base_lr = linearly_scaled_lr(config.get_number("optimizer.lr"), shape.update_batch,
                                   config.get_int("schedule.reference_batch"));
    s.steps_per_epoch = shape.steps_per_epoch;
    s.total_steps = shape.total_steps;
    s.warmup_steps =
        std::llround(config.get_number("schedule.warmup_epochs") * static_cast<double>(shape.steps_per_epoch));
    s.warmup_start_factor = config.get_number("schedule.warmup_start_factor");
    s.milestones = parse_milestones(config);
    s.gamma = config.get_number("schedule.gamma");
    s.power = config.get_number("schedule.power");
    s.min_lr = config.get_number("schedule.min_lr");
    return s;
  });
}

std::unique_ptr<Schedule> build_schedule(const core::Config& config, const TrainingShape& shape) {
  const ScheduleOptions options = schedule_options(config, shape);
  return with_source(config, [&] { return make_schedule(config.get_string("schedule.name"), options); });
}

}  // namespace tessera::engine
