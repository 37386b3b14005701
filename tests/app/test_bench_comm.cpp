// `tessera bench comm` on a tiny model: every strategy of the registry gets its rows, every figure is measured
// and finite, and the bytes each rank handed to the strategy's collectives are exactly what the strategy must
// send for this model (parameters and batch-norm buffers) over the measured steps. Nothing checks speed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/models/registry.h"
#include "engine/strategy.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::contains;
using testing::run;

constexpr int kSteps = 16;  // a multiple of every tau measured: each exchanges at its own rate
constexpr int kRanks = 2;

bool finite_positive(const json& v) { return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0; }
bool fraction(const json& v) {
  return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0 && v.get<double>() <= 1;
}

// The bytes all ranks together must hand to their collectives over kSteps steps, for a model of P parameter and
// B buffer values (4 bytes each), by each strategy's accounting in engine/strategy*.h; -1 when not known here.
std::int64_t expected_bytes(const json& row, std::int64_t P, std::int64_t B) {
  const std::string strategy = row["strategy"];
  const json& options = row["options"];
  const std::int64_t n = 4 * (P + B);  // parameters and buffers, the centre of the easgd strategies
  const std::int64_t steps = kSteps;
  if (strategy == "allreduce") {
    // Every step: all gradients (fused or in buckets), then rank 0's batch-norm statistics broadcast.
    return kRanks * steps * (4 * P + 4 * B);
  }
  if (strategy == "easgd") {
    // One allreduce of the elastic differences of parameters and buffers every tau steps (the centre's
    // re-broadcast every 100 exchanges does not come in 16 steps).
    const std::int64_t exchanges = steps / options["tau"].get<int>();
    return kRanks * exchanges * n;
  }
  if (strategy == "async-easgd") {
    // Every tau steps each rank gets every shard of the centre and accumulates its differences: 2 n.
    const std::int64_t exchanges = steps / options["tau"].get<int>();
    return kRanks * exchanges * 2 * n;
  }
  if (strategy == "two-level") {
    // Both ranks share memory: one group. Every step each rank hands its gradients to the group; its leader
    // then shares what the group needs after the update.
    const std::int64_t gradients = kRanks * steps * 4 * P;
    if (options["inter"] == "allreduce") return gradients + steps * 4 * B;  // rank 0's buffers
    // easgd: the lone leader's exchange every tau steps (n), then replica and centre to the group (2 n);
    // between exchanges its buffers.
    const std::int64_t exchanges = steps / options["tau"].get<int>();
    return gradients + exchanges * 3 * n + (steps - exchanges) * 4 * B;
  }
  return -1;
}

