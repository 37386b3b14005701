// `tessera train` and `tessera predict` end to end on small synthetic slides: the model learns, a resumed run
// continues bit for bit, predictions cover every chosen tile with the AUC the metrics give, and bad input is
// refused with the right exit code and the file or key named.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/metrics.h"
#include "io/checkpoint.h"
#include "io/shard.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::read_jsonl;
using testing::run;
using testing::run_mpi;

constexpr int kEpochs = 6;

// Eight synthetic slides (four per class: two train, one val, one test), tiled at 32 px, and one training run of
// kEpochs epochs, made once for the whole suite.
class Train : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const auto synth = run("synth --out " + dir_->file("synth") +
                           " --slides 8 --size 2048 --seed 5 --set preview.enabled=false --set tumour.max_regions=3"
                           " --set split.train=0.5 --set split.val=0.25");
    ASSERT_EQ(synth.code, 0) << synth.err;
    const std::string tile_job = dir_->file("tile.yaml");
    std::ofstream(tile_job) << "input:\n  csv: " << dir_->file("synth/dataset.csv") << "\n"
                            << "output: " << shards() << "\n"
                            << "tile:\n  size: 32\n  mpp: 1.0\n"
                            << "tissue:\n  min_fraction: 0.3\n"
                            << "shards:\n  tiles_per_shard: 256\n";
    const auto tile = run("tile " + tile_job);
    ASSERT_EQ(tile.code, 0) << tile.err;
    const auto trained = run("train " + job() + " --out " + dir_->file("run") + " --epochs " + std::to_string(kEpochs));
    ASSERT_EQ(trained.code, 0) << trained.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  static std::string shards() { return dir_->file("shards"); }

  // The training job: the tiny CNN with augmentation, a cosine schedule over kEpochs epochs. With seed 5 the first
  // validation is near chance (AUC about 0.5) and the last near 1. Other seeds learn as well, but some already
  // score high after one epoch (synthetic tumour is easy to tell by colour), so their rise would be no test.
  static std::string job() {
    const std::string path = dir_->file("train.yaml");
    if (!fs::exists(path)) {
      std::ofstream(path) << "data:\n  shards: " << shards() << "\n  block_size: 16\n  shuffle_buffer: 256\n"
                          << "model:\n  architecture: tiny_cnn\n"
                          << "train:\n  batch_size: 16\n  seed: 5\n  log_every: 5\n"
                          << "optimizer:\n  name: sgd\n  lr: 0.1\n  momentum: 0.9\n"
                          << "schedule:\n  name: cosine\n  reference_batch: 0\n";
    }
    return path;
  }

  static testing::TempDir* dir_;
};
testing::TempDir* Train::dir_ = nullptr;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

using TileKey = std::tuple<std::string, std::int64_t, std::int64_t, int>;  // slide, x, y, label

struct Prediction {
  TileKey key;
  float p = 0.0f;
};

// predict's CSV, header checked.
std::vector<Prediction> read_predictions(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "slide_id,x,y,label,p_tumor");
  std::vector<Prediction> rows;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string slide, x, y, label, p;
    std::getline(fields, slide, ',');
    std::getline(fields, x, ',');
    std::getline(fields, y, ',');
    std::getline(fields, label, ',');
    std::getline(fields, p, ',');
    rows.push_back({{slide, std::stoll(x), std::stoll(y), std::stoi(label)}, std::stof(p)});
  }
  return rows;
}

// Every tile of the shard folder whose slide is in one of `splits`, in shard order.
std::vector<TileKey> shard_tiles(const std::string& folder, const std::set<std::string>& splits) {
  const auto manifest = io::read_manifest(folder + "/manifest.json");
  std::set<std::string> slides;
  for (const auto& s : manifest.slides) {
    if (splits.contains(s.split)) slides.insert(s.id);
  }
  std::vector<TileKey> tiles;
  for (const auto& entry : manifest.shards) {
    const auto shard = io::ShardFile::open(folder + "/" + entry.file);
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      const std::string& slide = shard.slides()[shard.slide_indices()[k]];
      if (slides.contains(slide)) {
        tiles.emplace_back(slide, shard.coords()[2 * k], shard.coords()[2 * k + 1], shard.labels()[k]);
      }
    }
  }
  return tiles;
}

