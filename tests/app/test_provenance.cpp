// Provenance travels with the model (io/provenance.h): `tessera synth` marks its slides, `tile` records each slide's
// origin in the manifest, `train` counts its training slides by origin into the checkpoint, and `infer` warns once
// per slide, and says so in report.json and on the overlay, when a model trained only on synthetic slides scores a
// slide synth did not make. The real slides are ../shared/data's (tests that need them skip, naming the file, when it
// is absent).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/image.h"
#include "io/provenance.h"
#include "io/shard.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;

constexpr const char* kCaution = "model trained on synthetic slides \u2014 demonstration only";

fs::path real_file(const std::string& name) { return testing::shared_data_dir() / "real-slides" / name; }
std::string skip_message(const fs::path& path) {
  return "no real data at " + path.string() + " (../shared/data is absent)";
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// How many times `part` occurs in `text`.
int occurrences(const std::string& text, const std::string& part) {
  int n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// A tiny CNN trained briefly on two synthetic slides (32 px at 1 µm/px), as tests/app/test_real_slides.cpp's.
class Provenance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto r = run("synth --out " + dir_->file("synth") +
                 " --slides 2 --size 2048 --seed 9 --set preview.enabled=false --set tumour.max_regions=3"
                 " --set split.train=1 --set split.val=0");
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("tile --csv " + dir_->file("synth/dataset.csv") + " -o " + dir_->file("shards") +
            " --set tile.size=32 --set tile.mpp=1.0 --set tissue.min_fraction=0.3");
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("train.yaml")) << "model:\n  architecture: tiny_cnn\n"
                                            << "train:\n  batch_size: 16\n  seed: 9\n  threads: 1\n";
    r = run("train " + dir_->file("train.yaml") + " --set data.shards=" + dir_->file("shards") + " --out " +
            dir_->file("run") + " --epochs 1");
    ASSERT_EQ(r.code, 0) << r.err;
    train_log_ = r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string checkpoint() { return dir_->file("run/checkpoint.h5"); }
  static std::string synthetic_slide() { return dir_->file("synth/slides/tumor_001.svs"); }
  static std::string infer(const std::string& model, const std::vector<std::string>& slides, const std::string& out) {
    std::string list;
    for (const auto& s : slides) list += (list.empty() ? "" : ",") + s;
    // QC off: its own warnings (too little tissue on these small slides) are not what these tests are about.
    return "infer --checkpoint " + model + " --set 'input.slides=[" + list + "]' --out " + out +
           " --threads 1 --set 'outputs=[overlay.png,report.json]' --set qc.enabled=false";
  }

  static testing::TempDir* dir_;
  static std::string train_log_;
};
testing::TempDir* Provenance::dir_ = nullptr;
std::string Provenance::train_log_;

// Synth's slides carry the marker (`info` shows it), the manifest records them as synthetic, and the checkpoint
// records its training slides: all synthetic, with the shards' folder, beside the µm/px and stain normalization.
TEST_F(Provenance, AModelTrainedOnSynthShardsRecordsSyntheticProvenance) {
  const auto info = run("info " + synthetic_slide() + " " + dir_->file("synth/slides/normal_001.tif"));
  ASSERT_EQ(info.code, 0) << info.err;
  EXPECT_EQ(occurrences(info.out, "  origin       synthetic (made by tessera synth)\n"), 2) << info.out;

  const io::Manifest manifest = io::read_manifest(dir_->file("shards/manifest.json"));
  ASSERT_EQ(manifest.slides.size(), 2u);
  std::int64_t training = 0;
  for (const auto& s : manifest.slides) {
    EXPECT_EQ(s.origin, "synthetic") << s.id;
    if (s.split == "train") ++training;
  }
  ASSERT_GT(training, 0);

  const io::CheckpointMeta meta = io::read_checkpoint_meta(checkpoint());
  ASSERT_TRUE(meta.provenance.has_value());
  const std::string shards = fs::absolute(dir_->file("shards")).lexically_normal().string();
  EXPECT_EQ(*meta.provenance, (io::TrainingProvenance{training, 0, 0, shards}));
  EXPECT_EQ(meta.provenance->data(), io::TrainingData::synthetic);
  EXPECT_EQ(meta.mpp, 1.0);
  EXPECT_EQ(meta.stain_normalization, "none");
  EXPECT_TRUE(contains(train_log_, "training data: synthetic slides only (" + std::to_string(training) +
                                       " training slide(s): " + std::to_string(training) +
                                       " made by tessera synth, 0 not; shards " + shards +
                                       "); tiles of 32 px at 1 µm/px, stain normalization none"))
      << train_log_;
}

