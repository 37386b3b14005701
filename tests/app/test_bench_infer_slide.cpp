// `tessera bench infer-slide` on a tiny slide: it runs `tessera infer` end to end with 1 and 2 ranks and for
// memory on a slide and one four times larger, and the Python pipeline on the same tiles where /usr/bin/python3 has
// torch and openslide (else it says why not), and its report agrees with what those runs wrote (their infer.json
// and outputs). No timing is checked, only that each figure was measured and fits the runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "analysis/heatmap_outputs.h"
#include "io/checkpoint.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::contains;
using testing::run;

constexpr int kSide = 1024;
constexpr int kTile = 32;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// A measured figure: a finite number >= 0 (never required to be large or even positive: that is the machine's).
bool measured(const json& v) { return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0; }

TEST(BenchInferSlide, MeasuresInferEndToEndAndAgreesWithItsRuns) {
  testing::TempDir dir;
  const fs::path work = dir.file("bench");
  const std::string report_file = dir.file("report.json");
  std::string args = "bench infer-slide --size " + std::to_string(kSide) + " --tile " + std::to_string(kTile) +
                     " --mpp 1 --rounds 2 --workdir " + work.string() + " --json " + report_file;
  const auto r = run(args);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const json j = read_json(report_file);

  // The checkpoint says how its tiles are made, as training writes it.
  const auto meta = io::read_checkpoint_meta((work / "checkpoint.h5").string());
  EXPECT_EQ(meta.architecture, "compact");
  EXPECT_EQ(meta.input_size, kTile);
  EXPECT_DOUBLE_EQ(meta.mpp, 1.0);
  EXPECT_TRUE(contains(meta.stain_normalization, "reinhard")) << meta.stain_normalization;
  ASSERT_TRUE(meta.tissue.has_value());
  EXPECT_EQ(*meta.tissue, io::TissueSettings{});

  // The tiles are those infer scored, on one rank and on two (the same map), and the runs wrote every output.
  const json one = read_json(work / "infer-1rank" / "infer.json");
  const json two = read_json(work / "infer-2ranks" / "infer.json");
  const std::int64_t tiles = j["tiles"];
  ASSERT_GT(tiles, 0);
  EXPECT_EQ(one["tiles"], tiles);
  EXPECT_EQ(two["tiles"], tiles);
  EXPECT_EQ(one["ranks"], 1);
  EXPECT_EQ(two["ranks"], 2);
  EXPECT_EQ(j["slide"]["width"], kSide);
  EXPECT_EQ(j["slide"]["height"], kSide);
  // Every output of analysis/heatmap_outputs.h's registry that infer writes by default, and quality control's masks
  // (QC is on by default).
  std::size_t default_outputs = 0;
  for (const auto& writer : analysis::output_writers()) default_outputs += writer.only_when_asked ? 0 : 1;
  ASSERT_EQ(j["outputs"].size(), default_outputs + 1) << j.dump(2);
  EXPECT_NE(std::find(j["outputs"].begin(), j["outputs"].end(), "tumor_001.qc.png"), j["outputs"].end()) << j.dump(2);
  for (const auto& name : j["outputs"]) EXPECT_TRUE(fs::exists(work / "infer-1rank" / name.get<std::string>())) << name;
  EXPECT_EQ(one["slides"][0]["outputs"], j["outputs"]);
  EXPECT_EQ(two["slides"][0]["outputs"], j["outputs"]);

  // Each run: every figure measured, and the rates are the tiles over the times reported.
  ASSERT_EQ(j["runs"].size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    const json& run_figures = j["runs"][k];
    SCOPED_TRACE(run_figures.dump());
    EXPECT_EQ(run_figures["ranks"], k == 0 ? 1 : 2);
    EXPECT_EQ(run_figures["tiles"], tiles);
    EXPECT_GE(run_figures["threads_per_rank"].get<int>(), 1);
    for (const char* key : {"seconds", "tiles_per_s", "cpu_seconds", "tiles_per_cpu_s", "scoring_seconds",
                            "scoring_tiles_per_s", "output_seconds", "startup_seconds", "vs_one_rank"}) {
      EXPECT_TRUE(measured(run_figures[key])) << key;
    }
    const double seconds = run_figures["seconds"];
    EXPECT_NEAR(run_figures["tiles_per_s"].get<double>(), static_cast<double>(tiles) / seconds, 1e-9 * tiles / seconds);
    // The scoring and the outputs happen inside the process's lifetime.
    EXPECT_LE(run_figures["scoring_seconds"].get<double>() + run_figures["output_seconds"].get<double>(), seconds);
  }
  EXPECT_DOUBLE_EQ(j["runs"][0]["vs_one_rank"].get<double>(), 1.0);

  // The Python pipeline scored the same tiles, or the report says why it did not run.
  const json& python = j["python"];
  if (python["available"].get<bool>()) {
    EXPECT_EQ(python["tiles"], tiles);
    for (const char* key : {"seconds", "tiles_per_s", "cpu_seconds", "tessera_one_rank_vs_python"}) {
      EXPECT_TRUE(measured(python[key])) << key;
    }
    for (const char* phase : {"imports", "setup", "read", "model", "write"}) {
      EXPECT_TRUE(measured(python["phases"][phase])) << phase;
    }
    EXPECT_NEAR(python["tessera_one_rank_vs_python"].get<double>(),
                j["runs"][0]["tiles_per_s"].get<double>() / python["tiles_per_s"].get<double>(), 1e-9);
    EXPECT_TRUE(contains(r.out, "Python: OpenSlide + PyTorch")) << r.out;
    EXPECT_TRUE(contains(r.out, "the Python pipeline's tiles/s")) << r.out;
    EXPECT_TRUE(fs::exists(work / "python-grid.npy"));
  } else {
    const std::string reason = python["reason"];
    EXPECT_TRUE(contains(reason, "not measured")) << reason;
    EXPECT_TRUE(contains(r.out, reason)) << r.out;
  }

  // The output phase of the 1-rank run: its seconds, as a fraction of the run and of the scoring, by output.
  const json& phase = j["outputs_phase"];
  const json& one_run = j["runs"][0];
  EXPECT_EQ(phase["seconds"], one_run["output_seconds"]);
  EXPECT_NEAR(phase["of_run"].get<double>(), one_run["output_seconds"].get<double>() / one_run["seconds"].get<double>(),
              1e-12);
  EXPECT_NEAR(phase["of_scoring"].get<double>(),
              one_run["output_seconds"].get<double>() / one_run["scoring_seconds"].get<double>(), 1e-12);
  // The analysis and thumbnail, and each output.
  ASSERT_EQ(phase["by_output"].size(), default_outputs + 2) << phase.dump();
  for (const char* name : {"analysis and thumbnail", "heatmap.tif", "overlay.png", "geojson", "heatmap.h5", "xml",
                           "detections.csv", "report.json", "qc.png"}) {
    EXPECT_TRUE(measured(phase["by_output"][name])) << name;
  }
  EXPECT_TRUE(contains(r.out, "output phase (1 rank): ")) << r.out;
  EXPECT_TRUE(contains(r.out, j["isa"].get<std::string>())) << r.out;

  // Memory: the slide and one with twice its side, one rank each; the larger has more tissue cells.
  const json& memory = j["memory"]["slides"];
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_EQ(memory[0]["side"], kSide);
  EXPECT_EQ(memory[1]["side"], 2 * kSide);
  EXPECT_EQ(memory[0]["tiles"], tiles);
  EXPECT_EQ(read_json(work / ("memory-" + std::to_string(2 * kSide)) / "infer.json")["tiles"], memory[1]["tiles"]);
  EXPECT_GT(memory[1]["tiles"].get<std::int64_t>(), tiles);
  for (const auto& m : memory) EXPECT_TRUE(measured(m["peak_mb"])) << m.dump();
  EXPECT_TRUE(measured(j["memory"]["own_peak_mb"]));

  // The table says the same.
  EXPECT_TRUE(contains(r.out, std::to_string(tiles) + " tiles of the 1024x1024 px slide")) << r.out;
  EXPECT_TRUE(contains(r.out, "1 rank x ")) << r.out;
  EXPECT_TRUE(contains(r.out, "2 ranks x ")) << r.out;
  EXPECT_TRUE(
      contains(r.out, "peak memory, tessera infer 1 rank: 1024x1024 slide (" + std::to_string(tiles) + " tiles)"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "load average")) << r.out;
}

TEST(BenchInferSlide, RejectsBadOptions) {
  EXPECT_EQ(run("bench infer-slide --rounds 0").code, 2);
  EXPECT_EQ(run("bench infer-slide --ranks 1").code, 2);
  EXPECT_EQ(run("bench infer-slide --stain purple").code, 2);
  EXPECT_EQ(run("bench infer-slide --model nonet").code, 2);
}

}  // namespace
}  // namespace tessera