std::map<std::string, std::string> split_of_slides(const std::string& folder) {
  std::map<std::string, std::string> split;
  for (const auto& s : io::read_manifest(folder + "/manifest.json").slides) split[s.id] = s.split;
  return split;
}

// AUC and accuracy at 0.5 of predictions, as core/metrics.h computes them.
std::pair<double, double> auc_and_accuracy(const std::vector<Prediction>& rows) {
  std::vector<float> scores;
  std::vector<std::uint8_t> labels;
  int correct = 0;
  for (const auto& r : rows) {
    scores.push_back(r.p);
    labels.push_back(static_cast<std::uint8_t>(std::get<3>(r.key)));
    correct += (r.p >= 0.5f) == (std::get<3>(r.key) != 0);
  }
  return {core::roc_auc(scores, labels), static_cast<double>(correct) / static_cast<double>(rows.size())};
}

// metrics.csv as rows of named numbers.
std::vector<std::map<std::string, double>> read_metrics_csv(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> names;
  std::stringstream header(line);
  for (std::string name; std::getline(header, name, ',');) names.push_back(name);
  std::vector<std::map<std::string, double>> rows;
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    auto& row = rows.emplace_back();
    for (const auto& name : names) {
      std::string field;
      std::getline(fields, field, ',');
      row[name] = field == "null" ? std::nan("") : std::stod(field);
    }
  }
  return rows;
}

TEST_F(Train, LearnsToTellTumourFromNormal) {
  const fs::path out = dir_->file("run");
  const auto val = read_jsonl(out / "metrics.jsonl", "val");
  ASSERT_EQ(val.size(), static_cast<std::size_t>(kEpochs));
  const double first_auc = val.front()["auc"].get<double>();
  const double last_auc = val.back()["auc"].get<double>();
  const double first_loss = val.front()["loss"].get<double>();
  const double last_loss = val.back()["loss"].get<double>();
  EXPECT_GT(val.front()["tiles"].get<int>(), 100);
  EXPECT_GT(last_auc, 0.95) << "the tiny CNN separates synthetic tumour from normal tiles";
  EXPECT_GT(last_auc, first_auc + 0.2) << "validation AUC rises: " << first_auc << " -> " << last_auc;
  EXPECT_LT(last_loss, 0.8 * first_loss) << "validation loss falls: " << first_loss << " -> " << last_loss;

  // metrics.csv: one row per epoch, the training loss falling, the learning rate following the cosine down.
  const auto epochs = read_metrics_csv(out / "metrics.csv");
  ASSERT_EQ(epochs.size(), static_cast<std::size_t>(kEpochs));
  EXPECT_LT(epochs.back().at("train_loss"), 0.75 * epochs.front().at("train_loss"));
  EXPECT_LT(epochs.back().at("lr"), 0.1 * epochs.front().at("lr"));
  EXPECT_DOUBLE_EQ(epochs.back().at("val_auc"), last_auc);

  // Every artefact of a run is there.
  for (const char* name : {"checkpoint.h5", "checkpoint-epoch-001.h5", "train.config.yaml"}) {
    EXPECT_TRUE(fs::exists(out / name)) << name;
  }
  char last[32];
  std::snprintf(last, sizeof last, "checkpoint-epoch-%03d.h5", kEpochs);
  EXPECT_TRUE(fs::exists(out / last)) << last;
}

// The tensors a continued run depends on are equal, bit for bit.
void expect_same_training_state(const std::string& a_path, const std::string& b_path) {
  const auto a = io::read_checkpoint(a_path);
  const auto b = io::read_checkpoint(b_path);
  EXPECT_EQ(b.meta.step, a.meta.step);
  EXPECT_EQ(b.meta.epoch, a.meta.epoch);
  ASSERT_FALSE(a.params.empty());
  EXPECT_TRUE(b.params == a.params) << "the same weights, bit for bit";
  EXPECT_TRUE(b.buffers == a.buffers) << "the same batch-norm statistics";
  EXPECT_FALSE(a.optimizer.empty());
  EXPECT_TRUE(b.optimizer == a.optimizer) << "the same momentum";
}

