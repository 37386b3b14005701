// The model's size as a job key (model.width, model.classifier_width): a compact CNN of another width is trained,
// recorded in its checkpoint's /meta, rebuilt at that width by `tessera predict`, and refused where the job's model has
// another width (a resume) or does not take the key.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "tests/app/patch_shards.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::patch_shards;
using testing::read_jsonl;
using testing::run;

TEST(ModelWidth, TravelsWithTheCheckpointAndIsRefusedWhereItDoesNotFit) {
  testing::TempDir dir;
  const std::string shards = patch_shards(dir);
  const std::string job = dir.file("narrow.yaml");
  std::ofstream(job) << "output: " << dir.file("narrow") << "\n"
                     << "data:\n  shards: " << shards << "\n"
                     << "model:\n  architecture: compact\n  width: 8\n"
                     << "train:\n  epochs: 1\n  batch_size: 8\n";
  const auto trained = run("train " + job);
  ASSERT_EQ(trained.code, 0) << trained.err;
  const std::string checkpoint = dir.file("narrow/checkpoint.h5");
  const io::CheckpointMeta meta = io::read_checkpoint_meta(checkpoint);
  EXPECT_EQ(meta.width, std::optional<std::int64_t>(8));
  EXPECT_FALSE(meta.classifier_width.has_value()) << "a compact has no classifier width";
  // 8, 16, 32, 64, 64 channels: 3·8·9 + 8·16·9 + 16·32·9 + 32·64·9 + 64·64·9 conv weights, 2·(8+16+32+64+64) batch
  // norm, 64·2 + 2 fc.
  EXPECT_TRUE(contains(trained.err, "compact: 61770 parameters")) << trained.err;

  // predict rebuilds the width-8 model: its val split scores as the trainer's last validation did.
  const auto predicted = run("predict --checkpoint " + checkpoint + " --shards " + shards +
                             " --splits val --out " + dir.file("preds/val.csv"));
  ASSERT_EQ(predicted.code, 0) << predicted.err;
  std::ifstream summary_file(dir.file("preds/val.json"));
  const auto summary = nlohmann::json::parse(summary_file);
  const auto val = read_jsonl(dir.file("narrow/metrics.jsonl"), "val");
  ASSERT_EQ(val.size(), 1u);
  EXPECT_NEAR(summary["auc"].get<double>(), val.back()["auc"].get<double>(), 2e-4);
  EXPECT_NEAR(summary["accuracy"].get<double>(), val.back()["accuracy"].get<double>(), 2e-3);

  // Resumed at another width: one error naming the file and both widths, before anything is written.
  const auto resumed = run("train " + job + " --out " + dir.file("wider") + " --resume " + checkpoint +
                           " --epochs 2 --set model.width=16");
  EXPECT_EQ(resumed.code, 3) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, checkpoint) &&
              contains(resumed.err, "the checkpoint holds a compact of width 8, and the job trains one of width 16 "
                                    "(model.width)"))
      << resumed.err;
  EXPECT_FALSE(fs::exists(dir.file("wider/checkpoint.h5")));

  // A size the architecture is not built with, at another value than its default: a configuration mistake naming
  // the key.
  auto refused = run("train " + job + " --out " + dir.file("refused") + " --set model.architecture=resnet18");
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_TRUE(contains(refused.err, "model.width is 8, but a resnet18 is not built with it (only compact)"))
      << refused.err;
  refused = run("train " + job + " --out " + dir.file("refused") + " --set model.classifier_width=256");
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_TRUE(contains(refused.err, "model.classifier_width is 256, but a compact is not built with it (only alexnet, "
                                    "vgg11, vgg11_bn, vgg16, vgg16_bn)"))
      << refused.err;
  EXPECT_FALSE(fs::exists(dir.file("refused/checkpoint.h5")));
}

}  // namespace
}  // namespace tessera
