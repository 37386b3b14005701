// The two-level strategy (engine/strategy_two_level.h) under 1, 2 and 4 ranks: with one group it is the
// single-level allreduce, with two groups (ranks_per_node = p / 2) too up to float rounding; with inter = easgd a
// group's ranks stay one replica, the groups differ, one exchange among the leaders matches the EASGD formulas
// worked by hand, one rank per group is the single-level easgd and one group is one EASGD worker on the averaged
// gradients; bad group sizes are configuration errors. Every test is collective (tests/mpi/mpi_main.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/error.h"
#include "engine/context.h"
#include "engine/layers/loss.h"
#include "engine/models/registry.h"
#include "engine/optim/optimizer.h"
#include "engine/strategy.h"
#include "engine/strategy_two_level.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"
#include "tests/mpi/strategy_testing.h"

namespace tessera::engine {
namespace {

using testing::all_near;

using namespace strategy_testing;  // NOLINT(google-build-using-namespace): the suite's helpers

class TwoLevel : public OneThreadPerRank {};

// Ranks per group that make two groups of p / 2 ranks (one group of one rank on a single rank).
int half_of(int ranks) { return std::max(1, ranks / 2); }

// The key of the ConfigError `fn` throws ("" when it throws none; any other exception escapes).
std::string config_error_key(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const core::ConfigError& e) {
    return e.key();
  }
  return "";
}

// ------------------------------------------------------------------------------------------ small models

struct Replica {
  std::unique_ptr<Model> model;
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  std::unique_ptr<Optimizer> optimizer;
  SoftmaxCrossEntropy loss;

  explicit Replica(const std::string& architecture, int size) {
    model = make_model({.architecture = architecture, .input_size = size, .num_classes = 2, .seed = 7});
    model->collect(params, buffers);
    optimizer = make_optimizer("sgd", {.momentum = 0.9, .weight_decay = 1e-4});
  }

