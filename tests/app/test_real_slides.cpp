// `tessera info`, `tile` and `infer` on real files nobody on the project made (../shared/data/real-slides, described
// in ../shared/data/README.md): OpenSlide's CMU-1-Small-Region Aperio scan (one level, 240-px JPEG tiles,
// 0.499 µm/px), a Hamamatsu NDPI (7 levels, read through OpenSlide), boxes.tiff (a pyramidal TIFF whose only
// resolution is a 72-dpi screen default) and the corrupt files of OpenSlide's and histolab's test suites. Every test
// skips, naming the missing file, when the shared data is not beside the repository.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "io/heatmap.h"
#include "io/shard.h"
#include "io/slide.h"
#include "tests/app/run.h"
#include "tests/testing/testing.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::contains;
using testing::run;

fs::path real_file(const std::string& name) { return testing::shared_data_dir() / "real-slides" / name; }
std::string skip_message(const fs::path& path) {
  return "no real data at " + path.string() + " (../shared/data is absent)";
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// Every tile of a shard folder is exactly the slide's pixels there at the shards' µm/px, as Slide::read_at_mpp
// reads them (opened with `options`). Returns the tiles checked per slide id.
std::map<std::string, int> expect_tiles_are_the_slides_pixels(const fs::path& shards,
                                                              const std::map<std::string, fs::path>& slides,
                                                              const io::SlideOpenOptions& options = {}) {
  std::map<std::string, int> checked;
  const auto manifest = io::read_manifest((shards / "manifest.json").string());
  std::map<std::string, io::Slide> open;
  for (const auto& [id, path] : slides) open.emplace(id, io::Slide::open(path.string(), options));
  for (const auto& s : manifest.shards) {
    const auto shard = io::ShardFile::open((shards / s.file).string());
    const int side = shard.tile_size();
    const double mpp = shard.attributes().mpp;
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      const std::string& id = shard.slides()[shard.slide_indices()[k]];
      const std::int64_t x = shard.coords()[2 * k], y = shard.coords()[2 * k + 1];
      const auto it = open.find(id);
      if (it == open.end()) {
        ADD_FAILURE() << "a tile of an unexpected slide " << id;
        continue;
      }
      const io::Slide& slide = it->second;
      EXPECT_TRUE(x >= 0 && y >= 0 && x < slide.width() && y < slide.height()) << id << " tile at " << x << ", " << y;
      const cv::Mat expected = slide.read_at_mpp(x, y, side, side, mpp);
      const cv::Mat tile = shard.read_image(i);
      if (cv::countNonZero(cv::Mat(tile != expected).reshape(1)) != 0) {
        ADD_FAILURE() << id << ": the tile at (" << x << ", " << y << ") is not the slide's pixels there";
      }
      ++checked[id];
    }
  }
  return checked;
}

// The scan and the NDPI as `info` describes them, in text and JSON.
TEST(RealSlideVerbs, InfoDescribesTheScans) {
  const fs::path svs = real_file("cmu-1-small-region.svs");
  const fs::path ndpi = real_file("fluorescence-dapi.ndpi");
  if (!fs::exists(svs) || !fs::exists(ndpi)) GTEST_SKIP() << skip_message(svs.parent_path());
  auto r = run("info " + svs.string() + " " + ndpi.string());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string line : {
           "  vendor       aperio\n",
           "  reader       direct TIFF (JPEG tiles)\n",
           "  size         2220 x 2967 px (1.11 x 1.48 mm)\n",
           "  resolution   0.4990 x 0.4990 um/px, from openslide.mpp-x\n",
           "  objective    20x\n",
           "  levels       1\n",
           "        0      2220      2967      1.0000     0.4990    240x240\n",
           "  associated   label (387x463), macro (1280x431), thumbnail (574x768)\n",
           "  vendor       hamamatsu\n",
           "  reader       OpenSlide\n",
           "  size         3968 x 4864 px (0.91 x 1.11 mm)\n",
           "  resolution   0.2282 x 0.2282 um/px, from openslide.mpp-x\n",
           "  objective    40x\n",
           "  levels       7\n",
           "        2       992      1216      4.0000     0.9127",
           "        6        62        76     64.0000    14.6032",
           "  associated   macro (1188x406)\n",
       }) {
    EXPECT_TRUE(contains(r.out, line)) << "missing: " << line << "\n" << r.out;
  }

  r = run("info --json " + svs.string() + " " + ndpi.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json slides = json::parse(r.out);
  ASSERT_EQ(slides.size(), 2u);
  EXPECT_EQ(slides[0]["levels"].size(), 1u);
  EXPECT_EQ(slides[0]["levels"][0]["tile_width"], 240);
  EXPECT_EQ(slides[0]["mpp_x"].get<double>(), 0.499);
  EXPECT_EQ(slides[0]["mpp_source"], "openslide_property");
  const json& levels = slides[1]["levels"];
  ASSERT_EQ(levels.size(), 7u);
  for (std::size_t i = 0; i < levels.size(); ++i) {
    EXPECT_EQ(levels[i]["downsample"].get<double>(), std::ldexp(1.0, static_cast<int>(i))) << i;
    EXPECT_EQ(levels[i]["width"].get<std::int64_t>(), 3968 >> i) << i;
    EXPECT_NEAR(levels[i]["mpp"].get<double>(), 0.228175 * std::ldexp(1.0, static_cast<int>(i)), 1e-5) << i;
  }
}

