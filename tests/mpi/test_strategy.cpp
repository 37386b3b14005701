// The distributed strategies (engine/strategy.h) under 1, 2 and 4 ranks: an EASGD exchange against its formulas
// worked by hand, EASGD with α = 0 against independent runs, allreduce against one process with p× the batch,
// bit-reproducibility, the centre as the model that is evaluated and saved, and the centre's batch-norm statistics
// recomputed for its own weights. Every test is collective
// (tests/mpi/mpi_main.cpp): checks are EXPECTs after the communication.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/comm.h"
#include "core/error.h"
#include "engine/batchnorm_recalibration.h"
#include "engine/checkpoint_adapter.h"
#include "engine/context.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/loss.h"
#include "engine/models/registry.h"
#include "engine/optim/optimizer.h"
#include "engine/strategy.h"
#include "io/checkpoint.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/layer_testing.h"
#include "tests/mpi/strategy_testing.h"
#include "tests/testing/testing.h"

namespace tessera::engine {
namespace {

using testing::all_near;

using namespace strategy_testing;  // NOLINT(google-build-using-namespace): the suite's helpers

class Strategies : public OneThreadPerRank {};

// ------------------------------------------------------------------------------------ hand-made vectors

// Two parameters and a buffer (what batch-norm statistics look like to the strategy).
struct Tensors {
  Param weight{"fc.weight", ParamKind::linear_weight, {2, 3}, std::vector<float>(6), std::vector<float>(6)};
  Param bias{"fc.bias", ParamKind::bias, {3}, std::vector<float>(3), std::vector<float>(3)};
  Buffer mean{"bn.running_mean", {2}, std::vector<float>(2)};
  std::vector<Param*> params{&weight, &bias};
  std::vector<Buffer*> buffers{&mean};
};

// Element j of the flat order (weight, bias, buffer) starts at c_j = 0.25·j − 1 on rank 0.
float start_value(std::size_t j) { return 0.25f * static_cast<float>(j) - 1.0f; }

TEST_F(Strategies, EasgdExchangeMatchesTheFormulasWorkedByHand) {
  const auto world = core::Comm::world();
  const int p = world.size();
  const int r = world.rank();
  Tensors t;
  // Other ranks start from something else: initialize() must give every rank rank 0's values.
  std::size_t j = 0;
  for (auto& x : t.weight.value) x = start_value(j++) + static_cast<float>(100 * r);
  for (auto& x : t.bias.value) x = start_value(j++) - static_cast<float>(7 * r);
  for (auto& x : t.mean.value) x = start_value(j++) * static_cast<float>(r + 1);
  const std::size_t n = j;

  // α = 0.25: every value below is a small dyadic number, so every float operation is exact whatever order the
  // allreduce adds in, and the results can be compared with ==.
  EasgdStrategy easgd(world, {.tau = 1, .alpha = 0.25});
  EXPECT_EQ(easgd.alpha(), 0.25f);
  easgd.initialize(t.params, t.buffers);
  std::vector<float> start(n);
  for (std::size_t k = 0; k < n; ++k) start[k] = start_value(k);
  EXPECT_EQ(flatten(t.params, t.buffers), start) << "initialize() broadcasts rank 0's replica";
  EXPECT_EQ(easgd.center(), start) << "the centre starts as the replica";

  // Rank q moves its replica to x_q = c + δ_q with δ_q[k] = 0.5·(q + 1) + 0.125·k.
  auto delta = [](int q, std::size_t k) { return 0.5f * static_cast<float>(q + 1) + 0.125f * static_cast<float>(k); };
  j = 0;
  for (auto* values : {&t.weight.value, &t.bias.value, &t.mean.value}) {
    for (auto& x : *values) {
      x = start[j] + delta(r, j);
      ++j;
    }
  }
  easgd.exchange(t.params, t.buffers);

  // By hand: d_q = α·δ_q, so x_r ← c + (1 − α)·δ_r = c + 0.75·δ_r, and
  // c ← c + α·Σ_q δ_q = c + 0.25·(0.5·p(p + 1)/2 + 0.125·k·p).
  std::vector<float> replica(n), center(n);
  for (std::size_t k = 0; k < n; ++k) {
    replica[k] = start[k] + 0.75f * delta(r, k);
    center[k] = start[k] + 0.25f * (0.25f * static_cast<float>(p * (p + 1)) + 0.125f * static_cast<float>(k * p));
  }
  EXPECT_EQ(flatten(t.params, t.buffers), replica);
  EXPECT_EQ(easgd.center(), center);
  EXPECT_EQ(easgd.stats().exchanges, 1);
  EXPECT_EQ(easgd.stats().bytes, static_cast<std::int64_t>(n * sizeof(float)));
}

TEST_F(Strategies, EasgdMovingRateIsBetaOverRanksUnlessAlphaIsGiven) {
  const auto world = core::Comm::world();
  EXPECT_EQ(EasgdStrategy(world, {}).alpha(), static_cast<float>(0.9 / world.size()));
  EXPECT_EQ(EasgdStrategy(world, {.beta = 0.5}).alpha(), static_cast<float>(0.5 / world.size()));
  EXPECT_EQ(EasgdStrategy(world, {.beta = 0.5, .alpha = 0.125}).alpha(), 0.125f);
  EXPECT_THROW(EasgdStrategy(world, {.tau = 0}), core::ConfigError);
  EXPECT_THROW(EasgdStrategy(world, {.beta = 1.5}), core::ConfigError);
  EXPECT_THROW(EasgdStrategy(world, {.alpha = -0.1}), core::ConfigError);
  if (world.size() > 1) {
    EXPECT_THROW(EasgdStrategy(world, {.alpha = 0.9}), core::ConfigError) << "p x alpha > 1 overshoots the centre";
  }
  EXPECT_THROW(make_strategy("parameter-server", world), core::ConfigError);
  EXPECT_EQ(make_strategy("easgd", world, {.tau = 4})->name(), std::string("easgd"));
}

TEST_F(Strategies, EasgdRebroadcastsTheCentreOnItsSchedule) {
  const auto world = core::Comm::world();
  Tensors t;
  EasgdStrategy easgd(world, {.tau = 2, .alpha = 0.25, .center_sync_every = 3});
  easgd.initialize(t.params, t.buffers);
  // Steps 1..12 with τ = 2: exchanges at 2, 4, ..., 12 (six), broadcasts after the 3rd and the 6th.
  for (std::int64_t step = 1; step <= 12; ++step) easgd.after_update(t.params, t.buffers, step);
  EXPECT_EQ(easgd.stats().exchanges, 6 + 2);
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

  // One step on images [first, first + n) of `images`; `strategy` may be null (a process on its own).
  void step(const std::vector<float>& images, const std::vector<int>& labels, int first, int n, int size,
            Strategy* strategy, std::int64_t step_number) {
    const auto per_image = static_cast<std::size_t>(3 * size * size);
    const std::vector<float> batch(images.begin() + static_cast<std::ptrdiff_t>(first * per_image),
                                   images.begin() + static_cast<std::ptrdiff_t>((first + n) * per_image));
    Optimizer::zero_grad(params);
    loss.forward(model->forward(batch, n, size, size),
                 std::span<const int>(labels.data() + first, static_cast<std::size_t>(n)));
    model->backward(loss.backward());
    if (strategy != nullptr) strategy->reduce_gradients(params);
    optimizer->step(params, 0.05);
    if (strategy != nullptr) strategy->after_update(params, buffers, step_number);
  }
};

// n images of size×size and their labels, drawn from `seed`.
struct Data {
  std::vector<float> images;
  std::vector<int> labels;
  Data(int n, int size, std::uint32_t seed) {
    images = gradcheck::random_vector(static_cast<std::size_t>(n * 3 * size * size), seed);
    for (int i = 0; i < n; ++i) labels.push_back(static_cast<int>((seed + static_cast<std::uint32_t>(i * 7)) % 3 % 2));
  }
};

TEST_F(Strategies, AllreduceEqualsOneProcessWithRanksTimesTheBatch) {
  // LeNet-5 has no batch norm (whose statistics are per rank) and no dropout: the averaged gradient of p slices
  // of b images is the gradient of the p·b images.
  const auto world = core::Comm::world();
  const int p = world.size();
  constexpr int kSize = 32, kPerRank = 3, kSteps = 3;
  Replica distributed("lenet5", kSize), single("lenet5", kSize);
  AllreduceStrategy allreduce(world);
  allreduce.initialize(distributed.params, distributed.buffers);
  for (int s = 0; s < kSteps; ++s) {
    const Data data(p * kPerRank, kSize, 100 + static_cast<std::uint32_t>(s));  // the same global batch everywhere
    distributed.step(data.images, data.labels, world.rank() * kPerRank, kPerRank, kSize, &allreduce, s + 1);
    single.step(data.images, data.labels, 0, p * kPerRank, kSize, nullptr, s + 1);
  }
  const auto a = flatten(distributed.params, distributed.buffers);
  const auto b = flatten(single.params, single.buffers);
  EXPECT_TRUE(all_near(a, b, 1e-5));
  // The updates were not negligible (else the comparison would say nothing).
  const Replica untrained("lenet5", kSize);
  EXPECT_FALSE(all_near(b, flatten(untrained.params, untrained.buffers), 1e-3));
  EXPECT_TRUE(same_on_all_ranks(world, a)) << "allreduce keeps the replicas identical";
  EXPECT_EQ(allreduce.stats().exchanges, p > 1 ? kSteps : 0);
}

// Bucketed allreduce: `micro` micro-batches of n/micro images each add into the gradients, and the buckets of the
// last one's backward start during that backward.
void accumulated_step(Replica& r, const Data& data, int first, int n, int micro, int size, AllreduceStrategy& strategy,
                      std::int64_t step_number) {
  const auto per_image = static_cast<std::size_t>(3 * size * size);
  const int m = n / micro;
  Optimizer::zero_grad(r.params);
  for (int k = 0; k < micro; ++k) {
    const int at = first + k * m;
    const std::vector<float> batch(data.images.begin() + static_cast<std::ptrdiff_t>(at * per_image),
                                   data.images.begin() + static_cast<std::ptrdiff_t>((at + m) * per_image));
    r.loss.forward(r.model->forward(batch, m, size, size),
                   std::span<const int>(data.labels.data() + at, static_cast<std::size_t>(m)), 1.0 / micro);
    strategy.before_backward(k + 1 == micro);
    r.model->backward(r.loss.backward());
  }
  strategy.reduce_gradients(r.params);
  r.optimizer->step(r.params, 0.05);
  strategy.after_update(r.params, r.buffers, step_number);
}

TEST_F(Strategies, BucketedAllreduceOverlapsBackwardAndEqualsOneProcess) {
  const auto world = core::Comm::world();
  const int p = world.size();
  constexpr int kSize = 32, kPerRank = 4, kSteps = 3;
  Replica bucketed("lenet5", kSize), accumulated("lenet5", kSize), single("lenet5", kSize);
  // LeNet-5 has ~62k parameters (240 KB) in 10 tensors: 5 KB buckets make four.
  AllreduceStrategy by_buckets(world, {.bucket_mb = 0.005});
  AllreduceStrategy by_buckets_accumulating(world, {.bucket_mb = 0.005});
  by_buckets.attach(*bucketed.model);
  by_buckets_accumulating.attach(*accumulated.model);
  by_buckets.initialize(bucketed.params, bucketed.buffers);
  by_buckets_accumulating.initialize(accumulated.params, accumulated.buffers);
  for (int s = 0; s < kSteps; ++s) {
    const Data data(p * kPerRank, kSize, 300 + static_cast<std::uint32_t>(s));
    accumulated_step(bucketed, data, world.rank() * kPerRank, kPerRank, 1, kSize, by_buckets, s + 1);
    accumulated_step(accumulated, data, world.rank() * kPerRank, kPerRank, 2, kSize, by_buckets_accumulating, s + 1);
    single.step(data.images, data.labels, 0, p * kPerRank, kSize, nullptr, s + 1);
  }
  const auto expected = flatten(single.params, single.buffers);
  EXPECT_TRUE(all_near(flatten(bucketed.params, bucketed.buffers), expected, 1e-5));
  EXPECT_TRUE(all_near(flatten(accumulated.params, accumulated.buffers), expected, 1e-5))
      << "2 accumulated micro-batches of 2 equal one batch of 4";
  EXPECT_TRUE(same_on_all_ranks(world, flatten(bucketed.params, bucketed.buffers)));
  if (p > 1) {
    EXPECT_EQ(by_buckets.buckets(), 4u);  // fc3+fc2 | fc1 | conv2 | conv1 (a bucket closes once past 5 KB)
    // Every bucket but the one holding the first layer (which backward completes last) started during backward.
    EXPECT_GE(by_buckets.buckets_overlapped(), by_buckets.buckets() - 1);
    EXPECT_EQ(by_buckets.stats().exchanges, static_cast<std::int64_t>(kSteps * by_buckets.buckets()));
  } else {
    EXPECT_EQ(by_buckets.buckets(), 0u) << "one rank has nothing to reduce";
  }
}

// The buckets' allreduces give the fused allreduce's result, whichever thread moves them: exactly at 2 ranks (a sum
// of two floats has one order), within float tolerance at 4 (Open MPI picks the reduction order by message size, and
// a bucket is smaller than all gradients). The compact model (batch norm: buffers broadcast too) has 3.9 MB of
// parameters: with the default 25 MB buckets it makes two, the first closing once past 1 MB (with the last
// convolution's 2.4 MB: a tensor is never split).
TEST_F(Strategies, BucketsEqualTheFusedAllreduceWithEitherProgress) {
  const auto world = core::Comm::world();
  const int p = world.size();
  constexpr int kSize = 24, kPerRank = 2, kSteps = 2;
  for (const std::string progress : {"thread", "boundaries"}) {
    SCOPED_TRACE("progress " + progress);
    Replica fused_run("compact", kSize), bucketed_run("compact", kSize);
    AllreduceStrategy fused(world, {.bucket_mb = 0});
    AllreduceStrategy bucketed(world, {.progress = progress});
    bucketed.attach(*bucketed_run.model);
    fused.initialize(fused_run.params, fused_run.buffers);
    bucketed.initialize(bucketed_run.params, bucketed_run.buffers);
    for (int s = 0; s < kSteps; ++s) {
      const Data data(p * kPerRank, kSize, 500 + static_cast<std::uint32_t>(s));
      fused_run.step(data.images, data.labels, world.rank() * kPerRank, kPerRank, kSize, &fused, s + 1);
      bucketed.before_backward(true);
      bucketed_run.step(data.images, data.labels, world.rank() * kPerRank, kPerRank, kSize, &bucketed, s + 1);
    }
    const auto a = flatten(fused_run.params, fused_run.buffers);
    const auto b = flatten(bucketed_run.params, bucketed_run.buffers);
    if (p <= 2) {
      EXPECT_EQ(a, b);
    } else {
      EXPECT_TRUE(all_near(a, b, 1e-6));
    }
    EXPECT_TRUE(same_on_all_ranks(world, b));
    if (p == 1) {
      EXPECT_EQ(bucketed.buckets(), 0u) << "one rank has nothing to reduce";
      continue;
    }
    EXPECT_EQ(bucketed.progress_thread(), progress == "thread");
    ASSERT_EQ(bucketed.buckets(), 2u);
    EXPECT_EQ(bucketed.buckets_overlapped(), 2u);
    const auto& timeline = bucketed.last_timeline();
    ASSERT_EQ(timeline.buckets.size(), 2u);
    EXPECT_GE(timeline.buckets[0].bytes, 1u << 20);
    std::size_t bytes = 0;
    for (const auto& bucket : timeline.buckets) {
      bytes += bucket.bytes;
      // Order, not duration: a bucket is reduced after backward completed it, and backward ends after it completed
      // the first bucket (the second holds the first layer, completed at backward's very end).
      EXPECT_LE(bucket.ready_s, bucket.reduced_s);
    }
    EXPECT_LE(timeline.buckets[0].ready_s, timeline.backward_end_s);
    EXPECT_EQ(
        bytes, a.size() * sizeof(float) - [&] {
          std::size_t buffer_values = 0;
          for (const auto* buffer : bucketed_run.buffers) buffer_values += buffer->value.size();
          return buffer_values * sizeof(float);
        }());
  }
}

// Trains tiny_cnn (with batch norm: its statistics are part of the centre) on rank-specific data for `steps`
// steps under `strategy`; returns the replica's parameters and buffers.
std::vector<float> train_tiny(Strategy* strategy, int steps, int rank) {
  constexpr int kSize = 12, kBatch = 4;
  Replica run("tiny_cnn", kSize);
  if (strategy != nullptr) strategy->initialize(run.params, run.buffers);
  for (int s = 0; s < steps; ++s) {
    const Data data(kBatch, kSize, 1000 * static_cast<std::uint32_t>(rank + 1) + static_cast<std::uint32_t>(s));
    run.step(data.images, data.labels, 0, kBatch, kSize, strategy, s + 1);
  }
  return flatten(run.params, run.buffers);
}

TEST_F(Strategies, EasgdWithAlphaZeroEqualsIndependentRuns) {
  const auto world = core::Comm::world();
  constexpr int kSteps = 5;
  EasgdStrategy easgd(world, {.tau = 1, .beta = 0.0});
  ASSERT_EQ(easgd.alpha(), 0.0f);
  const auto coupled = train_tiny(&easgd, kSteps, world.rank());
  const auto independent = train_tiny(nullptr, kSteps, world.rank());
  EXPECT_EQ(coupled, independent);
  EXPECT_EQ(easgd.stats().exchanges, kSteps);  // it did exchange, every step
  // The centre never moved from the initial model.
  Replica initial("tiny_cnn", 12);
  EXPECT_EQ(easgd.center(), flatten(initial.params, initial.buffers));
}

TEST_F(Strategies, EasgdAndAllreduceAreBitReproducible) {
  const auto world = core::Comm::world();
  constexpr int kSteps = 7;
  auto easgd_run = [&] {
    EasgdStrategy easgd(world, {.tau = 2, .center_sync_every = 2});
    auto values = train_tiny(&easgd, kSteps, world.rank());
    values.insert(values.end(), easgd.center().begin(), easgd.center().end());
    return std::pair{values, easgd.center()};
  };
  const auto [first, first_center] = easgd_run();
  const auto [second, second_center] = easgd_run();
  EXPECT_EQ(first, second);
  EXPECT_TRUE(same_on_all_ranks(world, first_center)) << "every rank holds the same centre";
  // Coupled but not averaged: the replicas still differ between ranks (each trains on its own data).
  const std::vector<float> replica(first.begin(), first.end() - static_cast<std::ptrdiff_t>(first_center.size()));
  if (world.size() > 1) {
    EXPECT_FALSE(same_on_all_ranks(world, replica));
  }

  auto allreduce_run = [&] {
    AllreduceStrategy allreduce(world);
    return train_tiny(&allreduce, kSteps, world.rank());
  };
  const auto allreduced = allreduce_run();
  EXPECT_EQ(allreduced, allreduce_run());
  // Each rank trained on its own data, yet weights and batch-norm running statistics are one model.
  EXPECT_TRUE(same_on_all_ranks(world, allreduced)) << "allreduce replicas (with BN statistics) stay identical";
}

TEST_F(Strategies, EasgdEvaluatesAndSavesTheCentre) {
  const auto world = core::Comm::world();
  Replica run("tiny_cnn", 12);
  EasgdStrategy easgd(world, {.tau = 1, .alpha = 0.25});
  easgd.initialize(run.params, run.buffers);
  for (int s = 0; s < 3; ++s) {
    const Data data(4, 12, 50 + static_cast<std::uint32_t>(world.rank() * 10 + s));
    run.step(data.images, data.labels, 0, 4, 12, &easgd, s + 1);
  }
  // One more local step so that the replica is away from the centre.
  const Data data(4, 12, 99);
  run.step(data.images, data.labels, 0, 4, 12, nullptr, 0);
  const auto replica = flatten(run.params, run.buffers);
  const auto center = easgd.center();
  ASSERT_NE(replica, center);

  std::vector<float> seen;
  easgd.with_evaluation_model(run.params, run.buffers, [&] { seen = flatten(run.params, run.buffers); });
  EXPECT_EQ(seen, center);
  EXPECT_EQ(flatten(run.params, run.buffers), replica) << "the replica comes back";
  EXPECT_THROW(easgd.with_evaluation_model(run.params, run.buffers, [] { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_EQ(flatten(run.params, run.buffers), replica) << "also after an exception";

  // The checkpoint's /easgd/center is the centre's parameters, /easgd/center_buffers its buffers; a resumed strategy
  // takes both back.
  io::Checkpoint checkpoint;
  easgd.save_state(run.params, run.buffers, checkpoint);
  ASSERT_EQ(checkpoint.easgd_center.size(), run.params.size());
  std::vector<float> saved;
  for (const auto* param : run.params) {
    const auto& tensor = checkpoint.easgd_center.at(param->name);
    EXPECT_EQ(tensor.shape, param->shape);
    saved.insert(saved.end(), tensor.data.begin(), tensor.data.end());
  }
  EXPECT_EQ(saved, std::vector<float>(center.begin(), center.begin() + static_cast<std::ptrdiff_t>(saved.size())));
  ASSERT_EQ(checkpoint.easgd_center_buffers.size(), run.buffers.size());
  for (const auto* buffer : run.buffers) {
    const auto& tensor = checkpoint.easgd_center_buffers.at(buffer->name);
    EXPECT_EQ(tensor.shape, buffer->shape);
    saved.insert(saved.end(), tensor.data.begin(), tensor.data.end());
  }
  EXPECT_EQ(saved, center);
  EasgdStrategy resumed(world, {.tau = 1, .alpha = 0.25});
  resumed.load_state(checkpoint, run.params, run.buffers);
  resumed.initialize(run.params, run.buffers);
  EXPECT_EQ(resumed.center(), center) << "parameters and buffers";
}

// A checkpoint written before /easgd/center_buffers (neither the group nor /easgd's layout attribute), resumed as the
// trainer resumes one (a checked read, the model from /params and /buffers, then load_state and initialize): the live
// centre's parameters are /easgd/center and its buffers /buffers.
TEST_F(Strategies, EasgdResumesACheckpointWithoutCentreBuffersFromItsBuffers) {
  const auto world = core::Comm::world();
  Replica run("tiny_cnn", 12);
  EasgdStrategy easgd(world, {.tau = 1, .alpha = 0.25});
  easgd.initialize(run.params, run.buffers);
  for (int s = 0; s < 3; ++s) {
    const Data data(4, 12, 70 + static_cast<std::uint32_t>(world.rank() * 10 + s));
    run.step(data.images, data.labels, 0, 4, 12, &easgd, s + 1);
  }
  // /params the centre's, /buffers other statistics than the live centre's (as recomputed ones are); every rank the
  // same file's values.
  io::Checkpoint checkpoint;
  checkpoint.meta.architecture = "tiny_cnn";
  checkpoint.meta.input_size = 12;
  checkpoint.meta.num_classes = 2;
  easgd.with_evaluation_model(run.params, run.buffers, [&] {
    for (auto* buffer : run.buffers) {
      for (float& v : buffer->value) v = 2.0f * v + 0.5f;
    }
    store_checkpoint_tensors(run.params, run.buffers, checkpoint);
  });
  easgd.save_state(run.params, run.buffers, checkpoint);
  ASSERT_FALSE(checkpoint.easgd_center_buffers.empty());
  checkpoint.easgd_center_buffers.clear();  // as written before it
  const tessera::testing::TempDir dir;
  const std::string path = dir.file("old.h5");
  io::write_checkpoint(path, checkpoint);
  {  // without the attribute /easgd layout, which came after
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const herr_t deleted = H5Adelete_by_name(file, "/easgd", "layout", H5P_DEFAULT);
    H5Fclose(file);
    ASSERT_GE(deleted, 0);
  }

  Replica resumed_run("tiny_cnn", 12);
  const io::Checkpoint read = io::read_checkpoint(path, checkpoint_layout(resumed_run.params, resumed_run.buffers));
  ASSERT_TRUE(read.easgd_center_buffers.empty());
  load_checkpoint_tensors(read, resumed_run.params, resumed_run.buffers);
  EasgdStrategy resumed(world, {.tau = 1, .alpha = 0.25});
  resumed.load_state(read, resumed_run.params, resumed_run.buffers);
  resumed.initialize(resumed_run.params, resumed_run.buffers);

  const std::vector<float>& center = easgd.center();
  const std::size_t params_size = flatten(run.params, {}).size();
  std::vector<float> expected(center.begin(), center.begin() + static_cast<std::ptrdiff_t>(params_size));
  std::vector<float> statistics;
  for (auto* buffer : run.buffers) {
    const auto& tensor = read.buffers.at(buffer->name);
    statistics.insert(statistics.end(), tensor.data.begin(), tensor.data.end());
  }
  ASSERT_NE(statistics, std::vector<float>(center.begin() + static_cast<std::ptrdiff_t>(params_size), center.end()))
      << "/buffers differ from the live centre's";
  expected.insert(expected.end(), statistics.begin(), statistics.end());
  EXPECT_EQ(resumed.center(), expected) << "/easgd/center's parameters, /buffers' statistics";
}

// ------------------------------------------------------------------------- batch-norm statistics of the centre

// The running statistics of every batch norm of `model`, flat (mean, then variance, per layer).
std::vector<float> running_statistics(Model& model) {
  std::vector<float> all;
  for (auto* bn : model.batch_norms()) {
    all.insert(all.end(), bn->running_mean().value.begin(), bn->running_mean().value.end());
    all.insert(all.end(), bn->running_var().value.begin(), bn->running_var().value.end());
  }
  return all;
}

// A network input of n images of size×size drawn from `seed` (plain NCHW).
Tensor input_tensor(int n, int size, std::uint32_t seed) {
  return testing::make_tensor({n, 3, size, size}, Data(n, size, seed).images);
}

TEST_F(Strategies, RecalibrationAveragesEveryBatchStatisticsOverBatchesAndRanks) {
  const auto world = core::Comm::world();
  const int p = world.size();
  constexpr int kSize = 12, kBatch = 5, kBatches = 3;
  auto seed_of = [](int rank, int k) { return 7000 + static_cast<std::uint32_t>(100 * rank + k); };
  Replica run("tiny_cnn", kSize);
  std::vector<Tensor> inputs;
  for (int k = 0; k < kBatches; ++k) inputs.push_back(input_tensor(kBatch, kSize, seed_of(world.rank(), k)));
  const auto params_before = flatten(run.params, {});
  const std::vector<float> momenta_before = {run.model->batch_norms().at(0)->options().momentum};
  run.model->set_mode(Mode::train);
  ASSERT_EQ(recalibrate_batch_norm(
                *run.model, kBatches,
                [&](std::int64_t k) -> const Tensor& { return inputs[static_cast<std::size_t>(k)]; }, world),
            1);

  // Expected: each batch's statistics alone (momentum 1 replaces the running ones), of every rank's batches.
  Replica check("tiny_cnn", kSize);
  auto* bn = check.model->batch_norms().at(0);
  bn->set_momentum(1.0f);
  check.model->set_mode(Mode::train);
  std::vector<float> expected;
  for (int rank = 0; rank < p; ++rank) {
    for (int k = 0; k < kBatches; ++k) {
      check.model->forward(input_tensor(kBatch, kSize, seed_of(rank, k)));
      const auto stats = running_statistics(*check.model);
      if (expected.empty()) expected.assign(stats.size(), 0.0f);
      for (std::size_t i = 0; i < stats.size(); ++i) expected[i] += stats[i] / static_cast<float>(p * kBatches);
    }
  }
  const auto got = running_statistics(*run.model);
  EXPECT_TRUE(all_near(got, expected, 1e-5)) << "the mean of the p x batches' own statistics";
  EXPECT_TRUE(same_on_all_ranks(world, got));
  EXPECT_FALSE(all_near(got, running_statistics(*Replica("tiny_cnn", kSize).model), 1e-2))
      << "the statistics moved from their start (else the comparison says nothing)";
  EXPECT_EQ(flatten(run.params, {}), params_before) << "no parameter changes";
  EXPECT_EQ(run.model->mode(), Mode::train) << "the model's mode comes back";
  EXPECT_EQ(run.model->batch_norms().at(0)->options().momentum, momenta_before[0]) << "and the momentum";
}

TEST_F(Strategies, EasgdCentreGetsBatchNormStatisticsOfItsOwnWeights) {
  // Replicas that moved apart: the elastic average of their running statistics is not the statistics of the
  // averaged weights (the average of their activations' variances exceeds the averaged network's). What the centre
  // was validated and saved with before its statistics were recomputed.
  const auto world = core::Comm::world();
  const int p = world.size();
  constexpr int kSize = 12, kBatch = 16;
  const Tensor data = input_tensor(kBatch, kSize, 4242);  // the same tiles on every rank
  const auto self = world.split(world.rank(), 0);
  auto own_statistics = [&](Replica& replica) {
    recalibrate_batch_norm(
        *replica.model, 1, [&](std::int64_t) -> const Tensor& { return data; }, self);
  };

  Replica run("tiny_cnn", kSize);
  EasgdStrategy easgd(world, {.tau = 1, .beta = 1.0});  // α = 1/p: the centre becomes the replicas' mean
  easgd.initialize(run.params, run.buffers);
  // Each rank moves its weights its own way, as far as the weights are large, and takes their statistics.
  for (auto* param : run.params) {
    if (param->kind == ParamKind::norm_weight || param->kind == ParamKind::norm_bias) continue;
    const auto noise = gradcheck::random_vector(param->value.size(), 31 + static_cast<std::uint32_t>(world.rank()));
    for (std::size_t i = 0; i < noise.size(); ++i) param->value[i] += 2.0f * noise[i] * std::abs(param->value[i]);
  }
  own_statistics(run);
  easgd.exchange(run.params, run.buffers);
  const auto replica = flatten(run.params, run.buffers);
  const auto center = easgd.center();
  const std::vector<float> center_params(
      center.begin(), center.end() - static_cast<std::ptrdiff_t>(running_statistics(*run.model).size()));

  // The statistics of the centre's own weights on the same tiles.
  Replica check("tiny_cnn", kSize);
  unpack_values(center.data(), check.params, {});
  own_statistics(check);
  const auto own = running_statistics(*check.model);
  const std::vector<float> averaged(center.end() - static_cast<std::ptrdiff_t>(own.size()), center.end());
  if (p > 1) {
    // The averaged variances (second half of each layer's statistics: tiny_cnn has one batch norm) are larger.
    const std::size_t channels = own.size() / 2;
    int larger = 0;
    for (std::size_t c = 0; c < channels; ++c) larger += averaged[channels + c] > 1.2f * own[channels + c];
    EXPECT_GT(larger, static_cast<int>(channels) / 2) << "the elastic average overstates the centre's variances";
  }

  easgd.with_evaluation_model(run.params, run.buffers, [&] {
    recalibrate_batch_norm(
        *run.model, 1, [&](std::int64_t) -> const Tensor& { return data; }, world);
    easgd.set_center_buffers(run.buffers);
  });
  const auto& recalibrated = easgd.center();
  EXPECT_EQ(std::vector<float>(recalibrated.begin(),
                               recalibrated.begin() + static_cast<std::ptrdiff_t>(center_params.size())),
            center_params)
      << "the centre's parameters are untouched";
  EXPECT_TRUE(all_near(
      std::vector<float>(recalibrated.end() - static_cast<std::ptrdiff_t>(own.size()), recalibrated.end()), own, 1e-5))
      << "its statistics are its own weights'";
  EXPECT_TRUE(same_on_all_ranks(world, recalibrated));
  EXPECT_EQ(flatten(run.params, run.buffers), replica) << "the replica comes back";

  // The checkpoint's buffers are then the centre's own statistics.
  std::vector<float> saved;
  easgd.with_evaluation_model(run.params, run.buffers, [&] { saved = running_statistics(*run.model); });
  EXPECT_TRUE(all_near(saved, own, 1e-5));
  // Strategies whose evaluated model is the replica have no centre to set.
  AllreduceStrategy allreduce(world);
  EXPECT_THROW(allreduce.set_center_buffers(run.buffers), core::InternalError);
}

}  // namespace
}  // namespace tessera::engine
