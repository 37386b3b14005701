// `mpirun -n N tessera train` end to end on small synthetic slides, under every distributed strategy. easgd: the
// checkpoint holds the centre (as the model and under /easgd/center) and every rank's replica, metrics.jsonl splits
// the step time into computation and communication (also for every rank), a resumed run takes the centre back from
// the checkpoint and, on as many ranks, continues bit for bit. allreduce, async-easgd and two-level (inter easgd, two
// groups) train on two ranks into a checkpoint that `tessera predict` scores as validation did. A job killed with
// SIGKILL resumes on the same, on fewer and on more ranks (bit for bit on as many, for allreduce and easgd, whose
// checkpoint between epochs holds the centre's own batch-norm statistics, as one at a run's end does); every
// rank's replica file is published as a set whatever point a job is killed at, and a checkpoint of the earlier
// layout (replicas inside) still resumes; async-easgd validates and saves one centre, taken once; ranks whose
// shares of the tiles differ (3, 8 and 16 ranks) finish; a rank that dies takes the job down.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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
using testing::run_script;

// Four small slides (two train, two validate) tiled at 32 px, and an easgd job on them; made once for the tests
// below.
class DistributedJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r =
        run("synth --out " + dir_->file("synth") +
            " --slides 4 --size 1024 --seed 3 --set preview.enabled=false --set split.train=0.5 --set split.val=0.5");
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("tile.yaml")) << "input:\n  csv: " << dir_->file("synth/dataset.csv") << "\n"
                                           << "output: " << dir_->file("shards") << "\n"
                                           << "tile:\n  size: 32\n  mpp: 1.0\n"
                                           << "tissue:\n  min_fraction: 0.3\n";
    r = run("tile " + dir_->file("tile.yaml"));
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("train.yaml"))
        << "data:\n  shards: " << dir_->file("shards") << "\n  block_size: 16\n  shuffle_buffer: 128\n"
        << "model:\n  architecture: tiny_cnn\n"
        << "train:\n  batch_size: 8\n  seed: 2\n  threads: 1\n"
        << "optimizer:\n  name: sgd\n  lr: 0.05\n  momentum: 0.9\n"
        << "schedule:\n  name: constant\n  reference_batch: 0\n"
        << "distributed:\n  strategy: easgd\n  tau: 2\n  center_sync_every: 3\n";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string job() { return dir_->file("train.yaml"); }
  static std::string shards() { return dir_->file("shards"); }
  // Tiles of the slides in `split`, as the manifest counts them.
  static std::int64_t tiles_in(const std::string& split) {
    std::int64_t tiles = 0;
    for (const auto& s : io::read_manifest(shards() + "/manifest.json").slides) {
      if (s.split == split) tiles += s.tiles;
    }
    return tiles;
  }
  static testing::TempDir* dir_;
};
testing::TempDir* DistributedJob::dir_ = nullptr;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// The job's command-line settings for `strategy` (the job file names easgd). allreduce cuts tiny_cnn's gradients
// into several buckets; two-level makes one group per rank (ranks_per_node 1), whose leaders exchange by EASGD.
std::string strategy_settings(const std::string& strategy) {
  std::string settings = " --set distributed.strategy=" + strategy;
  if (strategy == "allreduce") settings += " --set distributed.bucket_mb=0.0001";
  if (strategy == "two-level") settings += " --set distributed.inter=easgd --set distributed.ranks_per_node=1";
  return settings;
}

// Whether checkpoints of `strategy` on `ranks` ranks carry every rank's replica (Strategy::replicas_differ()).
// (Under easgd on one rank too: its centre is not its replica.)
bool keeps_replicas(const std::string& strategy) { return strategy != "allreduce"; }

