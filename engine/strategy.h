// Distributed strategies: how the model replicas of the ranks are kept together during training.
//
// The training loop (engine/trainer.h) runs, per step: forward → loss → backward → strategy.reduce_gradients →
// optimizer step → strategy.after_update. A strategy plugs into those two points only, so the loop reads the
// same for one process and for many (STYLE.md item 4).
//
//   allreduce   synchronous data parallelism: before every update the gradients are averaged over all ranks
//               (one fused allreduce of all gradients), so every replica takes the same step and stays
//               identical. On one rank it does nothing.
//
// Every strategy starts from identical replicas (rank 0's parameters and buffers broadcast) and names the
// parameters to evaluate and checkpoint (for allreduce: the replica itself).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/parameters.h"
#include "io/comm.h"

namespace tessera::engine {

class Strategy {
 public:
  explicit Strategy(const io::Comm& comm) : comm_(comm) {}
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  virtual const char* name() const = 0;
  const io::Comm& comm() const { return comm_; }

  // Makes every replica equal to rank 0's (parameters and buffers). Called once before training.
  virtual void initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers);
  // Between backward and the optimizer's update.
  virtual void reduce_gradients(const std::vector<Param*>& params) = 0;
  // After the optimizer's update number `step` (1-based).
  virtual void after_update(const std::vector<Param*>& params, std::int64_t step) = 0;

 protected:
  const io::Comm& comm_;
};

class AllreduceStrategy final : public Strategy {
 public:
  using Strategy::Strategy;
  const char* name() const override { return "allreduce"; }
  void reduce_gradients(const std::vector<Param*>& params) override;
  void after_update(const std::vector<Param*>&, std::int64_t) override {}

 private:
  std::vector<float> flat_;  // all gradients, packed for one allreduce
};

// The one list of strategies (STYLE.md item 5).
struct StrategyEntry {
  const char* name;
  const char* doc;
  std::unique_ptr<Strategy> (*make)(const io::Comm& comm);
};
std::span<const StrategyEntry> strategy_registry();
std::vector<std::string> strategy_names();
// An unknown name is a ConfigError on key "distributed.strategy" listing the known ones.
std::unique_ptr<Strategy> make_strategy(const std::string& name, const io::Comm& comm);

}  // namespace tessera::engine
