#include "engine/strategy.h"

#include <array>
#include <cstring>

#include <fmt/format.h>

#include "io/error.h"

namespace tessera::engine {

void Strategy::initialize(const std::vector<Param*>& params, const std::vector<Buffer*>& buffers) {
  if (comm_.size() == 1) return;
  for (auto* p : params) comm_.broadcast(p->value.data(), p->value.size() * sizeof(float), 0);
  for (auto* b : buffers) comm_.broadcast(b->value.data(), b->value.size() * sizeof(float), 0);
}

void AllreduceStrategy::reduce_gradients(const std::vector<Param*>& params) {
  if (comm_.size() == 1) return;
  std::size_t total = 0;
  for (const auto* p : params) total += p->grad.size();
  flat_.resize(total);
  std::size_t offset = 0;
  for (const auto* p : params) {
    std::memcpy(flat_.data() + offset, p->grad.data(), p->grad.size() * sizeof(float));
    offset += p->grad.size();
  }
  comm_.allreduce(flat_.data(), flat_.size(), io::ReduceOp::sum);
  const float scale = 1.0f / static_cast<float>(comm_.size());
  offset = 0;
  for (auto* p : params) {
    for (std::size_t i = 0; i < p->grad.size(); ++i) p->grad[i] = flat_[offset + i] * scale;
    offset += p->grad.size();
  }
}

namespace {
const std::array<StrategyEntry, 1> kStrategies = {{
    {"allreduce", "synchronous SGD: gradients averaged over all ranks every step",
     [](const io::Comm& comm) -> std::unique_ptr<Strategy> { return std::make_unique<AllreduceStrategy>(comm); }},
}};
}  // namespace

std::span<const StrategyEntry> strategy_registry() { return kStrategies; }

std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for (const auto& s : kStrategies) names.emplace_back(s.name);
  return names;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, const io::Comm& comm) {
  for (const auto& s : kStrategies) {
    if (name == s.name) return s.make(comm);
  }
  throw io::ConfigError(fmt::format("unknown strategy '{}'; known: {}", name, fmt::join(strategy_names(), ", ")), "",
                        0, "distributed.strategy");
}

}  // namespace tessera::engine