// A parameter's name in a test name: letters, digits and underscores only.
std::string test_name(std::string text) {
  for (char& c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return text;
}

// The figures of a "val" line are there and sane: every held-out tile scored once, a finite positive loss, an
// accuracy and an AUC between 0 and 1.
void expect_sane_validation(const json& line, std::int64_t tiles) {
  EXPECT_EQ(line["tiles"].get<std::int64_t>(), tiles) << "every held-out tile, once: " << line.dump();
  for (const char* key : {"loss", "accuracy", "auc"}) {
    ASSERT_TRUE(line[key].is_number()) << key << " is not finite: " << line.dump();  // written as null
  }
  EXPECT_GT(line["loss"].get<double>(), 0.0) << line.dump();
  EXPECT_LT(line["loss"].get<double>(), 10.0) << line.dump();
  for (const char* key : {"accuracy", "auc"}) {
    EXPECT_GE(line[key].get<double>(), 0.0) << key;
    EXPECT_LE(line[key].get<double>(), 1.0) << key;
  }
}

TEST_F(DistributedJob, TwoRanksSaveTheCentreAndResumeFromIt) {
  const fs::path out = dir_->file("run");
  auto r = run_mpi(2, "train " + job() + " --out " + out.string() + " --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err + r.out, "the centre's batch-norm statistics are recomputed")) << r.err;

  // The saved model is the centre: /params repeat /easgd/center.
  const io::Checkpoint first = io::read_checkpoint((out / "checkpoint-epoch-001.h5").string());
  ASSERT_FALSE(first.easgd_center.empty());
  EXPECT_EQ(first.easgd_center, first.params);
  const auto val = read_jsonl(out / "metrics.jsonl", "val");
  ASSERT_EQ(val.size(), 1u);
  const auto timing = read_jsonl(out / "metrics.jsonl", "timing");
  ASSERT_EQ(timing.size(), 1u);
  EXPECT_EQ(timing[0]["steps"].get<std::int64_t>(), first.meta.step);
  const double fraction = timing[0]["comm_fraction"].get<double>();
  EXPECT_GT(fraction, 0.0);
  EXPECT_LT(fraction, 1.0);
  const double waiting = timing[0]["wait_fraction"].get<double>();
  EXPECT_GE(waiting, 0.0);
  EXPECT_LT(fraction + waiting, 1.0);
  // One exchange of every parameter and buffer every 2 steps, a centre broadcast every 3rd exchange.
  std::int64_t values = 0;
  for (const auto& tensors : {first.params, first.buffers}) {
    for (const auto& [name, tensor] : tensors) values += tensor.numel();
  }
  const std::int64_t exchanges = first.meta.step / 2;
  const double bytes_per_step =
      static_cast<double>((exchanges + exchanges / 3) * values * 4) / static_cast<double>(first.meta.step);
  EXPECT_NEAR(timing[0]["comm_bytes_per_step"].get<double>(), bytes_per_step, 1e-4 * bytes_per_step);
  // Every rank sends as much.
  ASSERT_EQ(timing[0]["ranks"].size(), 2u) << timing[0].dump();
  for (const auto& rank : timing[0]["ranks"]) {
    EXPECT_NEAR(rank["comm_bytes_per_step"].get<double>(), bytes_per_step, 1e-4 * bytes_per_step);
  }

  // Resume for a second epoch with α = 0: the replicas train on, but the centre must stay exactly the one the
  // checkpoint holds, and so must everything evaluated and saved from it (its batch-norm statistics, recomputed on
  // the same tiles for the same weights, too).
  r = run_mpi(2, "train " + job() + " --out " + out.string() + " --epochs 2 --resume auto --set distributed.beta=0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err + r.out, "resuming from")) << r.err;
  const io::Checkpoint second = io::read_checkpoint((out / "checkpoint-epoch-002.h5").string());
  EXPECT_EQ(second.meta.step, 2 * first.meta.step);
  EXPECT_EQ(second.easgd_center, first.easgd_center);
  EXPECT_EQ(second.params, first.params);
  EXPECT_EQ(second.buffers, first.buffers);
  EXPECT_NE(second.optimizer, first.optimizer) << "the replicas did train";
  const auto val2 = read_jsonl(out / "metrics.jsonl", "val");
  ASSERT_EQ(val2.size(), 2u);
  EXPECT_EQ(val2[1]["loss"], val2[0]["loss"]) << "validation evaluates the centre";

  // The same first epoch with the replicas' averaged statistics kept (center_bn_tiles 0): the same weights (the
  // statistics never enter a training step), other statistics: the saved centre's are its own, recomputed.
  const fs::path averaged = dir_->file("averaged");
  r = run_mpi(2, "train " + job() + " --out " + averaged.string() + " --epochs 1 --set distributed.center_bn_tiles=0");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint kept = io::read_checkpoint((averaged / "checkpoint-epoch-001.h5").string());
  EXPECT_EQ(kept.params, first.params);
  ASSERT_EQ(kept.buffers.size(), first.buffers.size());
  EXPECT_NE(kept.buffers, first.buffers) << "the epoch checkpoint holds the centre's recomputed statistics";
}

// A "timing" line's figures per rank (under "ranks", index = rank): every rank's step time splits into
// computation, communication and waiting, none negative, and the top-level figures are their means.
void expect_timing_of_every_rank(const json& line, int ranks) {
  ASSERT_EQ(line["ranks"].size(), static_cast<std::size_t>(ranks)) << line.dump();
  // Printed with 6 significant digits.
  auto near = [](double a, double b) { return std::abs(a - b) <= 1e-4 * std::max(std::abs(a), std::abs(b)) + 1e-9; };
  for (const char* key : {"step_s", "compute_s", "comm_s", "wait_s", "comm_bytes_per_step"}) {
    double sum = 0.0;
    for (const auto& rank : line["ranks"]) {
      ASSERT_TRUE(rank[key].is_number()) << key << ": " << line.dump();
      sum += rank[key].get<double>();
    }
    EXPECT_TRUE(near(sum / ranks, line[key].get<double>())) << key << ": " << line.dump();
  }
  for (const auto& rank : line["ranks"]) {
    EXPECT_GE(rank["comm_s"].get<double>(), 0.0);
    EXPECT_GE(rank["wait_s"].get<double>(), 0.0);
    EXPECT_GE(rank["compute_s"].get<double>(), 0.0);
    EXPECT_TRUE(near(rank["compute_s"].get<double>() + rank["comm_s"].get<double>() + rank["wait_s"].get<double>(),
                     rank["step_s"].get<double>()))
        << line.dump();
  }
}

// The linear scaling rule scales the rate for the batch one update averages: every rank's under allreduce, one
// rank's under easgd and async-easgd (each replica steps on its own gradient), a node group's under two-level with
// inter easgd. So an easgd replica's rate does not grow with the rank count.
TEST_F(DistributedJob, TheRateIsScaledForTheBatchOneUpdateAverages) {
  struct Case {
    std::string strategy;
    int ranks;
    int ranks_per_update;
    std::string settings;
  };
  const std::vector<Case> cases = {
      {"easgd", 1, 1, ""},
      {"easgd", 2, 1, ""},
      {"easgd", 4, 1, ""},
      {"easgd", 8, 1, ""},
      {"async-easgd", 2, 1, ""},
      {"async-easgd", 8, 1, ""},
      {"allreduce", 1, 1, ""},
      {"allreduce", 4, 4, ""},
      {"two-level", 4, 2, " --set distributed.inter=easgd --set distributed.ranks_per_node=2"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.strategy + " on " + std::to_string(c.ranks) + " ranks");
    const std::string out = dir_->file("rate-" + c.strategy + "-" + std::to_string(c.ranks));
    const auto r = run_mpi(
        c.ranks, "train " + job() + " --out " + out + " --set distributed.strategy=" + c.strategy +
                     " --set train.batch_size=4 --set schedule.reference_batch=4 --set train.max_steps=1" + c.settings);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    // batch 4 per rank (49 tiles make one on 8 ranks), optimizer.lr 0.05 at reference batch 4: the rate is 0.05 × the
    // ranks one update averages.
    const std::string expected = fmt::format(
        "learning rate {:g} per update after warmup, scaled for the {} tiles one "
        "update averages ({}: {} rank(s) x batch 4",
        0.05 * c.ranks_per_update, 4 * c.ranks_per_update, c.strategy, c.ranks_per_update);
    EXPECT_TRUE(contains(r.err, expected)) << expected << "\n" << r.err;
    const auto train = read_jsonl(fs::path(out) / "metrics.jsonl", "train");
    ASSERT_FALSE(train.empty());
    EXPECT_NEAR(train.front()["lr"].get<double>(), 0.05 * c.ranks_per_update, 1e-6);
  }
}

TEST_F(DistributedJob, TimingLinesGiveEveryRanksOwnBytes) {
  // Two-level with both ranks in one group (inter allreduce): every step each rank hands its gradients to the
  // shared window, and the leader (rank 0) also its batch-norm statistics to the other rank.
  const fs::path out = dir_->file("timing");
  const auto r = run_mpi(2, "train " + job() + " --out " + out.string() +
                                " --epochs 1 --set distributed.strategy=two-level --set distributed.ranks_per_node=2");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint checkpoint = io::read_checkpoint((out / "checkpoint.h5").string());
  std::int64_t params = 0, buffers = 0;
  for (const auto& [name, tensor] : checkpoint.params) params += tensor.numel();
  for (const auto& [name, tensor] : checkpoint.buffers) buffers += tensor.numel();
  ASSERT_GT(buffers, 0) << "tiny_cnn has batch norm";
  const auto timing = read_jsonl(out / "metrics.jsonl", "timing");
  ASSERT_EQ(timing.size(), 1u);
  expect_timing_of_every_rank(timing[0], 2);
  EXPECT_DOUBLE_EQ(timing[0]["ranks"][0]["comm_bytes_per_step"].get<double>(),
                   static_cast<double>(4 * (params + buffers)));
  EXPECT_DOUBLE_EQ(timing[0]["ranks"][1]["comm_bytes_per_step"].get<double>(), static_cast<double>(4 * params));
  EXPECT_DOUBLE_EQ(timing[0]["comm_bytes_per_step"].get<double>(), static_cast<double>(4 * params + 2 * buffers));
}

// The other strategies end to end on two ranks: the job finishes, validation scores every held-out tile with finite
// figures, and `tessera predict` takes the checkpoint and scores the validation tiles as the last validation did
// (the checkpoint holds the model that was validated: the replica, or the centre).
class EveryStrategy : public DistributedJob, public ::testing::WithParamInterface<std::string> {};

TEST_P(EveryStrategy, TwoRanksTrainAndPredictScoresTheValidatedModel) {
  const std::string strategy = GetParam();
  const fs::path out = dir_->file("two-ranks-" + strategy);
  auto r = run_mpi(2, "train " + job() + strategy_settings(strategy) + " --out " + out.string() + " --epochs 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "strategy " + strategy)) << r.err;

  const io::Checkpoint last = io::read_checkpoint((out / "checkpoint-epoch-002.h5").string());
  EXPECT_EQ(last.meta.epoch, 2);
  EXPECT_EQ(last.replicas.size(), keeps_replicas(strategy) ? 2u : 0u);
  if (keeps_replicas(strategy)) {
    EXPECT_EQ(last.easgd_center, last.params) << "the saved model is the centre";
    EXPECT_NE(last.replicas[0].params, last.replicas[1].params) << "the replicas trained apart";
  }
  const auto val = read_jsonl(out / "metrics.jsonl", "val");
  ASSERT_EQ(val.size(), 2u);
  for (const auto& line : val) expect_sane_validation(line, tiles_in("val"));
  const auto timing = read_jsonl(out / "metrics.jsonl", "timing");
  ASSERT_EQ(timing.size(), 2u);
  EXPECT_EQ(timing[0]["steps"].get<std::int64_t>() + timing[1]["steps"].get<std::int64_t>(), last.meta.step);
  EXPECT_GT(timing[1]["comm_bytes_per_step"].get<double>(), 0.0) << "the ranks exchanged";
  for (const auto& line : timing) expect_timing_of_every_rank(line, 2);

  const fs::path csv = out / "val.csv";
  r = run("predict --checkpoint " + (out / "checkpoint.h5").string() + " --shards " + shards() + " --out " +
          csv.string() + " --splits val");
  ASSERT_EQ(r.code, 0) << r.err;
  const json summary = read_json(out / "val.json");
  EXPECT_EQ(summary["tiles"].get<std::int64_t>(), tiles_in("val"));
  ASSERT_TRUE(summary["auc"].is_number()) << summary.dump();
  // Up to the rounding of folded batch norm (predict) and of the metrics' 6 digits.
  EXPECT_NEAR(summary["auc"].get<double>(), val.back()["auc"].get<double>(), 2e-4);
  EXPECT_NEAR(summary["accuracy"].get<double>(), val.back()["accuracy"].get<double>(), 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Strategies, EveryStrategy, ::testing::Values("allreduce", "async-easgd", "two-level"),
                         [](const auto& instance) { return test_name(instance.param); });

// Steps of the "train" lines of metrics.jsonl, in file order.
std::vector<std::int64_t> logged_steps(const fs::path& out) {
  std::vector<std::int64_t> steps;
  for (const auto& line : read_jsonl(out / "metrics.jsonl", "train")) steps.push_back(line["step"].get<std::int64_t>());
  return steps;
}

TEST_F(DistributedJob, EasgdResumedOnAsManyRanksContinuesBitForBit) {
  // Two epochs straight, against a run stopped after 3 steps (mid-epoch, between two exchanges) and resumed.
  const fs::path straight = dir_->file("straight");
  const fs::path resumed = dir_->file("resumed");
  const std::string common = " --set train.log_every=1 --epochs 2";
  auto r = run_mpi(2, "train " + job() + common + " --out " + straight.string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_mpi(2, "train " + job() + common + " --out " + resumed.string() + " --set train.max_steps=3");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint stopped = io::read_checkpoint((resumed / "checkpoint.h5").string());
  ASSERT_EQ(stopped.meta.step, 3);
  ASSERT_EQ(stopped.replicas.size(), 2u) << "every rank's replica is saved";
  EXPECT_NE(stopped.replicas[0].params, stopped.replicas[1].params) << "the replicas differ";
  EXPECT_NE(stopped.replicas[0].params, stopped.params) << "and differ from the centre";
  EXPECT_FALSE(stopped.replicas[1].optimizer.empty()) << "with their own momentum";
  r = run_mpi(2, "train " + job() + common + " --out " + resumed.string() + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;

  const io::Checkpoint a = io::read_checkpoint((straight / "checkpoint.h5").string());
  const io::Checkpoint b = io::read_checkpoint((resumed / "checkpoint.h5").string());
  EXPECT_EQ(b.meta.step, a.meta.step);
  EXPECT_TRUE(b.params == a.params) << "the same centre, bit for bit";
  EXPECT_TRUE(b.buffers == a.buffers);
  EXPECT_TRUE(b.easgd_center == a.easgd_center);
  EXPECT_TRUE(b.replicas == a.replicas) << "the same replicas and momenta";
  // The resumed run logs each step once: the lines the stopped run wrote after its checkpoint are dropped.
  EXPECT_EQ(logged_steps(resumed), logged_steps(straight));
}

// The replica sets of checkpoint `stem` in `out` (io/checkpoint.h "Replica files"), by name.
std::vector<std::string> replica_sets(const fs::path& out, const std::string& stem = "checkpoint") {
  std::vector<std::string> sets;
  const fs::path folder = out / (stem + ".replicas");
  if (!fs::exists(folder)) return sets;
  for (const auto& entry : fs::directory_iterator(folder))
    sets.push_back(stem + ".replicas/" + entry.path().filename().string());
  std::sort(sets.begin(), sets.end());
  return sets;
}

// Every rank writes its own replica file, in parallel; the checkpoint names the set and is published only once all
// are in place. Killed between the two (a rank's replica written, the checkpoint not yet renamed), the job leaves
// the previous checkpoint and its set whole; killed after the rename and before the old set is removed, the new
// one; the resumed run ends bit for bit as the uninterrupted one, and keeps only the set its checkpoint names.
TEST_F(DistributedJob, ReplicaFilesArePublishedAsASetAtEveryCrashPoint) {
  const std::string args =
      job() + " --epochs 2 --set train.checkpoint_every=2 --set train.log_every=1";  // 3 steps per epoch
  const fs::path straight = dir_->file("set-straight");
  auto r = run_mpi(2, "train " + args + " --out " + straight.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint expected = io::read_checkpoint((straight / "checkpoint-epoch-002.h5").string());
  ASSERT_EQ(expected.replicas.size(), 2u);
  EXPECT_EQ(replica_sets(straight),
            std::vector<std::string>{io::read_checkpoint((straight / "checkpoint.h5").string()).replica_files.set})
      << "only the set the checkpoint names is kept";
  EXPECT_EQ(replica_sets(straight, "checkpoint-epoch-001").size(), 1u);
  // Each rank's file holds one replica: its size does not depend on the rank count.
  const auto& bytes = expected.replica_files.bytes;
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes[0], bytes[1]);

  // 1. Rank 1 killed once its replica of the second checkpoint (step 3, the epoch's end) is written: nothing of
  // that checkpoint is published.
  const fs::path out = dir_->file("set-killed");
  r = run_script("TESSERA_FAULT='train.replica-written after=2 rank=1' $MPIEXEC -n 2 $TESSERA train " + args +
                 " --out " + out.string() + " >/dev/null 2>&1\necho $?\n");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out, "0\n") << "the job was killed";
  io::Checkpoint kept = io::read_checkpoint((out / "checkpoint.h5").string());
  EXPECT_EQ(kept.meta.step, 2) << "the previous checkpoint";
  ASSERT_EQ(kept.replicas.size(), 2u) << "with its whole set";
  EXPECT_EQ(replica_sets(out).size(), 2u) << "and the unnamed set of the killed checkpoint";
  EXPECT_FALSE(fs::exists(out / "checkpoint-epoch-001.h5"));

  // 2. Resumed, rank 0 killed right after publishing the next checkpoint.h5 (step 3), before the older sets go.
  r = run_script("TESSERA_FAULT='train.checkpoint-written after=1 rank=0' $MPIEXEC -n 2 $TESSERA train " + args +
                 " --out " + out.string() + " --resume auto >/dev/null 2>&1\necho $?\n");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out, "0\n") << "the job was killed";
  kept = io::read_checkpoint((out / "checkpoint.h5").string());
  EXPECT_EQ(kept.meta.step, 3) << "the new checkpoint";
  ASSERT_EQ(kept.replicas.size(), 2u) << "with its whole set";
  EXPECT_EQ(replica_sets(out).size(), 3u);

  // 3. Resumed to the end: as the uninterrupted run, bit for bit, and only the named set is left.
  r = run_mpi(2, "train " + args + " --out " + out.string() + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint last = io::read_checkpoint((out / "checkpoint-epoch-002.h5").string());
  EXPECT_EQ(last.meta.step, expected.meta.step);
  EXPECT_TRUE(last.params == expected.params) << "the same centre, bit for bit";
  EXPECT_TRUE(last.buffers == expected.buffers);
  EXPECT_TRUE(last.easgd_center == expected.easgd_center);
  EXPECT_TRUE(last.easgd_center_buffers == expected.easgd_center_buffers);
  EXPECT_TRUE(last.replicas == expected.replicas) << "the same replicas and momenta";
  EXPECT_EQ(replica_sets(out),
            std::vector<std::string>{io::read_checkpoint((out / "checkpoint.h5").string()).replica_files.set});
  EXPECT_EQ(logged_steps(out), logged_steps(straight));

  // Inference needs the checkpoint alone.
  const fs::path alone = dir_->file("set-alone");
  fs::create_directories(alone);
  fs::copy_file(out / "checkpoint.h5", alone / "checkpoint.h5");
  r = run("predict --checkpoint " + (alone / "checkpoint.h5").string() + " --shards " + shards() + " --out " +
          (alone / "val.csv").string() + " --splits val");
  EXPECT_EQ(r.code, 0) << r.err;
  // Resuming on as many ranks needs the replicas: without them, an error naming the missing file.
  r = run_mpi(2, "train " + job() + " --epochs 3 --out " + alone.string() + " --resume auto");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "the replica of rank ")) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot be read")) << r.err;
}

// A checkpoint of the earlier layout, every replica inside the file under /replicas/<rank>, still resumes on as many
// ranks bit for bit (here made from a new one: the same tensors, the replicas moved into the file).
TEST_F(DistributedJob, ACheckpointWithItsReplicasInsideResumesAsBefore) {
  const std::string args = job() + " --epochs 2 --set train.log_every=1";
  const fs::path straight = dir_->file("inside-straight");
  auto r = run_mpi(2, "train " + args + " --out " + straight.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path out = dir_->file("inside");
  r = run_mpi(2, "train " + args + " --out " + out.string() + " --set train.max_steps=2");
  ASSERT_EQ(r.code, 0) << r.err;
  io::Checkpoint c = io::read_checkpoint((out / "checkpoint.h5").string());
  ASSERT_EQ(c.replicas.size(), 2u);
  c.replica_files = {};
  io::write_checkpoint((out / "checkpoint.h5").string(), c);
  fs::remove_all(out / "checkpoint.replicas");
  ASSERT_TRUE(io::read_checkpoint((out / "checkpoint.h5").string()).replica_files.empty());

  r = run_mpi(2, "train " + args + " --out " + out.string() + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint a = io::read_checkpoint((straight / "checkpoint-epoch-002.h5").string());
  const io::Checkpoint b = io::read_checkpoint((out / "checkpoint-epoch-002.h5").string());
  EXPECT_TRUE(b.params == a.params) << "the same centre, bit for bit";
  EXPECT_TRUE(b.replicas == a.replicas) << "the same replicas and momenta";
  EXPECT_FALSE(b.replica_files.empty()) << "written in the new layout";
}

// A replica that cannot be written (a full disk on rank 1) ends the job naming its file; the previous checkpoint
// stays whole.
TEST_F(DistributedJob, AReplicaThatCannotBeWrittenEndsTheJobNamingItsFile) {
  const std::string args = job() + " --epochs 2 --set train.checkpoint_every=2";
  // The tensors of one replica file: every write of the second checkpoint's first one fails.
  const fs::path first = dir_->file("enospc-first");
  auto r = run_mpi(2, "train " + args + " --out " + first.string() + " --set train.max_steps=2");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint one = io::read_checkpoint((first / "checkpoint.h5").string());
  const io::Checkpoint file =
      io::read_checkpoint(io::replica_file((first / "checkpoint.h5").string(), one.replica_files.set, 1));
  std::size_t tensors = file.params.size() + file.buffers.size();
  for (const auto& slot : file.optimizer.slots) tensors += slot.second.size();

  const fs::path out = dir_->file("enospc");
  r = run_script("TESSERA_FAULT='checkpoint.write after=" + std::to_string(tensors + 1) +
                 " rank=1 do=enospc' $MPIEXEC -n 2 $TESSERA train " + args + " --out " + out.string() +
                 " 2>&1\necho \"exit $?\"\n");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.out, "exit 0\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "No space left on device")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank-00001.h5")) << r.out;
  const io::Checkpoint kept = io::read_checkpoint((out / "checkpoint.h5").string());
  EXPECT_EQ(kept.meta.step, 2);
  EXPECT_EQ(kept.replicas.size(), 2u);
  for (const auto& set : replica_sets(out)) {
    for (const auto& entry : fs::directory_iterator(out / set)) {
      EXPECT_FALSE(contains(entry.path().filename().string(), ".tmp-")) << "no half-written file: " << entry.path();
    }
  }
}

// async-easgd: the centre validated and saved is taken once, rank 0 fetching it while every other rank is held.
// Rank 0 is stopped at that point (fault injection, do=stop) at the first epoch's end; the test waits for it to be
// stopped, continues it, and the job ends with a checkpoint whose model is its centre and scores as validation did.
TEST_F(DistributedJob, AsyncEasgdValidatesAndSavesTheCentreTakenOnce) {
  const fs::path out = dir_->file("async-hold");
  const std::string log = out.string() + ".log";
  const auto r = run_script(
      "setsid env TESSERA_FAULT='async-easgd.center-taken after=1 rank=0 do=stop' $MPIEXEC -n 2 $TESSERA train " +
      job() + strategy_settings("async-easgd") + " --out " + out.string() + " --epochs 2 >" + log +
      " 2>&1 &\n"
      "job=$!\n"
      "setsid sh -c 'sleep 600 && touch \"$0\" && kill -9 -- \"-$1\"' " +
      out.string() +
      ".hung $job >/dev/null 2>&1 &\n"
      "watchdog=$!\n"
      "pid=''\n"
      "until [ -n \"$pid\" ] && [ \"$(awk '{print $3}' /proc/$pid/stat 2>/dev/null)\" = T ]; do\n"
      "  kill -0 $job 2>/dev/null || { echo 'ended before rank 0 stopped'; break; }\n"
      "  pid=$(sed -n 's/.*stopping process \\([0-9]*\\) until SIGCONT.*/\\1/p' " +
      log +
      ")\n"
      "  sleep 0.05\n"
      "done\n"
      "echo \"stopped $pid\"\n"
      // While rank 0 holds the centre it took, nothing of the epoch's end is written.
      "[ -e " +
      (out / "checkpoint.h5").string() +
      " ] && echo 'a checkpoint while rank 0 was stopped'\n"
      "kill -CONT $pid\n"
      "wait $job\necho \"exit $?\"\n"
      "kill -- -$watchdog 2>/dev/null\n");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(fs::exists(out.string() + ".hung")) << "the job hung\n" << text;
  ASSERT_TRUE(contains(r.out, "stopped ")) << r.out;
  EXPECT_FALSE(contains(r.out, "ended before")) << r.out << text;
  EXPECT_FALSE(contains(r.out, "a checkpoint while")) << r.out;
  ASSERT_TRUE(contains(r.out, "exit 0\n")) << r.out << text;
  EXPECT_TRUE(contains(text, "fault injected at async-easgd.center-taken")) << text;

  for (const char* name : {"checkpoint-epoch-001.h5", "checkpoint-epoch-002.h5"}) {
    const io::Checkpoint c = io::read_checkpoint((out / name).string());
    EXPECT_TRUE(c.easgd_center == c.params) << name << ": the model saved is the centre saved, bit for bit";
    EXPECT_EQ(c.replicas.size(), 2u) << name;
  }
  const auto val = read_jsonl(out / "metrics.jsonl", "val");
  ASSERT_EQ(val.size(), 2u);
  const fs::path csv = out / "val.csv";
  const auto scored = run("predict --checkpoint " + (out / "checkpoint-epoch-001.h5").string() + " --shards " +
                          shards() + " --out " + csv.string() + " --splits val");
  ASSERT_EQ(scored.code, 0) << scored.err;
  const json summary = read_json(out / "val.json");
  // The validated centre is the saved one: up to the rounding of folded batch norm (predict) and of 6 digits.
  EXPECT_NEAR(summary["auc"].get<double>(), val[0]["auc"].get<double>(), 2e-4);
  EXPECT_NEAR(summary["accuracy"].get<double>(), val[0]["accuracy"].get<double>(), 2e-3);
}

// A job of `strategy` on `ranks` ranks, killed with SIGKILL after its first checkpoint and resumed on `resume_ranks`.
struct Kill {
  std::string strategy;
  int ranks = 2;
  int resume_ranks = 2;
};

void PrintTo(const Kill& kill, std::ostream* os) {
  *os << kill.strategy << " killed on " << kill.ranks << " rank(s), resumed on " << kill.resume_ranks;
}

// The fault-injection hook kills at the n-th time a point is reached, on the rank it names: here one process, after
// its second step (the metrics line of step 2 is written, the third step never starts).
TEST_F(DistributedJob, AFaultKillsAtItsPointAndNowhereElse) {
  const fs::path out = dir_->file("fault-after-2");
  const auto r = run_script("TESSERA_FAULT='train.step after=2' $TESSERA train " + job() + " --out " + out.string() +
                            " --epochs 3 --set train.log_every=1 2>&1\necho \"exit $?\"\n");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "fault injected at train.step")) << r.out;
  EXPECT_TRUE(contains(r.out, "exit 137\n")) << r.out;
  EXPECT_EQ(logged_steps(out), (std::vector<std::int64_t>{1, 2}));
  // Another rank's fault does not fire in a single process (rank 0).
  const fs::path other = dir_->file("fault-other-rank");
  const auto spared = run_script("TESSERA_FAULT='train.step after=1 rank=1' $TESSERA train " + job() + " --out " +
                                 other.string() + " --epochs 1 >/dev/null 2>&1\necho $?\n");
  EXPECT_EQ(spared.out, "0\n");
}

class KilledJob : public DistributedJob, public ::testing::WithParamInterface<Kill> {};

TEST_P(KilledJob, ResumesFromItsLastCheckpoint) {
  const auto [strategy, ranks, resume_ranks] = GetParam();
  const std::string args =
      job() + strategy_settings(strategy) + " --epochs 3 --set train.checkpoint_every=2 --set train.log_every=1";
  const std::string name = strategy + "-" + std::to_string(ranks) + "-to-" + std::to_string(resume_ranks);
  const fs::path out = dir_->file("killed-" + name);
  // Rank 0 is killed (SIGKILL, by the fault-injection hook) right after it published the first rolling checkpoint,
  // at step 2, in the first epoch: a deterministic point, whatever the machine's load. mpirun then ends the job.
  const auto r =
      run_script("TESSERA_FAULT='train.checkpoint-written after=1 rank=0' $MPIEXEC -n " + std::to_string(ranks) +
                 " $TESSERA train " + args + " --out " + out.string() + " >/dev/null 2>&1\necho $?\n");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out, "0\n") << "the job was killed before it finished";
  EXPECT_FALSE(fs::exists(out / "checkpoint-epoch-001.h5")) << "killed in the first epoch";
  const io::Checkpoint killed = io::read_checkpoint((out / "checkpoint.h5").string());
  ASSERT_EQ(killed.meta.step, 2) << "the checkpoint of step 2 (train.checkpoint_every=2)";
  EXPECT_EQ(killed.replicas.size(), keeps_replicas(strategy) ? static_cast<std::size_t>(ranks) : 0u);
  if (strategy == "easgd" && resume_ranks == ranks) {
    // A checkpoint between epochs holds the centre's batch-norm statistics recomputed for its weights, so that
    // `infer`/`predict` on it use them: the same bits as a run ended by train.max_steps at that step validates and
    // saves (the same centre, the same tiles). The live centre's elastic average, from which the resumed run goes on
    // bit for bit (below), is under /easgd/center_buffers, the same in both (train.max_steps ends no epoch).
    const fs::path ended = dir_->file("ended-" + name);
    const auto end_run = run_mpi(ranks, "train " + args + " --out " + ended.string() + " --set train.max_steps=2");
    ASSERT_EQ(end_run.code, 0) << end_run.err;
    const io::Checkpoint end = io::read_checkpoint((ended / "checkpoint.h5").string());
    EXPECT_TRUE(killed.params == end.params) << "the same centre";
    EXPECT_TRUE(killed.buffers == end.buffers) << "with the same statistics, recomputed for its weights";
    ASSERT_EQ(killed.easgd_center_buffers.size(), killed.buffers.size());
    EXPECT_FALSE(killed.buffers == killed.easgd_center_buffers) << "not the live centre's elastic average";
    EXPECT_TRUE(killed.easgd_center_buffers == end.easgd_center_buffers);
  }

  const auto resumed = run_mpi(resume_ranks, "train " + args + " --out " + out.string() + " --resume auto");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "resuming from")) << resumed.err;
  EXPECT_EQ(contains(resumed.err, "was written by a run on " + std::to_string(ranks) + " rank(s), this one has " +
                                      std::to_string(resume_ranks)),
            resume_ranks != ranks)
      << resumed.err;
  const io::Checkpoint last = io::read_checkpoint((out / "checkpoint-epoch-003.h5").string());
  EXPECT_EQ(last.meta.epoch, 3);
  EXPECT_GT(last.meta.step, killed.meta.step);
  EXPECT_EQ(last.replicas.size(), keeps_replicas(strategy) ? static_cast<std::size_t>(resume_ranks) : 0u);
  // Every step logged once, in order, up to the last.
  const auto steps = logged_steps(out);
  ASSERT_FALSE(steps.empty());
  for (std::size_t i = 1; i < steps.size(); ++i) ASSERT_EQ(steps[i], steps[i - 1] + 1) << "line " << i;
  EXPECT_EQ(steps.back(), last.meta.step);
  const auto val = read_jsonl(out / "metrics.jsonl", "val");
  ASSERT_FALSE(val.empty());
  EXPECT_EQ(val.back()["epoch"].get<std::int64_t>(), 3);
  expect_sane_validation(val.back(), tiles_in("val"));

  // On as many ranks, the synchronous strategies end where the uninterrupted job ends, bit for bit (async-easgd's
  // ranks exchange in whatever order they reach the centre: not reproducible by design).
  if (resume_ranks != ranks || strategy == "async-easgd") return;
  const fs::path straight = dir_->file("straight-" + name);
  const auto whole = run_mpi(ranks, "train " + args + " --out " + straight.string());
  ASSERT_EQ(whole.code, 0) << whole.err;
  const io::Checkpoint expected = io::read_checkpoint((straight / "checkpoint-epoch-003.h5").string());
  EXPECT_EQ(last.meta.step, expected.meta.step);
  EXPECT_TRUE(last.params == expected.params) << "the same model, bit for bit";
  EXPECT_TRUE(last.buffers == expected.buffers);
  EXPECT_TRUE(last.optimizer == expected.optimizer) << "the same momentum";
  EXPECT_TRUE(last.easgd_center == expected.easgd_center);
  EXPECT_TRUE(last.easgd_center_buffers == expected.easgd_center_buffers);
  EXPECT_TRUE(last.replicas == expected.replicas) << "the same replicas and momenta";
  EXPECT_TRUE(last.state == expected.state) << "the same data position";
  const auto a = read_jsonl(straight / "metrics.jsonl", "train");
  const auto b = read_jsonl(out / "metrics.jsonl", "train");
  ASSERT_EQ(b.size(), a.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i]["loss"], a[i]["loss"]) << "step " << a[i]["step"];
  EXPECT_EQ(read_jsonl(out / "metrics.jsonl", "val").back(), read_jsonl(straight / "metrics.jsonl", "val").back());
}

