// Parameters and buffers to checkpoints and back: names, shapes and values survive a file bit for bit,
// optimizer state and the EASGD centre find their parameters, and mismatches are refused without changing
// the model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "io/checkpoint.h"
#include "tests/testing/testing.h"

namespace tessera::engine {
namespace {

using tessera::testing::TempDir;

std::vector<float> values_for(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t state = seed * 747796405u + 2891336453u;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<std::int32_t>(state)) / 2147483648.0f;
  }
  return v;
}

// A ResNet-named stem and classifier, owned here (a model's collect() gives the same pointer lists).
struct SmallModel {
  std::vector<Param> params;
  std::vector<Buffer> buffers;

  explicit SmallModel(std::uint32_t seed) {
    auto param = [&](const char* name, ParamKind kind, std::vector<std::int64_t> shape) {
      Param p;
      p.name = name;
      p.kind = kind;
      p.shape = std::move(shape);
      p.value = values_for(p.numel(), seed++);
      p.grad.assign(p.value.size(), 0.0f);
      params.push_back(std::move(p));
    };
    param("conv1.weight", ParamKind::conv_weight, {4, 3, 3, 3});
    param("bn1.weight", ParamKind::norm_weight, {4});
    param("bn1.bias", ParamKind::norm_bias, {4});
    param("fc.weight", ParamKind::linear_weight, {2, 4});
    param("fc.bias", ParamKind::bias, {2});
    buffers.push_back({"bn1.running_mean", {4}, values_for(4, seed++)});
    std::vector<float> variance = values_for(4, seed++);
    for (auto& v : variance) v = std::fabs(v) + 0.5f;  // a variance is above 0, as a checked read requires
    buffers.push_back({"bn1.running_var", {4}, std::move(variance)});
  }
  std::vector<Param*> param_ptrs() {
    std::vector<Param*> out;
    for (auto& p : params) out.push_back(&p);
    return out;
  }
  std::vector<Buffer*> buffer_ptrs() {
    std::vector<Buffer*> out;
    for (auto& b : buffers) out.push_back(&b);
    return out;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

io::Checkpoint with_meta() {
  io::Checkpoint c;
  c.meta.architecture = "tiny_cnn";
  c.meta.input_size = 8;
  c.meta.num_classes = 2;
  return c;
}

TEST(CheckpointAdapter, LayoutFollowsTheModelOrder) {
  SmallModel model(1);
  const io::CheckpointLayout layout = checkpoint_layout(model.param_ptrs(), model.buffer_ptrs());
  ASSERT_EQ(layout.params.size(), 5u);
  EXPECT_EQ(layout.params[0].name, "conv1.weight");
  EXPECT_EQ(layout.params[0].shape, (std::vector<std::int64_t>{4, 3, 3, 3}));
  EXPECT_EQ(layout.params[4].name, "fc.bias");
  ASSERT_EQ(layout.buffers.size(), 2u);
  EXPECT_EQ(layout.buffers[1].name, "bn1.running_var");
}

TEST(CheckpointAdapter, ModelAndOptimizerStateSurviveAFileBitForBit) {
  TempDir dir;
  const std::string path = dir.file("model.h5");
  SmallModel trained(1);
  OptimizerState momentum;
  for (const auto& p : trained.params) momentum[state_key(momentum_slot, p.name)] = values_for(p.numel(), 99);
  std::vector<std::vector<float>> center;
  for (const auto& p : trained.params) center.push_back(values_for(p.numel(), 7));

  io::Checkpoint c = with_meta();
  store_checkpoint_tensors(trained.param_ptrs(), trained.buffer_ptrs(), c);
  c.optimizer = to_checkpoint_state("sgd", 42, momentum, trained.param_ptrs());
  c.easgd_center = to_checkpoint_center(center, trained.param_ptrs());
  io::write_checkpoint(path, c);

  SmallModel fresh(1000);  // same architecture, other values
  const io::Checkpoint read = io::read_checkpoint(path, checkpoint_layout(fresh.param_ptrs(), fresh.buffer_ptrs()));
  load_checkpoint_tensors(read, fresh.param_ptrs(), fresh.buffer_ptrs());
  for (std::size_t i = 0; i < fresh.params.size(); ++i) {
    EXPECT_TRUE(same_bits(fresh.params[i].value, trained.params[i].value)) << fresh.params[i].name;
    EXPECT_EQ(fresh.params[i].grad.size(), fresh.params[i].value.size()) << "grads untouched";
  }
  for (std::size_t i = 0; i < fresh.buffers.size(); ++i) {
    EXPECT_TRUE(same_bits(fresh.buffers[i].value, trained.buffers[i].value)) << fresh.buffers[i].name;
  }
  EXPECT_EQ(read.optimizer.name, "sgd");
  EXPECT_EQ(read.optimizer.step, 42);
  EXPECT_EQ(read.optimizer.slots.at(momentum_slot).at("fc.weight").shape, (std::vector<std::int64_t>{2, 4}));
  const OptimizerState restored = from_checkpoint_state(read.optimizer);
  ASSERT_EQ(restored.size(), momentum.size());
  for (const auto& [key, values] : momentum) EXPECT_TRUE(same_bits(restored.at(key), values)) << key;
  const auto restored_center = from_checkpoint_center(read.easgd_center, fresh.param_ptrs());
  ASSERT_EQ(restored_center.size(), center.size());
  for (std::size_t i = 0; i < center.size(); ++i) EXPECT_TRUE(same_bits(restored_center[i], center[i])) << i;
}

// The PyTorch-made fixture loads into parameters with torchvision's names and layouts.
TEST(CheckpointAdapter, TorchFixtureLoadsIntoParameters) {
  SmallModel model(5);
  const std::string path = (tessera::testing::test_data_dir() / "checkpoints" / "tiny_torch.h5").string();
  const io::Checkpoint c = io::read_checkpoint(path, checkpoint_layout(model.param_ptrs(), model.buffer_ptrs()));
  load_checkpoint_tensors(c, model.param_ptrs(), model.buffer_ptrs());
  EXPECT_TRUE(same_bits(model.params[0].value, c.params.at("conv1.weight").data));
  EXPECT_TRUE(same_bits(model.buffers[1].value, c.buffers.at("bn1.running_var").data));
  for (float v : model.buffers[1].value) EXPECT_GT(v, 0.0f) << "a running variance";
}

TEST(CheckpointAdapter, MismatchesAreRefusedAndLeaveTheModelUnchanged) {
  SmallModel source(1);
  io::Checkpoint c = with_meta();
  store_checkpoint_tensors(source.param_ptrs(), source.buffer_ptrs(), c);
  c.buffers["bn1.running_var"].shape = {2, 2};  // same size, other shape

  SmallModel target(2);
  const auto before = target.params[0].value;
  try {
    load_checkpoint_tensors(c, target.param_ptrs(), target.buffer_ptrs());
    FAIL() << "no error";
  } catch (const core::InternalError& e) {
    EXPECT_NE(
        std::string(e.what()).find("tensor 'bn1.running_var' in /buffers has shape [2, 2], the model expects [4]"),
        std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(same_bits(target.params[0].value, before)) << "nothing copied before the check failed";

  c.params.erase("fc.bias");
  EXPECT_THROW(load_checkpoint_tensors(c, target.param_ptrs(), target.buffer_ptrs()), core::InternalError);

  OptimizerState foreign;
  foreign[state_key(momentum_slot, "old_head.weight")] = {1.0f};
  EXPECT_THROW(to_checkpoint_state("sgd", 1, foreign, source.param_ptrs()), core::InternalError);
  OptimizerState wrong_size;
  wrong_size[state_key(momentum_slot, "fc.bias")] = {1.0f, 2.0f, 3.0f};
  EXPECT_THROW(to_checkpoint_state("sgd", 1, wrong_size, source.param_ptrs()), core::InternalError);
  EXPECT_THROW(to_checkpoint_center({{1.0f}}, source.param_ptrs()), core::InternalError);

  source.params[1].name = "conv1.weight";  // a duplicate name
  io::Checkpoint duplicate = with_meta();
  EXPECT_THROW(store_checkpoint_tensors(source.param_ptrs(), source.buffer_ptrs(), duplicate), core::InternalError);
}

}  // namespace
}  // namespace tessera::engine