// On slides synth made, the synthetic model is in its element: no warning, no caution; the log and the reports still
// say what it was trained on.
TEST_F(Provenance, InferOnASyntheticSlideWarnsNothing) {
  const std::string out = dir_->file("infer-synthetic");
  const auto r = run(infer(checkpoint(), {synthetic_slide(), dir_->file("synth/slides/normal_001.tif")}, out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "demonstration only")) << r.err;
  EXPECT_FALSE(contains(r.err, "[warning]")) << r.err;
  EXPECT_TRUE(contains(r.err, "the model's training data: synthetic slides only (")) << r.err;
  for (const std::string id : {"tumor_001", "normal_001"}) {
    SCOPED_TRACE(id);
    const json report = read_json(out + "/" + id + ".report.json");
    EXPECT_TRUE(report["caution"].is_null()) << report.dump(2);
    EXPECT_EQ(report["model"]["training_data"], "synthetic");
    EXPECT_TRUE(io::read_png_text(out + "/" + id + ".overlay.png").empty());
  }
  EXPECT_EQ(read_json(out + "/infer.json")["training_data"], "synthetic");
}

// Real scans among synthetic slides: one warning for each real slide, none for the synthetic one; each real slide's
// report.json and overlay (its red line and its PNG Warning text) say "model trained on synthetic slides —
// demonstration only". A rerun that finds the outputs up to date scores nothing and warns nothing again.
TEST_F(Provenance, InferOnRealScansWarnsOncePerSlideAndSaysSoInItsOutputs) {
  const fs::path svs = real_file("cmu-1-small-region.svs");
  const fs::path ndpi = real_file("fluorescence-dapi.ndpi");
  if (!fs::exists(svs) || !fs::exists(ndpi)) GTEST_SKIP() << skip_message(svs.parent_path());
  const std::string out = dir_->file("infer-real");
  const std::string job = infer(checkpoint(), {svs.string(), synthetic_slide(), ndpi.string()}, out);
  auto r = run(job);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(occurrences(r.err, "demonstration only"), 2) << r.err;
  EXPECT_EQ(occurrences(r.err, "[warning]"), 2) << r.err;
  for (const std::string& line :
       std::vector<std::string>{"slide 1/3 cmu-1-small-region: " + std::string(kCaution) +
                                    " (the model saw only slides made by tessera synth and this slide is not one: its "
                                    "heatmap and report are "
                                    "no diagnosis)\n",
                                "slide 3/3 fluorescence-dapi: " + std::string(kCaution) + " ("}) {
    EXPECT_TRUE(contains(r.err, line)) << "missing: " << line << "\n" << r.err;
  }
  EXPECT_FALSE(contains(r.err, "tumor_001: " + std::string(kCaution))) << r.err;

  for (const std::string id : {"cmu-1-small-region", "fluorescence-dapi", "tumor_001"}) {
    SCOPED_TRACE(id);
    const bool real = id != "tumor_001";
    const json report = read_json(out + "/" + id + ".report.json");
    EXPECT_EQ(report["model"]["training_data"], "synthetic");
    if (real) {
      EXPECT_EQ(report["caution"], kCaution);
    } else {
      EXPECT_TRUE(report["caution"].is_null()) << report.dump(2);
    }
    const auto text = io::read_png_text(out + "/" + id + ".overlay.png");
    EXPECT_EQ(text.count("Warning"), real ? 1u : 0u);
    if (real && text.count("Warning") == 1) {
      EXPECT_EQ(text.at("Warning"), kCaution);
    }
  }
  const json summary = read_json(out + "/infer.json");
  ASSERT_EQ(summary["slides"].size(), 3u);
  EXPECT_EQ(summary["slides"][0]["caution"], kCaution);
  EXPECT_TRUE(summary["slides"][1]["caution"].is_null());
  EXPECT_EQ(summary["slides"][2]["caution"], kCaution);

  r = run(job);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(occurrences(r.err, "up to date"), 3) << r.err;
  EXPECT_FALSE(contains(r.err, "demonstration only")) << r.err;
  EXPECT_EQ(read_json(out + "/cmu-1-small-region.report.json")["caution"], kCaution);
}

