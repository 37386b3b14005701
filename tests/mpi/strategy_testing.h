// What the distributed-strategy tests (tests/mpi/test_strategy*.cpp) share.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/comm.h"
#include "engine/context.h"
#include "engine/parameters.h"
#include "engine/strategy.h"

namespace tessera::engine::strategy_testing {

// Several ranks share two cores: one OpenMP thread each, for the whole suite.
class OneThreadPerRank : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { Context::get().set_threads(1); }
  static void TearDownTestSuite() { Context::get().set_threads(0); }
};

// All values of the parameters, then of the buffers (the strategies' flat order).
inline std::vector<float> flatten(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  std::size_t n = 0;
  for (const auto* p : params) n += p->value.size();
  for (const auto* b : buffers) n += b->value.size();
  std::vector<float> all(n);
  pack_values(params, buffers, all.data());
  return all;
}

// True on every rank of `comm` when `values` is the same, bit for bit, on all its ranks.
inline bool same_on_all_ranks(const core::Comm& comm, std::vector<float> values) {
  auto max = values, min = values;
  comm.allreduce(max.data(), max.size(), core::ReduceOp::max);
  comm.allreduce(min.data(), min.size(), core::ReduceOp::min);
  const bool same = max == values && min == values;
  return comm.allreduce_value<std::int64_t>(same ? 0 : 1, core::ReduceOp::max) == 0;
}

}  // namespace tessera::engine::strategy_testing