TEST(BenchComm, EveryStrategyIsMeasuredAndSendsWhatItMust) {
  testing::TempDir dir;
  const std::string report_file = dir.file("comm.json");
  std::string args = "bench comm --ranks 2 --rounds 1 --size 32 --model tiny_cnn --steps ";
  args += std::to_string(kSteps);
  args += " --json ";
  args += report_file;
  const auto r = run(args);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::ifstream in(report_file);
  ASSERT_TRUE(in) << report_file;
  const json j = json::parse(in);

  engine::ModelOptions model_options;
  model_options.architecture = "tiny_cnn";
  model_options.input_size = 32;
  model_options.num_classes = 2;
  const auto model = engine::make_model(model_options);
  const std::int64_t P = model->parameter_count();
  std::int64_t B = 0;
  for (const auto* b : model->buffers()) B += static_cast<std::int64_t>(b->value.size());
  ASSERT_GT(B, 0) << "tiny_cnn has batch norm: its running statistics are part of what is sent";
  EXPECT_EQ(j["parameters"], P);
  EXPECT_EQ(j["buffer_values"], B);
  EXPECT_EQ(j["ranks"], kRanks);
  EXPECT_EQ(j["steps"], kSteps);

  // Bandwidth: 4 KB, 16 KB, ..., 64 MB, with the bus-bandwidth convention applied.
  const auto& bandwidth = j["bandwidth"];
  ASSERT_EQ(bandwidth.size(), 8u) << j.dump(2);
  std::int64_t bytes = 4096;
  for (const auto& row : bandwidth) {
    EXPECT_EQ(row["bytes"], bytes);
    ASSERT_TRUE(finite_positive(row["seconds"])) << row.dump();
    ASSERT_TRUE(finite_positive(row["fastest_seconds"])) << row.dump();
    EXPECT_LE(row["fastest_seconds"].get<double>(), row["seconds"].get<double>());
    const double algbw = static_cast<double>(bytes) / row["seconds"].get<double>() / 1e9;
    EXPECT_NEAR(row["algbw_gbps"].get<double>(), algbw, 1e-9 * algbw);
    EXPECT_NEAR(row["busbw_gbps"].get<double>(), algbw * 2.0 * (kRanks - 1) / kRanks, 1e-9 * algbw);
    std::string size_row = "\n";  // the table's row: "4 KB", ..., "64 MB" at the start of a line
    size_row += bytes >= (1 << 20) ? std::to_string(bytes >> 20) : std::to_string(bytes >> 10);
    size_row += bytes >= (1 << 20) ? " MB " : " KB ";
    EXPECT_TRUE(contains(r.out, size_row)) << size_row << r.out;
    bytes *= 4;
  }
  EXPECT_TRUE(contains(r.out, "NCCL convention")) << r.out;

  // The references: one rank with every core, and the job's ranks training side by side without a strategy.
  const auto& reference = j["reference"];
  ASSERT_TRUE(finite_positive(reference["images_per_s"])) << j.dump(2);
  EXPECT_EQ(reference["threads"], j["cores"]);
  const double reference_rate = reference["images_per_s"].get<double>();
  const auto& independent = j["no_exchange"];
  ASSERT_TRUE(finite_positive(independent["images_per_s"])) << j.dump(2);
  EXPECT_EQ(independent["threads"], j["threads_per_rank"]);
  EXPECT_EQ(j["threads_per_rank"], std::max(1, j["cores"].get<int>() / kRanks));
  const double independent_rate = independent["images_per_s"].get<double>();

  // Every strategy's rows: the variants named for the known ones, one row with defaults for any other.
  std::set<std::string> seen;
  for (const auto& row : j["strategies"]) {
    const std::string label = row["label"];
    SCOPED_TRACE(label);
    ASSERT_FALSE(row.contains("failure")) << row.dump(2);
    seen.insert(row["strategy"].get<std::string>() + " " + row["options"].dump());
    EXPECT_TRUE(contains(r.out, label)) << r.out;
    ASSERT_TRUE(finite_positive(row["images_per_s"])) << row.dump();
    ASSERT_TRUE(finite_positive(row["step_s"])) << row.dump();
    EXPECT_NEAR(row["vs_one_rank"].get<double>(), row["images_per_s"].get<double>() / reference_rate,
                1e-9 * row["images_per_s"].get<double>());
    EXPECT_NEAR(row["vs_no_exchange"].get<double>(), row["images_per_s"].get<double>() / independent_rate,
                1e-9 * row["images_per_s"].get<double>());
    EXPECT_TRUE(fraction(row["comm_fraction"])) << row.dump();
    EXPECT_TRUE(fraction(row["wait_fraction"])) << row.dump();
    EXPECT_LE(row["comm_fraction"].get<double>() + row["wait_fraction"].get<double>(), 1.0);
    ASSERT_EQ(row["per_rank"].size(), static_cast<std::size_t>(kRanks));
    std::int64_t total = 0;
    for (const auto& rank : row["per_rank"]) {
      ASSERT_TRUE(finite_positive(rank["seconds"])) << rank.dump();
      EXPECT_TRUE(std::isfinite(rank["loss"].get<double>())) << rank.dump();
      total += rank["bytes"].get<std::int64_t>();
    }
    EXPECT_DOUBLE_EQ(row["bytes_per_step"].get<double>(), static_cast<double>(total) / kRanks / kSteps);
    const std::int64_t expected = expected_bytes(row, P, B);
    if (expected >= 0) {
      EXPECT_EQ(total, expected) << row.dump(2);
    }
    if (row["strategy"] == "allreduce" && row["options"]["bucket_mb"].get<double>() > 0) {
      EXPECT_GE(row["buckets"].get<int>(), 1);
      EXPECT_LE(row["buckets_overlapped"].get<int>(), row["buckets"].get<int>());
    }
  }
  for (const auto& entry : engine::strategy_registry()) {
    const std::string name = entry.name;
    std::vector<std::string> wanted;
    if (name == "allreduce") {
      wanted = {R"({"bucket_mb":0.0})", R"({"bucket_mb":25.0})", R"({"bucket_mb":25.0,"progress":"boundaries"})"};
    } else if (name == "easgd" || name == "async-easgd") {
      for (int tau : {1, 4, 8, 16}) {
        std::string options = R"({"tau":)";
        options += std::to_string(tau);
        options += "}";
        wanted.push_back(options);
      }
    } else if (name == "two-level") {
      wanted = {R"({"inter":"allreduce"})", R"({"inter":"easgd","tau":8})"};
    } else {
      wanted = {"{}"};
    }
    for (const auto& options : wanted) {
      std::string key = name;
      key += " ";
      key += options;
      EXPECT_TRUE(seen.contains(key)) << key;
    }
  }

  // Overlap: both bucketed rows (a communication thread, progress between modules) give rank 0's last step, every
  // bucket complete before it is reduced, and the time against the fused allreduce's row.
  ASSERT_EQ(j["overlap"].size(), 2u) << j.dump(2);
  for (const auto& entry : j["overlap"]) {
    SCOPED_TRACE(entry.dump());
    const auto& timeline = entry["timeline"];
    ASSERT_GE(timeline["buckets"].size(), 1u);
    for (const auto& bucket : timeline["buckets"]) {
      EXPECT_GT(bucket["bytes"].get<std::int64_t>(), 0);
      EXPECT_LE(bucket["ready_s"].get<double>(), bucket["reduced_s"].get<double>());
    }
    EXPECT_TRUE(entry["step_s_saved_vs_fused"].is_number());
    EXPECT_TRUE(contains(r.out, entry["label"].get<std::string>() + " (rank 0, last step")) << r.out;
  }
}

TEST(BenchComm, RejectsBadOptions) {
  EXPECT_EQ(run("bench comm --ranks 1").code, 2);
  EXPECT_EQ(run("bench comm --steps 0").code, 2);
  EXPECT_EQ(run("bench comm --model nonet").code, 2);
}

}  // namespace
}  // namespace tessera
