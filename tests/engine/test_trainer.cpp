// The training job's schema: every key prints with its default and doc, and mistakes are named. The model's size
// (model.width) as a job key: trained in-process on a few tiles, recorded in the checkpoint, rebuilt by inference, and
// refused where it does not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include "core/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "engine/inference.h"
#include "engine/trainer.h"
#include "io/checkpoint.h"
#include "io/shard.h"
#include "io/shard_dataset.h"
#include "tests/testing/testing.h"

namespace tessera::engine {
namespace {

namespace fs = std::filesystem;

TEST(TrainSchema, PrintsEveryKeyWithItsDefault) {
  const core::Schema schema = train_schema();
  core::Config config(schema);
  const std::string yaml = config.to_yaml();
  for (const core::KeySpec& key : schema.keys()) {
    const std::string leaf = key.path.substr(key.path.rfind('.') + 1);
    EXPECT_NE(yaml.find(leaf + ":"), std::string::npos) << key.path << " missing from\n" << yaml;
  }
  EXPECT_NE(yaml.find("architecture: compact"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("\n  width: 32\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("\n  classifier_width: 4096\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("milestones: []"), std::string::npos) << "an empty list prints as []\n" << yaml;
}

constexpr int kTile = 16;  // the compact CNN's smallest input
constexpr int kTilesPerSlide = 8;

// Four slides of 16 px tiles at 2 µm/px in one shard, written here (no tessera process): a and b train, c and d
// validate; every other tile is tumour, darker and striped otherwise.
std::string tiny_shards(const tessera::testing::TempDir& dir) {
  const std::string folder = dir.file("shards");
  fs::create_directories(folder);
  io::Manifest manifest;
  manifest.attributes.tile_size = kTile;
  manifest.attributes.mpp = 2.0;
  const std::vector<std::string> slides = {"a", "b", "c", "d"};
  const auto total = static_cast<std::int64_t>(slides.size()) * kTilesPerSlide;
  io::ShardWriter writer(folder + "/shard-00000.h5", manifest.attributes, total, slides);
  io::ManifestShard shard{"shard-00000.h5", total, 0, 0, slides};
  std::int64_t index = 0;
  for (std::uint32_t s = 0; s < slides.size(); ++s) {
    io::ManifestSlide slide;
    slide.id = slides[s];
    slide.split = s < 2 ? "train" : "val";
    slide.tiles = kTilesPerSlide;
    for (int k = 0; k < kTilesPerSlide; ++k, ++index) {
      const int label = k % 2;
      cv::Mat rgb(kTile, kTile, CV_8UC3, label ? cv::Scalar(140, 60, 120) : cv::Scalar(210, 150, 200));
      for (int y = 0; y < kTile; y += 3) rgb.row(y).setTo(cv::Scalar(160, 90, (index * 13) % 255));
      io::ShardTileRecord record;
      record.label = static_cast<std::uint8_t>(label);
      record.tumor_fraction = static_cast<float>(label);
      record.x = k * kTile;
      record.slide_index = s;
      writer.write(index, record, rgb);
      (label ? slide.tumour : slide.normal) += 1;
    }
    shard.normal += slide.normal;
    shard.tumour += slide.tumour;
    manifest.slides.push_back(slide);
  }
  writer.finish();
  manifest.shards.push_back(shard);
  io::write_manifest(folder + "/manifest.json", manifest);
  return folder;
}

core::Config width_job(const tessera::testing::TempDir& dir, const std::string& output,
                       const std::vector<std::string>& settings) {
  core::Config config(train_schema());
  config.set("output=" + dir.file(output));
  config.set("data.shards=" + dir.file("shards"));
  config.set("model.architecture=compact");
  config.set("train.epochs=1");
  config.set("train.batch_size=4");
  config.set("train.threads=1");
  for (const auto& setting : settings) config.set(setting);
  return config;
}

// A compact of width 8 trains, its checkpoint records the width, and inference rebuilds it with the trained model's
// outputs (the validation loss the trainer measured); resumed at another width, or with the key on an architecture
// not built with it, the job is refused naming the file or the key.
TEST(TrainModelWidth, TravelsWithTheCheckpointAndIsRefusedWhereItDoesNotFit) {
  tessera::testing::TempDir dir;
  tiny_shards(dir);
  const core::Comm alone = core::Comm::alone();
  const TrainResult result = train(width_job(dir, "narrow", {"model.width=8"}), alone);
  ASSERT_TRUE(std::isfinite(result.final_val_loss));
  const io::CheckpointMeta meta = io::read_checkpoint_meta(result.checkpoint);
  EXPECT_EQ(meta.width, std::optional<std::int64_t>(8));
  EXPECT_FALSE(meta.classifier_width.has_value()) << "a compact has no classifier width";

  LoadedModel loaded = load_model(result.checkpoint);
  EXPECT_EQ(loaded.model->options().width, 8);
  io::ShardDatasetOptions val;
  val.batch_size = 4;
  val.shuffle = false;
  val.drop_last = false;
  val.slides = {"c", "d"};
  io::ShardDataset data(dir.file("shards"), val);
  data.start_epoch(0);
  TileScorer scorer(*loaded.model);
  io::Batch batch;
  double loss_sum = 0.0;
  int tiles = 0;
  while (data.next(batch)) {
    double loss = 0.0;
    scorer.probabilities(batch, loss);
    loss_sum += loss * batch.size;
    tiles += batch.size;
  }
  ASSERT_EQ(tiles, 2 * kTilesPerSlide);
  EXPECT_NEAR(loss_sum / tiles, result.final_val_loss, 1e-5 * std::max(1.0, result.final_val_loss));

  try {
    train(width_job(dir, "wider", {"model.width=16", "train.epochs=2", "train.resume=" + result.checkpoint}), alone);
    FAIL() << "a width 8 checkpoint resumed a width 16 job";
  } catch (const core::InputError& e) {
    EXPECT_EQ(e.file(), result.checkpoint);
    EXPECT_NE(e.message().find("the checkpoint holds a compact of width 8, and the job trains one of width 16 "
                               "(model.width)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("wider")));

  const auto refused_key = [&](const std::vector<std::string>& settings) {
    try {
      train(width_job(dir, "refused", settings), alone);
    } catch (const core::ConfigError& e) {
      return e.key() + ": " + e.message();
    }
    return std::string("no error");
  };
  EXPECT_EQ(refused_key({"model.architecture=resnet18", "model.width=8"}),
            "model.width: model.width is 8, but a resnet18 is not built with it (only compact); leave it at 32");
  EXPECT_EQ(refused_key({"model.classifier_width=256"}),
            "model.classifier_width: model.classifier_width is 256, but a compact is not built with it (only alexnet, "
            "vgg11, vgg11_bn, vgg16, vgg16_bn); leave it at 4096");
  EXPECT_FALSE(fs::exists(dir.file("refused")));
}

}  // namespace
}  // namespace tessera::engine
