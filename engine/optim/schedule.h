// Learning-rate schedules: the global rate γ for optimizer step s (0-based), given the steps per epoch E.
//
//   lr(s) = warmup(s) · decayed(s)
//
//   warmup(s)   = f + (1 − f)·s/W for s < W, else 1   (linear from start factor f to 1 over W warmup steps;
//                                                      W = 0: no warmup)
//   constant    decayed(s) = base
//   step        decayed(s) = base · gamma^k, k = number of milestones m (in epochs) with s ≥ round(m·E)
//   cosine      decayed(s) = min + (base − min)·(1 + cos(π·p))/2
//   poly        decayed(s) = min + (base − min)·(1 − p)^power
//
// where p = clamp((s − W)/(T − W), 0, 1) is the progress after warmup towards T total steps: cosine and poly hold
// `base` during warmup, fall to the floor `min` at step T and stay there. Milestones count epochs from the start
// of training, warmup included (as Goyal et al. and PyTorch's MultiStepLR do).
//
// `base` is the peak rate after the linear scaling rule of Goyal et al.:
//   base = lr · update_batch / reference_batch   (reference_batch 0: base = lr), where update_batch is the batch one
//   update averages over (engine/optim/config.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera::engine {

struct ScheduleOptions {
  double base_lr = 0.1;              // peak rate, after linear scaling
  std::int64_t steps_per_epoch = 1;  // E ≥ 1
  std::int64_t total_steps = 0;      // T: cosine and poly reach min_lr here (> W); constant and step ignore it
  std::int64_t warmup_steps = 0;     // W ≥ 0
  double warmup_start_factor = 0.1;  // f in [0, 1]
  std::vector<double> milestones;    // step: epochs, ascending, > 0
  double gamma = 0.1;                // step: factor per milestone, in [0, 1]
  double power = 2.0;                // poly: exponent ≥ 0
  double min_lr = 0.0;               // cosine, poly: the floor, in [0, base_lr]
};

// The linear scaling rule: base_lr · batch / reference_batch, or base_lr when reference_batch is 0.
double linearly_scaled_lr(double base_lr, std::int64_t batch, std::int64_t reference_batch);

class Schedule {
 public:
  // Throws ConfigError (keys "optimizer.lr", "schedule.*") on options out of range and InternalError on a
  // steps_per_epoch below 1 (the caller's count, not the user's).
  explicit Schedule(const ScheduleOptions& options);
  virtual ~Schedule() = default;

  virtual const char* name() const = 0;
  const ScheduleOptions& options() const { return options_; }

  // The rate for step `step` ≥ 0 (InternalError when negative).
  double lr(std::int64_t step) const;
  // The warmup multiplier alone, in [f, 1].
  double warmup_factor(std::int64_t step) const;

 protected:
  // The rate without warmup.
  virtual double decayed(std::int64_t step) const = 0;
  // p above.
  double progress(std::int64_t step) const;

 private:
  ScheduleOptions options_;
};

class ConstantSchedule final : public Schedule {
 public:
  using Schedule::Schedule;
  const char* name() const override { return "constant"; }

 protected:
  double decayed(std::int64_t step) const override;
};

class StepSchedule final : public Schedule {
 public:
  // Also needs at least one milestone, ascending.
  explicit StepSchedule(const ScheduleOptions& options);
  const char* name() const override { return "step"; }

 protected:
  double decayed(std::int64_t step) const override;

 private:
  std::vector<std::int64_t> milestone_steps_;  // round(m·E), ascending
};

class CosineSchedule final : public Schedule {
 public:
  // Also needs total_steps > warmup_steps and min_lr ≤ base_lr.
  explicit CosineSchedule(const ScheduleOptions& options);
  const char* name() const override { return "cosine"; }

 protected:
  double decayed(std::int64_t step) const override;
};

class PolySchedule final : public Schedule {
 public:
  // Also needs total_steps > warmup_steps and min_lr ≤ base_lr.
  explicit PolySchedule(const ScheduleOptions& options);
  const char* name() const override { return "poly"; }

 protected:
  double decayed(std::int64_t step) const override;
};

// The one list of schedules (STYLE item 5).
struct ScheduleEntry {
  const char* name;
  const char* doc;
  std::unique_ptr<Schedule> (*make)(const ScheduleOptions& options);
};
std::span<const ScheduleEntry> schedule_registry();
std::vector<std::string> schedule_names();

// The schedule called `name`; an unknown name is a ConfigError on key "schedule.name" listing the known ones.
std::unique_ptr<Schedule> make_schedule(const std::string& name, const ScheduleOptions& options);

}  // namespace tessera::engine