TEST_F(Train, ResumedRunContinuesBitForBit) {
  // Two epochs straight against one epoch, then --resume auto to two. A constant rate, because the cosine's
  // shape depends on the number of epochs asked for.
  const std::string constant = " --set schedule.name=constant";
  const fs::path straight = dir_->file("straight");
  const fs::path resumed = dir_->file("resumed");
  auto r = run("train " + job() + constant + " --out " + straight.string() + " --epochs 2");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("train " + job() + constant + " --out " + resumed.string() + " --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("train " + job() + constant + " --out " + resumed.string() + " --epochs 2 --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "resuming from")) << r.err;
  expect_same_training_state((straight / "checkpoint.h5").string(), (resumed / "checkpoint.h5").string());
  // The validation after the resume is the straight run's.
  const auto a = read_jsonl(straight / "metrics.jsonl", "val");
  const auto b = read_jsonl(resumed / "metrics.jsonl", "val");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b.back()["auc"], a.back()["auc"]);
  EXPECT_EQ(b.back()["loss"], a.back()["loss"]);

  // A job killed after its third epoch (of the suite's six, cosine rate) and started again with --resume auto ends
  // where the uninterrupted run ended.
  const fs::path killed = dir_->file("killed");
  fs::create_directories(killed);
  fs::copy_file(dir_->file("run/checkpoint-epoch-003.h5"), killed / "checkpoint.h5");
  r = run("train " + job() + " --out " + killed.string() + " --epochs " + std::to_string(kEpochs) + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_training_state(dir_->file("run/checkpoint.h5"), (killed / "checkpoint.h5").string());
}

// The decision threshold: chosen on the val tiles by balanced accuracy and applied unchanged to the test tiles (the
// summary's figures recomputed from the CSV by core/metrics.h), or given; a split that is not predicted cannot
// choose it.
TEST_F(Train, PredictChoosesTheThresholdOnOneSplitAndAppliesItToTheOthers) {
  const fs::path csv = dir_->file("threshold/preds.csv");
  auto r = run("predict --checkpoint " + dir_->file("run/checkpoint.h5") + " --shards " + shards() + " --out " +
               csv.string() + " --splits test,val --threshold-from val");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = read_predictions(csv);
  const auto split = split_of_slides(shards());
  std::map<std::string, std::pair<std::vector<float>, std::vector<std::uint8_t>>> by_split;
  for (const auto& row : rows) {
    auto& [p, labels] = by_split[split.at(std::get<0>(row.key))];
    p.push_back(row.p);
    labels.push_back(static_cast<std::uint8_t>(std::get<3>(row.key)));
  }
  const json summary = read_json(dir_->file("threshold/preds.json"));
  const double threshold = core::balanced_threshold(by_split["val"].first, by_split["val"].second);
  ASSERT_TRUE(std::isfinite(threshold));
  EXPECT_DOUBLE_EQ(summary["threshold"].get<double>(), threshold);
  EXPECT_EQ(summary["threshold_from"], "val");
  for (const std::string name : {"test", "val"}) {
    const core::OperatingPoint at = core::operating_point(by_split[name].first, by_split[name].second, threshold);
    const json& s = summary["per_split"][name];
    EXPECT_EQ(s["tp"].get<std::int64_t>(), at.tp) << name;
    EXPECT_EQ(s["fp"].get<std::int64_t>(), at.fp) << name;
    EXPECT_EQ(s["tn"].get<std::int64_t>(), at.tn) << name;
    EXPECT_EQ(s["fn"].get<std::int64_t>(), at.fn) << name;
    EXPECT_DOUBLE_EQ(s["balanced_accuracy"].get<double>(), at.balanced_accuracy()) << name;
    EXPECT_DOUBLE_EQ(s["f1"].get<double>(), at.f1()) << name;
    EXPECT_DOUBLE_EQ(s["sensitivity"].get<double>(), at.sensitivity()) << name;
    EXPECT_DOUBLE_EQ(s["specificity"].get<double>(), at.specificity()) << name;
  }
  // On the split that chose it, no other threshold does better.
  const auto& [val_p, val_labels] = by_split["val"];
  const double best = summary["per_split"]["val"]["balanced_accuracy"].get<double>();
  for (const float p : val_p) {
    EXPECT_LE(core::operating_point(val_p, val_labels, p).balanced_accuracy(), best + 1e-12) << "threshold " << p;
  }
  EXPECT_TRUE(fs::file_size(dir_->file("threshold/preds.roc.png")) > 1000) << "the ROC picture";

  // A given threshold.
  r = run("predict --checkpoint " + dir_->file("run/checkpoint.h5") + " --shards " + shards() + " --out " +
          dir_->file("threshold/given.csv") + " --splits test --threshold 0.3");
  ASSERT_EQ(r.code, 0) << r.err;
  const json given = read_json(dir_->file("threshold/given.json"));
  EXPECT_DOUBLE_EQ(given["threshold"].get<double>(), 0.3);
  EXPECT_TRUE(given["threshold_from"].is_null());
  EXPECT_EQ(given["per_split"]["test"]["tp"].get<std::int64_t>(),
            core::operating_point(by_split["test"].first, by_split["test"].second, 0.3).tp);

  // Test-time augmentation: the mean over the 8 symmetries, so the scores move (the model is not invariant to them)
  // while the rows stay the same.
  r = run("predict --checkpoint " + dir_->file("run/checkpoint.h5") + " --shards " + shards() + " --out " +
          dir_->file("threshold/d8.csv") + " --splits test,val --tta d8");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto d8 = read_predictions(dir_->file("threshold/d8.csv"));
  ASSERT_EQ(d8.size(), rows.size());
  std::size_t moved = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(d8[i].key, rows[i].key) << "row " << i;
    moved += d8[i].p != rows[i].p;
  }
  EXPECT_GT(moved, rows.size() / 2) << "d8 averaging changes most scores";
  EXPECT_EQ(read_json(dir_->file("threshold/d8.json"))["tta"], "d8");

  // The choosing split must be predicted.
  r = run("predict --checkpoint " + dir_->file("run/checkpoint.h5") + " --shards " + shards() + " --out " +
          dir_->file("threshold/bad.csv") + " --splits test --threshold-from val");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "predict.threshold_from")) << r.err;
  EXPECT_FALSE(fs::exists(dir_->file("threshold/bad.csv")));
}