// A slide without a resolution is described, not refused: levels, sizes, vendor, and "resolution: unknown" with why
// and the setting that gives one; --assume-mpp gives one.
TEST(RealSlideVerbs, InfoDescribesASlideWhoseResolutionIsUnknown) {
  const fs::path boxes = real_file("boxes.tiff");
  if (!fs::exists(boxes)) GTEST_SKIP() << skip_message(boxes);
  auto r = run("info " + boxes.string());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string line : {
           "  vendor       generic-tiff\n",
           "  size         300 x 250 px (mm unknown)\n",
           "  resolution   unknown — set assume_mpp (--assume-mpp here, input.assume_mpp in a job): the TIFF "
           "resolution tags say 352.8 µm/px, a screen default rather than a scan resolution\n",
           "  levels       4\n",
           "        0       300       250      1.0000          -      64x64\n",
           "        1       150       125      2.0000          -      64x64\n",
           "        2        75        62      4.0161          -      64x64\n",
           "        3        37        31      8.0863          -      64x64\n",
       }) {
    EXPECT_TRUE(contains(r.out, line)) << "missing: " << line << "\n" << r.out;
  }

  r = run("info --json " + boxes.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json slide = json::parse(r.out).at(0);
  EXPECT_TRUE(slide["mpp_x"].is_null());
  EXPECT_TRUE(slide["mpp_y"].is_null());
  EXPECT_EQ(slide["mpp_source"], "unknown");
  EXPECT_TRUE(contains(slide["mpp_problem"].get<std::string>(), "screen default")) << slide.dump(2);
  ASSERT_EQ(slide["levels"].size(), 4u);
  EXPECT_TRUE(slide["levels"][3]["mpp"].is_null());
  EXPECT_NEAR(slide["levels"][3]["downsample"].get<double>(), 8.0863, 1e-4);

  r = run("info --assume-mpp 0.25 " + boxes.string());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string line : {
           "  size         300 x 250 px (0.07 x 0.06 mm)\n",
           "  resolution   0.2500 x 0.2500 um/px, assumed (--assume-mpp), not in the slide\n",
           "        2        75        62      4.0161     1.0040      64x64\n",
           "        3        37        31      8.0863     2.0216      64x64\n",
       }) {
    EXPECT_TRUE(contains(r.out, line)) << "missing: " << line << "\n" << r.out;
  }
  // A slide that records its resolution keeps it.
  const fs::path svs = real_file("cmu-1-small-region.svs");
  r = run("info --assume-mpp 0.25 " + svs.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "0.4990 x 0.4990 um/px, from openslide.mpp-x")) << r.out;
}

// Corrupt files among good ones: each is named with its problem at the end, the others are described, exit code 3.
TEST(RealSlideVerbs, InfoNamesEachCorruptFileWithItsProblem) {
  const fs::path dir = testing::shared_data_dir() / "real-slides";
  if (!fs::exists(dir / "broken.svs")) GTEST_SKIP() << skip_message(dir / "broken.svs");
  std::string args;
  for (const std::string name : {"small.svs", "broken.svs", "unopenable.tiff", "unreadable.svs", "boxes.tiff"}) {
    args += " " + (dir / name).string();
  }
  const auto r = run("info" + args);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.out, (dir / "small.svs").string() + "\n  vendor       aperio\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "  size         16 x 16 px (0.01 x 0.01 mm)\n")) << r.out;
  EXPECT_TRUE(contains(r.out, (dir / "boxes.tiff").string() + "\n  vendor       generic-tiff\n")) << r.out;
  EXPECT_TRUE(contains(r.err, "tessera info: 3 of 5 slides could not be read:\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  file '" + (dir / "broken.svs").string() + "': unsupported slide format\n")) << r.err;
  EXPECT_TRUE(contains(r.err, "  file '" + (dir / "unopenable.tiff").string() +
                                  "': corrupt slide: Unsupported TIFF compression: 52479\n"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "file '" + (dir / "unreadable.svs").string() +
                                  "': cannot decode tile 0 (column 0, row 0) of level 0 (TIFF directory 0): JPEGLib: "
                                  "Bogus marker length\n"))
      << r.err;
}

