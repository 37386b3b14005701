// async-easgd (engine/strategy_async.h) under 1, 2 and 4 ranks: one exchange per rank, taken in turn, against the
// formulas; many unsynchronized exchanges of unequal counts with no update lost; a tiny CNN whose centre improves
// the held-out loss while the ranks take unequal numbers of steps; α = 0 against independent runs; the centre as
// the model that is evaluated and saved. Every test is collective (tests/mpi/mpi_main.cpp): checks are EXPECTs,
// and only settle(), initialize() and the destructor synchronize the ranks besides the tests' own barriers.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
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
#include "engine/strategy_async.h"
#include "tests/engine/gradcheck.h"
#include "tests/mpi/strategy_testing.h"

namespace tessera::engine {
namespace {

using namespace strategy_testing;  // NOLINT(google-build-using-namespace): the suite's helpers

class AsyncEasgd : public OneThreadPerRank {};

double max_abs_difference(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (std::size_t k = 0; k < std::min(a.size(), b.size()); ++k) {
    worst = std::max(worst, std::abs(static_cast<double>(a[k]) - b[k]));
  }
  return worst;
}

// Two parameters and a buffer of `n`, `m` and `b` values: 11 values in all by default, so that with 4 ranks the
// shards cut through tensors.
struct Tensors {
  Param weight, bias;
  Buffer mean;
  std::vector<Param*> params{&weight, &bias};
  std::vector<Buffer*> buffers{&mean};
  explicit Tensors(std::size_t n = 6, std::size_t m = 3, std::size_t b = 2)
      : weight{"fc.weight",
               ParamKind::linear_weight,
               {static_cast<std::int64_t>(n)},
               std::vector<float>(n),
               std::vector<float>(n)},
        bias{"fc.bias", ParamKind::bias, {static_cast<std::int64_t>(m)}, std::vector<float>(m), std::vector<float>(m)},
        mean{"bn.running_mean", {static_cast<std::int64_t>(b)}, std::vector<float>(b)} {}
  std::size_t size() const { return weight.value.size() + bias.value.size() + mean.value.size(); }
};

// ------------------------------------------------------------------------------------ hand-made vectors

TEST_F(AsyncEasgd, OneExchangePerRankInTurnMatchesTheFormulas) {
  const auto world = core::Comm::world();
  const int p = world.size();
  const int r = world.rank();
  Tensors t;
  const std::size_t n = t.size();
  // c_k = 0.25·k − 1 on rank 0; other ranks start elsewhere: initialize() must give every rank rank 0's values.
  std::vector<float> start(n), mine(n);
  for (std::size_t k = 0; k < n; ++k) {
    start[k] = 0.25f * static_cast<float>(k) - 1.0f;
    mine[k] = start[k] + static_cast<float>(100 * r);
  }
  unpack_values(mine.data(), t.params, t.buffers);

  // α a power of two with α·p ≤ 1 (0.25 up to 4 ranks) and dyadic values: every float operation below is
  // exact, so the centre can be compared with ==.
  const float alpha = 1.0f / static_cast<float>(std::bit_ceil(static_cast<unsigned>(std::max(p, 4))));
  AsyncEasgdStrategy strategy(world, {.tau = 1, .alpha = alpha});
  ASSERT_EQ(strategy.alpha(), alpha);
  strategy.initialize(t.params, t.buffers);
  EXPECT_EQ(flatten(t.params, t.buffers), start) << "initialize() broadcasts rank 0's replica";
  EXPECT_EQ(strategy.fetch_center(), start) << "the centre starts as the replica";
  // The shards cover the centre, in rank order, without overlap.
  EXPECT_EQ(strategy.shard(0).first, 0u);
  EXPECT_EQ(strategy.shard(p - 1).second, n);
  for (int q = 1; q < p; ++q) EXPECT_EQ(strategy.shard(q).first, strategy.shard(q - 1).second);
  world.barrier();  // every rank has read the initial centre before the first exchange

  // Rank q moves its replica to x_q = c + δ_q, δ_q[k] = 0.5·(q + 1) + 0.125·k, then the ranks exchange one at a
  // time, in rank order.
  auto replica_of = [&](int q) {
    std::vector<float> x(n);
    for (std::size_t k = 0; k < n; ++k)
      x[k] = start[k] + 0.5f * static_cast<float>(q + 1) + 0.125f * static_cast<float>(k);
    return x;
  };
  unpack_values(replica_of(r).data(), t.params, t.buffers);
  std::vector<double> sent;
  for (int q = 0; q < p; ++q) {
    if (q == r) strategy.exchange(t.params, t.buffers, &sent);
    world.barrier();
  }

  // By hand, in the same order: d_q = α (x_q − c), x_q ← x_q − d_q, c ← c + d_q.
  std::vector<float> center = start, replica;
  std::vector<double> d_mine;
  for (int q = 0; q < p; ++q) {
    auto x = replica_of(q);
    std::vector<double> d(n);
    for (std::size_t k = 0; k < n; ++k) {
      const float dk = alpha * (x[k] - center[k]);
      x[k] -= dk;
      center[k] += dk;
      d[k] = dk;
    }
    if (q == r) {
      replica = x;
      d_mine = d;
    }
  }
  EXPECT_EQ(flatten(t.params, t.buffers), replica);
  EXPECT_EQ(strategy.fetch_center(), center);
  EXPECT_EQ(sent, d_mine) << "exchange() reports the d it sent";
  EXPECT_EQ(strategy.stats().exchanges, 1);
  EXPECT_EQ(strategy.stats().bytes, static_cast<std::int64_t>(2 * n * sizeof(float))) << "one get, one accumulate";
  EXPECT_GE(strategy.stats().seconds, 0.0);
  strategy.settle(t.params, t.buffers);
}

// Starts `strategy` from every value k of `t` at scale·k + shift; then every rank moves its replica by rank + 1 and
// exchanges once (the centre moved), and the strategy settles.
void exchange_once_and_settle(AsyncEasgdStrategy& strategy, Tensors& t, float scale, float shift) {
  const int r = core::Comm::world().rank();
  std::vector<float> values(t.size());
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = scale * static_cast<float>(k) + shift;
  unpack_values(values.data(), t.params, t.buffers);
  strategy.initialize(t.params, t.buffers);  // ends with a barrier: every slice holds the initial centre
  for (auto& v : values) v += static_cast<float>(r + 1);
  unpack_values(values.data(), t.params, t.buffers);
  strategy.exchange(t.params, t.buffers);
  strategy.settle(t.params, t.buffers);
}

// The centre validated and saved is one: settle() takes it once, the same on every rank, and with_evaluation_model()
// and save_state() keep using it while another rank exchanges again (without it, rank 0 would fetch a centre that
// moved between validating and saving). This rank's own next exchange lets go of it.
TEST_F(AsyncEasgd, SettleTakesTheCentreOnceForValidationAndTheCheckpoint) {
  const auto world = core::Comm::world();
  const int p = world.size();
  const int r = world.rank();
  Tensors t;
  AsyncEasgdStrategy strategy(world, {.tau = 1, .alpha = 0.25f / static_cast<float>(std::max(p, 1))});
  exchange_once_and_settle(strategy, t, 0.5f, -2.0f);
  const std::vector<float> taken = strategy.fetch_center();
  std::vector<float> evaluated;
  strategy.with_evaluation_model(t.params, t.buffers, [&] { evaluated = flatten(t.params, t.buffers); });
  EXPECT_EQ(evaluated, taken) << "after settle, the centre";
  EXPECT_NE(flatten(t.params, t.buffers), taken) << "and the replica back afterwards";
  // The same on every rank, bit for bit.
  std::vector<float> rank0 = taken;
  world.broadcast(rank0, 0);
  EXPECT_EQ(taken, rank0);
  // A second settle with no exchange in between keeps it (one allreduce, nothing fetched).
  strategy.settle(t.params, t.buffers);

  // The last rank exchanges again while every other rank still holds what it validated: rank 0 saves that.
  world.barrier();
  if (r == p - 1) strategy.exchange(t.params, t.buffers);
  world.barrier();
  const std::vector<float> now = strategy.fetch_center();
  if (p > 1) {
    EXPECT_NE(now, taken) << "the centre moved after it was taken";
  }
  std::vector<float> again;
  strategy.with_evaluation_model(t.params, t.buffers, [&] { again = flatten(t.params, t.buffers); });
  io::Checkpoint saved;
  strategy.save_state(t.params, t.buffers, saved);
  std::vector<float> saved_params;
  for (const Param* q : t.params) {
    const auto& data = saved.easgd_center.at(q->name).data;
    saved_params.insert(saved_params.end(), data.begin(), data.end());
  }
  if (r == p - 1) {
    EXPECT_EQ(again, now) << "this rank exchanged since: the centre as it is now";
  } else {
    EXPECT_EQ(again, taken) << "validated and saved: the centre taken, not the one that moved since";
  }
  EXPECT_EQ(saved_params,
            std::vector<float>(again.begin(), again.begin() + static_cast<std::ptrdiff_t>(saved_params.size())));
  strategy.settle(t.params, t.buffers);
  EXPECT_EQ(strategy.fetch_center(), now);
}

// The centre's recomputed batch-norm statistics (set_center_buffers at an epoch's end) reach the centre in the
// windows, not only the centre taken for validation and saving: the exchanges after it go on from them. A buffer of 5
// values, so that with 4 ranks it spans two shards.
TEST_F(AsyncEasgd, CentreBuffersReachTheWindows) {
  const auto world = core::Comm::world();
  Tensors t(6, 3, 5);
  AsyncEasgdStrategy strategy(world, {.tau = 1, .alpha = 0.25f / static_cast<float>(world.size())});
  exchange_once_and_settle(strategy, t, 0.25f, 1.0f);
  const std::vector<float> before = strategy.fetch_center();
  const std::vector<float> replica = flatten(t.params, t.buffers);

  const std::vector<float> statistics{-3.0f, 4.5f, 0.125f, 7.0f, 9.25f};
  strategy.with_evaluation_model(t.params, t.buffers, [&] {
    t.mean.value = statistics;
    strategy.set_center_buffers(t.buffers);
  });
  std::vector<float> expected = before;
  std::copy(statistics.begin(), statistics.end(), expected.end() - static_cast<std::ptrdiff_t>(statistics.size()));
  EXPECT_EQ(strategy.fetch_center(), expected) << "the windows' centre: its parameters untouched, the new buffers";
  std::vector<float> evaluated;
  strategy.with_evaluation_model(t.params, t.buffers, [&] { evaluated = flatten(t.params, t.buffers); });
  EXPECT_EQ(evaluated, expected) << "the centre taken: the same";
  EXPECT_EQ(flatten(t.params, t.buffers), replica) << "the replica comes back";
}

TEST_F(AsyncEasgd, OptionsFollowEasgd) {
  const auto world = core::Comm::world();
  EXPECT_EQ(AsyncEasgdStrategy(world, {}).alpha(), static_cast<float>(0.9 / world.size()));
  EXPECT_EQ(AsyncEasgdStrategy(world, {.beta = 0.5, .alpha = 0.125}).alpha(), 0.125f);
  EXPECT_EQ(AsyncEasgdStrategy(world, {.tau = 3}).tau(), 3);
  EXPECT_THROW(AsyncEasgdStrategy(world, {.tau = 0}), core::ConfigError);
  EXPECT_THROW(AsyncEasgdStrategy(world, {.beta = 1.5}), core::ConfigError);
  if (world.size() > 1) {
    EXPECT_THROW(AsyncEasgdStrategy(world, {.alpha = 0.9}), core::ConfigError) << "p x alpha > 1 overshoots the centre";
  }
  EXPECT_EQ(make_strategy("async-easgd", world, {.tau = 4})->name(), std::string("async-easgd"));
}

TEST_F(AsyncEasgd, NoUpdateIsLostInUnsynchronizedExchanges) {
  const auto world = core::Comm::world();
  const int r = world.rank();
  // 1000 + 37 + 21 values: shards of a few hundred values that cut through the tensors.
  Tensors t(1000, 37, 21);
  const std::size_t n = t.size();
  std::vector<float> initial = gradcheck::random_vector(n, 11);  // rank 0's, broadcast by initialize()
  unpack_values(initial.data(), t.params, t.buffers);
  AsyncEasgdStrategy strategy(world, {.tau = 1});  // α = 0.9 / p
  strategy.initialize(t.params, t.buffers);
  const std::vector<float> center_before = strategy.fetch_center();
  world.barrier();  // every rank has read the initial centre before the first exchange
  ASSERT_EQ(center_before, initial);

  // Rank r takes 20 + 13·r "training steps" (its replica drifts by a rank-specific amount, tracked in double)
  // and exchanges after every one, without any synchronization: the exchanges of the ranks interleave as the
  // scheduler pleases.
  const int steps = 20 + 13 * r;
  std::vector<double> replica(initial.begin(), initial.end());  // x_initial + Σ drift − Σ d, in double
  std::vector<double> sent;
  for (int s = 0; s < steps; ++s) {
    const auto drift = gradcheck::random_vector(
        n, 1000 * static_cast<std::uint32_t>(r + 1) + static_cast<std::uint32_t>(s), -0.5f, 0.5f);
    auto x = flatten(t.params, t.buffers);
    for (std::size_t k = 0; k < n; ++k) {
      x[k] += drift[k];
      replica[k] += drift[k];
    }
    unpack_values(x.data(), t.params, t.buffers);
    std::vector<double> before = sent;
    strategy.exchange(t.params, t.buffers, &sent);
    for (std::size_t k = 0; k < n; ++k) replica[k] -= sent[k] - (before.empty() ? 0.0 : before[k]);
  }
  strategy.settle(t.params, t.buffers);
  EXPECT_EQ(strategy.stats().exchanges, steps);

  // Every rank's bookkeeping: its replica lost exactly what it sent.
  EXPECT_LT(max_abs_difference(flatten(t.params, t.buffers), replica), 1e-4);
  // The centre gained exactly what all ranks sent.
  std::vector<double> all_sent = sent;
  world.allreduce(all_sent.data(), all_sent.size(), core::ReduceOp::sum);
  const std::vector<float> center_after = strategy.fetch_center();
  std::vector<double> expected(n);
  double moved = 0.0;
  for (std::size_t k = 0; k < n; ++k) {
    expected[k] = static_cast<double>(center_before[k]) + all_sent[k];
    moved = std::max(moved, std::abs(all_sent[k]));
  }
  EXPECT_LT(max_abs_difference(center_after, expected), 1e-4);
  EXPECT_GT(moved, 0.1) << "the centre moved: the comparison above says something";
  EXPECT_TRUE(same_on_all_ranks(world, center_after)) << "after settle() every rank sees one centre";
}

// ------------------------------------------------------------------------------------------ small models

constexpr int kSize = 12;

struct Replica {
  std::unique_ptr<Model> model;
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
  std::unique_ptr<Optimizer> optimizer;
  SoftmaxCrossEntropy loss;