TEST_F(Train, PredictScoresEveryChosenTileWithTheAucTheMetricsGive) {
  const fs::path csv = dir_->file("preds/test-val.csv");
  const auto r = run("predict --checkpoint " + dir_->file("run/checkpoint.h5") + " --shards " + shards() + " --out " +
                     csv.string() + " --splits test,val --batch 50");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = read_predictions(csv);

  // One row per tile of the test and val slides, in shard order, with the shard's coordinates and labels.
  const auto expected = shard_tiles(shards(), {"test", "val"});
  ASSERT_EQ(rows.size(), expected.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].key, expected[i]) << "row " << i;
    ASSERT_TRUE(rows[i].p >= 0.0f && rows[i].p <= 1.0f) << "row " << i << ": " << rows[i].p;
  }

  // The summary: the AUC and accuracy recomputed from the CSV, overall and per split.
  const json summary = read_json(dir_->file("preds/test-val.json"));
  EXPECT_EQ(summary["tiles"].get<std::size_t>(), rows.size());
  EXPECT_TRUE(contains(summary["checkpoint"].get<std::string>(), "checkpoint.h5"));
  const auto [auc, accuracy] = auc_and_accuracy(rows);
  EXPECT_DOUBLE_EQ(summary["auc"].get<double>(), auc);
  EXPECT_DOUBLE_EQ(summary["accuracy"].get<double>(), accuracy);
  EXPECT_GT(auc, 0.9);
  const auto split = split_of_slides(shards());
  ASSERT_EQ(summary["per_split"].size(), 2u) << summary.dump();
  for (const std::string name : {"test", "val"}) {
    std::vector<Prediction> part;
    std::copy_if(rows.begin(), rows.end(), std::back_inserter(part),
                 [&](const Prediction& p) { return split.at(std::get<0>(p.key)) == name; });
    const auto& s = summary["per_split"][name];
    EXPECT_EQ(s["tiles"].get<std::size_t>(), part.size()) << name;
    EXPECT_DOUBLE_EQ(s["auc"].get<double>(), auc_and_accuracy(part).first) << name;
  }

  // Prediction sees the tiles as validation did: the val split's AUC is the trainer's last validation AUC (up to
  // the rounding of folded batch norm and of the metrics' 6 digits).
  const auto val = read_jsonl(dir_->file("run/metrics.jsonl"), "val");
  EXPECT_NEAR(summary["per_split"]["val"]["auc"].get<double>(), val.back()["auc"].get<double>(), 2e-4);
  EXPECT_NEAR(summary["per_split"]["val"]["accuracy"].get<double>(), val.back()["accuracy"].get<double>(), 2e-3);

  // Default: every slide.
  const auto all = run("predict --checkpoint " + dir_->file("run/checkpoint.h5") + " --shards " + shards() + " --out " +
                       dir_->file("preds/all.csv"));
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_EQ(read_predictions(dir_->file("preds/all.csv")).size(),
            shard_tiles(shards(), {"train", "val", "test"}).size());
}