// easgd on the same, fewer and more ranks; allreduce and async-easgd on the same.
INSTANTIATE_TEST_SUITE_P(Strategies, KilledJob,
                         ::testing::Values(Kill{"easgd", 2, 2}, Kill{"easgd", 2, 1}, Kill{"easgd", 2, 4},
                                           Kill{"allreduce", 2, 2}, Kill{"async-easgd", 2, 2}),
                         [](const auto& instance) {
                           return test_name(instance.param.strategy) + "_" + std::to_string(instance.param.ranks) +
                                  "_to_" + std::to_string(instance.param.resume_ranks);
                         });

// Three, eight and sixteen ranks on tiles that divide by none. Training: every rank takes the same number of steps
// (an equal part of the shuffled tiles each, the remainder left out of the epoch; at 8 and 16 ranks one batch each).
// Validation, where every tile counts: the parts differ by a tile and, at a batch size that divides the smallest
// part, by a batch (at 8 ranks some ranks score one batch, others two, one of them a single tile; at 16 ranks every
// part, of 2 or 3 tiles, is under a batch). The job must finish (a watchdog ends it otherwise) and score every
// validation tile once. The 16-rank cases are `extended` (tests/app/CMakeLists.txt).
struct Uneven {
  std::string strategy;
  int ranks = 3;
};