// A checkpoint that records no provenance (written before it was recorded, or converted) loads and scores a real
// scan with no claim either way: no warning, training data "unknown", no caution.
TEST_F(Provenance, ACheckpointWithoutProvenanceMakesNoClaim) {
  const fs::path svs = real_file("cmu-1-small-region.svs");
  if (!fs::exists(svs)) GTEST_SKIP() << skip_message(svs);
  io::Checkpoint old = io::read_checkpoint(checkpoint());
  ASSERT_TRUE(old.meta.provenance.has_value());
  old.meta.provenance.reset();
  const std::string model = dir_->file("old-checkpoint.h5");
  io::write_checkpoint(model, old);

  const std::string out = dir_->file("infer-old");
  const auto r = run(infer(model, {svs.string()}, out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.err, "demonstration only")) << r.err;
  EXPECT_FALSE(contains(r.err, "[warning]")) << r.err;
  EXPECT_TRUE(contains(r.err, "the model's training data: unknown (the checkpoint records no provenance)\n")) << r.err;
  const json report = read_json(out + "/cmu-1-small-region.report.json");
  EXPECT_EQ(report["model"]["training_data"], "unknown");
  EXPECT_TRUE(report["model"]["training_slides"].is_null());
  EXPECT_TRUE(report["caution"].is_null()) << report.dump(2);
  EXPECT_TRUE(io::read_png_text(out + "/cmu-1-small-region.overlay.png").empty());
  EXPECT_EQ(read_json(out + "/infer.json")["training_data"], "unknown");
}

// Shards tiled before the manifest recorded origins: training counts their slides as of unknown origin, and the
// checkpoint's training data is "unknown", not "synthetic".
TEST_F(Provenance, ShardsWithoutOriginsTrainAModelOfUnknownProvenance) {
  const fs::path shards = dir_->path() / "old-shards";
  fs::copy(dir_->path() / "shards", shards, fs::copy_options::recursive);
  json manifest = read_json(shards / "manifest.json");
  ASSERT_FALSE(manifest["slides"].empty());
  for (auto& slide : manifest["slides"]) {
    ASSERT_TRUE(slide.contains("origin"));
    slide.erase("origin");
  }
  std::ofstream(shards / "manifest.json") << manifest.dump(2) << "\n";
  const auto r = run("train " + dir_->file("train.yaml") + " --set data.shards=" + shards.string() + " --out " +
                     dir_->file("run-old") + " --epochs 1");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::CheckpointMeta meta = io::read_checkpoint_meta(dir_->file("run-old/checkpoint.h5"));
  ASSERT_TRUE(meta.provenance.has_value());
  EXPECT_EQ(meta.provenance->synthetic_slides, 0);
  EXPECT_EQ(meta.provenance->real_slides, 0);
  EXPECT_GT(meta.provenance->unknown_slides, 0);
  EXPECT_EQ(meta.provenance->data(), io::TrainingData::unknown);
  EXPECT_EQ(io::model_caution(meta.provenance, /*slide_is_synthetic=*/false), "");
  EXPECT_TRUE(contains(r.err, "training data: slides of unknown origin (")) << r.err;
}

}  // namespace
}  // namespace tessera