// `tile` on the scan (direct TIFF) and the NDPI (OpenSlide, from level 2 at 0.91 µm/px): every tile in the shards
// is the slide's own pixels at 1 µm/px. QC off: this is about reading and resampling, and QC takes a fifth of the
// scan's small section (its dark epidermis as a fold, with the margin), which would leave the count to QC's rules.
TEST(RealSlideVerbs, TileCutsTheScansAtTheTargetResolution) {
  const fs::path svs = real_file("cmu-1-small-region.svs");
  const fs::path ndpi = real_file("fluorescence-dapi.ndpi");
  if (!fs::exists(svs) || !fs::exists(ndpi)) GTEST_SKIP() << skip_message(svs.parent_path());
  testing::TempDir dir;
  const auto r = run("tile --set 'input.slides=[" + svs.string() + "," + ndpi.string() + "]' -o " + dir.file("shards") +
                     " --set tile.size=64 --set tile.mpp=1.0 --set qc.enabled=false");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto manifest = io::read_manifest(dir.file("shards/manifest.json"));
  EXPECT_TRUE(manifest.failures.empty());
  ASSERT_EQ(manifest.slides.size(), 2u);
  const auto checked = expect_tiles_are_the_slides_pixels(dir.path() / "shards",
                                                          {{"cmu-1-small-region", svs}, {"fluorescence-dapi", ndpi}});
  // The section of the scan at 64 µm tiles, and the fluorescence field (its dark background passes the H&E tissue
  // test; `tile` is not made for fluorescence, but it must read the file right).
  EXPECT_GT(checked.count("cmu-1-small-region") ? checked.at("cmu-1-small-region") : 0, 100);
  EXPECT_GT(checked.count("fluorescence-dapi") ? checked.at("fluorescence-dapi") : 0, 100);
}

// boxes.tiff has no usable resolution: `tile` fails it naming the file and the setting, and with input.assume_mpp
// it is tiled at the target µm/px from its non-power-of-two levels (1 µm/px is level 2, downsample 4.016).
TEST(RealSlideVerbs, TileReadsBoxesAtTheTargetResolutionWithAssumeMpp) {
  const fs::path boxes = real_file("boxes.tiff");
  if (!fs::exists(boxes)) GTEST_SKIP() << skip_message(boxes);
  testing::TempDir dir;
  const std::string job = "tile --set 'input.slides=[" + boxes.string() +
                          "]' --set tile.size=16 --set tile.mpp=1.0 --set tissue.min_fraction=0 -o ";
  auto r = run(job + dir.file("refused"));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "file '" + boxes.string() +
                                  "': the TIFF resolution tags say 352.8 µm/px, a screen "
                                  "default rather than a scan resolution; set assume_mpp"))
      << r.err;

  r = run(job + dir.file("shards") + " --set input.assume_mpp=0.25");
  ASSERT_EQ(r.code, 0) << r.err;
  io::SlideOpenOptions options;
  options.assume_mpp = 0.25;
  const auto checked = expect_tiles_are_the_slides_pixels(dir.path() / "shards", {{"boxes", boxes}}, options);
  // 75×62 µm at 1 µm/px holds 4×3 whole 16-px tiles.
  EXPECT_EQ(checked.count("boxes") ? checked.at("boxes") : 0, 12);
}

// A tiny CNN trained briefly on synthetic slides (32 px at 1 µm/px): a model to run over real slides, not a good one.
class RealSlideInference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(testing::shared_data_dir() / "real-slides")) return;  // every test skips
    dir_ = new testing::TempDir();
    auto r = run("synth --out " + dir_->file("synth") +
                 " --slides 2 --size 2048 --seed 9 --set preview.enabled=false --set tumour.max_regions=3"
                 " --set split.train=1 --set split.val=0");
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("tile --csv " + dir_->file("synth/dataset.csv") + " -o " + dir_->file("shards") +
            " --set tile.size=32 --set tile.mpp=1.0 --set tissue.min_fraction=0.3");
    ASSERT_EQ(r.code, 0) << r.err;
    std::ofstream(dir_->file("train.yaml")) << "data:\n  shards: " << dir_->file("shards") << "\n"
                                            << "model:\n  architecture: tiny_cnn\n"
                                            << "train:\n  batch_size: 16\n  seed: 9\n  threads: 1\n";
    r = run("train " + dir_->file("train.yaml") + " --out " + dir_->file("run") + " --epochs 1");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string checkpoint() { return dir_->file("run/checkpoint.h5"); }
  // The model is made only when the real slides are there.
  static bool have_model() { return dir_ != nullptr; }

  static testing::TempDir* dir_;
};
testing::TempDir* RealSlideInference::dir_ = nullptr;

