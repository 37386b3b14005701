// `tessera train` with model.init_from: a model fine-tuned from given weights (a Tessera checkpoint, or a PyTorch
// state dict converted by scripts/torch_checkpoint.py), the classifier head replaced when the class count differs.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/imgcodecs.hpp>

#include "engine/checkpoint_adapter.h"
#include "engine/models/registry.h"
#include "io/checkpoint.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::run;

// 24 px patches of 8 patients (tumour patches darker), imported into shards: a training set made in a second.
std::string patch_shards(const testing::TempDir& dir) {
  std::ofstream csv(dir.file("labels.csv"));
  csv << "path,label,group,split\n";
  for (int i = 0; i < 64; ++i) {
    const int label = i % 2;
    cv::Mat bgr(24, 24, CV_8UC3, cv::Scalar(label ? 120 : 200, label ? 60 : 150, label ? 140 : 210));
    for (int y = 0; y < 24; y += 3) bgr.row(y).setTo(cv::Scalar((i * 13) % 255, 90, 160));
    const std::string name = "p" + std::to_string(i) + ".png";
    cv::imwrite(dir.file(name), bgr);
    csv << name << "," << label << ",patient" << i % 8 << "," << (i % 8 < 6 ? "train" : "val") << "\n";
  }
  csv.close();
  const auto r = run("import --csv " + dir.file("labels.csv") + " --mpp 2 --out " + dir.file("shards"));
  EXPECT_EQ(r.code, 0) << r.err;
  return dir.file("shards");
}

std::string job(const testing::TempDir& dir, const std::string& name, const std::string& init_from) {
  const std::string path = dir.file(name + ".yaml");
  std::ofstream(path) << "output: " << dir.file(name) << "\n"
                      << "data:\n  shards: " << dir.file("shards") << "\n"
                      << "model:\n  architecture: tiny_cnn\n"
                      << (init_from.empty() ? "" : "  init_from: " + init_from + "\n")
                      << "train:\n  epochs: 1\n  batch_size: 8\n";
  return path;
}

TEST(InitFrom, TrainingStartsFromGivenWeightsAndReplacesAnotherHead) {
  testing::TempDir dir;
  patch_shards(dir);
  const auto base = run("train " + job(dir, "base", ""));
  ASSERT_EQ(base.code, 0) << base.err;

  // From the same model: every tensor taken.
  const auto tuned = run("train " + job(dir, "tuned", dir.file("base/checkpoint.h5")));
  ASSERT_EQ(tuned.code, 0) << tuned.err;
  EXPECT_TRUE(contains(tuned.err, "initial weights from " + dir.file("base/checkpoint.h5") + ": 7 tensors"))
      << tuned.err;
  EXPECT_FALSE(contains(tuned.err, "head replaced")) << tuned.err;

  // From a 5-class model (as a state dict converted from PyTorch would be): the head is replaced.
  engine::ModelOptions o;
  o.architecture = "tiny_cnn";
  o.input_size = 24;
  o.num_classes = 5;
  auto five = engine::make_model(o);
  std::vector<engine::Param*> params;
  std::vector<engine::Buffer*> buffers;
  five->collect(params, buffers);
  io::Checkpoint c;
  c.meta.architecture = "tiny_cnn";
  c.meta.input_size = 24;
  c.meta.num_classes = 5;
  engine::store_checkpoint_tensors(params, buffers, c);
  io::write_checkpoint(dir.file("five.h5"), c);
  const auto headed = run("train " + job(dir, "headed", dir.file("five.h5")));
  ASSERT_EQ(headed.code, 0) << headed.err;
  EXPECT_TRUE(contains(headed.err,
                       "5 tensors; classifier head replaced (seeded initialisation): fc.weight [2, 4] "
                       "(the checkpoint's [5, 4]), fc.bias [2] (the checkpoint's [5])"))
      << headed.err;

  // Another architecture: one error naming the file, before any training.
  const auto refused =
      run("train " + job(dir, "other", dir.file("base/checkpoint.h5")) + " --set model.architecture=compact");
  EXPECT_EQ(refused.code, 3) << refused.err;
  EXPECT_TRUE(contains(refused.err, dir.file("base/checkpoint.h5")) &&
              contains(refused.err, "holds a tiny_cnn model, and the job trains a compact"))
      << refused.err;
}

}  // namespace
}  // namespace tessera