void PrintTo(const Uneven& uneven, std::ostream* os) { *os << uneven.strategy << " on " << uneven.ranks << " ranks"; }

class UnequalShares : public DistributedJob, public ::testing::WithParamInterface<Uneven> {};

TEST_P(UnequalShares, RanksFinishAndValidateEveryTileOnce) {
  const auto [strategy, ranks] = GetParam();
  const std::int64_t train_tiles = tiles_in("train");
  const std::int64_t val_tiles = tiles_in("val");
  ASSERT_NE(train_tiles % ranks, 0) << "the fixture's tiles must not divide evenly";
  ASSERT_NE(val_tiles % ranks, 0);
  // Validation part r is [r·n/p, (r+1)·n/p): the smallest has n/p tiles, the largest one more.
  const std::int64_t smallest = val_tiles / ranks;
  std::int64_t batch = 4;
  if (smallest < batch) {
    // Parts under a batch (at 16 ranks 2 or 3 validation tiles): every rank scores one short batch, and trains on
    // one batch of its share per epoch.
    batch = train_tiles / ranks;
  } else {
    while (batch < 16 && smallest % batch != 0) ++batch;
    ASSERT_EQ(smallest % batch, 0) << "no batch size between 4 and 16 divides " << smallest;
  }
  ASSERT_GE(train_tiles / ranks / batch, 1) << "a step per epoch";

  const fs::path out = dir_->file("unequal-" + strategy + "-" + std::to_string(ranks));
  const auto r = run_script("timeout 900 $MPIEXEC -n " + std::to_string(ranks) + " $TESSERA train " + job() +
                            strategy_settings(strategy) + " --out " + out.string() + " --epochs 2" +
                            " --set train.batch_size=" + std::to_string(batch) + " 2>&1\necho \"exit $?\"\n");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(contains(r.out, "exit 0\n")) << "exit 124: the job hung\n" << r.out;
  const io::Checkpoint last = io::read_checkpoint((out / "checkpoint-epoch-002.h5").string());
  EXPECT_EQ(last.meta.step, 2 * (train_tiles / ranks / batch)) << "every rank took as many steps";
  EXPECT_EQ(last.replicas.size(), keeps_replicas(strategy) ? static_cast<std::size_t>(ranks) : 0u);
  const auto val = read_jsonl(out / "metrics.jsonl", "val");
  ASSERT_EQ(val.size(), 2u);
  for (const auto& line : val) expect_sane_validation(line, val_tiles);
}