  Replica() {
    model = make_model({.architecture = "tiny_cnn", .input_size = kSize, .num_classes = 2, .seed = 7});
    model->collect(params, buffers);
    optimizer = make_optimizer("sgd", {.momentum = 0.9, .weight_decay = 1e-4});
  }

  void step(const std::vector<float>& images, const std::vector<int>& labels, Strategy* strategy,
            std::int64_t step_number) {
    const int n = static_cast<int>(labels.size());
    model->set_mode(Mode::train);
    Optimizer::zero_grad(params);
    loss.forward(model->forward(images, n, kSize, kSize), labels);
    model->backward(loss.backward());
    if (strategy != nullptr) strategy->reduce_gradients(params);
    optimizer->step(params, 0.05);
    if (strategy != nullptr) strategy->after_update(params, buffers, step_number);
  }

  // The loss of the model as it is now, in evaluation mode (batch-norm running statistics).
  double eval_loss(const std::vector<float>& images, const std::vector<int>& labels) {
    model->set_mode(Mode::eval);
    const double value = loss.forward(model->forward(images, static_cast<int>(labels.size()), kSize, kSize), labels);
    model->set_mode(Mode::train);
    return value;
  }
};

// n images whose class is separable: class 1 brightens channel 0 and darkens channel 1, class 0 the reverse,
// on top of noise. Drawn from `seed`.
struct Data {
  std::vector<float> images;
  std::vector<int> labels;
  Data(int n, std::uint32_t seed) {
    const auto plane = static_cast<std::size_t>(kSize * kSize);
    images = gradcheck::random_vector(static_cast<std::size_t>(n) * 3 * plane, seed);
    for (int i = 0; i < n; ++i) {
      const int label = static_cast<int>((seed + static_cast<std::uint32_t>(i)) % 2);
      labels.push_back(label);
      const float sign = label == 1 ? 1.0f : -1.0f;
      for (std::size_t j = 0; j < plane; ++j) {
        images[(static_cast<std::size_t>(i) * 3 + 0) * plane + j] += 0.75f * sign;
        images[(static_cast<std::size_t>(i) * 3 + 1) * plane + j] -= 0.75f * sign;
      }
    }
  }
};

TEST_F(AsyncEasgd, CentreImprovesTheHeldOutLossWithUnequalStepCounts) {
  const auto world = core::Comm::world();
  const int r = world.rank();
  const Data held_out(64, 4242);
  Replica untrained;
  const double initial_loss = untrained.eval_loss(held_out.images, held_out.labels);

  Replica run;
  AsyncEasgdStrategy strategy(world, {.tau = 2});
  strategy.initialize(run.params, run.buffers);
  // Rank r takes 30 + 7·r steps on its own data, exchanging every other step with nobody waiting.
  const int steps = 30 + 7 * r;
  for (int s = 0; s < steps; ++s) {
    const Data batch(8, 100000 * static_cast<std::uint32_t>(r + 1) + static_cast<std::uint32_t>(s));
    run.step(batch.images, batch.labels, &strategy, s + 1);
  }
  strategy.settle(run.params, run.buffers);
  EXPECT_EQ(strategy.stats().exchanges, steps / 2);

  const auto replica = flatten(run.params, run.buffers);
  double center_loss = 0.0;
  std::vector<float> seen;
  strategy.with_evaluation_model(run.params, run.buffers, [&] {
    seen = flatten(run.params, run.buffers);
    center_loss = run.eval_loss(held_out.images, held_out.labels);
  });
  EXPECT_EQ(seen, strategy.fetch_center()) << "the evaluation model is the centre";
  EXPECT_EQ(flatten(run.params, run.buffers), replica) << "the replica comes back";
  EXPECT_LT(center_loss, 0.5 * initial_loss) << "initial " << initial_loss << ", centre " << center_loss;
  EXPECT_TRUE(same_on_all_ranks(world, seen));
  EXPECT_THROW(strategy.with_evaluation_model(run.params, run.buffers, [] { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_EQ(flatten(run.params, run.buffers), replica) << "also after an exception";

  // save_state is not collective: rank 0 alone fetches the centre for its checkpoint.
  if (world.is_root()) {
    io::Checkpoint alone;
    strategy.save_state(run.params, run.buffers, alone);
    EXPECT_EQ(alone.easgd_center.size(), run.params.size());
  }
  world.barrier();
  // Every rank saves (all see one centre now) and resumes from its checkpoint: every owner fills its slice with
  // the saved parameters and buffers.
  io::Checkpoint checkpoint;
  strategy.save_state(run.params, run.buffers, checkpoint);
  std::vector<float> saved;
  for (const auto* param : run.params) {
    const auto& tensor = checkpoint.easgd_center.at(param->name);
    EXPECT_EQ(tensor.shape, param->shape);
    saved.insert(saved.end(), tensor.data.begin(), tensor.data.end());
  }
  ASSERT_LE(saved.size(), seen.size());
  EXPECT_EQ(saved, std::vector<float>(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(saved.size())));
  AsyncEasgdStrategy resumed(world, {.tau = 2});
  resumed.load_state(checkpoint, run.params, run.buffers);
  resumed.initialize(run.params, run.buffers);
  EXPECT_EQ(resumed.fetch_center(), seen);
}

TEST_F(AsyncEasgd, AlphaZeroLeavesTheCentreAndTrainsIndependentReplicas) {
  const auto world = core::Comm::world();
  const int r = world.rank();
  const int steps = 5 + 2 * r;
  auto train = [&](Strategy* strategy) {
    Replica run;
    if (strategy != nullptr) strategy->initialize(run.params, run.buffers);
    for (int s = 0; s < steps; ++s) {
      const Data batch(4, 500 * static_cast<std::uint32_t>(r + 1) + static_cast<std::uint32_t>(s));
      run.step(batch.images, batch.labels, strategy, s + 1);
    }
    if (strategy != nullptr) strategy->settle(run.params, run.buffers);
    return flatten(run.params, run.buffers);
  };
  AsyncEasgdStrategy strategy(world, {.tau = 1, .beta = 0.0});
  ASSERT_EQ(strategy.alpha(), 0.0f);
  const auto coupled = train(&strategy);
  EXPECT_EQ(coupled, train(nullptr));
  EXPECT_EQ(strategy.stats().exchanges, steps) << "it did exchange, every step";
  const Replica initial;
  EXPECT_EQ(strategy.fetch_center(), flatten(initial.params, initial.buffers)) << "the centre never moved";
  if (world.size() > 1) {
    EXPECT_FALSE(same_on_all_ranks(world, coupled)) << "the replicas trained apart";
  }
}

}  // namespace
}  // namespace tessera::engine