TEST_F(Train, PredictOnTwoRanksWritesTheSameRows) {
  const std::string args = "predict --checkpoint " + dir_->file("run/checkpoint.h5") + " --shards " + shards() +
                           " --splits val --batch 64 --out ";
  const auto one = run(args + dir_->file("ranks/one.csv"));
  ASSERT_EQ(one.code, 0) << one.err;
  const auto two = run_mpi(2, args + dir_->file("ranks/two.csv"));
  ASSERT_EQ(two.code, 0) << two.err;
  const auto a = read_predictions(dir_->file("ranks/one.csv"));
  const auto b = read_predictions(dir_->file("ranks/two.csv"));
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].key, b[i].key) << "row " << i;
    // Other batch compositions may take other kernels: equal up to float rounding.
    ASSERT_NEAR(a[i].p, b[i].p, 1e-5f) << "row " << i;
  }
  EXPECT_EQ(read_json(dir_->file("ranks/two.json"))["ranks"].get<int>(), 2);
}

TEST_F(Train, PredictRefusesABadCheckpointOrMissingShardsNamingTheFile) {
  const std::string good = dir_->file("run/checkpoint.h5");
  const std::string rest = " --shards " + shards() + " --out " + dir_->file("bad/preds.csv");

  // Truncated copy.
  const std::string truncated = dir_->file("truncated.h5");
  const std::string bytes = read_text(good);
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() * 2 / 3);
  auto r = run("predict --checkpoint " + truncated + rest);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, truncated)) << r.err;

  // Tensors that do not fit the architecture /meta names.
  auto checkpoint = io::read_checkpoint(good);
  checkpoint.meta.architecture = "lenet5";
  const std::string mismatched = dir_->file("mismatched.h5");
  io::write_checkpoint(mismatched, checkpoint);
  r = run("predict --checkpoint " + mismatched + rest);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, mismatched)) << r.err;

  // No such checkpoint; no such shard folder.
  r = run("predict --checkpoint " + dir_->file("nothing.h5") + rest);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, dir_->file("nothing.h5"))) << r.err;
  r = run("predict --checkpoint " + good + " --shards " + dir_->file("no-shards") + " --out " +
          dir_->file("bad/preds.csv"));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, dir_->file("no-shards"))) << r.err;

  // A split no slide is in: a configuration mistake naming the key.
  r = run("predict --checkpoint " + good + rest + " --splits holdout");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "data.splits")) << r.err;
  EXPECT_FALSE(fs::exists(dir_->file("bad/preds.csv"))) << "nothing written on failure";
}

TEST_F(Train, TrainRefusesMissingShardsAndUnknownKeys) {
  const std::string out = " --out " + dir_->file("refused");
  auto r = run("train " + job() + out + " --shards " + dir_->file("missing-shards"));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, dir_->file("missing-shards"))) << r.err;

  r = run("train " + job() + out + " --set train.epoch=2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "train.epoch")) << r.err;
  EXPECT_TRUE(contains(r.err, "train.epochs")) << "a suggestion: " << r.err;

  const std::string typo = dir_->file("typo.yaml");
  std::ofstream(typo) << "model:\n  architecture: tiny_cnn\ntrain:\n  batch_sise: 8\n";
  r = run("train " + typo + out);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, typo)) << r.err;
  EXPECT_TRUE(contains(r.err, "batch_sise")) << r.err;
  EXPECT_FALSE(fs::exists(dir_->file("refused/checkpoint.h5")));
}

}  // namespace
}  // namespace tessera
