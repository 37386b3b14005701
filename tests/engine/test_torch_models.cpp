// Every architecture of Tessera's model registry, made by PyTorch and converted by scripts/torch_checkpoint.py, gives
// PyTorch's outputs in Tessera (label `torch`: it needs Debian's python3-torch, python3-h5py and, for torchvision's own
// models, python3-torchvision, which `scripts/install-deps.sh --bench` installs; `make test-torch` runs it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/models/registry.h"
#include "tests/engine/layer_testing.h"
#include "tests/engine/model_checkpoints.h"
#include "tests/testing/testing.h"

namespace tessera::engine {
namespace {

using testing::all_near;
using testing::fixture_input;
using testing::load_model;

const std::string python = "/usr/bin/python3";
constexpr const char* kNoTorch =
    "PyTorch is not here (Debian's python3-torch and python3-h5py: scripts/install-deps.sh --bench)";

// scripts/torch_checkpoint.py, or "" when Debian's python3 has no torch or h5py.
std::string torch_checkpoint_script() {
  if (std::system((python + " -c 'import torch, h5py' > /dev/null 2>&1").c_str()) != 0) return "";
  return (tessera::testing::test_data_dir().parent_path().parent_path() / "scripts" / "torch_checkpoint.py").string();
}

// Every architecture of the registry, made by PyTorch (torchvision's own models where torchvision has them and it is
// installed) and written by scripts/torch_checkpoint.py, gives PyTorch's outputs in Tessera: the conversion covers the
// whole registry. Needs Debian's python3 with torch and h5py (scripts/install-deps.sh --bench); skips without them.
TEST(ModelCheckpoint, EveryArchitectureFromPyTorchGivesPyTorchsOutputs) {
  const std::string script = torch_checkpoint_script();
  if (script.empty()) GTEST_SKIP() << kNoTorch;
  tessera::testing::TempDir dir;
  for (const auto& name : model_names()) {
    SCOPED_TRACE(name);
    // The smallest inputs each takes (AlexNet from 63 px), so that the largest models run in seconds.
    const int size = name == "tiny_cnn" ? 8 : name == "alexnet" ? 63 : 32;
    const std::string h5 = dir.file(name + ".h5"), json = dir.file(name + ".json");
    const std::string export_command = python + " " + script + " export --arch " + name + " --seed 3 --num-classes 3" +
                                       " --input-size " + std::to_string(size) + " " + h5 + " > /dev/null";
    ASSERT_EQ(std::system(export_command.c_str()), 0) << export_command;
    const std::string predict_command = python + " " + script + " predict " + h5 + " --json " + json + " > /dev/null";
    ASSERT_EQ(std::system(predict_command.c_str()), 0) << predict_command;
    std::ifstream file(json);
    const nlohmann::json expected = nlohmann::json::parse(file);
    auto model = load_model(h5);
    const auto shape = expected.at("input_shape").get<std::vector<int>>();
    const auto x = fixture_input(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
    model->set_mode(Mode::eval);
    const Tensor& logits = model->forward(x, shape[0], shape[2], shape[3]);
    EXPECT_EQ(logits.dims(), (dims_t{shape[0], 3}));
    EXPECT_TRUE(all_near(logits.to_plain(), expected.at("logits").get<std::vector<float>>(), 1e-4));
    std::filesystem::remove(h5);  // VGG's are half a gigabyte
  }
}

// A model of another size than the default (a compact of width 8, an AlexNet with a 64-unit classifier) keeps it both
// ways: the script writes it into /meta and Tessera builds that size; a state dict taken back from PyTorch (`import`,
// which reads the size from /meta) and converted again (`export --state-dict`, which reads it from the tensors'
// shapes) gives the same model.
TEST(ModelCheckpoint, AModelOfAnotherSizeKeepsItBothWays) {
  const std::string script = torch_checkpoint_script();
  if (script.empty()) GTEST_SKIP() << kNoTorch;
  tessera::testing::TempDir dir;
  struct Case {
    std::string architecture, option;
    int size, width, classifier_width;
  };
  for (const Case& c :
       {Case{"compact", "--width 8", 16, 8, 4096}, Case{"alexnet", "--classifier-width 64", 63, 32, 64}}) {
    SCOPED_TRACE(c.architecture);
    const std::string h5 = dir.file(c.architecture + ".h5"), pt = dir.file(c.architecture + ".pt"),
                      again = dir.file(c.architecture + "-again.h5"), json = dir.file(c.architecture + ".json");
    const std::string size = " --input-size " + std::to_string(c.size);
    for (const std::string& command :
         {python + " " + script + " export --arch " + c.architecture + " " + c.option + " --seed 3" + size + " " + h5,
          python + " " + script + " predict " + h5 + " --json " + json,
          python + " " + script + " import " + h5 + " " + pt,
          python + " " + script + " export --arch " + c.architecture + " --state-dict " + pt + size + " " + again}) {
      ASSERT_EQ(std::system((command + " > /dev/null").c_str()), 0) << command;
    }
    std::ifstream file(json);
    const nlohmann::json expected = nlohmann::json::parse(file);
    const auto shape = expected.at("input_shape").get<std::vector<int>>();
    const auto x = fixture_input(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
    for (const std::string& path : {h5, again}) {
      auto model = load_model(path);
      EXPECT_EQ(model->options().width, c.width) << path;
      EXPECT_EQ(model->options().classifier_width, c.classifier_width) << path;
      model->set_mode(Mode::eval);
      EXPECT_TRUE(all_near(model->forward(x, shape[0], shape[2], shape[3]).to_plain(),
                           expected.at("logits").get<std::vector<float>>(), 1e-4))
          << path;
    }
  }
}

}  // namespace
}  // namespace tessera::engine
