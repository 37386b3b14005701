// model.init_from: a model starts from a checkpoint's weights; the classifier head alone may differ (another class
// count) and then keeps its seeded initialisation; anything else that does not fit is refused naming the file and the
// tensor, with the model unchanged.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/checkpoint_adapter.h"
#include "engine/init_from.h"
#include "engine/models/registry.h"
#include "io/checkpoint.h"
#include "tests/testing/testing.h"

namespace tessera::engine {
namespace {

struct Built {
  std::unique_ptr<Model> model;
  std::vector<Param*> params;
  std::vector<Buffer*> buffers;
};

Built build(const ModelOptions& o) {
  Built b{make_model(o), {}, {}};
  b.model->collect(b.params, b.buffers);
  return b;
}

Built build(const std::string& architecture, int classes, std::uint64_t seed, int size = 32) {
  ModelOptions o;
  o.architecture = architecture;
  o.input_size = size;
  o.num_classes = classes;
  o.seed = seed;
  return build(o);
}

// Writes the model as a checkpoint (as `tessera train` would, without training state).
std::string save(Built& b, const std::string& architecture, int classes, const std::string& path) {
  io::Checkpoint c;
  c.meta.architecture = architecture;
  c.meta.input_size = 32;
  c.meta.num_classes = classes;
  store_checkpoint_tensors(b.params, b.buffers, c);
  io::write_checkpoint(path, c);
  return path;
}

// Writes the model of these options as a checkpoint whose /meta records them, size included (describe_model).
io::Checkpoint save_described(Built& b, const ModelOptions& o, const std::string& path) {
  io::Checkpoint c;
  describe_model(o, c.meta);
  store_checkpoint_tensors(b.params, b.buffers, c);
  io::write_checkpoint(path, c);
  return c;
}

TEST(InitFrom, TakesEveryTensorOfTheSameModel) {
  tessera::testing::TempDir dir;
  auto source = build("compact", 2, 7);
  const auto path = save(source, "compact", 2, dir.file("source.h5"));
  auto target = build("compact", 2, 8);
  ASSERT_NE(target.params[0]->value, source.params[0]->value);
  const auto result = init_from_checkpoint(path, {.architecture = "compact"}, target.params, target.buffers);
  EXPECT_EQ(result.tensors, static_cast<int>(target.params.size() + target.buffers.size()));
  EXPECT_TRUE(result.replaced.empty());
  for (std::size_t i = 0; i < target.params.size(); ++i) EXPECT_EQ(target.params[i]->value, source.params[i]->value);
  for (std::size_t i = 0; i < target.buffers.size(); ++i) {
    EXPECT_EQ(target.buffers[i]->value, source.buffers[i]->value);
  }
}

// The model alone is read: the replica files an EASGD run's checkpoint names (one per rank) are not opened — here
// they are not even there, as when the checkpoint alone was copied to another machine.
TEST(InitFrom, ReadsTheModelWithoutTheReplicaFiles) {
  tessera::testing::TempDir dir;
  auto source = build("tiny_cnn", 2, 7);
  io::Checkpoint c;
  c.meta.architecture = "tiny_cnn";
  c.meta.input_size = 32;
  c.meta.num_classes = 2;
  store_checkpoint_tensors(source.params, source.buffers, c);
  c.replica_files.set = "model.replicas/step-1-0123456789abcdef";
  c.replica_files.bytes = {1000, 1000};
  io::write_checkpoint(dir.file("model.h5"), c);
  EXPECT_THROW(io::read_checkpoint(dir.file("model.h5")), core::InputError) << "the full read needs the files";
  auto target = build("tiny_cnn", 2, 8);
  const auto result =
      init_from_checkpoint(dir.file("model.h5"), {.architecture = "tiny_cnn"}, target.params, target.buffers);
  EXPECT_EQ(result.tensors, static_cast<int>(target.params.size() + target.buffers.size()));
  EXPECT_EQ(target.params[0]->value, source.params[0]->value);
}

TEST(InitFrom, AnotherClassCountReplacesOnlyTheHead) {
  tessera::testing::TempDir dir;
  auto source = build("resnet18", 5, 7);
  const auto path = save(source, "resnet18", 5, dir.file("source.h5"));
  auto target = build("resnet18", 2, 8);
  const std::vector<float> head_weight = target.params[target.params.size() - 2]->value;
  const std::vector<float> head_bias = target.params.back()->value;
  const auto result = init_from_checkpoint(path, {.architecture = "resnet18"}, target.params, target.buffers);
  ASSERT_EQ(result.replaced.size(), 2u);
  EXPECT_EQ(result.replaced[0], "fc.weight [2, 512] (the checkpoint's [5, 512])");
  EXPECT_EQ(result.replaced[1], "fc.bias [2] (the checkpoint's [5])");
  EXPECT_EQ(target.params[target.params.size() - 2]->value, head_weight) << "the head keeps its initialisation";
  EXPECT_EQ(target.params.back()->value, head_bias);
  for (std::size_t i = 0; i + 2 < target.params.size(); ++i) {
    EXPECT_EQ(target.params[i]->value, source.params[i]->value) << target.params[i]->name;
  }
}

TEST(InitFrom, AnotherArchitectureOrABodyTensorIsRefusedNamingTheFile) {
  tessera::testing::TempDir dir;
  auto source = build("tiny_cnn", 2, 7);
  const auto path = save(source, "tiny_cnn", 2, dir.file("tiny.h5"));
  auto lenet = build("lenet5", 2, 8);
  try {
    init_from_checkpoint(path, {.architecture = "lenet5"}, lenet.params, lenet.buffers);
    FAIL() << "a tiny_cnn checkpoint was taken for a lenet5";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("holds a tiny_cnn model, and the job trains a lenet5"), std::string::npos)
        << e.what();
  }

