// Stop requests end to end (core/signals.h): `train`, `tile` and `infer` signalled with SIGUSR1 or SIGTERM at a
// fault-injection point (core/fault.h do=usr1|term, raised in the process itself: never a timer) exit with code 75,
// having recorded the work done, and a rerun ends exactly as the uninterrupted job: train checkpoints at the step
// boundary every rank agreed on (one, two or four ranks, the signal on one rank only) and `--resume auto` ends bit for
// bit where the uninterrupted run ends (allreduce, easgd, two-level); tile keeps the shards finished (SIGUSR1: the one
// in hand too; SIGTERM: not the one in hand) and the rerun extracts only the rest; infer finishes the slide in hand on
// SIGUSR1, leaves it on SIGTERM, and the rerun does only what is left.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/heatmap.h"
#include "io/shard.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;
using testing::run_mpi;
using testing::run_script;

constexpr int kInterrupted = 75;  // core::exit_interrupted

// Four small slides (two train, two validate) tiled at 32 px, a tiny CNN job on them and a checkpoint of it for
// infer; made once for the suite.
class Signals : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r =
        run("synth --out " + dir_->file("synth") +
            " --slides 4 --size 1024 --seed 3 --set preview.enabled=false --set split.train=0.5 --set split.val=0.5");
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("tile " + tile_job("shards"));
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("train.yaml"))
        << "data:\n  shards: " << dir_->file("shards") << "\n  block_size: 16\n  shuffle_buffer: 128\n"
        << "model:\n  architecture: tiny_cnn\n"
        << "train:\n  batch_size: 8\n  seed: 2\n  threads: 1\n  log_every: 1\n"
        << "optimizer:\n  name: sgd\n  lr: 0.05\n  momentum: 0.9\n"
        << "schedule:\n  name: constant\n  reference_batch: 0\n"
        << "distributed:\n  strategy: easgd\n  tau: 2\n";
    r = run("train " + dir_->file("train.yaml") + " --out " + dir_->file("model") + " --epochs 1");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  // A tile job over the four slides into `name` (95 tiles), `per_shard` tiles per shard.
  static std::string tile_job(const std::string& name, int per_shard = 60) {
    const std::string path = dir_->file(name + ".yaml");
    std::ofstream(path) << "input:\n  csv: " << dir_->file("synth/dataset.csv") << "\n"
                        << "output: " << dir_->file(name) << "\n"
                        << "tile:\n  size: 32\n  mpp: 1.0\n"
                        << "tissue:\n  min_fraction: 0.3\n"
                        << "shards:\n  tiles_per_shard: " << per_shard << "\n";
    return path;
  }
  static std::string train_job() { return dir_->file("train.yaml"); }
  static std::string slides() {
    std::string list;
    for (const auto& entry : fs::directory_iterator(dir_->file("synth/slides"))) {
      const auto ext = entry.path().extension();
      if (ext != ".svs" && ext != ".tif") continue;
      if (!list.empty()) list += ',';
      list += entry.path().string();
    }
    return list;
  }
  static std::string infer_args(const std::string& out) {
    return "infer --checkpoint " + dir_->file("model/checkpoint.h5") + " --slides " + slides() + " --out " +
           dir_->file(out) + " --set outputs=[heatmap.h5,detections.csv] --batch 16";
  }
  static testing::TempDir* dir_;
};
testing::TempDir* Signals::dir_ = nullptr;

// `command` under TESSERA_FAULT=`fault`, on `ranks` ranks; "exit N" ends the output (stdout and stderr together).
testing::Run faulted(const std::string& fault, int ranks, const std::string& command) {
  const std::string launch = ranks == 1 ? "$TESSERA " : "$MPIEXEC -n " + std::to_string(ranks) + " $TESSERA ";
  return run_script("TESSERA_FAULT='" + fault + "' " + launch + command + " 2>&1\necho \"exit $?\"\n");
}

int occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

bool exited(const testing::Run& r, int code) { return contains(r.out, "exit " + std::to_string(code) + "\n"); }

// The strategy's settings on the command line (the job names easgd).
std::string strategy_settings(const std::string& strategy) {
  std::string settings = " --set distributed.strategy=" + strategy;
  if (strategy == "allreduce") settings += " --set distributed.bucket_mb=0.0001";
  // Two node groups of two ranks on one host, whose leaders exchange by EASGD; batch 2, so that 4 ranks take 6 steps an
  // epoch.
  if (strategy == "two-level") {
    settings += " --set distributed.inter=easgd --set distributed.ranks_per_node=2 --set train.batch_size=2";
  }
  return settings;
}

