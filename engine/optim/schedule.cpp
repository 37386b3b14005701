#include "engine/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "core/config.h"
#include "core/error.h"

namespace tessera::engine {
namespace {

// Options are checked where the schedule is made, so that a bad value is reported against its config key.
void require(bool ok, const char* key, const std::string& message) {
  if (!ok) throw core::ConfigError(message, "", 0, key);
}

bool in_range(double x, double lo, double hi) { return std::isfinite(x) && x >= lo && x <= hi; }

// A number as the user wrote it, without std::to_string's six fixed decimals.
std::string text_of(double x) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", x);
  return buffer;
}

// What cosine and poly need beyond the common checks: somewhere to decay to and time to get there.
void check_decay_to_floor(const ScheduleOptions& o) {
  require(o.total_steps > o.warmup_steps, "schedule.warmup_epochs",
          "the warmup (" + std::to_string(o.warmup_steps) + " steps) must end before training does (" +
              std::to_string(o.total_steps) + " steps)");
  require(in_range(o.min_lr, 0.0, o.base_lr), "schedule.min_lr",
          "the floor must be in [0, the peak rate " + text_of(o.base_lr) + "], got " + text_of(o.min_lr));
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

double linearly_scaled_lr(double base_lr, std::int64_t batch, std::int64_t reference_batch) {
  if (batch < 1) throw core::InternalError("the batch of an update must be at least 1, got " + std::to_string(batch));
  require(reference_batch >= 0, "schedule.reference_batch",
          "reference batch must be >= 0 (0 = no scaling), got " + std::to_string(reference_batch));
  if (reference_batch == 0) return base_lr;
  return base_lr * static_cast<double>(batch) / static_cast<double>(reference_batch);
}

// ---- Schedule ----

Schedule::Schedule(const ScheduleOptions& options) : options_(options) {
  if (options.steps_per_epoch < 1) {
    throw core::InternalError("schedule: steps per epoch must be at least 1, got " +
                              std::to_string(options.steps_per_epoch));
  }
  require(std::isfinite(options.base_lr) && options.base_lr >= 0.0, "optimizer.lr",
          "the learning rate must be a finite number >= 0, got " + text_of(options.base_lr));
  require(options.warmup_steps >= 0, "schedule.warmup_epochs",
          "warmup must be >= 0 steps, got " + std::to_string(options.warmup_steps));
  require(in_range(options.warmup_start_factor, 0.0, 1.0), "schedule.warmup_start_factor",
          "the warmup start factor must be in [0, 1], got " + text_of(options.warmup_start_factor));
}

double Schedule::warmup_factor(std::int64_t step) const {
  if (step >= options_.warmup_steps) return 1.0;
  const double f = options_.warmup_start_factor;
  return f + (1.0 - f) * static_cast<double>(step) / static_cast<double>(options_.warmup_steps);
}

double Schedule::lr(std::int64_t step) const {
  if (step < 0) throw core::InternalError("schedule: step must be >= 0, got " + std::to_string(step));
  return warmup_factor(step) * decayed(step);
}

double Schedule::progress(std::int64_t step) const {
  const double done = static_cast<double>(step - options_.warmup_steps);
  const double length = static_cast<double>(options_.total_steps - options_.warmup_steps);
  return std::clamp(done / length, 0.0, 1.0);
}

// ---- constant ----

double ConstantSchedule::decayed(std::int64_t /*step*/) const { return options().base_lr; }

// ---- step ----

StepSchedule::StepSchedule(const ScheduleOptions& options) : Schedule(options) {
  require(!options.milestones.empty(), "schedule.milestones",
          "the step schedule needs at least one milestone (an epoch at which the rate drops)");
  require(in_range(options.gamma, 0.0, 1.0), "schedule.gamma",
          "gamma must be in [0, 1], got " + text_of(options.gamma));
  double previous = 0.0;
  for (const double m : options.milestones) {
    require(std::isfinite(m) && m > previous, "schedule.milestones",
            "milestones must be positive epochs in ascending order, got " + text_of(m) + " after " + text_of(previous));
    previous = m;
    // A milestone that rounds to step 0 would make the peak rate never happen; one step is the least.
    milestone_steps_.push_back(
        std::max<std::int64_t>(1, std::llround(m * static_cast<double>(options.steps_per_epoch))));
  }
}

double StepSchedule::decayed(std::int64_t step) const {
  const auto passed =
      std::upper_bound(milestone_steps_.begin(), milestone_steps_.end(), step) - milestone_steps_.begin();
  return options().base_lr * std::pow(options().gamma, static_cast<double>(passed));
}

// ---- cosine ----

CosineSchedule::CosineSchedule(const ScheduleOptions& options) : Schedule(options) { check_decay_to_floor(options); }

double CosineSchedule::decayed(std::int64_t step) const {
  const double lo = options().min_lr;
  return lo + (options().base_lr - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress(step)));
}

// ---- poly ----

PolySchedule::PolySchedule(const ScheduleOptions& options) : Schedule(options) {
  check_decay_to_floor(options);
  require(std::isfinite(options.power) && options.power >= 0.0, "schedule.power",
          "power must be a finite number >= 0, got " + text_of(options.power));
}

double PolySchedule::decayed(std::int64_t step) const {
  const double lo = options().min_lr;
  return lo + (options().base_lr - lo) * std::pow(1.0 - progress(step), options().power);
}

// ---- registry ----

namespace {

template <typename T>
std::unique_ptr<Schedule> make(const ScheduleOptions& options) {
  return std::make_unique<T>(options);
}

constexpr ScheduleEntry schedules[] = {
    {"constant", "The peak rate throughout (after warmup)", &make<ConstantSchedule>},
    {"step", "The rate times gamma at each milestone epoch", &make<StepSchedule>},
    {"cosine", "Half a cosine from the peak rate to min_lr over the training after warmup", &make<CosineSchedule>},
    {"poly", "(1 - progress)^power from the peak rate to min_lr over the training after warmup", &make<PolySchedule>},
};

}  // namespace

std::span<const ScheduleEntry> schedule_registry() { return schedules; }

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const auto& entry : schedules) names.emplace_back(entry.name);
  return names;
}

std::unique_ptr<Schedule> make_schedule(const std::string& name, const ScheduleOptions& options) {
  for (const auto& entry : schedules) {
    if (name == entry.name) return entry.make(options);
  }
  const std::vector<std::string> names = schedule_names();
  std::string message = "unknown schedule '" + name + "' (known: " + join(names) + ")";
  if (const std::string guess = core::closest_match(name, names); !guess.empty()) {
    message += "; did you mean '" + guess + "'?";
  }
  throw core::ConfigError(message, "", 0, "schedule.name");
}

}  // namespace tessera::engine