  void step(const std::vector<float>& images, const std::vector<int>& labels, int n, int size, Strategy& strategy,
            std::int64_t step_number) {
    Optimizer::zero_grad(params);
    loss.forward(model->forward(images, n, size, size), std::span<const int>(labels.data(), labels.size()));
    model->backward(loss.backward());
    strategy.reduce_gradients(params);
    optimizer->step(params, 0.05);
    strategy.after_update(params, buffers, step_number);
  }
};

// Trains `architecture` for `steps` steps on data of this rank's own (batch 4 of 12×12 images) under `strategy`;
// returns the replica's parameters and buffers.
std::vector<float> train(Strategy& strategy, const std::string& architecture, int steps, int rank) {
  constexpr int kSize = 12, kBatch = 4;
  Replica run(architecture, kSize);
  strategy.initialize(run.params, run.buffers);
  for (int s = 0; s < steps; ++s) {
    const auto seed = 1000 * static_cast<std::uint32_t>(rank + 1) + static_cast<std::uint32_t>(s);
    const auto images = gradcheck::random_vector(static_cast<std::size_t>(kBatch * 3 * kSize * kSize), seed);
    std::vector<int> labels;
    for (int i = 0; i < kBatch; ++i)
      labels.push_back(static_cast<int>((seed + static_cast<std::uint32_t>(i * 7)) % 3 % 2));
    run.step(images, labels, kBatch, kSize, strategy, s + 1);
  }
  return flatten(run.params, run.buffers);
}

// ------------------------------------------------------------------------------------------------ allreduce

TEST_F(TwoLevel, WithOneGroupItIsTheSingleLevelAllreduce) {
  const auto world = core::Comm::world();
  const int p = world.size();
  constexpr int kSteps = 3;
  AllreduceStrategy single(world);
  // tiny_cnn has batch norm: the running statistics follow rank 0's, through the window, as allreduce's do.
  const auto expected = train(single, "tiny_cnn", kSteps, world.rank());
  const auto untrained = Replica("tiny_cnn", 12);
  ASSERT_FALSE(all_near(expected, flatten(untrained.params, untrained.buffers), 1e-3)) << "the steps moved the model";

  // All ranks on this machine share memory: ranks_per_node 0 (what MPI says) and p are both one group.
  for (const int per_node : {0, p}) {
    TwoLevelStrategy two_level(world, {.ranks_per_node = per_node});
    EXPECT_EQ(two_level.groups(), 1);
    EXPECT_EQ(two_level.group().size(), p);
    const auto actual = train(two_level, "tiny_cnn", kSteps, world.rank());
    if (p <= 2) {
      // Bit for bit: the group adds its k segments in local-rank order and MPI's allreduce adds the same p values;
      // with p ≤ 2 there is only one sum (float addition is commutative), then the same 1/p scaling.
      EXPECT_EQ(actual, expected) << "ranks_per_node " << per_node;
    } else {
      // With more ranks the order of the additions differs (MPI reduces in its own tree): float rounding only.
      EXPECT_TRUE(all_near(actual, expected, 1e-5)) << "ranks_per_node " << per_node;
    }
    EXPECT_TRUE(same_on_all_ranks(world, actual)) << "one model on every rank, batch-norm statistics included";
    // Per step one shared-memory sum and one hand-over of rank 0's buffers; no leader exchange with one group.
    EXPECT_EQ(two_level.phases().shared.exchanges, p > 1 ? 2 * kSteps : 0);
    EXPECT_EQ(two_level.phases().inter.exchanges, 0);
    EXPECT_EQ(two_level.stats().exchanges, two_level.phases().shared.exchanges);
  }
}

TEST_F(TwoLevel, WithTwoGroupsItIsTheSingleLevelAllreduceToFloatTolerance) {
  const auto world = core::Comm::world();
  const int p = world.size();
  const int k = half_of(p);
  constexpr int kSteps = 3;
  AllreduceStrategy single(world);
  const auto expected = train(single, "tiny_cnn", kSteps, world.rank());
  TwoLevelStrategy two_level(world, {.ranks_per_node = k});
  EXPECT_EQ(two_level.groups(), p / k);
  EXPECT_EQ(two_level.group().size(), k);
  EXPECT_EQ(two_level.is_leader(), world.rank() % k == 0);
  const auto actual = train(two_level, "tiny_cnn", kSteps, world.rank());
  // Sums in a different order (group first, then leaders): equal up to float rounding.
  EXPECT_TRUE(all_near(actual, expected, 1e-5));
  EXPECT_TRUE(same_on_all_ranks(world, actual));
  // Leaders: one allreduce of the group sums and one broadcast of rank 0's buffers per step.
  const bool exchanging_leader = two_level.is_leader() && two_level.groups() > 1;
  EXPECT_EQ(two_level.phases().inter.exchanges, exchanging_leader ? 2 * kSteps : 0);
  EXPECT_EQ(two_level.phases().shared.exchanges, k > 1 ? 2 * kSteps : 0);
  EXPECT_EQ(two_level.stats().bytes, two_level.phases().shared.bytes + two_level.phases().inter.bytes);
}

// -------------------------------------------------------------------------------------------------- easgd

// Two parameters and a buffer (what batch-norm statistics look like to the strategy).
struct Tensors {
  Param weight{"fc.weight", ParamKind::linear_weight, {2, 3}, std::vector<float>(6), std::vector<float>(6)};
  Param bias{"fc.bias", ParamKind::bias, {3}, std::vector<float>(3), std::vector<float>(3)};
  Buffer mean{"bn.running_mean", {2}, std::vector<float>(2)};
  std::vector<Param*> params{&weight, &bias};
  std::vector<Buffer*> buffers{&mean};
  std::vector<float*> values() {
    std::vector<float*> all;
    for (auto* v : {&weight.value, &bias.value, &mean.value}) {
      for (auto& x : *v) all.push_back(&x);
    }
    return all;
  }
};

TEST_F(TwoLevel, EasgdAmongLeadersMatchesTheFormulasWorkedByHand) {
  const auto world = core::Comm::world();
  const int p = world.size();
  const int r = world.rank();
  const int k = half_of(p);
  constexpr std::size_t kParams = 9, kAll = 11;  // 6 + 3 parameter values, then 2 buffer values
  Tensors t;
  // Element j starts at c_j = 0.25·j − 1 on rank 0; the other ranks start elsewhere.
  auto start = [](std::size_t j) { return 0.25f * static_cast<float>(j) - 1.0f; };
  auto values = t.values();
  for (std::size_t j = 0; j < kAll; ++j) *values[j] = start(j) + static_cast<float>(100 * r);

  // α = 0.25 with at most two groups: every value below is a small dyadic number, so every float operation is
  // exact whatever order the sums are taken in, and results are compared with ==.
  TwoLevelStrategy two_level(world, {.tau = 1, .alpha = 0.25, .inter = "easgd", .ranks_per_node = k});
  ASSERT_EQ(two_level.is_leader(), r % k == 0);
  ASSERT_EQ(two_level.leader_easgd() != nullptr, two_level.is_leader());
  if (two_level.is_leader()) {
    EXPECT_EQ(two_level.leader_easgd()->alpha(), 0.25f);
  }
  two_level.initialize(t.params, t.buffers);
  std::vector<float> c(kAll);
  for (std::size_t j = 0; j < kAll; ++j) c[j] = start(j);
  EXPECT_EQ(flatten(t.params, t.buffers), c) << "initialize() gives every rank rank 0's replica";
  EXPECT_EQ(two_level.center(), c) << "every rank's centre starts as the replica";

  // Rank q's gradient g_q[j] = 0.5·(q + 1) + 0.125·j: the group averages the gradients of its k ranks.
  auto gradient = [](int q, std::size_t j) {
    return 0.5f * static_cast<float>(q + 1) + 0.125f * static_cast<float>(j);
  };
  for (std::size_t j = 0; j < 6; ++j) t.weight.grad[j] = gradient(r, j);
  for (std::size_t j = 0; j < 3; ++j) t.bias.grad[j] = gradient(r, 6 + j);
  two_level.reduce_gradients(t.params);
  const int g = r / k, leader = g * k;
  std::vector<float> mean(kParams), grads;
  for (std::size_t j = 0; j < kParams; ++j) {
    for (int q = leader; q < leader + k; ++q) mean[j] += gradient(q, j);
    mean[j] /= static_cast<float>(k);
  }
  grads.insert(grads.end(), t.weight.grad.begin(), t.weight.grad.end());
  grads.insert(grads.end(), t.bias.grad.begin(), t.bias.grad.end());
  EXPECT_EQ(grads, mean) << "the group's mean gradient";

  // The update (lr 1) and batch-norm statistics of each rank's own; then the exchange (τ = 1).
  for (std::size_t j = 0; j < kParams; ++j) *values[j] -= grads[j];
  for (std::size_t j = kParams; j < kAll; ++j) *values[j] = start(j) + static_cast<float>(10 * (r + 1));
  two_level.after_update(t.params, t.buffers, 1);

  // By hand, for group h with leader L = h·k: x_h = c − mean_h (parameters), c + 10·(L + 1) (the leader's
  // buffers); d_h = α·(x_h − c); the group's replica becomes x_h − d_h and the centre c + Σ_h d_h.
  auto replica_of = [&](int h) {
    std::vector<float> x(kAll);
    for (std::size_t j = 0; j < kAll; ++j) {
      if (j < kParams) {
        float m = 0.0f;
        for (int q = h * k; q < h * k + k; ++q) m += gradient(q, j);
        x[j] = c[j] - m / static_cast<float>(k);
      } else {
        x[j] = c[j] + static_cast<float>(10 * (h * k + 1));
      }
    }
    return x;
  };
  const int groups = p / k;
  std::vector<float> center = c, replica(kAll);
  for (int h = 0; h < groups; ++h) {
    const auto x = replica_of(h);
    for (std::size_t j = 0; j < kAll; ++j) {
      const float d = 0.25f * (x[j] - c[j]);
      center[j] += d;
      if (h == g) replica[j] = x[j] - d;
    }
  }
  EXPECT_EQ(flatten(t.params, t.buffers), replica) << "the leader's pulled replica, on every rank of group " << g;
  EXPECT_EQ(two_level.center(), center) << "every rank's centre";
  EXPECT_EQ(two_level.phases().inter.exchanges, two_level.is_leader() ? 1 : 0);
  EXPECT_EQ(two_level.phases().inter.bytes,
            two_level.is_leader() ? static_cast<std::int64_t>(kAll * sizeof(float)) : 0);
  EXPECT_EQ(two_level.phases().shared.exchanges, k > 1 ? 2 : 0) << "the gradient sum and the replica hand-over";

  // Validation and checkpoints see the centre, on leaders and the others alike.
  std::vector<float> seen;
  two_level.with_evaluation_model(t.params, t.buffers, [&] { seen = flatten(t.params, t.buffers); });
  EXPECT_EQ(seen, center);
  EXPECT_EQ(flatten(t.params, t.buffers), replica) << "the replica comes back";
  EXPECT_THROW(two_level.with_evaluation_model(t.params, t.buffers, [] { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_EQ(flatten(t.params, t.buffers), replica) << "also after an exception";
  io::Checkpoint checkpoint;
  two_level.save_state(t.params, t.buffers, checkpoint);
  ASSERT_EQ(checkpoint.easgd_center.size(), 2u);
  std::vector<float> saved = checkpoint.easgd_center.at("fc.weight").data;
  const auto& bias = checkpoint.easgd_center.at("fc.bias").data;
  saved.insert(saved.end(), bias.begin(), bias.end());
  EXPECT_EQ(saved, std::vector<float>(center.begin(), center.begin() + kParams));

  // A resumed run takes the checkpoint's centre back on every rank (the leaders read it, the groups get it).
  TwoLevelStrategy resumed(world, {.tau = 1, .alpha = 0.25, .inter = "easgd", .ranks_per_node = k});
  resumed.load_state(checkpoint, t.params, t.buffers);
  resumed.initialize(t.params, t.buffers);
  EXPECT_EQ(resumed.center(), center) << "parameters and buffers (/easgd/center_buffers)";
}

TEST_F(TwoLevel, EasgdGroupsAreOneReplicaEachAndDifferFromEachOther) {
  const auto world = core::Comm::world();
  const int p = world.size();
  const int k = half_of(p);
  constexpr int kSteps = 7;
  TwoLevelStrategy two_level(world, {.tau = 3, .inter = "easgd", .ranks_per_node = k});
  const auto replica = train(two_level, "tiny_cnn", kSteps, world.rank());
  const auto group = world.split(world.rank() / k, world.rank());
  EXPECT_TRUE(same_on_all_ranks(group, replica)) << "a group's ranks are one replica, bit for bit";
  EXPECT_TRUE(same_on_all_ranks(world, two_level.center())) << "one centre on every rank";
  if (p / k > 1) {
    // The ranks with the same place in their groups, one per group: each group trained on its own data.
    const auto across = world.split(world.rank() % k, world.rank());
    EXPECT_FALSE(same_on_all_ranks(across, replica)) << "the groups' replicas differ";
    EXPECT_NE(replica, two_level.center());
  }
  // Exchanges at steps 3 and 6 among the leaders.
  EXPECT_EQ(two_level.phases().inter.exchanges, two_level.is_leader() ? 2 : 0);

  // Bit-reproducible for a fixed seed and rank count.
  TwoLevelStrategy again(world, {.tau = 3, .inter = "easgd", .ranks_per_node = k});
  EXPECT_EQ(train(again, "tiny_cnn", kSteps, world.rank()), replica);
  EXPECT_EQ(again.center(), two_level.center());
}

// With inter = easgd, "one node" is not the single-level easgd of p ranks, by design: easgd keeps p replicas, each
// trained on its own rank's gradients and pulled with α = β / p, while a two-level group is one replica trained on
// the group's averaged gradients. Its single-level counterparts: with one rank per group, easgd itself; with one
// group of all ranks, one EASGD worker (α = β / 1) whose gradient is the allreduce average over the ranks.

TEST_F(TwoLevel, EasgdWithOneRankPerGroupIsTheSingleLevelEasgd) {
  const auto world = core::Comm::world();
  constexpr int kSteps = 5;
  EasgdStrategy single(world, {.tau = 2, .center_sync_every = 2});
  const auto expected = train(single, "tiny_cnn", kSteps, world.rank());
  TwoLevelStrategy two_level(world, {.tau = 2, .center_sync_every = 2, .inter = "easgd", .ranks_per_node = 1});
  EXPECT_EQ(two_level.groups(), world.size());
  const auto actual = train(two_level, "tiny_cnn", kSteps, world.rank());
  // Groups of one rank: no shared-memory phase, and the leaders are all ranks, in world order: the same
  // exchanges (steps 2 and 4, the centre re-broadcast after the second) on the same values.
  EXPECT_EQ(actual, expected) << "each rank's replica, bit for bit";
  EXPECT_EQ(two_level.center(), single.center());
  EXPECT_EQ(two_level.stats().exchanges, single.stats().exchanges);
  EXPECT_EQ(two_level.phases().shared.exchanges, 0);
  if (world.size() > 1) {
    EXPECT_FALSE(same_on_all_ranks(world, actual)) << "the ranks are replicas of their own";
  }
}

// One EASGD worker on its own communicator whose gradients are first averaged over all ranks (single-level
// allreduce, fused): what two-level with inter = easgd does with one group.
class AveragedEasgdWorker final : public Strategy {
 public:
  AveragedEasgdWorker(const core::Comm& world, const StrategyOptions& options)
      : Strategy(world),
        self_(world.split(world.rank(), 0)),
        allreduce_(world, {.bucket_mb = 0}),
        easgd_(self_, options) {}
  const char* name() const override { return "allreduce+easgd"; }
  void initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) override {
    allreduce_.initialize(params, buffers);
    easgd_.initialize(params, buffers);
  }
  void reduce_gradients(const std::vector<Param*>& params) override { allreduce_.reduce_gradients(params); }
  void after_update(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers,
                    std::int64_t step) override {
    allreduce_.after_update(params, buffers, step);  // rank 0's batch-norm statistics, as the group's leader's
    easgd_.after_update(params, buffers, step);
  }
  const EasgdStrategy& easgd() const { return easgd_; }

 private:
  core::Comm self_;  // before easgd_, which refers to it
  AllreduceStrategy allreduce_;
  EasgdStrategy easgd_;
};

TEST_F(TwoLevel, EasgdWithOneGroupIsOneEasgdWorkerOnTheAveragedGradients) {
  const auto world = core::Comm::world();
  const int p = world.size();
  constexpr int kSteps = 5;
  const StrategyOptions options{.tau = 2, .center_sync_every = 2, .inter = "easgd", .ranks_per_node = p};
  AveragedEasgdWorker single(world, options);
  EXPECT_FLOAT_EQ(single.easgd().alpha(), 0.9f) << "one worker: α = β";
  const auto expected = train(single, "tiny_cnn", kSteps, world.rank());
  const auto untrained = Replica("tiny_cnn", 12);
  ASSERT_FALSE(all_near(expected, flatten(untrained.params, untrained.buffers), 1e-3)) << "the steps moved the model";
  ASSERT_NE(single.easgd().center(), expected) << "the centre lags the replica";

  TwoLevelStrategy two_level(world, options);
  EXPECT_EQ(two_level.groups(), 1);
  const auto actual = train(two_level, "tiny_cnn", kSteps, world.rank());
  if (p <= 2) {
    // The group's sum of two (or one) gradients is MPI's, and both scale by 1/p (see the allreduce test above).
    EXPECT_EQ(actual, expected);
    EXPECT_EQ(two_level.center(), single.easgd().center());
  } else {
    EXPECT_TRUE(all_near(actual, expected, 1e-5));
    EXPECT_TRUE(all_near(two_level.center(), single.easgd().center(), 1e-5));
  }
  EXPECT_TRUE(same_on_all_ranks(world, actual)) << "the group is one replica";
  EXPECT_TRUE(same_on_all_ranks(world, two_level.center()));
}

// ------------------------------------------------------------------------------------------------ options

TEST_F(TwoLevel, BadGroupsAndOptionsAreConfigErrorsOnEveryRank) {
  const auto world = core::Comm::world();
  const int p = world.size();
  // More ranks per group than the node has: never a divisor.
  EXPECT_EQ(config_error_key([&] { (void)TwoLevelStrategy(world, {.ranks_per_node = p + 1}); }),
            "distributed.ranks_per_node");
  if (p == 4) {
    EXPECT_EQ(config_error_key([&] { (void)TwoLevelStrategy(world, {.ranks_per_node = 3}); }),
              "distributed.ranks_per_node");
  }
  EXPECT_EQ(config_error_key([&] { (void)TwoLevelStrategy(world, {.ranks_per_node = -1}); }),
            "distributed.ranks_per_node");
  EXPECT_EQ(config_error_key([&] { (void)TwoLevelStrategy(world, {.inter = "ring"}); }), "distributed.inter");
  // The leaders' EASGD refuses α × groups > 1; the other ranks hear it from their leader.
  if (p > 1) {
    EXPECT_EQ(
        config_error_key([&] { (void)TwoLevelStrategy(world, {.alpha = 0.9, .inter = "easgd", .ranks_per_node = 1}); }),
        "distributed.alpha");
  }
  EXPECT_EQ(config_error_key([&] { (void)TwoLevelStrategy(world, {.tau = 0, .inter = "easgd"}); }), "distributed.tau");
  // And valid ones build through the registry.
  EXPECT_EQ(make_strategy("two-level", world, {.inter = "easgd"})->name(), std::string("two-level"));
  const auto names = strategy_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "two-level"), names.end());
}

}  // namespace
}  // namespace tessera::engine