struct Stop {
  std::string strategy;
  int ranks = 1;
  std::string fault;  // where and what is raised
};

void PrintTo(const Stop& stop, std::ostream* os) {
  *os << stop.strategy << " on " << stop.ranks << " rank(s), " << stop.fault;
}

class TrainStop : public Signals, public ::testing::WithParamInterface<Stop> {};

// The run is signalled after step 3 of 2 epochs (mid-epoch; under easgd between two exchanges): it stops there on every
// rank, checkpoints step 3, exits 75; `--resume auto` ends bit for bit where the uninterrupted run ends.
TEST_P(TrainStop, CheckpointsAtTheNextStepAndResumesBitForBit) {
  const auto& [strategy, ranks, fault] = GetParam();
  const std::string name = strategy + "-" + std::to_string(ranks) + "-" + fault.substr(fault.size() - 4);
  const std::string args = train_job() + strategy_settings(strategy) + " --epochs 2";
  const fs::path stopped = dir_->file("stopped-" + name);
  const auto r = faulted(fault, ranks, "train " + args + " --out " + stopped.string());
  ASSERT_TRUE(exited(r, kInterrupted)) << r.out;
  EXPECT_TRUE(contains(r.out, "stopped at step 3")) << r.out;
  EXPECT_FALSE(fs::exists(stopped / "checkpoint-epoch-001.h5")) << "stopped in the first epoch";
  const io::Checkpoint at = io::read_checkpoint((stopped / "checkpoint.h5").string());
  EXPECT_EQ(at.meta.step, 3) << "every rank stopped after the step the signal came in";
  EXPECT_EQ(at.meta.epoch, 0);
  // Every rank's replica, apart from the centre (under easgd on one rank too: its centre is not its replica).
  EXPECT_EQ(at.replicas.size(), strategy == "allreduce" ? 0u : static_cast<std::size_t>(ranks));
  if (strategy == "easgd") {
    // SIGUSR1: /buffers are the centre's statistics recomputed for its weights; SIGTERM (SIGKILL follows within
    // KillWait): the live centre's, as its strategy state keeps them, without the forward passes.
    if (contains(fault, "do=term")) {
      EXPECT_TRUE(at.buffers == at.easgd_center_buffers);
    } else {
      EXPECT_FALSE(at.buffers == at.easgd_center_buffers);
    }
  }

  const auto resumed = ranks == 1 ? run("train " + args + " --out " + stopped.string() + " --resume auto")
                                  : run_mpi(ranks, "train " + args + " --out " + stopped.string() + " --resume auto");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "resuming from")) << resumed.err;

  const fs::path straight = dir_->file("straight-" + name);
  const auto whole = ranks == 1 ? run("train " + args + " --out " + straight.string())
                                : run_mpi(ranks, "train " + args + " --out " + straight.string());
  ASSERT_EQ(whole.code, 0) << whole.err;
  const io::Checkpoint a = io::read_checkpoint((straight / "checkpoint.h5").string());
  const io::Checkpoint b = io::read_checkpoint((stopped / "checkpoint.h5").string());
  EXPECT_EQ(b.meta.step, a.meta.step);
  EXPECT_TRUE(b.params == a.params) << "the same model, bit for bit";
  EXPECT_TRUE(b.buffers == a.buffers);
  EXPECT_TRUE(b.optimizer == a.optimizer);
  EXPECT_TRUE(b.easgd_center == a.easgd_center);
  EXPECT_TRUE(b.easgd_center_buffers == a.easgd_center_buffers);
  EXPECT_TRUE(b.replicas == a.replicas);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, TrainStop,
    // One rank: easgd, whose centre is not its replica (allreduce on one rank is plain SGD: test_train.cpp).
    ::testing::Values(Stop{"easgd", 1, "train.step after=3 do=usr1"},
                      // The signal reaches one rank only: the ranks agree, and both stop at the same step.
                      Stop{"easgd", 2, "train.step after=3 rank=1 do=term"},
                      Stop{"allreduce", 2, "train.step after=3 rank=0 do=term"},
                      // The signal reaches a rank of the second node group that is not its leader.
                      Stop{"two-level", 4, "train.step after=3 rank=3 do=usr1"}),
    [](const auto& instance) {
      std::string strategy = instance.param.strategy;
      std::replace(strategy.begin(), strategy.end(), '-', '_');
      return strategy + "_" + std::to_string(instance.param.ranks) + "_ranks_" +
             (contains(instance.param.fault, "usr1") ? "usr1" : "term");
    });

