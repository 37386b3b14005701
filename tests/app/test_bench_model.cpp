// `tessera bench train` / `tessera bench infer` on small models: the report's fields and their relations, the
// per-layer profile, the PyTorch comparison when torch is installed. Nothing here depends on how fast it runs.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/models/registry.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::contains;
using testing::run;

constexpr int kSize = 32;

std::unique_ptr<engine::Model> model(const std::string& architecture) {
  engine::ModelOptions options;
  options.architecture = architecture;
  options.input_size = kSize;
  options.num_classes = 2;  // the bench's tile classifier
  return engine::make_model(options);
}

std::vector<std::string> layer_names(const std::string& architecture) {
  std::vector<std::string> names;
  for (const auto& row : model(architecture)->layers(kSize)) names.push_back(row.name);
  return names;
}

json bench_json(const std::string& verb, const std::string& architecture, const std::string& extra = "") {
  std::string args = "bench ";
  args += verb;
  args += " --model ";
  args += architecture;
  args += " --size 32 --batch 4 --seconds 0.2 --json ";
  args += extra;
  const auto r = run(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return json::parse(r.out);
}

// Figures of the report: present, finite and >= 0 (never required to be large or even positive: a measured figure
// is the machine's business; counts and model sizes are checked against their own definitions elsewhere).
void expect_figures(const json& j, const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    ASSERT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
    ASSERT_TRUE(j[key].is_number()) << key;
    EXPECT_TRUE(std::isfinite(j[key].get<double>()) && j[key].get<double>() >= 0.0) << key << ": " << j[key];
  }
}

TEST(BenchModel, TrainReportsPositiveFiguresWithTheTrainingFlopConvention) {
  const json j = bench_json("train", "tiny_cnn", "--no-torch");
  EXPECT_EQ(j["bench"], "train");
  EXPECT_EQ(j["model"], "tiny_cnn");
  EXPECT_EQ(j["size"], kSize);
  EXPECT_EQ(j["batch"], 4);
  expect_figures(j, {"threads", "forward_gflop_per_image", "gflop_per_image"});
  expect_figures(j["peak"], {"gflops"});
  expect_figures(j["tessera"], {"images_per_s", "gflops", "fraction_of_peak"});
  EXPECT_EQ(j["tessera"]["rounds_images_per_s"].size(), 4u);  // the default rounds

  const auto m = model("tiny_cnn");
  EXPECT_EQ(j["parameters"].get<std::int64_t>(), m->parameter_count());
  EXPECT_DOUBLE_EQ(j["forward_gflop_per_image"].get<double>(), static_cast<double>(m->flops(kSize)) * 1e-9);
  EXPECT_DOUBLE_EQ(j["gflop_per_image"].get<double>(), 3.0 * j["forward_gflop_per_image"].get<double>());
  EXPECT_NEAR(j["tessera"]["gflops"].get<double>(),
              j["tessera"]["images_per_s"].get<double>() * j["gflop_per_image"].get<double>(), 1e-9);
  EXPECT_TRUE(contains(j["flop_convention"].get<std::string>(), "3x"));

  EXPECT_FALSE(j["pytorch"]["available"].get<bool>());
  EXPECT_TRUE(contains(j["pytorch"]["reason"].get<std::string>(), "--no-torch"));
  EXPECT_TRUE(j["ratio"].is_null());
  EXPECT_FALSE(j.contains("profile"));
}

TEST(BenchModel, ProfileListsEveryLayerOfTheModelInOrder) {
  // A plain body, residual blocks in Sequentials, a nested Sequential in a folded model.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train", "tiny_cnn"}, {"train", "resnet18"}, {"infer", "compact"}};
  for (const auto& [verb, architecture] : cases) {
    SCOPED_TRACE(verb + ' ' + architecture);
    const json j = bench_json(verb, architecture, "--no-torch --profile");
    ASSERT_TRUE(j.contains("profile"));
    const json& p = j["profile"];
    expect_figures(p, {"steps", "step_ms"});
    std::vector<std::string> names;
    for (const auto& row : p["layers"]) {
      names.push_back(row["layer"].get<std::string>());
      EXPECT_GE(row["forward_ms"].get<double>(), 0.0);
      EXPECT_GE(row["percent"].get<double>(), 0.0);
      if (verb == "infer") {
        EXPECT_EQ(row["backward_ms"].get<double>(), 0.0);  // no backward in inference
      }
    }
    EXPECT_EQ(names, layer_names(architecture));
  }
}