INSTANTIATE_TEST_SUITE_P(Strategies, UnequalShares,
                         ::testing::Values(Uneven{"allreduce", 3}, Uneven{"easgd", 3}, Uneven{"async-easgd", 3},
                                           Uneven{"two-level", 3}, Uneven{"allreduce", 8}, Uneven{"easgd", 8},
                                           Uneven{"async-easgd", 8}, Uneven{"two-level", 8}, Uneven{"allreduce", 16},
                                           Uneven{"easgd", 16}, Uneven{"async-easgd", 16}, Uneven{"two-level", 16}),
                         [](const auto& instance) {
                           return test_name(instance.param.strategy) + "_" + std::to_string(instance.param.ranks);
                         });

TEST_F(DistributedJob, ARankThatDiesTakesTheJobDownNamingIt) {
  // Rank 1 is killed (SIGKILL, by the fault-injection hook) after its third step; the job must end by itself (no
  // rank left waiting in a collective) with a message naming the rank. A watchdog, for hangs only, kills everything
  // after 600 s and leaves a file saying so.
  const fs::path out = dir_->file("dies");
  const auto r = run_script("setsid env TESSERA_FAULT='train.step after=3 rank=1' $MPIEXEC -n 2 $TESSERA train " +
                            job() + " --out " + out.string() + " --epochs 200 >" + (out.string() + ".log") +
                            " 2>&1 &\n"
                            "job=$!\n"
                            "( sleep 600; touch " +
                            (out.string() + ".hung") +
                            "; kill -9 -$job ) >/dev/null 2>&1 &\n"
                            "watchdog=$!\n"
                            "wait $job\necho $?\n"
                            "kill $watchdog\n");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(out.string() + ".log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int code = std::stoi(r.out);
  EXPECT_NE(code, 0) << log;
  EXPECT_FALSE(fs::exists(out.string() + ".hung")) << "the job hung and the watchdog killed it\n" << log;
  EXPECT_TRUE(contains(log, "rank 1")) << log;
  EXPECT_FALSE(fs::exists(out / "checkpoint-epoch-200.h5"));
}

}  // namespace
}  // namespace tessera