// `infer` on the scan and the NDPI: each heatmap lies on its slide (the slide's level-0 size and µm/px, cells whose
// tiles fit inside it at the model's 32 px at 1 µm/px), holds probabilities only, and the heatmap TIFF opens at the
// slide's size and resolution.
TEST_F(RealSlideInference, InferMapsTheScansOnTheirOwnGeometry) {
  const fs::path svs = real_file("cmu-1-small-region.svs");
  const fs::path ndpi = real_file("fluorescence-dapi.ndpi");
  if (!fs::exists(svs) || !fs::exists(ndpi) || !have_model()) GTEST_SKIP() << skip_message(svs.parent_path());
  const std::string out = dir_->file("infer");
  const auto r =
      run("infer --checkpoint " + checkpoint() + " --set 'input.slides=[" + svs.string() + "," + ndpi.string() +
          "]' --out " + out + " --threads 1 --set outputs=[heatmap.h5,heatmap.tif,report.json]");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& path : {svs, ndpi}) {
    const std::string id = path.stem().string();
    SCOPED_TRACE(id);
    const io::Slide slide = io::Slide::open(path.string());
    const io::Heatmap map = io::read_heatmap(out + "/" + id + ".heatmap.h5");
    EXPECT_EQ(map.slide_width, slide.width());
    EXPECT_EQ(map.slide_height, slide.height());
    EXPECT_EQ(map.slide_mpp, slide.mpp());
    EXPECT_EQ(map.tile_mpp, 1.0);
    EXPECT_EQ(map.tile, std::llround(32.0 / slide.mpp()));
    EXPECT_EQ(map.step, std::llround(16.0 / slide.mpp()));  // half a tile
    const double footprint = 32.0 / slide.mpp();
    EXPECT_LE(static_cast<double>((map.cols - 1) * map.step) + footprint, static_cast<double>(slide.width()));
    EXPECT_GT(static_cast<double>(map.cols * map.step) + footprint, static_cast<double>(slide.width()));
    EXPECT_LE(static_cast<double>((map.rows - 1) * map.step) + footprint, static_cast<double>(slide.height()));
    EXPECT_GT(static_cast<double>(map.rows * map.step) + footprint, static_cast<double>(slide.height()));
    std::int64_t scored = 0;
    for (const float p : map.prob) {
      if (std::isnan(p)) continue;
      EXPECT_TRUE(p >= 0.0f && p <= 1.0f) << p;
      ++scored;
    }
    EXPECT_GT(scored, 100);
    EXPECT_EQ(read_json(out + "/" + id + ".report.json")["scored_tiles"].get<std::int64_t>(), scored);
    const io::Slide tiff = io::Slide::open(out + "/" + id + ".heatmap.tif");
    EXPECT_EQ(tiff.width(), slide.width());
    EXPECT_EQ(tiff.height(), slide.height());
    EXPECT_NEAR(tiff.mpp(), slide.mpp(), 1e-6);
  }
}

// boxes.tiff through `infer`: refused naming the file and the setting without a resolution, mapped at the assumed one.
TEST_F(RealSlideInference, InferNeedsAssumeMppForASlideWithoutResolution) {
  const fs::path boxes = real_file("boxes.tiff");
  if (!fs::exists(boxes) || !have_model()) GTEST_SKIP() << skip_message(boxes);
  const std::string base = "infer --checkpoint " + checkpoint() + " --slides " + boxes.string() +
                           " --threads 1 --set outputs=[heatmap.h5] --out ";
  auto r = run(base + dir_->file("boxes-refused"));
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, boxes.string()) && contains(r.err, "set assume_mpp")) << r.err;
  r = run(base + dir_->file("boxes") + " --set input.assume_mpp=0.25");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Heatmap map = io::read_heatmap(dir_->file("boxes/boxes.heatmap.h5"));
  EXPECT_EQ(map.slide_mpp, 0.25);
  EXPECT_EQ(map.step, 64);  // 16 µm at 0.25 µm/px
  EXPECT_EQ(map.cols, 3);   // (3 - 1)·64 + 128 ≤ 300 < 3·64 + 128
  EXPECT_EQ(map.rows, 2);
}

}  // namespace
}  // namespace tessera
