// `mpirun -n 2 tessera train` with distributed.strategy easgd on small synthetic slides: the checkpoint holds the
// centre (as the model and under /easgd/center), metrics.jsonl splits the step time into computation and
// communication, and a resumed run takes the centre back from the checkpoint.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;
using testing::run_mpi;

std::vector<json> read_jsonl(const fs::path& path, const std::string& kind) {
  std::vector<json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = json::parse(line);
    if (j.value("kind", "") == kind) lines.push_back(std::move(j));
  }
  return lines;
}

TEST(TrainEasgd, TwoRanksSaveTheCentreAndResumeFromIt) {
  testing::TempDir dir;
  // Four small slides, two for training and two for validation, tiled at 32 px.
  auto r =
      run("synth --out " + dir.file("synth") +
          " --slides 4 --size 1024 --seed 3 --set preview.enabled=false --set split.train=0.5 --set split.val=0.5");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ofstream(dir.file("tile.yaml")) << "input:\n  csv: " << dir.file("synth/dataset.csv") << "\n"
                                       << "output: " << dir.file("shards") << "\n"
                                       << "tile:\n  size: 32\n  mpp: 1.0\n"
                                       << "tissue:\n  min_fraction: 0.3\n";
  r = run("tile " + dir.file("tile.yaml"));
  ASSERT_EQ(r.code, 0) << r.err;
  std::ofstream(dir.file("train.yaml")) << "data:\n  shards: " << dir.file("shards")
                                        << "\n  block_size: 16\n  shuffle_buffer: 128\n"
                                        << "model:\n  architecture: tiny_cnn\n"
                                        << "train:\n  batch_size: 8\n  seed: 2\n  threads: 1\n"
                                        << "optimizer:\n  name: sgd\n  lr: 0.05\n  momentum: 0.9\n"
                                        << "schedule:\n  name: constant\n  reference_batch: 0\n"
                                        << "distributed:\n  strategy: easgd\n  tau: 2\n  center_sync_every: 3\n";
  const fs::path out = dir.file("run");
  r = run_mpi(2, "train " + dir.file("train.yaml") + " --out " + out.string() + " --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;

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

  // Resume for a second epoch with α = 0: the replicas train on, but the centre must stay exactly the one the
  // checkpoint holds, and so must everything evaluated and saved from it.
  r = run_mpi(2, "train " + dir.file("train.yaml") + " --out " + out.string() +
                     " --epochs 2 --resume auto --set distributed.beta=0");
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
}

}  // namespace
}  // namespace tessera