  // A body tensor of another shape (here the first convolution's): refused, the model unchanged.
  io::Checkpoint c = io::read_checkpoint(path);
  auto& conv = c.params.at("conv1.weight");
  conv.shape[0] += 1;
  conv.data.resize(static_cast<std::size_t>(conv.numel()), 0.5f);
  c.meta.num_classes = 2;
  io::write_checkpoint(dir.file("bad.h5"), c);
  auto target = build("tiny_cnn", 2, 8);
  const std::vector<float> before = target.params[0]->value;
  try {
    init_from_checkpoint(dir.file("bad.h5"), {.architecture = "tiny_cnn"}, target.params, target.buffers);
    FAIL() << "a first convolution of another shape was taken";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'conv1.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("only the classifier head may differ"), std::string::npos) << e.what();
  }
  EXPECT_EQ(target.params[0]->value, before);
}

// A model of another size (model.width, model.classifier_width) is refused naming both sizes, before any tensor; a
// file without the attribute (written before it was recorded) is the default size.
TEST(InitFrom, AnotherWidthIsRefusedNamingBothWidths) {
  tessera::testing::TempDir dir;
  ModelOptions narrow{.architecture = "compact", .input_size = 32, .width = 8, .seed = 7};
  auto source = build(narrow);
  const std::string path = dir.file("narrow.h5");
  io::Checkpoint c = save_described(source, narrow, path);
  auto target = build("compact", 2, 8);  // width 32
  try {
    init_from_checkpoint(path, {.architecture = "compact"}, target.params, target.buffers);
    FAIL() << "a width 8 checkpoint was taken for a width 32 model";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(
        std::string(e.what()).find("holds a compact of width 8, and the job trains one of width 32 (model.width)"),
        std::string::npos)
        << e.what();
  }
  narrow.seed = 8;
  auto same = build(narrow);
  auto& params = same.params;
  auto& buffers = same.buffers;
  EXPECT_EQ(init_from_checkpoint(path, narrow, params, buffers).tensors,
            static_cast<int>(params.size() + buffers.size()));
  EXPECT_EQ(params[0]->value, source.params[0]->value);

  // Written before /meta recorded the width: the default, 32, which a width 8 job does not match.
  c.meta.width.reset();
  io::write_checkpoint(path, c);
  try {
    init_from_checkpoint(path, narrow, params, buffers);
    FAIL() << "a checkpoint without a width was taken as width 8";
  } catch (const core::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a compact of width 32, and the job trains one of width 8"), std::string::npos)
        << e.what();
  }
}

// AlexNet and VGG record their classifier's width instead, and another is refused the same way (an AlexNet at its
// smallest input, 63 px, with 16- and 32-unit linears, to keep it cheap).
TEST(InitFrom, AnotherClassifierWidthIsRefusedNamingBothWidths) {
  tessera::testing::TempDir dir;
  ModelOptions small{.architecture = "alexnet", .input_size = 63, .classifier_width = 16, .seed = 7};
  auto alexnet = build(small);
  const std::string path = dir.file("alexnet.h5");
  save_described(alexnet, small, path);
  small.classifier_width = 32;
  auto wider = build(small);
  const std::vector<float> before = wider.params[0]->value;
  try {
    init_from_checkpoint(path, small, wider.params, wider.buffers);
    FAIL() << "a 16-unit classifier was taken for a 32-unit one";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("alexnet with a classifier of width 16, and the job trains one of width 32 "
                                         "(model.classifier_width)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(wider.params[0]->value, before);
}

}  // namespace
}  // namespace tessera::engine