// A signal at the last step asks nothing: the run ends as it would have (validation, checkpoint), exit 0.
TEST_F(Signals, TrainSignalledAtItsLastStepJustEnds) {
  const fs::path out = dir_->file("last-step");
  const auto r = faulted("train.step after=2 do=usr1", 1,
                         "train " + train_job() + " --epochs 5 --set train.max_steps=2 --out " + out.string());
  EXPECT_TRUE(exited(r, 0)) << r.out;
  EXPECT_TRUE(contains(r.out, "fault injected at train.step")) << r.out;
  EXPECT_FALSE(contains(r.out, "stopped at step")) << r.out;
  EXPECT_EQ(io::read_checkpoint((out / "checkpoint.h5").string()).meta.step, 2);
}

std::vector<std::string> shard_files(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const auto name = entry.path().filename().string();
    if (name.starts_with("shard-") && name.ends_with(".h5")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// SIGUSR1 after the second shard: both are finished and recorded, nothing else is begun, no manifest; the rerun keeps
// them and extracts the rest into the same tiles as an uninterrupted job.
TEST_F(Signals, TileFinishesTheShardInHandOnUsr1AndTheRerunDoesTheRest) {
  const auto whole = run("tile " + tile_job("tiles-whole", 20));
  ASSERT_EQ(whole.code, 0) << whole.err;
  ASSERT_GE(shard_files(dir_->file("tiles-whole")).size(), 4u) << "enough shards to stop in the middle";

  const std::string job = tile_job("tiles-usr1", 20);
  const auto r = faulted("tile.shard-finished after=2 do=usr1", 1, "tile " + job);
  ASSERT_TRUE(exited(r, kInterrupted)) << r.out;
  EXPECT_TRUE(contains(r.out, "SIGUSR1: stopped with 2 shard(s) finished and recorded")) << r.out;
  EXPECT_FALSE(fs::exists(dir_->file("tiles-usr1/manifest.json")));
  const auto rerun = run("tile " + job);
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_TRUE(contains(rerun.err, "shard-00000.h5: kept from an earlier run")) << rerun.err;
  EXPECT_TRUE(contains(rerun.err, "shard-00001.h5: kept from an earlier run")) << rerun.err;
  EXPECT_FALSE(contains(rerun.err, "shard-00002.h5: kept")) << rerun.err;
  EXPECT_TRUE(testing::shard_tiles(dir_->file("tiles-usr1")) == testing::shard_tiles(dir_->file("tiles-whole")));
}

// SIGTERM in the middle of the second shard: the job stops at the next tile, that shard is not kept; the rerun
// extracts it again. On two ranks with the signal on rank 1 only, the job ends as a failing rank ends it, exit 75.
TEST_F(Signals, TileStopsAtTheNextTileOnTermAndTheRerunRedoesTheShard) {
  const auto expected = testing::shard_tiles(dir_->file("shards"));  // the same job (tiles_per_shard aside)
  const std::string job = tile_job("tiles-term");
  const auto r = faulted("tile.tile after=90 do=term", 1, "tile " + job);  // tile 30 of the second shard
  ASSERT_TRUE(exited(r, kInterrupted)) << r.out;
  EXPECT_TRUE(contains(r.out, "interrupted: SIGTERM received: stopped; shard-00001.h5.unchecked is left to the rerun"))
      << r.out;
  const auto rerun = run("tile " + job);
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_TRUE(contains(rerun.err, "shard-00000.h5: kept from an earlier run")) << rerun.err;
  EXPECT_FALSE(contains(rerun.err, "shard-00001.h5: kept")) << rerun.err;
  EXPECT_TRUE(testing::shard_tiles(dir_->file("tiles-term")) == expected);

  // Two ranks, SIGTERM on rank 1 only, in its second shard (20 tiles a shard: its first is finished and recorded):
  // the job ends as a failing rank ends it (core::abort_job, which also ends rank 0 wherever it is), exit 75. Nothing
  // is under a final name (no manifest, no shard-N.h5: shards are put in place only once every rank has extracted
  // its own), and the rerun keeps exactly the shards recorded, whichever rank finished them, and extracts the rest.
  const std::string two = tile_job("tiles-term-2", 20);
  const fs::path out2 = dir_->file("tiles-term-2");
  const auto r2 = faulted("tile.tile after=30 rank=1 do=term", 2, "tile " + two);
  ASSERT_TRUE(exited(r2, kInterrupted)) << r2.out;
  EXPECT_TRUE(contains(r2.out, "rank 1: interrupted: SIGTERM")) << r2.out;
  EXPECT_FALSE(fs::exists(out2 / "manifest.json"));
  EXPECT_TRUE(shard_files(out2).empty()) << "a shard under its final name before every rank finished";
  std::vector<std::string> recorded;  // "shard-00003.h5" for each record "shard-00003.h5.json"
  for (const auto& entry : fs::directory_iterator(out2 / ".tessera-tile-shards")) {
    const auto name = entry.path().filename().string();
    if (name.starts_with("shard-") && name.ends_with(".h5.json")) recorded.push_back(name.substr(0, name.size() - 5));
  }
  EXPECT_GE(recorded.size(), 1u) << "rank 1's first shard is recorded";
  const auto rerun2 = run_mpi(2, "tile " + two);
  ASSERT_EQ(rerun2.code, 0) << rerun2.err;
  EXPECT_EQ(occurrences(rerun2.err, ": kept from an earlier run"), static_cast<int>(recorded.size())) << rerun2.err;
  for (const auto& name : recorded) EXPECT_TRUE(contains(rerun2.err, name + ": kept from an earlier run")) << name;
  EXPECT_GT(shard_files(out2).size(), recorded.size()) << "the rerun extracted the shards left";
  EXPECT_TRUE(testing::shard_tiles(out2) == expected);
}

bool same_map(const fs::path& a, const fs::path& b) {
  const io::Heatmap x = io::read_heatmap(a.string());
  const io::Heatmap y = io::read_heatmap(b.string());
  return x.rows == y.rows && x.cols == y.cols && x.prob.size() == y.prob.size() &&
         std::memcmp(x.prob.data(), y.prob.data(), x.prob.size() * sizeof(float)) == 0;
}

std::vector<std::string> slide_ids(const fs::path& infer_json) {
  std::ifstream in(infer_json);
  const json summary = json::parse(in);
  std::vector<std::string> ids;
  for (const auto& s : summary["slides"]) ids.push_back(s["id"]);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// SIGUSR1 while the second slide is scored (on rank 1 of two, each slide's tiles split over both): its outputs and
// record are finished, the job stops before the third; the rerun skips the two and ends with the uninterrupted job's
// maps. SIGTERM in the middle of a slide: that slide is left to the rerun.
TEST_F(Signals, InferFinishesTheSlideInHandOnUsr1AndLeavesItOnTerm) {
  const auto whole = run(infer_args("infer-whole"));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const auto ids = slide_ids(dir_->file("infer-whole/infer.json"));
  ASSERT_EQ(ids.size(), 4u) << whole.err;

  const auto r =
      faulted("infer.slide-scored after=2 rank=1 do=usr1", 2, infer_args("infer-usr1") + " --distribute tiles");
  ASSERT_TRUE(exited(r, kInterrupted)) << r.out;
  EXPECT_TRUE(contains(r.out, "SIGUSR1: stopped before slide 3/4")) << r.out;
  EXPECT_FALSE(fs::exists(dir_->file("infer-usr1/infer.json"))) << "the job's summary is the rerun's";
  const auto rerun = run_mpi(2, infer_args("infer-usr1") + " --distribute tiles");
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_EQ(occurrences(rerun.err, ": up to date"), 2) << rerun.err;
  EXPECT_EQ(slide_ids(dir_->file("infer-usr1/infer.json")), ids);
  for (const auto& id : ids) {
    EXPECT_TRUE(
        same_map(dir_->file("infer-whole/" + id + ".heatmap.h5"), dir_->file("infer-usr1/" + id + ".heatmap.h5")))
        << id;
  }

  // SIGTERM after the first batch of the first slide: nothing is finished.
  const auto t = faulted("infer.batch after=1 do=term", 1, infer_args("infer-term"));
  ASSERT_TRUE(exited(t, kInterrupted)) << t.out;
  EXPECT_TRUE(contains(t.out, "is left to the rerun")) << t.out;
  const auto rerun_term = run(infer_args("infer-term"));
  ASSERT_EQ(rerun_term.code, 0) << rerun_term.err;
  EXPECT_FALSE(contains(rerun_term.err, ": up to date")) << rerun_term.err;
  for (const auto& id : ids) {
    EXPECT_TRUE(
        same_map(dir_->file("infer-whole/" + id + ".heatmap.h5"), dir_->file("infer-term/" + id + ".heatmap.h5")))
        << id;
  }
}

// Split tiles (infer.distribute tiles): SIGTERM on one rank of two in the middle of the first slide: that rank stops
// at its next batch and ends the job as a failing rank does (core::abort_job, rank 0 wherever it is), exit 75. Nothing
// is left under a final name (no map, no detections, no infer.json: rank 0 writes a slide's outputs only once every
// rank's scores are in), and the rerun removes what was left unfinished and ends with the uninterrupted job's maps.
TEST_F(Signals, InferTermOnOneRankLeavesNothingHalfWritten) {
  const auto whole = run(infer_args("infer-whole-term2"));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const fs::path out = dir_->file("infer-term-2");
  const auto r = faulted("infer.batch after=1 rank=1 do=term", 2, infer_args("infer-term-2") + " --distribute tiles");
  ASSERT_TRUE(exited(r, kInterrupted)) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1: interrupted: SIGTERM")) << r.out;
  EXPECT_FALSE(fs::exists(out / "infer.json"));
  for (const auto& entry : fs::directory_iterator(out)) {
    const auto name = entry.path().filename().string();
    EXPECT_FALSE(name.ends_with(".heatmap.h5") || name.ends_with(".detections.csv")) << name << " under a final name";
  }
  const auto rerun = run_mpi(2, infer_args("infer-term-2") + " --distribute tiles");
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_FALSE(contains(rerun.err, ": up to date")) << rerun.err;
  const auto ids = slide_ids(dir_->file("infer-whole-term2/infer.json"));
  EXPECT_EQ(slide_ids(out / "infer.json"), ids);
  for (const auto& entry : fs::directory_iterator(out)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
  for (const auto& id : ids) {
    EXPECT_TRUE(same_map(dir_->file("infer-whole-term2/" + id + ".heatmap.h5"), out / (id + ".heatmap.h5"))) << id;
  }
}

// Whole slides to the ranks: SIGUSR1 on each rank once it has scored its first slide. Each finishes that slide (its
// outputs and record), takes no other, and the job stops with slides left (at most one per rank is done of four),
// whichever rank took which; the rerun skips exactly the slides recorded and ends with the uninterrupted job's maps.
TEST_F(Signals, InferOnWholeSlidesFinishesTheSlideEachRankHoldsOnUsr1) {
  const auto whole = run(infer_args("infer-whole-slides"));
  ASSERT_EQ(whole.code, 0) << whole.err;
  const auto ids = slide_ids(dir_->file("infer-whole-slides/infer.json"));
  ASSERT_EQ(ids.size(), 4u) << whole.err;

  const std::string args = infer_args("infer-slides-usr1") + " --distribute slides";
  const auto r = faulted("infer.slide-scored after=1 do=usr1", 2, args);
  ASSERT_TRUE(exited(r, kInterrupted)) << r.out;
  EXPECT_TRUE(contains(r.out, "SIGUSR1: stopped before slide")) << r.out;
  EXPECT_FALSE(fs::exists(dir_->file("infer-slides-usr1/infer.json"))) << "the job's summary is the rerun's";
  int recorded = 0;
  for (const auto& entry : fs::directory_iterator(dir_->file("infer-slides-usr1/.tessera-infer"))) {
    if (entry.path().extension() != ".json") continue;
    ++recorded;
    const std::string id = entry.path().stem().string();
    EXPECT_TRUE(fs::exists(dir_->file("infer-slides-usr1/" + id + ".heatmap.h5"))) << id;
  }
  EXPECT_GE(recorded, 1);
  EXPECT_LE(recorded, 2) << "each of the two ranks stops after its first slide";

  const auto rerun = run_mpi(2, infer_args("infer-slides-usr1") + " --distribute slides");
  ASSERT_EQ(rerun.code, 0) << rerun.err;
  EXPECT_EQ(occurrences(rerun.err, ": up to date"), recorded) << rerun.err;
  EXPECT_EQ(slide_ids(dir_->file("infer-slides-usr1/infer.json")), ids);
  for (const auto& id : ids) {
    EXPECT_TRUE(same_map(dir_->file("infer-whole-slides/" + id + ".heatmap.h5"),
                         dir_->file("infer-slides-usr1/" + id + ".heatmap.h5")))
        << id;
  }
}

// Under Slurm (its variables in the environment) the job is traced: metrics.jsonl's "slurm" line, the checkpoint's
// /meta, infer.json's "slurm"; outside Slurm none of them.
TEST_F(Signals, TheSlurmJobIsRecordedWhereTheResultsAre) {
  const std::string slurm =
      "SLURM_JOB_ID=4242 SLURM_ARRAY_JOB_ID=4240 SLURM_ARRAY_TASK_ID=2 SLURM_JOB_NODELIST='t[1-2]' SLURM_NTASKS=4 "
      "SLURM_RESTART_COUNT=1 ";
  const fs::path out = dir_->file("traced");
  auto r = run_script(slurm + "$TESSERA train " + train_job() + " --epochs 1 --out " + out.string() + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "Slurm job 4242 (array 4240 task 2), 4 task(s) on t[1-2], requeued 1 time(s)")) << r.out;
  const auto lines = testing::read_jsonl(out / "metrics.jsonl", "slurm");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["job_id"], "4242");
  EXPECT_EQ(lines[0]["array_task_id"], "2");
  EXPECT_EQ(lines[0]["nodelist"], "t[1-2]");
  EXPECT_EQ(lines[0]["ntasks"], 4);
  EXPECT_EQ(lines[0]["restarts"], 1);
  const io::Checkpoint checkpoint = io::read_checkpoint((out / "checkpoint.h5").string());
  ASSERT_TRUE(checkpoint.meta.slurm.has_value());
  EXPECT_EQ(checkpoint.meta.slurm->job_id, "4242");
  EXPECT_EQ(checkpoint.meta.slurm->array_job_id, "4240");
  EXPECT_EQ(checkpoint.meta.slurm->nodelist, "t[1-2]");
  EXPECT_EQ(checkpoint.meta.slurm->ntasks, 4);

  r = run_script(slurm + "$TESSERA " + infer_args("traced-infer") + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(dir_->file("traced-infer/infer.json"));
  const json summary = json::parse(in);
  EXPECT_EQ(summary["slurm"]["job_id"], "4242");
  EXPECT_EQ(summary["slurm"]["array_job_id"], "4240");
  EXPECT_EQ(summary["slurm"]["array_task_id"], "2");
  EXPECT_EQ(summary["slurm"]["ntasks"], 4);

  // Outside Slurm: nothing claimed.
  EXPECT_FALSE(io::read_checkpoint(dir_->file("model/checkpoint.h5")).meta.slurm.has_value());
  EXPECT_TRUE(testing::read_jsonl(dir_->file("model/metrics.jsonl"), "slurm").empty());
}

// do=wait holds the process at the point until a signal comes, however long that takes (a batch system's warning in the
// Slurm tests), and the verb then stops as the signal asks: here the test sends SIGUSR1 once the process says it waits.
TEST_F(Signals, TheWaitActionHoldsTheProcessUntilASignal) {
  const fs::path out = dir_->file("waited");
  const std::string log = dir_->file("waited.log");
  const auto r = run_script("TESSERA_FAULT='train.step after=2 do=wait' $TESSERA train " + train_job() +
                            " --epochs 2 --out " + out.string() + " >" + log + " 2>&1 &\n" +
                            "pid=$!\n"
                            "until grep -q 'waits for SIGUSR1 or SIGTERM' " +
                            log +
                            "; do kill -0 $pid 2>/dev/null || break; sleep 0.1; done\n"
                            "kill -USR1 $pid\n"
                            "wait $pid\n"
                            "echo \"exit $?\"\n"
                            "cat " +
                            log + "\n");
  ASSERT_TRUE(exited(r, kInterrupted)) << r.out;
  EXPECT_TRUE(contains(r.out, "fault injected at train.step: process ")) << r.out;
  EXPECT_TRUE(contains(r.out, "SIGUSR1: stopped at step 2")) << r.out;
  EXPECT_EQ(io::read_checkpoint((out / "checkpoint.h5").string()).meta.step, 2);
}

// A malformed action is refused naming the known ones.
TEST_F(Signals, TheFaultActionsIncludeTheSignals) {
  const auto r = run_script(
      "TESSERA_FAULT='train.step do=hup' $TESSERA train --help >/dev/null 2>&1; echo $?\n"
      "TESSERA_FAULT='train.step do=hup' $TESSERA train --help 2>&1 >/dev/null | head -1\n");
  EXPECT_TRUE(contains(r.out, "2\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "do=kill|stop|wait|usr1|term|enospc|eio")) << r.out;
}

}  // namespace
}  // namespace tessera
