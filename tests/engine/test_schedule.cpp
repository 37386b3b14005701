// Learning-rate schedules at chosen steps, the linear scaling rule, and the optimizer/schedule YAML sections.
#include "engine/optim/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "engine/optim/config.h"

namespace tessera::engine {
namespace {

constexpr double tolerance = 1e-12;

ScheduleOptions base_options() {
  ScheduleOptions o;
  o.base_lr = 1.0;
  o.steps_per_epoch = 100;
  o.total_steps = 1000;
  o.warmup_steps = 0;
  o.warmup_start_factor = 0.1;
  o.min_lr = 0.0;
  return o;
}

// Runs `action`, which must throw a ConfigError, and returns it.
core::ConfigError config_error(const std::function<void()>& action) {
  try {
    action();
  } catch (const core::ConfigError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a ConfigError, got: " << e.what();
    return core::ConfigError("", "", 0, "");
  }
  ADD_FAILURE() << "expected a ConfigError, nothing was thrown";
  return core::ConfigError("", "", 0, "");
}

// ---- linear scaling ----

TEST(LinearScaling, RateGrowsWithTheGlobalBatch) {
  EXPECT_NEAR(linearly_scaled_lr(0.1, 4096, 256), 1.6, tolerance);  // Goyal et al.: 0.1 per 256
  EXPECT_NEAR(linearly_scaled_lr(0.1, 64, 256), 0.025, tolerance);
  EXPECT_EQ(linearly_scaled_lr(0.1, 4096, 0), 0.1) << "reference batch 0 turns scaling off";
  EXPECT_THROW(linearly_scaled_lr(0.1, 0, 256), core::InternalError);
}

// ---- warmup and the four schedules ----

TEST(Schedule, ConstantHoldsTheRate) {
  const auto s = make_schedule("constant", base_options());
  EXPECT_EQ(s->lr(0), 1.0);
  EXPECT_EQ(s->lr(999), 1.0);
  EXPECT_EQ(s->lr(5000), 1.0);
  EXPECT_THROW(s->lr(-1), core::InternalError);
}

TEST(Schedule, WarmupRisesLinearlyFromTheStartFactor) {
  ScheduleOptions o = base_options();
  o.warmup_steps = 10;
  const auto s = make_schedule("constant", o);
  EXPECT_NEAR(s->lr(0), 0.1, tolerance);   // f·base
  EXPECT_NEAR(s->lr(5), 0.55, tolerance);  // 0.1 + 0.9·5/10
  EXPECT_NEAR(s->lr(9), 0.91, tolerance);  // 0.1 + 0.9·9/10
  EXPECT_NEAR(s->lr(10), 1.0, tolerance);  // warmup over
  EXPECT_NEAR(s->lr(11), 1.0, tolerance);
}

TEST(Schedule, StepDropsAtEachMilestoneEpoch) {
  ScheduleOptions o = base_options();
  o.milestones = {1.5, 3.0};  // steps 150 and 300 at 100 steps per epoch
  o.gamma = 0.1;
  const auto s = make_schedule("step", o);
  EXPECT_NEAR(s->lr(0), 1.0, tolerance);
  EXPECT_NEAR(s->lr(149), 1.0, tolerance);
  EXPECT_NEAR(s->lr(150), 0.1, tolerance);
  EXPECT_NEAR(s->lr(299), 0.1, tolerance);
  EXPECT_NEAR(s->lr(300), 0.01, tolerance);
  EXPECT_NEAR(s->lr(100000), 0.01, tolerance);
}

TEST(Schedule, StepWithWarmupMultipliesBoth) {
  ScheduleOptions o = base_options();
  o.milestones = {0.25};  // step 25, inside the warmup
  o.gamma = 0.5;
  o.warmup_steps = 50;
  o.warmup_start_factor = 0.0;
  const auto s = make_schedule("step", o);
  EXPECT_EQ(s->lr(0), 0.0);
  EXPECT_NEAR(s->lr(20), 0.4, tolerance);        // 20/50 · 1
  EXPECT_NEAR(s->lr(30), 0.6 * 0.5, tolerance);  // 30/50 · 0.5
  EXPECT_NEAR(s->lr(50), 0.5, tolerance);
}

TEST(Schedule, CosineFallsFromThePeakToTheFloorAfterWarmup) {
  ScheduleOptions o = base_options();
  o.warmup_steps = 10;
  o.total_steps = 110;
  o.min_lr = 0.1;
  const auto s = make_schedule("cosine", o);
  EXPECT_NEAR(s->lr(0), 0.1, tolerance);   // warmup start: 0.1 · 1
  EXPECT_NEAR(s->lr(5), 0.55, tolerance);  // the cosine holds the peak during warmup
  EXPECT_NEAR(s->lr(10), 1.0, tolerance);  // warmup end = cosine start
  EXPECT_NEAR(s->lr(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), tolerance);
  EXPECT_NEAR(s->lr(60), 0.55, tolerance);  // midpoint: halfway between peak and floor
  EXPECT_NEAR(s->lr(110), 0.1, tolerance);  // end: the floor
  EXPECT_NEAR(s->lr(500), 0.1, tolerance);  // and it stays there
}

TEST(Schedule, PolyFollowsThePower) {
  ScheduleOptions o = base_options();
  o.total_steps = 100;
  o.power = 2.0;
  const auto s = make_schedule("poly", o);
  EXPECT_NEAR(s->lr(0), 1.0, tolerance);
  EXPECT_NEAR(s->lr(50), 0.25, tolerance);  // (1 − 0.5)²
  EXPECT_NEAR(s->lr(90), 0.01, tolerance);  // (1 − 0.9)²
  EXPECT_NEAR(s->lr(100), 0.0, tolerance);

  o.min_lr = 0.2;
  o.power = 1.0;
  o.warmup_steps = 20;
  o.total_steps = 120;
  const auto floored = make_schedule("poly", o);
  EXPECT_NEAR(floored->lr(0), 0.1, tolerance);
  EXPECT_NEAR(floored->lr(70), 0.2 + 0.8 * 0.5, tolerance);
  EXPECT_NEAR(floored->lr(120), 0.2, tolerance);
}

TEST(Schedule, InconsistentOptionsNameTheirKey) {
  ScheduleOptions o = base_options();
  EXPECT_EQ(config_error([&] { make_schedule("step", o); }).key(), "schedule.milestones");
  o.milestones = {3.0, 2.0};
  EXPECT_EQ(config_error([&] { make_schedule("step", o); }).key(), "schedule.milestones");
  o = base_options();
  o.warmup_steps = 1000;  // = total steps: nothing left to decay over
  EXPECT_EQ(config_error([&] { make_schedule("cosine", o); }).key(), "schedule.warmup_epochs");
  o = base_options();
  o.min_lr = 2.0;
  EXPECT_EQ(config_error([&] { make_schedule("poly", o); }).key(), "schedule.min_lr");
  o = base_options();
  o.warmup_start_factor = 1.5;
  EXPECT_EQ(config_error([&] { make_schedule("constant", o); }).key(), "schedule.warmup_start_factor");
  o = base_options();
  o.steps_per_epoch = 0;
  EXPECT_THROW(make_schedule("constant", o), core::InternalError);
}

TEST(ScheduleRegistry, UnknownNameListsTheKnownOnes) {
  EXPECT_EQ(schedule_names(), (std::vector<std::string>{"constant", "step", "cosine", "poly"}));
  const core::ConfigError e = config_error([] { make_schedule("cosin", base_options()); });
  EXPECT_EQ(e.key(), "schedule.name");
  EXPECT_NE(std::string(e.what()).find("unknown schedule 'cosin' (known: constant, step, cosine, poly)"),
            std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("did you mean 'cosine'?"), std::string::npos) << e.what();
}

// ---- the YAML sections ----

const core::Schema& optim_schema() {
  static const core::Schema schema = [] {
    core::Schema s;
    s.integer("train.epochs", 10, "Epochs");  // a key of the training verb next to ours
    declare_optim_keys(s);
    return s;
  }();
  return schema;
}

const char* const lars_job =
    "optimizer:\n"
    "  name: lars\n"
    "  lr: 0.2\n"
    "  momentum: 0.85\n"
    "  weight_decay: 5.0e-5\n"
    "  lars:\n"
    "    trust_coefficient: 0.002\n"
    "    epsilon: 1.0e-8\n"
    "schedule:\n"
    "  name: step\n"
    "  reference_batch: 512\n"
    "  warmup_epochs: 2.5\n"
    "  warmup_start_factor: 0.25\n"
    "  milestones: [30, 60.5, 80]\n"
    "  gamma: 0.2\n"
    "  power: 1.5\n"
    "  min_lr: 0.001\n";

void expect_same(const OptimizerOptions& a, const OptimizerOptions& b) {
  EXPECT_EQ(a.momentum, b.momentum);
  EXPECT_EQ(a.nesterov, b.nesterov);
  EXPECT_EQ(a.weight_decay, b.weight_decay);
  EXPECT_EQ(a.trust_coefficient, b.trust_coefficient);
  EXPECT_EQ(a.epsilon, b.epsilon);
}

void expect_same(const ScheduleOptions& a, const ScheduleOptions& b) {
  EXPECT_EQ(a.base_lr, b.base_lr);
  EXPECT_EQ(a.steps_per_epoch, b.steps_per_epoch);
  EXPECT_EQ(a.total_steps, b.total_steps);
  EXPECT_EQ(a.warmup_steps, b.warmup_steps);
  EXPECT_EQ(a.warmup_start_factor, b.warmup_start_factor);
  EXPECT_EQ(a.milestones, b.milestones);
  EXPECT_EQ(a.gamma, b.gamma);
  EXPECT_EQ(a.power, b.power);
  EXPECT_EQ(a.min_lr, b.min_lr);
}

TEST(OptimConfig, BuildsWhatTheYamlSays) {
  const core::Config config = core::Config::parse(optim_schema(), lars_job, "job.yaml");
  const TrainingShape shape{.global_batch = 4096, .update_batch = 4096, .steps_per_epoch = 100, .total_steps = 9000};

  const auto optimizer = build_optimizer(config);
  EXPECT_STREQ(optimizer->name(), "lars");
  EXPECT_EQ(optimizer->options().momentum, 0.85);
  EXPECT_FALSE(optimizer->options().nesterov);
  EXPECT_EQ(optimizer->options().weight_decay, 5.0e-5);
  EXPECT_EQ(optimizer->options().trust_coefficient, 0.002);
  EXPECT_EQ(optimizer->options().epsilon, 1.0e-8);

  const auto schedule = build_schedule(config, shape);
  EXPECT_STREQ(schedule->name(), "step");
  const ScheduleOptions& s = schedule->options();
  EXPECT_NEAR(s.base_lr, 0.2 * 4096 / 512, tolerance);
  EXPECT_EQ(s.steps_per_epoch, 100);
  EXPECT_EQ(s.total_steps, 9000);
  EXPECT_EQ(s.warmup_steps, 250);  // 2.5 epochs
  EXPECT_EQ(s.warmup_start_factor, 0.25);
  EXPECT_EQ(s.milestones, (std::vector<double>{30, 60.5, 80}));
  EXPECT_EQ(s.gamma, 0.2);
  EXPECT_EQ(s.power, 1.5);
  EXPECT_EQ(s.min_lr, 0.001);
  EXPECT_NEAR(schedule->lr(0), 0.25 * 1.6, tolerance);
  EXPECT_NEAR(schedule->lr(6049), 1.6 * 0.2, tolerance);
  EXPECT_NEAR(schedule->lr(6050), 1.6 * 0.2 * 0.2, tolerance);  // epoch 60.5
}

TEST(OptimConfig, EffectiveConfigRoundTrips) {
  const core::Config config = core::Config::parse(optim_schema(), lars_job, "job.yaml");
  const core::Config again = core::Config::parse(optim_schema(), config.to_yaml(), "effective.yaml");
  const TrainingShape shape{.global_batch = 1024, .update_batch = 1024, .steps_per_epoch = 50, .total_steps = 5000};
  expect_same(optimizer_options(config), optimizer_options(again));
  expect_same(schedule_options(config, shape), schedule_options(again, shape));
  EXPECT_EQ(again.get_string("optimizer.name"), "lars");
  EXPECT_EQ(again.get_string("schedule.name"), "step");
}

TEST(OptimConfig, DefaultsBuildSgdWithCosine) {
  const core::Config config(optim_schema());
  const auto optimizer = build_optimizer(config);
  EXPECT_STREQ(optimizer->name(), "sgd");
  const auto schedule = build_schedule(
      config, TrainingShape{.global_batch = 256, .update_batch = 256, .steps_per_epoch = 10, .total_steps = 100});
  EXPECT_STREQ(schedule->name(), "cosine");
  EXPECT_NEAR(schedule->lr(0), 0.1, tolerance);  // batch 256 = the reference batch
  EXPECT_NEAR(schedule->lr(100), 0.0, tolerance);
}

TEST(OptimConfig, ScalingOffKeepsTheRate) {
  const core::Config config = core::Config::parse(
      optim_schema(), "optimizer: {lr: 0.05}\nschedule: {name: constant, reference_batch: 0}\n", "job.yaml");
  EXPECT_EQ(
      build_schedule(
          config, TrainingShape{.global_batch = 4096, .update_batch = 4096, .steps_per_epoch = 10, .total_steps = 100})
          ->lr(7),
      0.05);
}

TEST(OptimConfig, TheRateIsScaledForTheBatchOneUpdateAverages) {
  // easgd on 16 ranks of 32: each replica's update averages 32 tiles, not the global 512.
  const core::Config config = core::Config::parse(
      optim_schema(), "optimizer: {lr: 0.1}\nschedule: {name: constant, reference_batch: 256}\n", "job.yaml");
  const auto schedule = build_schedule(
      config, TrainingShape{.global_batch = 512, .update_batch = 32, .steps_per_epoch = 10, .total_steps = 100});
  EXPECT_NEAR(schedule->lr(0), 0.1 * 32 / 256, tolerance);
}

TEST(OptimConfig, ErrorsNameTheFileAndTheKey) {
  struct Case {
    std::string yaml;
    std::string key;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"optimizer: {nesterov: true, momentum: 0}\n", "optimizer.nesterov", "needs momentum > 0"},
      {"optimizer: {name: lars, nesterov: true}\n", "optimizer.nesterov", "sgd only"},
      {"schedule: {name: step, milestones: [30, abc]}\n", "schedule.milestones", "'abc' as item 2"},
      {"schedule: {name: step, milestones: [60, 30]}\n", "schedule.milestones", "ascending"},
      {"schedule: {name: step}\n", "schedule.milestones", "at least one milestone"},
      {"schedule: {warmup_epochs: 10}\n", "schedule.warmup_epochs", "must end before training does"},
      {"schedule: {min_lr: 5}\n", "schedule.min_lr", "the floor"},
  };
  const TrainingShape shape{.global_batch = 256, .update_batch = 256, .steps_per_epoch = 10, .total_steps = 100};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    const core::Config config = core::Config::parse(optim_schema(), c.yaml, "job.yaml");
    const core::ConfigError e = config_error([&] {
      build_optimizer(config);
      build_schedule(config, shape);
    });
    EXPECT_EQ(e.file(), "job.yaml");
    EXPECT_EQ(e.key(), c.key);
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
  }
  // Names outside the registries are caught by the schema, with the registry's list.
  const core::ConfigError e =
      config_error([] { core::Config::parse(optim_schema(), "optimizer: {name: adam}\n", "job.yaml"); });
  EXPECT_EQ(e.key(), "optimizer.name");
  EXPECT_NE(std::string(e.what()).find("sgd, lars"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace tessera::engine
