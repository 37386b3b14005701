// DICOM whole-slide series through the verbs, as a user runs them: `synth --format dicom`, `info`, `infer` and
// `evaluate` on synthetic series, and `tile` and `infer` on the real CMU-1 series against the same scan as an SVS
// (../shared/data/real-slides; those tests skip, saying so, when it is absent).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>

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
// A tiny_cnn checkpoint at 0.5 µm/px (8-px tiles) with randomised weights: a model whose outputs depend on the
// pixels, to compare heatmaps of two files of one scan.
std::string checkpoint() { return (testing::test_data_dir() / "checkpoints/tiny_torch.h5").string(); }

TEST(DicomVerbs, SynthWritesSeriesThatInfoInferAndEvaluateRead) {
  const testing::TempDir dir;
  auto r = run("synth --out " + dir.file("synth") + " --slides 2 --size 1024 --seed 4 --format dicom" +
               " --set preview.enabled=false --set slides.flavour=aperio");
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path tumour = dir.path() / "synth/slides/tumor_001";
  ASSERT_TRUE(fs::is_directory(tumour));
  EXPECT_TRUE(fs::exists(tumour / "level-0.dcm") && fs::exists(tumour / "level-1.dcm"));
  EXPECT_FALSE(fs::exists(dir.path() / "synth/slides/tumor_001.source.tif"));

  r = run("info " + tumour.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "vendor       dicom")) << r.out;
  EXPECT_TRUE(contains(r.out, "reader       DICOM (JPEG Baseline frames)")) << r.out;
  EXPECT_TRUE(contains(r.out, "synthetic (made by tessera synth)")) << r.out;
  EXPECT_TRUE(contains(r.out, "0.2500 x 0.2500 um/px, from the DICOM Pixel Spacing")) << r.out;
  EXPECT_TRUE(contains(r.out, "associated   label (")) << r.out;
  EXPECT_TRUE(contains(r.out, "optical      paths 1 (the first is read)")) << r.out;
  r = run("info --json " + (tumour / "level-1.dcm").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const json info = json::parse(r.out);
  EXPECT_EQ(info[0]["mpp_source"], "dicom");
  EXPECT_EQ(info[0]["levels"].size(), 2U);

  // infer over the dataset.csv (rows name the series' folders; one row names a file of its series instead).
  std::ifstream in(dir.file("synth/dataset.csv"));
  std::string csv((std::istreambuf_iterator<char>(in)), {});
  const auto at = csv.find("slides/normal_001,");
  ASSERT_NE(at, std::string::npos);
  csv.replace(at, std::string("slides/normal_001,").size(), "slides/normal_001/level-0.dcm,");
  std::ofstream(dir.file("synth/dataset.csv")) << csv;
  r = run("infer --checkpoint " + checkpoint() + " --slides " + dir.file("synth/dataset.csv") + " --out " +
          dir.file("infer") + " --threads 1 --set infer.stride=16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir.path() / "infer/tumor_001.heatmap.h5"));
  EXPECT_TRUE(fs::exists(dir.path() / "infer/normal_001.heatmap.h5"));
  r = run("evaluate --dataset " + dir.file("synth/dataset.csv") + " --detections " + dir.file("infer") + " --out " +
          dir.file("evaluation"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::ifstream evaluation(dir.file("evaluation/evaluation.json"));
  EXPECT_EQ(json::parse(evaluation)["evaluated_slides"], 2);
}

// `tile` at the native 0.5 µm/px (so both read level 0) of the CMU-1 scan as DICOM and as SVS: the same tile
// coordinates but at the tissue border (the tissue masks come from different pyramids), ≥ 95% shared, and the shared
// tiles' pixels within JPEG re-encoding: mean difference per channel within ±5 (no colour shift; a YCbCr frame read
// as RGB is off by tens), mean absolute difference ≤ 10 (measured 7.9 / 4.8 / 9.0 on tissue tiles, which carry more
// re-encoding noise than the level's background does). The tissue mask is made at 2 µm/px: at the default 8 µm/px
// the DICOM series reads its converter's 16× level while the single-level SVS is area-averaged from level 0, and the
// masks' borders differ more (90.6% shared).
TEST(DicomVerbs, TileOfTheDicomSeriesIsTheSvs) {
  const fs::path series = real_file("dicom/cmu-1-small-region-dicom");
  const fs::path svs = real_file("cmu-1-small-region.svs");
  if (!fs::exists(series) || !fs::exists(svs)) GTEST_SKIP() << skip_message(series);
  const testing::TempDir dir;
  std::ofstream(dir.file("dataset.csv")) << "slide,label\n" << series.string() << "/,normal\n" << svs.string() << ",normal\n";
  const auto r = run("tile --csv " + dir.file("dataset.csv") + " -o " + dir.file("shards") +
                     " --set tile.size=64 --set tile.mpp=0.5 --set tissue.mask_mpp=2");
  ASSERT_EQ(r.code, 0) << r.err;
  std::map<std::pair<std::int64_t, std::int64_t>, cv::Mat> tiles[2];
  const auto manifest = io::read_manifest(dir.file("shards/manifest.json"));
  for (const auto& s : manifest.shards) {
    const auto shard = io::ShardFile::open(dir.file("shards/" + s.file));
    for (std::int64_t i = 0; i < shard.size(); ++i) {
      const auto k = static_cast<std::size_t>(i);
      const std::string& id = shard.slides()[shard.slide_indices()[k]];
      const int which = id == "cmu-1-small-region-dicom" ? 0 : 1;
      EXPECT_TRUE(id == "cmu-1-small-region-dicom" || id == "cmu-1-small-region") << id;
      tiles[which][{shard.coords()[2 * k], shard.coords()[2 * k + 1]}] = shard.read_image(i);
    }
  }
  ASSERT_GT(tiles[0].size(), 100U);
  std::size_t shared = 0;
  cv::Scalar total(0, 0, 0);
  cv::Scalar signed_total(0, 0, 0);
  for (const auto& [xy, tile] : tiles[0]) {
    const auto other = tiles[1].find(xy);
    if (other == tiles[1].end()) continue;
    ++shared;
    cv::Mat diff;
    cv::absdiff(tile, other->second, diff);
    total += cv::mean(diff);
    cv::Mat a;
    cv::Mat b;
    tile.convertTo(a, CV_32FC3);
    other->second.convertTo(b, CV_32FC3);
    signed_total += cv::mean(a - b);
  }
  const double fraction = static_cast<double>(shared) / static_cast<double>(std::max(tiles[0].size(), tiles[1].size()));
  const cv::Scalar mad = total / static_cast<double>(std::max<std::size_t>(shared, 1));
  const cv::Scalar mean = signed_total / static_cast<double>(std::max<std::size_t>(shared, 1));
  std::printf("tile: %zu DICOM tiles, %zu SVS tiles, %zu shared (%.1f%%); shared tiles' mean difference R %.2f G %.2f "
              "B %.2f, mean absolute difference R %.2f G %.2f B %.2f\n",
              tiles[0].size(), tiles[1].size(), shared, 100.0 * fraction, mean[0], mean[1], mean[2], mad[0], mad[1],
              mad[2]);
  EXPECT_GE(fraction, 0.95);
  for (int c = 0; c < 3; ++c) {
    EXPECT_LE(std::abs(mean[c]), 5.0) << "channel " << c;
    EXPECT_LE(mad[c], 10.0) << "channel " << c;
  }
}

// `infer` with one checkpoint at 0.5 µm/px on both files of the scan: heatmaps of one grid whose cells agree
// within 0.05 (the largest difference and the 99th percentile are printed).
TEST(DicomVerbs, InferHeatmapsOfTheDicomSeriesAndTheSvsAgree) {
  const fs::path series = real_file("dicom/cmu-1-small-region-dicom");
  const fs::path svs = real_file("cmu-1-small-region.svs");
  if (!fs::exists(series) || !fs::exists(svs)) GTEST_SKIP() << skip_message(series);
  const testing::TempDir dir;
  const auto r = run("infer --checkpoint " + checkpoint() + " --set 'input.slides=[" + series.string() + "," +
                     svs.string() + "]' --out " + dir.file("infer") +
                     " --threads 2 --set infer.stride=16 --set outputs=[heatmap.h5]");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Heatmap a = io::read_heatmap(dir.file("infer/cmu-1-small-region-dicom.heatmap.h5"));
  const io::Heatmap b = io::read_heatmap(dir.file("infer/cmu-1-small-region.heatmap.h5"));
  ASSERT_EQ(a.rows, b.rows);
  ASSERT_EQ(a.cols, b.cols);
  ASSERT_EQ(a.step, b.step);
  std::vector<double> differences;
  for (std::size_t i = 0; i < a.prob.size(); ++i) {
    if (std::isnan(a.prob[i]) || std::isnan(b.prob[i])) continue;  // tissue masks of two pyramids differ at the border
    differences.push_back(std::abs(static_cast<double>(a.prob[i]) - static_cast<double>(b.prob[i])));
  }
  ASSERT_GT(differences.size(), 1000U);
  std::sort(differences.begin(), differences.end());
  const double largest = differences.back();
  const double p99 = differences[differences.size() * 99 / 100];
  std::printf("infer: %zu cells scored in both; |difference| largest %.4f, 99th percentile %.4f\n", differences.size(),
              largest, p99);
  EXPECT_LE(largest, 0.05);
}

}  // namespace
}  // namespace tessera
