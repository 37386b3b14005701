// engine::train_step (engine/train_step.h): the one order of a training step that the trainer, the benchmarks and
// the simulator share, observed through a strategy and a computation that record what they are asked to do.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/error.h"
#include "engine/strategy.h"
#include "engine/train_step.h"

namespace tessera::engine {
namespace {

// A Strategy keeps a reference to its communicator: one that lives as long as the tests.
const core::Comm& world() {
  static const core::Comm instance = core::Comm::world();
  return instance;
}

class RecordingStrategy : public Strategy {
 public:
  explicit RecordingStrategy(std::vector<std::string>& log) : Strategy(world()), log_(log) {}
  const char* name() const override { return "recording"; }
  void before_backward(bool completes_step) override {
    log_.push_back(completes_step ? "before_backward(last)" : "before_backward");
  }
  void reduce_gradients(const std::vector<Param*>& /*params*/) override { log_.push_back("reduce_gradients"); }
  void after_update(const std::vector<Param*>& /*params*/, const std::vector<Buffer*>& /*buffers*/,
                    std::int64_t step) override {
    log_.push_back("after_update(" + std::to_string(step) + ")");
  }

 private:
  std::vector<std::string>& log_;
};

struct Recorded {
  std::vector<std::string> log;
  Param weight{"fc.weight", ParamKind::linear_weight, {2}, {1.0f, 2.0f}, {5.0f, 5.0f}};
  std::vector<Param*> params{&weight};
  std::vector<Buffer*> buffers;
  std::vector<double> losses;  // what each micro-batch's forward returns

  StepWork work() {
    return {.forward =
                [this](std::int64_t micro) {
                  // The gradients are zeroed before the first micro-batch and accumulate after it.
                  log.push_back("forward(" + std::to_string(micro) + ") grad " + std::to_string(int(weight.grad[0])));
                  return losses.at(static_cast<std::size_t>(micro));
                },
            .backward =
                [this] {
                  log.push_back("backward");
                  weight.grad[0] += 1.0f;
                },
            .update = [this] { log.push_back("update"); }};
  }
};

TEST(TrainStep, TakesEveryMicroBatchThenReducesUpdatesAndExchangesInThatOrder) {
  Recorded r;
  r.losses = {1.0, 2.0, 6.0};
  RecordingStrategy strategy(r.log);
  const double loss = train_step(&strategy, r.params, r.buffers, /*step=*/7, /*micro_batches=*/3, r.work());
  EXPECT_DOUBLE_EQ(loss, 3.0);  // the mean of the micro-batches' losses
  const std::vector<std::string> expected = {"forward(0) grad 0",
                                             "before_backward",
                                             "backward",
                                             "forward(1) grad 1",
                                             "before_backward",
                                             "backward",
                                             "forward(2) grad 2",
                                             "before_backward(last)",
                                             "backward",
                                             "reduce_gradients",
                                             "update",
                                             "after_update(8)"};
  EXPECT_EQ(r.log, expected);
}

TEST(TrainStep, WithoutAStrategyComputesAndUpdates) {
  Recorded r;
  r.losses = {0.5};
  EXPECT_DOUBLE_EQ(train_step(nullptr, r.params, r.buffers, 0, 1, r.work()), 0.5);
  const std::vector<std::string> expected = {"forward(0) grad 0", "backward", "update"};
  EXPECT_EQ(r.log, expected);
}

TEST(TrainStep, ANonFiniteLossStopsTheStepBeforeItsGradientsReachACollective) {
  for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Recorded r;
    r.losses = {1.0, bad};
    RecordingStrategy strategy(r.log);
    try {
      train_step(&strategy, r.params, r.buffers, 41, 2, r.work());
      ADD_FAILURE() << "a loss of " << bad << " was taken";
    } catch (const core::InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("at step 42"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("optimizer.lr"), std::string::npos) << e.what();
    }
    const std::vector<std::string> expected = {"forward(0) grad 0", "before_backward", "backward", "forward(1) grad 1"};
    EXPECT_EQ(r.log, expected);
  }
}

}  // namespace
}  // namespace tessera::engine