TEST(BenchModel, TextReportNamesTheMachineAndThePeak) {
  const auto r = run("bench infer --model tiny_cnn --size 32 --batch 4 --seconds 0.2 --no-torch");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "tessera bench infer: tiny_cnn, 32x32 px, batch 4")) << r.out;
  EXPECT_TRUE(contains(r.out, "batch norm folded")) << r.out;
  EXPECT_TRUE(contains(r.out, "peak:")) << r.out;
  EXPECT_TRUE(contains(r.out, "not measured (--no-torch)")) << r.out;
}

TEST(BenchModel, BadModelOrSizeIsAUsageError) {
  auto r = run("bench train --model resnet19 --no-torch");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "resnet18")) << r.err;  // the known names are listed
  r = run("bench train --model compact --size 8 --no-torch");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--size 8")) << r.err;
}

// A machine without torch: said so, Tessera's figures alone, exit 0. A `torch` package that fails to import,
// first on the child's PYTHONPATH, stands in for the missing one.
TEST(BenchModel, WithoutTorchReportsTesseraAlone) {
  const testing::TempDir dir;
  fs::create_directories(dir.path() / "torch");
  std::ofstream(dir.path() / "torch" / "__init__.py") << "raise ImportError(\"No module named 'torch'\")\n";
  const char* previous = std::getenv("PYTHONPATH");
  const std::string saved = previous != nullptr ? previous : "";
  setenv("PYTHONPATH", dir.path().c_str(), 1);
  const auto r = run("bench infer --model tiny_cnn --size 32 --batch 4 --seconds 0.2");
  const auto j = run("bench infer --model tiny_cnn --size 32 --batch 4 --seconds 0.2 --json");
  if (previous != nullptr) {
    setenv("PYTHONPATH", saved.c_str(), 1);
  } else {
    unsetenv("PYTHONPATH");
  }
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "No module named 'torch'")) << r.out;
  EXPECT_TRUE(contains(r.out, "install-deps.sh --bench")) << r.out;
  ASSERT_EQ(j.code, 0) << j.err;
  const json report = json::parse(j.out);
  EXPECT_FALSE(report["pytorch"]["available"].get<bool>());
  EXPECT_TRUE(report["ratio"].is_null());
  EXPECT_GE(report["tessera"]["images_per_s"].get<double>(), 0.0);
}

// PyTorch's side, where Debian's python3-torch is installed (`make bench` installs it): same parameter counts
// (the run fails otherwise), a ratio.
TEST(BenchModel, PyTorchRunsTheSameModel) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3-torch is not installed";
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train", "tiny_cnn"}, {"train", "resnet18"}, {"infer", "compact"}};
  for (const auto& [verb, architecture] : cases) {
    SCOPED_TRACE(verb + ' ' + architecture);
    const json j = bench_json(verb, architecture, "--rounds 2 --warmup 1");
    ASSERT_TRUE(j["pytorch"]["available"].get<bool>()) << j.dump();
    EXPECT_EQ(j["pytorch"]["parameters"], j["parameters"]);
    expect_figures(j["pytorch"], {"images_per_s", "gflops", "fraction_of_peak"});
    EXPECT_EQ(j["pytorch"]["rounds_images_per_s"].size(), 2u);
    ASSERT_TRUE(j["ratio"].is_number());
    EXPECT_NEAR(j["ratio"].get<double>(),
                j["tessera"]["images_per_s"].get<double>() / j["pytorch"]["images_per_s"].get<double>(), 1e-9);
  }
}

}  // namespace
}  // namespace tessera
